package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/inventory"
)

func TestParseFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "from-env")
	t.Setenv("POD_UID", "")
	for _, tc := range []struct {
		name    string
		args    []string
		want    func(flags) bool
		wantErr string
	}{
		{
			name: "defaults",
			want: func(f flags) bool {
				return f.NodeName == "from-env" && f.DriverRoot == "/" && f.CDIDir == "/var/run/cdi" &&
					f.StateDir == "/var/lib/facet" && f.CDIHook == "/usr/bin/nvidia-cdi-hook" &&
					f.RegistrarDir == "/var/lib/kubelet/plugins_registry" && f.PluginsDir == "/var/lib/kubelet/plugins" &&
					f.KubeAPIQPS == 1000 && f.KubeAPIBurst == 1000 && !f.DestroyUnownedMIG && f.Machine == "" &&
					f.Modes.Default == string(inventory.ModeAuto) && f.Modes.Order == string(inventory.OrderBinpack) &&
					f.PodUID == ""
			},
		},
		{
			name: "everything set",
			args: []string{
				"--node-name", "n1", "--kubeconfig", "/k", "--machine", "m.yaml", "--nvml-library", "/lib/nvml.so",
				"--driver-root", "/run/nvidia/driver", "--dev-root", "/d", "--nvidia-cdi-hook", "/h", "--cdi-dir", "/c",
				"--state-dir", "/s", "--kubelet-registrar-dir", "/r", "--kubelet-plugins-dir", "/p",
				"--kube-api-qps", "7.5", "--kube-api-burst", "9", "--hami-library", "/v.so", "--destroy-unowned-mig",
				"--mode", "exclusive", "--gpu-modes", "0-3=mig", "--gpu-order", "spread", "-v", "2",
				"--pod-uid", "5d1c",
			},
			want: func(f flags) bool {
				return f.NodeName == "n1" && f.Kubeconfig == "/k" && f.Machine == "m.yaml" && f.NVMLLibrary == "/lib/nvml.so" &&
					f.DriverRoot == "/run/nvidia/driver" && f.DevRoot == "/d" && f.CDIHook == "/h" && f.CDIDir == "/c" &&
					f.StateDir == "/s" && f.RegistrarDir == "/r" && f.PluginsDir == "/p" && f.KubeAPIQPS == 7.5 &&
					f.KubeAPIBurst == 9 && f.HAMiLibrary == "/v.so" && f.DestroyUnownedMIG && f.PodUID == "5d1c" &&
					f.Modes == inventory.ModeFlags{Default: "exclusive", PerGPU: "0-3=mig", Order: "spread", Slots: "4"}
			},
		},
		{name: "unknown flag", args: []string{"--gpus", "8"}, wantErr: "flag provided but not defined: -gpus"},
		{name: "bad number", args: []string{"--kube-api-burst", "many"}, wantErr: "invalid value"},
		{name: "bad bool", args: []string{"--destroy-unowned-mig=maybe"}, wantErr: "invalid boolean value"},
		{name: "missing value", args: []string{"--node-name"}, wantErr: "flag needs an argument"},
		{name: "help", args: []string{"-h"}, wantErr: flag.ErrHelp.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(f) {
				t.Errorf("parsed %+v", f)
			}
		})
	}
	if _, err := parseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestConfigurationErrors: run refuses a bad configuration before it
// touches the node (no state directory is created).
func TestConfigurationErrors(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no node name", nil, "--node-name (or NODE_NAME) is required"},
		{"bad mode", []string{"--node-name", "n", "--mode", "turbo"}, `--mode: unknown mode "turbo"`},
		{"bad per-GPU mode", []string{"--node-name", "n", "--gpu-modes", "0-3"}, "--gpu-modes:"},
		{"bad per-GPU mode name", []string{"--node-name", "n", "--gpu-modes", "0=mg"}, `unknown mode "mg"`},
		{"bad order", []string{"--node-name", "n", "--gpu-order", "random"}, `--gpu-order: unknown order "random"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			f, err := parseFlags(append(tc.args, "--state-dir", state))
			if err != nil {
				t.Fatal(err)
			}
			err = run(context.Background(), f)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run: %v, want %q", err, tc.wantErr)
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state directory created before the configuration was checked: %v", err)
			}
		})
	}
}

// TestUnreadableMachine: a --machine that cannot be simulated fails the
// start with the reason (no simulator in this build, or a bad file).
func TestUnreadableMachine(t *testing.T) {
	dir := t.TempDir()
	f, err := parseFlags([]string{"--node-name", "n", "--state-dir", filepath.Join(dir, "state"), "--machine", filepath.Join(dir, "missing.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), f)
	if err == nil || (!strings.Contains(err.Error(), "-tags facetsim") && !strings.Contains(err.Error(), "read machine file")) {
		t.Fatalf("run: %v", err)
	}
}

// TestStockConfigurationErrors: the flags of the stock-1.35 work fail the
// plugin at start with the flag and the entry named, before any GPU or
// API server is touched.
func TestStockConfigurationErrors(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--feature-gates", "DRAPartitionable=true"}, `--feature-gates: unknown gate "DRAPartitionable"`},
		{[]string{"--feature-gates", "DRAConsumableCapacity=maybe"}, "--feature-gates"},
		{[]string{"--mig-layouts", "0:all-1g.10gb"}, `--mig-layouts: "0:all-1g.10gb": want INDEX[-INDEX]=LAYOUT`},
		{[]string{"--gpu-slots", "0=4x20Gi"}, "--gpu-slots"},
		{[]string{"--slots", "0"}, "--slots"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--node-name", "n", "--state-dir", filepath.Join(t.TempDir(), "state")}, tc.args...)
			f, err := parseFlags(args)
			if err != nil {
				t.Fatal(err)
			}
			err = run(context.Background(), f)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestNoFailpointInShippedBuild: the default build ignores
// $FACET_FAILPOINT (L5). Under -tags facet_failpoints it arms.
func TestNoFailpointInShippedBuild(t *testing.T) {
	t.Setenv("FACET_FAILPOINT", "after-mig-create")
	armed := failpoint(context.Background()) != nil
	if armed != failpointsCompiled {
		t.Fatalf("failpoint armed=%v in a build with failpoints compiled=%v", armed, failpointsCompiled)
	}
}
