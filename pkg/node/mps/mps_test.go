package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

const gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
const gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"

// node is a simulated node: a driver root with the stand-in control
// program and an MPS directory, shared by the managers (plugin processes)
// a test starts on it.
type node struct {
	t      testing.TB
	root   string
	dir    string
	bootID string
}

// shmSize is the tests' GPU /dev/shm tmpfs.
const shmSize = 4 << 20

func newNode(t testing.TB) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		// Not a skip that hides a defect: CI runs as root, as the
		// chart's facet-mps does.
		t.Skip("starting MPS daemons mounts a tmpfs and chroots into the driver root: needs root")
	}
	root := t.TempDir()
	if err := mpssim.WriteRoot(root); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, root: root, dir: filepath.Join(t.TempDir(), "mps"), bootID: "boot-1"}
	// No daemon or tmpfs outlives its test.
	t.Cleanup(func() {
		entries, _ := os.ReadDir(n.dir)
		for _, en := range entries {
			if b, err := os.ReadFile(filepath.Join(n.dir, en.Name(), "pipe", pidFileName)); err == nil {
				var pid int
				if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 && isControl(pid) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			_ = unmountShm(filepath.Join(n.dir, en.Name(), "shm"))
		}
	})
	return n
}

// plugin starts a manager, as a plugin process would.
func (n *node) plugin(fail func(string)) *Manager {
	n.t.Helper()
	m, err := New(Options{Root: n.root, Control: "/usr/bin/" + ControlName, Dir: n.dir, ShmSize: shmSize, BootID: n.bootID, StopTimeout: 30 * time.Second, Failpoint: fail})
	if err != nil {
		n.t.Fatal(err)
	}
	return m
}

// log returns the GPU daemon's control.log lines of one kind ("startup",
// "quit", "client").
func (n *node) log(gpu, kind string) []string {
	b, _ := os.ReadFile(filepath.Join(n.dir, gpu, "log", "control.log"))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == kind {
			out = append(out, l)
		}
	}
	return out
}

// pid is the live daemon of a GPU, 0 if none.
func (n *node) pid(gpu string) int {
	m := &Manager{opts: Options{Dir: n.dir}}
	pid, _ := m.pidFileDaemon(m.DirsOf(gpu))
	return pid
}

func TestLifecycle(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
		t.Fatal(err)
	}
	first := n.pid(gpuA)
	if first == 0 {
		t.Fatal("no daemon after the first claim")
	}
	if d := m.Daemon(gpuA); d == nil || d.PID != first || d.BootID != n.bootID {
		t.Fatalf("recorded daemon %+v, want pid %d of %s", d, first, n.bootID)
	}
	if got := n.log(gpuA, "startup"); len(got) != 1 || !strings.Contains(got[0], "gpu="+gpuA) {
		t.Fatalf("startup log %q: want one start with CUDA_VISIBLE_DEVICES=%s", got, gpuA)
	}
	// A second claim, and the first again: the same daemon.
	for _, c := range []types.UID{"claim-2", "claim-1"} {
		if err := m.Acquire(ctx, gpuA, c, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.pid(gpuA); got != first || len(n.log(gpuA, "startup")) != 1 {
		t.Fatalf("daemon %d (%d starts) after more claims, want %d alone", got, len(n.log(gpuA, "startup")), first)
	}
	// Another GPU, another daemon.
	if err := m.Acquire(ctx, gpuB, "claim-3", 0); err != nil {
		t.Fatal(err)
	}
	if b := n.pid(gpuB); b == 0 || b == first {
		t.Fatalf("GPU B daemon %d, want its own", b)
	}
	if err := m.Release(ctx, "claim-1"); err != nil {
		t.Fatal(err)
	}
	if n.pid(gpuA) != first || len(n.log(gpuA, "quit")) != 0 {
		t.Fatal("daemon stopped while claim-2 still holds the GPU")
	}
	if err := m.Release(ctx, "claim-2"); err != nil {
		t.Fatal(err)
	}
	if n.pid(gpuA) != 0 || len(n.log(gpuA, "quit")) != 1 {
		t.Fatalf("after the last claim: daemon %d, quit log %q; want stopped by quit", n.pid(gpuA), n.log(gpuA, "quit"))
	}
	for _, dir := range []string{m.DirsOf(gpuA).Pipe, m.DirsOf(gpuA).Shm} {
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			t.Fatalf("%s after stop: %d entries (%v), want it empty", dir, len(entries), err)
		}
	}
	if mounted, err := isMountPoint(m.DirsOf(gpuA).Shm); err != nil || mounted {
		t.Fatalf("the GPU's shm tmpfs is still mounted after the stop (%v)", err)
	}
	if err := m.Release(ctx, "claim-2"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if n.pid(gpuB) == 0 {
		t.Fatal("GPU B's daemon stopped with GPU A's")
	}
}

func TestRestartAdoptsAndNeverStartsTwo(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	if err := n.plugin(nil).Acquire(ctx, gpuA, "claim-1", 0); err != nil {
		t.Fatal(err)
	}
	pid := n.pid(gpuA)
	tests := []struct {
		name  string
		setup func()
	}{
		{"record intact", func() {}},
		// A crash between the start and the record: the pid file names it.
		{"record lost", func() { _ = os.Remove(filepath.Join(n.dir, gpuA, recordName)) }},
		{"record corrupt", func() { _ = os.WriteFile(filepath.Join(n.dir, gpuA, recordName), []byte("{"), 0o644) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			m := n.plugin(nil)
			restarted, err := m.Restore(ctx, map[string]map[types.UID]int64{gpuA: {"claim-1": 0}})
			if err != nil || len(restarted) != 0 {
				t.Fatalf("Restore: restarted %v, %v; want the daemon adopted", restarted, err)
			}
			if err := m.Acquire(ctx, gpuA, "claim-2", 0); err != nil {
				t.Fatal(err)
			}
			if got := n.pid(gpuA); got != pid || len(n.log(gpuA, "startup")) != 1 {
				t.Fatalf("daemon %d with %d starts, want %d adopted", got, len(n.log(gpuA, "startup")), pid)
			}
			if d := m.Daemon(gpuA); d == nil || d.PID != pid {
				t.Fatalf("adopted daemon %+v, want pid %d", d, pid)
			}
		})
	}
}

func TestRestartAfterDeath(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	for _, c := range []types.UID{"claim-2", "claim-1"} {
		if err := m.Acquire(ctx, gpuA, c, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := m.Check(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Check of a live daemon: %v, %v", got, err)
	}
	old := n.pid(gpuA)
	d := m.Daemon(gpuA)
	// Held open, as a container's bind mount holds them.
	dirs := m.DirsOf(gpuA)
	var held []*os.File
	for _, dir := range []string{dirs.Pipe, dirs.Shm} {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		held = append(held, f)
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitGone(ctx, d, 5*time.Second) {
		t.Fatal("killed daemon still alive")
	}
	got, err := m.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []types.UID{"claim-1", "claim-2"}; fmt.Sprint(got[gpuA]) != fmt.Sprint(want) {
		t.Fatalf("Check reported %v, want the holders %v of GPU A", got, want)
	}
	if p := n.pid(gpuA); p == 0 || p == old {
		t.Fatalf("daemon after Check: %d, want a new one (old %d)", p, old)
	}
	// The claims' running containers have the pipe and shm directories
	// bind-mounted: the new daemon must serve the same directories, not
	// new ones of the same name.
	for _, f := range held {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
			t.Errorf("%s was removed and made again by the restart: running containers lose the daemon", f.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(dirs.Pipe, "control")); err != nil {
		t.Errorf("the new daemon's control pipe is not in the pipe directory: %v", err)
	}
	// A plugin started while the daemon is dead restarts it too.
	d = m.Daemon(gpuA)
	if err := syscall.Kill(d.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitGone(ctx, d, 5*time.Second) {
		t.Fatal("killed daemon still alive")
	}
	restarted, err := n.plugin(nil).Restore(ctx, map[string]map[types.UID]int64{gpuA: {"claim-1": 0}})
	if err != nil || fmt.Sprint(restarted) != fmt.Sprint([]string{gpuA}) {
		t.Fatalf("Restore after death: %v, %v; want GPU A restarted", restarted, err)
	}
}

func TestRebootDistrustsPipeDirectory(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	dirs := (&Manager{opts: Options{Dir: n.dir}}).DirsOf(gpuA)
	// What a boot left on a persistent directory: a record, and a pid file
	// naming a PID that now belongs to someone else (this test).
	for _, d := range []string{dirs.Pipe, dirs.Log, dirs.Shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self := os.Getpid()
	st, _ := procStart(self)
	stale := fmt.Sprintf(`{"gpu":%q,"bootID":"boot-0","pid":%d,"startTime":%d}`, gpuA, self, st)
	for path, data := range map[string]string{
		filepath.Join(dirs.Root, recordName):   stale,
		filepath.Join(dirs.Pipe, pidFileName):  fmt.Sprint(self),
		filepath.Join(dirs.Pipe, "stale-file"): "old",
	} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := n.plugin(nil)
	if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
		t.Fatal(err)
	}
	pid := n.pid(gpuA)
	if pid == 0 || pid == self {
		t.Fatalf("daemon %d, want a new one", pid)
	}
	if _, err := os.Stat(filepath.Join(dirs.Pipe, "stale-file")); !os.IsNotExist(err) {
		t.Fatalf("stale pipe directory content kept: %v", err)
	}
	if d := m.Daemon(gpuA); d == nil || d.BootID != n.bootID {
		t.Fatalf("record %+v, want this boot's", d)
	}
}

func TestRestoreStopsUnheldDaemons(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	for _, g := range []string{gpuA, gpuB} {
		if err := m.Acquire(ctx, g, "claim-"+types.UID(g[4:5]), 0); err != nil {
			t.Fatal(err)
		}
	}
	b := n.pid(gpuB)
	// A restart whose checkpoint holds GPU B only.
	if _, err := n.plugin(nil).Restore(ctx, map[string]map[types.UID]int64{gpuB: {"claim-b": 0}}); err != nil {
		t.Fatal(err)
	}
	if n.pid(gpuA) != 0 || len(n.log(gpuA, "quit")) != 1 {
		t.Fatal("GPU A's daemon, which no claim holds, still runs")
	}
	if n.pid(gpuB) != b {
		t.Fatal("GPU B's daemon was not adopted")
	}
}

func TestMaxClients(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	for i := range MaxClients {
		if err := m.Acquire(ctx, gpuA, types.UID(fmt.Sprintf("claim-%d", i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	err := m.Acquire(ctx, gpuA, "claim-one-too-many", 0)
	if err == nil || !strings.Contains(err.Error(), "48") || !strings.Contains(err.Error(), gpuA) {
		t.Fatalf("claim %d on one GPU: %v, want an error naming the GPU and the limit", MaxClients+1, err)
	}
	if err := m.Acquire(ctx, gpuA, "claim-0", 0); err != nil {
		t.Fatalf("a holder acquiring again: %v", err)
	}
	if got := len(m.Holders(gpuA)); got != MaxClients {
		t.Fatalf("%d holders, want %d", got, MaxClients)
	}
}

// TestUsers: a GPU's daemon serves one Unix user; a claim of another is
// refused with the UID served and its claims, and one whose UID is not
// recorded conflicts with no one.
func TestUsers(t *testing.T) {
	type acquire struct {
		claim types.UID
		user  int64
	}
	for _, tc := range []struct {
		name    string
		held    []acquire
		restore bool // the holders come from Restore (a restarted plugin)
		next    acquire
		// served is the UID the refusal names; -2: no refusal.
		served int64
		others []types.UID
	}{
		{name: "first claim of any user", next: acquire{"c", 1001}, served: -2},
		{name: "same user", held: []acquire{{"a", 1001}, {"b", 1001}}, next: acquire{"c", 1001}, served: -2},
		{name: "another user", held: []acquire{{"a", 0}, {"b", 0}}, next: acquire{"c", 1001}, served: 0, others: []types.UID{"a", "b"}},
		{name: "another user, holders restored", held: []acquire{{"a", 1001}}, restore: true, next: acquire{"c", 0}, served: 1001, others: []types.UID{"a"}},
		{name: "a claim acquiring again as another user", held: []acquire{{"a", 0}, {"b", 0}}, next: acquire{"a", 1001}, served: 0, others: []types.UID{"b"}},
		{name: "the only holder acquiring again as another user", held: []acquire{{"a", 0}}, next: acquire{"a", 1001}, served: -2},
		{name: "an unrecorded user conflicts with no one", held: []acquire{{"a", AnyUser}}, next: acquire{"c", 1001}, served: -2},
		{name: "beside an unrecorded user, the recorded one counts", held: []acquire{{"a", AnyUser}, {"b", 0}}, next: acquire{"c", 1001}, served: 0, others: []types.UID{"a", "b"}},
		{name: "a claim of unknown user joins anyone", held: []acquire{{"a", 0}}, next: acquire{"c", AnyUser}, served: -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			_, ctx := ktesting.NewTestContext(t)
			m := n.plugin(nil)
			if tc.restore {
				holders := map[types.UID]int64{}
				for _, h := range tc.held {
					holders[h.claim] = h.user
				}
				if _, err := m.Restore(ctx, map[string]map[types.UID]int64{gpuA: holders}); err != nil {
					t.Fatal(err)
				}
			}
			for _, h := range tc.held {
				if !tc.restore {
					if err := m.Acquire(ctx, gpuA, h.claim, h.user); err != nil {
						t.Fatal(err)
					}
				}
			}
			err := m.Acquire(ctx, gpuA, tc.next.claim, tc.next.user)
			var conflict *UserConflictError
			if tc.served == -2 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.As(err, &conflict) {
				t.Fatalf("got %v, want a refusal for UID %d", err, tc.served)
			}
			if conflict.Served != tc.served || conflict.User != tc.next.user || conflict.GPU != gpuA || fmt.Sprint(conflict.Holders) != fmt.Sprint(tc.others) {
				t.Errorf("refusal %+v, want UID %d served to %v", conflict, tc.served, tc.others)
			}
			for _, want := range []string{gpuA, fmt.Sprintf("serves UID %d", tc.served), fmt.Sprintf("run as UID %d", tc.next.user)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q does not say %q", err, want)
				}
			}
			// The refused claim holds nothing: releasing it stops nothing.
			held := fmt.Sprint(m.Holders(gpuA))
			if _, had := map[types.UID]bool{"a": true, "b": true}[tc.next.claim]; !had {
				if err := m.Release(ctx, tc.next.claim); err != nil || n.pid(gpuA) == 0 || fmt.Sprint(m.Holders(gpuA)) != held {
					t.Errorf("after releasing the refused claim: %v, daemon %d, holders %v (want %s)", err, n.pid(gpuA), m.Holders(gpuA), held)
				}
			}
		})
	}
}

func TestEdits(t *testing.T) {
	m := &Manager{opts: Options{Dir: "/run/facet/mps"}}
	tests := []struct {
		cores int64
		pct   string
	}{{20, "20"}, {50, "50"}, {100, "100"}, {0, "100"}}
	for _, tc := range tests {
		e := m.Edits(gpuA, tc.cores)
		want := []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + tc.pct}
		if fmt.Sprint(e.Env) != fmt.Sprint(want) {
			t.Errorf("cores %d: env %v, want %v", tc.cores, e.Env, want)
		}
		if len(e.Mounts) != 2 ||
			e.Mounts[0].HostPath != "/run/facet/mps/"+gpuA+"/pipe" || e.Mounts[0].ContainerPath != "/tmp/nvidia-mps" ||
			e.Mounts[1].HostPath != "/run/facet/mps/"+gpuA+"/shm" || e.Mounts[1].ContainerPath != "/dev/shm" {
			t.Errorf("cores %d: mounts %+v", tc.cores, e.Mounts)
		}
	}
}

// TestKillMatrix kills the plugin at each step of a daemon's start and stop
// and checks that the next start converges: one daemon for a GPU its
// checkpoint says is held, none for one it says is not.
func TestKillMatrix(t *testing.T) {
	type crash struct{ at string }
	for _, point := range []string{FailpointStarting, FailpointStarted, FailpointRecorded, FailpointQuitSent} {
		for _, held := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/held=%v", point, held), func(t *testing.T) {
				t.Parallel()
				n := newNode(t)
				_, ctx := ktesting.NewTestContext(t)
				kill := func(name string) {
					if name == point {
						panic(crash{name})
					}
				}
				run := func(f func() error) (died bool) {
					defer func() {
						if v := recover(); v != nil {
							if _, ok := v.(crash); !ok {
								panic(v)
							}
							died = true
						}
					}()
					_ = f()
					return false
				}
				m := n.plugin(kill)
				died := run(func() error { return m.Acquire(ctx, gpuA, "claim-1", 0) })
				if !died {
					died = run(func() error { return m.Release(ctx, "claim-1") })
				}
				if !died {
					t.Fatalf("never reached %s", point)
				}
				holders := map[string]map[types.UID]int64{}
				if held {
					holders[gpuA] = map[types.UID]int64{"claim-1": 0}
				}
				if _, err := n.plugin(nil).Restore(ctx, holders); err != nil {
					t.Fatal(err)
				}
				pid := n.pid(gpuA)
				switch {
				case held && pid == 0:
					t.Fatal("held GPU has no daemon after the restart")
				case !held && pid != 0:
					t.Fatalf("daemon %d runs for a GPU no claim holds", pid)
				}
				if held {
					// Never two: every start the log shows but the last
					// was stopped.
					starts, quits := len(n.log(gpuA, "startup")), len(n.log(gpuA, "quit"))
					if starts-quits > 1 {
						t.Fatalf("%d starts and %d quits: more than one daemon", starts, quits)
					}
				}
			})
		}
	}
}

// TestDaemonNamespace: the daemon runs chrooted into the driver root,
// with the one pipe directory path its clients get, the GPU's shm tmpfs
// of the configured size as its /dev/shm, and no LD_LIBRARY_PATH; nothing
// of its namespace reaches this process's.
func TestDaemonNamespace(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
		t.Fatal(err)
	}
	pid := n.pid(gpuA)
	dirs := m.DirsOf(gpuA)
	if _, err := os.Stat(filepath.Join(dirs.Shm, fmt.Sprintf("%s.%d", mpssim.ShmMarker, pid))); err != nil {
		t.Fatalf("the daemon's /dev/shm is not the GPU's shm tmpfs: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", fmt.Sprintf("%s.%d", mpssim.ShmMarker, pid))); err == nil {
		t.Fatal("the daemon wrote into this process's /dev/shm")
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dirs.Shm, &fs); err != nil {
		t.Fatal(err)
	}
	const tmpfsMagic = 0x01021994
	if fs.Type != tmpfsMagic || int64(fs.Blocks)*fs.Bsize != shmSize {
		t.Fatalf("shm: filesystem type %#x of %d bytes, want a tmpfs of %d", fs.Type, int64(fs.Blocks)*fs.Bsize, shmSize)
	}
	root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil || root != n.root {
		t.Fatalf("daemon's root %q (%v), want the driver root %s", root, err, n.root)
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	vars := strings.Split(string(env), "\x00")
	if !slices.Contains(vars, EnvPipeDirectory+"="+ContainerPipeDir) {
		t.Errorf("daemon's environment %q: want %s=%s, the clients' path", vars, EnvPipeDirectory, ContainerPipeDir)
	}
	for _, v := range vars {
		if strings.HasPrefix(v, "LD_LIBRARY_PATH=") {
			t.Errorf("daemon's environment has %s: the driver root's own loader must find its libraries", v)
		}
	}
	// The scratch tmpfs over the root's /tmp stayed in the daemon's
	// namespace: the root's own /tmp has nothing of it.
	if entries, _ := os.ReadDir(filepath.Join(n.root, "tmp")); len(entries) != 0 {
		t.Errorf("the driver root's /tmp holds %d entries in this namespace, want none", len(entries))
	}
	if err := m.Release(ctx, "claim-1"); err != nil {
		t.Fatal(err)
	}
}

// TestShmSurvivesRestart: a daemon started again while its shares run
// keeps the GPU's tmpfs (their containers have it as /dev/shm), emptied.
func TestShmSurvivesRestart(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	m := n.plugin(nil)
	if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
		t.Fatal(err)
	}
	shm := m.DirsOf(gpuA).Shm
	var before syscall.Stat_t
	if err := syscall.Stat(shm, &before); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shm, "stale"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := m.Daemon(gpuA)
	_ = syscall.Kill(rec.PID, syscall.SIGKILL)
	if !waitGone(ctx, rec, 10*time.Second) {
		t.Fatal("the killed daemon lives")
	}
	restarted, err := m.Check(ctx)
	if err != nil || len(restarted[gpuA]) != 1 {
		t.Fatalf("check: %v %v", restarted, err)
	}
	var after syscall.Stat_t
	if err := syscall.Stat(shm, &after); err != nil {
		t.Fatal(err)
	}
	if after.Dev != before.Dev {
		t.Fatal("the restarted daemon got a new tmpfs: running shares keep the old one, cut off")
	}
	if _, err := os.Stat(filepath.Join(shm, "stale")); !os.IsNotExist(err) {
		t.Fatalf("the tmpfs was not emptied for the new daemon: %v", err)
	}
	if err := m.Release(ctx, "claim-1"); err != nil {
		t.Fatal(err)
	}
}

func TestFindControl(t *testing.T) {
	for _, dir := range []string{"usr/bin", "bin"} {
		root := t.TempDir()
		if err := mpssim.Write(filepath.Join(root, dir)); err != nil {
			t.Fatal(err)
		}
		control, err := FindControl(root)
		if err != nil || control != "/"+dir+"/"+ControlName {
			t.Errorf("%s: %q %v", dir, control, err)
		}
	}
	if _, err := FindControl(t.TempDir()); err == nil || !strings.Contains(err.Error(), ControlName+" not found") {
		t.Errorf("empty root: %v", err)
	}
}

// TestFailedStartUnmountsShm: a daemon that never starts leaves no tmpfs
// behind (seen on a real H200: the node check's scratch directory could not
// be removed, "device or resource busy"), and a tmpfs that running shares
// hold is never unmounted by a failed restart.
func TestFailedStartUnmountsShm(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	// A control program that exits at once, as one refusing its
	// environment does.
	if err := os.WriteFile(filepath.Join(n.root, "usr/bin/failing-control"), []byte("#!/bin/sh\necho refused: no-such-gpu >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Root: n.root, Control: "/usr/bin/failing-control", Dir: n.dir, ShmSize: shmSize, BootID: n.bootID, StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Acquire(ctx, gpuA, "claim-1", 0)
	if err == nil || !strings.Contains(err.Error(), "refused: no-such-gpu") {
		t.Fatalf("Acquire with a missing control program: %v", err)
	}
	shm := m.DirsOf(gpuA).Shm
	if mounted, err := isMountPoint(shm); err != nil || mounted {
		t.Fatalf("shm %s mounted after a failed start: %v %v", shm, mounted, err)
	}
	if err := os.RemoveAll(n.dir); err != nil {
		t.Fatalf("the MPS directory cannot be removed after a failed start: %v", err)
	}

	// A tmpfs already there (a restart under running shares) stays.
	if err := os.MkdirAll(shm, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("facet-test-shm", shm, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := m.Acquire(ctx, gpuA, "claim-1", 0); err == nil {
		t.Fatal("Acquire with a missing control program succeeded")
	}
	if mounted, err := isMountPoint(shm); err != nil || !mounted {
		t.Fatalf("a failed restart unmounted the tmpfs that running shares hold: %v %v", mounted, err)
	}
}

func TestLaunchHint(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: syscall.EINVAL}, true},
		{&os.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: syscall.ENOENT}, false},
		{&os.PathError{Op: "open", Path: "/x", Err: syscall.EINVAL}, false},
		{errors.New("exit status 1"), false},
	} {
		if got := launchHint(tc.err) != ""; got != tc.want {
			t.Errorf("launchHint(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestCheckRoot: a root MPS can be chrooted into passes; a driver under a
// prefix of its own (seen on a real H200 at /usr/local/nvidia: bin/ and
// lib64/, no loader, /tmp or /dev/shm) is refused once, naming what lacks.
func TestCheckRoot(t *testing.T) {
	full := t.TempDir()
	if err := mpssim.WriteRoot(full); err != nil {
		t.Fatal(err)
	}
	control, err := FindControl(full)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckRoot(full, control); err != nil {
		t.Errorf("a chrootable root: %v", err)
	}

	// The host's own dynamically linked /bin/true stands for the driver's
	// nvidia-cuda-mps-control under a prefix.
	prefix := t.TempDir()
	elfProgram, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prefix, "bin", ControlName), elfProgram, 0o755); err != nil {
		t.Fatal(err)
	}
	control, err = FindControl(prefix)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := driverroot.Interpreter("/bin/true")
	if err != nil || loader == "" {
		t.Fatalf("/bin/true's loader: %q %v", loader, err)
	}
	err = CheckRoot(prefix, control)
	for _, want := range []string{"cannot run MPS chrooted", "no /tmp directory", "no /dev/shm directory", "interpreter " + loader + " is not in it"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a prefix root: %v; want %q", err, want)
		}
	}

	// A script whose "#!" program the root lacks.
	script := t.TempDir()
	for _, d := range []string{"tmp", "dev/shm", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(script, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(script, "usr/bin", ControlName), []byte("#!/bin/sh -e\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckRoot(script, "/usr/bin/"+ControlName); err == nil || !strings.Contains(err.Error(), "interpreter /bin/sh is not in it") {
		t.Errorf("a script without its shell: %v", err)
	}

	// An interpreter reached through an absolute link, as Debian's
	// /lib64/ld-linux-x86-64.so.2: resolved in the root, not on this host.
	if err := os.MkdirAll(filepath.Join(script, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/facet-test-loader", filepath.Join(script, "lib64", "loader")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(script, "usr/bin", ControlName), []byte("#!/lib64/loader\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckRoot(script, "/usr/bin/"+ControlName); err == nil || !strings.Contains(err.Error(), "interpreter /lib64/loader is not in it") {
		t.Errorf("a link to a loader the root lacks: %v", err)
	}
	if err := os.WriteFile(filepath.Join(script, "usr", "facet-test-loader"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckRoot(script, "/usr/bin/"+ControlName); err != nil {
		t.Errorf("a link to a loader the root has (and this host does not): %v", err)
	}
}
