// Package mps runs one NVIDIA MPS control daemon (nvidia-cuda-mps-control
// from the driver root, chrooted into it, or, for a driver under a prefix
// of its own, into the host's root: Locate, launch.go) per GPU whose vGPU
// shares or slots it partitions, and writes what each share's CDI spec
// needs to join it: the GPU's pipe directory and shared-memory tmpfs as
// mounts, and CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
//
// Where it runs: in facet-mps (package mps/service), a process of its own
// beside the kubelet plugin (the chart's MPS DaemonSet, hostPID), never in
// the plugin. The daemons then outlive a plugin crash, a plugin pod
// deleted and a rolling update of the plugin; the plugin reaches the
// Manager through service.Client.
//
// Why MPS: HAMi-core's SM limit does not hold for GEMMs on an H100, while
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE does (measured:
// shared/hardware/h100-80gb-hbm3.md, "MPS on this card"). HAMi-core keeps
// the per-claim memory budget; MPS's own pinned-memory limit is per
// process, not per claim. docs/mps.md lists MPS's limits and what Facet
// does about each.
//
// Lifecycle, per GPU: the daemon starts at the first claim that holds the
// GPU (Acquire) and gets "quit" when the last lets go (Release); a GPU
// never has two. Each daemon is recorded in <Dir>/<gpu-uuid>/daemon.json
// (pid, process start time, boot ID), next to its pipe/, log/ and shm/
// directories. A restarted facet-mps adopts a daemon whose record is of
// this boot and whose process is still the one recorded; a record of
// another boot is not trusted, and its directories are emptied. A daemon found dead
// is started again (Check), and the caller tells the claims on it.
//
// Which claims hold a GPU is the caller's to record (the driver keeps it in
// its checkpoint and hands it to Restore at start): this package records
// only the daemons.
package mps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// MPS's environment variables (NVIDIA, "Multi-Process Service", Appendix:
// Tools and Interface Reference).
const (
	EnvPipeDirectory          = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDirectory           = "CUDA_MPS_LOG_DIRECTORY"
	EnvActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Paths of the MPS directories in a share's container and, the same, in
// the daemon's chroot.
const (
	// ContainerPipeDir is MPS's default pipe directory, so a client that
	// ignores the variable still finds it.
	ContainerPipeDir = "/tmp/nvidia-mps"
	// ContainerShmDir is where MPS clients and servers share memory: the
	// GPU's tmpfs (Options.ShmSize).
	ContainerShmDir = "/dev/shm"
)

// envDaemonDir marks a daemon's environment with its GPU's directory, so
// that a PID named in a pipe directory is known to serve that one (every
// daemon's CUDA_MPS_PIPE_DIRECTORY is ContainerPipeDir in its chroot).
const envDaemonDir = "FACET_MPS_DIR"

// MaxClients is how many client CUDA contexts one MPS server serves per
// GPU on Volta and later (NVIDIA, "Multi-Process Service", Limitations: 48;
// 16 before Volta). Each claim is at least one client, so a GPU's daemon
// takes at most this many claims.
const MaxClients = names.MPSMaxClients

// ControlName is the control program's file name in the driver root.
const ControlName = "nvidia-cuda-mps-control"

// pidFileName is what the control daemon writes into its pipe directory.
const pidFileName = "nvidia-cuda-mps-control.pid"

const recordName = "daemon.json"

// Failpoint names (Options.Failpoint), in the order a start and a stop
// reach them.
const (
	// FailpointStarting: the GPU's directories are fresh, the daemon is
	// not started yet.
	FailpointStarting = "mps/starting"
	// FailpointStarted: the daemon runs, its record is not written.
	FailpointStarted = "mps/started"
	// FailpointRecorded: the daemon runs and is recorded.
	FailpointRecorded = "mps/recorded"
	// FailpointQuitSent: "quit" was sent, the record still exists.
	FailpointQuitSent = "mps/quit-sent"
)

// Options configure a Manager.
type Options struct {
	// Root is the root the daemons run chrooted into, as this process
	// sees it (Layout.Root): the driver root (facet-mps's mount of the
	// host's), or the host's root for a driver under a prefix.
	Root string
	// Control is nvidia-cuda-mps-control's path inside Root
	// (Layout.Control).
	Control string
	// LibraryPath, when set, is the daemons' LD_LIBRARY_PATH inside Root
	// (Layout.LibraryPath): a prefix's library directory.
	LibraryPath string
	// Dir holds a directory per GPU: pipe/, log/, shm/ and daemon.json.
	// It should be on a tmpfs (e.g. /run/facet/mps); a record of another
	// boot is distrusted either way. Its path is the host's too: the CDI
	// specs mount its directories into containers by it.
	Dir string
	// ShmSize is the size in bytes of the tmpfs each GPU's shm/ is, the
	// /dev/shm of its daemon, its servers and every share of the GPU.
	// Required.
	ShmSize int64
	// BootID is this boot's ID; a record with another is from before a
	// reboot. Empty: records are judged by their process alone.
	BootID string
	// StopTimeout bounds "quit": a daemon still alive after it is killed.
	// Default 10 s.
	StopTimeout time.Duration
	// Failpoint, when set, is called at the Failpoint* names.
	Failpoint func(string)
}

// Manager runs the control daemons. It is safe for concurrent use; work on
// one GPU is serialised.
type Manager struct {
	opts Options
	mu   sync.Mutex
	gpus map[string]*gpuState
}

type gpuState struct {
	mu sync.Mutex
	// holders are the claims on the GPU's daemon, each with the Unix UID
	// its processes run as (AnyUser: not recorded).
	holders map[types.UID]int64
	// rec is the daemon this process started or adopted; nil: none known.
	rec *Record
}

// Record is a running daemon, as recorded in <Dir>/<gpu>/daemon.json.
type Record struct {
	GPU    string `json:"gpu"`
	BootID string `json:"bootID,omitempty"`
	PID    int    `json:"pid"`
	// StartTime is the process's start time (/proc/<pid>/stat field 22,
	// clock ticks since boot), so a reused PID is not taken for it.
	StartTime uint64    `json:"startTime"`
	Started   time.Time `json:"started"`
}

// New checks the control program and creates Dir. Starting daemons needs
// CAP_SYS_ADMIN (mounts, chroot).
func New(opts Options) (*Manager, error) {
	if !filepath.IsAbs(opts.Root) || !filepath.IsAbs(opts.Control) {
		return nil, fmt.Errorf("MPS: driver root %q and control program %q must be absolute paths", opts.Root, opts.Control)
	}
	inRoot := filepath.Join(opts.Root, opts.Control)
	st, err := os.Stat(inRoot)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("MPS control program %s: not an executable file (%v)", inRoot, err)
	}
	if opts.ShmSize <= 0 {
		return nil, fmt.Errorf("MPS shared-memory size %d: must be positive (bytes)", opts.ShmSize)
	}
	if opts.Dir == "" || !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("MPS directory %q: must be an absolute path", opts.Dir)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("MPS directory: %w", err)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 10 * time.Second
	}
	return &Manager{opts: opts, gpus: map[string]*gpuState{}}, nil
}

// Dirs are a GPU's host directories.
type Dirs struct{ Root, Pipe, Log, Shm string }

// DirsOf returns a GPU's directories under Options.Dir.
func (m *Manager) DirsOf(gpuUUID string) Dirs { return DirsIn(m.opts.Dir, gpuUUID) }

// DirsIn returns a GPU's directories under an MPS directory (Options.Dir).
func DirsIn(dir, gpuUUID string) Dirs {
	root := filepath.Join(dir, gpuUUID)
	return Dirs{Root: root, Pipe: filepath.Join(root, "pipe"), Log: filepath.Join(root, "log"), Shm: filepath.Join(root, "shm")}
}

func (m *Manager) gpu(uuid string) *gpuState {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gpus[uuid]
	if g == nil {
		g = &gpuState{holders: map[types.UID]int64{}}
		m.gpus[uuid] = g
	}
	return g
}

func (m *Manager) failpoint(name string) {
	if m.opts.Failpoint != nil {
		m.opts.Failpoint(name)
	}
}

func validGPU(uuid string) error {
	if uuid == "" || uuid == "." || uuid == ".." || strings.ContainsAny(uuid, "/\x00") {
		return fmt.Errorf("GPU UUID %q is not one path element", uuid)
	}
	return nil
}

// ErrHoldersLost is a Partitioner's Check error (wrapped) when the
// daemons' keeper forgot its holders: facet-mps restarted, and the daemons
// of the last one went with its container. The caller hands the holders
// over again (Restore), which starts their daemons again and names them.
var ErrHoldersLost = errors.New("the MPS daemons' keeper restarted and knows no holders")

// AnyUser is the user of a holder whose UID is not recorded (a checkpoint
// record of an earlier version): it conflicts with no one.
const AnyUser int64 = -1

// UserConflictError is Acquire's refusal of a claim whose processes run
// as another Unix user than the one the GPU's daemon serves. An MPS
// control daemon runs one server at a time, for one UID: a client of
// another UID waits, silently, until every client of the running server
// has exited (nvidia-cuda-mps-control(1), DESCRIPTION; NVIDIA,
// "Multi-Process Service", Appendix: Tools and Interface Reference.
// Measured on an H100: a uid-1001 client blocked 26 s behind root's
// server, shared/hardware/h100-80gb-hbm3.md).
type UserConflictError struct {
	GPU string
	// User is the refused claim's UID; Served the UID the daemon's
	// claims run as, and Holders those claims.
	User, Served int64
	Holders      []types.UID
	// HolderNames, when the caller sets them, name the holders in the
	// message ("namespace/name") instead of their UIDs.
	HolderNames []string
}

func (e *UserConflictError) Error() string {
	holders := fmt.Sprint(e.Holders)
	if len(e.HolderNames) > 0 {
		holders = "[" + strings.Join(e.HolderNames, " ") + "]"
	}
	return fmt.Sprintf("GPU %s: its MPS control daemon serves UID %d (claims %s), and this claim's pods run as UID %d: MPS runs one user's server at a time, so this claim's CUDA processes would wait until all of UID %d's had exited", e.GPU, e.Served, holders, e.User, e.Served)
}

// Acquire makes claim a holder of the GPU's daemon for processes running
// as Unix UID user (AnyUser: not known), starting or adopting the daemon
// first. It fails, and the claim does not hold the GPU, when the daemon
// cannot be started, already serves MaxClients claims, or serves claims of
// another UID (a *UserConflictError). Acquiring again is a no-op beyond
// making sure the daemon runs.
func (m *Manager) Acquire(ctx context.Context, gpuUUID string, claim types.UID, user int64) error {
	if err := validGPU(gpuUUID); err != nil {
		return err
	}
	g := m.gpu(gpuUUID)
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, held := g.holders[claim]; !held && len(g.holders) >= MaxClients {
		return fmt.Errorf("GPU %s: its MPS control daemon already serves %d claims, the most an MPS server serves (NVIDIA MPS: 48 clients per GPU on Volta and later)", gpuUUID, len(g.holders))
	}
	if served, others := g.servedUser(claim); user != AnyUser && served != AnyUser && served != user {
		return &UserConflictError{GPU: gpuUUID, User: user, Served: served, Holders: others}
	}
	if _, err := m.ensure(ctx, gpuUUID, g); err != nil {
		return err
	}
	g.holders[claim] = user
	return nil
}

// servedUser is the UID the GPU's holders other than claim run as
// (AnyUser if none is known), and those holders, sorted.
func (g *gpuState) servedUser(claim types.UID) (int64, []types.UID) {
	served := AnyUser
	var others []types.UID
	for c, u := range g.holders {
		if c == claim {
			continue
		}
		others = append(others, c)
		if u != AnyUser {
			served = u
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i] < others[j] })
	return served, others
}

// Release drops claim from every GPU it holds, and stops the daemon of each
// GPU left without holders. A claim holding nothing is no error.
func (m *Manager) Release(ctx context.Context, claim types.UID) error {
	// Not under m.mu: a GPU busy starting its daemon must not hold up
	// the others.
	m.mu.Lock()
	all := make(map[string]*gpuState, len(m.gpus))
	maps.Copy(all, m.gpus)
	m.mu.Unlock()
	var errs []error
	for uuid, g := range all {
		g.mu.Lock()
		if _, held := g.holders[claim]; !held {
			g.mu.Unlock()
			continue
		}
		delete(g.holders, claim)
		if len(g.holders) == 0 {
			if err := m.stop(ctx, uuid, g); err != nil {
				// Held again by nobody, still running: Restore or the
				// next Release retries the stop.
				errs = append(errs, err)
			}
		}
		g.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Holders returns the claims holding a GPU's daemon, sorted.
func (m *Manager) Holders(gpuUUID string) []types.UID {
	g := m.gpu(gpuUUID)
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.holders))
}

// Restore is called at start, and again whenever another plugin process
// (a rolling update) may have changed the checkpoint, with the claims that
// hold each GPU and the UID each runs as: they replace the holders known. It adopts each held GPU's running daemon,
// or starts one (returned in restarted: the claims on it lost theirs), and
// stops the daemons no claim holds (a crash between a start and its
// claim's record, or between a release and its stop). Errors are per GPU;
// the next Acquire or Check retries.
func (m *Manager) Restore(ctx context.Context, holders map[string]map[types.UID]int64) (restarted []string, err error) {
	var errs []error
	m.mu.Lock()
	for uuid, g := range m.gpus {
		if _, ok := holders[uuid]; !ok {
			g.mu.Lock()
			clear(g.holders)
			g.mu.Unlock()
		}
	}
	m.mu.Unlock()
	for uuid, claims := range holders {
		if err := validGPU(uuid); err != nil {
			errs = append(errs, err)
			continue
		}
		g := m.gpu(uuid)
		g.mu.Lock()
		clear(g.holders)
		maps.Copy(g.holders, claims)
		started, err := m.ensure(ctx, uuid, g)
		g.mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		} else if started {
			restarted = append(restarted, uuid)
		}
	}
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil {
		return restarted, errors.Join(append(errs, fmt.Errorf("list MPS directories: %w", err))...)
	}
	for _, en := range entries {
		if !en.IsDir() || len(holders[en.Name()]) > 0 || validGPU(en.Name()) != nil {
			continue
		}
		g := m.gpu(en.Name())
		g.mu.Lock()
		if len(g.holders) == 0 {
			if err := m.stop(ctx, en.Name(), g); err != nil {
				errs = append(errs, err)
			} else {
				klog.FromContext(ctx).Info("Stopped an MPS control daemon no prepared claim holds", "gpu", en.Name())
			}
		}
		g.mu.Unlock()
	}
	sort.Strings(restarted)
	return restarted, errors.Join(errs...)
}

// Check restarts the daemon of each held GPU that has died, and returns,
// by GPU, the claims on each one restarted: their running MPS clients lost
// their server.
func (m *Manager) Check(ctx context.Context) (map[string][]types.UID, error) {
	m.mu.Lock()
	uuids := slices.Sorted(maps.Keys(m.gpus))
	m.mu.Unlock()
	restarted := map[string][]types.UID{}
	var errs []error
	for _, uuid := range uuids {
		g := m.gpu(uuid)
		g.mu.Lock()
		if len(g.holders) > 0 {
			started, err := m.ensure(ctx, uuid, g)
			if err != nil {
				errs = append(errs, err)
			} else if started {
				restarted[uuid] = slices.Sorted(maps.Keys(g.holders))
			}
		}
		g.mu.Unlock()
	}
	return restarted, errors.Join(errs...)
}

// Daemon returns the GPU's running daemon, or nil.
func (m *Manager) Daemon(gpuUUID string) *Record {
	g := m.gpu(gpuUUID)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rec == nil || !alive(g.rec) {
		return nil
	}
	r := *g.rec
	return &r
}

// Running returns the PID of the GPU's live daemon as its pipe directory
// names it, whether or not this Manager started or adopted it.
func (m *Manager) Running(gpuUUID string) (int, bool) {
	if validGPU(gpuUUID) != nil {
		return 0, false
	}
	return m.pidFileDaemon(m.DirsOf(gpuUUID))
}

// Edits are what a share of the GPU adds to its claim's CDI spec
// (EditsFor).
func (m *Manager) Edits(gpuUUID string, cores int64) *cdispec.ContainerEdits {
	return EditsFor(m.opts.Dir, gpuUUID, cores)
}

// EditsFor are what a share of the GPU adds to its claim's CDI spec, with
// dir the host's MPS directory (Options.Dir): the GPU's pipe directory at
// ContainerPipeDir, the path its daemon uses too; its shm tmpfs as
// /dev/shm; CUDA_MPS_PIPE_DIRECTORY; and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// from the share's cores (percent of the GPU's SMs; 0, best effort, is
// 100: no partition).
func EditsFor(dir, gpuUUID string, cores int64) *cdispec.ContainerEdits {
	d := DirsIn(dir, gpuUUID)
	pct := cores
	if pct <= 0 || pct > 100 {
		pct = 100
	}
	return &cdispec.ContainerEdits{
		Env: []string{
			EnvPipeDirectory + "=" + ContainerPipeDir,
			EnvActiveThreadPercentage + "=" + strconv.FormatInt(pct, 10),
		},
		Mounts: []*cdispec.Mount{
			{HostPath: d.Pipe, ContainerPath: ContainerPipeDir, Options: []string{"rw", "nosuid", "nodev", "bind"}},
			{HostPath: d.Shm, ContainerPath: ContainerShmDir, Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}},
		},
	}
}

// ensure makes the GPU's daemon run: the one known, else the recorded one
// if it is still the process recorded and of this boot, else a new one.
// It reports whether it started one. Called with g.mu held.
func (m *Manager) ensure(ctx context.Context, uuid string, g *gpuState) (bool, error) {
	if g.rec != nil && alive(g.rec) {
		return false, nil
	}
	dirs := m.DirsOf(uuid)
	rec, err := m.readRecord(uuid)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "MPS daemon record unreadable; starting afresh", "gpu", uuid)
	case rec != nil && m.opts.BootID != "" && rec.BootID != m.opts.BootID:
		klog.FromContext(ctx).Info("MPS daemon record is from before a reboot; its directories are not trusted", "gpu", uuid, "recordBootID", rec.BootID)
	case rec != nil && alive(rec) && m.namedByPidFile(dirs, rec.PID):
		// The pid file too: a daemon that got "quit" removes it before
		// it exits, and is not to be adopted.
		g.rec = rec
		klog.FromContext(ctx).Info("Adopted the running MPS control daemon", "gpu", uuid, "pid", rec.PID)
		return false, nil
	}
	// No trusted record: a daemon may still run that a crash left
	// unrecorded, named by its pid file. A live control program serving
	// this pipe directory is this boot's, whatever a record says: never
	// a second one beside it.
	if pid, ok := m.pidFileDaemon(dirs); ok {
		if r, err := m.recordDaemon(uuid, pid); err == nil {
			g.rec = r
			klog.FromContext(ctx).Info("Adopted an unrecorded MPS control daemon", "gpu", uuid, "pid", pid)
			return false, nil
		}
	}
	g.rec = nil
	if err := m.start(ctx, uuid, dirs); err != nil {
		return false, fmt.Errorf("GPU %s: start MPS control daemon: %w", uuid, err)
	}
	pid, ok := m.pidFileDaemon(dirs)
	if !ok {
		return false, fmt.Errorf("GPU %s: MPS control daemon started but no live daemon is named in %s", uuid, filepath.Join(dirs.Pipe, pidFileName))
	}
	m.failpoint(FailpointStarted)
	r, err := m.recordDaemon(uuid, pid)
	if err != nil {
		return false, fmt.Errorf("GPU %s: %w", uuid, err)
	}
	g.rec = r
	m.failpoint(FailpointRecorded)
	klog.FromContext(ctx).Info("Started MPS control daemon", "gpu", uuid, "pid", pid, "pipeDirectory", dirs.Pipe)
	return true, nil
}

// start empties the GPU's pipe directory, makes its shm directory an empty
// tmpfs, and runs the control program with -d, chrooted, which returns
// once the daemon listens.
func (m *Manager) start(ctx context.Context, uuid string, dirs Dirs) (err error) {
	if err := os.Remove(filepath.Join(dirs.Root, recordName)); err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{dirs.Root, 0o755}, {dirs.Pipe, 0o755}, {dirs.Log, 0o755}, {dirs.Shm, 0o1777}} {
		if err := os.MkdirAll(dir.path, dir.mode); err != nil {
			return err
		}
		// MkdirAll honours the umask; shm must be world-writable and
		// sticky like /dev/shm, for clients of any UID.
		if err := os.Chmod(dir.path, dir.mode); err != nil {
			return err
		}
	}
	if err := emptyDirs(dirs.Pipe); err != nil {
		return err
	}
	fresh, err := m.shmTmpfs(dirs.Shm)
	if err != nil {
		return err
	}
	defer func() {
		// Seen on a real node: a daemon that never started left its
		// tmpfs mounted, and the directory could not be removed.
		if err != nil && fresh {
			if uerr := unmountShm(dirs.Shm); uerr != nil {
				err = fmt.Errorf("%w (and its shm tmpfs stays: %v)", err, uerr)
			}
		}
	}()
	m.failpoint(FailpointStarting)
	out, err := os.Create(filepath.Join(dirs.Log, "facet-start.log"))
	if err != nil {
		return err
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(ctx, m.opts.StopTimeout)
	defer cancel()
	cmd := m.launch(ctx, dirs, "-d")
	cmd.Env = m.env(uuid, dirs)
	// A file, not a pipe: the daemon may keep inherited descriptors, and
	// Wait would then wait for it.
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(out.Name())
		return fmt.Errorf("%s -d (chrooted into %s%s): %w: %s%s", m.opts.Control, m.opts.Root, m.libraryPathNote(), err, bytes.TrimSpace(msg), launchHint(err))
	}
	return nil
}

// launch is the control program with args, chrooted into Options.Root
// with the GPU's directories (launch.go).
func (m *Manager) launch(ctx context.Context, dirs Dirs, args ...string) *exec.Cmd {
	return launch(ctx, launchSpec{Root: m.opts.Root, Control: m.opts.Control, Pipe: dirs.Pipe, Log: dirs.Log, Shm: dirs.Shm, Args: args})
}

// env is the control program's environment, as it sees its directories
// in its chroot. LD_LIBRARY_PATH only for a driver under a prefix, whose
// libraries are in none of the host loader's directories: chrooted into a
// driver root, its own loader finds its libraries, and a path set in the
// daemon's environment alone reaches no client (each share's container
// gets the driver's libraries from its CDI spec).
func (m *Manager) env(uuid string, dirs Dirs) []string {
	env := []string{
		EnvPipeDirectory + "=" + ContainerPipeDir,
		EnvLogDirectory + "=" + chrootLogDir,
		"CUDA_VISIBLE_DEVICES=" + uuid,
		envDaemonDir + "=" + dirs.Root,
		// The daemon starts nvidia-cuda-mps-server, next to it.
		"PATH=" + filepath.Dir(m.opts.Control) + ":/usr/sbin:/usr/bin:/sbin:/bin",
	}
	if m.opts.LibraryPath != "" {
		env = append(env, "LD_LIBRARY_PATH="+m.opts.LibraryPath)
	}
	return env
}

// libraryPathNote names LD_LIBRARY_PATH in a failed start's error, where
// it is set.
func (m *Manager) libraryPathNote() string {
	if m.opts.LibraryPath == "" {
		return ""
	}
	return ", LD_LIBRARY_PATH=" + m.opts.LibraryPath
}

// shmTmpfs makes the GPU's shm directory a tmpfs of ShmSize bytes, empty:
// a fresh one, or, when one is mounted already (a daemon restarted while
// its shares' containers run, which have it bound as /dev/shm), that one
// emptied, so that they reach the new daemon through it. A tmpfs of its
// own bounds what the GPU's tenants put in /dev/shm, which would
// otherwise fill the host's /run.
//
// fresh says whether it mounted the tmpfs now: a start that then fails
// unmounts only such a one, never one that running shares hold.
func (m *Manager) shmTmpfs(shm string) (fresh bool, err error) {
	mounted, err := isMountPoint(shm)
	if err != nil {
		return false, err
	}
	if mounted {
		return false, emptyDirs(shm)
	}
	opts := fmt.Sprintf("size=%d,mode=1777", m.opts.ShmSize)
	if err := syscall.Mount("facet-mps-shm", shm, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, opts); err != nil {
		return false, fmt.Errorf("mount a tmpfs (%s) on %s: %w", opts, shm, err)
	}
	return true, nil
}

// isMountPoint says whether dir is mounted on: another device than its
// parent's. (A bind mount of the same filesystem is not told apart; Facet
// mounts only tmpfs there.)
func isMountPoint(dir string) (bool, error) {
	var st, parent syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// unmountShm removes the GPU's shm tmpfs, lazily: a container that still
// has it (none should, once the GPU has no holders) keeps its copy.
func unmountShm(shm string) error {
	mounted, err := isMountPoint(shm)
	if err != nil || !mounted {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	if err := syscall.Unmount(shm, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", shm, err)
	}
	return nil
}

// stop sends "quit" to the GPU's daemon, kills it if it outlives
// StopTimeout, removes its record, empties its pipe directory and unmounts
// its shm tmpfs (the log stays for the operator). Called with g.mu held.
func (m *Manager) stop(ctx context.Context, uuid string, g *gpuState) error {
	dirs := m.DirsOf(uuid)
	rec := g.rec
	if rec == nil {
		r, err := m.readRecord(uuid)
		if err == nil && r != nil && (m.opts.BootID == "" || r.BootID == m.opts.BootID) {
			rec = r
		}
	}
	if rec == nil || !alive(rec) {
		if pid, ok := m.pidFileDaemon(dirs); ok {
			if r, err := m.recordDaemon(uuid, pid); err == nil {
				rec = r
			}
		}
	}
	if rec != nil && alive(rec) {
		qctx, cancel := context.WithTimeout(ctx, m.opts.StopTimeout)
		cmd := m.launch(qctx, dirs)
		cmd.Env = m.env(uuid, dirs)
		cmd.Stdin = strings.NewReader("quit\n")
		out, err := cmd.CombinedOutput()
		cancel()
		m.failpoint(FailpointQuitSent)
		if err != nil {
			klog.FromContext(ctx).Error(err, "MPS quit failed; killing the control daemon", "gpu", uuid, "pid", rec.PID, "output", string(bytes.TrimSpace(out)))
		}
		if !waitGone(ctx, rec, m.opts.StopTimeout) {
			klog.FromContext(ctx).Info("MPS control daemon outlived quit; killing it", "gpu", uuid, "pid", rec.PID)
			_ = syscall.Kill(rec.PID, syscall.SIGKILL)
			if !waitGone(ctx, rec, m.opts.StopTimeout) {
				return fmt.Errorf("GPU %s: MPS control daemon %d survives SIGKILL", uuid, rec.PID)
			}
		}
		klog.FromContext(ctx).Info("Stopped MPS control daemon", "gpu", uuid, "pid", rec.PID)
	}
	g.rec = nil
	if err := os.Remove(filepath.Join(dirs.Root, recordName)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := emptyDirs(dirs.Pipe); err != nil {
		return err
	}
	return unmountShm(dirs.Shm)
}

// emptyDirs removes what the directories hold, but not the directories
// themselves: running containers have them bind-mounted (the CDI spec's
// mounts), and a directory removed and made again would leave those
// containers with the old, deleted one, cut off from the next daemon. A
// missing directory is no error.
func emptyDirs(dirs ...string) error {
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		for _, en := range entries {
			if err := os.RemoveAll(filepath.Join(dir, en.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Manager) readRecord(uuid string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(m.opts.Dir, uuid, recordName))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil || r.GPU != uuid || r.PID <= 0 {
		return nil, fmt.Errorf("MPS daemon record of GPU %s is corrupt (%v)", uuid, err)
	}
	return &r, nil
}

// recordDaemon writes the record of the live daemon pid.
func (m *Manager) recordDaemon(uuid string, pid int) (*Record, error) {
	st, ok := procStart(pid)
	if !ok {
		return nil, fmt.Errorf("MPS control daemon %d is gone", pid)
	}
	r := &Record{GPU: uuid, BootID: m.opts.BootID, PID: pid, StartTime: st, Started: time.Now().UTC()}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(m.opts.Dir, uuid), recordName, ".daemon-", b, 0o644); err != nil {
		return nil, fmt.Errorf("record MPS control daemon: %w", err)
	}
	return r, nil
}

// pidFileDaemon returns the pid the pipe directory's pid file names, if
// that process lives, is the control program, and serves this pipe
// directory.
func (m *Manager) pidFileDaemon(dirs Dirs) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dirs.Pipe, pidFileName))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, ok := procStart(pid); !ok || !isControl(pid) {
		return 0, false
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00"+envDaemonDir+"="+dirs.Root+"\x00")) {
		return 0, false
	}
	return pid, true
}

func (m *Manager) namedByPidFile(dirs Dirs, pid int) bool {
	p, ok := m.pidFileDaemon(dirs)
	return ok && p == pid
}

// alive says whether the recorded process still runs: same PID, same start
// time, not a zombie, and the control program.
func alive(r *Record) bool {
	st, ok := procStart(r.PID)
	return ok && st == r.StartTime && isControl(r.PID)
}

// procStart reads a live (non-zombie) process's start time.
func procStart(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may hold spaces: fields
	// count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), f[19] field 22 (starttime).
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		if len(f) > 0 && f[0] == "Z" {
			// An orphan reparented to this process (PID 1 in a
			// container) is reaped here.
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		return 0, false
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	return st, err == nil
}

// isControl says whether a process runs the control program: its command
// line names it (as argv[0], or as the script a shell runs).
func isControl(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	for i, a := range args {
		if i > 1 {
			break
		}
		if filepath.Base(string(a)) == ControlName {
			return true
		}
	}
	return false
}

// waitGone polls until the recorded process is gone or timeout passes.
func waitGone(ctx context.Context, r *Record, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	delay := time.Millisecond
	for alive(r) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
	return true
}
