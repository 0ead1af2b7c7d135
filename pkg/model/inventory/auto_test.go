package inventory

import (
	"flag"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestAutoPolicyMatchesResolveAuto: the help text of --mode (the plugin's
// and facetctl's) says what resolveAuto does. Each case is one of its
// branches; the sentence of AutoPolicy that names the case's conditions
// must name the mode resolveAuto picks.
func TestAutoPolicyMatchesResolveAuto(t *testing.T) {
	withGates := func(on bool, version string) features.Set {
		s := features.Stock("test")
		s.Enabled[features.PartitionableDevices] = on
		s.ServerVersion = version
		return s
	}
	migGPU := nvmlgpu.GPU{MIGCapable: true, MIGProfiles: []nvmlgpu.MIGProfile{{}}}
	// An A100 whose MIG mode is off and one where it is on (and stays so),
	// and a vGPU guest with MIG mode off and on.
	fixedOff, fixedOn, guest := migGPU, migGPU, migGPU
	fixedOff.MIGModeFixed, fixedOn.MIGModeFixed, guest.MIGModeFixed = "before Hopper", "before Hopper", "vGPU guest"
	fixedOn.MIGEnabled, guest.VGPUGuest = true, true
	guestOn := guest
	guestOn.MIGEnabled = true
	newest := "v" + countersScaleFrom.String() + ".2"
	const fixedOnClause = "on other GPUs before Hopper with MIG mode on"
	for _, tc := range []struct {
		name         string
		gpu          nvmlgpu.GPU
		gates        features.Set
		hasInstances bool
		// clause is the part of the help text that covers the case.
		clause string
	}{
		{"MIG instances", migGPU, withGates(false, "v1.35.4"), true, "on GPUs with MIG instances"},
		{"MIG-capable, gate on, new enough", migGPU, withGates(true, newest), false, "on other MIG-capable GPUs where the cluster enforces " + string(features.PartitionableDevices) + " and runs Kubernetes " + countersScaleFrom.String() + " or later"},
		{"MIG-capable, gate on, too old", migGPU, withGates(true, "v1.36.3"), false, "everywhere else"},
		{"MIG-capable, gate off", migGPU, withGates(false, newest), false, "everywhere else"},
		{"no MIG", nvmlgpu.GPU{}, withGates(true, newest), false, "everywhere else"},
		{"MIG mode off, not Facet's to change", fixedOff, withGates(true, newest), false, "everywhere else"},
		{"MIG mode on, not Facet's to change, new enough", fixedOn, withGates(true, newest), false, "on other MIG-capable GPUs where the cluster enforces " + string(features.PartitionableDevices) + " and runs Kubernetes " + countersScaleFrom.String() + " or later (before Hopper only with MIG mode on"},
		{"MIG mode on, not Facet's to change, too old", fixedOn, withGates(true, "v1.36.3"), false, fixedOnClause},
		{"MIG mode on, not Facet's to change, gate off", fixedOn, withGates(false, newest), false, fixedOnClause},
		{"MIG mode on, not Facet's to change, MIG instances", fixedOn, withGates(false, newest), true, "on GPUs with MIG instances"},
		{"vGPU guest", guest, withGates(true, newest), false, "everywhere else"},
		{"vGPU guest, MIG mode on", guestOn, withGates(true, newest), false, "everywhere else"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// As Build: resolveAuto, then what a GPU whose MIG mode
			// stays as it is serves.
			mode, _, _ := resolveAuto(tc.gpu, tc.gates, tc.hasInstances)
			mode, _ = fixedMIGMode(tc.gpu, ModeAuto, mode, tc.gates)
			if want := string(mode) + " " + tc.clause; !strings.Contains(AutoPolicy(), want) {
				t.Errorf("resolveAuto gives %s; the help text %q does not say %q", mode, AutoPolicy(), want)
			}
		})
	}
	var f ModeFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f.Register(fs)
	if usage := fs.Lookup("mode").Usage; !strings.Contains(usage, AutoPolicy()) {
		t.Errorf("--mode's help %q lacks the auto policy", usage)
	}
}
