package dradriver

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// migDevice finds the published device of a profile at a placement.
func (r *rig) migDevice(gpu int, profile string, start int) string {
	r.t.Helper()
	for _, d := range r.inv.GPUs[gpu].Devices {
		if d.Kind == inventory.KindMIG && d.MIG.Name == profile && d.Placement.Start == start {
			return d.Name
		}
	}
	r.t.Fatalf("GPU %d publishes no %s at %d", gpu, profile, start)
	return ""
}

func (r *rig) migCount() int {
	r.t.Helper()
	in, err := r.lib.ListMIG()
	if err != nil {
		r.t.Fatal(err)
	}
	return len(in)
}

func needMIGEdits(t *testing.T) {
	t.Helper()
	if bindErr != nil {
		t.Skipf("MIG CDI edits need the simulated /proc/driver: %v", bindErr)
	}
}

// share is a claim for a share of a shareable gpu-<i>.
func share(name, device string, memory string, cores int64, configJSON ...string) *resourceapi.ResourceClaim {
	c := claim(name, device)
	id := types.UID("share-" + name)
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = &id
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse(memory),
		"cores":  *resource.NewQuantity(cores, resource.DecimalSI),
	}
	return withConfig(c, configJSON...)
}

// withConfig adds opaque configs from the claim to an allocated claim.
func withConfig(c *resourceapi.ResourceClaim, configJSON ...string) *resourceapi.ResourceClaim {
	for _, cfg := range configJSON {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: names.Driver, Parameters: runtime.RawExtension{Raw: []byte(cfg)}}},
		})
	}
	return c
}

func TestMIGCarvedAtPrepareDestroyedAtUnprepare(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	small := claim("small", r.migDevice(0, "1g.10gb", 6))
	res := r.prepare(small)[small.UID]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	in, _ := r.lib.ListMIG()
	if len(in) != 1 || in[0].Profile != "1g.10gb" || in[0].Placement.Start != 6 || in[0].ParentIndex != 0 {
		t.Fatalf("instances after prepare: %+v", in)
	}
	spec := r.spec(small.UID)
	for _, want := range []string{"/dev/nvidia-caps/nvidia-cap", r.root + `/dev/nvidia0"`, "FACET_GPU_UUIDS=" + in[0].UUID} {
		if !strings.Contains(spec, want) {
			t.Errorf("spec lacks %s:\n%s", want, spec)
		}
	}
	store, _ := checkpoint.Open(r.checkpoints)
	rec, _ := store.Get(small.UID)
	if m := rec.Devices[0].MIG; m == nil || !m.Created || m.GIID != in[0].GIID || m.UUID != in[0].UUID {
		t.Fatalf("checkpoint: %+v", rec.Devices[0].MIG)
	}
	// After a 1g at the end of the GPU, a 4g still fits at slice 0.
	big := claim("big", r.migDevice(0, "4g.40gb", 0))
	if err := r.prepare(big)[big.UID].Err; err != nil {
		t.Fatal(err)
	}
	if err := r.unprepare(small.UID, big.UID)[small.UID]; err != nil {
		t.Fatal(err)
	}
	if n := r.migCount(); n != 0 || r.specExists(small.UID) {
		t.Fatalf("%d instances left, spec left: %v", n, r.specExists(small.UID))
	}
}

// TestConflictsAcrossModes hands prepare allocations the scheduler should
// never make (the 1.35 double-booking bug makes some of them possible) and
// checks the later claim is refused, naming the holder, with nothing else
// disturbed.
func TestConflictsAcrossModes(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeDynamic})
	mig := claim("mig", r.migDevice(1, "2g.20gb", 0))
	if err := r.prepare(mig)[mig.UID].Err; err != nil {
		t.Fatal(err)
	}
	s1 := share("s1", "gpu-2", "30Gi", 25)
	if err := r.prepare(s1)[s1.UID].Err; err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{claim("overlap", r.migDevice(1, "1g.10gb", 1)), "conflicts with MIG device " + r.migDevice(1, "2g.20gb", 0) + " (memory slices 0-1) of claim ns/mig"},
		{share("share-on-mig", "gpu-1", "1Gi", 10), "conflicts with MIG device"},
		{claim("mig-on-share", r.migDevice(2, "1g.10gb", 6)), "conflicts with vGPU share of gpu-2 (30720 MiB, 25% SM) of claim ns/s1"},
		{share("too-much-memory", "gpu-2", "60Gi", 10), "a share of 61440 MiB does not fit on GPU"},
		{share("too-many-cores", "gpu-2", "1Gi", 80), "a share of 80% SM does not fit"},
	} {
		err := r.prepare(tc.c)[tc.c.UID].Err
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "claim ns/"+tc.c.Name) {
			t.Errorf("%s: error %v, want %q", tc.c.Name, err, tc.want)
		}
		if r.specExists(tc.c.UID) {
			t.Errorf("%s: refused claim left a spec", tc.c.Name)
		}
	}
	if n := r.migCount(); n != 1 {
		t.Fatalf("%d MIG instances after refusals, want the first claim's 1", n)
	}
	// What the refusals named is still free where it should be.
	ok := claim("ok", r.migDevice(1, "1g.10gb", 6))
	s2 := share("s2", "gpu-2", "50359Mi", 75) // the rest of the H100's usable 81079 MiB
	res := r.prepare(ok, s2)
	if res[ok.UID].Err != nil || res[s2.UID].Err != nil {
		t.Fatalf("later claims: %v / %v", res[ok.UID].Err, res[s2.UID].Err)
	}
}

func TestSharesGetHAMiCoreLimits(t *testing.T) {
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared})
	volcano := share("volcano", "gpu-3", "2000Mi", 20)
	notebook := share("notebook", "gpu-3", "4Gi", 0, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","coreUtilizationPolicy":"force"}`)
	whole := share("whole", "gpu-4", "81079Mi", 100) // all of the H100's usable memory
	optOut := share("opt-out", "gpu-5", "8Gi", 50, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","enforcement":"disabled"}`)
	bad := share("bad", "gpu-5", "8Gi", 10, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","taskPriority":7}`)
	res := r.prepare(volcano, notebook, whole, optOut, bad)
	for _, c := range []*resourceapi.ResourceClaim{volcano, notebook, whole, optOut} {
		if res[c.UID].Err != nil {
			t.Fatalf("%s: %v", c.Name, res[c.UID].Err)
		}
	}
	if err := res[bad.UID].Err; err == nil || !strings.Contains(err.Error(), "claim ns/bad: devices.config[0] (from claim): VgpuConfig: taskPriority: Invalid value: 7") {
		t.Fatalf("bad config: %v", err)
	}
	for _, tc := range []struct {
		c        *resourceapi.ResourceClaim
		want     []string
		wantNone []string
	}{
		{volcano, []string{"CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "CUDA_DEVICE_SM_LIMIT_0=20", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/uid-volcano/vgpu.cache", "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload", "GPU_CORE_UTILIZATION_POLICY=default"}, nil},
		{notebook, []string{"CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=0", "GPU_CORE_UTILIZATION_POLICY=force", "uid-notebook/vgpu.cache"}, nil},
		{whole, []string{r.root + `/dev/nvidia4"`}, []string{"CUDA_DEVICE_MEMORY_LIMIT", "libvgpu.so"}},
		{optOut, []string{r.root + `/dev/nvidia5"`}, []string{"CUDA_DEVICE_MEMORY_LIMIT", "libvgpu.so"}},
	} {
		spec := r.spec(tc.c.UID)
		for _, w := range tc.want {
			if !strings.Contains(spec, w) {
				t.Errorf("%s: spec lacks %s", tc.c.Name, w)
			}
		}
		for _, w := range tc.wantNone {
			if strings.Contains(spec, w) {
				t.Errorf("%s: spec has %s", tc.c.Name, w)
			}
		}
	}
	cache := filepath.Join(filepath.Dir(r.checkpoints), "vgpu", "claims", "uid-volcano")
	if _, err := os.Stat(cache); err != nil {
		t.Fatal(err)
	}
	// The whole-GPU share holds all of gpu-4.
	if err := r.prepare(share("late", "gpu-4", "1Gi", 1))["uid-late"].Err; err == nil {
		t.Fatal("a share fit beside a full-capacity share")
	}
	r.unprepare(volcano.UID)
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Fatal("accounting region survived unprepare")
	}
}

// TestWholeGPUBesideAShareGetsUsableLimit: a container that sees a vGPU
// share needs a HAMi-core limit for every GPU it sees; a whole GPU's is the
// memory CUDA can give (the H100's 81079 MiB: 81559 less 480 reserved),
// never NVML's total, which the card cannot allocate.
func TestWholeGPUBesideAShareGetsUsableLimit(t *testing.T) {
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared, PerGPU: map[int]inventory.Mode{0: inventory.ModeExclusive}})
	c := share("mixed", "gpu-3", "2000Mi", 20)
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: names.Driver, Pool: node, Device: "gpu-0"})
	if err := r.prepare(c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	spec := r.spec(c.UID)
	// gpu-0 comes first in PCI order (0000:1b:00.0 before gpu-3's 0000:61:00.0).
	for _, want := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=81079m", "CUDA_DEVICE_SM_LIMIT_0=100", "CUDA_DEVICE_MEMORY_LIMIT_1=2000m", "CUDA_DEVICE_SM_LIMIT_1=20"} {
		if !strings.Contains(spec, want) {
			t.Errorf("spec lacks %s:\n%s", want, spec)
		}
	}
}

// TestCrashMidMIGPrepare: the plugin died after NVML created the instance
// but before the checkpoint recorded it. The next start rolls the intent
// back but does not destroy the instance at its placement, which nothing
// proves is the claim's (H3: it used to destroy whatever sat there, an
// admin's instance included). The retry fails naming the instance; with
// --destroy-unowned-mig the next start removes it and the retry succeeds.
func TestCrashMidMIGPrepare(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	dev := r.migDevice(3, "3g.40gb", 4)
	d, _ := r.inv.Device(dev)
	store, _ := checkpoint.Open(r.checkpoints)
	err := store.Put(&checkpoint.Claim{UID: "uid-crashed", Namespace: "ns", Name: "crashed", State: checkpoint.StatePreparing,
		Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: node, Device: dev, GPUUUID: d.GPU.UUID, Kind: kindMIG,
			MIG: &checkpoint.MIG{Profile: d.MIG.Name, GIProfileID: d.MIG.GIProfileID, CIProfileID: d.MIG.CIProfileID, Start: 4, Size: d.Placement.Size}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.lib.EnableMIG(d.GPU.UUID); err != nil {
		t.Fatal(err)
	}
	// The instance at the intent's placement: the crashed prepare's, or
	// an admin's; the plugin cannot tell.
	if _, err := r.lib.CreateMIG(d.GPU.UUID, d.MIG.GIProfileID, 4); err != nil {
		t.Fatal(err)
	}
	// And an instance nobody recorded at all (made by hand).
	other := r.inv.GPUs[4]
	if _, err := r.lib.EnableMIG(other.UUID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.lib.CreateMIG(other.UUID, other.MIGProfiles[0].GIProfileID, 0); err != nil {
		t.Fatal(err)
	}

	r.start() // report only
	if n := r.migCount(); n != 2 {
		t.Fatalf("%d instances after restart, want both kept (reported)", n)
	}
	if c, _ := store.Get("uid-crashed"); c != nil {
		t.Fatal("interrupted record kept")
	}
	again := claim("again", dev)
	err = r.prepare(again)[again.UID].Err
	if err == nil || !strings.Contains(err.Error(), "MIG instances that no prepared claim owns overlap it: GI ") || !strings.Contains(err.Error(), "--destroy-unowned-mig") {
		t.Fatalf("retry over the unowned instance: %v", err)
	}
	if len(r.d.UnusableGPUs()) != 0 {
		t.Fatalf("a whole, unowned instance made a GPU unusable: %v", r.d.UnusableGPUs())
	}
	r.destroyUnowned = true
	r.start()
	if n := r.migCount(); n != 0 {
		t.Fatalf("%d instances after --destroy-unowned-mig", n)
	}
	if err := r.prepare(again)[again.UID].Err; err != nil {
		t.Fatalf("placement not free after --destroy-unowned-mig: %v", err)
	}
	r.start()
	in, _ := r.lib.ListMIG()
	if len(in) != 1 || in[0].ParentUUID != d.GPU.UUID {
		t.Fatalf("after another --destroy-unowned-mig start: %+v (want only the prepared claim's)", in)
	}
}

// TestSlowNVMLDoesNotBlockOtherGPUs: while one claim's MIG create hangs in
// NVML (held at the failpoint right after CreateMIG), claims on other GPUs,
// MIG or whole, prepare to completion.
func TestSlowNVMLDoesNotBlockOtherGPUs(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	held, release := make(chan struct{}), make(chan struct{})
	// Only the first create is held. (Not sync.Once: its Do makes later
	// callers wait for the first, which is the blocking under test.)
	var first atomic.Bool
	r.failpoint = func(name string) {
		if name == "after-mig-create" && first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	}
	r.start()

	slow := claim("slow", r.migDevice(0, "7g.80gb", 0))
	slowDone := make(chan error, 1)
	go func() { slowDone <- r.prepare(slow)[slow.UID].Err }()
	// The slow prepare is released and waited for however the test ends:
	// it writes into the test's directories.
	defer func() {
		close(release)
		if err := <-slowDone; err != nil {
			t.Errorf("the slow prepare, once released: %v", err)
		}
	}()
	<-held

	other := claim("other-gpu-mig", r.migDevice(1, "1g.10gb", 6))
	whole := claim("other-gpu-whole", "gpu-2")
	done := make(chan map[types.UID]error, 1)
	go func() {
		res := r.prepare(other, whole)
		done <- map[types.UID]error{other.UID: res[other.UID].Err, whole.UID: res[whole.UID].Err}
	}()
	select {
	case errs := <-done:
		for uid, err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", uid, err)
			}
		}
	case <-time.After(2 * time.Minute):
		// A prepare that waited for GPU 0 would wait forever (release
		// comes only at the end): the bound only turns that into a
		// failure, and is generous so that load cannot trip it.
		t.Fatal("claims on GPUs 1 and 2 waited for GPU 0's NVML call")
	}
}

// TestWholeGPUAfterMIG: Facet turns MIG mode on for a GPU's first MIG
// device and leaves it on; a whole-GPU claim there later must get the GPU
// back with MIG mode off (CUDA sees no device otherwise). An instance no
// claim owns blocks that, and the claim says so.
func TestWholeGPUAfterMIG(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	migEnabled := func(i int) bool {
		n, err := r.lib.Discover()
		if err != nil {
			t.Fatal(err)
		}
		return n.GPUs[i].MIGEnabled
	}
	mig := claim("mig", r.migDevice(0, "1g.10gb", 6))
	if err := r.prepare(mig)[mig.UID].Err; err != nil {
		t.Fatal(err)
	}
	r.unprepare(mig.UID)
	if !migEnabled(0) {
		t.Fatal("MIG mode off after the MIG claim; this test needs it left on")
	}
	whole := claim("whole", "gpu-0")
	if err := r.prepare(whole)[whole.UID].Err; err != nil {
		t.Fatal(err)
	}
	if migEnabled(0) {
		t.Fatal("a whole GPU was prepared with MIG mode on")
	}

	// An instance made by hand on gpu-1.
	gpu1 := r.inv.GPUs[1]
	if _, err := r.lib.EnableMIG(gpu1.UUID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.lib.CreateMIG(gpu1.UUID, gpu1.MIGProfiles[0].GIProfileID, 0); err != nil {
		t.Fatal(err)
	}
	blocked := claim("blocked", "gpu-1")
	err := r.prepare(blocked)[blocked.UID].Err
	if err == nil || !strings.Contains(err.Error(), "MIG instances that no prepared claim owns") {
		t.Fatalf("whole GPU over an unowned instance: %v", err)
	}
	if r.specExists(blocked.UID) {
		t.Fatal("refused claim left a spec")
	}
}

// TestMIGInUse: MIGInUse follows the reservations of carved instances, on
// the GPU that holds them only, and MIGUseChanges signals each change once
// (coalesced), never for a prepare that does not change the set.
func TestMIGInUse(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	gpu0 := r.inv.GPUs[0].UUID
	signalled := func() bool {
		select {
		case <-r.d.MIGUseChanges():
			return true
		default:
			return false
		}
	}
	signalled() // what the start may have left
	if got := r.d.MIGInUse(); len(got) != 0 {
		t.Fatalf("MIGInUse before any claim: %v", got)
	}

	a := claim("a", r.migDevice(0, "1g.10gb", 6))
	if err := r.prepare(a)[a.UID].Err; err != nil {
		t.Fatal(err)
	}
	if got := r.d.MIGInUse(); len(got) != 1 || !got[gpu0] {
		t.Fatalf("MIGInUse with a carved instance on GPU 0: %v", got)
	}
	if !signalled() {
		t.Fatal("no signal when GPU 0 came into MIG use")
	}
	b := claim("b", r.migDevice(0, "1g.10gb", 5))
	whole := claim("whole", "gpu-1")
	if err := r.prepare(b, whole)[b.UID].Err; err != nil {
		t.Fatal(err)
	}
	if signalled() {
		t.Fatal("a signal for a second instance on a GPU already in MIG use, or a whole GPU")
	}
	if err := r.unprepare(a.UID)[a.UID]; err != nil {
		t.Fatal(err)
	}
	if signalled() || !r.d.MIGInUse()[gpu0] {
		t.Fatal("GPU 0 left MIG use while claim b holds an instance there")
	}
	if err := r.unprepare(b.UID)[b.UID]; err != nil {
		t.Fatal(err)
	}
	if !signalled() || len(r.d.MIGInUse()) != 0 {
		t.Fatalf("after the last instance: signalled no change, or MIGInUse %v", r.d.MIGInUse())
	}
}
