package nodeplugin

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/node/dradriver"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// Reasons of the Node Events that say a sharing mechanism arrived or went,
// with what the node's shares and slots now are.
const (
	reasonMechanismAvailable   = "FacetSharingMechanismAvailable"
	reasonMechanismUnavailable = "FacetSharingMechanismUnavailable"
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
	// CheckEvery is how often facet-mps and HAMi-core are looked for or
	// probed, and MPS daemons checked and dead ones restarted
	// (--mps-check-interval).
	CheckEvery time.Duration
}

// probeTimeout bounds one look for facet-mps: the first, before the
// slices are first published, so a facet-mps that hangs delays whole GPUs
// and MIG by no more than this; and each later one.
const probeTimeout = 500 * time.Millisecond

// sharingOptions are the openers of the node's sharing mechanisms:
// HAMi-core from --hami-library (verified against --hami-library-sha256
// each time it is opened), facet-mps on its socket in --mps-dir. Neither
// is waited for. An invalid --mps fails the start.
func (f Config) sharingOptions() (sharing.Options, error) {
	var o sharing.Options
	if f.HAMiLibrary != "" {
		o.OpenHAMi = func(context.Context) (sharing.ShareEditor, error) {
			e, err := hami.NewEditor(hami.Options{LibraryPath: f.HAMiLibrary, LibrarySHA256: f.HAMiLibrarySHA256, StateDir: f.hamiStateDir()})
			if err != nil {
				return nil, err
			}
			return e, nil
		}
		// The library may be removed (the hami-core DaemonSet deleted, a
		// node cleaned): a share prepared then would preload nothing.
		o.ProbeHAMi = func(context.Context, sharing.ShareEditor) error {
			if _, err := os.Stat(f.HAMiLibrary); err != nil {
				return fmt.Errorf("HAMi-core's library is gone: %w", err)
			}
			return nil
		}
	}
	switch f.MPS.Mode {
	case "auto":
	case "off":
		o.MPSOff = fmt.Errorf("--mps=off: %w", sharing.ErrOff)
		return o, nil
	default:
		return o, fmt.Errorf("--mps=%q: want auto or off", f.MPS.Mode)
	}
	client := service.NewClient(f.MPS.Dir)
	probe := func(ctx context.Context) (*service.Info, error) {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		info, err := client.Info(ctx)
		if err != nil {
			return nil, err
		}
		if info.Control == "" {
			return nil, fmt.Errorf("facet-mps has no MPS control program: %s", info.ControlError)
		}
		return info, nil
	}
	o.OpenMPS = func(ctx context.Context) (sharing.Partitioner, error) {
		info, err := probe(ctx)
		if err != nil {
			return nil, err
		}
		klog.FromContext(ctx).Info("MPS partitions vGPU shares and slots by default", "facetMPS", info.Instance, "control", info.Control, "driverRoot", info.Root, "hostRoot", info.HostRoot, "dir", info.Dir, "shmSize", info.ShmSize)
		return client, nil
	}
	o.ProbeMPS = func(ctx context.Context, _ sharing.Partitioner) error {
		_, err := probe(ctx)
		return err
	}
	return o, nil
}

func (f Config) hamiStateDir() string { return f.StateDir + "/vgpu" }

// sharingChanged tells the node what a mechanism's arrival or loss means
// (a log line, a Node Event, the metric), hands the prepared claims'
// holders to a facet-mps that arrived, and reports whether the slices
// must be republished.
func (p *process) sharingChanged(ctx context.Context, changes []sharing.Change) bool {
	logger := klog.FromContext(ctx)
	republish := false
	for _, c := range changes {
		if !c.Off {
			// A mechanism turned off has no series: nothing to alert on.
			p.m.SetMechanism(string(c.Mechanism), c.Available)
		}
		msg := mechanismMessage(c)
		switch {
		case c.Available:
			logger.Info("Sharing mechanism available", "mechanism", c.Mechanism, "message", msg)
			p.ev.Normal(reasonMechanismAvailable, msg)
		case c.Off:
			logger.Info("Sharing mechanism off", "mechanism", c.Mechanism, "why", c.Why)
		default:
			logger.Error(nil, "Sharing mechanism unavailable", "mechanism", c.Mechanism, "message", msg)
			p.ev.Warning(reasonMechanismUnavailable, msg)
		}
		if c.Mechanism == sharing.MPS && c.Available && p.drv != nil {
			p.drv.RestoreMPS(ctx)
		}
		republish = republish || c.Mechanism == sharing.MPS
	}
	return republish
}

// mechanismMessage says what a change means for the node's shares and
// slots, for the Node Event.
func mechanismMessage(c sharing.Change) string {
	switch {
	case c.Mechanism == sharing.MPS && c.Available:
		return "facet-mps answers: vGPU shares and slots are MPS-partitioned and published with computePartitioning \"mps\""
	case c.Mechanism == sharing.MPS:
		return fmt.Sprintf("MPS unavailable (%s): vGPU shares and slots are published with computePartitioning \"time-sliced\", which the shipped vgpu classes leave out; new claims that ask for a compute limit fail to prepare unless they accept best effort, and running MPS clients lost their server", c.Why)
	case c.Available:
		return "HAMi-core's library is verified: enforced vGPU shares and slots can be prepared"
	default:
		return fmt.Sprintf("HAMi-core unavailable (%s): enforced vGPU shares and slots fail to prepare; whole GPUs and MIG devices are served", c.Why)
	}
}

// watchSharing looks for missing mechanisms and probes present ones every
// interval, republishing when MPS comes or goes, and checks the MPS
// daemons (dead ones restarted), until ctx ends.
func (p *process) watchSharing(ctx context.Context, republish func(context.Context)) {
	every := p.f.MPS.CheckEvery
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.sharingChanged(ctx, p.sharing.Refresh(ctx)) {
			republish(ctx)
		}
		p.drv.CheckMPS(ctx)
	}
}

// podGetter reads a claim's pods for the UID they run as (MPS serves one
// UID per GPU): one GET per prepare of an MPS-partitioned claim, which
// the kubelet makes once per claim and node.
func podGetter(client kubernetes.Interface) dradriver.PodGetter {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}
