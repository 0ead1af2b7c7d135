package dradriver

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
)

var stockCluster = features.Stock("test")

// TestStaticMIG: on a stock cluster, GPU 0 carries mig-parted's
// all-balanced. Its instances are devices: prepare hands one out, carving
// nothing; unprepare and restarts destroy nothing, even with
// --destroy-unowned-mig; a second claim on a held instance is refused.
func TestStaticMIG(t *testing.T) {
	needMIGEdits(t)
	r := newRigMode(t, inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive})
	g := r.inv.GPUs[0].GPU
	if _, err := miglayout.Apply(r.lib, miglayout.NewStore(filepath.Join(t.TempDir(), "layouts.json")), g, "all-balanced", nil, false); err != nil {
		t.Fatal(err)
	}
	carved, err := r.lib.ListMIG()
	if err != nil || len(carved) != 4 {
		t.Fatalf("carved %d instances: %v", len(carved), err)
	}
	r.rebuild(inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{0: inventory.ModeStaticMIG}, MIGInstances: carved})

	dev := r.migDevice(0, "1g.10gb", carved[len(carved)-1].Placement.Start)
	var want string
	for _, in := range carved {
		if in.Profile == "1g.10gb" && strings.HasSuffix(dev, "-"+itoa(in.Placement.Start)) {
			want = in.UUID
		}
	}
	c := claim("static", dev)
	if err := r.prepare(c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	spec := r.spec(c.UID)
	for _, w := range []string{"/dev/nvidia-caps/nvidia-cap", "FACET_GPU_UUIDS=" + want} {
		if !strings.Contains(spec, w) {
			t.Errorf("spec lacks %s:\n%s", w, spec)
		}
	}
	if n := r.migCount(); n != 4 {
		t.Errorf("prepare changed the instances: %d", n)
	}
	twice := claim("twice", dev)
	if err := r.prepare(twice)[twice.UID].Err; err == nil || !strings.Contains(err.Error(), "claim ns/static") {
		t.Errorf("a held static instance was handed out again: %v", err)
	}
	if err := r.unprepare(c.UID)[c.UID]; err != nil {
		t.Fatal(err)
	}
	if n := r.migCount(); n != 4 {
		t.Errorf("unprepare destroyed a static instance: %d left", n)
	}
	r.destroyUnowned = true
	r.start()
	if n := r.migCount(); n != 4 {
		t.Errorf("--destroy-unowned-mig destroyed static instances: %d left", n)
	}
}

// TestSlots: fixed-size vGPU slots get their slot's HAMi-core limits; a
// slot holds one claim.
func TestSlots(t *testing.T) {
	layout, err := inventory.ParseSlotLayout("1x40Gi/50+2")
	if err != nil {
		t.Fatal(err)
	}
	r := newRigMode(t, inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive,
		PerGPU: map[int]inventory.Mode{3: inventory.ModeSlots}, PerGPUSlots: map[int]inventory.SlotLayout{3: layout}})
	small, big := claim("small", "gpu-3-slot-0"), claim("big", "gpu-3-slot-2")
	res := r.prepare(small, big)
	for _, c := range []string{"small", "big"} {
		if err := res[claim(c).UID].Err; err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"small", []string{"CUDA_DEVICE_MEMORY_LIMIT_0=20059m", "CUDA_DEVICE_SM_LIMIT_0=25", "uid-small/vgpu.cache", "/etc/ld.so.preload", r.root + `/dev/nvidia3"`}},
		{"big", []string{"CUDA_DEVICE_MEMORY_LIMIT_0=40960m", "CUDA_DEVICE_SM_LIMIT_0=50"}},
	} {
		spec := r.spec(claim(tc.name).UID)
		for _, w := range tc.want {
			if !strings.Contains(spec, w) {
				t.Errorf("%s: spec lacks %s", tc.name, w)
			}
		}
	}
	again := claim("again", "gpu-3-slot-0")
	if err := r.prepare(again)[again.UID].Err; err == nil || !strings.Contains(err.Error(), "claim ns/small") {
		t.Errorf("a held slot was handed out again: %v", err)
	}
	if err := r.prepare(claim("other", "gpu-3-slot-1"))["uid-other"].Err; err != nil {
		t.Errorf("the free slot: %v", err)
	}
}

// rebuild replaces the rig's inventory and restarts the driver on it.
func (r *rig) rebuild(cfg inventory.Config) {
	r.t.Helper()
	n, err := r.lib.Discover()
	if err != nil {
		r.t.Fatal(err)
	}
	if r.inv, err = inventory.Build(n, cfg); err != nil {
		r.t.Fatal(err)
	}
	r.start()
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestSlotLimitedByVgpuConfig: a claim's VgpuConfig lowers its slot's
// limits (HAMi's 3000 MiB / 10 % on a 20 GiB / 25 % slot), and asking for
// more than the slot fails that claim alone, naming the field.
func TestSlotLimitedByVgpuConfig(t *testing.T) {
	r := newRigMode(t, inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{3: inventory.ModeSlots}})
	hami := withConfig(claim("hami", "gpu-3-slot-0"), `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","memory":"3000Mi","cores":10}`)
	greedy := withConfig(claim("greedy", "gpu-3-slot-1"), `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","memory":"30Gi"}`)
	res := r.prepare(hami, greedy)
	if err := res[hami.UID].Err; err != nil {
		t.Fatal(err)
	}
	spec := r.spec(hami.UID)
	for _, w := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT_0=10"} {
		if !strings.Contains(spec, w) {
			t.Errorf("spec lacks %s", w)
		}
	}
	want := `claim ns/greedy: request "gpu": device node-a/gpu-3-slot-1: VgpuConfig: memory: Invalid value: "30Gi": more than the 20269 MiB the device gives`
	if err := res[greedy.UID].Err; err == nil || err.Error() != want {
		t.Errorf("error %v\nwant  %s", err, want)
	}
}
