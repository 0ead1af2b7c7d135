// Package service runs a node's MPS control daemons (an mps.Manager) in
// facet-mps, a process of its own, and gives the kubelet plugin a client
// for it: JSON over HTTP on a unix socket in the MPS directory.
//
// Why a process of its own: the daemons are the Manager's children. Run in
// the kubelet plugin, PID 1 of its container, they died with every plugin
// crash, `kubectl delete pod` and rolling update, and every running MPS
// client lost its server; and two plugin pods of a maxSurge update both
// managed one set of directories. facet-mps is the chart's MPS DaemonSet:
// hostPID (MPS servers and clients in several containers), privileged
// (mounts, chroot), updated only when its pod is deleted (OnDelete), so
// that `helm upgrade` of Facet leaves the daemons running. NVIDIA's device
// plugin runs MPS in a DaemonSet of its own in the same way
// (deployments/helm/nvidia-device-plugin/templates/daemonset-mps-control-daemon.yml);
// NVIDIA's DRA driver creates a Deployment per claim from the plugin
// (cmd/gpu-kubelet-plugin/sharing.go), which needs the plugin to be able to
// create privileged pods, a right Facet's node plugin does not get.
//
// The plugin keeps the claims' state (its checkpoint) and hands it over at
// start (Restore) and whenever facet-mps restarted (Client.Check reports
// it): facet-mps keeps the daemons and the holders it was told of, and no
// state of its own beyond the Manager's daemon records.
package service

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/node/mps"
)

// SocketName is the socket's file name in the MPS directory, shared by
// facet-mps and the plugin's pods on the node (a hostPath).
const SocketName = "facet-mps.sock"

// instanceHeader carries, on every answer, the serving process's instance
// ID: a new one means facet-mps restarted and knows no holders.
const instanceHeader = "Facet-Mps-Instance"

// Info is GET /v1/info.
type Info struct {
	Instance string `json:"instance"`
	// Control is the control program's path in the driver root; empty,
	// with ControlError, while the driver root has none (a simulated
	// root not laid out yet, or no MPS in the driver).
	Control      string `json:"control,omitempty"`
	ControlError string `json:"controlError,omitempty"`
	Root         string `json:"root"`
	// HostRoot is the host's root the daemons run chrooted into, with
	// Control under Root's prefix there, when the driver is under a
	// prefix of its own; empty when they run in Root.
	HostRoot string `json:"hostRoot,omitempty"`
	Dir      string `json:"dir"`
	ShmSize  int64  `json:"shmSize"`
}

type acquireRequest struct {
	GPU   string    `json:"gpu"`
	Claim types.UID `json:"claim"`
	User  int64     `json:"user"`
}

type releaseRequest struct {
	Claim types.UID `json:"claim"`
}

type restoreRequest struct {
	Holders map[string]map[types.UID]int64 `json:"holders"`
}

// restartedResponse answers /v1/restore (T: the GPUs whose daemons were
// restarted) and /v1/check (T: by GPU, the claims whose daemon was): a
// call that failed part-way still tells what it restarted, beside its
// error.
type restartedResponse[T any] struct {
	Restarted T      `json:"restarted,omitempty"`
	Error     string `json:"error,omitempty"`
}

// restarted is the response of a call that restarted r and returned err.
func restarted[T any](r T, err error) restartedResponse[T] {
	resp := restartedResponse[T]{Restarted: r}
	if err != nil {
		resp.Error = err.Error()
	}
	return resp
}

// result is what the call returned: the restarts, and its error, if any.
func (r restartedResponse[T]) result() (T, error) {
	if r.Error != "" {
		return r.Restarted, fmt.Errorf("facet-mps: %s", r.Error)
	}
	return r.Restarted, nil
}

type daemonResponse struct {
	Daemon *mps.Record `json:"daemon,omitempty"`
}

// errorResponse is every failed call's body; Conflict is set for an
// *mps.UserConflictError.
type errorResponse struct {
	Error    string                 `json:"error"`
	Conflict *mps.UserConflictError `json:"conflict,omitempty"`
}
