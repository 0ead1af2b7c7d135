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

// TestRunRefusesBadPodMutatorSettings: a bad setting stops the webhook at
// start, naming the flag or file, before it serves anything.
func TestRunRefusesBadPodMutatorSettings(t *testing.T) {
	dir := t.TempDir()
	badMap := filepath.Join(dir, "map.yaml")
	if err := os.WriteFile(badMap, []byte("devices:\n- {resource: gpu, deviceClassName: gpu.facet.dev}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                      string
		kubeconfig, mapFile, mode string
		kueue                     string
		want                      string
	}{
		{"unknown kueue mode", "", "", "auto", "yes", `--kueue: unknown Kueue mode "yes" (known: auto, on, off)`},
		{"unknown mode", "", "", "sometimes", "off", `--mutate-extended-resources: unknown mode "sometimes" (known: auto, always, never)`},
		{"missing table", "", filepath.Join(dir, "absent.yaml"), "auto", "off", "extended resource map: open"},
		{"bad table", "", badMap, "auto", "off", `devices[0]: "gpu" is not an extended resource name`},
		{"no API", filepath.Join(dir, "absent.kubeconfig"), "", "auto", "off", "--mutate-pods: API client: --kubeconfig "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, webhook.ServerOptions{}, true, true, daemon.Kube{Kubeconfig: tc.kubeconfig}, tc.mapFile, tc.mode, tc.kueue, time.Minute)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
