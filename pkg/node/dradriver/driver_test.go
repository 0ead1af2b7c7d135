package dradriver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

const node = "node-a"

// rig is a driver on a simulated DGX H100 with its directories, which can
// be "restarted" on the same state.
type rig struct {
	t                         testing.TB
	lib                       *nvmlgpu.Library
	inv                       *inventory.Inventory
	root, cdiDir, checkpoints string
	d                         *Driver
	destroyUnowned            bool
	failpoint                 func(string)
	cfg                       inventory.Config
	// bootIDFile stands in for /proc/sys/kernel/random/boot_id.
	bootIDFile string
	// simState, when set, is the simulated NVML's state file.
	simState string
	// wrapMIG and wrapEdits, when set, stand between the driver and the
	// simulated NVML, to inject faults.
	wrapMIG func(MIGManager) MIGManager
	// partitioner, when set, stands for facet-mps instead of a Manager.
	partitioner sharing.Partitioner
	// mpsDown, without a partitioner, is why MPS is unavailable now
	// (facet-mps not answering); nil: MPS is off by configuration.
	mpsDown   error
	wrapEdits func(EditSource) EditSource
	// noHAMi starts the driver as if --hami-library were broken.
	noHAMi bool
	// cdiSurvivesReboot: a CDI directory that is not a tmpfs.
	cdiSurvivesReboot bool
	// nodeLock is Options.NodeLock.
	nodeLock string
	// mpsDir, when set, starts the driver with MPS (package mps) on the
	// simulated driver root's stand-in, with its daemons there.
	mpsDir string
	// mpsKilled counts, by GPU, the daemons a test killed (they log no quit).
	mpsKilled map[string]int
	// podUsers are, by claim name, the runAsUser of the pod each claim is
	// reserved for (nil: unset); a claim not named runs as 0 (root).
	podUsers map[string]*int64
	// stores are the checkpoint stores of every start, left open as a
	// killed process leaves its journal (see compactCheckpoint).
	stores []*checkpoint.Store
}

// compactCheckpoint stops the driver cleanly, as a plugin that shuts
// down does: its checkpoint's journal goes to record files, which is where
// damage on disk can then be staged. Call start before using the driver
// again.
func (r *rig) compactCheckpoint() {
	r.t.Helper()
	for _, s := range r.stores {
		if err := s.Close(); err != nil {
			r.t.Fatal(err)
		}
	}
	r.stores = nil
	if m, _ := filepath.Glob(filepath.Join(r.checkpoints, "*.json")); len(m) == 0 {
		r.t.Fatal("compaction wrote no record file")
	}
}

var (
	layoutOnce sync.Once
	sharedRoot string
	hamiLib    string
	// bindErr says why MIG edits cannot be made in this process.
	bindErr error
)

func newRig(t testing.TB) *rig { return newRigMode(t, inventory.Config{}) }

func newRigMode(t testing.TB, cfg inventory.Config) *rig {
	t.Helper()
	return newRigOn(t, "dgx-h100", false, cfg)
}

// newRigOn is newRigMode on another demo machine of eight GPUs (the
// shared driver root's), with every GPU's MIG mode on at boot if migOn.
func newRigOn(t testing.TB, machine string, migOn bool, cfg inventory.Config) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the simulated driver root needs mknod (root)")
	}
	m, err := sim.LoadMachine("../../../demo/machines/" + machine + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.GPUs {
		m.GPUs[i].MIGEnabled = m.GPUs[i].MIGEnabled || migOn
	}
	lib, err := sim.OpenSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	n, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	layoutOnce.Do(func() {
		sharedRoot, _ = os.MkdirTemp("", "facet-driver-root")
		minors := []int{0, 1, 2, 3, 4, 5, 6, 7}
		if err := sim.LayoutDriverRoot(sharedRoot, n.DriverVersion, minors); err != nil {
			t.Fatal(err)
		}
		if os.Getenv(privateNamespaceEnv) == "1" {
			// nvcdi reads MIG caps from the fixed /proc/driver path.
			bindErr = sim.BindSimulatedProcDriver(sharedRoot)
		} else {
			bindErr = fmt.Errorf("not in a private mount namespace")
		}
		hamiLib = filepath.Join(sharedRoot, "libvgpu.so")
		if err := os.WriteFile(hamiLib, []byte("stub"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	inv, err := inventory.Build(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &rig{t: t, lib: lib, inv: inv, root: sharedRoot, cdiDir: filepath.Join(dir, "cdi"), checkpoints: filepath.Join(dir, "state"), cfg: cfg,
		bootIDFile: filepath.Join(dir, "boot_id")}
	if err := os.WriteFile(r.bootIDFile, []byte("boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.start()
	return r
}

func (r *rig) start() {
	r.t.Helper()
	_, ctx := ktesting.NewTestContext(r.t)
	editor, err := r.lib.DriverEditor(nvmlgpu.DriverEditorOptions{DriverRoot: r.root, ProcRoot: filepath.Join(r.root, "proc"), NvidiaCDIHookPath: "/usr/bin/nvidia-cdi-hook"})
	if err != nil {
		r.t.Fatal(err)
	}
	store, err := checkpoint.Open(r.checkpoints)
	if err != nil {
		r.t.Fatal(err)
	}
	r.stores = append(r.stores, store)
	w, err := claimcdi.NewWriter(r.cdiDir)
	if err != nil {
		r.t.Fatal(err)
	}
	lib := hamiLib
	if r.noHAMi {
		lib = filepath.Join(r.root, "no-such-libvgpu.so")
	}
	h, hamiErr := hami.NewEditor(hami.Options{LibraryPath: lib, StateDir: filepath.Join(filepath.Dir(r.checkpoints), "vgpu")})
	if hamiErr != nil && !r.noHAMi {
		r.t.Fatal(hamiErr)
	}
	var edits EditSource = editor
	if r.wrapEdits != nil {
		edits = r.wrapEdits(edits)
	}
	var mig MIGManager = r.lib
	if r.wrapMIG != nil {
		mig = r.wrapMIG(mig)
	}
	var partitioner sharing.Partitioner
	if r.mpsDir != "" {
		partitioner = r.mpsManager()
	}
	if r.partitioner != nil {
		partitioner = r.partitioner
	}
	r.d, err = New(ctx, Options{NodeName: node, Inventory: r.inv, Store: store, CDI: w, Edits: edits, MIG: mig, HAMi: h, HAMiUnavailable: hamiErr,
		MPS: partitioner, MPSUnavailable: r.mpsDown, Pods: r.pod, BootIDPath: r.bootIDFile, DestroyUnownedMIG: r.destroyUnowned, Failpoint: r.failpoint, NodeLock: r.nodeLock})
	if err != nil {
		r.t.Fatal(err)
	}
}

// pod is the rig's API server for pods: "pod-of-<claim>", which uses
// the claim and runs as podUsers says.
func (r *rig) pod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	claim, ok := strings.CutPrefix(name, "pod-of-")
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
	}
	p := &corev1.Pod{}
	p.Namespace, p.Name, p.UID = namespace, name, types.UID("uid-of-"+name)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}
	user, set := r.podUsers[claim]
	if !set {
		user = new(int64)
	}
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: user}
	return p, nil
}

// reserve reserves each claim that is reserved for no one for its pod
// (see pod), as the scheduler does.
func reserve(claims ...*resourceapi.ResourceClaim) {
	for _, c := range claims {
		if len(c.Status.ReservedFor) == 0 {
			name := "pod-of-" + c.Name
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: types.UID("uid-of-" + name)}}
		}
	}
}

func (r *rig) prepare(claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	r.t.Helper()
	reserve(claims...)
	_, ctx := ktesting.NewTestContext(r.t)
	res, err := r.d.PrepareResourceClaims(ctx, claims)
	if err != nil || len(res) != len(claims) {
		r.t.Fatalf("PrepareResourceClaims: %d results, %v", len(res), err)
	}
	return res
}

func (r *rig) unprepare(uids ...types.UID) map[types.UID]error {
	r.t.Helper()
	_, ctx := ktesting.NewTestContext(r.t)
	var objs []kubeletplugin.NamespacedObject
	for _, u := range uids {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: u})
	}
	res, err := r.d.UnprepareResourceClaims(ctx, objs)
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

func (r *rig) specExists(uid types.UID) bool {
	_, err := os.Stat(filepath.Join(r.cdiDir, claimcdi.SpecName(uid)+".json"))
	return err == nil
}

func (r *rig) spec(uid types.UID) string {
	b, _ := os.ReadFile(filepath.Join(r.cdiDir, claimcdi.SpecName(uid)+".json"))
	return string(b)
}

// claim builds an allocated claim for devices of this node's pool.
func claim(name string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: names.Driver, Pool: node, Device: d})
	}
	return c
}

func TestPrepareWholeGPUs(t *testing.T) {
	r := newRig(t)
	c := claim("pair", "gpu-2", "gpu-3")
	res := r.prepare(c)[c.UID]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(res.Devices) != 2 {
		t.Fatalf("%d devices", len(res.Devices))
	}
	for i, want := range []string{"gpu-2", "gpu-3"} {
		d := res.Devices[i]
		if d.DeviceName != want || d.PoolName != node || len(d.CDIDeviceIDs) != 1 ||
			d.CDIDeviceIDs[0] != "gpu.facet.dev/claim=uid-pair-"+want {
			t.Errorf("device %d: %+v", i, d)
		}
	}
	spec := r.spec(c.UID)
	g2, g3 := r.inv.GPUs[2].UUID, r.inv.GPUs[3].UUID
	for _, want := range []string{
		`"kind":"gpu.facet.dev/claim"`,
		`"name":"uid-pair-gpu-2"`,
		r.root + `/dev/nvidia2"`,
		r.root + `/dev/nvidia3"`,
		r.root + `/dev/nvidiactl"`,
		"libcuda.so.580.159.04",
		"FACET_GPU_UUIDS=" + g2 + "," + g3,
		"FACET_DEVICES=gpu-2,gpu-3",
	} {
		if !strings.Contains(spec, want) {
			t.Errorf("CDI spec lacks %s:\n%s", want, spec)
		}
	}
	if strings.Contains(spec, "/dev/nvidia0\"") {
		t.Errorf("CDI spec exposes an unallocated GPU")
	}

	// Re-prepare returns the same result and rewrites nothing.
	again := r.prepare(c)[c.UID]
	if again.Err != nil || len(again.Devices) != 2 || again.Devices[1].CDIDeviceIDs[0] != res.Devices[1].CDIDeviceIDs[0] {
		t.Fatalf("re-prepare: %+v", again)
	}

	if err := r.unprepare(c.UID)[c.UID]; err != nil {
		t.Fatal(err)
	}
	if r.specExists(c.UID) {
		t.Fatal("spec left after unprepare")
	}
	if err := r.unprepare(c.UID, "never-seen")["never-seen"]; err != nil {
		t.Fatalf("unprepare of an unknown claim: %v", err)
	}
}

// TestBadClaimsFailAlone: each bad claim fails with a message naming it and
// what is wrong; the good claim in the same call is prepared.
func TestBadClaimsFailAlone(t *testing.T) {
	r := newRig(t)
	good := claim("good", "gpu-0")
	unallocated := claim("unallocated")
	unallocated.Status.Allocation = nil
	ghost := claim("ghost", "gpu-9")
	foreign := claim("foreign", "gpu-1")
	foreign.Status.Allocation.Devices.Results[0].Pool = "node-b"
	configured := claim("configured", "gpu-4")
	configured.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: names.Driver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig","x":1}`)}}},
	}}
	share := claim("share", "gpu-5")
	shareID := types.UID("s1")
	share.Status.Allocation.Devices.Results[0].ShareID = &shareID
	twice := claim("twice", "gpu-6", "gpu-6")
	none := claim("none")
	none.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{Request: "x", Driver: "other.example.com", Pool: node, Device: "d"}}

	res := r.prepare(good, unallocated, ghost, foreign, configured, share, twice, none)
	if res[good.UID].Err != nil {
		t.Fatalf("good claim failed: %v", res[good.UID].Err)
	}
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{unallocated, "claim ns/unallocated: not allocated"},
		{ghost, `claim ns/ghost: request "gpu": device node-a/gpu-9: no such device in this node's inventory`},
		{foreign, `claim ns/foreign: request "gpu": device node-b/gpu-1: pool "node-b" is not this node's pool "node-a"`},
		{configured, `claim ns/configured: devices.config[0] (from claim): GpuConfig: strict decoding error: unknown field "x"`},
		{share, "claim ns/share: request \"gpu\": device node-a/gpu-5: allocated as a share"},
		{twice, "claim ns/twice: device gpu-6: allocated twice in one claim"},
		{none, "claim ns/none: allocation has no device of driver gpu.facet.dev"},
	} {
		err := res[tc.c.UID].Err
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.c.Name, err, tc.want)
		}
		if r.specExists(tc.c.UID) {
			t.Errorf("%s: failed claim left a CDI spec", tc.c.Name)
		}
	}
	// Nothing the bad claims named is held: all those GPUs are free.
	for _, dev := range []string{"gpu-1", "gpu-4", "gpu-5", "gpu-6"} {
		c := claim("later-"+dev, dev)
		if err := r.prepare(c)[c.UID].Err; err != nil {
			t.Errorf("%s not free after failed claims: %v", dev, err)
		}
	}
}

// TestConflictRefused: the last line of defense against a double booking.
func TestConflictRefused(t *testing.T) {
	r := newRig(t)
	first := claim("first", "gpu-1")
	if err := r.prepare(first)[first.UID].Err; err != nil {
		t.Fatal(err)
	}
	second := claim("second", "gpu-1", "gpu-2")
	err := r.prepare(second)[second.UID].Err
	if err == nil || !strings.Contains(err.Error(), "claim ns/second: device gpu-1: conflicts with whole GPU gpu-1 of claim ns/first (uid-first), already prepared on GPU "+r.inv.GPUs[1].UUID) {
		t.Fatalf("conflict: %v", err)
	}
	if !r.specExists(first.UID) || r.specExists(second.UID) {
		t.Fatal("the refusal disturbed the first claim or left the second's spec")
	}
	// gpu-2, named by the refused claim, is still free.
	third := claim("third", "gpu-2")
	if err := r.prepare(third)[third.UID].Err; err != nil {
		t.Fatal(err)
	}
	// Two claims racing for one GPU: exactly one wins.
	r.unprepare(first.UID)
	a, b := claim("race-a", "gpu-1"), claim("race-b", "gpu-1")
	res := r.prepare(a, b)
	if (res[a.UID].Err == nil) == (res[b.UID].Err == nil) {
		t.Fatalf("race: a=%v b=%v", res[a.UID].Err, res[b.UID].Err)
	}
}

// TestRestart covers what a plugin restart finds: prepared claims (kept),
// an interrupted prepare (rolled back), an orphaned spec (removed) and a
// corrupt record (its claim fails; the plugin and the others do not).
func TestRestart(t *testing.T) {
	r := newRig(t)
	kept, broken := claim("kept", "gpu-0"), claim("broken", "gpu-3")
	r.prepare(kept, broken)
	r.compactCheckpoint()

	// A crash between the Preparing record and the Prepared one.
	store, _ := checkpoint.Open(r.checkpoints)
	interrupted := &checkpoint.Claim{UID: "uid-interrupted", Namespace: "ns", Name: "interrupted", State: checkpoint.StatePreparing,
		Devices: []checkpoint.Device{{Requests: []string{"gpu"}, Pool: node, Device: "gpu-1", GPUUUID: r.inv.GPUs[1].UUID}}}
	if err := store.Put(interrupted); err != nil {
		t.Fatal(err)
	}
	w, _ := claimcdi.NewWriter(r.cdiDir)
	// (These writes used to fail unchecked: a CDI device needs an edit.)
	node := &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia1"}}}
	if _, _, _, err := w.WriteClaim("uid-interrupted", nil, []claimcdi.Device{{Name: "gpu-1", Edits: node}}); err != nil {
		t.Fatal(err)
	}
	// A spec no record owns (its record was lost).
	if _, _, _, err := w.WriteClaim("uid-orphan", nil, []claimcdi.Device{{Name: "gpu-2", Edits: node}}); err != nil {
		t.Fatal(err)
	}
	// An accounting region whose claim's record was lost.
	orphanCache := filepath.Join(filepath.Dir(r.checkpoints), "vgpu", "claims", "uid-orphan")
	if err := os.MkdirAll(orphanCache, 0o777); err != nil {
		t.Fatal(err)
	}
	// A record damaged on disk.
	if err := os.WriteFile(filepath.Join(r.checkpoints, "uid-broken.json"), []byte(`{"version":1,"checksum":"x","claim":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	r.start()

	if !r.specExists(kept.UID) {
		t.Fatal("restart lost a prepared claim's spec")
	}
	if r.specExists("uid-interrupted") || r.specExists("uid-orphan") {
		t.Fatal("restart left an interrupted or orphaned spec")
	}
	if _, err := os.Stat(orphanCache); !os.IsNotExist(err) {
		t.Fatal("restart left an orphaned HAMi-core accounting region")
	}
	if c, _ := store.Get("uid-interrupted"); c != nil {
		t.Fatal("restart kept the interrupted record")
	}
	// The kept claim still owns gpu-0; re-prepare is idempotent.
	if res := r.prepare(kept)[kept.UID]; res.Err != nil || res.Devices[0].DeviceName != "gpu-0" {
		t.Fatalf("re-prepare after restart: %+v", res)
	}
	intruder := claim("intruder", "gpu-0")
	if err := r.prepare(intruder)[intruder.UID].Err; err == nil || !strings.Contains(err.Error(), "ns/kept") {
		t.Fatalf("restart forgot who holds gpu-0: %v", err)
	}
	// gpu-1 (interrupted) is free again.
	if c := claim("after", "gpu-1"); r.prepare(c)[c.UID].Err != nil {
		t.Fatal("gpu-1 still held after rollback")
	}
	// The corrupt record fails its claim with the file named ...
	err := r.prepare(broken)[broken.UID].Err
	if err == nil || !strings.Contains(err.Error(), "claim ns/broken") || !strings.Contains(err.Error(), "uid-broken.json") || !strings.Contains(err.Error(), "corrupt checkpoint") {
		t.Fatalf("corrupt record: %v", err)
	}
	// ... and unprepare still cleans that claim up completely.
	if err := r.unprepare(broken.UID)[broken.UID]; err != nil {
		t.Fatal(err)
	}
	if r.specExists(broken.UID) {
		t.Fatal("corrupt claim's spec survived unprepare")
	}
	if err := r.prepare(broken)[broken.UID].Err; err != nil {
		t.Fatalf("claim after cleanup: %v", err)
	}
}

// privateNamespaceEnv marks the test binary re-run in a private mount
// namespace, where the simulated /proc/driver can be bound for nvcdi.
const privateNamespaceEnv = "FACET_DRIVER_TEST_MOUNT_NAMESPACE"

func TestMain(m *testing.M) {
	if os.Getenv(privateNamespaceEnv) == "" && os.Geteuid() == 0 {
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), privateNamespaceEnv+"=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		err := cmd.Run()
		if cmd.ProcessState != nil {
			os.Exit(cmd.ProcessState.ExitCode())
		}
		// No namespace for us: run here; MIG tests skip.
		fmt.Fprintln(os.Stderr, "cannot re-run in a private mount namespace:", err)
	}
	code := m.Run()
	if sharedRoot != "" {
		os.RemoveAll(sharedRoot)
	}
	os.Exit(code)
}
