package dradriver

// Unit tests: the driver over the in-memory fakes of package fake, with no
// driver root, NVML, mount namespace or root. They never call newRig, so
// they run (in parallel) as an ordinary user; the tests that do are the
// integration tests on real files and the simulated NVML.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/driver/fake"
	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

var (
	_ EditSource          = fake.Edits{}
	_ MIGManager          = (*fake.MIG)(nil)
	_ SpecWriter          = (*fake.Specs)(nil)
	_ Store               = (*fake.Store)(nil)
	_ sharing.ShareEditor = (*fake.HAMi)(nil)
)

// simNodes are demo machines discovered once per test binary, by file
// name (discovery only: no NVML calls afterwards).
var (
	simNodesMu sync.Mutex
	simNodes   = map[string]*nvmlgpu.Node{}
)

// simNode discovers demo/machines/<machine>.yaml, once.
func simNode(t *testing.T, machine string) *nvmlgpu.Node {
	t.Helper()
	simNodesMu.Lock()
	defer simNodesMu.Unlock()
	if n, ok := simNodes[machine]; ok {
		return n
	}
	lib, err := sim.OpenMachine("../../../demo/machines/" + machine + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	n, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	simNodes[machine] = n
	return n
}

// unit is a driver over fakes, on the inventory of a simulated DGX H100
// (read once: discovery only, no NVML calls afterwards).
type unit struct {
	t     *testing.T
	ctx   context.Context
	inv   *inventory.Inventory
	specs *fake.Specs
	store *fake.Store
	mig   *fake.MIG
	hami  *fake.HAMi
	d     *Driver
	// bootIDFile stands in for /proc/sys/kernel/random/boot_id, which
	// holds bootID.
	bootIDFile, bootID string
}

func newUnit(t *testing.T, cfg inventory.Config) *unit {
	t.Helper()
	unitNode := simNode(t, "dgx-h100")
	inv, err := inventory.Build(unitNode, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, ctx := ktesting.NewTestContext(t)
	u := &unit{t: t, ctx: ctx, inv: inv, specs: fake.NewSpecs(), store: fake.NewStore(), mig: fake.NewMIG(unitNode.GPUs), hami: fake.NewHAMi(filepath.Join(dir, "vgpu")),
		bootIDFile: filepath.Join(dir, "boot_id")}
	u.boot("boot-1")
	u.start()
	return u
}

// boot sets the boot ID the next start reads.
func (u *unit) boot(id string) {
	u.t.Helper()
	u.bootID = id
	if err := os.WriteFile(u.bootIDFile, []byte(id+"\n"), 0o600); err != nil {
		u.t.Fatal(err)
	}
}

// start (re)starts the driver on the fakes' current state.
func (u *unit) start() {
	u.t.Helper()
	var err error
	u.d, err = New(u.ctx, Options{NodeName: node, Inventory: u.inv, Store: u.store, CDI: u.specs, Edits: fake.Edits{}, MIG: u.mig, HAMi: u.hami, BootIDPath: u.bootIDFile})
	if err != nil {
		u.t.Fatal(err)
	}
}

func (u *unit) prepare(claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	u.t.Helper()
	res, err := u.d.PrepareResourceClaims(u.ctx, claims)
	if err != nil || len(res) != len(claims) {
		u.t.Fatalf("PrepareResourceClaims: %d results, %v", len(res), err)
	}
	return res
}

func (u *unit) unprepare(uids ...types.UID) map[types.UID]error {
	u.t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, uid := range uids {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: uid})
	}
	res, err := u.d.UnprepareResourceClaims(u.ctx, objs)
	if err != nil {
		u.t.Fatal(err)
	}
	return res
}

// migDevice finds the published device of a profile at a placement.
func (u *unit) migDevice(gpu int, profile string, start int) string {
	u.t.Helper()
	for _, d := range u.inv.GPUs[gpu].Devices {
		if d.Kind == inventory.KindMIG && d.MIG.Name == profile && d.Placement.Start == start {
			return d.Name
		}
	}
	u.t.Fatalf("GPU %d publishes no %s at %d", gpu, profile, start)
	return ""
}

func slotCfg(t *testing.T) inventory.Config {
	layout, err := inventory.ParseSlotLayout("1x40Gi/50+2")
	if err != nil {
		t.Fatal(err)
	}
	return inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive,
		PerGPU: map[int]inventory.Mode{3: inventory.ModeSlots}, PerGPUSlots: map[int]inventory.SlotLayout{3: layout}}
}

// TestUnitPrepare prepares one claim of each kind and checks the result,
// the CDI spec, the checkpoint record and what was made for it.
func TestUnitPrepare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   func(*testing.T) inventory.Config
		claim func(*unit) *resourceapi.ResourceClaim
		kind  string
		// want are strings the spec contains; wantNone it must not.
		want     func(*unit) []string
		wantNone []string
		migs     int
	}{
		{
			name:  "whole GPU",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeExclusive} },
			claim: func(*unit) *resourceapi.ResourceClaim { return claim("pair", "gpu-2", "gpu-3") },
			kind:  kindWhole,
			want: func(u *unit) []string {
				g2, g3 := u.inv.GPUs[2].UUID, u.inv.GPUs[3].UUID
				return []string{`"kind":"gpu.facet.dev/claim"`, `"name":"uid-pair-gpu-2"`, "/dev/nvidia-" + g2, "/dev/nvidia-" + g3, "/dev/nvidiactl", "FAKE_COMMON=1",
					"FACET_GPU_UUIDS=" + g2 + "," + g3, "FACET_DEVICES=gpu-2,gpu-3", "FACET_CLAIM=ns/pair"}
			},
			wantNone: []string{"CUDA_DEVICE_MEMORY_LIMIT", "/dev/nvidia-GPU-0"},
		},
		{
			name:  "vGPU share",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeShared} },
			claim: func(*unit) *resourceapi.ResourceClaim { return share("volcano", "gpu-3", "2000Mi", 20) },
			kind:  kindShare,
			want: func(u *unit) []string {
				return []string{"/dev/nvidia-" + u.inv.GPUs[3].UUID, "CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "CUDA_DEVICE_SM_LIMIT_0=20", "uid-volcano/vgpu.cache", "FACET_DEVICES=gpu-3"}
			},
		},
		{
			name:  "vGPU share of the whole GPU",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeShared} },
			claim: func(*unit) *resourceapi.ResourceClaim { return share("whole", "gpu-4", "81079Mi", 100) },
			kind:  kindShare,
			want: func(u *unit) []string {
				return []string{"/dev/nvidia-" + u.inv.GPUs[4].UUID}
			},
			wantNone: []string{"CUDA_DEVICE_MEMORY_LIMIT", "vgpu.cache"},
		},
		{
			name:  "vGPU slot",
			cfg:   slotCfg,
			claim: func(*unit) *resourceapi.ResourceClaim { return claim("small", "gpu-3-slot-0") },
			kind:  kindSlot,
			want: func(u *unit) []string {
				return []string{"/dev/nvidia-" + u.inv.GPUs[3].UUID, "CUDA_DEVICE_MEMORY_LIMIT_0=20059m", "CUDA_DEVICE_SM_LIMIT_0=25", "uid-small/vgpu.cache"}
			},
		},
		{
			name:  "MIG device",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeMIG} },
			claim: func(u *unit) *resourceapi.ResourceClaim { return claim("small", u.migDevice(0, "1g.10gb", 6)) },
			kind:  kindMIG,
			want: func(u *unit) []string {
				return []string{"/dev/nvidia-caps/" + u.inv.GPUs[0].UUID + "-1-0", "FACET_GPU_UUIDS=MIG-fake-" + u.inv.GPUs[0].UUID + "-1"}
			},
			migs: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, tc.cfg(t))
			c := tc.claim(u)
			res := u.prepare(c)[c.UID]
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			results := c.Status.Allocation.Devices.Results
			if len(res.Devices) != len(results) {
				t.Fatalf("%d devices, want %d", len(res.Devices), len(results))
			}
			for i, d := range res.Devices {
				if d.DeviceName != results[i].Device || d.PoolName != node || len(d.CDIDeviceIDs) != 1 ||
					d.CDIDeviceIDs[0] != "gpu.facet.dev/claim="+string(c.UID)+"-"+results[i].Device {
					t.Errorf("device %d: %+v", i, d)
				}
			}
			spec := u.specs.Spec(c.UID)
			for _, w := range tc.want(u) {
				if !strings.Contains(spec, w) {
					t.Errorf("spec lacks %s:\n%s", w, spec)
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(spec, w) {
					t.Errorf("spec has %s:\n%s", w, spec)
				}
			}
			rec, err := u.store.Get(c.UID)
			if err != nil || rec == nil || rec.State != checkpoint.StatePrepared || rec.BootID != "boot-1" || rec.Devices[0].Kind != tc.kind {
				t.Fatalf("checkpoint: %+v, %v", rec, err)
			}
			if n := u.mig.Count(); n != tc.migs {
				t.Errorf("%d MIG instances, want %d", n, tc.migs)
			}
			if m := rec.Devices[0].MIG; tc.migs > 0 && (m == nil || !m.Created || m.GIID != 1 || m.UUID == "") {
				t.Errorf("checkpoint MIG: %+v", m)
			}
			// Re-prepare is idempotent: the same result, nothing rewritten.
			again := u.prepare(c)[c.UID]
			if again.Err != nil || len(again.Devices) != len(res.Devices) || again.Devices[0].CDIDeviceIDs[0] != res.Devices[0].CDIDeviceIDs[0] {
				t.Fatalf("re-prepare: %+v", again)
			}
			if u.specs.Spec(c.UID) != spec || u.mig.Count() != tc.migs {
				t.Error("re-prepare rewrote the spec or made MIG instances")
			}
		})
	}
}

// TestUnitConflictRefused: a device another claim holds is refused with an
// error naming the holder, and the refused claim holds nothing.
func TestUnitConflictRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		cfg          func(*testing.T) inventory.Config
		first, later func(*unit) *resourceapi.ResourceClaim
		free         string
		want         func(*unit) string
	}{
		{
			name:  "whole GPU twice",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeExclusive} },
			first: func(*unit) *resourceapi.ResourceClaim { return claim("first", "gpu-1") },
			later: func(*unit) *resourceapi.ResourceClaim { return claim("second", "gpu-1", "gpu-2") },
			free:  "gpu-2",
			want: func(u *unit) string {
				return "claim ns/second: device gpu-1: conflicts with whole GPU gpu-1 of claim ns/first (uid-first), already prepared on GPU " + u.inv.GPUs[1].UUID
			},
		},
		{
			name:  "slot twice",
			cfg:   slotCfg,
			first: func(*unit) *resourceapi.ResourceClaim { return claim("small", "gpu-3-slot-0") },
			later: func(*unit) *resourceapi.ResourceClaim { return claim("again", "gpu-3-slot-0") },
			free:  "gpu-3-slot-1",
			want: func(*unit) string {
				return "claim ns/again: device gpu-3-slot-0: conflicts with vGPU share of gpu-3-slot-0 (20059 MiB, 25% SM) of claim ns/small (uid-small)"
			},
		},
		{
			name:  "shares beyond the GPU",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeShared} },
			first: func(*unit) *resourceapi.ResourceClaim { return share("whole", "gpu-4", "81079Mi", 100) },
			later: func(*unit) *resourceapi.ResourceClaim { return share("late", "gpu-4", "1Gi", 1) },
			free:  "gpu-5",
			want: func(u *unit) string {
				return "claim ns/late: device gpu-4: a share of 1024 MiB does not fit on GPU " + u.inv.GPUs[4].UUID
			},
		},
		{
			name:  "overlapping MIG placements",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeMIG} },
			first: func(u *unit) *resourceapi.ResourceClaim { return claim("big", u.migDevice(0, "4g.40gb", 0)) },
			later: func(u *unit) *resourceapi.ResourceClaim { return claim("small", u.migDevice(0, "1g.10gb", 0)) },
			free:  "gpu-1",
			want: func(u *unit) string {
				return "conflicts with MIG device " + u.migDevice(0, "4g.40gb", 0) + " (memory slices 0-3) of claim ns/big (uid-big)"
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, tc.cfg(t))
			first, later := tc.first(u), tc.later(u)
			if err := u.prepare(first)[first.UID].Err; err != nil {
				t.Fatal(err)
			}
			migs := u.mig.Count()
			err := u.prepare(later)[later.UID].Err
			if err == nil || !strings.Contains(err.Error(), tc.want(u)) {
				t.Fatalf("conflict: %v\nwant: %s", err, tc.want(u))
			}
			if u.specs.Spec(first.UID) == "" || u.specs.Spec(later.UID) != "" {
				t.Fatal("the refusal disturbed the first claim or left the later one's spec")
			}
			if rec, _ := u.store.Get(later.UID); rec != nil || u.mig.Count() != migs {
				t.Fatalf("the refused claim left a record (%+v) or MIG instances", rec)
			}
			// What else the refused claim named is still free.
			free := claim("free", tc.free)
			if err := u.prepare(free)[free.UID].Err; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnitUnprepareIdempotent: unprepare removes everything prepare made,
// and unpreparing again, or a claim never seen, succeeds.
func TestUnitUnprepareIdempotent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   func(*testing.T) inventory.Config
		claim func(*unit) *resourceapi.ResourceClaim
	}{
		{"whole GPU", func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeExclusive} },
			func(*unit) *resourceapi.ResourceClaim { return claim("pair", "gpu-2", "gpu-3") }},
		{"vGPU share", func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeShared} },
			func(*unit) *resourceapi.ResourceClaim { return share("volcano", "gpu-3", "2000Mi", 20) }},
		{"vGPU slot", slotCfg, func(*unit) *resourceapi.ResourceClaim { return claim("small", "gpu-3-slot-0") }},
		{"MIG device", func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeMIG} },
			func(u *unit) *resourceapi.ResourceClaim { return claim("small", u.migDevice(0, "1g.10gb", 6)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, tc.cfg(t))
			c := tc.claim(u)
			if err := u.prepare(c)[c.UID].Err; err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 2; i++ {
				if err := u.unprepare(c.UID)[c.UID]; err != nil {
					t.Fatalf("unprepare %d: %v", i+1, err)
				}
				if rec, _ := u.store.Get(c.UID); rec != nil || u.specs.Spec(c.UID) != "" || u.mig.Count() != 0 {
					t.Fatalf("unprepare %d left record %+v, spec %q or %d MIG instances", i+1, rec, u.specs.Spec(c.UID), u.mig.Count())
				}
				if caches, _ := u.hami.ClaimCaches(); len(caches) != 0 {
					t.Fatalf("unprepare %d left accounting regions %v", i+1, caches)
				}
			}
			if err := u.unprepare("never-seen")["never-seen"]; err != nil {
				t.Fatalf("unprepare of an unknown claim: %v", err)
			}
			// The devices are free again.
			again := tc.claim(u)
			if err := u.prepare(again)[again.UID].Err; err != nil {
				t.Fatalf("prepare after unprepare: %v", err)
			}
		})
	}
}

// TestUnitRestart: a restart keeps prepared claims and who holds what,
// rolls back an interrupted prepare, removes an orphaned spec, and keeps
// the devices an unreadable record names reserved until its claim is
// unprepared.
func TestUnitRestart(t *testing.T) {
	t.Parallel()
	u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeExclusive})
	kept := claim("kept", "gpu-0")
	if err := u.prepare(kept)[kept.UID].Err; err != nil {
		t.Fatal(err)
	}
	interrupted := &checkpoint.Claim{UID: "uid-interrupted", Namespace: "ns", Name: "interrupted", State: checkpoint.StatePreparing, BootID: "boot-1",
		Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: node, Device: "gpu-1", GPUUUID: u.inv.GPUs[1].UUID, Kind: kindWhole}}}
	if err := u.store.Put(interrupted); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []types.UID{"uid-interrupted", "uid-orphan"} {
		if _, _, _, err := u.specs.WriteClaim(uid, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	broken := claim("broken", "gpu-3")
	u.store.Corrupt(broken.UID, &checkpoint.Claim{UID: broken.UID, Namespace: "ns", Name: "broken", State: checkpoint.StatePrepared,
		Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: node, Device: "gpu-3", GPUUUID: u.inv.GPUs[3].UUID, Kind: kindWhole}}})

	u.start()

	if u.specs.Spec(kept.UID) == "" || u.specs.Spec("uid-interrupted") != "" || u.specs.Spec("uid-orphan") != "" {
		t.Fatal("restart lost a prepared claim's spec or kept an interrupted or orphaned one")
	}
	if rec, _ := u.store.Get("uid-interrupted"); rec != nil {
		t.Fatal("restart kept the interrupted record")
	}
	if res := u.prepare(kept)[kept.UID]; res.Err != nil || res.Devices[0].DeviceName != "gpu-0" {
		t.Fatalf("re-prepare after restart: %+v", res)
	}
	for _, tc := range []struct{ device, holder string }{{"gpu-0", "ns/kept"}, {"gpu-3", "ns/broken"}} {
		c := claim("intruder-"+tc.device, tc.device)
		if err := u.prepare(c)[c.UID].Err; err == nil || !strings.Contains(err.Error(), tc.holder) {
			t.Errorf("restart forgot that %s holds %s: %v", tc.holder, tc.device, err)
		}
	}
	if c := claim("after", "gpu-1"); u.prepare(c)[c.UID].Err != nil {
		t.Fatal("gpu-1 still held after rollback")
	}
	if err := u.prepare(broken)[broken.UID].Err; err == nil || !strings.Contains(err.Error(), "claim ns/broken") || !strings.Contains(err.Error(), "corrupt checkpoint") {
		t.Fatalf("corrupt record: %v", err)
	}
	if err := u.unprepare(broken.UID)[broken.UID]; err != nil {
		t.Fatal(err)
	}
	if err := u.prepare(broken)[broken.UID].Err; err != nil {
		t.Fatalf("claim after cleanup: %v", err)
	}
}

// TestUnitRebuild: a prepared claim whose spec or MIG instance is gone, or
// which dates from before a reboot, is rebuilt on re-prepare, not handed
// out stale.
func TestUnitRebuild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(u *unit, c *resourceapi.ResourceClaim)
	}{
		{"spec lost", func(u *unit, c *resourceapi.ResourceClaim) { u.specs.Delete(c.UID) }},
		{"spec changed", func(u *unit, c *resourceapi.ResourceClaim) {
			if _, _, _, err := u.specs.WriteClaim(c.UID, nil, nil); err != nil {
				u.t.Fatal(err)
			}
		}},
		{"MIG instance destroyed", func(u *unit, c *resourceapi.ResourceClaim) {
			rec, _ := u.store.Get(c.UID)
			if err := u.mig.DestroyMIG(rec.Devices[0].GPUUUID, rec.Devices[0].MIG.GIID, rec.Devices[0].MIG.CIID); err != nil {
				u.t.Fatal(err)
			}
		}},
		{"reboot", func(u *unit, c *resourceapi.ResourceClaim) {
			// The reboot took the instance; the fake keeps it, so the
			// rebuild must not reuse it: remove it as the reboot would.
			rec, _ := u.store.Get(c.UID)
			if err := u.mig.DestroyMIG(rec.Devices[0].GPUUUID, rec.Devices[0].MIG.GIID, rec.Devices[0].MIG.CIID); err != nil {
				u.t.Fatal(err)
			}
			u.boot("boot-2")
			u.start()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeMIG})
			c := claim("small", u.migDevice(0, "1g.10gb", 6))
			res := u.prepare(c)[c.UID]
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			tc.damage(u, c)
			again := u.prepare(c)[c.UID]
			if again.Err != nil || again.Devices[0].CDIDeviceIDs[0] != res.Devices[0].CDIDeviceIDs[0] {
				t.Fatalf("re-prepare: %+v", again)
			}
			rec, _ := u.store.Get(c.UID)
			if rec == nil || rec.State != checkpoint.StatePrepared || rec.BootID != u.bootID || u.specs.Verify(c.UID, rec.CDISpecHash) != nil {
				t.Fatalf("after rebuild: record %+v, spec %q", rec, u.specs.Spec(c.UID))
			}
			live, _ := u.mig.ListMIGOn(rec.Devices[0].GPUUUID)
			if len(live) != 1 || live[0].GIID != rec.Devices[0].MIG.GIID || !strings.Contains(u.specs.Spec(c.UID), live[0].UUID) {
				t.Fatalf("after rebuild: instances %+v, record %+v", live, rec.Devices[0].MIG)
			}
		})
	}
}
