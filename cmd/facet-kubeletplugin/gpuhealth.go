package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/driver"
	"github.com/facet-gpu/facet/pkg/features"
	gpuhealth "github.com/facet-gpu/facet/pkg/health"
	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/metrics"
	"github.com/facet-gpu/facet/pkg/names"
	"github.com/facet-gpu/facet/pkg/nvml"
	"github.com/facet-gpu/facet/pkg/slices"
)

// Events of GPU health, on the Node.
const (
	reasonGPUUnhealthy      = "FacetGPUUnhealthy"
	reasonGPURecovered      = "FacetGPURecovered"
	reasonGPURecoveryFailed = "FacetGPURecoveryFailed"
	reasonHealthWatch       = "FacetHealthWatchDegraded"
)

// publisher publishes the node's ResourceSlices from the inventory, less
// the GPUs a start-up problem made unusable, with the GPUs' health faults
// applied: tainted where the cluster enforces DRADeviceTaints, left out
// where it does not.
type publisher struct {
	helper   *kubeletplugin.Helper
	inv      *inventory.Inventory
	unusable map[string]string
	gates    features.Set
	node     string
	drv      *driver.Driver
	mon      *gpuhealth.Monitor
	ev       *nodeEvents
	metrics  *metrics.Metrics

	mu sync.Mutex
}

// publish hands the slices to the helper's ResourceSlice controller and
// the faults to the driver; it returns the number of slices.
func (p *publisher) publish(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	faults := p.mon.Faults()
	p.drv.SetFaults(faults)
	// One slice build per publish: taints where the cluster enforces them,
	// else the faulted GPUs left out like the unusable ones.
	var res resourceslice.DriverResources
	if p.gates.Has(features.DeviceTaints) {
		taints := make(map[string]resourceapi.DeviceTaint, len(faults))
		for uuid, f := range faults {
			t := metav1.NewTime(f.Since)
			taints[uuid] = resourceapi.DeviceTaint{Key: names.TaintUnhealthy, Value: f.Reason, Effect: f.Effect(), TimeAdded: &t}
		}
		res = slices.TaintedResources(p.inv.Without(p.unusable), p.node, taints)
	} else {
		drop := maps.Clone(p.unusable)
		for uuid, f := range faults {
			drop[uuid] = f.String()
		}
		res = slices.Resources(p.inv.Without(drop), p.node)
	}
	if errs := slices.Dropped(slices.Objects(res, p.node), p.gates); len(errs) > 0 {
		// Guard against a mode that slipped past inventory.Build's check.
		return 0, fmt.Errorf("internal error: the slices use fields the cluster drops: %v", errors.Join(errs...))
	}
	if err := p.helper.PublishResources(ctx, res); err != nil {
		return 0, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	n := len(res.Pools[p.node].Slices)
	p.metrics.SetPublished(n, publishedDevices(res))
	return n, nil
}

// changed reports a health change and republishes.
func (p *publisher) changed(ctx context.Context, c gpuhealth.Change) {
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
		p.ev.warning(reasonGPUUnhealthy, msg)
	} else {
		msg := fmt.Sprintf("GPU %s: %s; its devices are offered again", gpu, c.Why)
		logger.Info("GPU recovered", "gpu", c.GPU, "message", msg)
		p.ev.normal(reasonGPURecovered, msg)
	}
	if _, err := p.publish(ctx); err != nil {
		logger.Error(err, "Republishing after a health change failed; the helper retries on its next sync")
	}
}

func (p *publisher) describe(uuid string) string {
	for _, g := range p.inv.GPUs {
		if g.UUID == uuid {
			return fmt.Sprintf("%d (%s, %s)", g.Index, uuid, g.ProductName)
		}
	}
	return uuid
}

// watchGPUHealth runs NVML's health watch over the published GPUs and
// feeds the monitor until ctx ends.
func watchGPUHealth(ctx context.Context, lib *nvml.Library, p *publisher, probeEvery time.Duration) {
	var uuids []string
	for _, g := range p.inv.GPUs {
		if _, bad := p.unusable[g.UUID]; !bad {
			uuids = append(uuids, g.UUID)
		}
	}
	logger := klog.FromContext(ctx)
	err := lib.WatchHealth(ctx, uuids, probeEvery, func(ev nvml.HealthEvent) {
		c, err := p.mon.Observe(ev)
		if err != nil {
			logger.Error(err, "Cannot record a GPU health change; it holds until the plugin restarts", "gpu", ev.GPU)
		}
		if c != nil {
			p.changed(ctx, *c)
		}
	})
	if err != nil {
		logger.Error(err, "GPU health watch degraded")
		p.ev.warning(reasonHealthWatch, err.Error())
	}
}

// recoverPoll is how often the plugin reads its Node for recovery
// requests: a GET of one object from the API server's cache. A watch
// would need list and watch on every Node (RBAC cannot narrow them to
// one), which the plugin's role deliberately lacks.
const recoverPoll = 5 * time.Second

// watchRecoverRequests acts on the Node annotation names.AnnotationRecover
// until ctx ends: each request clears the faults of the GPUs it names, if
// they answer NVML and saw no fault after it. Each request is acted on
// once per plugin run.
func watchRecoverRequests(ctx context.Context, client kubernetes.Interface, lib *nvml.Library, p *publisher) {
	logger := klog.FromContext(ctx)
	done := map[gpuhealth.RecoverRequest]bool{}
	tick := time.NewTicker(recoverPoll)
	defer tick.Stop()
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err != nil {
			logger.V(2).Info("Cannot read the Node for GPU recovery requests; retrying", "err", err)
		} else if value, ok := node.Annotations[names.AnnotationRecover]; ok {
			p.handleRecoverRequests(ctx, lib, value, done)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// handleRecoverRequests acts on the annotation's requests not in done.
func (p *publisher) handleRecoverRequests(ctx context.Context, lib *nvml.Library, value string, done map[gpuhealth.RecoverRequest]bool) {
	logger := klog.FromContext(ctx)
	reqs, err := gpuhealth.ParseRecoverRequests(value)
	if err != nil {
		key := gpuhealth.RecoverRequest{GPU: "malformed:" + value}
		if !done[key] {
			done[key] = true
			p.ev.warning(reasonGPURecoveryFailed, fmt.Sprintf("annotation %s: %v", names.AnnotationRecover, err))
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
				p.ev.warning(reasonGPURecoveryFailed, fmt.Sprintf("GPU %s: %v", p.describe(uuid), err))
			case c != nil:
				p.changed(ctx, *c)
			}
		}
	}
}

// resolve turns a request's GPU (a UUID, an NVML index, "all") into the
// UUIDs of faulted GPUs.
func (p *publisher) resolve(gpu string) []string {
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
