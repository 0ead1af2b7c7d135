package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
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

// demoRunDir lays out a demo node's run directory as hack/sim-node.sh and
// the plugin leave it, with one 1g.10gb instance carved on GPU 2, and
// returns it and the instance's UUID. withMachine, withState: which of
// the two files it keeps.
func demoRunDir(t *testing.T, withMachine, withState bool) (string, string) {
	t.Helper()
	dir := t.TempDir()
	statePath := filepath.Join(dir, "facet-state", "simulated-nvml.json")
	if err := os.MkdirAll(filepath.Dir(statePath), 0o700); err != nil {
		t.Fatal(err)
	}
	lib, err := sim.OpenMachine(machine, sim.WithStateFile(statePath))
	if err != nil {
		t.Fatal(err)
	}
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	g := node.GPUs[2]
	if _, err := lib.EnableMIG(g.UUID); err != nil {
		t.Fatal(err)
	}
	var uuid string
	for _, p := range g.MIGProfiles {
		if p.Name == "1g.10gb" {
			in, err := lib.CreateMIG(g.UUID, p.GIProfileID, p.Placements[0].Start)
			if err != nil {
				t.Fatal(err)
			}
			uuid = in.UUID
		}
	}
	if err := lib.Close(); err != nil || uuid == "" {
		t.Fatalf("carving 1g.10gb: %v (uuid %q)", err, uuid)
	}
	if !withState {
		if err := os.Remove(statePath); err != nil {
			t.Fatal(err)
		}
	}
	if withMachine {
		data, err := os.ReadFile(machine)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "machine.yaml"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, uuid
}

// TestMIGInstancesFindsTheDemoNode: without --machine and --nvml-state,
// mig-instances reads the demo node's run directory (--run-dir, else
// $RUN_DIR, else $FACET_RUN_DIR); half a demo node, or none on a host
// without NVML, is an error that names the flags.
func TestMIGInstancesFindsTheDemoNode(t *testing.T) {
	if lib, err := nvmlgpu.OpenReal(""); err == nil {
		lib.Close()
		t.Skip("this host has NVML: without a demo node, mig-instances reads it")
	}
	full, uuid := demoRunDir(t, true, true)
	noMachine, _ := demoRunDir(t, false, true)
	noState, _ := demoRunDir(t, true, false)
	empty := t.TempDir()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    string // in the output
		wantErr []string
	}{
		{name: "--run-dir", args: []string{"--run-dir", full}, want: uuid},
		{name: "$RUN_DIR", env: map[string]string{"RUN_DIR": full, "FACET_RUN_DIR": empty}, want: uuid},
		{name: "$FACET_RUN_DIR from env.sh", env: map[string]string{"RUN_DIR": "", "FACET_RUN_DIR": full}, want: uuid},
		{name: "no demo node", args: []string{"--run-dir", empty}, wantErr: []string{"no NVML on this host", "no demo node in " + empty, "--machine FILE --nvml-state FILE"}},
		{name: "no machine file", args: []string{"--run-dir", noMachine}, wantErr: []string{"no machine.yaml", "--machine FILE --nvml-state " + noMachine}},
		{name: "no state", args: []string{"--run-dir", noState}, wantErr: []string{"no facet-state/simulated-nvml.json", "--machine " + noState}},
		{name: "--nvml-state alone", args: []string{"--run-dir", full, "--nvml-state", filepath.Join(full, "facet-state", "simulated-nvml.json")}, wantErr: []string{"--nvml-state needs --machine"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out, err := captureStdout(t, func() error { return runMIGInstances(tc.args) })
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v, want it to contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[1], uuid) || !strings.HasPrefix(lines[1], "2 ") {
				t.Errorf("want the one instance on GPU 2, %s, got:\n%s", tc.want, out)
			}
		})
	}
}

// TestNodeCheckOnTheSimulator runs `facetctl node-check` as an operator
// would on a simulated node: a driver root from sim-driver-root, with its
// stand-in libvgpu.so; every step but the CUDA probe.
func TestNodeCheckOnTheSimulator(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sim-driver-root makes device nodes (root)")
	}
	dir := t.TempDir()
	root, hamiLib, hook, scratch := filepath.Join(dir, "driver"), filepath.Join(dir, "hami", "libvgpu.so"), filepath.Join(dir, "nvidia-cdi-hook"), filepath.Join(dir, "scratch")
	if _, err := captureStdout(t, func() error {
		return runSimDriverRoot([]string{"--machine", machine, "--root", root, "--hami-library", hamiLib})
	}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	base := []string{"--machine", machine, "--driver-root", root, "--hami-library", hamiLib, "--nvidia-cdi-hook", hook, "--scratch-dir", scratch}
	// Plugin state directories whose checkpoints hold GPU 0, and every GPU.
	firstHeld, allHeld := filepath.Join(dir, "state-first"), filepath.Join(dir, "state-all")
	lib, err := sim.OpenMachine(machine)
	if err != nil {
		t.Fatal(err)
	}
	node, err := nodemodel.Discover(lib)
	lib.Close()
	if err != nil {
		t.Fatal(err)
	}
	for stateDir, gpus := range map[string]int{firstHeld: 1, allHeld: len(node.GPUs)} {
		store, err := checkpoint.Open(filepath.Join(stateDir, "claims"))
		if err != nil {
			t.Fatal(err)
		}
		for i := range gpus {
			c := &checkpoint.Claim{UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), Namespace: "team", Name: fmt.Sprintf("c%d", i), State: checkpoint.StatePrepared,
				Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: "n", Device: fmt.Sprintf("gpu-%d", i), GPUUUID: node.GPUs[i].UUID, Kind: "gpu"}}}
			if err := store.Put(c); err != nil {
				t.Fatal(err)
			}
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name       string
		args       []string
		wantErr    string
		wantOut    []string
		wantStderr []string
	}{
		{
			name: "defaults",
			wantOut: []string{
				"CLAIM ", "PUBLISHED", "PROCESS SEES", "LARGEST ALLOC", "PAST THE LIMIT", "COMPUTE",
				"whole GPU   gpu-0 ", "vGPU share  gpu-0 (share)  2000 MiB, 20 % SM    2000m, MPS 20 %",
				"vGPU slot   gpu-0-slot-0 ", "prepared, probe skipped",
				"CUDA probe skipped for every claim: simulated GPU (--machine " + machine + ")",
				"Left nothing behind",
			},
			wantStderr: []string{"node-check: GPU 0 (NVIDIA H100 80GB HBM3", "vGPU slot   unprepared"},
		},
		{
			name:    "a GPU, share and slot layout of the operator's",
			args:    []string{"--gpu", "5", "--share-memory", "3000Mi", "--share-cores", "50", "--slots", "2x10Gi/10+2"},
			wantOut: []string{"gpu-5 (share)  3000 MiB, 50 % SM", "gpu-5-slot-0   10240 MiB, 10 % SM   10240m, MPS 10 %"},
		},
		{
			name:    "per-GPU slot layout",
			args:    []string{"--gpu", "1", "--gpu-slots", "1=7"},
			wantOut: []string{"gpu-1-slot-0 ", ", 14 % SM"},
		},
		{
			name:    "the share's plugin refuses without HAMi-core",
			args:    []string{"--hami-library", filepath.Join(dir, "none.so")},
			wantErr: "does not deliver what it publishes",
			wantOut: []string{"vGPU share  gpu-0 (share)", "FAILED (prepare)", "vGPU share prepare failed: claim facet-node-check/share: vGPU shares need HAMi-core", "Left nothing behind"},
		},
		{
			name:    "a hook that is not here",
			args:    []string{"--nvidia-cdi-hook", "/nonexistent/nvidia-cdi-hook"},
			wantOut: []string{"whole GPU note: the spec's hook /nonexistent/nvidia-cdi-hook does not exist here", "prepared, probe skipped"},
		},
		{
			name:       "an idle GPU: the first one no claim of the plugin's checkpoint holds",
			args:       []string{"--gpu", "idle", "--state-dir", firstHeld},
			wantOut:    []string{"whole GPU   gpu-1 ", "vGPU slot   gpu-1-slot-0 ", "Left nothing behind"},
			wantStderr: []string{"GPU 1 is idle: MIG mode off, and no claim in " + filepath.Join(firstHeld, "claims") + " holds it"},
		},
		{name: "no idle GPU", args: []string{"--gpu", "idle", "--state-dir", allHeld}, wantErr: "no idle GPU to check: GPU 0 holds claim team/c0; GPU 1 holds claim team/c1;"},
		{name: "idle without the plugin's state", args: []string{"--gpu", "idle"}, wantErr: "--gpu idle needs --state-dir"},
		{name: "not a GPU", args: []string{"--gpu", "first"}, wantErr: `--gpu "first": want an NVML index or "idle"`},
		{name: "no such GPU", args: []string{"--gpu", "9"}, wantErr: "--gpu 9: the node has GPUs 0-7"},
		{name: "bad share", args: []string{"--share-memory", "lots"}, wantErr: "--share-memory"},
		{name: "bad slots", args: []string{"--slots", "4x"}, wantErr: "--slots"},
		{name: "stray argument", args: []string{"now"}, wantErr: `unexpected argument "now"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			err := runNodeCheck(append(append([]string(nil), base...), tc.args...), &stdout, &stderr)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("%v\n%s%s", err, stderr.String(), stdout.String())
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			for _, want := range tc.wantOut {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
			for _, want := range tc.wantStderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if left, _ := filepath.Glob(filepath.Join(scratch, "*")); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestNodeCheckMachineAlone: `facetctl node-check --machine FILE`, as a new
// user first tries it, lays out the machine's simulated driver root and a
// stand-in HAMi-core itself, prepares every claim, and leaves nothing.
func TestNodeCheckMachineAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a simulated driver root has device nodes (root)")
	}
	dir := t.TempDir()
	hook, scratch := filepath.Join(dir, "nvidia-cdi-hook"), filepath.Join(dir, "scratch")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if err := runNodeCheck([]string{"--machine", machine, "--nvidia-cdi-hook", hook, "--scratch-dir", scratch}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s%s", err, stderr.String(), stdout.String())
	}
	for _, want := range []string{"whole GPU   gpu-0 ", "vGPU share  gpu-0 (share)  2000 MiB, 20 % SM    2000m, MPS 20 %", "vGPU slot   gpu-0-slot-0 "} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stdout.String(), "FAILED") || !strings.Contains(stderr.String(), "(--machine without --driver-root)") {
		t.Errorf("want every claim prepared on a simulated root the check laid out:\n%s%s", stderr.String(), stdout.String())
	}
	if left, _ := filepath.Glob(filepath.Join(scratch, "*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestUsageNamesEveryCommand keeps usage and the commands table together:
// usage's command list (the lines indented by two spaces under
// "Commands:") names exactly the commands facetctl runs.
func TestUsageNamesEveryCommand(t *testing.T) {
	list := usage[strings.Index(usage, "Commands:"):strings.Index(usage, "Run 'facetctl")]
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z][a-z-]*)(?: |$)`).FindAllStringSubmatch(list, -1) {
		listed[m[1]] = true
	}
	for name := range commands {
		if !listed[name] {
			t.Errorf("command %q runs but usage does not describe it", name)
		}
	}
	for name := range listed {
		if commands[name] == nil {
			t.Errorf("usage describes %q, which is no command", name)
		}
	}
	if len(listed) < 10 {
		t.Fatalf("found only %d commands in usage: %v", len(listed), listed)
	}
}
