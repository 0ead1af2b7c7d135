package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/cluster/webhook"
	"github.com/facet-gpu/facet/pkg/daemon"
)

// TestRunRefusesBadPodMutatorSettings: a bad setting of either mutator
// stops the webhook at start, naming the flag or file, before it serves
// anything or asks the API.
func TestRunRefusesBadPodMutatorSettings(t *testing.T) {
	dir := t.TempDir()
	badMap := filepath.Join(dir, "map.yaml")
	if err := os.WriteFile(badMap, []byte("devices:\n- {resource: gpu, deviceClassName: gpu.facet.dev}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                      string
		mutatePods, mutateClaims  bool
		kubeconfig, mapFile, mode string
		kueue                     string
		want                      string
	}{
		{"unknown kueue mode", true, false, "", "", "auto", "yes", `--kueue: unknown Kueue mode "yes" (known: auto, on, off)`},
		{"unknown kueue mode, claims only", false, true, "", "", "auto", "yes", `--kueue: unknown Kueue mode "yes" (known: auto, on, off)`},
		{"unknown mode", true, false, "", "", "sometimes", "off", `--mutate-extended-resources: unknown mode "sometimes" (known: auto, always, never)`},
		{"missing table", true, true, "", filepath.Join(dir, "absent.yaml"), "auto", "off", "extended resource map: open"},
		{"bad table", true, false, "", badMap, "auto", "off", `devices[0]: "gpu" is not an extended resource name`},
		{"no API", true, false, filepath.Join(dir, "absent.kubeconfig"), "", "auto", "off", "--mutate-pods, --mutate-claims: API client: --kubeconfig "},
		{"no API, claims only", false, true, filepath.Join(dir, "absent.kubeconfig"), "", "auto", "off", "--mutate-pods, --mutate-claims: API client: --kubeconfig "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, webhook.ServerOptions{}, flags{
				mutatePods: tc.mutatePods, mutateClaims: tc.mutateClaims, preferMIG: true,
				kube: daemon.Kube{Kubeconfig: tc.kubeconfig}, mapFile: tc.mapFile, mode: tc.mode, kueue: tc.kueue, recheck: time.Minute,
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
