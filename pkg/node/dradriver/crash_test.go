package dradriver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
)

const machineFile = "../../../demo/machines/dgx-h100.yaml"

// splitModes is the demo's node: MIG on GPUs 0-3, shares on 4-7.
var splitModes = inventory.Config{PerGPU: map[int]inventory.Mode{
	0: inventory.ModeMIG, 1: inventory.ModeMIG, 2: inventory.ModeMIG, 3: inventory.ModeMIG,
	4: inventory.ModeShared, 5: inventory.ModeShared, 6: inventory.ModeShared, 7: inventory.ModeShared,
}}

// killed is what a failpoint panics with to stop the "process" there: the
// Driver is abandoned mid-call, as SIGKILL would leave it.
type killed struct{ at string }

// killAt arms a failpoint that kills at the nth time point is reached.
func (r *rig) killAt(point string, nth int) {
	seen := 0
	r.failpoint = func(name string) {
		if name == point {
			if seen++; seen == nth {
				panic(killed{name})
			}
		}
	}
	// The hook is read at New; arm it on the running driver too.
	r.d.fail = r.failpoint
}

// call runs f and reports whether a failpoint killed it.
func call(f func()) (died bool) {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(killed); !ok {
				panic(v)
			}
			died = true
		}
	}()
	f()
	return false
}

func (r *rig) prepareOne(c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	_, ctx := ktesting.NewTestContext(r.t)
	reserve(c)
	return r.d.prepareClaim(ctx, c)
}

func (r *rig) unprepareOne(c *resourceapi.ResourceClaim) error {
	_, ctx := ktesting.NewTestContext(r.t)
	return r.d.unprepareClaim(ctx, kubeletplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
}

// restart is a plugin process restart on the same node state.
func (r *rig) restart() {
	r.t.Helper()
	r.failpoint = nil
	r.start()
}

// reboot is a node reboot: the CDI directory (a tmpfs) is empty, the GPUs
// have no MIG instances, and the boot ID is new. The state directory
// (on disk) survives.
func (r *rig) reboot(n int) {
	r.t.Helper()
	if !r.cdiSurvivesReboot {
		os.RemoveAll(r.cdiDir)
	}
	lib, err := sim.OpenMachine(machineFile)
	if err != nil {
		r.t.Fatal(err)
	}
	r.lib = lib
	if err := os.WriteFile(r.bootIDFile, []byte(fmt.Sprintf("boot-%d\n", n)), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.restart()
}

// audit proves the node's state is exactly what the prepared claims
// account for: every record Prepared and one of want; every CDI spec,
// HAMi-core region and MIG instance owned by a record (0 leaked, 0
// orphaned); each of want prepared with a spec matching its record and
// its MIG instances alive (0 lost); no temporary files.
func (r *rig) audit(want ...*resourceapi.ResourceClaim) {
	r.t.Helper()
	store, _ := checkpoint.Open(r.checkpoints)
	recs, corrupt, err := store.List()
	if err != nil || len(corrupt) > 0 {
		r.t.Fatalf("checkpoint: %v %v", err, corrupt)
	}
	wantUIDs := map[types.UID]bool{}
	for _, c := range want {
		wantUIDs[c.UID] = true
	}
	w, _ := claimcdi.NewWriter(r.cdiDir)
	gotRecs := map[types.UID]bool{}
	instances := map[string]bool{}
	caches := map[types.UID]bool{}
	for _, rec := range recs {
		gotRecs[rec.UID] = true
		if rec.State != checkpoint.StatePrepared || !wantUIDs[rec.UID] {
			r.t.Errorf("record of %s/%s in state %s; want only Prepared records of %v", rec.Namespace, rec.Name, rec.State, keys(wantUIDs))
			continue
		}
		if err := w.Verify(rec.UID, rec.CDISpecHash); err != nil {
			r.t.Errorf("claim %s: %v", rec.Name, err)
		}
		for _, dev := range rec.Devices {
			if dev.MIG != nil {
				if !dev.MIG.Created {
					r.t.Errorf("claim %s: prepared without its MIG instance", rec.Name)
				}
				instances[migKey(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)] = true
			}
			if dev.Share != nil && dev.Share.Enforced {
				caches[rec.UID] = true
			}
		}
	}
	for uid := range wantUIDs {
		if !gotRecs[uid] {
			r.t.Errorf("prepared claim %s lost", uid)
		}
	}
	specs, _ := w.ClaimSpecs()
	for _, uid := range specs {
		if !gotRecs[uid] {
			r.t.Errorf("orphaned CDI spec of %s", uid)
		}
	}
	live, err := r.lib.ListMIG()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, in := range live {
		if !instances[migKey(in.ParentUUID, in.GIID, in.CIID)] {
			r.t.Errorf("leaked MIG instance: GPU %d %s at %d (GI %d CI %d)", in.ParentIndex, in.Profile, in.Placement.Start, in.GIID, in.CIID)
		}
		delete(instances, migKey(in.ParentUUID, in.GIID, in.CIID))
	}
	for k := range instances {
		r.t.Errorf("recorded MIG instance %s is gone", k)
	}
	regions, _ := os.ReadDir(filepath.Join(filepath.Dir(r.checkpoints), "vgpu", "claims"))
	for _, e := range regions {
		if !caches[types.UID(e.Name())] {
			r.t.Errorf("orphaned HAMi-core region %s", e.Name())
		}
		delete(caches, types.UID(e.Name()))
	}
	for uid := range caches {
		r.t.Errorf("claim %s lost its HAMi-core region", uid)
	}
	for _, dir := range []string{r.cdiDir, r.checkpoints} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".tmp") || strings.HasPrefix(e.Name(), ".tmp-") {
				r.t.Errorf("temporary file left: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
}

// brief is a prepare result without pointers, to compare two.
func brief(devs []kubeletplugin.Device) string {
	var out []string
	for _, d := range devs {
		share := ""
		if d.ShareID != nil {
			share = string(*d.ShareID)
		}
		out = append(out, fmt.Sprintf("%v/%s/%s/%v/%s", d.Requests, d.PoolName, d.DeviceName, d.CDIDeviceIDs, share))
	}
	return strings.Join(out, " ")
}

func keys[V any](m map[types.UID]V) []string {
	var out []string
	for k := range m {
		out = append(out, string(k))
	}
	sort.Strings(out)
	return out
}

// subject is one device kind the matrix kills the plugin around.
type subject struct {
	kind  string
	claim func(r *rig) *resourceapi.ResourceClaim
}

var subjects = []subject{
	{"whole GPU", func(r *rig) *resourceapi.ResourceClaim { return claim("subject", "gpu-1") }},
	{"dynamic MIG device", func(r *rig) *resourceapi.ResourceClaim { return claim("subject", r.migDevice(0, "1g.10gb", 6)) }},
	{"vGPU share", func(r *rig) *resourceapi.ResourceClaim { return share("subject", "gpu-5", "8Gi", 25) }},
}

// bystanders are prepared before every kill and must come through it.
func bystanders(r *rig) []*resourceapi.ResourceClaim {
	return []*resourceapi.ResourceClaim{
		claim("by-mig", r.migDevice(2, "1g.10gb", 6)),
		share("by-share", "gpu-5", "4Gi", 10),
		claim("by-whole", "gpu-3"),
	}
}

type point struct {
	phase string // "prepare", "rebuild" (re-prepare after a reboot) or "unprepare"
	name  string
	nth   int
}

// points records the failpoints one prepare, one re-prepare after a reboot
// and one unprepare of the subject pass, in order: the matrix kills at each of them, so a step
// added to prepare or unprepare is covered without touching this test.
func points(t *testing.T, s subject) []point {
	r := newRigMode(t, splitModes)
	var got []point
	phase := "prepare"
	count := map[string]int{}
	r.failpoint = func(name string) {
		count[phase+name]++
		got = append(got, point{phase, name, count[phase+name]})
	}
	r.d.fail = r.failpoint
	c := s.claim(r)
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	record := r.failpoint
	r.reboot(2)
	phase = "rebuild"
	r.failpoint, r.d.fail = record, record
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	phase = "unprepare"
	if err := r.unprepareOne(c); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestKillMatrix kills the plugin at every step of prepare, of the rebuild
// a re-prepare after a reboot does, and of unprepare, for a whole GPU, a
// dynamic MIG device and a vGPU share, then restarts it
// (or reboots the node) on the same state and plays the kubelet's retry.
// After each: the retry succeeds, and audit finds 0 leaked MIG instances,
// 0 orphaned specs or regions and 0 lost prepared claims.
func TestKillMatrix(t *testing.T) {
	needMIGEdits(t)
	total := 0
	for _, s := range subjects {
		pts := points(t, s)
		if len(pts) < 6 {
			t.Fatalf("%s: only %d failpoints reached: %v", s.kind, len(pts), pts)
		}
		for _, p := range pts {
			for _, reboot := range []bool{false, true} {
				total++
				name := fmt.Sprintf("%s/%s/%s#%d/reboot=%v", s.kind, p.phase, p.name, p.nth, reboot)
				t.Run(name, func(t *testing.T) { killCase(t, s, p, reboot) })
			}
		}
	}
	t.Logf("kill matrix: %d cases", total)
}

func killCase(t *testing.T, s subject, p point, reboot bool) {
	r := newRigMode(t, splitModes)
	by := bystanders(r)
	for _, c := range by {
		if _, err := r.prepareOne(c); err != nil {
			t.Fatalf("bystander %s: %v", c.Name, err)
		}
	}
	subj := s.claim(r)
	rebooted := reboot
	if p.phase != "prepare" {
		if _, err := r.prepareOne(subj); err != nil {
			t.Fatal(err)
		}
	}
	if p.phase == "rebuild" {
		r.reboot(2)
		rebooted = true
	}
	r.killAt(p.name, p.nth)
	died := call(func() {
		// Ignored: the call is meant to die at the failpoint; if it
		// returns instead, died is false and the test fails below.
		if p.phase != "unprepare" {
			_, _ = r.prepareOne(subj)
		} else {
			_ = r.unprepareOne(subj)
		}
	})
	if !died {
		t.Fatalf("failpoint %s #%d not reached", p.name, p.nth)
	}
	if reboot {
		r.reboot(3)
	} else {
		r.restart()
	}
	if p.name == "after-mig-create" && !reboot {
		// The one window where the instance exists and its IDs are not
		// recorded: reported, not destroyed, until the operator opts in.
		want := 2 // the bystander's and the unrecorded one
		if rebooted {
			want = 1 // the bystander is not re-prepared yet
		}
		if n := r.migCount(); n != want {
			t.Fatalf("%d MIG instances, want %d", n, want)
		}
		if _, err := r.prepareOne(subj); err == nil || !strings.Contains(err.Error(), "--destroy-unowned-mig") {
			t.Fatalf("retry over the unrecorded instance: %v", err)
		}
		r.destroyUnowned = true
		r.restart()
	}
	want := by
	if p.phase != "unprepare" {
		devs, err := r.prepareOne(subj)
		if err != nil {
			t.Fatalf("kubelet's retry of prepare: %v", err)
		}
		if len(devs) != 1 || len(devs[0].CDIDeviceIDs) != 1 {
			t.Fatalf("retry result %+v", devs)
		}
		want = append(want, subj)
	} else if err := r.unprepareOne(subj); err != nil {
		t.Fatalf("kubelet's retry of unprepare: %v", err)
	}
	if rebooted {
		// The kubelet prepares again every claim of a pod it restarts.
		for _, c := range by {
			if _, err := r.prepareOne(c); err != nil {
				t.Fatalf("re-prepare of %s after the reboot: %v", c.Name, err)
			}
		}
	}
	r.audit(want...)
	// And everything unprepares to an empty node.
	for _, c := range want {
		if err := r.unprepareOne(c); err != nil {
			t.Fatal(err)
		}
	}
	r.audit()
}

// TestRebootRebuilds (H1): after a reboot, the kubelet's re-prepare of each
// kind rebuilds the spec, the MIG instance and the HAMi-core region rather
// than return CDI IDs that resolve to nothing. Unprepare of a claim not
// re-prepared destroys nothing, not even an instance that NVML gave the
// recorded GI/CI IDs after the reboot.
func TestRebootRebuilds(t *testing.T) {
	needMIGEdits(t)
	for _, survives := range []bool{false, true} {
		t.Run(fmt.Sprintf("CDI specs survive the reboot=%v", survives), func(t *testing.T) { testReboot(t, survives) })
	}
}

func testReboot(t *testing.T, cdiSurvives bool) {
	r := newRigMode(t, splitModes)
	r.cdiSurvivesReboot = cdiSurvives
	whole, mig, vgpu := claim("whole", "gpu-1"), claim("mig", r.migDevice(0, "1g.10gb", 6)), share("vgpu", "gpu-5", "8Gi", 25)
	gone := claim("gone", r.migDevice(2, "1g.10gb", 6))
	before := map[types.UID][]kubeletplugin.Device{}
	for _, c := range []*resourceapi.ResourceClaim{whole, mig, vgpu, gone} {
		devs, err := r.prepareOne(c)
		if err != nil {
			t.Fatal(err)
		}
		before[c.UID] = devs
	}
	store, _ := checkpoint.Open(r.checkpoints)
	goneRec, _ := store.Get(gone.UID)
	r.reboot(2)
	for _, c := range []*resourceapi.ResourceClaim{whole, mig, vgpu} {
		devs, err := r.prepareOne(c)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if brief(devs) != brief(before[c.UID]) {
			t.Errorf("%s: CDI IDs changed across the reboot: %v -> %v", c.Name, before[c.UID], devs)
		}
		if !r.specExists(c.UID) {
			t.Errorf("%s: no CDI spec after re-prepare", c.Name)
		}
	}
	// The MIG claim's spec names the instance carved in this boot.
	live, _ := r.lib.ListMIGOn(r.inv.GPUs[0].UUID)
	if len(live) != 1 || !strings.Contains(r.spec(mig.UID), "FACET_GPU_UUIDS="+live[0].UUID) {
		t.Errorf("MIG claim's spec does not name the live instance %+v", live)
	}
	// An admin carves the same instance the unre-prepared claim had:
	// NVML hands out the same IDs.
	gpu1 := r.inv.GPUs[2].UUID
	if _, err := r.lib.EnableMIG(gpu1); err != nil {
		t.Fatal(err)
	}
	admin, err := r.lib.CreateMIG(gpu1, goneRec.Devices[0].MIG.GIProfileID, 6)
	if err != nil {
		t.Fatal(err)
	}
	if admin.GIID != goneRec.Devices[0].MIG.GIID {
		t.Logf("(NVML gave the admin's instance GI %d, the record had %d)", admin.GIID, goneRec.Devices[0].MIG.GIID)
	}
	if err := r.unprepareOne(gone); err != nil {
		t.Fatal(err)
	}
	if in, _ := r.lib.ListMIGOn(gpu1); len(in) != 1 {
		t.Fatalf("unprepare after a reboot destroyed an instance it did not create: %+v", in)
	}
	if err := r.lib.DestroyMIG(gpu1, admin.GIID, admin.CIID); err != nil {
		t.Fatal(err)
	}
	r.audit(whole, mig, vgpu)
	// A second re-prepare in the same boot trusts what it verified.
	for _, c := range []*resourceapi.ResourceClaim{whole, mig, vgpu} {
		if _, err := r.prepareOne(c); err != nil {
			t.Fatal(err)
		}
	}
	r.audit(whole, mig, vgpu)
}

// TestRePrepareVerifies (H1): without a reboot, a re-prepare checks the
// spec's content hash, the MIG instance and the HAMi-core region, and
// rebuilds what is missing or damaged.
func TestRePrepareVerifies(t *testing.T) {
	needMIGEdits(t)
	for _, tc := range []struct {
		name   string
		claim  func(r *rig) *resourceapi.ResourceClaim
		damage func(r *rig, c *resourceapi.ResourceClaim)
	}{
		{"spec deleted", subjects[0].claim, func(r *rig, c *resourceapi.ResourceClaim) {
			os.Remove(filepath.Join(r.cdiDir, claimcdi.SpecName(c.UID)+".json"))
		}},
		{"spec truncated", subjects[0].claim, func(r *rig, c *resourceapi.ResourceClaim) {
			p := filepath.Join(r.cdiDir, claimcdi.SpecName(c.UID)+".json")
			b, _ := os.ReadFile(p)
			if err := os.WriteFile(p, b[:len(b)/2], 0o644); err != nil {
				r.t.Fatal(err)
			}
		}},
		{"MIG instance destroyed", subjects[1].claim, func(r *rig, c *resourceapi.ResourceClaim) {
			in, _ := r.lib.ListMIG()
			for _, i := range in {
				if err := r.lib.DestroyMIG(i.ParentUUID, i.GIID, i.CIID); err != nil {
					r.t.Fatal(err)
				}
			}
		}},
		{"HAMi-core region removed", subjects[2].claim, func(r *rig, c *resourceapi.ResourceClaim) {
			os.RemoveAll(filepath.Join(filepath.Dir(r.checkpoints), "vgpu", "claims", string(c.UID)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRigMode(t, splitModes)
			c := tc.claim(r)
			first, err := r.prepareOne(c)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(r, c)
			again, err := r.prepareOne(c)
			if err != nil {
				t.Fatal(err)
			}
			if brief(first) != brief(again) {
				t.Errorf("result changed: %v -> %v", first, again)
			}
			r.audit(c)
		})
	}
}

// TestOneBadGPUDoesNotStopTheNode (H2, fail small): a half-made instance,
// a GPU NVML cannot list, and a rollback that fails each make their own
// GPU unusable, with the reason; the plugin starts and the other GPUs
// serve. --destroy-unowned-mig clears the half-made instance.
func TestOneBadGPUDoesNotStopTheNode(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, splitModes)
	gpu := func(i int) string { return r.inv.GPUs[i].UUID }
	r.simState = filepath.Join(t.TempDir(), "nvml.json")
	var err error
	if r.lib, err = sim.OpenMachine(machineFile, sim.WithStateFile(r.simState)); err != nil {
		t.Fatal(err)
	}
	r.restart()

	// GPU 1: an interrupted prepare whose rollback fails in NVML.
	c1 := claim("rollback-fails", r.migDevice(1, "1g.10gb", 6))
	if _, err := r.prepareOne(c1); err != nil {
		t.Fatal(err)
	}
	// GPU 2: a GPU instance without a compute instance.
	if _, err := r.lib.EnableMIG(gpu(2)); err != nil {
		t.Fatal(err)
	}
	half, err := r.lib.CreateMIG(gpu(2), r.inv.GPUs[2].MIGProfiles[0].GIProfileID, 0)
	if err != nil {
		t.Fatal(err)
	}
	halfMade(t, r, gpu(2), half)
	store, _ := checkpoint.Open(r.checkpoints)
	rec, _ := store.Get(c1.UID)
	rec.State = checkpoint.StatePreparing
	if err := store.Put(rec); err != nil {
		t.Fatal(err)
	}
	// GPU 3: NVML cannot list its instances.
	r.wrapMIG = func(m MIGManager) MIGManager {
		return faultyMIG{MIGManager: m, listFails: gpu(3), destroyFails: gpu(1)}
	}
	r.restart()

	bad := r.d.UnusableGPUs()
	for i, want := range map[int]string{1: "rolling back the interrupted prepare of claim ns/rollback-fails", 2: "has no compute instance", 3: "listing its MIG instances failed"} {
		if !strings.Contains(bad[gpu(i)], want) {
			t.Errorf("GPU %d: unusable because %q, want %q", i, bad[gpu(i)], want)
		}
	}
	if len(bad) != 3 {
		t.Errorf("unusable: %v", bad)
	}
	for _, i := range []int{1, 2, 3} {
		c := claim(fmt.Sprintf("on-%d", i), fmt.Sprintf("gpu-%d", i))
		if _, err := r.prepareOne(c); err == nil || !strings.Contains(err.Error(), "is unusable: ") {
			t.Errorf("claim on unusable GPU %d: %v", i, err)
		}
	}
	// The rolled-back claim's record and reservation are kept (fail closed).
	if rec, _ := store.Get(c1.UID); rec == nil {
		t.Error("record of the failed rollback dropped")
	}
	for _, c := range []*resourceapi.ResourceClaim{claim("ok-whole", "gpu-0"), share("ok-share", "gpu-6", "1Gi", 10)} {
		if _, err := r.prepareOne(c); err != nil {
			t.Errorf("%s on a good GPU: %v", c.Name, err)
		}
	}

	r.wrapMIG = nil
	r.destroyUnowned = true
	r.restart()
	if bad := r.d.UnusableGPUs(); len(bad) != 0 {
		t.Errorf("still unusable after --destroy-unowned-mig and a working NVML: %v", bad)
	}
	if in, _ := r.lib.ListMIGOn(gpu(2)); len(in) != 0 {
		t.Errorf("half-made instance left: %+v", in)
	}
}

// halfMade turns a created instance into what a crash inside CreateMIG
// leaves, the GPU instance without its compute instance, by editing the
// simulated NVML's state file and reopening it.
func halfMade(t *testing.T, r *rig, gpu string, in nvmlgpu.MIGInstance) {
	t.Helper()
	data, err := os.ReadFile(r.simState)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	for _, g := range st["gpus"].([]any) {
		g := g.(map[string]any)
		if g["uuid"] != gpu {
			continue
		}
		for _, gi := range g["gpuInstances"].([]any) {
			if gi := gi.(map[string]any); int(gi["id"].(float64)) == in.GIID {
				delete(gi, "computeInstances")
			}
		}
	}
	data, _ = json.Marshal(st)
	if err := os.WriteFile(r.simState, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if r.lib, err = sim.OpenMachine(machineFile, sim.WithStateFile(r.simState)); err != nil {
		t.Fatal(err)
	}
	list, _ := r.lib.ListMIGOn(gpu)
	if len(list) != 1 || list[0].CIID != -1 {
		t.Fatalf("not half-made: %+v", list)
	}
}

type faultyMIG struct {
	MIGManager
	listFails, destroyFails string
}

func (f faultyMIG) ListMIGOn(gpu string) ([]nvmlgpu.MIGInstance, error) {
	if gpu == f.listFails {
		return nil, fmt.Errorf("simulated NVML error")
	}
	return f.MIGManager.ListMIGOn(gpu)
}

func (f faultyMIG) DestroyMIG(gpu string, gi, ci int) error {
	if gpu == f.destroyFails {
		return fmt.Errorf("simulated NVML error")
	}
	return f.MIGManager.DestroyMIG(gpu, gi, ci)
}
