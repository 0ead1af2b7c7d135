// Package publisher publishes a node's ResourceSlices and keeps them in
// step with its GPUs' health: it feeds NVML's health watch into the fault
// monitor (package health), acts on the recovery requests an operator
// leaves on the Node (names.AnnotationRecover), and republishes on every
// change, tainting faulted GPUs' devices where the cluster enforces
// DRADeviceTaints and leaving them out where it does not.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// Events of GPU health, on the Node.
const (
	ReasonGPUUnhealthy      = "FacetGPUUnhealthy"
	ReasonGPURecovered      = "FacetGPURecovered"
	ReasonGPURecoveryFailed = "FacetGPURecoveryFailed"
	ReasonHealthWatch       = "FacetHealthWatchDegraded"
)

// SliceSink takes the node's slices: the kubelet plugin helper
// (kubeletplugin.Helper), whose ResourceSlice controller syncs them to the
// API server.
type SliceSink interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// FaultSink takes the GPUs' faults, by UUID: the driver
// (driver.Driver.SetFaults), which refuses claims on fatally faulted GPUs.
type FaultSink interface {
	SetFaults(faults map[string]gpuhealth.Fault)
}

// MIGUse says which GPUs hold MIG instances carved at prepare
// (driver.Driver.MIGInUse), published as their migInUse attribute.
type MIGUse interface {
	MIGInUse() map[string]bool
}

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

// Options are a Publisher's parts. All but Metrics are required.
type Options struct {
	Sink SliceSink
	// Inventory is the node's GPUs and devices.
	Inventory *inventory.Inventory
	// Unusable are GPUs, by UUID, never published, with why (a start-up
	// problem: driver.Driver.UnusableGPUs).
	Unusable map[string]string
	// Gates are the DRA features the cluster enforces.
	Gates features.Set
	// Node is the node's name: the pool's.
	Node    string
	Faults  FaultSink
	Monitor *gpuhealth.Monitor
	Events  Events
	// Metrics, when set, counts the published slices and devices.
	Metrics *nodemetrics.Metrics
	// MIGUse, when set, is read on every publish; without it every GPU
	// in mig or dynamic mode is published with migInUse false.
	MIGUse MIGUse
	// Partitioning, when set, is how shares and slots are held to their
	// cores now (sharing.Set.ComputePartitioning), published as their
	// computePartitioning attribute on every publish.
	Partitioning func() string
}

// Publisher publishes the node's ResourceSlices from the inventory, less
// the GPUs a start-up problem made unusable, with the GPUs' health faults
// applied: tainted where the cluster enforces DRADeviceTaints, left out
// where it does not. Safe for concurrent use.
type Publisher struct {
	helper   SliceSink
	inv      *inventory.Inventory
	unusable map[string]string
	gates    features.Set
	node     string
	drv      FaultSink
	mon      *gpuhealth.Monitor
	ev       Events
	metrics  *nodemetrics.Metrics
	migUse   MIGUse
	part     func() string

	mu sync.Mutex
}

// New returns a Publisher of o; nothing is published until Publish.
func New(o Options) *Publisher {
	return &Publisher{
		helper: o.Sink, inv: o.Inventory, unusable: o.Unusable, gates: o.Gates, node: o.Node,
		drv: o.Faults, mon: o.Monitor, ev: o.Events, metrics: o.Metrics, migUse: o.MIGUse, part: o.Partitioning,
	}
}

// Publish hands the slices to the sink and the faults to the fault sink;
// it returns the number of resourceslices. An error is the sink's, or an internal
// one: slices with fields the cluster's gates drop.
func (p *Publisher) Publish(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	faults := p.mon.Faults()
	p.drv.SetFaults(faults)
	inv := p.inv
	if p.migUse != nil {
		inv = inv.WithMIGInUse(p.migUse.MIGInUse())
	}
	if p.part != nil {
		inv = inv.WithComputePartitioning(p.part())
	}
	// One slice build per publish: taints where the cluster enforces them,
	// else the faulted GPUs left out like the unusable ones.
	var res resourceslice.DriverResources
	if p.gates.Has(features.DeviceTaints) {
		taints := make(map[string]resourceapi.DeviceTaint, len(faults))
		for uuid, f := range faults {
			t := metav1.NewTime(f.Since)
			taints[uuid] = resourceapi.DeviceTaint{Key: names.TaintUnhealthy, Value: f.Reason, Effect: f.Effect(), TimeAdded: &t}
		}
		res = resourceslices.TaintedResources(inv.Without(p.unusable), p.node, taints)
	} else {
		drop := maps.Clone(p.unusable)
		for uuid, f := range faults {
			drop[uuid] = f.String()
		}
		res = resourceslices.Resources(inv.Without(drop), p.node)
	}
	if errs := resourceslices.Dropped(resourceslices.Objects(res, p.node), p.gates); len(errs) > 0 {
		// Guard against a mode that slipped past inventory.Build's check.
		return 0, fmt.Errorf("internal error: the slices use fields the cluster drops: %v", errors.Join(errs...))
	}
	if err := p.helper.PublishResources(ctx, res); err != nil {
		return 0, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	n := len(res.Pools[p.node].Slices)
	if p.metrics != nil {
		p.metrics.SetPublished(n, PublishedDevices(res))
	}
	return n, nil
}

// Changed reports a health change (an Event on the Node and a log line)
// and republishes. A failed republish is logged: the helper retries.
func (p *Publisher) Changed(ctx context.Context, c gpuhealth.Change) {
	logger := klog.FromContext(ctx)
	gpu := p.describe(c.GPU)
	if c.Fault != nil {
		what := fmt.Sprintf("its devices are no longer published (this cluster does not enforce %s, so Facet cannot taint them)", features.DeviceTaints)
		if p.gates.Has(features.DeviceTaints) {
			what = fmt.Sprintf("its devices carry the taint %s=%s:%s", names.TaintUnhealthy, c.Fault.Reason, c.Fault.Effect())
		}
		how := "it returns by itself once it answers NVML for the quiet period, or with `facetctl health recover`"
		if c.Fault.Fatal {
			how = "once the GPU is reset, recover it with `facetctl health recover --node " + p.node + " --gpu <uuid|index>`; claims on it fail to prepare until then"
		}
		msg := fmt.Sprintf("GPU %s: %s; %s; %s", gpu, c.Why, what, how)
		logger.Error(nil, "GPU unhealthy", "gpu", c.GPU, "fault", c.Fault.Reason, "fatal", c.Fault.Fatal, "message", msg)
		p.ev.Warning(ReasonGPUUnhealthy, msg)
	} else {
		msg := fmt.Sprintf("GPU %s: %s; its devices are offered again", gpu, c.Why)
		logger.Info("GPU recovered", "gpu", c.GPU, "message", msg)
		p.ev.Normal(ReasonGPURecovered, msg)
	}
	if _, err := p.Publish(ctx); err != nil {
		logger.Error(err, "Republishing after a health change failed; the helper retries on its next sync")
	}
}

// WatchMIGUse republishes on every signal of changes (the driver's
// MIGUseChanges) until ctx ends, so the migInUse attributes follow the
// prepared claims. A failed republish is logged: the helper retries.
func (p *Publisher) WatchMIGUse(ctx context.Context, changes <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			if _, err := p.Publish(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Republishing after a change of the GPUs in MIG use failed; the helper retries on its next sync")
			}
		}
	}
}

func (p *Publisher) describe(uuid string) string {
	for _, g := range p.inv.GPUs {
		if g.UUID == uuid {
			return fmt.Sprintf("%d (%s, %s)", g.Index, uuid, g.ProductName)
		}
	}
	return uuid
}

// WatchHealth runs NVML's health watch over the published GPUs, each
// queried every probeEvery, and feeds the monitor until ctx ends; a
// degraded watch is logged and raised as an Event.
func (p *Publisher) WatchHealth(ctx context.Context, lib NVML, probeEvery time.Duration) {
	var uuids []string
	for _, g := range p.inv.GPUs {
		if _, bad := p.unusable[g.UUID]; !bad {
			uuids = append(uuids, g.UUID)
		}
	}
	logger := klog.FromContext(ctx)
	err := lib.WatchHealth(ctx, uuids, probeEvery, func(ev nvmlgpu.HealthEvent) {
		c, err := p.mon.Observe(ev)
		if err != nil {
			logger.Error(err, "Cannot record a GPU health change; it holds until the plugin restarts", "gpu", ev.GPU)
		}
		if c != nil {
			p.Changed(ctx, *c)
		}
	})
	if err != nil {
		logger.Error(err, "GPU health watch degraded")
		p.ev.Warning(ReasonHealthWatch, err.Error())
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
func (p *Publisher) WatchRecoverRequests(ctx context.Context, client kubernetes.Interface, lib NVML) {
	logger := klog.FromContext(ctx)
	done := map[gpuhealth.RecoverRequest]bool{}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		node, err := client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err != nil {
			logger.V(2).Info("Cannot read the Node for GPU recovery requests; retrying", "err", err)
		} else if value, ok := node.Annotations[names.AnnotationRecover]; ok {
			p.handleRecoverRequests(ctx, lib, value, done)
		}
	}, recoverPoll)
}

// handleRecoverRequests acts on the annotation's requests not in done.
func (p *Publisher) handleRecoverRequests(ctx context.Context, lib NVML, value string, done map[gpuhealth.RecoverRequest]bool) {
	logger := klog.FromContext(ctx)
	reqs, err := gpuhealth.ParseRecoverRequests(value)
	if err != nil {
		key := gpuhealth.RecoverRequest{GPU: "malformed:" + value}
		if !done[key] {
			done[key] = true
			p.ev.Warning(ReasonGPURecoveryFailed, fmt.Sprintf("annotation %s: %v", names.AnnotationRecover, err))
		}
		return
	}
	for _, r := range reqs {
		if done[r] {
			continue
		}
		done[r] = true
		for _, uuid := range p.resolve(r.GPU) {
			c, err := p.mon.Recover(uuid, r.At, lib.ProbeGPU)
			switch {
			case err != nil:
				logger.Error(err, "GPU recovery refused", "gpu", uuid)
				p.ev.Warning(ReasonGPURecoveryFailed, fmt.Sprintf("GPU %s: %v", p.describe(uuid), err))
			case c != nil:
				p.Changed(ctx, *c)
			}
		}
	}
}

// resolve turns a request's GPU (a UUID, an NVML index, "all") into the
// UUIDs of faulted GPUs.
func (p *Publisher) resolve(gpu string) []string {
	faults := p.mon.Faults()
	var out []string
	for _, g := range p.inv.GPUs {
		if _, bad := faults[g.UUID]; !bad {
			continue
		}
		if gpu == "all" || gpu == g.UUID || gpu == fmt.Sprint(g.Index) {
			out = append(out, g.UUID)
		}
	}
	return out
}

// PublishedDevices counts the devices in res's resourceslices.
func PublishedDevices(res resourceslice.DriverResources) int {
	n := 0
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			n += len(s.Devices)
		}
	}
	return n
}
