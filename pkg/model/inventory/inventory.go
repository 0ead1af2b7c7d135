// Package inventory is Facet's model of a node: which DRA devices each
// physical GPU offers, under which mode, which shared counters encode the
// GPU's MIG placement rules, and how to find a device again by name when a
// claim that names it is prepared.
//
// Data flows one way: nvmlgpu.Node (discovery) → Inventory → ResourceSlices
// (package slices) and → prepare (package dradriver).
//
// The model is described in docs/design/resource-model.md; in short,
// per physical GPU i:
//
//	mode       devices                                              counters
//	exclusive  gpu-i (one claim at a time)                          none
//	mig        gpu-i (one claim, consumes all of i's counters)      gpu-i-counters
//	           + gpu-i-mig-<profile>-<start> for every placement
//	shared     gpu-i (allowMultipleAllocations, memory+cores)       none
//	dynamic    gpu-i (allowMultipleAllocations, consumes all)       gpu-i-counters
//	           + every MIG placement
//	static-mig gpu-i-mig-<profile>-<start> per existing MIG instance none
//	slots      gpu-i-slot-<k> per fixed-size vGPU slot              none
//
// A GPU whose MIG mode Facet does not change (before Hopper, or a vGPU
// guest: nvmlgpu.GPU.MIGModeFixed) serves only what its MIG mode allows
// (fixedMIGMode): with MIG mode off no MIG devices, with it on no gpu-i
// (mig publishes its placements alone; other modes become static-mig).
//
// mig, shared and dynamic need DRA features that are alpha and off in
// Kubernetes 1.35 (package features); exclusive, static-mig and slots use
// GA fields only and work on every 1.35 cluster.
package inventory

import (
	"fmt"
	"sort"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// Mode says how a physical GPU may be used. Modes are exclusive per GPU.
// Their words, published as the mode attribute, live in package names, the
// one home of published words, which the cluster wing reads.
type Mode string

const (
	// ModeAuto is not a mode of its own but the default policy; see
	// resolveAuto.
	ModeAuto Mode = "auto"
	// ModeExclusive publishes gpu-<i> alone, for one claim at a time.
	ModeExclusive Mode = names.ModeExclusive
	// ModeMIG publishes gpu-<i> for one claim at a time plus every MIG
	// profile × placement as its own device. A shared counter set encodes
	// which placements fit together; gpu-<i> consumes all of it, so the
	// whole GPU and MIG instances exclude each other. Non-MIG GPUs fall back
	// to ModeExclusive.
	ModeMIG Mode = names.ModeMIG
	// ModeShared publishes gpu-<i> as a multi-allocatable device with
	// consumable `memory` and `cores` capacity (vGPU shares enforced by
	// HAMi-core at prepare). No MIG, no counters.
	ModeShared Mode = names.ModeShared
	// ModeDynamic is ModeShared plus every MIG placement: gpu-<i> consumes
	// all of the GPU's counters (charged once, by its first share), so vGPU
	// shares and MIG instances exclude each other per GPU. Non-MIG GPUs fall
	// back to ModeShared. On Kubernetes 1.35 this mode meets two allocator
	// bugs (kubernetes#139034, kubernetes#140436); see resolveAuto.
	ModeDynamic Mode = names.ModeDynamic
	// ModeStaticMIG publishes each MIG instance that exists on the GPU (made
	// by mig-parted, the GPU Operator, an admin, or Facet applying a
	// layout at start) as a plain device. Prepare carves and destroys
	// nothing. GA fields only: works on stock Kubernetes 1.35.
	ModeStaticMIG Mode = names.ModeStaticMIG
	// ModeSlots splits the GPU into fixed-size vGPU slots (a SlotLayout),
	// each a plain device with its memory and compute share as capacity,
	// enforced by HAMi-core at prepare, like NVIDIA vGPU profiles. GA fields
	// only: works on stock Kubernetes 1.35.
	ModeSlots Mode = names.ModeSlots
)

// Needs lists the DRA feature gates a mode's ResourceSlices need the
// cluster to enforce; the API server silently drops the fields of a gate
// that is off, and the scheduler then over-commits the GPU.
// MaxDevicesPerSliceCounters is the API's limit on devices in one
// ResourceSlice when any of them consumes counters or has taints: 64.
// k8s.io/api names it ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
// in v0.35 and ResourceSliceMaxDevicesWithAdvancedFeatures from v0.36;
// Facet keeps its own name so that it builds against each (the allocator
// tests run on v0.35, v0.36 and v0.37: hack/allocator-matrix.sh), and a
// test pins it to v0.35's.
const MaxDevicesPerSliceCounters = 64

func (m Mode) Needs() []features.Gate {
	switch m {
	case ModeMIG:
		return []features.Gate{features.PartitionableDevices}
	case ModeShared:
		return []features.Gate{features.ConsumableCapacity}
	case ModeDynamic:
		return []features.Gate{features.PartitionableDevices, features.ConsumableCapacity}
	}
	return nil
}

// Modes lists the modes (and the auto policy) this build accepts.
var Modes = []Mode{ModeAuto, ModeExclusive, ModeMIG, ModeShared, ModeDynamic, ModeStaticMIG, ModeSlots}

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) { return names.Parse(s, "mode", Modes...) }

// Order is how devices of several GPUs are ordered inside one ResourceSlice.
// The allocator takes the first device that fits, in slice order; the
// order of the slices themselves is random in the 1.35 scheduler (see
// slices.Resources for what that leaves of binpack and spread).
type Order string

const (
	// OrderBinpack lists each GPU's devices together, GPUs by index: a GPU
	// is filled before the next one in the same slice is touched.
	OrderBinpack Order = "binpack"
	// OrderSpread interleaves the GPUs of a slice device by device
	// (gpu-a, gpu-b, a's first MIG placement, b's first, ...), so equal MIG
	// claims take turns among those GPUs.
	OrderSpread Order = "spread"
	// OrderProfile lays dynamic MIG devices out one slice per profile,
	// across all GPUs, GPU after GPU: equal MIG claims fill one GPU before
	// the next, node-wide, whatever order the scheduler lists the slices
	// in. A claim that several profiles satisfy (a memory selector) then
	// gets one of them at random, not the smallest.
	OrderProfile Order = "profile"
)

// Orders lists the known orders.
var Orders = []Order{OrderBinpack, OrderSpread, OrderProfile}

// ParseOrder checks an order name.
func ParseOrder(s string) (Order, error) { return names.Parse(s, "order", Orders...) }

// Kind is what a device is.
type Kind string

const (
	// KindGPU is a whole physical GPU (or, when Shareable, a pool of vGPU
	// shares of it).
	KindGPU Kind = names.KindGPU
	// KindMIG is one MIG instance: a GPU instance of one profile at one
	// placement, with one compute instance spanning all of it. In
	// static-mig mode the instance exists already (Device.Instance).
	KindMIG Kind = names.KindMIG
	// KindSlot is one fixed-size vGPU slot (Device.Slot) of a GPU in slots
	// mode.
	KindSlot Kind = names.KindVGPUSlot
)

// Device is one DRA device of the inventory.
type Device struct {
	// Name is the DRA device name, unique in the node's pool, e.g. "gpu-3"
	// or "gpu-3-mig-1g10gb-6".
	Name string
	Kind Kind
	// GPU is the physical GPU the device lives on.
	GPU *GPU
	// Shareable is set on gpu-<i> in shared and dynamic mode: the device
	// allows multiple allocations, each consuming part of its `memory` and
	// `cores` capacity.
	Shareable bool
	// MIG is the profile of a KindMIG device (GIProfileID and CIProfileID are
	// what prepare creates); nil otherwise.
	MIG *nvmlgpu.MIGProfile
	// Placement is a KindMIG device's memory-slice range [Start, Start+Size).
	Placement nvmlgpu.Placement
	// Counters are the names of the counters, in GPU.CounterSet, that the
	// device consumes (one unit each); empty when it consumes none.
	Counters []string
	// Instance is the existing MIG instance a static-mig device stands
	// for; nil for every other device.
	Instance *nvmlgpu.MIGInstance
	// Slot is a KindSlot device's share of its GPU; nil otherwise.
	Slot *Slot
}

// GPU is a physical GPU with the mode it is published under.
type GPU struct {
	nvmlgpu.GPU
	// Mode is the mode in force (never ModeAuto).
	Mode Mode
	// ModeRequested is what the configuration asked for (possibly ModeAuto).
	ModeRequested Mode
	// ModeNote says why Mode differs from ModeRequested; empty when the
	// request was taken as is. A fallback (mig or dynamic on a GPU without
	// MIG, or with MIG tables the counters cannot express exactly) is also
	// listed in Inventory.Notes.
	ModeNote string
	// CounterSet names the GPU's shared counter set; empty when the mode
	// uses no counters.
	CounterSet string
	// Counters lists the counter set's counters, each of value 1, in
	// publication order.
	Counters []string
	// ShareMemoryBytes is the memory, in bytes, that the GPU's vGPU shares
	// or slots publish and prepare admits together: MemoryBytes less
	// Config.MPSReserveBytes in shared, dynamic and slots modes, and
	// MemoryBytes in the others.
	ShareMemoryBytes int64
	// Devices are this GPU's devices in publication order: gpu-<i> first,
	// then MIG placements smallest profile first and, within a profile,
	// from the end of the GPU first.
	Devices []*Device
}

// Inventory is a node's devices.
type Inventory struct {
	// DriverVersion and CUDADriverVersion as discovered.
	DriverVersion     string
	CUDADriverVersion string
	GPUs              []*GPU
	// Order is how slices order the devices of several GPUs.
	Order Order
	// Notes are configuration fallbacks the plugin should log as warnings.
	Notes []string
	// Warnings are known defects of the cluster's allocator that the modes
	// in force meet without being refused (AllocatorDefects), one line
	// each; the plugin raises them as Node Events.
	Warnings []string
	// ComputePartitioning is the node's default partitioning of vGPU
	// shares and slots (names.PartitioningMPS or
	// names.PartitioningTimeSliced), published as their
	// computePartitioning attribute; empty: not published. The plugin
	// sets it once it knows whether MPS runs.
	ComputePartitioning string
	// MIGInUse are the GPUs, by UUID, where a prepared claim holds a MIG
	// instance carved at prepare (driver.Driver.MIGInUse); published as
	// the migInUse attribute of GPUs in mig and dynamic mode. Set with
	// WithMIGInUse.
	MIGInUse map[string]bool
	// IMEXChannel is the node's IMEX channel device, published as
	// names.IMEXChannelDevice beside the GPUs' devices; nil where the
	// node has none (see IMEXChannelOf).
	IMEXChannel *IMEXChannel
	// IMEXNote says why a node whose GPUs report a fabric clique has no
	// IMEX channel device; empty otherwise, and on nodes outside a
	// multi-node NVLink fabric.
	IMEXNote string
	byName   map[string]*Device
}

// IMEXChannel is a node's one IMEX channel device: the driver's channels
// and the fabric clique of the node's GPUs, which a ComputeDomain's
// channel claims select (docs/design/compute-domains.md). One device: a
// node serves one domain at a time.
type IMEXChannel struct {
	nvmlgpu.IMEXChannels
	// ClusterUUID and CliqueID are the GPUs' fabric clique
	// (nvmlDeviceGetGpuFabricInfo), published as the device's
	// fabricClusterUUID and fabricCliqueID.
	ClusterUUID string
	CliqueID    uint32
}

// Clique is the device's clique, "<fabricClusterUUID>.<fabricCliqueID>",
// as ComputeDomainStatus.Clique names one.
func (c *IMEXChannel) Clique() string { return fmt.Sprintf("%s.%d", c.ClusterUUID, c.CliqueID) }

// IMEXChannelOf is the IMEX channel device of a node whose driver offers
// channels (nil: none, or compute domains turned off) and whose GPUs are
// gpus: one device where every GPU reports the same fabric clique (fabric
// state completed, as discovery reads it). It returns nil and a note
// where the GPUs report a clique but no device can be published (no
// channels from the driver, GPUs in different cliques or some in none),
// and nil without a note on a node outside a multi-node NVLink fabric.
func IMEXChannelOf(gpus []nvmlgpu.GPU, channels *nvmlgpu.IMEXChannels) (*IMEXChannel, string) {
	var first *nvmlgpu.GPU
	var cliques []string
	differ := false
	for i := range gpus {
		g := &gpus[i]
		where := "none"
		if g.Fabric != nil {
			where = fmt.Sprintf("%s.%d", g.Fabric.ClusterUUID, g.Fabric.CliqueID)
			if first == nil {
				first = g
			}
		}
		cliques = append(cliques, fmt.Sprintf("GPU %d: %s", g.Index, where))
		if g.Fabric == nil || first == nil || *g.Fabric != *first.Fabric {
			differ = true
		}
	}
	switch {
	case first == nil:
		return nil, ""
	case differ:
		return nil, fmt.Sprintf("no IMEX channel device: the GPUs do not all report one fabric clique (%s), and a node's channel joins one clique", strings.Join(cliques, ", "))
	case channels == nil:
		return nil, fmt.Sprintf("no IMEX channel device: the GPUs are in fabric clique %s.%d, but the driver registers no %s major (NVreg_ImexChannelCount=0, or a driver before R550)",
			first.Fabric.ClusterUUID, first.Fabric.CliqueID, nvmlgpu.IMEXChannelsDriverName)
	}
	return &IMEXChannel{IMEXChannels: *channels, ClusterUUID: first.Fabric.ClusterUUID, CliqueID: first.Fabric.CliqueID}, ""
}

// Config chooses each GPU's mode.
type Config struct {
	// DefaultMode applies to GPUs without an entry in PerGPU; empty means
	// ModeAuto.
	DefaultMode Mode
	// PerGPU maps an NVML index to its mode.
	PerGPU map[int]Mode
	// Order of GPUs inside a slice; empty means OrderBinpack.
	Order Order
	// Features is what the cluster enforces. A mode that needs a gate it
	// lacks is refused, and ModeAuto picks among the modes it allows. nil
	// stands for a current cluster with every feature on (offline tools
	// and tests that are about the devices, not the cluster).
	Features *features.Set
	// MIGInstances are the MIG instances that exist on the node
	// (nvml ListMIG): what static-mig mode publishes, and what makes
	// ModeAuto choose static-mig for a GPU.
	MIGInstances []nvmlgpu.MIGInstance
	// DefaultSlots is the slot layout of slots-mode GPUs without an entry
	// in PerGPUSlots; nil means DefaultSlotLayout.
	DefaultSlots SlotLayout
	// PerGPUSlots maps an NVML index to its slot layout.
	PerGPUSlots map[int]SlotLayout
	// MPSReserveBytes is memory, in bytes (a multiple of 1 MiB), that each
	// GPU in shared, dynamic or slots mode keeps out of what its vGPU
	// shares and slots publish: the MPS server's own memory
	// (sharemem.MPSServerBytes), which no share's HAMi-core limit counts, where
	// the plugin partitions shares with MPS; 0 otherwise.
	MPSReserveBytes int64
	// IMEXChannels are the driver's IMEX channels
	// (nvmlgpu.ReadIMEXChannels): with GPUs in one fabric clique, the node
	// publishes an IMEX channel device (IMEXChannelOf). Nil: none, as
	// where compute domains are turned off.
	IMEXChannels *nvmlgpu.IMEXChannels
}

// gates returns the cluster's features, or every gate on for nil.
func (c Config) gates() features.Set {
	if c.Features != nil {
		return *c.Features
	}
	all := features.AllOn("assumed")
	all.ServerVersion = "v" + countersScaleFrom.String()
	return all
}

// Build turns a discovered node into an inventory. It fails when the
// configuration names a GPU the node does not have or an unknown mode, or
// when MIG profile names do not map to distinct device names. A GPU whose
// MIG tables the counter model cannot express exactly (NewMIGModel) falls
// back to the mode without MIG, with a note.
func Build(node *nvmlgpu.Node, cfg Config) (*Inventory, error) {
	if cfg.DefaultMode == "" {
		cfg.DefaultMode = ModeAuto
	}
	if cfg.Order == "" {
		cfg.Order = OrderBinpack
	}
	if _, err := ParseOrder(string(cfg.Order)); err != nil {
		return nil, err
	}
	inv := &Inventory{
		DriverVersion:     node.DriverVersion,
		CUDADriverVersion: node.CUDADriverVersion,
		Order:             cfg.Order,
		byName:            map[string]*Device{},
	}
	for _, per := range []map[int]bool{keys(cfg.PerGPU), keys(cfg.PerGPUSlots)} {
		for idx := range per {
			if idx < 0 || idx >= len(node.GPUs) {
				return nil, fmt.Errorf("mode or layout configured for GPU %d, but the node has GPUs 0-%d", idx, len(node.GPUs)-1)
			}
		}
	}
	gates := cfg.gates()
	instances := map[string][]nvmlgpu.MIGInstance{}
	for _, in := range cfg.MIGInstances {
		instances[in.ParentUUID] = append(instances[in.ParentUUID], in)
	}
	for _, g := range node.GPUs {
		requested := cfg.DefaultMode
		if m, ok := cfg.PerGPU[g.Index]; ok {
			requested = m
		}
		if _, err := ParseMode(string(requested)); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", g.Index, err)
		}
		if missing := gates.Missing(requested.Needs()...); len(missing) > 0 {
			return nil, fmt.Errorf("GPU %d: %w", g.Index, needsError(requested, missing, gates))
		}
		mode, note, fallback := resolveMode(requested, g, gates, len(instances[g.UUID]) > 0)
		if m, n := fixedMIGMode(g, requested, mode, gates); m != mode {
			mode, note, fallback = m, n, true
		}
		var model *MIGModel
		if mode == ModeMIG || mode == ModeDynamic {
			var err error
			if model, err = NewMIGModel(g.MIGProfiles); err != nil {
				was := mode
				mode = map[Mode]Mode{ModeMIG: ModeExclusive, ModeDynamic: ModeShared}[was]
				note = fmt.Sprintf("mode %s: the GPU's MIG tables cannot be published exactly (%v); using %s", was, err, mode)
				fallback = true
				// A GPU whose MIG mode stays on cannot be served whole
				// either: only the instances that exist.
				if m, n := fixedMIGMode(g, mode, mode, gates); m != mode {
					mode, note = m, note+"; "+n
				}
			}
		}
		// The upstream allocator's known defects on this version
		// (AllocatorDefects): a mode it can double-book is refused, as a
		// mode whose gates are off is; one it only delays gets a warning.
		for _, d := range defectsOf(mode, gates) {
			if d.Refuse {
				return nil, fmt.Errorf("GPU %d: %w", g.Index, defectError(mode, d, gates))
			}
			if w := defectWarning(mode, d, gates); !hasString(inv.Warnings, w) {
				inv.Warnings = append(inv.Warnings, w)
			}
		}
		gpu := &GPU{GPU: g, Mode: mode, ModeRequested: requested, ModeNote: note, ShareMemoryBytes: int64(g.MemoryBytes)}
		switch mode {
		case ModeShared, ModeDynamic, ModeSlots:
			if cfg.MPSReserveBytes < 0 || cfg.MPSReserveBytes%(1<<20) != 0 || cfg.MPSReserveBytes >= gpu.ShareMemoryBytes {
				return nil, fmt.Errorf("GPU %d (%s): MPS reserve of %d bytes: want whole MiB, less than the GPU's %d MiB", g.Index, g.ProductName, cfg.MPSReserveBytes, g.MemoryBytes>>20)
			}
			gpu.ShareMemoryBytes -= cfg.MPSReserveBytes
		}
		if fallback {
			inv.Notes = append(inv.Notes, fmt.Sprintf("GPU %d (%s): %s", g.Index, g.ProductName, note))
		}
		var err error
		switch mode {
		case ModeStaticMIG:
			var skipped []string
			skipped, err = gpu.buildStatic(instances[g.UUID])
			for _, s := range skipped {
				inv.Notes = append(inv.Notes, fmt.Sprintf("GPU %d (%s): %s", g.Index, g.ProductName, s))
			}
		case ModeSlots:
			layout := cfg.DefaultSlots
			if l, ok := cfg.PerGPUSlots[g.Index]; ok {
				layout = l
			}
			err = gpu.buildSlots(layout)
		default:
			err = gpu.build(model)
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %d (%s): %w", g.Index, g.ProductName, err)
		}
		for _, d := range gpu.Devices {
			if _, dup := inv.byName[d.Name]; dup {
				return nil, fmt.Errorf("internal error: device name %s used twice", d.Name)
			}
			inv.byName[d.Name] = d
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}
	inv.IMEXChannel, inv.IMEXNote = IMEXChannelOf(node.GPUs, cfg.IMEXChannels)
	return inv, nil
}

func hasString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// migUsable reports whether a GPU can be partitioned: MIG-capable, with
// at least one profile discovery could describe.
func migUsable(g nvmlgpu.GPU) bool { return g.MIGCapable && len(g.MIGProfiles) > 0 }

// resolveMode turns a requested mode into the one in force, with a note
// when they differ; fallback is set when the request could not be honoured.
// hasInstances says whether MIG instances exist on the GPU.
func resolveMode(requested Mode, g nvmlgpu.GPU, gates features.Set, hasInstances bool) (mode Mode, note string, fallback bool) {
	switch requested {
	case ModeAuto:
		return resolveAuto(g, gates, hasInstances)
	case ModeStaticMIG:
		if !g.MIGCapable {
			return ModeExclusive, "mode static-mig requested, but the GPU has no MIG; using exclusive", true
		}
	case ModeSlots:
		// Any GPU can be sliced by HAMi-core.
	case ModeMIG:
		if !migUsable(g) {
			return ModeExclusive, "mode mig requested, but the GPU has no MIG; using exclusive", true
		}
	case ModeDynamic:
		if !migUsable(g) {
			return ModeShared, "mode dynamic requested, but the GPU has no MIG; using shared", true
		}
	}
	return requested, "", false
}

// fixedMIGMode narrows a mode to what a GPU whose MIG mode Facet must not
// change (nvmlgpu.GPU.MIGModeFixed: before Hopper, or a vGPU guest) can serve
// in its current MIG mode, as NVIDIA's DRA driver does
// (cmd/gpu-kubelet-plugin/nvlib.go, isDynamicMIGCapable):
//   - MIG mode off: no MIG. mig becomes exclusive, dynamic shared; an
//     admin who wants MIG there turns MIG mode on and resets the GPU.
//   - MIG mode on (not in a vGPU guest): no whole GPU, which would need
//     MIG mode off. mig keeps its MIG devices without the whole GPU
//     (GPU.build), dynamic becomes mig, and exclusive, shared and slots
//     become static-mig (the instances that exist).
//   - A vGPU guest cannot create instances: mig and dynamic lose MIG as
//     above, whatever the mode.
//
// mode is the mode resolveMode gave for requested (which auto resolves to
// mode; resolveAuto already keeps a GPU whose MIG mode stays off out of
// mig). It returns the mode unchanged where nothing narrows it, else the
// mode in force and a note saying why, for the plugin's Event.
func fixedMIGMode(g nvmlgpu.GPU, requested, mode Mode, gates features.Set) (Mode, string) {
	if !g.MIGCapable || g.MIGModeFixed == "" {
		return mode, ""
	}
	why := func(to Mode) string {
		state := "off"
		if g.MIGEnabled {
			state = "on"
		}
		asked := "mode " + string(mode)
		if requested == ModeAuto {
			asked = "auto (" + string(mode) + ")"
		}
		return fmt.Sprintf("%s: MIG mode is %s and stays so (%s); using %s", asked, state, g.MIGModeFixed, to)
	}
	switch {
	case g.VGPUGuest || !g.MIGEnabled:
		switch mode {
		case ModeMIG:
			return ModeExclusive, why(ModeExclusive)
		case ModeDynamic:
			return ModeShared, why(ModeShared)
		}
	default: // MIG mode on, before Hopper
		switch mode {
		case ModeDynamic:
			if len(gates.Missing(ModeMIG.Needs()...)) == 0 {
				return ModeMIG, why(ModeMIG) + " without the whole GPU"
			}
			return ModeStaticMIG, why(ModeStaticMIG)
		case ModeExclusive, ModeShared, ModeSlots:
			return ModeStaticMIG, why(ModeStaticMIG)
		}
	}
	return mode, ""
}

// build lays out the GPU's devices and counters for its mode; model is
// the GPU's MIG model in mig and dynamic mode.
func (gpu *GPU) build(model *MIGModel) error {
	whole := &Device{Name: WholeGPUName(gpu.Index), Kind: KindGPU, GPU: gpu}
	gpu.Devices = append(gpu.Devices, whole)
	switch gpu.Mode {
	case ModeExclusive:
		return nil
	case ModeShared:
		whole.Shareable = true
		return nil
	case ModeMIG, ModeDynamic:
		whole.Shareable = gpu.Mode == ModeDynamic
		if gpu.MIGModeFixed != "" && gpu.MIGEnabled {
			// MIG mode stays on (fixedMIGMode): the whole GPU cannot
			// be served, only its instances.
			gpu.Devices = gpu.Devices[:0]
		}
	default:
		return fmt.Errorf("internal error: mode %q", gpu.Mode)
	}

	gpu.CounterSet = CounterSetName(gpu.Index)
	gpu.Counters = model.Counters
	whole.Counters = model.Counters
	names := map[string]string{}
	for _, p := range model.Profiles {
		label, err := ProfileLabel(p.Name)
		if err != nil {
			return err
		}
		if other, dup := names[label]; dup {
			return fmt.Errorf("MIG profiles %q and %q both map to device name part %q", other, p.Name, label)
		}
		names[label] = p.Name
		prof := p
		for _, pl := range PlacementOrder(p.Placements) {
			gpu.Devices = append(gpu.Devices, &Device{
				Name:      MIGDeviceName(gpu.Index, label, pl.Start),
				Kind:      KindMIG,
				GPU:       gpu,
				MIG:       &prof,
				Placement: pl,
				Counters:  model.Consumes(prof, pl),
			})
		}
	}
	for _, d := range gpu.Devices {
		if len(d.Name) > maxDeviceName {
			return fmt.Errorf("device name %s is longer than %d characters", d.Name, maxDeviceName)
		}
	}
	return nil
}

// countersScaleFrom is the first Kubernetes release whose allocator
// handles shared counters at cluster scale: through the real 1.35.4 and
// 1.36.3 schedulers, mig mode cost 0.73 s of Filter per pod at 100 nodes and
// 11-12.5 s at 500, against 43 ms on 1.37.2 (issue 14's measurements).
var countersScaleFrom = utilversion.MajorMinor(1, 37)

// AutoPolicy says in a sentence what mode auto gives each GPU, for help
// texts; resolveAuto decides it (TestAutoPolicyMatchesResolveAuto keeps
// them together).
func AutoPolicy() string {
	return fmt.Sprintf("auto is %s on GPUs with MIG instances, %s on other MIG-capable GPUs where the cluster enforces %s and runs Kubernetes %s or later "+
		"(before Hopper only with MIG mode on, which Facet does not change there; never in a vGPU guest), "+
		"%s on other GPUs before Hopper with MIG mode on, and %s everywhere else",
		ModeStaticMIG, ModeMIG, features.PartitionableDevices, countersScaleFrom, ModeStaticMIG, ModeExclusive)
}

// resolveAuto is the default policy, per GPU:
//   - MIG instances exist: static-mig, on every cluster. Someone carved the
//     GPU on purpose; publishing the instances is correct everywhere and
//     costs the scheduler nothing.
//   - MIG-capable, no instances: mig where the cluster enforces partitionable
//     devices and is 1.37 or later; else exclusive. Before 1.37, counters
//     make scheduling slow at scale, and on 1.35 the allocator's rollback
//     leak (kubernetes#140436) can leave a pod that fits Pending.
//     A GPU whose MIG mode Facet must not change (nvmlgpu.GPU.MIGModeFixed)
//     gets exclusive while its MIG mode is off or it is a vGPU guest,
//     without a note: that is no fallback but the GPU as its admin left
//     it. With MIG mode on, fixedMIGMode then narrows exclusive to
//     static-mig (mig keeps its MIG devices, without the whole GPU).
//   - Others: exclusive.
//
// dynamic is never the default: a shareable device that consumes counters
// met kubernetes#139034 (a MIG instance double-booked beside a vGPU share)
// before 1.36.2.
func resolveAuto(g nvmlgpu.GPU, gates features.Set, hasInstances bool) (Mode, string, bool) {
	switch {
	case g.MIGCapable && hasInstances:
		return ModeStaticMIG, "auto: static-mig, because the GPU has MIG instances", false
	case !migUsable(g):
		return ModeExclusive, "auto: exclusive, the default for GPUs without MIG", false
	case g.MIGModeFixed != "" && (g.VGPUGuest || !g.MIGEnabled):
		why := "its MIG mode is off"
		if g.VGPUGuest {
			why = "it cannot create MIG instances"
		}
		return ModeExclusive, "auto: exclusive, because " + why + " and its MIG mode is not Facet's to change (" + g.MIGModeFixed + ")", false
	case !gates.Has(features.PartitionableDevices):
		return ModeExclusive, "auto: exclusive, because the cluster does not enforce " + string(features.PartitionableDevices) +
			" (dynamic MIG); carve instances or use --mode=static-mig with --mig-layouts for MIG", false
	case !atLeast(gates.ServerVersion, countersScaleFrom):
		return ModeExclusive, fmt.Sprintf("auto: exclusive, because dynamic MIG's counters do not scale in the scheduler before Kubernetes %s (cluster: %s); "+
			"--mode=mig is fine for small clusters, static-mig for large ones", countersScaleFrom, gates.ServerVersion), false
	}
	return ModeMIG, "auto: mig (dynamic MIG), the default for MIG-capable GPUs on Kubernetes " + countersScaleFrom.String() + " and later", false
}

// atLeast reports whether a server's gitVersion is at least want; an
// unparseable or empty version is not.
func atLeast(gitVersion string, want *utilversion.Version) bool {
	v, err := utilversion.ParseGeneric(gitVersion)
	return err == nil && v.AtLeast(want)
}

// needsError explains a mode the cluster cannot enforce, naming the gates
// and how to turn them on.
func needsError(m Mode, missing []features.Gate, gates features.Set) error {
	list := make([]string, len(missing))
	on := make([]string, len(missing))
	for i, g := range missing {
		list[i] = fmt.Sprintf("%s (%s)", g, gates.Source[g])
		on[i] = string(g) + "=true"
	}
	return fmt.Errorf("mode %s needs the DRA feature gate %s, which the cluster does not enforce: the API server would drop the fields it needs and the scheduler would over-commit the GPU. "+
		"Turn it on in kube-apiserver and kube-scheduler (--feature-gates=%s; on by default from Kubernetes 1.36), "+
		"or use a mode that works without it: exclusive, static-mig or slots",
		m, strings.Join(list, ", "), strings.Join(on, ","))
}

func keys[V any](m map[int]V) map[int]bool {
	out := make(map[int]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// maxDeviceName is the API's limit on device names (a DNS label).
const maxDeviceName = 63

// WholeGPUName is the device name of GPU index i.
func WholeGPUName(i int) string { return fmt.Sprintf("gpu-%d", i) }

// MIGDeviceName is the device name of a MIG placement of GPU i, with the
// profile already mapped by ProfileLabel: "gpu-0-mig-1g10gb-me-6".
func MIGDeviceName(i int, profileLabel string, start int) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d", i, profileLabel, start)
}

// CounterSetName is the name of GPU i's shared counter set.
func CounterSetName(i int) string { return fmt.Sprintf("gpu-%d-counters", i) }

// ProfileLabel maps NVIDIA's profile notation onto the characters a device
// name (a DNS label) may hold, one to one for the names NVIDIA uses:
// '.' is dropped, "+x" becomes "-x" and "-x" (a feature taken away, as in
// Blackwell's "1g.23gb-me") becomes "-nox". So "1g.10gb" → "1g10gb",
// "1g.10gb+me" → "1g10gb-me", "1g.23gb+me.all" → "1g23gb-meall",
// "1g.23gb-me" → "1g23gb-nome". The original name is published in the
// device's `profile` attribute.
func ProfileLabel(profile string) (string, error) {
	var b strings.Builder
	for _, r := range strings.ToLower(profile) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '.':
		case r == '+':
			b.WriteByte('-')
		case r == '-':
			b.WriteString("-no")
		default:
			return "", fmt.Errorf("MIG profile %q: character %q has no mapping into a device name", profile, r)
		}
	}
	s := b.String()
	if s == "" || strings.HasSuffix(s, "-") || strings.Contains(s, "--") {
		return "", fmt.Errorf("MIG profile %q maps to %q, which is not part of a DNS label", profile, s)
	}
	return s, nil
}

// Device finds a device by name.
func (inv *Inventory) Device(name string) (*Device, bool) {
	d, ok := inv.byName[name]
	return d, ok
}

// PlacementOrder lists a profile's placements from the end of the GPU to
// its start: the allocator takes the first free one, so small instances
// fill the GPU from the top and leave slice 0, where the large profiles
// start, free as long as possible.
func PlacementOrder(placements []nvmlgpu.Placement) []nvmlgpu.Placement {
	out := append([]nvmlgpu.Placement(nil), placements...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start > out[j].Start })
	return out
}

// WithMIGInUse returns a copy of inv whose MIGInUse is inUse (by GPU
// UUID); the GPUs and devices are shared.
func (inv *Inventory) WithMIGInUse(inUse map[string]bool) *Inventory {
	out := *inv
	out.MIGInUse = inUse
	return &out
}

// WithComputePartitioning is a shallow copy of inv whose shares and slots
// say they are held to their cores by partitioning (names.PartitioningMPS
// or names.PartitioningTimeSliced), for publishing: it follows the node's
// MPS as it comes and goes, while the devices' sizes do not.
func (inv *Inventory) WithComputePartitioning(partitioning string) *Inventory {
	out := *inv
	out.ComputePartitioning = partitioning
	return &out
}

// Without is the inventory less the GPUs with these UUIDs, for publishing:
// a GPU the driver cannot serve (start-up rollback failed, a half-made MIG
// instance, an NVML error) is left out of the slices so the scheduler puts
// nothing new on it, while the driver keeps the full inventory to account
// for the claims already prepared there. The GPUs and devices are shared
// with inv, not copied.
func (inv *Inventory) Without(uuids map[string]string) *Inventory {
	if len(uuids) == 0 {
		return inv
	}
	out := *inv
	out.GPUs = nil
	out.byName = map[string]*Device{}
	for _, g := range inv.GPUs {
		if _, drop := uuids[g.UUID]; drop {
			continue
		}
		out.GPUs = append(out.GPUs, g)
		for _, d := range g.Devices {
			out.byName[d.Name] = d
		}
	}
	return &out
}
