package nodeplugin

import (
	"strings"
	"testing"
)

// TestComputeDomainsFlag: --compute-domains takes auto (the default, also
// when unset) or off, and the plugin refuses anything else before it
// touches the node.
func TestComputeDomainsFlag(t *testing.T) {
	for _, tc := range []struct {
		value, wantErr string
	}{
		{value: ""},
		{value: ComputeDomainsAuto},
		{value: ComputeDomainsOff},
		{value: "on", wantErr: `unknown --compute-domains value "on" (known: auto, off)`},
	} {
		p := &process{f: Config{NodeName: "node-a", StateDir: t.TempDir(), ComputeDomains: tc.value}}
		err := p.configure()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("--compute-domains=%q: %v, want %q", tc.value, err, tc.wantErr)
		}
	}
}

// TestProcRoot: the driver's proc files are the node's /proc, or a
// simulated node's driver root's proc/, where the plugin sees that root.
func TestProcRoot(t *testing.T) {
	for _, tc := range []struct {
		f    Config
		want string
	}{
		{Config{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver-root"}, "/proc"},
		{Config{Machine: "m.yaml", DriverRoot: "/var/run/facet/driver-root", ContainerDriverRoot: "/driver-root"}, "/driver-root/proc"},
		{Config{Machine: "m.yaml", DriverRoot: "/var/run/facet/driver-root"}, "/var/run/facet/driver-root/proc"},
	} {
		if got := tc.f.procRoot(); got != tc.want {
			t.Errorf("%+v: proc root %s, want %s", tc.f, got, tc.want)
		}
	}
}
