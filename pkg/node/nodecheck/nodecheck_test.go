package nodecheck

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
)

const machine = "../../../demo/machines/dgx-h100.yaml"

// testContext sends the plugin code's log to the test's.
func testContext(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	return ctx
}

// shared is the simulated node's driver root, stand-in libvgpu.so and
// nvidia-cdi-hook, laid out once for the package's tests (they only read
// them).
var shared struct {
	once                sync.Once
	err                 error
	dir                 string
	root, hamiLib, hook string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// simNode is a simulated DGX H100 with its driver root, a stand-in
// libvgpu.so and nvidia-cdi-hook: Options for checking GPU gpu, with a
// scratch parent of the test's own.
func simNode(t *testing.T, gpu int) Options {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the simulated driver root needs mknod (root)")
	}
	lib, err := sim.OpenMachine(machine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "facet-nodecheck-test-"); shared.err != nil {
			return
		}
		shared.root = filepath.Join(shared.dir, "driver")
		shared.hamiLib = filepath.Join(shared.dir, "hami", "libvgpu.so")
		shared.hook = filepath.Join(shared.dir, "nvidia-cdi-hook")
		var minors []int
		for _, g := range node.GPUs {
			minors = append(minors, g.Minor)
		}
		shared.err = errors.Join(sim.LayoutDriverRoot(shared.root, node.DriverVersion, minors),
			sim.WriteSimulatedHAMiCore(shared.hamiLib),
			os.WriteFile(shared.hook, []byte("#!/bin/sh\n"), 0o755))
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	scratch := t.TempDir()
	return Options{Library: lib, GPU: gpu, ShareMemoryBytes: 2000 * probe.MiB, ShareCores: 20,
		DriverRoot: shared.root, NvidiaCDIHook: shared.hook, HAMiLibrary: shared.hamiLib, ScratchParent: scratch}
}

// published is the memory gpu-<i> publishes in exclusive mode, in MiB,
// read from the ResourceSlices as the scheduler sees them.
func published(t *testing.T, lib *nvmlgpu.Library, gpu int) uint64 {
	t.Helper()
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeExclusive})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resourceslices.Objects(resourceslices.Resources(inv, "n"), "n") {
		for _, d := range s.Spec.Devices {
			if d.Name == inventory.WholeGPUName(gpu) {
				q := d.Capacity["memory"].Value
				return uint64(q.Value()) / probe.MiB
			}
		}
	}
	t.Fatalf("gpu-%d not published", gpu)
	return 0
}

// assertEmpty fails unless the scratch directory holds no CDI spec, no
// checkpoint record and no HAMi-core region. scratch is the directory
// Run made (found under parent when Run did not return).
func assertEmpty(t *testing.T, parent string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(parent, "facet-node-check-*"))
	if len(dirs) != 1 {
		t.Fatalf("scratch directories under %s: %v, want one", parent, dirs)
	}
	scratch := dirs[0]
	specs, _ := os.ReadDir(filepath.Join(scratch, "cdi"))
	regions, _ := os.ReadDir(filepath.Join(scratch, "state", "vgpu", "claims"))
	store, err := checkpoint.Open(filepath.Join(scratch, "state", "claims"))
	if err != nil {
		t.Fatal(err)
	}
	claims, corrupt, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if len(specs) != 0 || len(regions) != 0 || len(claims) != 0 || len(corrupt) != 0 {
		t.Errorf("left behind: %d CDI specs, %d HAMi-core regions, %d checkpoint records (%d corrupt)", len(specs), len(regions), len(claims), len(corrupt))
	}
}

// TestSimulatedNode runs the whole check on the simulator: every step
// but the CUDA probe.
func TestSimulatedNode(t *testing.T) {
	o := simNode(t, 3)
	o.SkipProbe = "simulated GPU"
	o.KeepScratch = true
	o.Slots = inventory.SlotLayout{{Count: 2, Memory: resource.MustParse("10Gi"), Cores: 10}, {Count: 2}}
	var log bytes.Buffer
	o.Log = &log
	rep, err := Run(testContext(t), o)
	if err != nil {
		t.Fatal(err)
	}
	whole := published(t, o.Library, 3)
	for i, want := range []struct {
		claim, device, limitMem, limitSM string
		mib                              uint64
		cores                            int64
	}{
		{ClaimWhole, "gpu-3", "", "", whole, 100},
		{ClaimShare, "gpu-3 (share)", "2000m", "20", 2000, 20},
		// The smallest slot of 2x10Gi/10+2 equal parts.
		{ClaimSlot, "gpu-3-slot-0", "10240m", "10", 10240, 10},
	} {
		row := rep.Rows[i]
		if row.Claim != want.claim || row.Device != want.device || row.PublishedMiB != want.mib || row.Cores != want.cores ||
			row.LimitMemory != want.limitMem || row.LimitSM != want.limitSM {
			t.Errorf("row %d: %s %s %d MiB %d %% limit %q/%q; want %+v", i, row.Claim, row.Device, row.PublishedMiB, row.Cores, row.LimitMemory, row.LimitSM, want)
		}
		if row.PrepareErr != nil || row.UnprepareErr != nil || len(row.Missing) > 0 || row.Skipped != "simulated GPU" || row.Probe != nil {
			t.Errorf("row %d: %+v", i, row)
		}
		if len(row.CDIDevices) != 1 || !strings.HasPrefix(row.CDIDevices[0], "gpu.facet.dev/claim=") {
			t.Errorf("row %d: CDI devices %v", i, row.CDIDevices)
		}
	}
	if rep.Failed() || len(rep.Leftovers) > 0 {
		t.Errorf("failed: %v, leftovers %v", rep.Failed(), rep.Leftovers)
	}
	assertEmpty(t, o.ScratchParent)
	for _, want := range []string{"vGPU share  probe environment: ", "CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "LD_PRELOAD=" + o.HAMiLibrary, "CUDA_VISIBLE_DEVICES=" + strconv.Itoa(rep.GPU.Index), "CUDA_DEVICE_ORDER=PCI_BUS_ID", "vGPU slot   unprepared"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CUDA probe skipped for every claim: simulated GPU", "prepared, probe skipped", "Left nothing behind"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

func TestScratchRemoved(t *testing.T) {
	o := simNode(t, 0)
	o.SkipProbe = "simulated GPU"
	rep, err := Run(testContext(t), o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rep.Scratch); !os.IsNotExist(err) {
		t.Errorf("scratch directory %s: %v, want removed", rep.Scratch, err)
	}
}

// fakeProber answers each claim with a canned result, records what it
// was given, and can fail or panic.
type fakeProber struct {
	mu      sync.Mutex
	results map[string]*probe.Result
	errs    map[string]error
	panicOn string
	// cancel, when set, is called at the first probe (an operator's
	// Ctrl-C), which then returns the context's error.
	cancel context.CancelFunc
	envs   map[string][]string
	libs   map[string]string
	binds  map[string][]probe.Bind
}

func (f *fakeProber) Probe(ctx context.Context, env []string, libCUDA string, p probe.Params) (*probe.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	claim := ""
	limit := "CUDA_DEVICE_MEMORY_LIMIT_0="
	for _, kv := range env {
		if strings.HasPrefix(kv, limit) {
			claim = kv
		}
	}
	// Which claim: by the limit in the environment (none: whole GPU).
	kind := ClaimWhole
	switch claim {
	case limit + "2000m":
		kind = ClaimShare
	case "":
	default:
		kind = ClaimSlot
	}
	if f.envs == nil {
		f.envs, f.libs = map[string][]string{}, map[string]string{}
	}
	f.envs[kind], f.libs[kind] = env, libCUDA
	if f.binds == nil {
		f.binds = map[string][]probe.Bind{}
	}
	f.binds[kind] = p.Binds
	if f.cancel != nil {
		f.cancel()
		return nil, ctx.Err()
	}
	if kind == f.panicOn {
		panic("probe crashed")
	}
	if err := f.errs[kind]; err != nil {
		return nil, err
	}
	res := *f.results[kind]
	res.PastLimit.RequestMiB = p.PublishedMiB + 1
	return &res, nil
}

func result(total, largest uint64, past string, tflops float64) *probe.Result {
	return &probe.Result{Devices: 1, TotalMiB: total, FreeMiB: largest + 8, LargestAllocMiB: largest,
		PastLimit: probe.PastLimit{Error: past}, Compute: &probe.Compute{TFLOPS: tflops}}
}

// sms sets the multiprocessors a probe saw.
func sms(r *probe.Result, n int) *probe.Result {
	r.Multiprocessors = n
	return r
}

func TestProbedClaims(t *testing.T) {
	oom := "CUDA_ERROR_OUT_OF_MEMORY"
	for _, tc := range []struct {
		name string
		// whole is the whole GPU's result, with total and largest relative
		// to what it publishes.
		wholeShort    uint64
		share, slot   *probe.Result
		wantResults   []string
		wantProblems  []string
		wantNotes     []string
		wantFailed    bool
		wantShareFrac float64
		// mps: the share and the slot are MPS clients (Options.MPS), of
		// the check's own daemon on the simulated driver root.
		mps bool
	}{
		{
			name:  "delivers what it publishes",
			share: result(2000, 1472, oom, 10.5), slot: result(20269, 19739, oom, 12.4),
			wantResults:   []string{"ok", "ok", "ok"},
			wantNotes:     []string{"vGPU share note: a workload can allocate at most 1472 MiB of the 2000 MiB (74 %): HAMi-core charges"},
			wantShareFrac: 0.21,
		},
		{
			name:       "reserved memory published",
			wholeShort: 480,
			share:      result(2000, 1472, oom, 10), slot: result(20269, 19739, oom, 12.5),
			wantResults:  []string{"PROBLEM", "ok", "ok"},
			wantProblems: []string{"whole GPU PROBLEM: the process sees", "480 MiB less than the"},
			wantFailed:   true, wantShareFrac: 0.2,
		},
		{
			name:  "limit not enforced",
			share: result(2000, 1472, "", 10), slot: result(81000, 80000, oom, 12.5),
			wantResults: []string{"ok", "PROBLEM", "PROBLEM"},
			wantProblems: []string{"vGPU share PROBLEM: an allocation of 2001 MiB, past the 2000 MiB published, succeeded",
				"vGPU slot PROBLEM: the process sees 81000 MiB in all, more than the 20269 MiB published",
				"vGPU slot PROBLEM: one allocation of 80000 MiB succeeded"},
			wantFailed: true, wantShareFrac: 0.2,
		},
		{
			name: "MPS applied: the clients see their percentage of the SMs",
			mps:  true, share: sms(result(2000, 1872, oom, 10.5), 26), slot: sms(result(20253, 20125, oom, 12.4), 32),
			wantResults: []string{"ok", "ok", "ok"},
			wantNotes:   []string{"vGPU share note: as an MPS client at 20 % it sees 26 of the GPU's 132 SMs", "vGPU slot note: as an MPS client at 25 % it sees 32 of the GPU's 132 SMs"},
			wantFailed:  false, wantShareFrac: 0.21,
		},
		{
			name: "MPS lost: a client sees every SM",
			mps:  true, share: sms(result(2000, 1872, oom, 10.5), 132), slot: sms(result(20253, 20125, oom, 12.4), 32),
			wantResults:  []string{"ok", "PROBLEM", "ok"},
			wantProblems: []string{"vGPU share PROBLEM: as an MPS client at 20 % it sees 132 of the GPU's 132 SMs, want about 26: it runs without MPS"},
			wantFailed:   true, wantShareFrac: 0.21,
		},
		{
			name:  "SM share not held",
			share: result(2000, 1472, oom, 50), slot: result(20269, 19739, oom, 12.5),
			wantResults:  []string{"ok", "PROBLEM", "ok"},
			wantProblems: []string{"vGPU share PROBLEM: its kernel ran at 100 % of the whole GPU's throughput, above its 20 %"},
			wantFailed:   true, wantShareFrac: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := simNode(t, 1)
			// Four slots that fill the GPU; under MPS the server's 66 MiB
			// is kept out first, as the plugin publishes.
			slot := "20269Mi"
			if tc.mps {
				slot = "20253Mi"
			}
			o.Slots = inventory.SlotLayout{{Count: 4, Memory: resource.MustParse(slot), Cores: 25}}
			pub := published(t, o.Library, 1)
			f := &fakeProber{results: map[string]*probe.Result{
				ClaimWhole: result(pub-tc.wholeShort, pub-tc.wholeShort-500, oom, 50),
				ClaimShare: tc.share, ClaimSlot: tc.slot,
			}}
			o.Prober = f
			o.MPS = tc.mps
			f.results[ClaimWhole] = sms(f.results[ClaimWhole], 132)
			rep, err := Run(testContext(t), o)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, row := range rep.Rows {
				got = append(got, row.result())
			}
			if strings.Join(got, ",") != strings.Join(tc.wantResults, ",") {
				t.Errorf("results %v, want %v", got, tc.wantResults)
			}
			if rep.Failed() != tc.wantFailed {
				t.Errorf("Failed() = %v, want %v", rep.Failed(), tc.wantFailed)
			}
			if d := rep.Rows[1].Share - tc.wantShareFrac; d > 0.01 || d < -0.01 {
				t.Errorf("share's throughput %.3f of the whole GPU's, want %.2f", rep.Rows[1].Share, tc.wantShareFrac)
			}
			var table bytes.Buffer
			if err := rep.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			for _, want := range append(append([]string{"Left nothing behind"}, tc.wantProblems...), tc.wantNotes...) {
				if !strings.Contains(table.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, table.String())
				}
			}
			if len(tc.wantProblems) == 0 && strings.Contains(table.String(), "PROBLEM") {
				t.Errorf("table has a problem:\n%s", table.String())
			}
			// What the share's probe process got: its container's view.
			env := strings.Join(f.envs[ClaimShare], "\n")
			for _, want := range []string{
				"CUDA_DEVICE_MEMORY_LIMIT_0=2000m",
				"LD_PRELOAD=" + o.HAMiLibrary,
				"CUDA_REDIRECT=" + o.HAMiLibrary,
				// GPU 1 by its NVML index, which HAMi-core's atoi reads.
				"CUDA_VISIBLE_DEVICES=1",
				"CUDA_DEVICE_ORDER=PCI_BUS_ID",
				"CUDA_DEVICE_MEMORY_SHARED_CACHE=" + filepath.Join(rep.Scratch, "state", "vgpu", "claims"),
				// The mounted libraries' links, as a container's
				// library path has them; not the driver root's
				// directory, which holds the host's libc.
				"LD_LIBRARY_PATH=" + filepath.Join(os.TempDir(), "facet-node-check-libs-"),
			} {
				if !strings.Contains(env, want) {
					t.Errorf("share's probe environment lacks %q:\n%s", want, env)
				}
			}
			// Under MPS the SM limit is MPS's percentage, HAMi-core's 0.
			wantSM := []string{"CUDA_DEVICE_SM_LIMIT_0=20"}
			if tc.mps {
				wantSM = []string{"CUDA_DEVICE_SM_LIMIT_0=0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(rep.Scratch, "mps", rep.GPU.UUID, "pipe")}
			}
			if tc.mps {
				want := []probe.Bind{{Host: filepath.Join(rep.Scratch, "mps", rep.GPU.UUID, "shm"), Container: "/dev/shm"}}
				if !reflect.DeepEqual(f.binds[ClaimShare], want) {
					t.Errorf("share's probe binds %v, want %v: an MPS client shares /dev/shm with its server", f.binds[ClaimShare], want)
				}
			} else if len(f.binds[ClaimShare]) != 0 {
				t.Errorf("time-sliced share's probe binds %v, want none", f.binds[ClaimShare])
			}
			for _, want := range wantSM {
				if !strings.Contains(env, want) {
					t.Errorf("share's probe environment lacks %q:\n%s", want, env)
				}
			}
			if strings.Contains(env, "LD_LIBRARY_PATH="+filepath.Dir(f.libs[ClaimShare])) {
				t.Errorf("the probe's library path starts with the driver root's library directory:\n%s", env)
			}
			if strings.Contains(strings.Join(f.envs[ClaimWhole], "\n"), "LD_PRELOAD") {
				t.Errorf("the whole GPU's probe preloads HAMi-core: %v", f.envs[ClaimWhole])
			}
			if !strings.HasPrefix(f.libs[ClaimWhole], o.DriverRoot+"/") || !strings.Contains(f.libs[ClaimWhole], "libcuda.so") {
				t.Errorf("libcuda %q, want the driver root's", f.libs[ClaimWhole])
			}
		})
	}
}

// TestFailureMidwayUnprepares: whatever fails, every prepared claim is
// unprepared and nothing is left behind.
func TestFailureMidwayUnprepares(t *testing.T) {
	for _, tc := range []struct {
		name        string
		setup       func(o *Options, f *fakeProber, cancel context.CancelFunc)
		wantPanic   bool
		wantResults []string
	}{
		{"probe fails", func(o *Options, f *fakeProber, _ context.CancelFunc) {
			f.errs = map[string]error{ClaimShare: errors.New("cuInit: CUDA_ERROR_NO_DEVICE (100)")}
		}, false, []string{"ok", "FAILED (probe)", "ok"}},
		{"probe panics", func(o *Options, f *fakeProber, _ context.CancelFunc) { f.panicOn = ClaimShare }, true, nil},
		{"interrupted", func(o *Options, f *fakeProber, cancel context.CancelFunc) { f.cancel = cancel },
			false, []string{"FAILED (probe)", "FAILED (prepare)", "FAILED (prepare)"}},
		{"no HAMi-core", func(o *Options, f *fakeProber, _ context.CancelFunc) { o.HAMiLibrary += ".missing" },
			false, []string{"ok", "FAILED (prepare)", "FAILED (prepare)"}},
		{"panic after prepare", func(o *Options, f *fakeProber, _ context.CancelFunc) {
			o.prepared = func(claim string) {
				if claim == ClaimSlot {
					panic("crash after prepare")
				}
			}
		}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := simNode(t, 2)
			o.KeepScratch = true
			pub := published(t, o.Library, 2)
			f := &fakeProber{results: map[string]*probe.Result{ClaimWhole: result(pub, pub-500, "CUDA_ERROR_OUT_OF_MEMORY", 50),
				ClaimShare: result(2000, 1472, "CUDA_ERROR_OUT_OF_MEMORY", 10), ClaimSlot: result(pub/4, pub/4-500, "CUDA_ERROR_OUT_OF_MEMORY", 12)}}
			o.Prober = f
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			tc.setup(&o, f, cancel)
			var rep *Report
			panicked := func() (p any) {
				defer func() { p = recover() }()
				var err error
				rep, err = Run(ctx, o)
				if err != nil {
					t.Fatal(err)
				}
				return nil
			}()
			if (panicked != nil) != tc.wantPanic {
				t.Fatalf("panic: %v, want one: %v", panicked, tc.wantPanic)
			}
			assertEmpty(t, o.ScratchParent)
			if rep == nil {
				return
			}
			var got []string
			for _, row := range rep.Rows {
				got = append(got, row.result())
				if row.UnprepareErr != nil {
					t.Errorf("%s: unprepare: %v", row.Claim, row.UnprepareErr)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantResults, ",") {
				t.Errorf("results %v, want %v", got, tc.wantResults)
			}
			if !rep.Failed() || len(rep.Leftovers) > 0 {
				t.Errorf("failed %v (want true), leftovers %v", rep.Failed(), rep.Leftovers)
			}
		})
	}
}

func TestRunRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(o *Options)
		wantErr string
	}{
		{"no such GPU", func(o *Options) { o.GPU = 8 }, "--gpu 8: the node has GPUs 0-7"},
		{"share not in MiB", func(o *Options) { o.ShareMemoryBytes = 1000 }, "whole number of MiB"},
		{"share cores", func(o *Options) { o.ShareCores = 101 }, "want 0-100"},
		{"no prober", func(o *Options) { o.SkipProbe = "" }, "no prober"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := simNode(t, 0)
			o.SkipProbe = "simulated"
			tc.change(&o)
			_, err := Run(testContext(t), o)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if dirs, _ := filepath.Glob(filepath.Join(o.ScratchParent, "*")); len(dirs) != 0 {
				t.Errorf("left %v", dirs)
			}
		})
	}
}
