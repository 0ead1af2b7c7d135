package inventory

import (
	"fmt"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// AllocatorDefect is a known defect of the upstream DRA allocator (the
// scheduler's, k8s.io/dynamic-resource-allocation/structured) that a mode's
// ResourceSlices meet on the Kubernetes versions before FixedIn.
type AllocatorDefect struct {
	// Issue is the upstream issue, e.g. "kubernetes#139034".
	Issue string
	// FixedIn is the first release with the fix; every earlier version,
	// 1.35's patch releases included, has the defect.
	FixedIn *utilversion.Version
	// Modes are the modes whose slices meet it. None: Facet checked the
	// defect (Test) and publishes nothing that meets it, so no mode is
	// refused or warned about on any version.
	Modes []Mode
	// Effect says what a user sees.
	Effect string
	// Refuse: the mode is refused where the defect is (the scheduler would
	// over-commit a GPU); otherwise the plugin warns (a pod that fits can
	// wait, but nothing is double-booked).
	Refuse bool
	// Test is the test in test/allocator that reproduces it on the
	// allocator of each version (hack/allocator-matrix.sh).
	Test string
}

// AllocatorDefects are the defects Facet knows, each reproduced in
// test/allocator on the allocator of every minor, which checks that it is
// fixed in the version named (docs/design/resource-model.md, "Known
// allocator bugs"). #139034 and #140436 reproduce on 1.35.4, #140433 on
// 1.36.3.
//
// kubernetes#140436 is a warning, not a refusal: it never allocates a GPU
// twice, it keeps counters the allocator tried and backtracked over, so a
// pod that fits can stay Pending for a scheduling cycle or more until the
// scheduler's shuffled slice order lets it through. Refusing mig mode on 1.35
// for it would take MIG away from every 1.35 cluster for a delay; the
// operator is told instead, with the modes that avoid it.
//
// kubernetes#140433 is neither: no mode meets it. A later share of a
// multi-allocatable device that consumes counters skips the counter check
// only if the allocator's AggregatedCapacity has the device, so a share
// saved with a shareID and no consumedCapacity (a device that publishes no
// capacity) has its counters charged again by the next share, which then
// fails with "Insufficient counters". That is a warning's kind of harm (a
// pod waits, nothing is double-booked), but Facet's only such device,
// gpu-<i> in dynamic mode, publishes memory and clients with a minimum above
// zero, so every share records a consumedCapacity that never sums to zero
// and the device stays in AggregatedCapacity while a share holds it.
// Warning dynamic-mode operators on 1.36 of a Pending pod they cannot meet
// would be noise; test/allocator reproduces the bug with gpu-<i>'s capacity
// taken off and checks that the slices as published keep the capacity that
// avoids it. On 1.35 it does not show: #139034 charges a saved share
// nothing. It is fixed in 1.37.0; the backport to 1.36 was declined, so
// every 1.36 patch release has it.
var AllocatorDefects = []AllocatorDefect{
	{
		Issue: "kubernetes#139034", FixedIn: utilversion.MustParseGeneric("1.36.2"), Modes: []Mode{ModeDynamic}, Refuse: true,
		Effect: "once a vGPU share is saved in a claim the allocator stops charging its GPU's counters, so it puts a MIG instance on a GPU that shares hold: " +
			"the scheduler double-books the GPU, Facet's prepare refuses the later claim, and its pod stays in ContainerCreating",
		Test: "TestK8s139034DoubleBooking",
	},
	{
		Issue: "kubernetes#140436", FixedIn: utilversion.MustParseGeneric("1.36.3"), Modes: []Mode{ModeDynamic, ModeMIG},
		Effect: "the allocator keeps the counters of a device it backtracks over, so a pod that fits " +
			"(a multi-GPU claim with matchAttribute, a share beside MIG) can stay Pending for a scheduling cycle or more",
		Test: "TestK8s140436RollbackLeak",
	},
	{
		Issue: "kubernetes#140433", FixedIn: utilversion.MustParseGeneric("1.37.0"), Modes: nil,
		Effect: "the allocator charges a multi-allocatable device's counters again for each later share when a saved share records no consumedCapacity, " +
			"so a share that fits fails with \"Insufficient counters\" and its pod stays Pending; every Facet share records its consumed memory, cores and clients",
		Test: "TestK8s140433ShareChargedTwice",
	},
}

// defectsOf returns the defects mode meets on the cluster's version. An
// empty or unparseable version meets every defect: Facet publishes only
// what it knows the cluster enforces correctly.
func defectsOf(mode Mode, gates features.Set) []AllocatorDefect {
	v, err := utilversion.ParseGeneric(gates.ServerVersion)
	var out []AllocatorDefect
	for _, d := range AllocatorDefects {
		if !hasMode(d.Modes, mode) || (err == nil && v.AtLeast(d.FixedIn)) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// DefectsAt lists the issues of AllocatorDefects that a cluster at
// gitVersion has, whatever the modes: the plugin restarts when an upgrade
// or downgrade of its control plane changes them, so that what it refuses
// or warns about follows the version. A defect that no mode meets is left
// out: crossing its fix changes nothing the plugin publishes, so it is no
// reason to restart.
func DefectsAt(gitVersion string) []string {
	v, err := utilversion.ParseGeneric(gitVersion)
	var out []string
	for _, d := range AllocatorDefects {
		if len(d.Modes) == 0 {
			continue
		}
		if err != nil || !v.AtLeast(d.FixedIn) {
			out = append(out, d.Issue)
		}
	}
	return out
}

func hasMode(modes []Mode, m Mode) bool {
	for _, x := range modes {
		if x == m {
			return true
		}
	}
	return false
}

// defectError explains a mode refused for a defect: the defect, what it
// does, the release that fixes it, and the modes that are safe on this
// cluster (its gates on, no refusing defect).
func defectError(m Mode, d AllocatorDefect, gates features.Set) error {
	return &DefectError{Defect: d, err: fmt.Errorf("mode %s is refused on Kubernetes %s: %s (%s, fixed in Kubernetes %s; test/allocator %s). "+
		"Upgrade to %s or later, or use a mode that is safe on this cluster: %s",
		m, versionOrUnknown(gates.ServerVersion), d.Effect, d.Issue, d.FixedIn, d.Test, d.FixedIn, strings.Join(safeModes(gates), ", "))}
}

// DefectError is Build's error for a mode refused for an allocator defect
// (errors.As finds it): the plugin raises it under its own Event reason.
type DefectError struct {
	Defect AllocatorDefect
	err    error
}

func (e *DefectError) Error() string { return e.err.Error() }

// defectWarning explains a defect a mode meets but is not refused for.
func defectWarning(m Mode, d AllocatorDefect, gates features.Set) string {
	return fmt.Sprintf("mode %s on Kubernetes %s: %s (%s, fixed in Kubernetes %s). Nothing is double-booked; "+
		"exclusive, shared, static-mig and slots do not meet it", m, versionOrUnknown(gates.ServerVersion), d.Effect, d.Issue, d.FixedIn)
}

// safeModes are the modes whose gates the cluster enforces and that no
// defect refuses on its version.
func safeModes(gates features.Set) []string {
	var out []string
	for _, m := range []Mode{ModeExclusive, ModeStaticMIG, ModeSlots, ModeShared, ModeMIG, ModeDynamic} {
		if len(gates.Missing(m.Needs()...)) > 0 {
			continue
		}
		refused := false
		for _, d := range defectsOf(m, gates) {
			refused = refused || d.Refuse
		}
		if !refused {
			out = append(out, string(m))
		}
	}
	return out
}

func versionOrUnknown(v string) string {
	if v == "" {
		return "(version unknown)"
	}
	return v
}
