package nodecleanup

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/nodeplugin"
)

// node is a host root laid out as a node after `helm uninstall`, with the
// chart's default paths: every file Facet writes there, and some that
// are others'.
type node struct {
	root string
	// others are files that are not Facet's, in directories Facet shares.
	others []string
}

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
)

func newNode(t *testing.T) *node {
	t.Helper()
	// Short: a unix socket's path has at most 107 bytes.
	root, err := os.MkdirTemp("", "nc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n := &node{root: root}
	d := ChartDefaults
	for _, f := range []string{
		d.StateDir + "/claims/journal.wal",
		d.StateDir + "/vgpu/claims/uid-1/region",
		d.StateDir + "/vgpu/ld.so.preload",
		d.StateDir + "/vgpu/vgpulock/lock",
		d.StateDir + "/plugin.lock",
		d.StateDir + "/gpu-faults.json",
		d.StateDir + "/.health-123",
		d.StateDir + "/simulated-nvml.json",
		d.StateDir + "/mig-layouts.json.tmp42",
		d.CDIDir + "/" + claimcdi.SpecName("uid-1") + ".json",
		d.CDIDir + "/" + claimcdi.TempPrefix + "x.json.1.tmp",
		d.KubeletDir + "/plugins/gpu.facet.dev/dra-uid.sock",
		d.KubeletDir + "/plugins_registry/gpu.facet.dev-uid-reg.sock",
		d.KubeletDir + "/plugins_registry/gpu.facet.dev-reg.sock",
		d.MPSDir + "/" + gpuA + "/pipe/control",
		d.MPSDir + "/" + gpuA + "/log/control.log",
		d.MPSDir + "/" + gpuA + "/shm/x",
		d.MPSDir + "/facet-mps.sock",
		d.MPSDir + "/facet-mps.lock",
		d.CDIHookDir + "/nvidia-cdi-hook",
		d.CDIHookDir + "/.nvidia-cdi-hook.tmp.7",
		d.HAMiCoreDir + "/libvgpu.so",
	} {
		n.write(t, f, "x")
	}
	for _, f := range []string{
		d.CDIDir + "/nvidia.com-gpu.yaml",
		d.KubeletDir + "/plugins_registry/other.example.com-reg.sock",
		d.KubeletDir + "/plugins/other.example.com/dra.sock",
	} {
		n.write(t, f, "x")
		n.others = append(n.others, f)
	}
	return n
}

func (n *node) path(p string) string { return filepath.Join(n.root, p) }

func (n *node) write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(n.path(p)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.path(p), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// facetLeft lists what of Facet's is still on the node: every path under
// its own directories, its specs and sockets in the shared ones.
func (n *node) facetLeft(t *testing.T) []string {
	t.Helper()
	var left []string
	err := filepath.Walk(n.root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, n.root)
		name := filepath.Base(p)
		if strings.Contains(rel, "facet") && !slices.Contains(n.others, rel) && !strings.Contains(name, "example.com") &&
			rel != "/var/lib/kubelet" && rel != "/var/lib/kubelet/plugins" && rel != "/var/lib/kubelet/plugins_registry" {
			left = append(left, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return left
}

func (n *node) options() Options {
	return Options{Paths: ChartDefaults, HostRoot: n.root}
}

// putClaim records a prepared claim in the node's checkpoint, as the
// plugin left it.
func (n *node) putClaim(t *testing.T) {
	t.Helper()
	s, err := checkpoint.Open(n.path(ChartDefaults.StateDir + "/claims"))
	if err != nil {
		t.Fatal(err)
	}
	c := &checkpoint.Claim{UID: "3d0f6a5e-0000-0000-0000-000000000001", Namespace: "team-a", Name: "notebook-gpu", State: checkpoint.StatePrepared,
		Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: "node-1", Device: "gpu-0", GPUUUID: gpuA, Kind: "gpu"}}}
	if err := s.Put(c); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

const layoutRecord = `{"` + gpuA + `": {"layout": "all-balanced", "instances": [
  {"giProfileID": 9, "start": 0, "giID": 1, "ciID": 0},
  {"giProfileID": 0, "start": 6, "giID": 13, "ciID": 0}]}}`

// fakeMIG is the node's NVML for MIGDestroy: its instances, and the ones
// destroyed.
type fakeMIG struct {
	instances []nvmlgpu.MIGInstance
	destroyed []string
	opened    bool
}

func (f *fakeMIG) ListMIG() ([]nvmlgpu.MIGInstance, error) { return f.instances, nil }

func (f *fakeMIG) DestroyMIG(gpu string, gi, ci int) error {
	f.destroyed = append(f.destroyed, fmt.Sprintf("%s GI %d CI %d", gpu, gi, ci))
	return nil
}

func TestRun(t *testing.T) {
	inst := func(gpu string, giProfile, start, gi int) nvmlgpu.MIGInstance {
		return nvmlgpu.MIGInstance{ParentUUID: gpu, GIProfileID: giProfile, Placement: nvmlgpu.Placement{Start: start}, GIID: gi}
	}
	for _, tc := range []struct {
		name string
		// setup changes the node; it may return a cleanup.
		setup func(t *testing.T, n *node, o *Options) func()
		// wantErr: the refusal, nothing removed; nil: everything of
		// Facet's removed.
		wantErr  error
		wantText []string
		// wantKept: paths Run leaves, listed in Result.Kept.
		wantKept []string
		// mig is the node's NVML; wantDestroyed what must be destroyed.
		mig           *fakeMIG
		wantDestroyed []string
	}{
		{name: "after uninstall"},
		{name: "claims prepared", setup: func(t *testing.T, n *node, _ *Options) func() { n.putClaim(t); return nil },
			wantErr: ErrClaimsPrepared, wantText: []string{"team-a/notebook-gpu", "gpu-0 of " + gpuA, "--force"}},
		{name: "claims prepared, forced", setup: func(t *testing.T, n *node, o *Options) func() { n.putClaim(t); o.Force = true; return nil }},
		{name: "plugin running", setup: func(t *testing.T, n *node, _ *Options) func() {
			s, err := checkpoint.Open(n.path(ChartDefaults.StateDir + "/claims"))
			if err != nil {
				t.Fatal(err)
			}
			return func() { s.Close() }
		}, wantErr: ErrInUse, wantText: []string{"checkpoint", "helm uninstall"}},
		{name: "socket answers", setup: func(t *testing.T, n *node, _ *Options) func() {
			sock := n.path(ChartDefaults.KubeletDir + "/plugins/gpu.facet.dev/dra-uid.sock")
			os.Remove(sock)
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			return func() { l.Close() }
		}, wantErr: ErrInUse, wantText: []string{"dra-uid.sock answers"}},
		{name: "facet-mps running", setup: func(t *testing.T, n *node, _ *Options) func() {
			f, err := os.Open(n.path(ChartDefaults.MPSDir + "/facet-mps.lock"))
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			return func() { f.Close() }
		}, wantErr: ErrInUse, wantText: []string{"facet-mps holds"}},
		{name: "MIG layout undecided", setup: func(t *testing.T, n *node, _ *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/mig-layouts.json", layoutRecord)
			return nil
		}, wantErr: ErrMIGUndecided, wantText: []string{gpuA + ": GI 1 CI 0 of layout all-balanced", "GI 13", "--mig-instances=destroy"}},
		{name: "MIG layout kept", setup: func(t *testing.T, n *node, o *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/mig-layouts.json", layoutRecord)
			o.MIG = MIGKeep
			return nil
		}, mig: &fakeMIG{}},
		{name: "MIG layout destroyed: only what is recorded and still there", setup: func(t *testing.T, n *node, o *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/mig-layouts.json", layoutRecord)
			o.MIG = MIGDestroy
			return nil
		}, mig: &fakeMIG{instances: []nvmlgpu.MIGInstance{
			inst(gpuA, 9, 0, 1),  // Facet's
			inst(gpuA, 0, 4, 5),  // not recorded: an admin's
			inst(gpuB, 0, 6, 13), // the recorded IDs, on another GPU
			inst(gpuA, 0, 6, 14), // the recorded placement, another GI: made again by someone else
		}}, wantDestroyed: []string{gpuA + " GI 1 CI 0"}},
		{name: "MIG record corrupt, destroy refused", setup: func(t *testing.T, n *node, o *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/mig-layouts.json", "{")
			o.MIG = MIGDestroy
			return nil
		}, wantErr: ErrMIGUndecided, wantText: []string{"corrupt", "--mig-instances=keep"}, mig: &fakeMIG{}},
		{name: "MIG record corrupt, kept", setup: func(t *testing.T, n *node, o *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/mig-layouts.json", "{")
			o.MIG = MIGKeep
			return nil
		}, mig: &fakeMIG{}},
		{name: "a file that is not Facet's in its state directory", setup: func(t *testing.T, n *node, _ *Options) func() {
			n.write(t, ChartDefaults.StateDir+"/notes.txt", "mine")
			n.others = append(n.others, ChartDefaults.StateDir+"/notes.txt", ChartDefaults.StateDir)
			return nil
		}, wantKept: []string{ChartDefaults.StateDir + ": kept, it holds notes.txt"}},
		{name: "HAMi-core not installed by the chart", setup: func(t *testing.T, n *node, o *Options) func() {
			o.HAMiCoreDir = ""
			n.others = append(n.others, ChartDefaults.HAMiCoreDir, ChartDefaults.HAMiCoreDir+"/libvgpu.so")
			return nil
		}},
		{name: "a tmpfs still mounted", setup: func(t *testing.T, n *node, _ *Options) func() {
			if os.Geteuid() != 0 {
				t.Skip("mounting a tmpfs needs root")
			}
			shm := n.path(ChartDefaults.MPSDir + "/" + gpuA + "/shm")
			if err := unix.Mount("tmpfs", shm, "tmpfs", 0, "size=1m"); err != nil {
				t.Skipf("mount tmpfs: %v", err)
			}
			return func() { _ = unix.Unmount(shm, unix.MNT_DETACH) }
		}, wantErr: ErrMounted, wantText: []string{gpuA + "/shm", "umount"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			o := n.options()
			if tc.mig != nil {
				o.OpenMIG = func() (MIG, func(), error) { tc.mig.opened = true; return tc.mig, func() {}, nil }
			}
			if tc.setup != nil {
				if done := tc.setup(t, n, &o); done != nil {
					defer done()
				}
			}
			before := n.facetLeft(t)
			res, err := Run(o)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				for _, w := range tc.wantText {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				if after := n.facetLeft(t); !slices.Equal(before, after) {
					t.Errorf("refused, but removed %v", diff(before, after))
				}
				for _, o := range n.others {
					if _, err := os.Stat(n.path(o)); err != nil {
						t.Errorf("%s is not Facet's, and is gone: %v", o, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if left := n.facetLeft(t); len(left) > 0 {
				t.Errorf("Facet files left: %v", left)
			}
			for _, o := range n.others {
				if _, err := os.Stat(n.path(o)); err != nil {
					t.Errorf("%s is not Facet's, and is gone: %v", o, err)
				}
			}
			if len(res.Kept) != len(tc.wantKept) {
				t.Errorf("kept %q, want %q", res.Kept, tc.wantKept)
			}
			for i, w := range tc.wantKept {
				if i < len(res.Kept) && !strings.HasPrefix(res.Kept[i], n.path(w)) {
					t.Errorf("kept %q, want %q", res.Kept[i], w)
				}
			}
			if tc.mig != nil {
				if !slices.Equal(tc.mig.destroyed, tc.wantDestroyed) {
					t.Errorf("destroyed %v, want %v", tc.mig.destroyed, tc.wantDestroyed)
				}
				if tc.mig.opened != (o.MIG == MIGDestroy) {
					t.Errorf("NVML opened: %v, with --mig-instances=%s", tc.mig.opened, o.MIG)
				}
			}
		})
	}
}

func diff(before, after []string) []string {
	var gone []string
	for _, b := range before {
		if !slices.Contains(after, b) {
			gone = append(gone, b)
		}
	}
	return gone
}

// TestStateEntries: the state directory's names that packages export are
// among those Run removes. (The chart's live test TestLiveChartUninstall
// finds any other the plugin writes.)
func TestStateEntries(t *testing.T) {
	for _, name := range []string{nodeplugin.NodeLockFile, sim.FaultFileName} {
		if !matchAny(stateEntries, name) {
			t.Errorf("%s is written in the state directory, and not removed", name)
		}
	}
}
