package gpuhealth

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// Reasons of the Events of GPU health, on the Node.
const (
	ReasonGPUUnhealthy      = "FacetGPUUnhealthy"
	ReasonGPURecovered      = "FacetGPURecovered"
	ReasonGPURecoveryFailed = "FacetGPURecoveryFailed"
	ReasonHealthWatch       = "FacetHealthWatchDegraded"
)

// Events records Events on the Node (nodeevents.Recorder).
type Events interface {
	Normal(reason, msg string)
	Warning(reason, msg string)
}

// NVML is what the health watch and the recovery requests ask of the
// GPUs (nvmlgpu.Library).
type NVML interface {
	// WatchHealth reports health events of the GPUs uuids until ctx ends
	// (nvmlgpu.Library.WatchHealth).
	WatchHealth(ctx context.Context, uuids []string, probeEvery time.Duration, report func(nvmlgpu.HealthEvent)) error
	// ProbeGPU returns nil if the GPU answers NVML.
	ProbeGPU(uuid string) error
}

// WatchOptions are a Watch's parts; all are required.
type WatchOptions struct {
	Monitor *Monitor
	// Inventory is the node's GPUs, named in Events and recovered.
	Inventory *inventory.Inventory
	// Unusable are the GPUs, by UUID, that a start-up problem made
	// unusable (dradriver.Driver.UnusableGPUs): never published, so
	// never watched.
	Unusable map[string]string
	// Node is the node's name.
	Node string
	// Tainted says that the cluster enforces DRADeviceTaints, so a fault
	// taints its GPU's devices (Fault.Taint); otherwise they are no longer
	// published. For the Events' words.
	Tainted bool
	Events  Events
	// Changed is called after each change of the faults: the plugin
	// republishes the slices and hands the faults to the driver.
	Changed func(context.Context)
}

// Watch keeps the faults (Monitor) current: it feeds NVML's health watch
// into the monitor, acts on the recovery requests an operator leaves on
// the Node (names.AnnotationRecover), and tells of each change with a log
// line, an Event on the Node, and WatchOptions.Changed.
type Watch struct {
	o WatchOptions
}

// NewWatch returns a Watch of o; nothing is watched until WatchNVML and
// WatchRecoverRequests.
func NewWatch(o WatchOptions) *Watch { return &Watch{o: o} }

// Changed reports a change (an Event on the Node and a log line) and
// calls WatchOptions.Changed.
func (w *Watch) Changed(ctx context.Context, c Change) {
	logger := klog.FromContext(ctx)
	gpu := w.describe(c.GPU)
	if c.Fault != nil {
		what := fmt.Sprintf("its devices are no longer published (this cluster does not enforce %s, so Facet cannot taint them)", features.DeviceTaints)
		if w.o.Tainted {
			what = fmt.Sprintf("its devices carry the taint %s=%s:%s", names.TaintUnhealthy, c.Fault.Reason, c.Fault.Effect())
		}
		how := "it returns by itself once it answers NVML for the quiet period, or with `facetctl health recover`"
		if c.Fault.Fatal {
			how = "once the GPU is reset, recover it with `facetctl health recover --node " + w.o.Node + " --gpu <uuid|index>`; claims on it fail to prepare until then"
		}
		msg := fmt.Sprintf("GPU %s: %s; %s; %s", gpu, c.Why, what, how)
		logger.Error(nil, "GPU unhealthy", "gpu", c.GPU, "fault", c.Fault.Reason, "fatal", c.Fault.Fatal, "message", msg)
		w.o.Events.Warning(ReasonGPUUnhealthy, msg)
	} else {
		msg := fmt.Sprintf("GPU %s: %s; its devices are offered again", gpu, c.Why)
		logger.Info("GPU recovered", "gpu", c.GPU, "message", msg)
		w.o.Events.Normal(ReasonGPURecovered, msg)
	}
	w.o.Changed(ctx)
}

func (w *Watch) describe(uuid string) string {
	for _, g := range w.o.Inventory.GPUs {
		if g.UUID == uuid {
			return fmt.Sprintf("%d (%s, %s)", g.Index, uuid, g.ProductName)
		}
	}
	return uuid
}

// WatchNVML runs NVML's health watch over the published GPUs, each
// queried every probeEvery, and feeds the monitor until ctx ends; a
// degraded watch is logged and raised as an Event.
func (w *Watch) WatchNVML(ctx context.Context, lib NVML, probeEvery time.Duration) {
	var uuids []string
	for _, g := range w.o.Inventory.GPUs {
		if _, bad := w.o.Unusable[g.UUID]; !bad {
			uuids = append(uuids, g.UUID)
		}
	}
	logger := klog.FromContext(ctx)
	err := lib.WatchHealth(ctx, uuids, probeEvery, func(ev nvmlgpu.HealthEvent) {
		c, err := w.o.Monitor.Observe(ev)
		if err != nil {
			logger.Error(err, "Cannot record a GPU health change; it holds until the plugin restarts", "gpu", ev.GPU)
		}
		if c != nil {
			w.Changed(ctx, *c)
		}
	})
	if err != nil {
		logger.Error(err, "GPU health watch degraded")
		w.o.Events.Warning(ReasonHealthWatch, err.Error())
	}
}

// recoverPoll is how often the plugin reads its Node for recovery
// requests: a GET of one object from the API server's cache. A watch
// would need list and watch on every Node (RBAC cannot narrow them to
// one), which the plugin's role deliberately lacks.
const recoverPoll = 5 * time.Second

// WatchRecoverRequests acts on the Node annotation names.AnnotationRecover
// until ctx ends, reading the Node every recoverPoll: each request clears
// the faults of the GPUs it names, if they answer NVML and saw no fault
// after it. Each request is acted on once per plugin run.
func (w *Watch) WatchRecoverRequests(ctx context.Context, client kubernetes.Interface, lib NVML) {
	logger := klog.FromContext(ctx)
	done := map[RecoverRequest]bool{}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		node, err := client.CoreV1().Nodes().Get(ctx, w.o.Node, metav1.GetOptions{})
		if err != nil {
			logger.V(2).Info("Cannot read the Node for GPU recovery requests; retrying", "err", err)
		} else if value, ok := node.Annotations[names.AnnotationRecover]; ok {
			w.handleRecoverRequests(ctx, lib, value, done)
		}
	}, recoverPoll)
}

// handleRecoverRequests acts on the annotation's requests not in done.
func (w *Watch) handleRecoverRequests(ctx context.Context, lib NVML, value string, done map[RecoverRequest]bool) {
	logger := klog.FromContext(ctx)
	reqs, err := ParseRecoverRequests(value)
	if err != nil {
		key := RecoverRequest{GPU: "malformed:" + value}
		if !done[key] {
			done[key] = true
			w.o.Events.Warning(ReasonGPURecoveryFailed, fmt.Sprintf("annotation %s: %v", names.AnnotationRecover, err))
		}
		return
	}
	for _, r := range reqs {
		if done[r] {
			continue
		}
		done[r] = true
		for _, uuid := range w.resolve(r.GPU) {
			c, err := w.o.Monitor.Recover(uuid, r.At, lib.ProbeGPU)
			switch {
			case err != nil:
				logger.Error(err, "GPU recovery refused", "gpu", uuid)
				w.o.Events.Warning(ReasonGPURecoveryFailed, fmt.Sprintf("GPU %s: %v", w.describe(uuid), err))
			case c != nil:
				w.Changed(ctx, *c)
			}
		}
	}
}

// resolve turns a request's GPU (a UUID, an NVML index, "all") into the
// UUIDs of faulted GPUs.
func (w *Watch) resolve(gpu string) []string {
	faults := w.o.Monitor.Faults()
	var out []string
	for _, g := range w.o.Inventory.GPUs {
		if _, bad := faults[g.UUID]; !bad {
			continue
		}
		if gpu == "all" || gpu == g.UUID || gpu == fmt.Sprint(g.Index) {
			out = append(out, g.UUID)
		}
	}
	return out
}
