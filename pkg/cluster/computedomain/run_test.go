package computedomain

import (
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestConfig parses command lines as main does and checks what Complete
// makes of them.
func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		podNS string // POD_NAMESPACE
		want  string // namespace lease-namespace/lease-name resync
		err   string // a part of Complete's error
	}{
		{name: "the chart's", podNS: "facet", args: []string{"--imex-pod-template=/etc/facet/imex-pod-template.yaml"}, want: "facet facet/facet-controller 1m0s"},
		{name: "flags over the environment", podNS: "facet",
			args: []string{"--imex-pod-template=t.yaml", "--namespace=gpu", "--leader-elect-namespace=gpu", "--leader-elect-name=x", "--resync=30s"}, want: "gpu gpu/x 30s"},
		{name: "no namespace", args: []string{"--imex-pod-template=t.yaml"}, err: "--namespace: required"},
		{name: "no pod template", podNS: "facet", err: "--imex-pod-template: required"},
		{name: "a bad namespace", args: []string{"--imex-pod-template=t.yaml", "--namespace=Facet_NS"}, err: `--namespace="Facet_NS": not a namespace name`},
		{name: "a bad resync", podNS: "facet", args: []string{"--imex-pod-template=t.yaml", "--resync=0s"}, err: "--resync=0s: must be positive"},
		{name: "no lease namespace needed without leader election", args: []string{"--imex-pod-template=t.yaml", "--namespace=facet", "--leader-elect=false"}, want: "facet /facet-controller 1m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.podNS)
			var cfg Config
			testenv.ParseFlags(t, "facet-controller", cfg.AddFlags, tc.args)
			if testenv.WantError(t, cfg.Complete(), tc.err) {
				return
			}
			got := cfg.Namespace + " " + cfg.LeaseNamespace + "/" + cfg.LeaseName + " " + cfg.Resync.String()
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if cfg.CacheSyncTimeout != 2*time.Minute || cfg.MetricsAddr != ":8080" {
				t.Errorf("defaults: %s %s", cfg.CacheSyncTimeout, cfg.MetricsAddr)
			}
		})
	}
}
