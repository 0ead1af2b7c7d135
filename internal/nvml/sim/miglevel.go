package sim

import (
	"maps"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// migLevel is one of MIG's two levels: the GPU instances of a GPU
// (simGPU) or the compute instances of a GPU instance (simGI). NVML's
// calls on the two are alike (create an instance where the driver would
// or at a placement, count how many more fit, list them by profile, look
// one up by ID), and migCalls serve both. Every method but
// lookup and idOf runs with the GPU's lock held, which migCalls
// take.
type migLevel[Info, Place any, C migInstance[H], H any] interface {
	// lookup is the level's own table entry for a caller's profile info.
	lookup(*Info) (Info, nvml.Return)
	// idOf is a profile info's ID, which the instances' profiles carry.
	idOf(*Info) uint32
	// open is SUCCESS where instances can be listed and created: MIG mode
	// on, the GPU instance not destroyed.
	open() nvml.Return
	fits(Info, Place) nvml.Return
	// choose is where the driver puts a new instance of a profile.
	choose(Info) (Place, bool)
	create(Info, Place) (C, nvml.Return)
	// hold stands an instance that is not created at a placement, for
	// counting what else fits, until release.
	hold(Info, Place) (release func())
	// instances are the level's instances by ID, below maxID.
	instances() map[int]C
	maxID() int
	locker() sync.Locker
}

// migInstance is a GPU or compute instance as its level's calls return it.
type migInstance[H any] interface {
	handleOf() H
	profileID() uint32
}

// migCalls are NVML's calls on the instances of a level, as the mock's
// functions take them: method values of a level's migCalls are what the
// GPU's and the GPU instance's handles install.
type migCalls[Info, Place any, C migInstance[H], H any] struct {
	l migLevel[Info, Place, C, H]
}

func callsOf[Info, Place any, C migInstance[H], H any](l migLevel[Info, Place, C, H]) migCalls[Info, Place, C, H] {
	return migCalls[Info, Place, C, H]{l}
}

// create is Create{Gpu,Compute}Instance: where the driver would put it.
func (m migCalls[Info, Place, C, H]) create(info *Info) (H, nvml.Return) {
	return m.place(info, nil)
}

// createAt is Create{Gpu,Compute}InstanceWithPlacement.
func (m migCalls[Info, Place, C, H]) createAt(info *Info, at *Place) (H, nvml.Return) {
	if at == nil {
		var none H
		return none, nvml.ERROR_INVALID_ARGUMENT
	}
	return m.place(info, at)
}

// place creates an instance at at, or where the driver would put it.
func (m migCalls[Info, Place, C, H]) place(info *Info, at *Place) (H, nvml.Return) {
	l := m.l
	var none H
	profile, ret := l.lookup(info)
	if ret != nvml.SUCCESS {
		return none, ret
	}
	mu := l.locker()
	mu.Lock()
	defer mu.Unlock()
	if ret := l.open(); ret != nvml.SUCCESS {
		return none, ret
	}
	var p Place
	if at != nil {
		if ret := l.fits(profile, *at); ret != nvml.SUCCESS {
			return none, ret
		}
		p = *at
	} else {
		var ok bool
		if p, ok = l.choose(profile); !ok {
			return none, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	c, ret := l.create(profile, p)
	if ret != nvml.SUCCESS {
		return none, ret
	}
	return c.handleOf(), nvml.SUCCESS
}

// remaining is Get{Gpu,Compute}InstanceRemainingCapacity: how many more
// instances of a profile fit, each where the driver would put it.
func (m migCalls[Info, Place, C, H]) remaining(info *Info) (int, nvml.Return) {
	l := m.l
	profile, ret := l.lookup(info)
	if ret != nvml.SUCCESS {
		return 0, ret
	}
	mu := l.locker()
	mu.Lock()
	defer mu.Unlock()
	if ret := l.open(); ret != nvml.SUCCESS {
		return 0, ret
	}
	// Hold instances greedily where the driver would put them, and
	// release them all once counted.
	var held []func()
	defer func() {
		for _, release := range held {
			release()
		}
	}()
	for {
		p, ok := l.choose(profile)
		if !ok {
			return len(held), nvml.SUCCESS
		}
		held = append(held, l.hold(profile, p))
	}
}

// list is Get{Gpu,Compute}Instances: the instances of a profile, by ID.
func (m migCalls[Info, Place, C, H]) list(info *Info) ([]H, nvml.Return) {
	l := m.l
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	mu := l.locker()
	mu.Lock()
	defer mu.Unlock()
	if ret := l.open(); ret != nvml.SUCCESS {
		return nil, ret
	}
	var out []H
	for _, c := range sortedByID(l.instances()) {
		if c.profileID() == l.idOf(info) {
			out = append(out, c.handleOf())
		}
	}
	return out, nvml.SUCCESS
}

// byID is Get{Gpu,Compute}InstanceById.
func (m migCalls[Info, Place, C, H]) byID(id int) (H, nvml.Return) {
	l := m.l
	var none H
	mu := l.locker()
	mu.Lock()
	defer mu.Unlock()
	if ret := l.open(); ret != nvml.SUCCESS {
		return none, ret
	}
	if id < 0 || id >= l.maxID() {
		return none, nvml.ERROR_INVALID_ARGUMENT
	}
	c, ok := l.instances()[id]
	if !ok {
		return none, nvml.ERROR_NOT_FOUND
	}
	return c.handleOf(), nvml.SUCCESS
}

// crowding counts the instances of a profile among a level's, and says
// whether one of them shares a slice with [start, start+size): what a new
// instance's placement must be clear of on either level.
func crowding[C interface {
	profileID() uint32
	span() (start, size uint32)
}](in map[int]C, profileID, start, size uint32) (same uint32, clash bool) {
	for _, c := range in {
		if c.profileID() == profileID {
			same++
		}
		s, n := c.span()
		clash = clash || sharesSlices(s, n, start, size)
	}
	return same, clash
}

// liveInfo is a GPU or compute instance's GetInfo: ERROR_INVALID_ARGUMENT
// once it is destroyed.
func liveInfo[T any](g *simGPU, destroyed *bool, info func() T) (T, nvml.Return) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *destroyed {
		var none T
		return none, nvml.ERROR_INVALID_ARGUMENT
	}
	return info(), nvml.SUCCESS
}

// destroy is a GPU or compute instance's Destroy: ERROR_IN_USE while busy
// (nil: never), else the instance leaves its level's instances, for good
// once the state is saved, and gone (nil: nothing) runs under the lock.
func destroy[C any](g *simGPU, destroyed *bool, in map[int]C, id int, busy func() bool, gone func()) nvml.Return {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *destroyed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if busy != nil && busy() {
		return nvml.ERROR_IN_USE
	}
	c := in[id]
	delete(in, id)
	if ret := g.persist(); ret != nvml.SUCCESS {
		in[id] = c
		return ret
	}
	*destroyed = true
	if gone != nil {
		gone()
	}
	return nvml.SUCCESS
}

// sortedByID are a level's instances in the order of their IDs.
func sortedByID[C any](m map[int]C) []C {
	out := make([]C, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

// The GPU's level: its GPU instances.

func (g *simGPU) idOf(info *nvml.GpuInstanceProfileInfo) uint32 { return info.Id }
func (g *simGPU) open() nvml.Return {
	if g.migMode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}
func (g *simGPU) create(profile nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement) (*simGI, nvml.Return) {
	return g.createGI(profile, p, -1)
}
func (g *simGPU) hold(profile nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement) func() {
	gi := &simGI{gpu: g, id: g.freeGIID(p), profile: profile, placement: p}
	g.gis[gi.id] = gi
	return func() { delete(g.gis, gi.id) }
}
func (g *simGPU) instances() map[int]*simGI { return g.gis }
func (g *simGPU) maxID() int                { return migMaxGPUInstances }
func (g *simGPU) locker() sync.Locker       { return &g.mu }

func (gi *simGI) handleOf() nvml.GpuInstance { return gi.handle }
func (gi *simGI) profileID() uint32          { return gi.profile.Id }
func (gi *simGI) span() (start, size uint32) { return gi.placement.Start, gi.placement.Size }

// A GPU instance's level: its compute instances.

func (gi *simGI) idOf(info *nvml.ComputeInstanceProfileInfo) uint32 { return info.Id }
func (gi *simGI) open() nvml.Return {
	if gi.destroyed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}
func (gi *simGI) create(profile nvml.ComputeInstanceProfileInfo, p nvml.ComputeInstancePlacement) (*simCI, nvml.Return) {
	return gi.createCI(profile, p, -1, "")
}
func (gi *simGI) hold(profile nvml.ComputeInstanceProfileInfo, p nvml.ComputeInstancePlacement) func() {
	id := gi.freeCIID()
	gi.cis[id] = &simCI{gi: gi, id: id, profile: profile, placement: p}
	return func() { delete(gi.cis, id) }
}
func (gi *simGI) instances() map[int]*simCI { return gi.cis }
func (gi *simGI) maxID() int                { return migMaxComputeInsts }
func (gi *simGI) locker() sync.Locker       { return &gi.gpu.mu }

func (ci *simCI) handleOf() nvml.ComputeInstance { return ci.handle }
func (ci *simCI) profileID() uint32              { return ci.profile.Id }
func (ci *simCI) span() (start, size uint32)     { return ci.placement.Start, ci.placement.Size }
