package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const machine = "../../demo/machines/dgx-h100.yaml"

// captureStdout runs fn with os.Stdout sent to a file and returns what it
// wrote.
func captureStdout(t *testing.T, fn func() error) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stdout")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = out
	runErr := fn()
	os.Stdout = saved
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data), runErr
}

func TestConfigurationErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		run     func([]string) error
		args    []string
		wantErr string
	}{
		{"slices without --node", runSlices, []string{"--machine", machine}, "--node is required"},
		{"slices with a bad mode", runSlices, []string{"--machine", machine, "--node", "n", "--mode", "turbo"}, `--mode: unknown mode "turbo"`},
		{"slices with bad per-GPU modes", runSlices, []string{"--machine", machine, "--node", "n", "--gpu-modes", "x=mig"}, "--gpu-modes:"},
		{"slices with a bad order", runSlices, []string{"--machine", machine, "--node", "n", "--gpu-order", "random"}, "--gpu-order:"},
		{"slices with a missing machine file", runSlices, []string{"--machine", "missing.yaml", "--node", "n"}, "read machine file"},
		{"sim-driver-root without flags", runSimDriverRoot, nil, "--machine and --root are required"},
		{"sim-driver-root without --root", runSimDriverRoot, []string{"--machine", machine}, "--machine and --root are required"},
		{"mig-instances of a machine without its state", runMIGInstances, []string{"--machine", machine}, "--machine needs --nvml-state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := captureStdout(t, func() error { return tc.run(tc.args) })
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if out != "" {
				t.Errorf("wrote to stdout on error:\n%s", out)
			}
		})
	}
}

func TestSlicesOfAMachine(t *testing.T) {
	out, err := captureStdout(t, func() error {
		return runSlices([]string{"--machine", machine, "--node", "gpu-node-1", "--gpu-modes", "0-3=mig,4-7=shared"})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: ResourceSlice", "driver: gpu.facet.dev", "nodeName: gpu-node-1", "name: gpu-0-mig-1g10gb-6", "name: gpu-7"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestSlicesExplainCounterOnly: the counter-only slice, and only it, is
// preceded by a comment that says why it has no devices; a mode without
// counters has no such comment.
func TestSlicesExplainCounterOnly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		modes    string
		comments int
	}{
		{"mig and shared", "0-3=mig,4-7=shared", 1},
		{"exclusive", "0-7=exclusive", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := captureStdout(t, func() error {
				return runSlices([]string{"--machine", machine, "--node", "n", "--gpu-modes", tc.modes})
			})
			if err != nil {
				t.Fatal(err)
			}
			docs := strings.Split(out, "---\n")
			comments := 0
			for _, doc := range docs {
				commented := strings.HasPrefix(doc, "# counter-only slice: ")
				if commented {
					comments++
				}
				if counterOnly := strings.Contains(doc, "sharedCounters:") && !strings.Contains(doc, "devices:"); counterOnly != commented {
					t.Errorf("counter-only %t, explained %t:\n%s", counterOnly, commented, doc)
				}
			}
			if comments != tc.comments {
				t.Errorf("%d explained slices, want %d", comments, tc.comments)
			}
			if tc.comments > 0 && !strings.Contains(out, "DEVICES <none>") {
				t.Error("the explanation does not name what kubectl shows")
			}
		})
	}
}

func TestMIGInstancesOfASimulatedNode(t *testing.T) {
	state := filepath.Join(t.TempDir(), "simulated-nvml.json")
	out, err := captureStdout(t, func() error {
		return runMIGInstances([]string{"--machine", machine, "--nvml-state", state})
	})
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "GPU") {
		t.Errorf("a fresh node has no instances, got:\n%s", out)
	}
}
