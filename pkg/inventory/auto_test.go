package inventory

import (
	"flag"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/features"
	"github.com/facet-gpu/facet/pkg/nvml"
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
	migGPU := nvml.GPU{MIGCapable: true, MIGProfiles: []nvml.MIGProfile{{}}}
	newest := "v" + countersScaleFrom.String() + ".2"
	for _, tc := range []struct {
		name         string
		gpu          nvml.GPU
		gates        features.Set
		hasInstances bool
		// clause is the part of the help text that covers the case.
		clause string
	}{
		{"MIG instances", migGPU, withGates(false, "v1.35.4"), true, "on GPUs with MIG instances"},
		{"MIG-capable, gate on, new enough", migGPU, withGates(true, newest), false, "on other MIG-capable GPUs where the cluster enforces " + string(features.PartitionableDevices) + " and runs Kubernetes " + countersScaleFrom.String() + " or later"},
		{"MIG-capable, gate on, too old", migGPU, withGates(true, "v1.36.3"), false, "everywhere else"},
		{"MIG-capable, gate off", migGPU, withGates(false, newest), false, "everywhere else"},
		{"no MIG", nvml.GPU{}, withGates(true, newest), false, "everywhere else"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, _, _ := resolveAuto(tc.gpu, tc.gates, tc.hasInstances)
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
