// Package nodecheck proves on a GPU node that what Facet publishes is what
// a workload gets. It prepares, through the plugin's own code (package
// driver over pkg/node/claimcdi, pkg/node/checkpoint and pkg/node/hami) but in scratch
// directories of its own, three claims on one GPU in turn: the whole GPU
// (exclusive mode), a vGPU share of it (shared mode) and the smallest slot
// of the node's slot layout (slots mode). For each it starts the CUDA probe
// (package probe) in a process whose environment is the claim's CDI spec's,
// then unprepares, and finally checks that nothing is left behind.
//
// On a simulated node every step runs except the CUDA probe, which the
// report says it skipped, and why.
package nodecheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/pkg/model/sharemem"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/dradriver"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/mps"
	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// NodeName is the pool the check's claims are allocated from. It is no
// real node's: the check's inventories and claims live only in its
// scratch directories.
const NodeName = "facet-node-check"

// The claims the check prepares, in order: the whole GPU's throughput is
// what the others are compared with.
const (
	ClaimWhole = "whole GPU"
	ClaimShare = "vGPU share"
	ClaimSlot  = "vGPU slot"
)

// Prober runs the CUDA probe in a process with env, the environment of a
// claim's container, loading libCUDA. It returns the probe's result, or
// why it could not run.
type Prober interface {
	Probe(ctx context.Context, env []string, libCUDA string, p probe.Params) (*probe.Result, error)
}

// Options configure Run.
type Options struct {
	// Library is the node's NVML, real or simulated.
	Library *nvmlgpu.Library
	// SkipProbe, when not empty, says why the CUDA probe does not run
	// (a simulated GPU); every other step does.
	SkipProbe string
	// Prober runs the CUDA probe; required unless SkipProbe is set.
	Prober Prober
	// GPU is the NVML index of the GPU to check.
	GPU int
	// ShareMemoryBytes and ShareCores size the vGPU share: bytes (a whole
	// number of MiB) and percent of SM time.
	ShareMemoryBytes int64
	ShareCores       int64
	// Slots is the GPU's slot layout (nil: inventory.DefaultSlotLayout);
	// the check prepares its smallest slot.
	Slots inventory.SlotLayout
	// DriverRoot, DevRoot and NvidiaCDIHook are the plugin's
	// --driver-root, --dev-root and --nvidia-cdi-hook.
	DriverRoot, DevRoot, NvidiaCDIHook string
	// HAMiLibrary is the host path of libvgpu.so (the plugin's
	// --hami-library); without it the share and the slot fail to prepare,
	// as they would in the plugin.
	HAMiLibrary string
	// MPS partitions the share's and the slot's SMs with MPS, as the
	// plugin does by default: the check runs an MPS control daemon of
	// its own for the GPU (an mps.Manager, as facet-mps runs it: chrooted
	// into DriverRoot, or into HostRoot for a driver under a prefix,
	// mps.Locate; its directories in the scratch directory, its /dev/shm
	// a tmpfs), and the probe joins it as a container would. Off, or
	// without nvidia-cuda-mps-control in the driver root, or where
	// neither root can run it, they are time-sliced, and the log says
	// why.
	MPS bool
	// HostRoot is the host's / as this process sees it (facet-mps's
	// --host-root; "/" on the host), for a driver under a prefix, of
	// which DriverRoot is then a directory; "": none.
	HostRoot string
	// ScratchParent is where the scratch directory is made ("": the
	// system's temporary directory). KeepScratch leaves it in place (for
	// tests that inspect it); it is empty unless a step failed to clean.
	ScratchParent string
	KeepScratch   bool
	// ProbeSeconds is how long the probe's kernel runs per claim; zero
	// measures memory only.
	ProbeSeconds float64
	// Log, when set, gets a line for each step as it happens.
	Log io.Writer
	// prepared, for tests, is called with each claim once it is
	// prepared, before its probe.
	prepared func(claim string)
}

// Row is one claim's outcome.
type Row struct {
	// Claim is ClaimWhole, ClaimShare or ClaimSlot; Device the DRA device
	// it was allocated (a share's device is the whole GPU's).
	Claim, Device string
	// PublishedMiB and Cores are what the claim holds as published: the
	// device's memory capacity in the ResourceSlice (a share: what it
	// consumes) and its percent of SM time (100: the whole GPU).
	PublishedMiB uint64
	Cores        int64
	// CDIDevices are the CDI device IDs prepare returned.
	CDIDevices []string
	// Limit is the HAMi-core limit the claim's spec sets for its GPU, as
	// written there: CUDA_DEVICE_MEMORY_LIMIT_0 and CUDA_DEVICE_SM_LIMIT_0
	// ("2000m", "20"); empty without HAMi-core.
	LimitMemory, LimitSM string
	// MPSPercent is the spec's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE ("20"):
	// the claim is an MPS client; empty when it is not.
	MPSPercent string
	// WholeSMs is the whole GPU's multiprocessor count, as the whole
	// GPU's probe saw it (0: not measured), to judge an MPS client's.
	WholeSMs int
	// PrepareErr and UnprepareErr are the plugin's errors.
	PrepareErr, UnprepareErr error
	// Missing lists host paths the claim's spec names that do not exist.
	Missing []string
	// Probe is the probe's result; ProbeErr why it failed; Skipped why
	// it did not run.
	Probe    *probe.Result
	ProbeErr error
	Skipped  string
	// Share is the claim's compute throughput as a fraction of the whole
	// GPU's (0: not measured).
	Share float64
	// Problems say where the node does not deliver what it publishes;
	// Notes are findings that are not failures.
	Problems, Notes []string
}

// Report is the check's outcome.
type Report struct {
	GPU                              nvmlgpu.GPU
	DriverVersion, CUDADriverVersion string
	// Scratch is the scratch directory (removed unless KeepScratch).
	Scratch string
	Rows    []*Row
	// Leftovers are what the claims left in the scratch directories after
	// unprepare: CDI specs, checkpoint records, HAMi-core regions.
	Leftovers []string
}

// Failed reports whether any claim failed a step or showed a problem, or
// something was left behind.
func (r *Report) Failed() bool {
	for _, row := range r.Rows {
		if row.PrepareErr != nil || row.UnprepareErr != nil || row.ProbeErr != nil || len(row.Problems) > 0 || len(row.Missing) > 0 {
			return true
		}
	}
	return len(r.Leftovers) > 0
}

// Run checks one GPU. It returns an error only when the check cannot
// start (no such GPU, MIG mode on, scratch directories); a claim's failure
// is in its Row, and the other claims still run. Every prepared claim is
// unprepared, also when its probe fails or ctx is cancelled.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.SkipProbe == "" && o.Prober == nil {
		return nil, errors.New("internal error: no prober")
	}
	node, err := nodemodel.Discover(o.Library)
	if err != nil {
		return nil, err
	}
	if o.GPU < 0 || o.GPU >= len(node.GPUs) {
		return nil, fmt.Errorf("--gpu %d: the node has GPUs 0-%d", o.GPU, len(node.GPUs)-1)
	}
	g := node.GPUs[o.GPU]
	if g.MIGEnabled {
		return nil, fmt.Errorf("GPU %d (%s) has MIG mode enabled: a whole GPU, a vGPU share and a slot need it off; choose another --gpu, or disable MIG (nvidia-smi -i %d -mig 0) on an idle GPU", o.GPU, g.UUID, o.GPU)
	}
	if o.ShareMemoryBytes <= 0 || o.ShareMemoryBytes%probe.MiB != 0 {
		return nil, fmt.Errorf("share memory %d bytes: want a positive whole number of MiB", o.ShareMemoryBytes)
	}
	if o.ShareCores < 0 || o.ShareCores > 100 {
		return nil, fmt.Errorf("share cores %d%%: want 0-100", o.ShareCores)
	}
	rep := &Report{GPU: g, DriverVersion: node.DriverVersion, CUDADriverVersion: node.CUDADriverVersion}
	scratch, err := os.MkdirTemp(o.ScratchParent, "facet-node-check-")
	if err != nil {
		return nil, fmt.Errorf("scratch directory: %w", err)
	}
	rep.Scratch = scratch
	c := &checker{o: o, node: node, rep: rep,
		cdiDir: filepath.Join(scratch, "cdi"), claimsDir: filepath.Join(scratch, "state", "claims"), vgpuDir: filepath.Join(scratch, "state", "vgpu")}
	c.logf("node-check: GPU %d (%s, %s), driver %s, CUDA %s; scratch %s", g.Index, g.ProductName, g.UUID, node.DriverVersion, node.CUDADriverVersion, scratch)
	editor, err := o.Library.DriverEditor(nvmlgpu.DriverEditorOptions{DriverRoot: o.DriverRoot, DevRoot: o.DevRoot, NvidiaCDIHookPath: o.NvidiaCDIHook})
	if err != nil {
		return nil, errors.Join(err, c.cleanup())
	}
	c.edits = editor
	c.hami, c.hamiErr = hami.NewEditor(hami.Options{LibraryPath: o.HAMiLibrary, StateDir: c.vgpuDir})
	// Turned off, as --mps=off turns it off in the plugin: the share and
	// the slot are then time-sliced, and measured so.
	c.mpsErr = fmt.Errorf("the check runs without MPS (--mps=false): %w", sharing.ErrOff)
	if o.MPS {
		c.mps, c.mpsErr = openMPS(o.DriverRoot, o.HostRoot, filepath.Join(scratch, "mps"))
	}
	if c.mpsErr != nil {
		c.logf("MPS unavailable, the share and the slot are time-sliced by HAMi-core: %v", c.mpsErr)
	}
	var wholeIters, wholeSMs int
	var wholeTFLOPS float64
	for _, kind := range []string{ClaimWhole, ClaimShare, ClaimSlot} {
		if ctx.Err() != nil {
			// Interrupted: prepare nothing more.
			rep.Rows = append(rep.Rows, &Row{Claim: kind, PrepareErr: fmt.Errorf("not started: %w", context.Cause(ctx))})
			continue
		}
		row := c.claim(ctx, kind, wholeIters)
		rep.Rows = append(rep.Rows, row)
		if row.Probe != nil && kind == ClaimWhole {
			wholeSMs = row.Probe.Multiprocessors
		}
		row.WholeSMs = wholeSMs
		if row.Probe != nil && row.Probe.Compute != nil {
			if kind == ClaimWhole {
				wholeIters, wholeTFLOPS = row.Probe.Compute.Iters, row.Probe.Compute.TFLOPS
			} else if wholeTFLOPS > 0 {
				row.Share = row.Probe.Compute.TFLOPS / wholeTFLOPS
			}
		}
		judge(row)
	}
	return rep, c.cleanup()
}

type checker struct {
	o                          Options
	node                       *nvmlgpu.Node
	rep                        *Report
	cdiDir, claimsDir, vgpuDir string
	edits                      dradriver.EditSource
	hami                       *hami.Editor
	hamiErr                    error
	mps                        *mps.Manager
	mpsErr                     error
}

// mpsShmBytes is the check's MPS daemon's /dev/shm tmpfs.
const mpsShmBytes = 256 << 20

// openMPS is the check's own MPS daemon manager, as facet-mps makes it.
func openMPS(driverRoot, hostRoot, dir string) (*mps.Manager, error) {
	l, err := mps.Locate(driverRoot, hostRoot)
	if err != nil {
		return nil, err
	}
	boot, _ := os.ReadFile(dradriver.DefaultBootIDPath)
	return mps.New(mps.Options{Root: l.Root, Control: l.Control, LibraryPath: l.LibraryPath, Dir: dir, ShmSize: mpsShmBytes, BootID: strings.TrimSpace(string(boot))})
}

// probePod is the pod the check's claims are reserved for: the probe
// process, which runs as this process's UID (MPS serves one UID per GPU).
const probePod = "probe"

// pods answers the driver's read of the claim's pod: the probe process,
// as a pod of this process's UID that uses the claim.
func (c *checker) pods(claimName string) dradriver.PodGetter {
	return func(_ context.Context, namespace, name string) (*corev1.Pod, error) {
		uid := int64(os.Geteuid())
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("facet-node-check-" + probePod)},
			Spec: corev1.PodSpec{
				SecurityContext: &corev1.PodSecurityContext{RunAsUser: &uid},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}},
				Containers:      []corev1.Container{{Name: probePod, Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			},
		}, nil
	}
}

func (c *checker) logf(format string, args ...any) {
	if c.o.Log != nil {
		fmt.Fprintf(c.o.Log, format+"\n", args...)
	}
}

// claim prepares, probes and unprepares one claim, each with its own
// inventory (the GPU in the claim's mode) and plugin instance over the
// same scratch directories, as a plugin restarted with another mode.
func (c *checker) claim(ctx context.Context, kind string, wholeIters int) (row *Row) {
	row = &Row{Claim: kind}
	cfg := inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{c.o.GPU: inventory.ModeExclusive}}
	switch kind {
	case ClaimShare:
		cfg.PerGPU[c.o.GPU] = inventory.ModeShared
	case ClaimSlot:
		cfg.PerGPU[c.o.GPU] = inventory.ModeSlots
		cfg.DefaultSlots = c.o.Slots
	}
	if c.mps != nil {
		// As the plugin publishes under MPS.
		cfg.MPSReserveBytes = sharemem.MPSServerBytes
	}
	fail := func(err error) *Row {
		row.PrepareErr = err
		c.logf("%-10s  %v", kind, err)
		return row
	}
	// No MIG instances: the checked GPU has MIG mode off.
	inv, err := nodemodel.Build(c.node, cfg, nodemodel.Options{})
	if err != nil {
		return fail(fmt.Errorf("inventory: %w", err))
	}
	gpu := inv.GPUs[c.o.GPU]
	dev := gpu.Devices[0] // gpu-<i>, or the smallest slot
	row.Device = dev.Name
	published, err := publishedMemory(inv, dev.Name)
	if err != nil {
		return fail(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "facet-node-check", Name: map[string]string{ClaimWhole: "whole", ClaimShare: "share", ClaimSlot: "slot"}[kind],
			UID: types.UID(fmt.Sprintf("facet-node-check-%d-%d", os.Getpid(), len(c.rep.Rows)))},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: names.Driver, Pool: NodeName, Device: dev.Name}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: probePod, UID: types.UID("facet-node-check-" + probePod)}}},
	}
	row.PublishedMiB, row.Cores = uint64(published)/probe.MiB, 100
	switch kind {
	case ClaimShare:
		if c.o.ShareMemoryBytes > published {
			return fail(fmt.Errorf("share of %d MiB: the GPU publishes %d MiB", c.o.ShareMemoryBytes/probe.MiB, published/probe.MiB))
		}
		shareID := types.UID("node-check-share")
		r := &claim.Status.Allocation.Devices.Results[0]
		r.ShareID = &shareID
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			names.CapacityMemory: *resource.NewQuantity(c.o.ShareMemoryBytes, resource.BinarySI),
			names.CapacityCores:  *resource.NewQuantity(c.o.ShareCores, resource.DecimalSI),
		}
		row.Device += " (share)"
		row.PublishedMiB, row.Cores = uint64(c.o.ShareMemoryBytes)/probe.MiB, c.o.ShareCores
	case ClaimSlot:
		row.Cores = dev.Slot.Cores
	}
	if kind != ClaimWhole && c.mps == nil && !sharing.Off(c.mpsErr) {
		// MPS configured but unavailable: the node publishes its shares
		// and slots as time-sliced, which only the best-effort classes
		// select, so the check prepares them as such a claim is
		// (docs/mps.md, "Compute policy"), and measures what they get.
		claim.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClass, Requests: []string{"gpu"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: names.Driver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"best-effort"}`)},
			}},
		}}
	}

	store, err := checkpoint.Open(c.claimsDir)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := store.Close(); err != nil && row.UnprepareErr == nil {
			row.UnprepareErr = fmt.Errorf("close checkpoint: %w", err)
		}
	}()
	writer, err := claimcdi.NewWriter(c.cdiDir)
	if err != nil {
		return fail(err)
	}
	drv, err := dradriver.New(ctx, dradriver.Options{NodeName: NodeName, Inventory: inv, Store: store, CDI: writer, Edits: c.edits,
		Sharing: sharing.Fixed(c.hami, c.hamiErr, c.mps, c.mpsErr), Pods: c.pods(claim.Name)})
	if err != nil {
		return fail(fmt.Errorf("start the plugin's driver: %w", err))
	}
	start := time.Now()
	res, err := drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err == nil {
		err = res[claim.UID].Err
	}
	// Unprepared whatever prepare did or left, also after a failed or
	// panicking probe and with ctx cancelled.
	defer func() {
		out, err := drv.UnprepareResourceClaims(context.WithoutCancel(ctx), []kubeletplugin.NamespacedObject{{UID: claim.UID, NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}}})
		if err == nil {
			err = out[claim.UID]
		}
		row.UnprepareErr = err
		if err != nil {
			c.logf("%-10s  unprepare: %v", kind, err)
		} else {
			c.logf("%-10s  unprepared", kind)
		}
	}()
	if err != nil {
		return fail(err)
	}
	for _, d := range res[claim.UID].Devices {
		row.CDIDevices = append(row.CDIDevices, d.CDIDeviceIDs...)
	}
	c.logf("%-10s  %s prepared in %v: %v", kind, row.Device, time.Since(start).Round(time.Millisecond), row.CDIDevices)
	if c.o.prepared != nil {
		c.o.prepared(kind)
	}
	spec, err := readSpec(filepath.Join(c.cdiDir, claimcdi.SpecName(claim.UID)+".json"))
	if err != nil {
		row.ProbeErr = err
		return row
	}
	for _, kv := range spec.ContainerEdits.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "CUDA_DEVICE_MEMORY_LIMIT_0":
			row.LimitMemory = v
		case "CUDA_DEVICE_SM_LIMIT_0":
			row.LimitSM = v
		case mps.EnvActiveThreadPercentage:
			row.MPSPercent = v
		}
	}
	nvmlIndex := map[string]int{}
	for _, g := range c.node.GPUs {
		nvmlIndex[g.UUID] = g.Index
	}
	proc, err := NewProcess(spec, nvmlIndex)
	if proc != nil {
		// Its library directory, made also when NewProcess failed later.
		defer proc.Close()
		row.Missing = proc.Missing
		for _, h := range proc.MissingHooks {
			row.Notes = append(row.Notes, fmt.Sprintf("the spec's hook %s does not exist here: the host's container runtime needs it there (the plugin's --nvidia-cdi-hook)", h))
		}
		var shown []string
		for _, kv := range proc.Env {
			if strings.HasPrefix(kv, "CUDA_") || strings.HasPrefix(kv, "LD_PRELOAD=") {
				shown = append(shown, kv)
			}
		}
		c.logf("%-10s  probe environment: %s", kind, strings.Join(shown, " "))
	}
	if c.o.SkipProbe != "" {
		row.Skipped = c.o.SkipProbe
		c.logf("%-10s  CUDA probe skipped: %s", kind, c.o.SkipProbe)
		return row
	}
	if err != nil {
		row.ProbeErr = err
		return row
	}
	row.Probe, row.ProbeErr = c.o.Prober.Probe(ctx, proc.Env, proc.LibCUDA, probe.Params{PublishedMiB: row.PublishedMiB, Seconds: c.o.ProbeSeconds, Iters: wholeIters, Binds: proc.Binds})
	if row.ProbeErr != nil {
		c.logf("%-10s  CUDA probe: %v", kind, row.ProbeErr)
	} else {
		c.logf("%-10s  CUDA probe done", kind)
	}
	return row
}

// publishedMemory is the memory capacity, in bytes, that the device has
// in the ResourceSlices the plugin would publish for inv.
func publishedMemory(inv *inventory.Inventory, device string) (int64, error) {
	res := resourceslices.Resources(inv, NodeName)
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				if d.Name != device {
					continue
				}
				c, ok := d.Capacity[names.CapacityMemory]
				if !ok {
					return 0, fmt.Errorf("device %s publishes no %s capacity", device, names.CapacityMemory)
				}
				return c.Value.Value(), nil
			}
		}
	}
	return 0, fmt.Errorf("internal error: device %s is not in the ResourceSlices", device)
}

func readSpec(path string) (*cdispec.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the claim's CDI spec: %w", err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("the claim's CDI spec %s: %w", path, err)
	}
	return &spec, nil
}

// cleanup lists what the claims left behind (Report.Leftovers) and
// removes the scratch directory unless KeepScratch is set.
func (c *checker) cleanup() error {
	var errs []error
	specs, err := os.ReadDir(c.cdiDir)
	if err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	for _, s := range specs {
		c.rep.Leftovers = append(c.rep.Leftovers, "CDI spec "+filepath.Join(c.cdiDir, s.Name()))
	}
	if _, err := os.Stat(c.claimsDir); err == nil {
		store, err := checkpoint.Open(c.claimsDir)
		if err != nil {
			errs = append(errs, err)
		} else {
			claims, corrupt, err := store.List()
			errs = append(errs, err, store.Close())
			for _, cl := range claims {
				c.rep.Leftovers = append(c.rep.Leftovers, fmt.Sprintf("checkpoint record of claim %s/%s (%s)", cl.Namespace, cl.Name, cl.UID))
			}
			for uid := range corrupt {
				c.rep.Leftovers = append(c.rep.Leftovers, fmt.Sprintf("corrupt checkpoint record %s", uid))
			}
		}
	}
	if c.hami != nil {
		uids, err := c.hami.ClaimCaches()
		errs = append(errs, err)
		for _, uid := range uids {
			dir, _ := c.hami.CacheDir(uid)
			c.rep.Leftovers = append(c.rep.Leftovers, "HAMi-core region "+dir)
		}
	}
	for _, l := range c.rep.Leftovers {
		c.logf("left behind: %s", l)
	}
	if !c.o.KeepScratch {
		errs = append(errs, os.RemoveAll(c.rep.Scratch))
	}
	return errors.Join(errs...)
}
