package allocator

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// The "iff" property: for every MIG-capable model, a set of MIG placements
// on one GPU is allocated by the upstream allocator, fed Facet's slices, if
// and only if the hardware can create those GPU instances together.
//
// "The hardware" is pkg/model/nvmlgpu's simulated NVML ((*nvmlgpu.Library)
// CanCreateTogether), which refuses what NVML refuses: overlapping memory
// slices, a profile's InstanceCount exceeded, more compute slices or engines
// than the GPU has (which makes "+me" unique). refAllows below is an
// independent reference written from NVIDIA's rules; the test also checks
// that the two agree on every set it looks at.
//
// Method, per model (one GPU, mig mode):
//
//  1. Compatible sets, exhaustively: a depth-first search over the
//     placements, in a fixed order, extends a set by each later placement
//     the hardware accepts next to it. Every compatible set is reached once
//     (hardware refusal is monotone: a superset of a refused set is refused).
//     The allocator must allocate each of them, as one claim with one
//     request per placement.
//  2. Minimal incompatible sets, exhaustively: every refused set contains
//     one, a refused set all of whose proper subsets are accepted. Each is
//     some compatible set S plus a placement d after all of S, so the search
//     finds them as it extends S. The allocator must refuse each, both as
//     one claim and as one claim per placement allocated one after another
//     (separate scheduling cycles, so the counters of allocated devices
//     come from the allocated state, the path a later pod takes).
//  3. Every set of at most 3 placements, both ways.
//  4. Random sets of 4 to 8 placements, both ways.
//  5. On the A30 (13 placements), every one of the 2^13 subsets.
//
// Each maximal compatible set (a full layout: no placement can be added) is
// also allocated one placement per scheduling cycle on a fresh cluster, so
// the cross-cycle path is checked both ways.

// placement is one MIG profile at one placement, as discovery reports it.
type placement struct {
	profile nvmlgpu.MIGProfile
	pl      nvmlgpu.Placement
}

func (p placement) String() string { return fmt.Sprintf("%s@%d", p.profile.Name, p.pl.Start) }

// refAllows is the reference rule set, from NVIDIA's MIG user guide: GPU
// instances own disjoint memory slices; at most one "+me" instance; the
// instances' compute slices add up to at most the full profile's.
func refAllows(full int, set []placement) bool {
	me, compute := 0, 0
	for i, a := range set {
		for _, b := range set[:i] {
			if a.pl.Start < b.pl.Start+b.pl.Size && b.pl.Start < a.pl.Start+a.pl.Size {
				return false
			}
		}
		if strings.Contains(a.profile.Name, "+me") {
			me++
		}
		compute += a.profile.SliceCount
	}
	return me <= 1 && compute <= full
}

// iffRig holds one model's GPU, its hardware simulation and its slices.
type iffRig struct {
	model      string
	lib        *nvmlgpu.Library
	uuid       string
	full       int
	placements []placement
	slices     []*resourceapi.ResourceSlice
	classes    []*resourceapi.DeviceClass
	cluster    *Cluster // nothing allocated; used with Try
	requests   []resourceapi.DeviceRequest
}

func newIffRig(t *testing.T, model string) *iffRig {
	t.Helper()
	m := oneGPU(model)
	lib, err := sim.OpenSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	g := node.GPUs[0]
	r := &iffRig{model: model, lib: lib, uuid: g.UUID, classes: deviceClasses(t)}
	for _, p := range g.MIGProfiles {
		r.full = max(r.full, p.SliceCount)
		for _, pl := range p.Placements {
			r.placements = append(r.placements, placement{p, pl})
		}
	}
	r.slices = machineSlices(t, m, "node-a", "--mode", "mig")
	r.reset()
	for i, p := range r.placements {
		r.requests = append(r.requests, request(fmt.Sprintf("p%d", i), "mig.facet.dev", 1,
			fmt.Sprintf(`device.attributes["%s"].profile == %q && device.attributes["%s"].placementStart == %d`, domain, p.profile.Name, domain, p.pl.Start)))
	}
	return r
}

// reset rebuilds the cluster from r.slices (after a test changed them).
func (r *iffRig) reset() { r.cluster = NewCluster(r.slices, r.classes) }

// hardware asks the simulated NVML.
func (r *iffRig) hardware(t *testing.T, set []int) bool {
	var want []nvmlgpu.MIGPlacement
	for _, i := range set {
		p := r.placements[i]
		want = append(want, nvmlgpu.MIGPlacement{GIProfileID: p.profile.GIProfileID, Start: p.pl.Start})
	}
	ok, err := r.lib.CanCreateTogether(r.uuid, want)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func (r *iffRig) reference(set []int) bool {
	var ps []placement
	for _, i := range set {
		ps = append(ps, r.placements[i])
	}
	return refAllows(r.full, ps)
}

// together: does the allocator allocate the set as one claim?
func (r *iffRig) together(t *testing.T, set []int) bool {
	var reqs []resourceapi.DeviceRequest
	for _, i := range set {
		reqs = append(reqs, *r.requests[i].DeepCopy())
	}
	res, err := r.cluster.Try(context.Background(), "node-a", claim("set", reqs...))
	if err != nil {
		t.Fatal(err)
	}
	return res != nil
}

// oneByOne: on a fresh cluster, allocate each placement as its own claim,
// in order; how many fit before the first that does not (len(set): all)?
func (r *iffRig) oneByOne(t *testing.T, set []int) int {
	c := NewCluster(r.slices, r.classes)
	for n, i := range set {
		res, err := c.Allocate(context.Background(), "node-a", claim(fmt.Sprintf("c%d", n), *r.requests[i].DeepCopy()))
		if err != nil {
			t.Fatal(err)
		}
		if res == nil {
			return n
		}
	}
	return len(set)
}

// iffResult counts what a check looked at and what disagreed.
type iffResult struct {
	compatible, maximal, minimalIncompatible, small, random, all int
	// mismatches counts disagreements; examples keeps the first 20.
	mismatches int
	examples   []string
}

// iffOptions choose the parts of the method to run.
type iffOptions struct {
	search     bool // steps 1 and 2
	sequential bool // also one placement per cycle in steps 1 and 2
	random     int  // step 4
	exhaustive bool // step 5, on GPUs with at most 14 placements
}

func (r *iffRig) mismatch(res *iffResult, format string, args ...any) {
	res.mismatches++
	if len(res.examples) < 20 {
		res.examples = append(res.examples, fmt.Sprintf(format, args...))
	}
}

func (r *iffRig) names(set []int) string {
	var s []string
	for _, i := range set {
		s = append(s, r.placements[i].String())
	}
	return "{" + strings.Join(s, " ") + "}"
}

// compare checks one set one way: the allocator (one claim) must agree
// with the hardware, and the reference with both.
func (r *iffRig) compare(t *testing.T, res *iffResult, set []int) {
	hw := r.hardware(t, set)
	if ref := r.reference(set); ref != hw {
		r.mismatch(res, "reference rules say %v, hardware %v: %s", ref, hw, r.names(set))
	}
	if got := r.together(t, set); got != hw {
		r.mismatch(res, "allocator allocates %v, hardware allows %v: %s", got, hw, r.names(set))
	}
}

// check runs the method above and returns what it saw.
func (r *iffRig) check(t *testing.T, opt iffOptions) iffResult {
	var res iffResult
	n := len(r.placements)
	var dfs func(from int, set []int)
	dfs = func(from int, set []int) {
		res.compatible++
		if len(set) > 0 {
			if !r.together(t, set) {
				r.mismatch(&res, "allocator refuses a set the hardware allows: %s", r.names(set))
			}
			if ref := r.reference(set); !ref {
				r.mismatch(&res, "reference refuses a set the hardware allows: %s", r.names(set))
			}
		}
		maximal := true
		for d := 0; d < n && maximal; d++ {
			maximal = slices.Contains(set, d) || !r.hardware(t, append(slices.Clone(set), d))
		}
		if maximal {
			res.maximal++
			if opt.sequential {
				if got := r.oneByOne(t, set); got != len(set) {
					r.mismatch(&res, "one by one, the allocator stops after %d of %s", got, r.names(set))
				}
			}
		}
		for d := from; d < n; d++ {
			next := append(slices.Clone(set), d)
			if r.hardware(t, next) {
				dfs(d+1, next)
				continue
			}
			minimal := true
			for x := range set {
				if !r.hardware(t, slices.Delete(slices.Clone(next), x, x+1)) {
					minimal = false
					break
				}
			}
			if !minimal {
				continue
			}
			res.minimalIncompatible++
			if r.reference(next) {
				r.mismatch(&res, "reference allows a set the hardware refuses: %s", r.names(next))
			}
			if r.together(t, next) {
				r.mismatch(&res, "allocator allocates, as one claim, a set the hardware refuses: %s", r.names(next))
			}
			if opt.sequential {
				if got := r.oneByOne(t, next); got != len(set) {
					r.mismatch(&res, "one by one, the allocator allocates %d of %s, want %d", got, r.names(next), len(set))
				}
			}
		}
	}
	if opt.search {
		dfs(0, nil)
	}

	for size := 1; size <= 3; size++ {
		var rec func(from int, set []int)
		rec = func(from int, set []int) {
			if len(set) == size {
				res.small++
				r.compare(t, &res, set)
				return
			}
			for d := from; d < n; d++ {
				rec(d+1, append(slices.Clone(set), d))
			}
		}
		rec(0, nil)
	}

	rnd := rand.New(rand.NewSource(int64(len(r.model))))
	for i := 0; i < opt.random; i++ {
		size := 4 + rnd.Intn(5)
		set := rnd.Perm(n)[:size]
		slices.Sort(set)
		res.random++
		r.compare(t, &res, set)
	}

	if opt.exhaustive && n <= 14 {
		for mask := 0; mask < 1<<n; mask++ {
			var set []int
			for i := 0; i < n; i++ {
				if mask&(1<<i) != 0 {
					set = append(set, i)
				}
			}
			if len(set) > resourceapi.DeviceRequestsMaxSize {
				continue
			}
			res.all++
			r.compare(t, &res, set)
		}
	}
	return res
}

// iffModels are the simulated MIG-capable models (PCIe A100s share their
// SXM twins' tables).
var iffModels = []string{"A100-SXM4-40GB", "A100-SXM4-80GB", "A30-PCIE-24GB", "H100-SXM5-80GB", "H200-141GB", "B200-180GB"}

func TestMIGIff(t *testing.T) {
	for _, model := range iffModels {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			r := newIffRig(t, model)
			opt := iffOptions{search: true, sequential: true, random: 300, exhaustive: true}
			if testing.Short() {
				opt.sequential, opt.random = false, 50
			}
			res := r.check(t, opt)
			t.Logf("%s: %d placements; %d compatible sets (incl. empty; %d maximal), %d minimal incompatible sets, %d sets of size <= 3, %d random sets of size 4-8, %d sets exhaustively",
				model, len(r.placements), res.compatible, res.maximal, res.minimalIncompatible, res.small, res.random, res.all)
			for _, m := range res.examples {
				t.Error(m)
			}
			if res.mismatches > len(res.examples) {
				t.Errorf("... %d mismatches in all", res.mismatches)
			}
		})
	}
}

// TestMIGIffCanFail: the iff check is not vacuous. Without the
// media-extensions counter, or without one memory slice's counter, the
// allocator accepts sets the hardware refuses, and the check says so.
func TestMIGIffCanFail(t *testing.T) {
	for _, tc := range []struct {
		model, counter string
		want           string
	}{
		{"H100-SXM5-80GB", "media-extensions", "1g.10gb+me@0 1g.10gb+me@1"},
		{"A30-PCIE-24GB", "media-extensions", "1g.6gb+me@0 2g.12gb+me@2"},
		{"A100-SXM4-80GB", "memory-slice-6", "1g.10gb@6 1g.10gb+me@6"},
	} {
		t.Run(tc.model+"/"+tc.counter, func(t *testing.T) {
			r := newIffRig(t, tc.model)
			r.slices = withoutCounter(r.slices, tc.counter)
			r.reset()
			res := r.check(t, iffOptions{})
			if res.mismatches == 0 {
				t.Fatalf("without %s, the iff check found nothing", tc.counter)
			}
			found := false
			for _, m := range res.examples {
				found = found || strings.Contains(m, tc.want)
			}
			if !found {
				t.Errorf("no mismatch names %s; got %q", tc.want, res.examples)
			}
			t.Logf("without %s: %d mismatches among sets of at most 3, e.g. %s", tc.counter, res.mismatches, res.examples[0])
		})
	}
}

// withoutCounter deep-copies slices and removes a counter from every
// counter set and every device.
func withoutCounter(in []*resourceapi.ResourceSlice, counter string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		s = s.DeepCopy()
		for i := range s.Spec.SharedCounters {
			delete(s.Spec.SharedCounters[i].Counters, counter)
		}
		for i := range s.Spec.Devices {
			for j := range s.Spec.Devices[i].ConsumesCounters {
				delete(s.Spec.Devices[i].ConsumesCounters[j].Counters, counter)
			}
		}
		out = append(out, s)
	}
	return out
}
