package plugin

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/driver"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

// MPSConfig configures MPS partitioning of vGPU shares and slots (package
// mps). The daemons run in facet-mps (package mps/service), which the
// plugin reaches on a socket in Dir.
type MPSConfig struct {
	// Mode is auto or off (--mps).
	Mode string
	// Dir is the host directory of the per-GPU pipe, log and shm
	// directories and of facet-mps's socket (--mps-dir).
	Dir string
	// Wait bounds how long the start waits for facet-mps (--mps-wait).
	Wait time.Duration
	// CheckEvery is how often daemons are checked and dead ones restarted (--mps-check-interval).
	CheckEvery time.Duration
}

// open reaches facet-mps; nil and the reason when MPS is off or facet-mps
// does not answer with a control program within Wait (shares are then
// time-sliced, and a share that asks for MPS fails to prepare, naming
// the reason). An invalid --mps fails the start (fatal).
func (m *MPSConfig) open(ctx context.Context) (p driver.Partitioner, reason, fatal error) {
	logger := klog.FromContext(ctx)
	switch m.Mode {
	case "auto", "off":
	default:
		return nil, nil, fmt.Errorf("--mps=%q: want auto or off", m.Mode)
	}
	if m.Mode == "off" {
		logger.Info("MPS partitioning off (--mps=off): vGPU shares are time-sliced by HAMi-core")
		return nil, fmt.Errorf("--mps=off"), nil
	}
	client, err := service.Dial(ctx, m.Dir, m.Wait)
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	info, err := client.Info(ctx)
	if err != nil {
		logger.Error(err, "MPS unavailable: vGPU shares are time-sliced by HAMi-core")
		return nil, err, nil
	}
	logger.Info("MPS partitions vGPU shares and slots by default", "facetMPS", info.Instance, "control", info.Control, "driverRoot", info.Root, "hostRoot", info.HostRoot, "dir", info.Dir, "shmSize", info.ShmSize)
	return client, nil, nil
}

// podGetter reads a claim's pods for the UID they run as (MPS serves one
// UID per GPU): one GET per prepare of an MPS-partitioned claim, which
// the kubelet makes once per claim and node.
func podGetter(client kubernetes.Interface) driver.PodGetter {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}

// partitioning is the node's default, as its shares' attribute says.
func partitioning(p driver.Partitioner) string {
	if p == nil {
		return names.PartitioningTimeSliced
	}
	return names.PartitioningMPS
}
