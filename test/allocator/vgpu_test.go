package allocator

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// consumed is a share's consumed capacity, "memory/cores".
func consumed(t *testing.T, res *resourceapi.AllocationResult) string {
	t.Helper()
	if res == nil || len(res.Devices.Results) != 1 {
		t.Fatalf("want one result, got %v", res)
	}
	r := res.Devices.Results[0]
	if r.ShareID == nil {
		t.Fatalf("%s: no shareID", r.Device)
	}
	mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
	return mem.String() + "/" + cores.String()
}

func sharedH100(t *testing.T, mode string) *Cluster {
	return NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", mode), deviceClasses(t))
}

func TestVGPUShares(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"four 25% shares fit on one GPU, a fifth does not", []step{
			{share("a", "1Gi", "25"), []string{"gpu-0"}},
			{share("b", "1Gi", "25"), []string{"gpu-0"}},
			{share("c", "1Gi", "25"), []string{"gpu-0"}},
			{share("d", "1Gi", "25"), []string{"gpu-0"}},
			{share("e", "1Gi", "25"), []string{"gpu-1"}},
			{share("f", "1Gi", "25", onGPU(0)), nil},
		}},
		// 81079 MiB less the MPS server's 66 MiB, kept out wherever MPS
		// is configured (sharemem.MPSServerBytes).
		{"memory is enforced: 3 x 30Gi on H100s of 81013 MiB", []step{
			{share("a", "30Gi", "1"), []string{"gpu-0"}},
			{share("b", "30Gi", "1"), []string{"gpu-0"}},
			{share("c", "30Gi", "1"), []string{"gpu-1"}},
			{share("d", "19573Mi", "1"), []string{"gpu-0"}}, // exactly the 81013 - 61440 MiB left
			{share("e", "1Mi", "0", onGPU(0)), nil},
		}},
		{"cores are enforced", []step{
			{share("a", "1Gi", "60"), []string{"gpu-0"}},
			{share("b", "1Gi", "50"), []string{"gpu-1"}},
			{share("c", "1Gi", "40"), []string{"gpu-0"}},
			{share("d", "1Gi", "0"), []string{"gpu-0"}}, // best effort fits on a full GPU
		}},
		{"a claim asking nothing takes the whole GPU", []step{
			{share("all", "", ""), []string{"gpu-0"}},
			{share("tiny", "1Mi", "0"), []string{"gpu-1"}},
		}},
		{"asking only memory takes all cores", []step{
			{share("mem", "1Gi", ""), []string{"gpu-0"}},
			{share("tiny", "1Mi", "1"), []string{"gpu-1"}},
			{share("best-effort", "1Mi", "0"), []string{"gpu-0"}},
		}},
		{"a whole GPU does not fit beside a share", []step{
			{share("s", "1Gi", "10"), []string{"gpu-0"}},
			{gpuClaim("whole", 1, onGPU(0)), nil},
			{gpuClaim("whole", 1), []string{"gpu-1"}},
		}},
		{"a share does not fit beside a whole GPU", []step{
			{gpuClaim("whole", 1), []string{"gpu-0"}},
			{share("s", "1Mi", "0", onGPU(0)), nil},
			{share("s", "1Mi", "0"), []string{"gpu-1"}},
		}},
		{"requests beyond the GPU do not fit", []step{
			{share("cores", "1Gi", "101"), nil},
			{share("mem", "81Gi", "1"), nil},
		}},
		{"demo claims share one GPU", []step{
			{demoClaim(t, "vgpu/volcano-share.yaml"), []string{"gpu-0"}},
			{demoClaim(t, "vgpu/notebook.yaml"), []string{"gpu-0"}},
			{demoClaim(t, "vgpu/shared-by-two-containers.yaml"), []string{"gpu-0"}},
			{share("rest", "1Gi", "30"), []string{"gpu-0"}},
			{share("more", "1Gi", "1"), []string{"gpu-1"}},
		}},
	} {
		for _, mode := range []string{"shared", "dynamic"} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				steps := make([]step, len(tc.steps))
				for i, s := range tc.steps {
					steps[i] = step{s.claim.DeepCopy(), s.want}
				}
				run(t, sharedH100(t, mode), "node-a", steps)
			})
		}
	}
}

// TestVGPUSharesAtMostMPSClients: however small, at most 48 shares fit on
// a GPU, the clients its MPS control daemon serves (NVIDIA, "Multi-Process
// Service", Limitations): each takes one of its 48 "clients" unless it
// asks for more.
func TestVGPUSharesAtMostMPSClients(t *testing.T) {
	clients := func(c *resourceapi.ResourceClaim, n string) *resourceapi.ResourceClaim {
		c.Spec.Devices.Requests[0].Exactly.Capacity.Requests["clients"] = resource.MustParse(n)
		return c
	}
	var fill []step
	for i := range 48 {
		fill = append(fill, step{share(fmt.Sprintf("tiny-%d", i), "1Mi", "0", onGPU(0)), []string{"gpu-0"}})
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"48 best-effort shares of 1 MiB fill a GPU", append(fill,
			step{share("one-too-many", "1Mi", "0", onGPU(0)), nil},
			step{share("elsewhere", "1Mi", "0"), []string{"gpu-1"}})},
		{"a share may take several clients", []step{
			{clients(share("workers", "1Gi", "10", onGPU(0)), "40"), []string{"gpu-0"}},
			{clients(share("eight", "1Gi", "10", onGPU(0)), "8"), []string{"gpu-0"}},
			{share("ninth", "1Gi", "10", onGPU(0)), nil},
			{clients(share("too-many", "1Gi", "10"), "49"), nil},
		}},
		{"a share asking no clients takes one", []step{
			{clients(share("all-but-one", "1Gi", "10", onGPU(0)), "47"), []string{"gpu-0"}},
			{clients(share("zero", "1Gi", "10", onGPU(0)), "0"), []string{"gpu-0"}},
			{share("full", "1Gi", "10", onGPU(0)), nil},
		}},
	} {
		for _, mode := range []string{"shared", "dynamic"} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				steps := make([]step, len(tc.steps))
				for i, s := range tc.steps {
					steps[i] = step{s.claim.DeepCopy(), s.want}
				}
				run(t, sharedH100(t, mode), "node-a", steps)
			})
		}
	}
}

// TestVGPUConsumedCapacity: what the allocator records for the driver,
// with the rounding of the request policy (1Mi steps).
func TestVGPUConsumedCapacity(t *testing.T) {
	c := sharedH100(t, "shared")
	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{demoClaim(t, "vgpu/volcano-share.yaml"), "2000Mi/20"},
		{demoClaim(t, "vgpu/notebook.yaml"), "4Gi/0"},
		{share("round", "1500Ki", "5"), "2Mi/5"},
		{share("tiny", "1", "5"), "1Mi/5"},
		{share("all", "", "", onGPU(1)), "81013Mi/100"}, // the H100's usable memory less the MPS server's 66 MiB
	} {
		res, err := c.Allocate(context.Background(), "node-a", tc.claim)
		if err != nil {
			t.Fatal(err)
		}
		if got := consumed(t, res); got != tc.want {
			t.Errorf("%s: consumed %s, want %s", tc.claim.Name, got, tc.want)
		}
	}
}

// TestVGPUOnlyInSharedModes: the vgpu class matches nothing in exclusive and
// mig mode, and per-GPU modes mix on one node.
func TestVGPUOnlyInSharedModes(t *testing.T) {
	for _, mode := range []string{"exclusive", "mig"} {
		run(t, sharedH100(t, mode), "node-a", []step{{share("s", "1Gi", "10"), nil}})
	}
	c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--gpu-modes", "0-3=mig,4-5=shared,6-7=dynamic"), deviceClasses(t))
	run(t, c, "node-a", []step{
		{share("s", "60Gi", "10"), []string{"gpu-4"}},
		{share("s", "60Gi", "10"), []string{"gpu-5"}},
		{share("s", "60Gi", "10"), []string{"gpu-6"}},
		{profileClaim("m", "7g.80gb"), []string{"gpu-0-mig-7g80gb-0"}},
		{gpuClaim("w", 1), []string{"gpu-1"}},
	})
}

// TestDynamicShareBesideMIG: in dynamic mode a share does not fit beside a
// MIG instance of its GPU, and a MIG instance does not fit beside a share
// allocated in the same scheduling cycle. (A share allocated in an earlier
// cycle is another matter: TestK8s139034DoubleBooking.)
func TestDynamicShareBesideMIG(t *testing.T) {
	c := sharedH100(t, "dynamic")
	run(t, c, "node-a", []step{
		{profileClaim("mig", "1g.10gb"), []string{"gpu-0-mig-1g10gb-6"}},
		{share("s0", "1Gi", "10", onGPU(0)), nil},
		{gpuClaim("whole0", 1, onGPU(0)), nil},
		{share("s", "1Gi", "10"), []string{"gpu-1"}},
	})

	c = sharedH100(t, "dynamic")
	res, err := c.AllocateTogether(context.Background(), "node-a", share("s", "1Gi", "10", onGPU(2)), migClaim("m", onGPU(2)))
	if err != nil || res != nil {
		t.Errorf("share and MIG on gpu-2 in one cycle: %v %v, want no fit", res, err)
	}
	res, err = c.AllocateTogether(context.Background(), "node-a", share("s", "1Gi", "10", onGPU(2)), migClaim("m", onGPU(3)))
	if err != nil || res == nil {
		t.Fatalf("share on gpu-2 and MIG on gpu-3 in one cycle: %v", err)
	}
}

// TestK8s139034DoubleBooking records a Kubernetes 1.35 allocator bug
// (kubernetes#139034, fixed in 1.36.2): the counters a multi-allocatable
// device consumes are charged while the allocator runs, but a later
// scheduling cycle rebuilds the used counters from AllocatedDevices only,
// and a share is recorded under AllocatedSharedDeviceIDs. So once a share
// (or a whole GPU, which in dynamic mode is a share of everything) is
// allocated, a MIG instance of the same GPU is allocated too. The driver's
// prepare must refuse it. Dynamic mode only: no other mode has a
// multi-allocatable device that consumes counters.
//
// The test asserts the bug as v0.35.4 shows it; when the allocator is
// upgraded to a fixed one it fails, and the expectations flip to nil.
func TestK8s139034DoubleBooking(t *testing.T) {
	c := sharedH100(t, "dynamic")
	mig, mig7 := []string{"gpu-0-mig-1g10gb-6"}, []string{"gpu-1-mig-7g80gb-0"}
	if fixedIn(t, "v0.36.2") {
		// gpu-1 is taken whole; another GPU's 7g.80gb fits.
		mig, mig7 = nil, []string{"gpu-2-mig-7g80gb-0"}
	}
	run(t, c, "node-a", []step{
		{share("s", "1Gi", "10"), []string{"gpu-0"}},
		// Correct: nil. v0.35.4: allocated.
		{migClaim("mig", onGPU(0)), mig},
		{gpuClaim("whole", 1, onGPU(1)), []string{"gpu-1"}},
		// Correct: nil; but a 7g.80gb of another GPU fits. v0.35.4: gpu-1's.
		{profileClaim("mig7", "7g.80gb"), mig7},
	})
	// Shared mode has no counters, mig mode no multi-allocatable device:
	// neither can meet the bug.
}

// TestK8s140436RollbackLeak records the other 1.35 bug (kubernetes#140436,
// fixed in 1.36.3): when the allocator backtracks over a device it had
// tried, it does not give back the counters that device reserved, if the
// device is multi-allocatable (dynamic mode) or if a claim constraint
// rejected it after its counters were reserved (any device that consumes
// counters: mig mode too). A claim that fits then stays unallocated.
//
// The test asserts the bug as v0.35.4 shows it; correct results are in the
// comments.
func TestK8s140436RollbackLeak(t *testing.T) {
	// Dynamic mode: a share and a MIG instance on GPU 0. The share tries
	// gpu-0 first and reserves its counters; the MIG instance then fails,
	// the allocator moves the share to gpu-1 but keeps gpu-0's counters
	// reserved, and the MIG instance fails again.
	fixed := fixedIn(t, "v0.36.3")
	c := sharedH100(t, "dynamic")
	both := claim("both", request("share", "vgpu.facet.dev", 1), request("mig", "mig.facet.dev", 1, onGPU(0)))
	both.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}}
	var wantBoth []string // correct: [gpu-1 gpu-0-mig-1g10gb-6]
	if fixed {
		wantBoth = []string{"gpu-1", "gpu-0-mig-1g10gb-6"}
	}
	run(t, c, "node-a", []step{
		{both, wantBoth},
	})
	// Without the backtracking (the share placed by selector) it fits, on
	// a fresh node (with the fix, "both" holds these devices now).
	c = sharedH100(t, "dynamic")
	ok := claim("ok", request("share", "vgpu.facet.dev", 1, onGPU(1)), request("mig", "mig.facet.dev", 1, onGPU(0)))
	run(t, c, "node-a", []step{{ok, []string{"gpu-1", "gpu-0-mig-1g10gb-6"}}})

	// Mig mode, no shared device: two whole GPUs on one PCIe root after
	// gpu-0 is taken. gpu-1 is tried first; every GPU tried as its partner
	// fails the matchAttribute constraint after its counters were
	// reserved, and keeps them; so when gpu-2 and gpu-3 are tried as a
	// pair, their counters are gone.
	for _, mode := range []string{"exclusive", "shared", "mig", "dynamic"} {
		c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", mode), deviceClasses(t))
		want := []string{"gpu-2", "gpu-3"}
		if (mode == "mig" || mode == "dynamic") && !fixed {
			want = nil // correct: [gpu-2 gpu-3]
		}
		t.Run(mode, func(t *testing.T) {
			run(t, c, "node-a", []step{
				{demoClaim(t, "gpu/one-gpu.yaml"), []string{"gpu-0"}},
				{demoClaim(t, "examples/pair-one-pcie-root.yaml"), want},
			})
		})
	}

	// In the scheduler the slice order changes every cycle, so a retry of
	// the pending pod may find a luckier order: count how often.
	sl := nodeSlices(t, "dgx-h100", "node-a", "--mode", "mig")
	fits := 0
	const trials = 40
	for seed := int64(0); seed < trials; seed++ {
		c := NewCluster(sl, deviceClasses(t))
		run(t, c, "node-a", []step{{demoClaim(t, "gpu/one-gpu.yaml"), []string{"gpu-0"}}})
		c.Shuffle = rand.New(rand.NewSource(seed))
		res, err := c.Allocate(context.Background(), "node-a", demoClaim(t, "examples/pair-one-pcie-root.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if res != nil {
			fits++
		}
	}
	t.Logf("mig mode, gpu-0 taken: pair-one-pcie-root.yaml fits in %d of %d random slice orders (correct: all)", fits, trials)
	switch {
	case fixed && fits != trials:
		t.Errorf("pair-one-pcie-root.yaml fits in %d of %d random slice orders; with the fix it should in all", fits, trials)
	case !fixed && (fits == 0 || fits == trials):
		t.Errorf("pair-one-pcie-root.yaml fits in %d of %d random slice orders; the leak should show in some, not all", fits, trials)
	}
}

// TestK8s140433ShareChargedTwice records a Kubernetes 1.36 allocator bug
// (kubernetes#140433, fixed in 1.37.0; the 1.36 backport was declined). A
// multi-allocatable device that consumes counters is meant to pay them
// once, with its first share: a later share skips the counter check when
// the device already has capacity in use (deviceCapacityInUse). That check
// reads only AggregatedCapacity, so it misses a share saved with a shareID
// but no consumedCapacity (a device that publishes no capacity), which is
// recorded in AllocatedSharedDeviceIDs alone. From 1.36.2 the rebuilt
// counters subtract that share (the fix of kubernetes#139034), and the next
// share of the device charges them again: "Insufficient counters", and a
// pod that fits stays Pending. On 1.35, #139034 hides it: the saved share
// is not charged at all, so the next one fits.
//
// Facet's shares never take that shape: every shareable device publishes
// memory, cores and clients, memory and clients with a minimum above zero,
// so every share records a consumedCapacity that is never all zero, and its
// device stays in AggregatedCapacity while any share holds it. So the test
// shows the bug on Facet's dynamic slices with gpu-<i>'s capacity taken
// off, and that the slices as published do not meet it on any version;
// inventory.AllocatorDefects lists it with no mode.
func TestK8s140433ShareChargedTwice(t *testing.T) {
	// The bug shows from the #139034 fix (1.36.2) to its own (1.37.0).
	charged := fixedIn(t, "v0.36.2")
	fixed := fixedIn(t, "v0.37.0")
	slices := nodeSlices(t, "dgx-h100", "node-a", "--mode", "dynamic")

	t.Run("a share saved without consumedCapacity", func(t *testing.T) {
		c := NewCluster(withoutShareCapacity(slices), deviceClasses(t))
		first := share("first", "", "", onGPU(0))
		res, err := c.Allocate(context.Background(), "node-a", first)
		if err != nil || len(Devices(res)) != 1 || Devices(res)[0] != "gpu-0" {
			t.Fatalf("first share: %v %v, want gpu-0", Devices(res), err)
		}
		// The shape of the bug: a share, recorded by shareID alone.
		if r := res.Devices.Results[0]; r.ShareID == nil || len(r.ConsumedCapacity) > 0 {
			t.Fatalf("first share: shareID %v, consumedCapacity %v; want a shareID and no capacity", r.ShareID, r.ConsumedCapacity)
		}
		second := []string{"gpu-0"}
		if charged && !fixed {
			second = nil // correct: [gpu-0]; gpu-0's counters charged twice
		}
		mig := []string(nil)
		if !charged {
			mig = []string{"gpu-0-mig-1g10gb-6"} // kubernetes#139034: the saved share charged nothing
		}
		run(t, c, "node-a", []step{
			{share("second", "", "", onGPU(0)), second},
			// Charged once, not twice and not never: no MIG instance
			// beside the shares (the fix did not just skip the charge).
			{migClaim("mig", onGPU(0)), mig},
		})
	})

	t.Run("Facet's shares, as published", func(t *testing.T) {
		for _, d := range multiAllocatable(slices) {
			if len(d.ConsumesCounters) > 0 && !nonzeroCapacity(d) {
				t.Errorf("%s: a shareable device that consumes counters without a capacity whose minimum is above zero meets kubernetes#140433 before 1.37", d.Name)
			}
		}
		c := NewCluster(slices, deviceClasses(t))
		res, err := c.Allocate(context.Background(), "node-a", share("first", "1Gi", "10", onGPU(0)))
		if err != nil || res == nil {
			t.Fatalf("first share: %v %v", res, err)
		}
		if got := consumed(t, res); got != "1Gi/10" {
			t.Errorf("first share: consumed %s, want 1Gi/10", got)
		}
		run(t, c, "node-a", []step{
			{share("second", "1Gi", "10", onGPU(0)), []string{"gpu-0"}},
			{share("third", "1Gi", "10", onGPU(0)), []string{"gpu-0"}},
		})
	})
}

// withoutShareCapacity deep-copies slices and takes the capacity off every
// multi-allocatable device, so that its shares record no consumedCapacity.
func withoutShareCapacity(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		s = s.DeepCopy()
		for i := range s.Spec.Devices {
			if d := &s.Spec.Devices[i]; d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
				d.Capacity = nil
			}
		}
		out = append(out, s)
	}
	return out
}

// multiAllocatable lists the multi-allocatable devices of slices.
func multiAllocatable(slices []*resourceapi.ResourceSlice) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
				out = append(out, d)
			}
		}
	}
	return out
}

// nonzeroCapacity reports whether every share of d consumes some capacity:
// one of its capacities has a request policy whose minimum is above zero.
// Then the share's consumedCapacity is never all zero, and the allocator's
// AggregatedCapacity keeps an entry for the device while a share holds it
// (ConsumedCapacityCollection.Remove drops an entry that sums to zero).
func nonzeroCapacity(d resourceapi.Device) bool {
	for _, c := range d.Capacity {
		if p := c.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Min != nil && p.ValidRange.Min.Sign() > 0 {
			return true
		}
	}
	return false
}
