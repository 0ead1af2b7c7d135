// Package publisher publishes a node's ResourceSlices and keeps them in
// step with its GPUs' health faults (package gpuhealth, whose watch calls
// Publish on every change) and MIG use: faulted GPUs' devices are tainted
// where the cluster enforces DRADeviceTaints and left out where it does
// not.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// SliceSink takes the node's slices: the kubelet plugin helper
// (kubeletplugin.Helper), whose ResourceSlice controller syncs them to the
// API server.
type SliceSink interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// FaultSink takes the GPUs' faults, by UUID: the driver
// (dradriver.Driver.SetFaults), which refuses claims on fatally faulted GPUs.
type FaultSink interface {
	SetFaults(faults map[string]gpuhealth.Fault)
}

// MIGUse says which GPUs hold MIG instances carved at prepare
// (dradriver.Driver.MIGInUse), published as their migInUse attribute.
type MIGUse interface {
	MIGInUse() map[string]bool
}

// Options are a Publisher's parts. All but Metrics are required.
type Options struct {
	Sink SliceSink
	// Inventory is the node's GPUs and devices.
	Inventory *inventory.Inventory
	// Unusable are GPUs, by UUID, never published, with why (a start-up
	// problem: dradriver.Driver.UnusableGPUs).
	Unusable map[string]string
	// Gates are the DRA features the cluster enforces.
	Gates features.Set
	// Node is the node's name: the pool's.
	Node string
	// Faults is handed the Monitor's faults on every publish.
	Faults  FaultSink
	Monitor *gpuhealth.Monitor
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
	metrics  *nodemetrics.Metrics
	migUse   MIGUse
	part     func() string

	mu sync.Mutex
}

// New returns a Publisher of o; nothing is published until Publish.
func New(o Options) *Publisher {
	return &Publisher{
		helper: o.Sink, inv: o.Inventory, unusable: o.Unusable, gates: o.Gates, node: o.Node,
		drv: o.Faults, mon: o.Monitor, metrics: o.Metrics, migUse: o.MIGUse, part: o.Partitioning,
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
			taints[uuid] = f.Taint()
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
