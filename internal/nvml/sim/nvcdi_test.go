package sim

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

// The simulated nodes' driver version.
const simDriverVersion = "580.159.04"

// testNode is a simulated node (a machine file opened with OpenMachine) with
// a simulated driver root laid out for its GPUs.
type testNode struct {
	lib  *nvmlgpu.Library
	root string
}

// gpu returns the go-nvml mock device behind GPU i, for tests that break it.
func (n *testNode) gpu(i int) *server.Device {
	return serverOf(n.lib).Devices[i].(*server.Device)
}

// openTestMachine writes a machine file of gpus GPUs of model and opens it
// with OpenMachine. The GPUs' bus IDs are 0000:80:00.0 and up, where a
// test host has no device whose /dev/dri nodes nvcdi would add.
func openTestMachine(t *testing.T, model string, gpus int, opts ...Option) *nvmlgpu.Library {
	t.Helper()
	return openTestMachineMIG(t, model, gpus, false, opts...)
}

// openTestMachineMIG is openTestMachine with every GPU's MIG mode on at boot
// when migEnabled, as an admin leaves an A100 whose MIG mode Facet must
// not change (it applies only after a GPU reset).
func openTestMachineMIG(t *testing.T, model string, gpus int, migEnabled bool, opts ...Option) *nvmlgpu.Library {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "name: test-%s\ndriverVersion: %q\ncudaDriverVersion: \"13.0\"\ngpus:\n", strings.ToLower(model), simDriverVersion)
	for i := 0; i < gpus; i++ {
		fmt.Fprintf(&b, "- model: %s\n  pciBusID: \"0000:%02x:00.0\"\n", model, 0x80+i)
		if migEnabled {
			b.WriteString("  migEnabled: true\n")
		}
	}
	path := filepath.Join(t.TempDir(), "machine.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := openMachineFile(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	return lib
}

// openMachineFile is OpenMachine for tests that reach into the mock server
// behind the library (serverOf).
func openMachineFile(path string, opts ...Option) (*nvmlgpu.Library, error) {
	m, err := LoadMachine(path)
	if err != nil {
		return nil, err
	}
	lib, srv, err := openSimulated(m, opts...)
	if err != nil {
		return nil, err
	}
	servers.Store(lib, srv)
	return lib, nil
}

// servers maps the libraries openMachineFile opened to their mock servers.
var servers sync.Map

// serverOf returns the go-nvml mock server behind a library that
// openMachineFile opened.
func serverOf(lib *nvmlgpu.Library) *server.Server {
	srv, ok := servers.Load(lib)
	if !ok {
		panic("serverOf: library not opened by openMachineFile")
	}
	return srv.(*server.Server)
}

// The simulated nodes of the tests: eight GPUs, like go-nvml's dgxh100 and
// dgxa100 mocks.
func dgxH100(t *testing.T) *nvmlgpu.Library { return openTestMachine(t, "H100-SXM5-80GB", 8) }
func dgxA100(t *testing.T) *nvmlgpu.Library { return openTestMachine(t, "A100-SXM4-40GB", 8) }

// dgxA100MIG is dgxA100 with MIG mode on: Facet carves there but never
// changes an A100's MIG mode.
func dgxA100MIG(t *testing.T) *nvmlgpu.Library {
	return openTestMachineMIG(t, "A100-SXM4-40GB", 8, true)
}

// newTestNode gives lib a simulated driver root: shared when not empty (a
// root laid out by newSharedRoot for the same GPU minors, which the test
// must not modify), otherwise a fresh one. It skips the test where mknod is
// not permitted.
func newTestNode(t *testing.T, lib *nvmlgpu.Library, shared string) *testNode {
	t.Helper()
	n := &testNode{lib: lib, root: shared}
	if shared != "" {
		return n
	}
	n.root = t.TempDir()
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	var minors []int
	for _, g := range node.GPUs {
		minors = append(minors, g.Minor)
	}
	layoutOrSkip(t, n.root, node.DriverVersion, minors)
	return n
}

// newSharedRoot lays out one driver root for eight GPUs (minors 0-7), to
// share between the cases of a test that leave it alone: a root has over a
// thousand device nodes, slow to create and delete.
func newSharedRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	layoutOrSkip(t, root, simDriverVersion, []int{0, 1, 2, 3, 4, 5, 6, 7})
	return root
}

func layoutOrSkip(t *testing.T, root, version string, minors []int) {
	t.Helper()
	if err := LayoutDriverRoot(root, version, minors); err != nil {
		if errors.Is(err, os.ErrPermission) {
			t.Skipf("creating device nodes is not permitted here (run as root with CAP_MKNOD): %v", err)
		}
		t.Fatal(err)
	}
}

func newEditor(t *testing.T, n *testNode, opts nvmlgpu.DriverEditorOptions) *nvmlgpu.DriverEditor {
	t.Helper()
	if opts.DriverRoot == "/" {
		opts.DriverRoot = n.root + "/"
	} else {
		opts.DriverRoot = n.root
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = filepath.Join(n.root, "proc")
	}
	e, err := n.lib.DriverEditor(opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// deviceNodePaths returns the container paths of the edits' device nodes.
func deviceNodePaths(e *cdispec.ContainerEdits) []string {
	var paths []string
	for _, n := range e.DeviceNodes {
		paths = append(paths, n.Path)
	}
	return paths
}

func TestDriverEditorCommonEdits(t *testing.T) {
	shared := newSharedRoot(t)
	for _, tc := range []struct {
		name      string
		lib       func(*testing.T) *nvmlgpu.Library
		opts      nvmlgpu.DriverEditorOptions
		breakRoot func(root string) error
		golden    string
		wantHooks []string
		wantErr   string
	}{
		{
			name:      "dgxh100",
			lib:       dgxH100,
			golden:    "common-edits-" + simDriverVersion,
			wantHooks: []string{"create-symlinks", "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"},
		},
		{
			name:      "dgxa100",
			lib:       dgxA100,
			golden:    "common-edits-" + simDriverVersion,
			wantHooks: []string{"create-symlinks", "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"},
		},
		{
			name:      "custom hook path, ldcache hook only",
			lib:       dgxH100,
			opts:      nvmlgpu.DriverEditorOptions{NvidiaCDIHookPath: "/opt/facet/bin/nvidia-cdi-hook", DisabledHooks: []string{"create-symlinks", "enable-cuda-compat", "disable-device-node-modification"}},
			wantHooks: []string{"update-ldcache"},
		},
		{
			name: "all hooks disabled",
			lib:  dgxH100,
			opts: nvmlgpu.DriverEditorOptions{DisabledHooks: []string{"all"}},
		},
		{
			name:      "root with a trailing slash",
			lib:       dgxH100,
			opts:      nvmlgpu.DriverEditorOptions{DriverRoot: "/"}, // replaced by root + "/"
			golden:    "common-edits-" + simDriverVersion,
			wantHooks: []string{"create-symlinks", "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"},
		},
		{
			name:      "no nvidiactl",
			lib:       dgxH100,
			breakRoot: func(root string) error { return os.Remove(filepath.Join(root, "dev", "nvidiactl")) },
			wantErr:   "no /dev/nvidiactl",
		},
		{
			name:      "no driver libraries",
			lib:       dgxH100,
			breakRoot: func(root string) error { return os.RemoveAll(filepath.Join(root, "usr", "lib")) },
			wantErr:   "driver root",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := shared
			if tc.breakRoot != nil {
				root = ""
			}
			n := newTestNode(t, tc.lib(t), root)
			if tc.breakRoot != nil {
				if err := tc.breakRoot(n.root); err != nil {
					t.Fatal(err)
				}
			}
			e := newEditor(t, n, tc.opts)
			edits, err := e.CommonEdits()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), n.root) {
					t.Fatalf("error %v, want one containing %q and the root %s", err, tc.wantErr, n.root)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ce := edits
			for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
				found := false
				for _, d := range ce.DeviceNodes {
					if d.Path == want {
						found = true
						if d.HostPath != filepath.Join(n.root, want) || d.Major != simDeviceMajor || d.Minor != simDeviceMinor {
							t.Errorf("%s: host path %s, %d:%d", want, d.HostPath, d.Major, d.Minor)
						}
					}
				}
				if !found {
					t.Errorf("no device node %s in %v", want, deviceNodePaths(ce))
				}
			}
			libcuda := filepath.Join("/", SimulatedLibraryDir(), "libcuda.so."+simDriverVersion)
			found := false
			for _, m := range ce.Mounts {
				if m.ContainerPath == libcuda && m.HostPath == filepath.Join(n.root, libcuda) {
					found = true
				}
			}
			if !found {
				t.Errorf("no mount of %s", libcuda)
			}
			wantHook := tc.opts.NvidiaCDIHookPath
			if wantHook == "" {
				wantHook = nvmlgpu.DefaultNvidiaCDIHookPath
			}
			var hooks []string
			for _, h := range ce.Hooks {
				if h.Path != wantHook || len(h.Args) < 2 || h.Args[0] != "nvidia-cdi-hook" {
					t.Errorf("hook %s %v, want %s", h.Path, h.Args, wantHook)
					continue
				}
				hooks = append(hooks, h.Args[1])
			}
			if fmt.Sprint(hooks) != fmt.Sprint(tc.wantHooks) {
				t.Errorf("hooks %v, want %v", hooks, tc.wantHooks)
			}
			if tc.golden != "" {
				checkGolden(t, tc.golden, ce, n.root)
			}
		})
	}
}

func TestDriverEditorGPUEdits(t *testing.T) {
	shared := newSharedRoot(t)
	for _, tc := range []struct {
		name      string
		lib       func(*testing.T) *nvmlgpu.Library
		gpu       int
		uuid      func(n *testNode) string
		breakNode func(n *testNode)
		freshRoot bool // breakNode changes the root
		want      []string
		wantErr   []string
	}{
		{name: "dgxh100 GPU 3", lib: dgxH100, gpu: 3, want: []string{"/dev/nvidia3"}},
		{name: "dgxh100 GPU 0", lib: dgxH100, gpu: 0, want: []string{"/dev/nvidia0"}},
		{name: "dgxa100 GPU 7", lib: dgxA100, gpu: 7, want: []string{"/dev/nvidia7"}},
		{
			name: "minor differs from index",
			lib:  dgxH100,
			gpu:  2,
			breakNode: func(n *testNode) {
				// Swap the minors of GPUs 2 and 5: the node follows the minor.
				n.gpu(2).Minor, n.gpu(5).Minor = 5, 2
			},
			want: []string{"/dev/nvidia5"},
		},
		{
			name:    "unknown UUID",
			lib:     dgxH100,
			uuid:    func(*testNode) string { return "GPU-00000000-1111-2222-3333-444444444444" },
			wantErr: []string{"GPU-00000000-1111-2222-3333-444444444444", "driver root"},
		},
		{
			name:    "index instead of UUID",
			lib:     dgxH100,
			uuid:    func(*testNode) string { return "3" },
			wantErr: []string{`"3"`, "not a GPU UUID"},
		},
		{
			name:      "device node missing",
			lib:       dgxH100,
			gpu:       4,
			freshRoot: true,
			breakNode: func(n *testNode) {
				if err := os.Remove(filepath.Join(n.root, "dev", "nvidia4")); err != nil {
					panic(err)
				}
			},
			wantErr: []string{"no /dev/nvidiaN node"},
		},
		{
			name: "NVML function missing in the simulation",
			lib:  dgxH100,
			gpu:  1,
			breakNode: func(n *testNode) {
				n.gpu(1).GetMinorNumberFunc = nil
			},
			wantErr: []string{"nvcdi panicked", "GetMinorNumber"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := shared
			if tc.freshRoot {
				root = ""
			}
			n := newTestNode(t, tc.lib(t), root)
			if tc.breakNode != nil {
				tc.breakNode(n)
			}
			id := n.gpu(tc.gpu).UUID
			if tc.uuid != nil {
				id = tc.uuid(n)
			}
			e := newEditor(t, n, nvmlgpu.DriverEditorOptions{})
			edits, err := e.GPUEdits(id)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want %q", tc.wantErr)
				}
				for _, s := range append(tc.wantErr, id) {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ce := edits
			if got := deviceNodePaths(ce); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("device nodes %v, want exactly %v", got, tc.want)
			}
			d := ce.DeviceNodes[0]
			if d.HostPath != filepath.Join(n.root, tc.want[0]) || d.Major != simDeviceMajor || d.Minor != simDeviceMinor || d.Permissions != "rwm" {
				t.Errorf("device node %+v", *d)
			}
			if len(ce.Mounts) != 0 || len(ce.Hooks) != 0 || len(ce.Env) != 0 {
				t.Errorf("unexpected edits beyond the device node: %+v", *ce)
			}
			if err := (&cdiapi.ContainerEdits{ContainerEdits: edits}).Validate(); err != nil {
				t.Errorf("edits do not validate: %v", err)
			}
		})
	}
}

// TestDriverEditorMIGEdits runs in the host's mount namespace: MIG edits
// read the driver's proc files under the simulated root (ProcRoot), and
// need no bind of them over /proc/driver.
func TestDriverEditorMIGEdits(t *testing.T) {
	// Expected nvidia-caps minors, from the driver's numbering in
	// /proc/driver/nvidia-caps/mig-minors ("config 1", "monitor 2",
	// "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4", ..., 9 minors per GPU
	// instance, 135 per GPU, "gpu31/gi14/ci7/access 4322").
	for _, tc := range []struct {
		name   string
		lib    func(*testing.T) *nvmlgpu.Library
		gpu    int
		others []nvmlgpu.MIGPlacement // created first
		create nvmlgpu.MIGPlacement
		wantGI int
		want   []string
	}{
		{
			name: "dgxh100 GPU 3 7g", lib: dgxH100, gpu: 3,
			create: nvmlgpu.MIGPlacement{GIProfileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, Start: 0}, wantGI: 0,
			want: []string{"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap408", "/dev/nvidia-caps/nvidia-cap409"},
		},
		{
			name: "dgxh100 GPU 3 3g at 4 next to 1g", lib: dgxH100, gpu: 3,
			others: []nvmlgpu.MIGPlacement{{GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, Start: 0}},
			create: nvmlgpu.MIGPlacement{GIProfileID: nvml.GPU_INSTANCE_PROFILE_3_SLICE, Start: 4}, wantGI: 2,
			want: []string{"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap426", "/dev/nvidia-caps/nvidia-cap427"},
		},
		{
			name: "dgxa100 GPU 0 1g at 0", lib: dgxA100MIG, gpu: 0,
			create: nvmlgpu.MIGPlacement{GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, Start: 0}, wantGI: 7,
			want: []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"},
		},
		{
			name: "dgxa100 GPU 7 2g at 2 next to 3g", lib: dgxA100MIG, gpu: 7,
			others: []nvmlgpu.MIGPlacement{{GIProfileID: nvml.GPU_INSTANCE_PROFILE_3_SLICE, Start: 4}},
			create: nvmlgpu.MIGPlacement{GIProfileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE, Start: 2}, wantGI: 4,
			want: []string{"/dev/nvidia7", "/dev/nvidia-caps/nvidia-cap984", "/dev/nvidia-caps/nvidia-cap985"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, tc.lib(t), "")
			parent := n.gpu(tc.gpu).UUID
			if _, err := n.lib.EnableMIG(parent); err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.others {
				if _, err := n.lib.CreateMIG(parent, o.GIProfileID, o.Start); err != nil {
					t.Fatal(err)
				}
			}
			inst, err := n.lib.CreateMIG(parent, tc.create.GIProfileID, tc.create.Start)
			if err != nil {
				t.Fatal(err)
			}
			gi, ci := inst.GIID, inst.CIID
			if gi != tc.wantGI || ci != 0 {
				t.Fatalf("created GI %d CI %d, want GI %d CI 0", gi, ci, tc.wantGI)
			}
			e := newEditor(t, n, nvmlgpu.DriverEditorOptions{})
			edits, err := e.MIGEdits(parent, gi, ci)
			if err != nil {
				t.Fatal(err)
			}
			ce := edits
			if got := deviceNodePaths(ce); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("device nodes %v, want %v", got, tc.want)
			}
			// The parent's node is the host's; the two capability nodes
			// have no host node (the layout makes none for instances) and
			// carry the driver's numbers for the runtime to create.
			if d := ce.DeviceNodes[0]; d.HostPath != filepath.Join(n.root, d.Path) || d.Major != simDeviceMajor || d.Minor != simDeviceMinor {
				t.Errorf("parent device node %+v", *d)
			}
			for _, d := range ce.DeviceNodes[1:] {
				if _, err := os.Lstat(filepath.Join(n.root, d.Path)); !os.IsNotExist(err) {
					t.Errorf("%s exists under the simulated dev root (%v): a host has no node for a fresh instance", d.Path, err)
				}
				minor := strings.TrimPrefix(d.Path, "/dev/nvidia-caps/nvidia-cap")
				if d.HostPath != "" || d.Type != "c" || d.Major != simCapsMajor || fmt.Sprint(d.Minor) != minor || d.FileMode == nil || *d.FileMode != 0o444 {
					t.Errorf("capability device node %+v, want c %d:%s mode 0444 and no host path", *d, simCapsMajor, minor)
				}
			}
			if len(ce.Mounts) != 0 || len(ce.Env) != 0 {
				t.Errorf("unexpected edits beyond device nodes: %+v", *ce)
			}
			if err := (&cdiapi.ContainerEdits{ContainerEdits: edits}).Validate(); err != nil {
				t.Errorf("edits do not validate: %v", err)
			}

			// A GI/CI that does not exist.
			if _, err := e.MIGEdits(parent, gi, ci+1); err == nil || !strings.Contains(err.Error(), parent) || !strings.Contains(err.Error(), "no such MIG device") {
				t.Errorf("missing CI: error %v", err)
			}
			// The driver shows no capability for the GI: its access file
			// is gone. The error names the file.
			access := filepath.Join(n.root, "proc", "driver", "nvidia", "capabilities", fmt.Sprintf("gpu%d", tc.gpu), "mig", fmt.Sprintf("gi%d", gi), "access")
			saved, err := os.ReadFile(access)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(access); err != nil {
				t.Fatal(err)
			}
			if _, err := e.MIGEdits(parent, gi, ci); err == nil || !strings.Contains(err.Error(), access) || !strings.Contains(err.Error(), parent) {
				t.Errorf("missing access file: error %v, want one naming %s and the GPU", err, access)
			}
			if err := os.WriteFile(access, saved, 0o444); err != nil {
				t.Fatal(err)
			}
			// Destroyed, the MIG device is gone for nvcdi too.
			if err := n.lib.DestroyMIG(parent, gi, ci); err != nil {
				t.Fatal(err)
			}
			if _, err := e.MIGEdits(parent, gi, ci); err == nil || !strings.Contains(err.Error(), "no such MIG device") {
				t.Errorf("destroyed: error %v", err)
			}
		})
	}
}

func TestDriverEditorMIGEditsWithoutMIGMinors(t *testing.T) {
	n := newTestNode(t, dgxH100(t), newSharedRoot(t))
	parent := n.gpu(3).UUID
	if _, err := n.lib.EnableMIG(parent); err != nil {
		t.Fatal(err)
	}
	inst, err := n.lib.CreateMIG(parent, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A proc root without the driver's MIG files: no MIG-capable driver.
	procRoot := t.TempDir()
	_, err = newEditor(t, n, nvmlgpu.DriverEditorOptions{ProcRoot: procRoot}).MIGEdits(parent, inst.GIID, inst.CIID)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(procRoot, "devices")) || !strings.Contains(err.Error(), parent) {
		t.Fatalf("error %v, want one naming %s/devices and the GPU", err, procRoot)
	}
}

func TestBindSimulatedProcDriverRefusesHostNamespace(t *testing.T) {
	self, _ := os.Readlink("/proc/self/ns/mnt")
	pid1, err := os.Readlink("/proc/1/ns/mnt")
	if err != nil || self != pid1 {
		t.Skip("not in the host's mount namespace")
	}
	root := t.TempDir()
	layoutOrSkip(t, root, simDriverVersion, []int{0})
	if err := BindSimulatedProcDriver(root); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("error %v, want a refusal", err)
	}
}

// TestBindSimulatedProcDriverAsContainerInit runs this test binary as PID
// 1 of a new PID namespace, the way a container runtime starts the chart's
// plugin: with a /proc of its own (and so a mount namespace of its own) the
// bind is allowed and shows the simulated table; with the host's /proc in
// the host's mount namespace it is refused, though the process is PID 1 of
// its PID namespace.
func TestBindSimulatedProcDriverAsContainerInit(t *testing.T) {
	if root := os.Getenv("FACET_TEST_BIND_ROOT"); root != "" {
		// The child: report what BindSimulatedProcDriver did.
		err := BindSimulatedProcDriver(root)
		if err == nil {
			_, err = os.Stat(filepath.Join(procDriver, "nvidia-caps", "mig-minors"))
		}
		fmt.Printf("pid %d, bind: %v\n", os.Getpid(), err)
		return
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	pid1, err := os.Readlink("/proc/1/ns/mnt")
	inInitNamespace := err == nil && self == pid1
	root := t.TempDir()
	layoutOrSkip(t, root, simDriverVersion, []int{0})
	for _, tc := range []struct {
		name    string
		unshare []string
		want    string
	}{
		{"own /proc and mount namespace", []string{"--pid", "--fork", "--mount", "--propagation", "private", "--mount-proc"}, "pid 1, bind: <nil>"},
		{"the host's /proc and mount namespace", []string{"--pid", "--fork"}, "pid 1, bind: bind simulated /proc/driver: refusing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.want, "refusing") && !inInitNamespace {
				t.Skip("not in the mount namespace of /proc's PID 1")
			}
			args := append(append([]string{}, tc.unshare...), os.Args[0], "-test.run=^TestBindSimulatedProcDriverAsContainerInit$")
			cmd := exec.Command("unshare", args...)
			cmd.Env = append(os.Environ(), "FACET_TEST_BIND_ROOT="+root)
			out, err := cmd.CombinedOutput()
			if err != nil && strings.Contains(string(out), "Operation not permitted") {
				t.Skipf("unshare not permitted here: %s", out)
			}
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("unshare %v: %v, output:\n%s\nwant %q", tc.unshare, err, out, tc.want)
			}
		})
	}
}

func TestLayoutDriverRoot(t *testing.T) {
	root := t.TempDir()
	minors := []int{0, 3}
	layoutOrSkip(t, root, simDriverVersion, minors)
	// Idempotent, and it repairs: a wrong device node, a wrong symlink, a
	// modified library, and a library of another version.
	libDir := filepath.Join(root, SimulatedLibraryDir())
	stale := filepath.Join(libDir, "libcuda.so.535.104.05")
	for _, f := range []func() error{
		func() error { return os.Remove(filepath.Join(root, "dev", "nvidia3")) },
		func() error { return os.WriteFile(filepath.Join(root, "dev", "nvidiactl"), nil, 0o644) },
		func() error {
			os.Remove(filepath.Join(libDir, "libcuda.so.1"))
			return os.Symlink("nowhere", filepath.Join(libDir, "libcuda.so.1"))
		},
		func() error {
			return os.WriteFile(filepath.Join(libDir, "libnvidia-ml.so."+simDriverVersion), []byte("x"), 0o755)
		},
		func() error { return os.WriteFile(stale, []byte("x"), 0o755) },
		// A capability node of an instance, as layouts before the driver's
		// proc files made.
		func() error {
			return unix.Mknod(filepath.Join(root, "dev", "nvidia-caps", "nvidia-cap408"), unix.S_IFCHR|0o444, int(unix.Mkdev(simDeviceMajor, simDeviceMinor)))
		},
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	layoutOrSkip(t, root, simDriverVersion, minors)
	layoutOrSkip(t, root, simDriverVersion, minors)
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("stale library of another version kept: %v", err)
	}

	t.Run("the driver's proc files", func(t *testing.T) {
		// What nvmlgpu.ReadMIGCapDevices reads, as the driver lays it out:
		// GPU 3's GI 2 is minor 3 + 3*135 + 2*9 = 426, its CI 1 is 428.
		gi, ci, err := nvmlgpu.ReadMIGCapDevices(filepath.Join(root, "proc"), 3, 2, 1)
		if err != nil {
			t.Fatal(err)
		}
		if gi.Major != simCapsMajor || gi.Minor != 426 || ci.Major != simCapsMajor || ci.Minor != 428 || gi.Mode != 0o444 || ci.Path != "/dev/nvidia-caps/nvidia-cap428" {
			t.Errorf("GI %+v CI %+v, want c %d:426 and :428, mode 0444", gi, ci, simCapsMajor)
		}
		for _, rel := range []string{"mig/config", "mig/monitor"} {
			if _, err := os.Stat(filepath.Join(root, "proc", "driver", "nvidia", "capabilities", rel)); err != nil {
				t.Error(err)
			}
		}
		// GPU 1 is not listed: no capability files for it.
		if _, _, err := nvmlgpu.ReadMIGCapDevices(filepath.Join(root, "proc"), 1, 0, 0); err == nil {
			t.Error("capabilities of an unlisted GPU minor")
		}
	})

	t.Run("device nodes", func(t *testing.T) {
		want := map[string]uint32{
			"dev/nvidiactl": 0o666, "dev/nvidia-uvm": 0o666, "dev/nvidia-uvm-tools": 0o666,
			"dev/nvidia0": 0o666, "dev/nvidia3": 0o666,
			"dev/nvidia-caps/nvidia-cap1": 0o400, "dev/nvidia-caps/nvidia-cap2": 0o444,
		}
		for rel, mode := range want {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
				t.Errorf("%s: %v", rel, err)
				continue
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(uint64(st.Rdev)) != simDeviceMajor || unix.Minor(uint64(st.Rdev)) != simDeviceMinor || st.Mode&0o7777 != mode {
				t.Errorf("%s: mode %o rdev %d:%d, want char device 1:3 mode %o", rel, st.Mode, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), mode)
			}
		}
		// No node for any GPU or compute instance's capability (GPU 0:
		// minors 3-137; GPU 3: 408-542), the one an earlier layout left
		// included.
		for _, rel := range []string{"dev/nvidia1", "dev/nvidia-caps/nvidia-cap3", "dev/nvidia-caps/nvidia-cap137", "dev/nvidia-caps/nvidia-cap408", "dev/nvidia-caps/nvidia-cap542"} {
			if _, err := os.Lstat(filepath.Join(root, rel)); !os.IsNotExist(err) {
				t.Errorf("%s exists", rel)
			}
		}
		// A container opens them like /dev/null.
		f, err := os.OpenFile(filepath.Join(root, "dev", "nvidia3"), os.O_RDWR, 0)
		if err != nil {
			t.Skipf("cannot open device nodes here (nodev mount?): %v", err)
		}
		defer f.Close()
		if n, err := f.Read(make([]byte, 8)); n != 0 {
			t.Errorf("read %d bytes (%v), want EOF", n, err)
		}
	})

	t.Run("libraries", func(t *testing.T) {
		for _, lib := range simLibraries {
			file := filepath.Join(libDir, lib.name+".so."+simDriverVersion)
			f, err := elf.Open(file)
			if err != nil {
				t.Errorf("%s: %v", file, err)
				continue
			}
			sonames, err := f.DynString(elf.DT_SONAME)
			f.Close()
			want := lib.soname
			if want == "" {
				want = filepath.Base(file)
			}
			if err != nil || len(sonames) != 1 || sonames[0] != want {
				t.Errorf("%s: SONAME %v (%v), want %s", file, sonames, err, want)
			}
			if want != filepath.Base(file) {
				if target, err := os.Readlink(filepath.Join(libDir, want)); err != nil || target != filepath.Base(file) {
					t.Errorf("%s -> %q (%v)", want, target, err)
				}
			}
			if lib.devLink {
				if target, err := os.Readlink(filepath.Join(libDir, lib.name+".so")); err != nil || target != want {
					t.Errorf("%s.so -> %q (%v)", lib.name, target, err)
				}
			}
		}
	})

	t.Run("binaries and firmware", func(t *testing.T) {
		for _, rel := range []string{"usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control", "bin/sh", "bin/busybox"} {
			fi, err := os.Stat(filepath.Join(root, rel))
			if err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: %v %v", rel, fi, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "lib/firmware/nvidia", simDriverVersion, "gsp_ga10x.bin")); err != nil {
			t.Error(err)
		}
	})

	t.Run("mig-minors", func(t *testing.T) {
		f, err := os.Open(filepath.Join(root, "proc/driver/nvidia-caps/mig-minors"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var lines []string
		for s := bufio.NewScanner(f); s.Scan(); {
			lines = append(lines, s.Text())
		}
		// The driver's table: 2 + 32 GPUs x 15 GIs x (1 + 8 CIs) lines.
		if len(lines) != 2+32*15*9 {
			t.Fatalf("%d lines", len(lines))
		}
		for i, want := range map[int]string{
			0: "config 1", 1: "monitor 2", 2: "gpu0/gi0/access 3", 3: "gpu0/gi0/ci0/access 4",
			11: "gpu0/gi1/access 12", len(lines) - 1: "gpu31/gi14/ci7/access 4322",
		} {
			if lines[i] != want {
				t.Errorf("line %d: %q, want %q", i, lines[i], want)
			}
		}
	})

	t.Run("invalid arguments", func(t *testing.T) {
		for _, tc := range []struct {
			root, version string
			minors        []int
		}{
			{"relative", simDriverVersion, nil},
			{root, "", nil},
			{root, "550", nil},
			{root, "5*0.1", nil},
			{root, simDriverVersion, []int{32}},
			{root, simDriverVersion, []int{1, 1}},
		} {
			if err := LayoutDriverRoot(tc.root, tc.version, tc.minors); err == nil {
				t.Errorf("LayoutDriverRoot(%q, %q, %v): no error", tc.root, tc.version, tc.minors)
			}
		}
	})
}

func TestMIGCapMinors(t *testing.T) {
	for _, tc := range []struct {
		gpu, gi, ci    int
		wantGI, wantCI int
		wantErr        bool
	}{
		{0, 0, 0, 3, 4, false},
		{0, 0, 7, 3, 11, false},
		{0, 1, 0, 12, 13, false},
		{1, 0, 0, 138, 139, false},
		{31, 14, 7, 4314, 4322, false},
		{32, 0, 0, 0, 0, true},
		{0, 15, 0, 0, 0, true},
		{0, 0, 8, 0, 0, true},
		{-1, 0, 0, 0, 0, true},
	} {
		gi, ci, err := MIGCapMinors(tc.gpu, tc.gi, tc.ci)
		if (err != nil) != tc.wantErr || gi != tc.wantGI || ci != tc.wantCI {
			t.Errorf("MIGCapMinors(%d, %d, %d) = %d, %d, %v", tc.gpu, tc.gi, tc.ci, gi, ci, err)
		}
	}
}

// checkGolden compares edits, with the driver root written as $ROOT, with
// testdata/nvcdi/<name>-<GOARCH>.json, or rewrites it under -update.
func checkGolden(t *testing.T, name string, edits *cdispec.ContainerEdits, root string) {
	t.Helper()
	got, err := json.MarshalIndent(edits, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(bytes.ReplaceAll(got, []byte(root), []byte("$ROOT")), '\n')
	path := filepath.Join("testdata", "nvcdi", name+"-"+runtime.GOARCH+".json")
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("edits differ from %s (run with -update to accept):\n%s", path, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			fmt.Fprintf(&b, "- %s\n", l)
			count[l]--
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] < 0 {
			fmt.Fprintf(&b, "+ %s\n", l)
			count[l]++
		}
	}
	return b.String()
}

func TestNewDriverEditorErrors(t *testing.T) {
	srv := serverOf(dgxH100(t))
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		name    string
		lib     nvml.Interface
		opts    nvmlgpu.DriverEditorOptions
		wantErr string
	}{
		{"no library", nil, nvmlgpu.DriverEditorOptions{}, "no NVML library"},
		{"relative driver root", srv, nvmlgpu.DriverEditorOptions{DriverRoot: "run/nvidia/driver"}, "run/nvidia/driver"},
		{"relative dev root", srv, nvmlgpu.DriverEditorOptions{DriverRoot: "/", DevRoot: "dev"}, `"dev"`},
		{"missing driver root", srv, nvmlgpu.DriverEditorOptions{DriverRoot: missing}, missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nvmlgpu.NewDriverEditor(tc.lib, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestDriverEditorContainerDriverRoot reads the simulated root where the
// plugin's container would mount it, and checks that the edits name the
// host's paths: the driver's files under the host's driver root, the device
// nodes under the host's dev root, nothing under the container's mount.
func TestDriverEditorContainerDriverRoot(t *testing.T) {
	shared := newSharedRoot(t)
	// A dev root outside the container's mount of the driver root, read at
	// its own path as the chart mounts it: its dev/ is the shared root's.
	devRoot := t.TempDir()
	if err := os.Symlink(filepath.Join(shared, "dev"), filepath.Join(devRoot, "dev")); err != nil {
		t.Fatal(err)
	}
	const hook = "/var/lib/facet-cdi-hook/nvidia-cdi-hook"
	for _, tc := range []struct {
		name             string
		opts             nvmlgpu.DriverEditorOptions // ContainerDriverRoot is the shared root
		wantLib, wantDev string                      // host directories of libcuda and of nvidiactl
		wantErr          string
	}{
		{
			name:    "driver in the host's /",
			opts:    nvmlgpu.DriverEditorOptions{DriverRoot: "/"},
			wantLib: "/" + SimulatedLibraryDir(), wantDev: "/dev",
		},
		{
			name:    "GPU Operator",
			opts:    nvmlgpu.DriverEditorOptions{DriverRoot: "/run/nvidia/driver/"},
			wantLib: "/run/nvidia/driver/" + SimulatedLibraryDir(), wantDev: "/run/nvidia/driver/dev",
		},
		{
			name:    "prefix with a dev root of its own",
			opts:    nvmlgpu.DriverEditorOptions{DriverRoot: "/usr/local/nvidia", DevRoot: devRoot},
			wantLib: "/usr/local/nvidia/" + SimulatedLibraryDir(), wantDev: devRoot + "/dev",
		},
		{
			name:    "dev root inside the container's mount",
			opts:    nvmlgpu.DriverEditorOptions{DriverRoot: "/usr/local/nvidia", DevRoot: shared},
			wantErr: "under " + shared,
		},
		{
			name:    "read at the container's /",
			opts:    nvmlgpu.DriverEditorOptions{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/"},
			wantErr: "read at / in the container",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if opts.ContainerDriverRoot == "" {
				opts.ContainerDriverRoot = shared
			}
			opts.NvidiaCDIHookPath = hook
			lib := dgxH100(t)
			e, err := lib.DriverEditor(opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			common, err := e.CommonEdits()
			if err != nil {
				t.Fatal(err)
			}
			gpu, err := e.GPUEdits(serverOf(lib).Devices[0].(*server.Device).UUID)
			if err != nil {
				t.Fatal(err)
			}
			if len(gpu.DeviceNodes) != 1 || gpu.DeviceNodes[0].HostPath != filepath.Join(tc.wantDev, "nvidia0") {
				t.Errorf("GPU 0's device nodes %+v, want /dev/nvidia0 from host %s", gpu.DeviceNodes, filepath.Join(tc.wantDev, "nvidia0"))
			}
			libcuda := "libcuda.so." + simDriverVersion
			var sawLib bool
			for _, m := range common.Mounts {
				if strings.HasPrefix(m.HostPath, shared) {
					t.Errorf("mount %s: host path under the container's mount %s", m.HostPath, shared)
				}
				if filepath.Base(m.ContainerPath) == libcuda {
					sawLib = true
					if m.HostPath != filepath.Join(tc.wantLib, libcuda) || m.ContainerPath != filepath.Join("/", SimulatedLibraryDir(), libcuda) {
						t.Errorf("libcuda mounted from %s at %s, want from %s", m.HostPath, m.ContainerPath, filepath.Join(tc.wantLib, libcuda))
					}
				}
			}
			if !sawLib {
				t.Errorf("no mount of %s", libcuda)
			}
			var sawCtl bool
			for _, d := range common.DeviceNodes {
				if d.Path == "/dev/nvidiactl" {
					sawCtl = true
					if d.HostPath != filepath.Join(tc.wantDev, "nvidiactl") {
						t.Errorf("/dev/nvidiactl from host %s, want %s", d.HostPath, filepath.Join(tc.wantDev, "nvidiactl"))
					}
				}
			}
			if !sawCtl {
				t.Error("no /dev/nvidiactl")
			}
			if len(common.Hooks) == 0 {
				t.Error("no hooks")
			}
			for _, h := range common.Hooks {
				if h.Path != hook {
					t.Errorf("hook path %s, want %s", h.Path, hook)
				}
			}
			if err := (&cdiapi.ContainerEdits{ContainerEdits: common}).Validate(); err != nil {
				t.Errorf("edits do not validate: %v", err)
			}
		})
	}
}
