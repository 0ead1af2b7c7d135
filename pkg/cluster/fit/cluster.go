// Package fit runs ResourceClaims through the upstream structured allocator
// (k8s.io/dynamic-resource-allocation/structured), the same code the
// kube-scheduler runs, offline: against Facet's rendered slices in tests
// (test/allocator), and against a cluster's live slices, classes and
// allocated claims in `facetctl fit`, which also says, from the occupancy
// model, why a claim does not fit where it does not.
package fit

import (
	"context"
	"fmt"
	"math/rand"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Features are the DRA features of a Kubernetes 1.35 cluster with Facet's
// gates on (partitionable devices and consumable capacity are alpha there).
var Features = structured.Features{
	PrioritizedList:        true,
	DeviceBindingAndStatus: true,
	AdminAccess:            true,
	PartitionableDevices:   true,
	ConsumableCapacity:     true,
}

// StockFeatures are the DRA features of a stock Kubernetes 1.35 cluster:
// the beta ones, on by default; every alpha gate off.
var StockFeatures = structured.Features{
	PrioritizedList:        true,
	DeviceBindingAndStatus: true,
	AdminAccess:            true,
}

// celCache holds compiled CEL selectors for every Cluster, as the
// scheduler keeps one for its lifetime.
var celCache = cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})

// Cluster is a set of nodes' slices, DeviceClasses and the allocations made
// so far.
type Cluster struct {
	Slices  []*resourceapi.ResourceSlice
	Classes map[string]*resourceapi.DeviceClass
	// Shuffle, when set, hands the allocator the slices in a new random
	// order on every call, as the scheduler does: it lists them from an
	// informer cache, whose List walks a Go map (client-go tools/cache
	// threadSafeMap.List, reached through resourceslice/tracker
	// ListPatchedResourceSlices). Without it they come in Slices' order.
	// It also gives each slice a random name, as the API server gives the
	// slices that Facet's ResourceSlice controller (k8s.io/dynamic-resource-
	// allocation v0.35: GenerateName "<node>-<driver>-") creates: from
	// v0.36 the allocator sorts a pool's slices by name, which is then as
	// random as the informer's order.
	Shuffle *rand.Rand
	// Features, when set, replaces the package's Features: StockFeatures
	// runs the allocator as a stock 1.35 scheduler does.
	Features *structured.Features
	state    structured.AllocatedState
	cache    *cel.Cache
}

// NewCluster starts with nothing allocated.
func NewCluster(slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass) *Cluster {
	c := &Cluster{
		Slices:  slices,
		Classes: map[string]*resourceapi.DeviceClass{},
		state: structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		},
		cache: celCache,
	}
	for _, cl := range classes {
		c.Classes[cl.Name] = cl
	}
	return c
}

// List and Get make Cluster a structured.DeviceClassLister.
func (c *Cluster) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, cl := range c.Classes {
		out = append(out, cl)
	}
	return out, nil
}

func (c *Cluster) Get(name string) (*resourceapi.DeviceClass, error) {
	cl, ok := c.Classes[name]
	if !ok {
		return nil, fmt.Errorf("DeviceClass %s not found", name)
	}
	return cl, nil
}

// Allocate asks the upstream allocator to place claim on node, as the
// scheduler's DRA plugin would. It returns nil, nil when the claim does not
// fit. A successful allocation is recorded, so later claims see it.
func (c *Cluster) Allocate(ctx context.Context, node string, claim *resourceapi.ResourceClaim) (*resourceapi.AllocationResult, error) {
	results, err := c.AllocateTogether(ctx, node, claim)
	if err != nil || results == nil {
		return nil, err
	}
	return &results[0], nil
}

// AllocateTogether allocates several claims in one scheduling cycle, as
// for a pod with several claims: all fit or none. It returns nil, nil when
// they do not fit, and records the allocations when they do.
func (c *Cluster) AllocateTogether(ctx context.Context, node string, claims ...*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	results, err := c.Try(ctx, node, claims...)
	if err != nil || results == nil {
		return nil, err
	}
	for i := range results {
		c.Record(&results[i])
	}
	return results, nil
}

// Try is AllocateTogether without recording: would these claims fit now?
func (c *Cluster) Try(ctx context.Context, node string, claims ...*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	slices := c.Slices
	if c.Shuffle != nil {
		slices = make([]*resourceapi.ResourceSlice, len(c.Slices))
		for i, s := range c.Slices {
			named := *s
			named.Name = fmt.Sprintf("%s-%s-%08x", s.Spec.Pool.Name, s.Spec.Driver, c.Shuffle.Uint32())
			slices[i] = &named
		}
		c.Shuffle.Shuffle(len(slices), func(i, j int) { slices[i], slices[j] = slices[j], slices[i] })
	}
	features := Features
	if c.Features != nil {
		features = *c.Features
	}
	a, err := structured.NewAllocator(ctx, features, c.state, c, slices, c.cache)
	if err != nil {
		return nil, err
	}
	for _, claim := range claims {
		defaultClaim(claim)
	}
	results, err := a.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, claims)
	if err != nil || len(results) == 0 {
		return nil, err
	}
	return results, nil
}

// Record marks an allocation's devices and consumed capacity as in use,
// the way the scheduler's DRA manager rebuilds its AllocatedState from
// claims' status: a result with a shareID is a share of a multi-allocatable
// device (AllocatedSharedDeviceIDs plus its consumed capacity), any other
// result is the device itself (AllocatedDevices).
func (c *Cluster) Record(res *resourceapi.AllocationResult) {
	for _, r := range res.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			c.state.AllocatedDevices.Insert(id)
			continue
		}
		c.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			c.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// Devices lists the device names of an allocation, in result order.
func Devices(res *resourceapi.AllocationResult) []string {
	if res == nil {
		return nil
	}
	var out []string
	for _, r := range res.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

// defaultClaim applies the apiserver's defaults for device requests
// (pkg/apis/resource/v1/defaults.go: allocationMode ExactCount, count 1),
// which a claim read from a file has not been through.
func defaultClaim(c *resourceapi.ResourceClaim) {
	def := func(r *resourceapi.ExactDeviceRequest) {
		if r.AllocationMode == "" {
			r.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		}
		if r.AllocationMode == resourceapi.DeviceAllocationModeExactCount && r.Count == 0 {
			r.Count = 1
		}
	}
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			def(r.Exactly)
		}
		for j := range r.FirstAvailable {
			sub := &r.FirstAvailable[j]
			if sub.AllocationMode == "" {
				sub.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if sub.AllocationMode == resourceapi.DeviceAllocationModeExactCount && sub.Count == 0 {
				sub.Count = 1
			}
		}
	}
}
