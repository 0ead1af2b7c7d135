package dradriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/mps"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// mpsManager is the MPS daemon manager of the rig's node: the simulated
// driver root's stand-in control program, daemons under r.mpsDir. Its
// failpoints are the rig's, armed or not at the time they are reached.
func (r *rig) mpsManager() *mps.Manager {
	r.t.Helper()
	boot, _ := os.ReadFile(r.bootIDFile)
	m, err := mps.New(mps.Options{
		Root: r.root, Control: "/usr/bin/" + mps.ControlName, Dir: r.mpsDir, ShmSize: 4 << 20, BootID: strings.TrimSpace(string(boot)),
		StopTimeout: 30 * time.Second,
		Failpoint: func(name string) {
			if r.failpoint != nil {
				r.failpoint(name)
			}
		},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// newMPSRig is a rig whose driver partitions shares with MPS: its
// Manager, in process, stands for facet-mps, and the rig's kills take
// both down, as a node crash does.
func newMPSRig(t *testing.T, cfg inventory.Config) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("MPS daemons start chrooted into the driver root, with a tmpfs: needs root (CI runs as root)")
	}
	r := newRigMode(t, cfg)
	r.mpsDir = filepath.Join(t.TempDir(), "mps")
	t.Cleanup(func() { r.killDaemons() })
	r.start()
	return r
}

// daemon is the PID of the GPU's live MPS control daemon, 0 if none.
func (r *rig) daemon(gpu string) int {
	pid, _ := r.mpsManager().Running(gpu)
	return pid
}

// killDaemons leaves no daemon, and no shm tmpfs, behind the test.
func (r *rig) killDaemons() {
	entries, _ := os.ReadDir(r.mpsDir)
	for _, e := range entries {
		if pid := r.daemon(e.Name()); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = syscall.Unmount(filepath.Join(r.mpsDir, e.Name(), "shm"), syscall.MNT_DETACH)
	}
}

// mpsLog counts the GPU daemon's control.log lines of a kind.
func (r *rig) mpsLog(gpu, kind string) int {
	b, _ := os.ReadFile(filepath.Join(r.mpsDir, gpu, "log", "control.log"))
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == kind {
			n++
		}
	}
	return n
}

// auditMPS: a daemon runs for exactly the GPUs that prepared records hold
// under MPS, one each.
func (r *rig) auditMPS(want ...*resourceapi.ResourceClaim) {
	r.t.Helper()
	held := map[string]bool{}
	for _, c := range want {
		for _, dev := range r.record(c.UID).Devices {
			if dev.Share != nil && dev.Share.MPS {
				held[dev.GPUUUID] = true
			}
		}
	}
	for _, g := range r.inv.GPUs {
		pid := r.daemon(g.UUID)
		switch {
		case held[g.UUID] && pid == 0:
			r.t.Errorf("GPU %d: held by an MPS claim, but no daemon runs", g.Index)
		case !held[g.UUID] && pid != 0:
			r.t.Errorf("GPU %d: MPS daemon %d runs, but no claim holds it", g.Index, pid)
		case held[g.UUID] && r.mpsLog(g.UUID, "startup")-r.mpsLog(g.UUID, "quit") > 1+r.mpsKilled[g.UUID]:
			r.t.Errorf("GPU %d: more daemons started than stopped", g.Index)
		}
	}
}

func gpuUUID(r *rig, device string) string {
	dev, ok := r.inv.Device(device)
	if !ok {
		r.t.Fatalf("no device %s", device)
	}
	return dev.GPU.UUID
}

const (
	cfgTimeSliced = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"time-sliced"}`
	cfgMPS        = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"mps"}`
	cfgBestEffort = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"best-effort"}`
)

// TestMPSPartitionsSharesAndSlots: consumable-capacity shares (1.36+) and
// slots (stock 1.35) join their GPU's one daemon with their cores as the
// active thread percentage; HAMi-core keeps the memory limit and its SM
// throttle is off; the daemon stops with the GPU's last claim.
func TestMPSPartitionsSharesAndSlots(t *testing.T) {
	layout, err := inventory.ParseSlotLayout("1x40Gi/50+2")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		cfg    inventory.Config
		claims []*resourceapi.ResourceClaim
		want   [][]string
	}{
		{
			name:   "shares",
			cfg:    inventory.Config{DefaultMode: inventory.ModeShared},
			claims: []*resourceapi.ResourceClaim{share("twenty", "gpu-5", "2000Mi", 20), share("fifty", "gpu-5", "3000Mi", 50)},
			want: [][]string{
				{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "CUDA_DEVICE_SM_LIMIT_0=0"},
				{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_DEVICE_MEMORY_LIMIT_0=3000m", "CUDA_DEVICE_SM_LIMIT_0=0"},
			},
		},
		{
			name: "slots on a stock cluster",
			cfg: inventory.Config{Features: &stockCluster, DefaultMode: inventory.ModeExclusive,
				PerGPU: map[int]inventory.Mode{5: inventory.ModeSlots}, PerGPUSlots: map[int]inventory.SlotLayout{5: layout}},
			claims: []*resourceapi.ResourceClaim{claim("big", "gpu-5-slot-2"), claim("small", "gpu-5-slot-0")},
			want: [][]string{
				{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_DEVICE_MEMORY_LIMIT_0=40960m", "CUDA_DEVICE_SM_LIMIT_0=0"},
				{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_DEVICE_MEMORY_LIMIT_0=20059m", "CUDA_DEVICE_SM_LIMIT_0=0"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newMPSRig(t, tc.cfg)
			gpu := gpuUUID(r, tc.claims[0].Status.Allocation.Devices.Results[0].Device)
			for i, c := range tc.claims {
				if _, err := r.prepareOne(c); err != nil {
					t.Fatal(err)
				}
				spec := r.spec(c.UID)
				want := append([]string{
					"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
					`"hostPath":"` + filepath.Join(r.mpsDir, gpu, "pipe") + `","containerPath":"/tmp/nvidia-mps"`,
					`"hostPath":"` + filepath.Join(r.mpsDir, gpu, "shm") + `","containerPath":"/dev/shm"`,
				}, tc.want[i]...)
				for _, w := range want {
					if !strings.Contains(spec, w) {
						t.Errorf("claim %s: spec lacks %s", c.Name, w)
					}
				}
				if rec := r.record(c.UID); !rec.Devices[0].Share.MPS {
					t.Errorf("claim %s: record does not say MPS", c.Name)
				}
			}
			if n := r.mpsLog(gpu, "startup"); n != 1 {
				t.Fatalf("%d daemon starts for one GPU, want 1", n)
			}
			r.audit(tc.claims...)
			r.auditMPS(tc.claims...)
			if err := r.unprepareOne(tc.claims[0]); err != nil {
				t.Fatal(err)
			}
			r.auditMPS(tc.claims[1:]...)
			if err := r.unprepareOne(tc.claims[1]); err != nil {
				t.Fatal(err)
			}
			r.auditMPS()
			if r.mpsLog(gpu, "quit") != 1 {
				t.Fatal("the daemon was not stopped with quit")
			}
		})
	}
}

// TestMPSChoice: the admin's or user's partitioning, and what happens where
// MPS cannot be had.
func TestMPSChoice(t *testing.T) {
	uid := func(u int64) *int64 { return &u }
	tests := []struct {
		name string
		mps  bool
		// down: MPS is configured but unavailable now (facet-mps gone),
		// not off by configuration.
		down bool
		// before is prepared first, on the same GPU; its pod runs as 0.
		before *resourceapi.ResourceClaim
		claim  *resourceapi.ResourceClaim
		// users are the claims' pods' runAsUser (claim name: UID; nil:
		// unset); 0 where not named.
		users     map[string]*int64
		wantErr   string
		wantEnv   []string
		notEnv    []string
		wantNote  string
		wantEvent string
	}{
		{name: "pod runs as a UID", mps: true, claim: share("nb", "gpu-5", "4Gi", 20), users: map[string]*int64{"nb": uid(1001)},
			wantEnv: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_DEVICE_SM_LIMIT_0=0"}},
		{name: "pod sets no runAsUser: time-sliced by default", mps: true, claim: share("nouser", "gpu-5", "4Gi", 20), users: map[string]*int64{"nouser": nil},
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20"}, notEnv: []string{"CUDA_MPS_"}, wantNote: "container c sets no runAsUser"},
		{name: "pod sets no runAsUser, asked for MPS", mps: true, claim: share("nouser-asked", "gpu-5", "4Gi", 20, cfgMPS), users: map[string]*int64{"nouser-asked": nil},
			wantErr: `VgpuConfig partitioning "mps": UID unknown: pod ns/pod-of-nouser-asked: container c sets no runAsUser`},
		{name: "same UID as the GPU's daemon serves", mps: true, before: share("root-job", "gpu-5", "4Gi", 20), claim: share("root-too", "gpu-5", "4Gi", 30),
			wantEnv: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"}},
		{name: "another UID than the GPU's daemon serves: time-sliced by default", mps: true,
			before: share("root-job", "gpu-5", "4Gi", 20), claim: share("user-job", "gpu-5", "4Gi", 30), users: map[string]*int64{"user-job": uid(1001)},
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=30"}, notEnv: []string{"CUDA_MPS_"}, wantNote: "MPS control daemon serves UID 0 (claims [ns/root-job]), and this claim's pods run as UID 1001"},
		{name: "another UID than the GPU's daemon serves, asked for MPS", mps: true,
			before: share("root-job", "gpu-5", "4Gi", 20), claim: share("user-asked", "gpu-5", "4Gi", 30, cfgMPS), users: map[string]*int64{"user-asked": uid(1001)},
			wantErr: "serves UID 0 (claims [ns/root-job]), and this claim's pods run as UID 1001", wantEvent: ReasonMPSUser},
		{name: "another UID on another GPU", mps: true,
			before: share("root-job", "gpu-4", "4Gi", 20), claim: share("user-job", "gpu-5", "4Gi", 30), users: map[string]*int64{"user-job": uid(1001)},
			wantEnv: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"}},
		{name: "time-sliced by config", mps: true, claim: share("sliced", "gpu-5", "4Gi", 20, cfgTimeSliced),
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20"}, notEnv: []string{"CUDA_MPS_"}},
		{name: "no MPS on the node: time-sliced by default", claim: share("plain", "gpu-5", "4Gi", 20),
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20"}, notEnv: []string{"CUDA_MPS_"}},
		{name: "no MPS on the node, asked for", claim: share("asked", "gpu-5", "4Gi", 20, cfgMPS),
			wantErr: `VgpuConfig partitioning "mps": MPS is unavailable on this node`},
		{name: "MPS down: a share with a compute limit fails, naming why", down: true, claim: share("limited", "gpu-5", "4Gi", 20),
			wantErr: "device gpu-5 asks for 20% of the GPU's SMs, which only MPS holds, and MPS is unavailable on this node: facet-mps unreachable"},
		{name: "MPS down: a best-effort share is time-sliced, told", down: true, claim: share("be", "gpu-5", "4Gi", 20, cfgBestEffort),
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20"}, notEnv: []string{"CUDA_MPS_"}, wantNote: "its compute limit best effort"},
		{name: "MPS down: a share without a compute limit is time-sliced", down: true, claim: share("nolimit", "gpu-5", "4Gi", 0),
			notEnv: []string{"CUDA_MPS_"}},
		{name: "MPS down: time-sliced by config", down: true, claim: share("sliced-down", "gpu-5", "4Gi", 20, cfgTimeSliced),
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20"}, notEnv: []string{"CUDA_MPS_"}},
		{name: "MPS down, asked for", down: true, claim: share("asked-down", "gpu-5", "4Gi", 20, cfgMPS),
			wantErr: `VgpuConfig partitioning "mps": MPS is unavailable on this node: facet-mps unreachable`},
		{name: "best effort with MPS: MPS", mps: true, claim: share("be-mps", "gpu-5", "4Gi", 20, cfgBestEffort),
			wantEnv: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_DEVICE_SM_LIMIT_0=0"}},
		{name: "shares on two GPUs fall back", mps: true, claim: twoGPUShares("two", false),
			wantEnv: []string{"CUDA_DEVICE_SM_LIMIT_0=20", "CUDA_DEVICE_SM_LIMIT_1=20"}, notEnv: []string{"CUDA_MPS_"},
			wantNote: "a container joins one MPS daemon"},
		{name: "shares on two GPUs asked for MPS", mps: true, claim: twoGPUShares("two-asked", true),
			wantErr: "a container joins one MPS daemon"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r *rig
			switch {
			case tc.mps:
				r = newMPSRig(t, inventory.Config{DefaultMode: inventory.ModeShared})
			case tc.down:
				r = newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared})
				r.mpsDown = errMPSDown
				r.start()
			default:
				r = newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared})
			}
			r.podUsers = tc.users
			var prepared []*resourceapi.ResourceClaim
			if tc.before != nil {
				if _, err := r.prepareOne(tc.before); err != nil {
					t.Fatal(err)
				}
				prepared = append(prepared, tc.before)
			}
			events := record.NewFakeRecorder(10)
			r.d.obs.events = events
			_, err := r.prepareOne(tc.claim)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("prepare: %v, want %q", err, tc.wantErr)
				}
				r.audit(prepared...)
				if tc.mps {
					r.auditMPS(prepared...)
				}
				if tc.wantEvent != "" {
					var seen []string
					for len(events.Events) > 0 {
						seen = append(seen, <-events.Events)
					}
					// On the claim and on its pod.
					if n := strings.Count(strings.Join(seen, "\n"), tc.wantEvent); n != 2 {
						t.Errorf("%d %s Events, want 2 (claim and pod): %q", n, tc.wantEvent, seen)
					}
				}
				return
			}
			prepared = append(prepared, tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			spec := r.spec(tc.claim.UID)
			for _, w := range tc.wantEnv {
				if !strings.Contains(spec, w) {
					t.Errorf("spec lacks %s", w)
				}
			}
			for _, w := range tc.notEnv {
				if strings.Contains(spec, w) {
					t.Errorf("spec has %s", w)
				}
			}
			if tc.mps {
				r.auditMPS(prepared...)
			}
			if tc.wantNote != "" {
				select {
				case e := <-events.Events:
					if !strings.Contains(e, ReasonMPSNotApplied) || !strings.Contains(e, tc.wantNote) {
						t.Errorf("event %q", e)
					}
				default:
					t.Error("no Event says why the claim is not MPS-partitioned")
				}
			}
		})
	}
}

func twoGPUShares(name string, askMPS bool) *resourceapi.ResourceClaim {
	c := share(name, "gpu-4", "4Gi", 20)
	second := share(name+"-b", "gpu-5", "4Gi", 20).Status.Allocation.Devices.Results[0]
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, second)
	if askMPS {
		return withConfig(c, cfgMPS)
	}
	return c
}

// TestMPSPluginRestartAndDaemonDeath: a restarted plugin adopts the daemon
// (no second start); a daemon that dies is started again, with an Event on
// its claims; a re-prepare of a claim whose daemon is dead brings it back.
func TestMPSPluginRestartAndDaemonDeath(t *testing.T) {
	r := newMPSRig(t, inventory.Config{DefaultMode: inventory.ModeShared})
	c := share("job", "gpu-5", "4Gi", 20)
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	gpu := gpuUUID(r, "gpu-5")
	pid := r.daemon(gpu)
	r.restart()
	if got := r.daemon(gpu); got != pid || r.mpsLog(gpu, "startup") != 1 {
		t.Fatalf("after a plugin restart: daemon %d (%d starts), want %d adopted", got, r.mpsLog(gpu, "startup"), pid)
	}
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}

	events := record.NewFakeRecorder(10)
	r.d.obs.events = events
	r.killDaemon(gpu)
	_, ctx := ktesting.NewTestContext(t)
	r.d.CheckMPS(ctx)
	if got := r.daemon(gpu); got == 0 || got == pid {
		t.Fatalf("daemon after its death: %d", got)
	}
	select {
	case e := <-events.Events:
		if !strings.Contains(e, ReasonMPSRestarted) || !strings.Contains(e, gpu) {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Event on the claim whose daemon was restarted")
	}

	// Dead while the plugin was down: the restart starts it again.
	r.killDaemon(gpu)
	r.restart()
	if r.daemon(gpu) == 0 {
		t.Fatal("no daemon after a restart that found it dead")
	}
	// Dead at a re-prepare: the claim is rebuilt onto a new daemon.
	r.killDaemon(gpu)
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	r.audit(c)
	r.auditMPS(c)
	if err := r.unprepareOne(c); err != nil {
		t.Fatal(err)
	}
	r.auditMPS()
}

// killDaemon kills the GPU's daemon and waits for it to be gone.
func (r *rig) killDaemon(gpu string) {
	r.t.Helper()
	pid := r.daemon(gpu)
	if pid == 0 {
		r.t.Fatal("no daemon to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	if r.mpsKilled == nil {
		r.mpsKilled = map[string]int{}
	}
	r.mpsKilled[gpu]++
	deadline := time.Now().Add(5 * time.Second)
	for r.daemon(gpu) == pid {
		if time.Now().After(deadline) {
			r.t.Fatal("killed daemon still alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMPSReboot: after a reboot the daemon of the last boot is not
// trusted; the claim's rebuild starts a fresh one.
func TestMPSReboot(t *testing.T) {
	r := newMPSRig(t, inventory.Config{DefaultMode: inventory.ModeShared})
	c := share("job", "gpu-5", "4Gi", 20)
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	gpu := gpuUUID(r, "gpu-5")
	// The reboot took the daemon (here: it is killed), and /run is a
	// tmpfs in real life; here the stale directory survives, on purpose.
	r.killDaemon(gpu)
	r.reboot(2)
	if r.daemon(gpu) != 0 {
		t.Fatal("a daemon runs for a claim of the last boot before its re-prepare")
	}
	if _, err := r.prepareOne(c); err != nil {
		t.Fatal(err)
	}
	r.audit(c)
	r.auditMPS(c)
}

// TestMPSKillMatrix kills the plugin at every step of an MPS claim's
// prepare and unprepare, restarts it, and checks that the node converges:
// one daemon exactly while a prepared record holds its GPU.
func TestMPSKillMatrix(t *testing.T) {
	points := []struct {
		at        string
		unprepare bool // reached while unpreparing
	}{
		{mps.FailpointStarting, false},
		{mps.FailpointStarted, false},
		{mps.FailpointRecorded, false},
		{"prepare/acquired-mps", false},
		{"prepare/wrote-spec", false},
		{"prepare/recorded-prepared", false},
		{"rollback/removed-cache", true},
		{mps.FailpointQuitSent, true},
		{"rollback/released-mps", true},
		{"rollback/deleted-record", true},
	}
	for _, p := range points {
		t.Run(p.at, func(t *testing.T) {
			t.Parallel()
			r := newMPSRig(t, inventory.Config{DefaultMode: inventory.ModeShared})
			c := share("job", "gpu-5", "4Gi", 20)
			r.killAt(p.at, 1)
			died := call(func() { _, _ = r.prepareOne(c) })
			if !died {
				died = call(func() { _ = r.unprepareOne(c) })
			}
			if !died {
				t.Fatalf("never reached %s", p.at)
			}
			r.restart()
			// A daemon runs exactly while a Prepared record holds its
			// GPU: a prepare that did not record Prepared is rolled back
			// at the start, its daemon stopped; an unprepare cut short
			// leaves its record (and daemon) to the kubelet's retry.
			rec := r.record(c.UID)
			switch {
			case rec == nil:
				r.audit()
				r.auditMPS()
			case p.unprepare:
				r.auditMPS(c)
				if err := r.unprepareOne(c); err != nil {
					t.Fatal(err)
				}
				r.audit()
				r.auditMPS()
			default:
				r.audit(c)
				r.auditMPS(c)
			}
			// The kubelet's retries converge either way.
			if _, err := r.prepareOne(c); err != nil {
				t.Fatal(err)
			}
			r.auditMPS(c)
			if err := r.unprepareOne(c); err != nil {
				t.Fatal(err)
			}
			r.audit()
			r.auditMPS()
		})
	}
}

// record reads a claim's checkpoint record; nil if it has none.
func (r *rig) record(uid types.UID) *checkpoint.Claim {
	r.t.Helper()
	rec, err := r.d.store.Get(uid)
	if err != nil {
		r.t.Fatal(err)
	}
	return rec
}

// unreachableMPS stands for facet-mps, reachable or not (down).
type unreachableMPS struct {
	down    bool
	holders map[types.UID]bool
}

var errMPSDown = errors.New("facet-mps unreachable at /run/facet/mps/facet-mps.sock (test)")

func (u *unreachableMPS) Acquire(_ context.Context, _ string, claim types.UID, _ int64) error {
	if u.down {
		return errMPSDown
	}
	u.holders[claim] = true
	return nil
}

func (u *unreachableMPS) Release(_ context.Context, claim types.UID) error {
	if u.down {
		return errMPSDown
	}
	delete(u.holders, claim)
	return nil
}

func (u *unreachableMPS) Edits(_ string, cores int64) *cdispec.ContainerEdits {
	return &cdispec.ContainerEdits{Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", cores)}}
}

func (u *unreachableMPS) Daemon(string) *mps.Record { return &mps.Record{PID: 1} }

func (u *unreachableMPS) Restore(context.Context, map[string]map[types.UID]int64) ([]string, error) {
	return nil, nil
}

func (u *unreachableMPS) Check(context.Context) (map[string][]types.UID, error) { return nil, nil }

// TestMPSUnreachableLeavesNothingHeld: a share prepared while facet-mps is
// unreachable fails, and its rollback cannot release the MPS holder either,
// so its reservation stays. Seen live (TestMPS): once facet-mps was back, a
// new pod's share did not fit beside the failed claim's 20 %. The kubelet's
// unprepare of the failed claim releases it, and a retry of the claim
// itself takes its own reservation again instead of adding to it.
func TestMPSUnreachableLeavesNothingHeld(t *testing.T) {
	for _, then := range []string{"unprepared", "retried"} {
		t.Run(then, func(t *testing.T) {
			r := newRigMode(t, inventory.Config{DefaultMode: inventory.ModeShared})
			fake := &unreachableMPS{holders: map[types.UID]bool{}}
			r.partitioner = fake
			r.start()
			big := share("big", "gpu-5", "3000Mi", 80, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"mps"}`)
			if _, err := r.prepareOne(big); err != nil {
				t.Fatal(err)
			}
			fake.down = true
			late := share("late", "gpu-5", "2000Mi", 20, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"mps"}`)
			if _, err := r.prepareOne(late); err == nil || !strings.Contains(err.Error(), "facet-mps unreachable") {
				t.Fatalf("prepare with facet-mps down: %v", err)
			}
			fake.down = false
			if then == "unprepared" {
				if err := r.unprepareOne(late); err != nil {
					t.Fatal(err)
				}
				next := share("next", "gpu-5", "2000Mi", 20, `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","partitioning":"mps"}`)
				if _, err := r.prepareOne(next); err != nil {
					t.Fatalf("a new share beside the unprepared failed one: %v", err)
				}
				if fake.holders[late.UID] {
					t.Error("the failed claim is still an MPS holder")
				}
				return
			}
			if _, err := r.prepareOne(late); err != nil {
				t.Fatalf("the kubelet's retry of the failed claim: %v", err)
			}
		})
	}
}
