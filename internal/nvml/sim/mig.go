package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// The simulated MIG backend.
//
// go-nvml's mock server creates any GPU instance anywhere, even with MIG
// disabled, numbers instances with ever-growing counters and forgets them
// with the process. The functions installed here replace its MIG functions
// so that a simulated GPU refuses what the hardware refuses, with the
// return codes NVML documents:
//
//   - MIG mode is state: SetMigMode changes it at once on Hopper and later,
//     and before Hopper (A100, A30) only sets the pending mode, which no
//     simulated reset ever applies, as the driver holds it for a GPU
//     reset; disabling it with GPU instances present fails with
//     ERROR_IN_USE, and creating instances while it is off fails with
//     ERROR_NOT_SUPPORTED ("device doesn't have MIG mode enabled").
//   - A GPU instance is created only at one of its profile's placements
//     (CreateGpuInstance chooses one like the driver does, see simGPU.choose)
//     (ERROR_INVALID_ARGUMENT otherwise) and only if it fits next to the
//     existing ones (ERROR_INSUFFICIENT_RESOURCES otherwise); see
//     simGPU.fits for the rules.
//   - GPU instance IDs are what the hardware uses (giIDForPlacement), so
//     they stay within the driver's 0-14 and are reused; compute instance
//     IDs are the lowest free in 0-7. Both are what the nvidia-caps table
//     (MIGCapMinors) accepts.
//   - A GPU instance with compute instances cannot be destroyed
//     (ERROR_IN_USE).
//   - Every compute instance is a MIG device with a handle nvcdi can use:
//     GetMaxMigDeviceCount, GetMigDeviceHandleByIndex, GetGpuInstanceById,
//     GetComputeInstanceById, DeviceGetHandleByUUID("MIG-..." and
//     "MIG-GPU-.../<GI ID>/<CI ID>"), ComputeInstance.GetInfo's Device
//     (unless Machine.CIInfoParentDevice), and MIG
//     handles answering GetUUID, GetGpuInstanceId, GetComputeInstanceId,
//     GetDeviceHandleFromMigDeviceHandle, GetIndex and GetAttributes.
//   - With a state file (WithStateFile), MIG mode and instances outlive the
//     process, as they outlive the plugin on a real node.
//
// Each GPU has its own lock; calls on different GPUs do not wait for each
// other (except for the state file write, see simStore).

// simNode is the MIG state of one simulated node.
type simNode struct {
	gpus []*simGPU
	// migs maps a MIG device UUID to its *simCI.
	migs sync.Map
	// store persists the state; nil keeps it in memory only.
	store *simStore
	// ciInfoParent is Machine.CIInfoParentDevice.
	ciInfoParent bool
}

// simGPU is one simulated GPU's MIG state.
type simGPU struct {
	node  *simNode
	index int
	model string
	dev   *server.Device
	// cfg's maps are keyed by NVML's profile index
	// (GPU_INSTANCE_PROFILE_*), the argument of
	// GetGpuInstanceProfileInfo; the infos it returns, which callers pass
	// back, carry the profile ID nvidia-smi shows, which key maps back.
	cfg gpus.MIGProfileConfig
	// byID maps a GPU instance profile ID to its index.
	byID map[uint32]int
	// full is the profile spanning the whole GPU (the 7g, or 4g on an
	// A30): its slice and engine counts are the GPU's totals.
	full nvml.GpuInstanceProfileInfo
	// memSlices is the number of memory slices: the end of the full
	// profile's placement.
	memSlices int

	mu      sync.Mutex
	migMode int
	// pendingMode is the MIG mode a GPU before Hopper takes at its next
	// reset (NVML's pending mode); equal to migMode when nothing is
	// pending. Not persisted: the simulation has no GPU reset, and a
	// restarted plugin on a real node sees a pending change until one.
	pendingMode int
	gis         map[int]*simGI // by GPU instance ID
}

// simGI is a GPU instance.
type simGI struct {
	gpu       *simGPU
	id        int
	profile   nvml.GpuInstanceProfileInfo
	placement nvml.GpuInstancePlacement
	handle    *mock.GpuInstance
	cis       map[int]*simCI // by compute instance ID; guarded by gpu.mu
	destroyed bool           // guarded by gpu.mu
}

// simCI is a compute instance, and the MIG device it makes.
type simCI struct {
	gi        *simGI
	id        int
	profile   nvml.ComputeInstanceProfileInfo
	placement nvml.ComputeInstancePlacement
	uuid      string
	handle    *mock.ComputeInstance
	mig       *mock.Device
	destroyed bool // guarded by gi.gpu.mu
}

// newSimNode installs the MIG simulation on every GPU of srv. models are
// the machine file's model names, by index.
func newSimNode(srv *server.Server, modelNames []string) *simNode {
	n := &simNode{}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		g := &simGPU{node: n, index: i, model: modelNames[i], dev: dev, cfg: dev.Config.MIGProfiles, migMode: dev.MigMode, pendingMode: dev.MigMode, gis: map[int]*simGI{}}
		n.gpus = append(n.gpus, g)
		if migCapable(dev.Config) {
			g.install()
		} else {
			g.installNotSupported()
		}
	}
	byUUID := srv.DeviceGetHandleByUUIDFunc
	srv.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		if strings.HasPrefix(id, "MIG-GPU-") {
			return n.migByIDs(strings.TrimPrefix(id, "MIG-"))
		}
		if strings.HasPrefix(id, "MIG-") {
			if ci, ok := n.migs.Load(id); ok {
				return ci.(*simCI).mig, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		}
		return byUUID(id)
	}
	return n
}

// migByIDs finds a MIG device by the name nvmlDeviceGetHandleByUUID takes
// besides its UUID, "MIG-<parent UUID>/<GPU instance ID>/<compute instance
// ID>" (the form MIG UUIDs had before R470, which later drivers accept;
// NVML API reference, "Change log"), less the "MIG-".
func (n *simNode) migByIDs(name string) (nvml.Device, nvml.Return) {
	parts := strings.Split(name, "/")
	if len(parts) != 3 {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	giID, err1 := strconv.Atoi(parts[1])
	ciID, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	for _, g := range n.gpus {
		if g.dev.UUID != parts[0] {
			continue
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if gi, ok := g.gis[giID]; ok {
			if ci, ok := gi.cis[ciID]; ok {
				return ci.mig, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// installNotSupported makes the MIG functions of a GPU without MIG fail the
// way NVML fails them on such a GPU.
func (g *simGPU) installNotSupported() {
	d := g.dev
	d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	d.SetMigModeFunc = func(int) (nvml.Return, nvml.Return) {
		return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.CreateGpuInstanceFunc = func(*nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.CreateGpuInstanceWithPlacementFunc = func(*nvml.GpuInstanceProfileInfo, *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstancesFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return nil, nvml.ERROR_INVALID_ARGUMENT }
}

// install replaces the mock's MIG functions of a MIG-capable GPU.
func (g *simGPU) install() {
	g.byID = map[uint32]int{}
	for index, info := range g.cfg.GpuInstanceProfiles {
		g.byID[info.Id] = index
		if info.SliceCount > g.full.SliceCount {
			g.full = info
		}
	}
	for _, p := range g.cfg.GpuInstancePlacements[g.key(g.full)] {
		g.memSlices = max(g.memSlices, int(p.Start+p.Size))
	}

	d := g.dev
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.migMode, g.pendingMode, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
			return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		// Before Hopper the driver takes the change and holds it for a
		// GPU reset (NVIDIA's MIG user guide, "Enable MIG Mode"); asking
		// for the current mode again cancels it.
		if g.dev.Config.Architecture < nvml.DEVICE_ARCH_HOPPER {
			g.pendingMode = mode
			if mode == g.migMode {
				return nvml.SUCCESS, nvml.SUCCESS
			}
			return nvml.SUCCESS, nvml.ERROR_RESET_REQUIRED
		}
		if mode == g.migMode {
			return nvml.SUCCESS, nvml.SUCCESS
		}
		if mode == nvml.DEVICE_MIG_DISABLE && len(g.gis) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		old := g.migMode
		g.migMode, g.pendingMode = mode, mode
		if ret := g.persist(); ret != nvml.SUCCESS {
			g.migMode, g.pendingMode = old, old
			return ret, ret
		}
		return nvml.SUCCESS, nvml.SUCCESS
	}
	d.GetGpuInstanceProfileInfoFunc = func(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if id < 0 || id >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		info, ok := g.cfg.GpuInstanceProfiles[id]
		if !ok {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return info, nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		pl, ok := g.cfg.GpuInstancePlacements[g.key(*info)]
		if !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return append([]nvml.GpuInstancePlacement(nil), pl...), nvml.SUCCESS
	}
	// NVML's calls on the GPU instances, alike on both levels (migLevel).
	gc := callsOf(g)
	d.CreateGpuInstanceFunc, d.CreateGpuInstanceWithPlacementFunc = gc.create, gc.createAt
	d.GetGpuInstanceRemainingCapacityFunc, d.GetGpuInstancesFunc, d.GetGpuInstanceByIdFunc = gc.remaining, gc.list, gc.byID
	// As many MIG devices as compute slices: seven 1-slice compute
	// instances, or four on an A30.
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return int(g.full.SliceCount), nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if i < 0 || i >= int(g.full.SliceCount) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		migs := g.migDevices()
		if i >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[i].mig, nvml.SUCCESS
	}
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return nil, nvml.ERROR_INVALID_ARGUMENT }
}

// lookup returns the GPU's own table entry for the profile info a caller
// passed (NVML looks the profile up by ID, too).
func (g *simGPU) lookup(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if info == nil {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	index, ok := g.byID[info.Id]
	if !ok {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return g.cfg.GpuInstanceProfiles[index], nvml.SUCCESS
}

// key returns the index under which g.cfg holds a profile, or -1 for an ID
// the GPU does not have.
func (g *simGPU) key(info nvml.GpuInstanceProfileInfo) int {
	if index, ok := g.byID[info.Id]; ok {
		return index
	}
	return -1
}

// fits reports whether a GPU instance of profile can be created at
// placement next to the existing ones. g.mu is held. The rules:
//
//  1. MIG mode must be enabled (else ERROR_NOT_SUPPORTED).
//  2. The placement must be one of the profile's
//     (nvmlDeviceGetGpuInstancePossiblePlacements; else
//     ERROR_INVALID_ARGUMENT).
//  3. The rest fail with ERROR_INSUFFICIENT_RESOURCES:
//     a. the profile's InstanceCount is reached;
//     b. the placement's memory slices [Start, Start+Size) overlap an
//     existing instance's;
//     c. the compute slices of all instances would exceed the full
//     profile's SliceCount;
//     d. the engines would run out: for copy engines, decoders, encoders,
//     JPEG decoders and OFAs, the instances together may hold at most what
//     the full profile (the one instance that has the whole GPU) holds.
//
// What (d) adds to (a)-(c) is the media-extension rule, and nothing else
// (TestEngineRuleOnlyLimitsMediaExtensions checks every layout of every
// model). Decoders, JPEG decoders and copy engines come with compute slices,
// so no layout that fits (c) runs out of them; but a GPU has one OFA (and on
// A100/A30 one NVJPG), which only the "+me" profiles and the full profile
// get. So:
//   - A100 40/80 GB: 7g has 1 NVJPG and 1 OFA, 1g+me has 1 and 1: one +me;
//   - A30: 4g has 1 NVJPG and 1 OFA, and so have 1g+me and 2g+me: one of
//     the two +me profiles, not both (InstanceCount alone would allow one
//     of each);
//   - H100, H200, B200: 7g has 1 OFA, 1g+me has 1: one +me.
//
// This holds for the corrected tables of models.go. With go-nvml's own
// H100/H200 tables the rule would refuse every 1g+me (their 7g has no OFA)
// and a seventh 1g (5 NVDECs); with its B200 table (7g: 4 OFA) it would
// leave the limit to InstanceCount.
func (g *simGPU) fits(profile nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement) nvml.Return {
	if g.migMode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	if !slices.Contains(g.cfg.GpuInstancePlacements[g.key(profile)], p) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if same, clash := crowding(g.gis, profile.Id, p.Start, p.Size); clash || same >= profile.InstanceCount {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	var used engines
	for _, gi := range g.gis {
		used = used.add(engineCounts(gi.profile))
	}
	if !used.add(engineCounts(profile)).within(engineCounts(g.full)) {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

// sharesSlices says whether two placements [start, start+size) share a slice.
func sharesSlices(aStart, aSize, bStart, bSize uint32) bool {
	return aStart < bStart+bSize && bStart < aStart+aSize
}

// engines counts what a GPU instance takes of the GPU.
type engines [6]uint32

func engineCounts(p nvml.GpuInstanceProfileInfo) engines {
	return engines{p.SliceCount, p.CopyEngineCount, p.DecoderCount, p.EncoderCount, p.JpegCount, p.OfaCount}
}

func (e engines) add(o engines) engines {
	for i := range e {
		e[i] += o[i]
	}
	return e
}

func (e engines) within(limit engines) bool {
	for i := range e {
		if e[i] > limit[i] {
			return false
		}
	}
	return true
}

// choose returns the placement nvmlDeviceCreateGpuInstance would use for
// profile, if any fits. NVML does not document its choice; the simulation
// takes, among the placements where the instance fits, the one that
// overlaps the fewest placements of all profiles (it blocks the least),
// the lowest start first. On an A100 this gives what nvidia-smi reports
// there: seven 1g instances land on slices 6, 4, 5, 0, 1, 2, 3 (GPU
// instance IDs 13, 11, 12, 7, 8, 9, 10), the first 3g on 4 (ID 2), and a
// 2g after it on 0 (ID 3). It matters for tools that create instances
// without placements, like mig-parted: creating 3g, 2g, 1g, 1g (its
// "all-balanced" layout) in that order fits, while "first free" would put
// the 3g on 0 and leave no room for the second 1g. g.mu is held.
func (g *simGPU) choose(profile nvml.GpuInstanceProfileInfo) (nvml.GpuInstancePlacement, bool) {
	best, bestScore := nvml.GpuInstancePlacement{}, -1
	for _, p := range g.cfg.GpuInstancePlacements[g.key(profile)] {
		if g.fits(profile, p) != nvml.SUCCESS {
			continue
		}
		score := 0
		for _, pls := range g.cfg.GpuInstancePlacements {
			for _, q := range pls {
				if sharesSlices(q.Start, q.Size, p.Start, p.Size) {
					score++
				}
			}
		}
		if bestScore < 0 || score < bestScore || (score == bestScore && p.Start < best.Start) {
			best, bestScore = p, score
		}
	}
	return best, bestScore >= 0
}

// giIDForPlacement returns the GPU instance ID the hardware gives the
// instance at placement p on a GPU with memSlices memory slices: the
// instances are the nodes of a binary tree over the memory slices, numbered
// breadth first. On an 8-slice GPU the full GPU is 0, the halves 1-2, the
// quarters 3-6 and the eighths 7-14; `nvidia-smi mig -cgi` on an A100 or
// H100 reports exactly these (3g at 4:4 is GI 2, 2g at 0:2 is GI 3, 1g at
// 2:1 is GI 9). It returns false for a placement that is not a tree node.
func giIDForPlacement(memSlices int, p nvml.GpuInstancePlacement) (int, bool) {
	size, start := int(p.Size), int(p.Start)
	pow2 := func(n int) bool { return n > 0 && n&(n-1) == 0 }
	if !pow2(memSlices) || !pow2(size) || size > memSlices || start%size != 0 || start+size > memSlices {
		return 0, false
	}
	return memSlices/size - 1 + start/size, true
}

// freeGIID returns the ID for a new instance at p: the hardware's, or the
// lowest free one for a placement outside the tree. g.mu is held.
func (g *simGPU) freeGIID(p nvml.GpuInstancePlacement) int {
	if id, ok := giIDForPlacement(g.memSlices, p); ok && id < migMaxGPUInstances {
		if _, taken := g.gis[id]; !taken {
			return id
		}
	}
	for id := 0; id < migMaxGPUInstances; id++ {
		if _, taken := g.gis[id]; !taken {
			return id
		}
	}
	return -1
}

// createGI creates a GPU instance that fits; id < 0 picks the ID. g.mu is
// held.
func (g *simGPU) createGI(profile nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement, id int) (*simGI, nvml.Return) {
	if id < 0 {
		id = g.freeGIID(p)
	}
	if _, taken := g.gis[id]; taken || id < 0 || id >= migMaxGPUInstances {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := &simGI{gpu: g, id: id, profile: profile, placement: p, cis: map[int]*simCI{}}
	gi.install()
	g.gis[id] = gi
	if ret := g.persist(); ret != nvml.SUCCESS {
		delete(g.gis, id)
		return nil, ret
	}
	return gi, nvml.SUCCESS
}

// migDevices returns the MIG devices (compute instances) by GPU instance
// ID, then compute instance ID: the order of GetMigDeviceHandleByIndex.
// g.mu is held.
func (g *simGPU) migDevices() []*simCI {
	var out []*simCI
	for _, gi := range sortedByID(g.gis) {
		out = append(out, sortedByID(gi.cis)...)
	}
	return out
}

// persist writes the GPU's state to the state file, if any. g.mu is held.
func (g *simGPU) persist() nvml.Return {
	if g.node.store == nil {
		return nvml.SUCCESS
	}
	if err := g.node.store.save(g.index, g.snapshot()); err != nil {
		// What a failing driver would say; the change is undone.
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

func (gi *simGI) install() {
	g := gi.gpu
	h := &mock.GpuInstance{}
	gi.handle = h
	h.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		return liveInfo(g, &gi.destroyed, func() nvml.GpuInstanceInfo {
			return nvml.GpuInstanceInfo{Device: g.dev, Id: uint32(gi.id), ProfileId: gi.profile.Id, Placement: gi.placement}
		})
	}
	h.GetComputeInstanceProfileInfoFunc = func(ciProfile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if ciProfile < 0 || ciProfile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || engProfile < 0 || engProfile >= nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		if engProfile != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		info, ok := g.cfg.ComputeInstanceProfiles[g.key(gi.profile)][ciProfile]
		if !ok {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return info, nvml.SUCCESS
	}
	h.GetComputeInstancePossiblePlacementsFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
		profile, ret := gi.lookup(info)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return gi.ciPlacements(profile), nvml.SUCCESS
	}
	// NVML's calls on the compute instances, alike on both levels (migLevel).
	gic := callsOf(gi)
	h.CreateComputeInstanceFunc, h.CreateComputeInstanceWithPlacementFunc = gic.create, gic.createAt
	h.GetComputeInstanceRemainingCapacityFunc, h.GetComputeInstancesFunc, h.GetComputeInstanceByIdFunc = gic.remaining, gic.list, gic.byID
	// A GPU instance with compute instances is in use.
	h.DestroyFunc = func() nvml.Return {
		return destroy(g, &gi.destroyed, g.gis, gi.id, func() bool { return len(gi.cis) > 0 }, nil)
	}
}

// lookup returns the table entry for a compute instance profile of this
// GPU instance.
func (gi *simGI) lookup(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if info == nil {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	p, ok := gi.gpu.cfg.ComputeInstanceProfiles[gi.gpu.key(gi.profile)][int(info.Id)]
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return p, nvml.SUCCESS
}

// ciPlacements returns the compute slice ranges a compute instance of
// profile may take inside the GPU instance: the table's, or where the table
// has none (go-nvml's A100), every aligned range that fits.
func (gi *simGI) ciPlacements(profile nvml.ComputeInstanceProfileInfo) []nvml.ComputeInstancePlacement {
	if pl, ok := gi.gpu.cfg.ComputeInstancePlacements[gi.gpu.key(gi.profile)][int(profile.Id)]; ok && len(pl) > 0 {
		return append([]nvml.ComputeInstancePlacement(nil), pl...)
	}
	var out []nvml.ComputeInstancePlacement
	for s := uint32(0); profile.SliceCount > 0 && s+profile.SliceCount <= gi.profile.SliceCount; s += profile.SliceCount {
		out = append(out, nvml.ComputeInstancePlacement{Start: s, Size: profile.SliceCount})
	}
	return out
}

// fits reports whether a compute instance of profile fits at p: a legal
// placement (ERROR_INVALID_ARGUMENT), the profile's InstanceCount, and no
// compute slice shared with another compute instance
// (ERROR_INSUFFICIENT_RESOURCES). gi.gpu.mu is held.
func (gi *simGI) fits(profile nvml.ComputeInstanceProfileInfo, p nvml.ComputeInstancePlacement) nvml.Return {
	if !slices.Contains(gi.ciPlacements(profile), p) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if same, clash := crowding(gi.cis, profile.Id, p.Start, p.Size); clash || same >= profile.InstanceCount || len(gi.cis) >= migMaxComputeInsts {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

// choose returns the first placement where a compute instance of profile
// fits: the simulation's choice for CreateComputeInstance. gi.gpu.mu is
// held.
func (gi *simGI) choose(profile nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstancePlacement, bool) {
	for _, p := range gi.ciPlacements(profile) {
		if gi.fits(profile, p) == nvml.SUCCESS {
			return p, true
		}
	}
	return nvml.ComputeInstancePlacement{}, false
}

func (gi *simGI) freeCIID() int {
	for id := 0; id < migMaxComputeInsts; id++ {
		if _, taken := gi.cis[id]; !taken {
			return id
		}
	}
	return -1
}

// createCI creates a compute instance that fits; id < 0 picks the lowest
// free ID, migUUID "" draws a new UUID (as the driver does for every new
// MIG device). gi.gpu.mu is held.
func (gi *simGI) createCI(profile nvml.ComputeInstanceProfileInfo, p nvml.ComputeInstancePlacement, id int, migUUID string) (*simCI, nvml.Return) {
	g := gi.gpu
	if id < 0 {
		id = gi.freeCIID()
	}
	if _, taken := gi.cis[id]; taken || id < 0 || id >= migMaxComputeInsts {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	if migUUID == "" {
		migUUID = "MIG-" + uuid.NewString()
	}
	ci := &simCI{gi: gi, id: id, profile: profile, placement: p, uuid: migUUID}
	ci.install()
	gi.cis[id] = ci
	if ret := g.persist(); ret != nvml.SUCCESS {
		delete(gi.cis, id)
		return nil, ret
	}
	g.node.migs.Store(migUUID, ci)
	return ci, nvml.SUCCESS
}

func (ci *simCI) install() {
	gi := ci.gi
	g := gi.gpu
	h := &mock.ComputeInstance{}
	ci.handle = h
	h.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return liveInfo(g, &ci.destroyed, func() nvml.ComputeInstanceInfo {
			// nvml.h calls the device "Parent device", yet NVIDIA's DRA
			// driver reads the MIG device's UUID from it
			// (dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/nvlib.go), so
			// the driver must give the MIG device; a machine can ask for
			// the documented parent instead.
			dev := nvml.Device(ci.mig)
			if g.node.ciInfoParent {
				dev = g.dev
			}
			return nvml.ComputeInstanceInfo{Device: dev, GpuInstance: gi.handle, Id: uint32(ci.id), ProfileId: ci.profile.Id, Placement: ci.placement}
		})
	}
	// The MIG device goes with its compute instance.
	h.DestroyFunc = func() nvml.Return {
		return destroy(g, &ci.destroyed, gi.cis, ci.id, nil, func() { g.node.migs.Delete(ci.uuid) })
	}

	cfg := g.dev.Config
	m := &mock.Device{}
	ci.mig = m
	m.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	m.GetUUIDFunc = func() (string, nvml.Return) { return ci.uuid, nvml.SUCCESS }
	m.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return gi.id, nvml.SUCCESS }
	m.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return ci.id, nvml.SUCCESS }
	m.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return g.dev, nvml.SUCCESS }
	m.GetIndexFunc = func() (int, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, other := range g.migDevices() {
			if other == ci {
				return i, nvml.SUCCESS
			}
		}
		return 0, nvml.ERROR_NOT_FOUND
	}
	m.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:       ci.profile.MultiprocessorCount,
			SharedCopyEngineCount:     gi.profile.CopyEngineCount,
			SharedDecoderCount:        gi.profile.DecoderCount,
			SharedEncoderCount:        gi.profile.EncoderCount,
			SharedJpegCount:           gi.profile.JpegCount,
			SharedOfaCount:            gi.profile.OfaCount,
			GpuInstanceSliceCount:     gi.profile.SliceCount,
			ComputeInstanceSliceCount: ci.profile.SliceCount,
			MemorySizeMB:              gi.profile.MemorySizeMB,
		}, nvml.SUCCESS
	}
	m.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := gi.profile.MemorySizeMB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	m.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	m.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	m.GetNameFunc = func() (string, nvml.Return) { return cfg.Name, nvml.SUCCESS }
	m.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return cfg.Architecture, nvml.SUCCESS }
	m.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return cfg.Brand, nvml.SUCCESS }
	m.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return cfg.CudaMajor, cfg.CudaMinor, nvml.SUCCESS }
}

// String names a simulated GPU in errors.
func (g *simGPU) String() string {
	return fmt.Sprintf("GPU %d (%s, %s)", g.index, g.dev.UUID, g.model)
}
