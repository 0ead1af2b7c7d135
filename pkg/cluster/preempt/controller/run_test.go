package controller

import (
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestConfig parses command lines as main does and checks what Complete
// makes of them.
func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		podNS string // POD_NAMESPACE
		want  string // the protected namespaces, comma-separated
		err   string // a part of Complete's error
	}{
		{name: "defaults: none besides kube-system, which is implied", want: ""},
		{name: "the preemptor's own namespace", podNS: "facet", want: "facet"},
		{name: "a list, trimmed, the own namespace once", args: []string{"--protected-namespaces= monitoring,facet ,"}, podNS: "facet", want: "monitoring,facet"},
		{name: "no namespace name", args: []string{"--protected-namespaces=Mon_itoring"}, err: `"Mon_itoring" is no namespace name`},
		{name: "a negative eviction cap", args: []string{"--max-evictions-per-minute=-1"}, err: "must be 0 (no cap) or more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAMESPACE", tc.podNS)
			var cfg Config
			testenv.ParseFlags(t, "facet-preemptor", cfg.AddFlags, tc.args)
			if testenv.WantError(t, cfg.Complete(), tc.err) {
				return
			}
			if got := strings.Join(cfg.ProtectedNamespaces, ","); got != tc.want {
				t.Errorf("protected namespaces %q, want %q", got, tc.want)
			}
		})
	}
}
