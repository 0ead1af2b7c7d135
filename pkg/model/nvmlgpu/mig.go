package nvmlgpu

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// Dynamic MIG: Facet creates a GPU instance (GI) at the placement of the
// allocated MIG device, with one compute instance (CI) spanning it, when a
// claim is prepared, and destroys both when it is unprepared. These calls
// are the same for the real and the simulated NVML.
//
// They are safe for concurrent use. Calls on one GPU are serialized; calls
// on different GPUs do not wait for each other.

// MIGInstance is one GPU instance with its compute instance: a MIG device.
type MIGInstance struct {
	// ParentUUID and ParentIndex identify the physical GPU.
	ParentUUID  string
	ParentIndex int
	// Profile is the GPU instance profile's name as discovery names it
	// (MIGProfile.Name), e.g. "1g.10gb".
	Profile string
	// GIProfileID is NVML's GPU instance profile index, as in MIGProfile.
	// CIProfileID is the compute instance's profile ID
	// (ComputeInstanceInfo.ProfileId, equal to its
	// COMPUTE_INSTANCE_PROFILE_* index on A100, A30, H100, H200 and B200),
	// -1 for a GPU instance without compute instance.
	GIProfileID, CIProfileID int
	// GIProfileInfoID is the GPU instance profile's ID as nvidia-smi shows
	// it (GpuInstanceInfo.ProfileId), as in MIGProfile: 19 for a 1g.10gb
	// whose GIProfileID is 0.
	GIProfileInfoID int
	// Placement is the GPU instance's memory slices.
	Placement Placement
	// GIID and CIID are NVML's instance IDs; CIID is -1 for a GPU instance
	// without compute instance.
	GIID, CIID int
	// UUID is the MIG device's "MIG-..." UUID; empty without compute
	// instance.
	UUID string
}

// MIGPlacement names a GPU instance to create: a profile (by NVML index,
// MIGProfile.GIProfileID) and the start of one of its placements.
type MIGPlacement struct {
	GIProfileID int
	Start       int
}

// ErrMIGDisabled is wrapped by errors of MIG operations on a GPU whose MIG
// mode is off (see EnableMIG).
var ErrMIGDisabled = errors.New("MIG mode is disabled")

// ErrMIGModeFixed is wrapped by EnableMIG and DisableMIG on a GPU whose MIG
// mode Facet must not change (GPU.MIGModeFixed, MIGModeFixedReason).
var ErrMIGModeFixed = errors.New("this GPU's MIG mode is not for Facet to change")

// IsInsufficientResources reports whether err carries NVML's
// ERROR_INSUFFICIENT_RESOURCES: the instance does not fit next to the
// GPU's existing ones.
func IsInsufficientResources(err error) bool {
	return hasReturn(err, nvml.ERROR_INSUFFICIENT_RESOURCES)
}

// IsNotFound reports whether err carries NVML's ERROR_NOT_FOUND.
func IsNotFound(err error) bool { return hasReturn(err, nvml.ERROR_NOT_FOUND) }

// IsInUse reports whether err carries NVML's ERROR_IN_USE (e.g. a GPU
// instance that still has compute instances).
func IsInUse(err error) bool { return hasReturn(err, nvml.ERROR_IN_USE) }

func hasReturn(err error, ret nvml.Return) bool {
	var e nvmlReturnError
	return errors.As(err, &e) && e.ret == ret
}

// gpuState is the per-GPU state of MIG operations. mu serializes them.
type gpuState struct {
	uuid string

	mu sync.Mutex
	// dev is the GPU's handle, nil until resolved (and again after a MIG
	// mode change, which may reset the GPU).
	dev   nvml.Device
	index int
	// profiles are the GPU's MIG profiles as discovery reports them, and
	// infos NVML's profile infos by GI profile index; nil until loaded.
	profiles []MIGProfile
	infos    map[int]nvml.GpuInstanceProfileInfo
}

// gpu returns the GPU's state, locked, with its handle resolved. The caller
// unlocks it.
func (l *Library) gpu(uuid string) (*gpuState, error) {
	l.gpusMu.Lock()
	if l.gpus == nil {
		l.gpus = map[string]*gpuState{}
	}
	g, ok := l.gpus[uuid]
	if !ok {
		g = &gpuState{uuid: uuid}
		l.gpus[uuid] = g
	}
	l.gpusMu.Unlock()

	g.mu.Lock()
	if g.dev != nil {
		return g, nil
	}
	dev, ret := l.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		g.mu.Unlock()
		return nil, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetHandleByUUID", ret))
	}
	index, ret := dev.GetIndex()
	if ret != nvml.SUCCESS {
		g.mu.Unlock()
		return nil, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetIndex", ret))
	}
	g.dev, g.index = dev, index
	return g, nil
}

func (g *gpuState) String() string { return fmt.Sprintf("GPU %d (%s)", g.index, g.uuid) }

// migEnabled returns the current MIG mode; an error names the GPU and says
// when it has no MIG at all (IsNotSupported).
func (g *gpuState) migEnabled() (bool, error) {
	current, _, ret := g.dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return false, fmt.Errorf("%s does not support MIG: %w", g, nvmlError("nvmlDeviceGetMigMode", ret))
	}
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("%s: %w", g, nvmlError("nvmlDeviceGetMigMode", ret))
	}
	return current == nvml.DEVICE_MIG_ENABLE, nil
}

// requireMIG fails unless the GPU's MIG mode is on.
func (g *gpuState) requireMIG() error {
	on, err := g.migEnabled()
	if err != nil {
		return err
	}
	if !on {
		return fmt.Errorf("%s: %w (enable it first)", g, ErrMIGDisabled)
	}
	return nil
}

// loadProfiles reads the GPU's MIG profiles once, with discovery's code, so
// that instances carry the names devices are published under.
func (l *Library) loadProfiles(g *gpuState) error {
	if g.profiles != nil {
		return nil
	}
	// Names derive from the total (v1's equals v2's), as in discovery.
	mem, ret := g.dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("%s: %w", g, nvmlError("nvmlDeviceGetMemoryInfo", ret))
	}
	profiles, err := discoverMIGProfiles(nvdev.New(l.lib), g.dev, mem.Total)
	if err != nil {
		return fmt.Errorf("%s: MIG profiles: %w", g, err)
	}
	infos := map[int]nvml.GpuInstanceProfileInfo{}
	for _, p := range profiles {
		info, ret := g.dev.GetGpuInstanceProfileInfo(p.GIProfileID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%s: %w", g, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", p.GIProfileID), ret))
		}
		infos[p.GIProfileID] = info
	}
	g.profiles, g.infos = profiles, infos
	return nil
}

// profile returns the GPU's MIG profile with this GI profile index and the
// placement starting at start.
func (g *gpuState) profile(giProfileID, start int) (MIGProfile, Placement, error) {
	for _, p := range g.profiles {
		if p.GIProfileID != giProfileID {
			continue
		}
		for _, pl := range p.Placements {
			if pl.Start == start {
				return p, pl, nil
			}
		}
		var starts []string
		for _, pl := range p.Placements {
			starts = append(starts, fmt.Sprint(pl.Start))
		}
		return p, Placement{}, fmt.Errorf("%s: MIG %s (%s) has no placement starting at memory slice %d (starts: %s)",
			g, p.Name, p.describeIDs(), start, strings.Join(starts, ", "))
	}
	var known []string
	for _, p := range g.profiles {
		known = append(known, fmt.Sprintf("%d (%s, GI profile ID %d)", p.GIProfileID, p.Name, p.GIProfileInfoID))
	}
	return MIGProfile{}, Placement{}, fmt.Errorf("%s has no MIG profile with NVML GI profile index %d (known: %s)", g, giProfileID, strings.Join(known, ", "))
}

// EnableMIG turns the GPU's MIG mode on if it is off, and reports whether
// it changed it. It fails on a GPU without MIG (IsNotSupported), and when
// the driver accepts the change but has not made it: on some GPUs and
// platforms the new mode takes effect only after a GPU reset (nvidia-smi
// -r) or a reboot, and NVML reports the mode as pending.
func (l *Library) EnableMIG(parentUUID string) (changed bool, err error) {
	return l.setMIGMode(parentUUID, nvml.DEVICE_MIG_ENABLE)
}

// DisableMIG turns MIG mode off, so the GPU can be used whole again; it
// reports whether it changed anything. NVML refuses while GPU instances
// exist (ERROR_IN_USE). As with EnableMIG, a change the driver accepts but
// has not made (a GPU reset is needed) is an error that says so.
func (l *Library) DisableMIG(parentUUID string) (changed bool, err error) {
	return l.setMIGMode(parentUUID, nvml.DEVICE_MIG_DISABLE)
}

// setMIGMode moves the GPU's MIG mode to want (DEVICE_MIG_ENABLE or
// DEVICE_MIG_DISABLE).
func (l *Library) setMIGMode(parentUUID string, want int) (changed bool, err error) {
	verb, state := "enable", "enable"
	if want == nvml.DEVICE_MIG_DISABLE {
		verb, state = "disable", "disable"
	}
	g, err := l.gpu(parentUUID)
	if err != nil {
		return false, err
	}
	defer g.mu.Unlock()
	current, pending, ret := g.dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return false, fmt.Errorf("%s MIG: %s does not support MIG: %w", verb, g, nvmlError("nvmlDeviceGetMigMode", ret))
	}
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("%s MIG on %s: %w", verb, g, nvmlError("nvmlDeviceGetMigMode", ret))
	}
	if current == want {
		return false, nil
	}
	if pending == want {
		return false, fmt.Errorf("%s MIG on %s: MIG mode is pending %s: reset the GPU (nvidia-smi -r -i %d) or reboot to activate it", verb, g, state, g.index)
	}
	arch, ret := g.dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("%s MIG on %s: %w", verb, g, nvmlError("nvmlDeviceGetArchitecture", ret))
	}
	guest, err := vgpuGuest(g.dev)
	if err != nil {
		return false, fmt.Errorf("%s MIG on %s: %w", verb, g, err)
	}
	if why := MIGModeFixedReason(arch, guest); why != "" {
		return false, fmt.Errorf("%s MIG on %s: refused: %s: %w", verb, g, why, ErrMIGModeFixed)
	}
	ret, activation := g.dev.SetMigMode(want)
	// NVML may reset the GPU to change the mode, after which the handle
	// and its attributes must be read again.
	dev, index := g.dev, g.index
	g.dev = nil
	if ret != nvml.SUCCESS {
		return false, fmt.Errorf("%s MIG on GPU %d (%s): %w", verb, index, g.uuid, nvmlError("nvmlDeviceSetMigMode", ret))
	}
	current, pending, ret = dev.GetMigMode()
	if ret == nvml.SUCCESS && current == want {
		return true, nil
	}
	// The driver took the change but holds it for a reset: take it back,
	// so the GPU does not change mode at the next reboot under whatever
	// runs on it then.
	reverted := ""
	if ret == nvml.SUCCESS && pending == want && current != want {
		if rret, _ := dev.SetMigMode(current); rret == nvml.SUCCESS {
			if _, p, gret := dev.GetMigMode(); gret == nvml.SUCCESS && p == current {
				reverted = "; Facet took the pending change back"
			}
		}
		if reverted == "" {
			reverted = "; taking the pending change back failed, so the GPU will change mode at its next reset"
		}
	}
	status := "activation status: " + nvml.ErrorString(activation)
	if ret != nvml.SUCCESS {
		status += "; nvmlDeviceGetMigMode: " + nvml.ErrorString(ret)
	} else if pending == want {
		status += "; MIG mode is pending " + state
	}
	return false, fmt.Errorf("%s MIG on GPU %d (%s): the driver accepted the change but has not made it (%s%s): reset the GPU (nvidia-smi -r -i %d) or reboot to %s MIG mode: %w",
		verb, index, g.uuid, status, reverted, index, verb, nvmlReturnError{activation})
}

// CreateMIG creates a GPU instance of the profile at the placement starting
// at memory slice placementStart, then the compute instance that spans it.
// If the compute instance cannot be created, or its MIG device not found,
// the GPU instance is destroyed again. The GPU's MIG mode must be on
// (ErrMIGDisabled).
//
// Errors name the GPU, the profile and the placement; an instance that does
// not fit next to the GPU's others fails with IsInsufficientResources.
func (l *Library) CreateMIG(parentUUID string, giProfileID, placementStart int) (MIGInstance, error) {
	g, err := l.gpu(parentUUID)
	if err != nil {
		return MIGInstance{}, err
	}
	defer g.mu.Unlock()
	if err := g.requireMIG(); err != nil {
		return MIGInstance{}, fmt.Errorf("create MIG instance: %w", err)
	}
	if err := l.loadProfiles(g); err != nil {
		return MIGInstance{}, err
	}
	p, pl, err := g.profile(giProfileID, placementStart)
	if err != nil {
		return MIGInstance{}, fmt.Errorf("create MIG instance: %w", err)
	}
	what := describeMIG(p, pl, g)
	info := g.infos[giProfileID]
	gi, ret := g.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
	if ret != nvml.SUCCESS {
		return MIGInstance{}, fmt.Errorf("create %s: %w", what, nvmlError("nvmlDeviceCreateGpuInstanceWithPlacement", ret))
	}
	inst, err := l.createCI(g, gi, p)
	if err != nil {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("and destroying the GPU instance again failed, it is left behind: %w", nvmlError("nvmlGpuInstanceDestroy", ret)))
		}
		return MIGInstance{}, fmt.Errorf("create %s: %w", what, err)
	}
	return inst, nil
}

// describeMIG names a MIG instance in errors, e.g. "MIG 1g.10gb (GI
// profile ID 19, NVML index 0) at placement 3:1 (memory slice 3) on GPU 2
// (GPU-...)".
func describeMIG(p MIGProfile, pl Placement, g *gpuState) string {
	slices := fmt.Sprintf("memory slice %d", pl.Start)
	if pl.Size > 1 {
		slices = fmt.Sprintf("memory slices %d-%d", pl.Start, pl.Start+pl.Size-1)
	}
	return fmt.Sprintf("MIG %s (%s) at placement %d:%d (%s) on %s", p.Name, p.describeIDs(), pl.Start, pl.Size, slices, g)
}

// describeIDs gives both numbers of a GI profile, as people compare them
// with `nvidia-smi mig -lgip` and with NVML code: "GI profile ID 19, NVML
// index 0".
func (p MIGProfile) describeIDs() string {
	return fmt.Sprintf("GI profile ID %d, NVML index %d", p.GIProfileInfoID, p.GIProfileID)
}

// createCI creates the compute instance spanning gi and finds its MIG
// device.
func (l *Library) createCI(g *gpuState, gi nvml.GpuInstance, p MIGProfile) (MIGInstance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return MIGInstance{}, nvmlError("nvmlGpuInstanceGetInfo", ret)
	}
	ciProfile, ret := gi.GetComputeInstanceProfileInfo(p.CIProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return MIGInstance{}, nvmlError(fmt.Sprintf("nvmlGpuInstanceGetComputeInstanceProfileInfo(%d)", p.CIProfileID), ret)
	}
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return MIGInstance{}, nvmlError("nvmlGpuInstanceCreateComputeInstance", ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret == nvml.SUCCESS {
		inst := MIGInstance{
			ParentUUID: g.uuid, ParentIndex: g.index, Profile: p.Name,
			GIProfileID: p.GIProfileID, GIProfileInfoID: int(giInfo.ProfileId), CIProfileID: int(ciInfo.ProfileId),
			Placement: Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
			GIID:      int(giInfo.Id), CIID: int(ciInfo.Id),
		}
		var err error
		if inst.UUID, err = (&migUUIDs{l: l, g: g}).find(ciInfo.Device, inst.GIID, inst.CIID); err == nil {
			return inst, nil
		}
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, nvmlError("nvmlComputeInstanceDestroy", ret))
		}
		return MIGInstance{}, err
	}
	err := nvmlError("nvmlComputeInstanceGetInfo", ret)
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		err = errors.Join(err, nvmlError("nvmlComputeInstanceDestroy", ret))
	}
	return MIGInstance{}, err
}

// migUUIDs finds the UUIDs of a GPU's MIG devices. Walking the GPU's MIG
// device handles (nvmlDeviceGetMigDeviceHandleByIndex up to
// nvmlDeviceGetMaxMigDeviceCount) costs an NVML call per possible MIG
// device, each slow on a busy driver: NVIDIA's DRA driver measured O(10 s)
// under load and reads the UUID from the compute instance instead
// (dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/nvlib.go). So does find,
// and it walks only when both direct ways fail, at most once per migUUIDs.
// g.mu is held.
type migUUIDs struct {
	l *Library
	g *gpuState
	// walked maps (GI ID, CI ID) to UUID once walked.
	walked map[[2]int]string
}

// find returns the UUID of the MIG device of compute instance ciID in GPU
// instance giID, given the device its nvmlComputeInstanceGetInfo reported.
// It tries, in order:
//
//  1. that device: NVIDIA's DRA driver takes it as the MIG device, but
//     nvml.h documents it as the "Parent device", so it counts only if it
//     is a MIG device handle with these GI and CI IDs;
//  2. nvmlDeviceGetHandleByUUID("MIG-<parent UUID>/<GI ID>/<CI ID>"), the
//     name NVML documents for a MIG device besides its UUID;
//  3. the walk, once: later instances are looked up in what it found.
func (m *migUUIDs) find(ciDevice nvml.Device, giID, ciID int) (string, error) {
	g := m.g
	uuid, why := migDeviceUUID(ciDevice, giID, ciID)
	if uuid != "" {
		klog.V(4).InfoS("MIG device UUID from its compute instance's info", "gpu", g.uuid, "gi", giID, "ci", ciID, "uuid", uuid)
		return uuid, nil
	}
	if m.walked != nil {
		// This driver answered neither way for an earlier instance.
		return m.fromWalk(giID, ciID)
	}
	name := fmt.Sprintf("MIG-%s/%d/%d", g.uuid, giID, ciID)
	dev, ret := m.l.lib.DeviceGetHandleByUUID(name)
	if ret != nvml.SUCCESS {
		why += "; " + nvmlError("nvmlDeviceGetHandleByUUID("+name+")", ret).Error()
	} else if uuid, whyNot := migDeviceUUID(dev, giID, ciID); uuid != "" {
		klog.V(4).InfoS("MIG device UUID by its GPU and instance IDs", "gpu", g.uuid, "gi", giID, "ci", ciID, "uuid", uuid, "computeInstanceDevice", why)
		return uuid, nil
	} else {
		why += "; " + name + ": " + whyNot
	}
	klog.V(4).InfoS("Walking the GPU's MIG devices for a MIG device UUID", "gpu", g.uuid, "gi", giID, "ci", ciID, "why", why)
	walked, err := g.walkMIGDevices()
	if err != nil {
		return "", err
	}
	m.walked = walked
	return m.fromWalk(giID, ciID)
}

func (m *migUUIDs) fromWalk(giID, ciID int) (string, error) {
	if uuid := m.walked[[2]int{giID, ciID}]; uuid != "" {
		return uuid, nil
	}
	return "", fmt.Errorf("%w for GPU instance %d compute instance %d", errNoMIGDevice, giID, ciID)
}

// errNoMIGDevice is wrapped by migUUIDs.find when no way finds the compute
// instance's MIG device.
var errNoMIGDevice = errors.New("no MIG device")

// migDeviceUUID returns dev's UUID if it is the MIG device of these GPU and
// compute instances, or "" and why not.
func migDeviceUUID(dev nvml.Device, giID, ciID int) (uuid, why string) {
	if dev == nil {
		return "", "no device"
	}
	isMIG, ret := dev.IsMigDeviceHandle()
	if ret != nvml.SUCCESS {
		return "", nvmlError("nvmlDeviceIsMigDeviceHandle", ret).Error()
	}
	if !isMIG {
		return "", "not a MIG device handle"
	}
	gi, ret := dev.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return "", nvmlError("nvmlDeviceGetGpuInstanceId", ret).Error()
	}
	ci, ret := dev.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return "", nvmlError("nvmlDeviceGetComputeInstanceId", ret).Error()
	}
	if gi != giID || ci != ciID {
		return "", fmt.Sprintf("the MIG device of GPU instance %d compute instance %d", gi, ci)
	}
	uuid, ret = dev.GetUUID()
	if ret != nvml.SUCCESS {
		return "", nvmlError("nvmlDeviceGetUUID", ret).Error()
	}
	if uuid == "" {
		return "", "empty UUID"
	}
	return uuid, ""
}

// walkMIGDevices maps (GI ID, CI ID) to MIG device UUID for every MIG device
// of the GPU.
func (g *gpuState) walkMIGDevices() (map[[2]int]string, error) {
	count, ret := g.dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetMaxMigDeviceCount", ret)
	}
	out := map[[2]int]string{}
	for i := 0; i < count; i++ {
		mig, ret := g.dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d)", i), ret)
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, nvmlError("nvmlDeviceGetGpuInstanceId", ret)
		}
		ci, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, nvmlError("nvmlDeviceGetComputeInstanceId", ret)
		}
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, nvmlError("nvmlDeviceGetUUID", ret)
		}
		out[[2]int{gi, ci}] = uuid
	}
	return out, nil
}

// DestroyMIG destroys compute instance ciID of GPU instance giID, then the
// GPU instance. An instance that is already gone is not an error, so it
// can be retried, and a GPU whose MIG mode is off has none. A GPU instance
// that still has other compute instances is left alone (IsInUse). ciID -1
// (as ListMIG reports a GPU instance without compute instances, what a
// crash inside CreateMIG leaves) destroys the GPU instance alone.
func (l *Library) DestroyMIG(parentUUID string, giID, ciID int) error {
	g, err := l.gpu(parentUUID)
	if err != nil {
		return err
	}
	defer g.mu.Unlock()
	what := fmt.Sprintf("MIG GPU instance %d compute instance %d on %s", giID, ciID, g)
	on, err := g.migEnabled()
	if err != nil {
		return fmt.Errorf("destroy %s: %w", what, err)
	}
	if !on {
		return nil
	}
	gi, ret := g.dev.GetGpuInstanceById(giID)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("destroy %s: %w", what, nvmlError("nvmlDeviceGetGpuInstanceById", ret))
	}
	ci, ret := nvml.ComputeInstance(nil), nvml.ERROR_NOT_FOUND
	if ciID >= 0 {
		ci, ret = gi.GetComputeInstanceById(ciID)
	}
	switch ret {
	case nvml.SUCCESS:
		if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
			return fmt.Errorf("destroy %s: %w", what, nvmlError("nvmlComputeInstanceDestroy", ret))
		}
	case nvml.ERROR_NOT_FOUND:
	default:
		return fmt.Errorf("destroy %s: %w", what, nvmlError("nvmlGpuInstanceGetComputeInstanceById", ret))
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		if ret == nvml.ERROR_IN_USE {
			return fmt.Errorf("destroy %s: the GPU instance has other compute instances: %w", what, nvmlError("nvmlGpuInstanceDestroy", ret))
		}
		return fmt.Errorf("destroy %s: %w", what, nvmlError("nvmlGpuInstanceDestroy", ret))
	}
	return nil
}

// ListMIG returns every MIG instance on every GPU whose MIG mode is on, by
// GPU index, GI ID and CI ID: one entry per compute instance, and one with
// CIID -1 for a GPU instance without any (what a crash between creating the
// two leaves). It sees instances Facet did not create, too, which is what a
// plugin needs at startup to find the ones no prepared claim owns.
func (l *Library) ListMIG() ([]MIGInstance, error) {
	count, ret := l.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetCount", ret)
	}
	var out []MIGInstance
	for i := 0; i < count; i++ {
		dev, ret := l.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %w", i, nvmlError("nvmlDeviceGetHandleByIndex", ret))
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %w", i, nvmlError("nvmlDeviceGetUUID", ret))
		}
		insts, err := l.listGPU(uuid)
		if err != nil {
			return nil, err
		}
		out = append(out, insts...)
	}
	return out, nil
}

// ListMIGOn is ListMIG for one GPU, so that an NVML error on one GPU does
// not hide the instances of the others.
func (l *Library) ListMIGOn(parentUUID string) ([]MIGInstance, error) {
	return l.listGPU(parentUUID)
}

func (l *Library) listGPU(uuid string) ([]MIGInstance, error) {
	g, err := l.gpu(uuid)
	if err != nil {
		return nil, err
	}
	defer g.mu.Unlock()
	on, err := g.migEnabled()
	if IsNotSupported(err) || (err == nil && !on) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := l.loadProfiles(g); err != nil {
		return nil, err
	}
	uuids := &migUUIDs{l: l, g: g}
	var out []MIGInstance
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := g.dev.GetGpuInstanceProfileInfo(id)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list MIG instances of %s: %w", g, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", id), ret))
		}
		gis, ret := g.dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list MIG instances of %s: %w", g, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstances(%d)", id), ret))
		}
		name := fmt.Sprintf("profile-%d", id)
		for _, p := range g.profiles {
			if p.GIProfileID == id {
				name = p.Name
			}
		}
		for _, gi := range gis {
			insts, err := listGI(gi, uuids)
			if err != nil {
				return nil, fmt.Errorf("list MIG instances of %s: %w", g, err)
			}
			for _, inst := range insts {
				inst.ParentUUID, inst.ParentIndex, inst.Profile, inst.GIProfileID = g.uuid, g.index, name, id
				out = append(out, inst)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GIID != out[j].GIID {
			return out[i].GIID < out[j].GIID
		}
		return out[i].CIID < out[j].CIID
	})
	return out, nil
}

// listGI returns a GPU instance's compute instances, with their MIG devices'
// UUIDs, or the GPU instance alone (CIID -1) when it has none.
func listGI(gi nvml.GpuInstance, uuids *migUUIDs) ([]MIGInstance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlGpuInstanceGetInfo", ret)
	}
	base := MIGInstance{
		GIProfileInfoID: int(giInfo.ProfileId),
		GIID:            int(giInfo.Id),
		Placement:       Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
		CIID:            -1, CIProfileID: -1,
	}
	var out []MIGInstance
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlGpuInstanceGetComputeInstanceProfileInfo(%d)", id), ret)
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlGpuInstanceGetComputeInstances(%d)", id), ret)
		}
		for _, ci := range cis {
			ciInfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, nvmlError("nvmlComputeInstanceGetInfo", ret)
			}
			inst := base
			inst.CIID, inst.CIProfileID = int(ciInfo.Id), int(ciInfo.ProfileId)
			uuid, err := uuids.find(ciInfo.Device, inst.GIID, inst.CIID)
			if err != nil && !errors.Is(err, errNoMIGDevice) {
				return nil, err
			}
			inst.UUID = uuid
			out = append(out, inst)
		}
	}
	if len(out) == 0 {
		out = append(out, base)
	}
	return out, nil
}

// CanCreateTogether reports whether GPU instances at these placements can
// all exist at once on the GPU, next to the instances it already has: it
// creates them in order, stops at the first that NVML refuses for lack of
// resources (IsInsufficientResources), and destroys what it created, so
// the GPU is left as it was. It is the hardware's answer to "would the
// allocator be right to allocate these MIG devices together?".
//
// It creates GPU instances only: the compute instance spanning a GPU
// instance can always be created in it, so it does not change the answer.
// The GPU's MIG mode must be on. A profile or placement the GPU does not
// have is an error, not false. On a simulated GPU a call costs
// microseconds; give the library no state file (WithStateFile) when calling
// it in bulk, or every create and destroy is written to disk.
func (l *Library) CanCreateTogether(parentUUID string, placements []MIGPlacement) (ok bool, err error) {
	g, err := l.gpu(parentUUID)
	if err != nil {
		return false, err
	}
	defer g.mu.Unlock()
	if err := g.requireMIG(); err != nil {
		return false, err
	}
	if err := l.loadProfiles(g); err != nil {
		return false, err
	}
	var created []nvml.GpuInstance
	defer func() {
		for i := len(created) - 1; i >= 0; i-- {
			if ret := created[i].Destroy(); ret != nvml.SUCCESS {
				err = errors.Join(err, fmt.Errorf("%s: destroying a trial GPU instance failed, it is left behind: %w", g, nvmlError("nvmlGpuInstanceDestroy", ret)))
				ok = false
			}
		}
	}()
	for _, want := range placements {
		p, pl, err := g.profile(want.GIProfileID, want.Start)
		if err != nil {
			return false, err
		}
		info := g.infos[p.GIProfileID]
		gi, ret := g.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
			return false, nil
		}
		if ret != nvml.SUCCESS {
			return false, fmt.Errorf("%s: %w", describeMIG(p, pl, g), nvmlError("nvmlDeviceCreateGpuInstanceWithPlacement", ret))
		}
		created = append(created, gi)
	}
	return true, nil
}
