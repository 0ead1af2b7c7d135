// Package nodecleanup removes what Facet left on a node once its chart is
// uninstalled: `helm uninstall` deletes the DaemonSets, not the files
// their pods wrote to host paths. It is `facetctl node-cleanup`
// (docs/operations.md, "Upgrade, rollback, uninstall").
//
// It fails closed. Nothing is removed while a Facet process still runs on
// the node (the plugin's checkpoint or facet-mps's lock is held, one of
// their sockets answers), while the checkpoint records prepared claims
// (their pods may still use the GPUs) unless forced, while a tmpfs is
// still mounted in the MPS directory, or while MIG instances that Facet
// carved for a layout are left undecided (keep them, or destroy exactly
// those Facet recorded creating; an instance Facet did not record is
// never touched). Within a directory it removes only the names Facet
// writes there, so a directory shared with others (the CDI directory, the
// kubelet's) keeps theirs, and a path set to a shared directory by
// mistake loses nothing that is not Facet's.
package nodecleanup

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
)

// Paths are the host paths Facet's chart gives its pods, as the chart's
// values name them. CDIHookDir and HAMiCoreDir are empty where the chart
// did not install nvidia-cdi-hook or HAMi-core (their install values
// false): a file someone else put there is not Facet's to remove.
type Paths struct {
	// StateDir is kubeletPlugin.stateDir (the plugin's --state-dir).
	StateDir string
	// CDIDir is kubeletPlugin.cdiDir (--cdi-dir).
	CDIDir string
	// KubeletDir is kubeletPlugin.kubeletDir: the plugin's sockets are
	// in its plugins/ and plugins_registry/.
	KubeletDir string
	// MPSDir is kubeletPlugin.mps.dir (--mps-dir, facet-mps's too).
	MPSDir string
	// CDIHookDir is kubeletPlugin.nvidiaCDIHook.hostDir.
	CDIHookDir string
	// HAMiCoreDir is kubeletPlugin.hamiCore.hostDir.
	HAMiCoreDir string
}

// ChartDefaults are the chart's default host paths (values.yaml).
var ChartDefaults = Paths{
	StateDir:    "/var/lib/facet",
	CDIDir:      "/var/run/cdi",
	KubeletDir:  "/var/lib/kubelet",
	MPSDir:      "/run/facet/mps",
	CDIHookDir:  "/var/lib/facet-cdi-hook",
	HAMiCoreDir: "/var/lib/facet-hami-core",
}

// MIGAction is what to do with the MIG instances Facet carved for its
// layouts (--mig-layouts), recorded in <state dir>/mig-layouts.json.
type MIGAction string

const (
	// MIGUndecided refuses while the record lists instances: removing the
	// record forgets that Facet made them, and a later Facet would then
	// leave them alone as someone else's.
	MIGUndecided MIGAction = ""
	// MIGKeep leaves them on the GPUs, and forgets them.
	MIGKeep MIGAction = "keep"
	// MIGDestroy destroys each recorded instance that still exists with
	// the recorded GPU instance and compute instance IDs, profile and
	// placement. MIG mode stays as it is.
	MIGDestroy MIGAction = "destroy"
)

// MIG is the NVML that MIGDestroy needs (package nvmlgpu's Library).
type MIG interface {
	ListMIG() ([]nvmlgpu.MIGInstance, error)
	DestroyMIG(parentUUID string, giID, ciID int) error
}

// Options configure Run.
type Options struct {
	Paths
	// HostRoot is the host's / as this process sees it: "/" on the host,
	// "/host" in the pod `facetctl node-cleanup --node` starts. Paths
	// are under it.
	HostRoot string
	// Force removes the files even where the checkpoint records prepared
	// claims (their running containers keep their devices; a restarted
	// one cannot start, its CDI spec gone).
	Force bool
	// MIG says what to do with the instances of Facet's MIG layouts.
	MIG MIGAction
	// OpenMIG opens the node's NVML; called only for MIGDestroy with
	// instances recorded. Its close function is called when done.
	OpenMIG func() (MIG, func(), error)
	// Log gets a line for each thing removed, kept or found.
	Log io.Writer
}

// The refusals. Each error names what it found and what to do.
var (
	// ErrInUse: a Facet process still runs on the node.
	ErrInUse = errors.New("a Facet process still runs on this node")
	// ErrClaimsPrepared: the checkpoint records prepared claims.
	ErrClaimsPrepared = errors.New("claims are still prepared on this node")
	// ErrMIGUndecided: Facet's MIG instances need MIGKeep or MIGDestroy.
	ErrMIGUndecided = errors.New("MIG instances that Facet carved are still on the GPUs")
	// ErrMounted: a tmpfs is still mounted in the MPS directory.
	ErrMounted = errors.New("a tmpfs of facet-mps is still mounted")
)

// Result is what Run did.
type Result struct {
	// Removed are the host paths removed, as this process sees them.
	Removed []string
	// Kept are what Run left in a Facet directory because it is not a
	// name Facet writes there ("<path>: <why>").
	Kept []string
	// DestroyedMIG lists the MIG instances destroyed ("GPU-...: GI n CI m").
	DestroyedMIG []string
}

// The names Facet writes in its state directory (the plugin's
// --state-dir; pkg/node/nodeplugin), and the temporary files of their
// atomic replacement (pkg/model/atomicfile).
var stateEntries = []string{
	"claims",                                    // the checkpoint (pkg/node/checkpoint)
	"vgpu",                                      // HAMi-core's regions, preload and lock (pkg/node/hami)
	"plugin.lock",                               // nodeplugin.NodeLockFile
	"mig-layouts.json", "mig-layouts.json.tmp*", // pkg/model/miglayout
	"gpu-faults.json", ".health-*", // pkg/node/gpuhealth
	// A simulated node's NVML state and faults (internal/nvml/sim).
	"simulated-nvml.json", ".simulated-nvml.json.tmp-*",
	"simulated-faults.json", ".faults-*",
}

// mpsEntries are what facet-mps and the plugin write in the MPS
// directory (pkg/node/mps, pkg/node/mps/service): a directory per GPU
// (pipe, log, shm, the daemon's record), facet-mps's socket and lock.
var mpsEntries = []string{"GPU-*", "facet-mps.sock", "facet-mps.lock"}

// Run removes Facet's files from the node, or refuses with nothing
// removed. An error after the checks (a file that could not be removed)
// leaves the rest removed; running it again finishes.
func Run(o Options) (*Result, error) {
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	for _, p := range []struct{ flag, path string }{
		{"--state-dir", o.StateDir}, {"--cdi-dir", o.CDIDir}, {"--kubelet-dir", o.KubeletDir}, {"--mps-dir", o.MPSDir},
	} {
		if !filepath.IsAbs(p.path) {
			return nil, fmt.Errorf("%s %q: want an absolute host path", p.flag, p.path)
		}
	}
	for _, p := range []struct{ flag, path string }{{"--nvidia-cdi-hook-dir", o.CDIHookDir}, {"--hami-core-dir", o.HAMiCoreDir}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			return nil, fmt.Errorf("%s %q: want an absolute host path, or empty where the chart did not install it", p.flag, p.path)
		}
	}
	switch o.MIG {
	case MIGUndecided, MIGKeep, MIGDestroy:
	default:
		return nil, fmt.Errorf("MIG instances %q: want keep or destroy", o.MIG)
	}
	c := &cleaner{o: o, res: &Result{}}
	state := c.host(o.StateDir)
	pluginDir := filepath.Join(c.host(o.KubeletDir), "plugins", names.Driver)
	registry := filepath.Join(c.host(o.KubeletDir), "plugins_registry")
	mpsDir := c.host(o.MPSDir)

	// 1. Nothing of Facet's may still run here.
	sockets, err := globAll(filepath.Join(pluginDir, "*.sock"), filepath.Join(registry, names.Driver+"-*reg.sock"), filepath.Join(mpsDir, "facet-mps.sock"))
	if err != nil {
		return nil, err
	}
	var running []string
	if in, err := flockHeld(filepath.Join(state, "claims")); err != nil {
		return nil, err
	} else if in {
		running = append(running, "a kubelet plugin has its checkpoint "+filepath.Join(state, "claims")+" open")
	}
	if held, err := flockHeld(filepath.Join(mpsDir, "facet-mps.lock")); err != nil {
		return nil, err
	} else if held {
		running = append(running, "facet-mps holds "+filepath.Join(mpsDir, "facet-mps.lock"))
	}
	for _, s := range sockets {
		if conn, err := net.DialTimeout("unix", s, time.Second); err == nil {
			conn.Close()
			running = append(running, "socket "+s+" answers")
		}
	}
	if len(running) > 0 {
		return nil, fmt.Errorf("%w: %s. Uninstall the chart (helm uninstall) and wait for its pods on this node to end, then run this again", ErrInUse, strings.Join(running, "; "))
	}

	// 2. No claim may still be prepared, unless forced.
	claims, corrupt, err := checkpoint.PeekAll(filepath.Join(state, "claims"))
	if err != nil {
		return nil, err
	}
	if len(claims)+len(corrupt) > 0 {
		described := describeClaims(claims, corrupt)
		if !o.Force {
			return nil, fmt.Errorf("%w: %s. Their pods may still use the GPUs, and only the plugin unprepares them: delete those pods while the plugin runs (install the chart again if it is gone), then uninstall; or pass --force to remove Facet's files anyway (running containers keep their devices, a restarted one cannot start, and MIG instances of these claims stay on the GPUs)",
				ErrClaimsPrepared, strings.Join(described, "; "))
		}
		for _, d := range described {
			c.logf("forced: claim %s is still prepared; its files go, its devices and MIG instances stay", d)
		}
	}

	// 3. Facet's MIG layouts: decided, and nothing mounted in the MPS
	// directory.
	layouts, layoutErr := miglayout.NewStore(filepath.Join(state, "mig-layouts.json")).Load()
	owned := ownedInstances(layouts)
	switch {
	case layoutErr != nil && o.MIG != MIGKeep:
		return nil, fmt.Errorf("%w: %v; which instances are Facet's is unknown, so none is destroyed: check the GPUs (nvidia-smi mig -lgi), then pass --mig-instances=keep", ErrMIGUndecided, layoutErr)
	case len(owned) > 0 && o.MIG == MIGUndecided:
		return nil, fmt.Errorf("%w: %s (%s). Pass --mig-instances=destroy to destroy exactly these, or --mig-instances=keep to leave them (a Facet installed later will not know it made them)",
			ErrMIGUndecided, strings.Join(owned, "; "), filepath.Join(state, "mig-layouts.json"))
	}
	if mounts, err := mountsUnder(mpsDir); err != nil {
		return nil, err
	} else if len(mounts) > 0 {
		return nil, fmt.Errorf("%w: %s. facet-mps unmounts them when it stops; where it was killed, unmount them on the node (umount %s) or reboot it", ErrMounted, strings.Join(mounts, ", "), strings.Join(mounts, " "))
	}
	if len(owned) > 0 {
		if o.MIG == MIGKeep {
			for _, in := range owned {
				c.logf("kept MIG instance %s on its GPU (--mig-instances=keep)", in)
			}
		} else if err := c.destroyMIG(layouts); err != nil {
			return c.res, err
		}
	}

	// 4. The files.
	var errs []error
	keep := func(err error) { errs = append(errs, err) }
	cdi := c.host(o.CDIDir)
	if entries, err := os.ReadDir(cdi); err == nil {
		for _, e := range entries {
			n := e.Name()
			spec := strings.HasPrefix(n, claimcdi.Vendor+"-") && (strings.HasSuffix(n, ".json") || strings.HasSuffix(n, ".yaml"))
			if spec || strings.HasPrefix(n, claimcdi.TempPrefix) {
				keep(c.remove(filepath.Join(cdi, n)))
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		keep(err)
	}
	for _, s := range sockets {
		if strings.HasPrefix(s, registry) {
			keep(c.remove(s))
		}
	}
	keep(c.removeDir(pluginDir, []string{"*.sock"}))
	keep(c.removeDir(state, stateEntries))
	keep(c.removeDir(mpsDir, mpsEntries))
	if parent := filepath.Dir(mpsDir); filepath.Base(parent) == "facet" {
		// The chart's default /run/facet/mps: the kubelet made /run/facet
		// for it.
		keep(c.removeEmpty(parent))
	}
	if o.CDIHookDir != "" {
		keep(c.removeDir(c.host(o.CDIHookDir), []string{"nvidia-cdi-hook", ".nvidia-cdi-hook.tmp.*"}))
	}
	if o.HAMiCoreDir != "" {
		keep(c.removeDir(c.host(o.HAMiCoreDir), []string{"libvgpu.so", ".libvgpu.so.tmp.*"}))
	}
	return c.res, errors.Join(errs...)
}

type cleaner struct {
	o   Options
	res *Result
}

func (c *cleaner) host(p string) string { return filepath.Join(c.o.HostRoot, p) }

func (c *cleaner) logf(format string, args ...any) {
	if c.o.Log != nil {
		fmt.Fprintf(c.o.Log, format+"\n", args...)
	}
}

// remove removes path, a directory with all it holds.
func (c *cleaner) remove(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	c.res.Removed = append(c.res.Removed, path)
	c.logf("removed %s", path)
	return nil
}

// removeDir removes the entries of dir that match one of patterns
// (filepath.Match), then dir itself if that left it empty; anything else
// stays, in Result.Kept.
func (c *cleaner) removeDir(dir string, patterns []string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs, others []string
	for _, e := range entries {
		if !matchAny(patterns, e.Name()) {
			others = append(others, e.Name())
			continue
		}
		if err := c.remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	if len(others) > 0 {
		sort.Strings(others)
		kept := fmt.Sprintf("%s: kept, it holds %s, which Facet does not write there", dir, strings.Join(others, ", "))
		c.res.Kept = append(c.res.Kept, kept)
		c.logf("%s", kept)
		return nil
	}
	return c.removeEmpty(dir)
}

// removeEmpty removes dir if it is empty.
func (c *cleaner) removeEmpty(dir string) error {
	err := os.Remove(dir)
	switch {
	case err == nil:
		c.res.Removed = append(c.res.Removed, dir)
		c.logf("removed %s", dir)
		return nil
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
		return nil
	}
	return fmt.Errorf("remove %s: %w", dir, err)
}

// destroyMIG destroys every instance the layout records list that still
// exists as recorded: same GPU, GI and CI IDs, profile and placement.
func (c *cleaner) destroyMIG(layouts map[string]miglayout.Record) error {
	if c.o.OpenMIG == nil {
		return errors.New("internal error: no NVML to destroy MIG instances with")
	}
	lib, closeLib, err := c.o.OpenMIG()
	if err != nil {
		return fmt.Errorf("open NVML to destroy Facet's MIG instances: %w", err)
	}
	defer closeLib()
	existing, err := lib.ListMIG()
	if err != nil {
		return fmt.Errorf("list MIG instances: %w", err)
	}
	gpus := make([]string, 0, len(layouts))
	for g := range layouts {
		gpus = append(gpus, g)
	}
	sort.Strings(gpus)
	for _, gpu := range gpus {
		for _, o := range layouts[gpu].Instances {
			what := fmt.Sprintf("%s: GI %d CI %d (GI profile %d at memory slice %d)", gpu, o.GIID, o.CIID, o.GIProfileID, o.Start)
			found := false
			for _, in := range existing {
				if in.ParentUUID == gpu && in.GIID == o.GIID && in.CIID == o.CIID && in.GIProfileID == o.GIProfileID && in.Placement.Start == o.Start {
					found = true
					break
				}
			}
			if !found {
				c.logf("MIG instance %s is gone already", what)
				continue
			}
			if err := lib.DestroyMIG(gpu, o.GIID, o.CIID); err != nil {
				return fmt.Errorf("destroy Facet's MIG instance %s: %w (nothing else was removed; run this again once it can be destroyed, or with --mig-instances=keep)", what, err)
			}
			c.res.DestroyedMIG = append(c.res.DestroyedMIG, what)
			c.logf("destroyed MIG instance %s", what)
		}
	}
	return nil
}

// ownedInstances describes the instances the layout records list.
func ownedInstances(layouts map[string]miglayout.Record) []string {
	var out []string
	for gpu, r := range layouts {
		for _, o := range r.Instances {
			out = append(out, fmt.Sprintf("%s: GI %d CI %d of layout %s", gpu, o.GIID, o.CIID, r.Layout))
		}
	}
	sort.Strings(out)
	return out
}

func describeClaims(claims []*checkpoint.Claim, corrupt map[types.UID]error) []string {
	var out []string
	for _, cl := range claims {
		var devs []string
		for _, d := range cl.Devices {
			devs = append(devs, d.Device+" of "+d.GPUUUID)
		}
		out = append(out, fmt.Sprintf("%s/%s (UID %s, %s, devices %s)", cl.Namespace, cl.Name, cl.UID, cl.State, strings.Join(devs, ", ")))
	}
	for uid, err := range corrupt {
		out = append(out, fmt.Sprintf("an unreadable record %s (%v)", uid, err))
	}
	sort.Strings(out)
	return out
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return false
}

func globAll(patterns ...string) ([]string, error) {
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// flockHeld reports whether some process holds a flock on path: a running
// plugin holds its checkpoint directory's shared from checkpoint.Open to
// Close, facet-mps its lock file exclusively while it runs. A missing path
// is not held.
func flockHeld(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	}
	return false, fmt.Errorf("lock %s: %w", path, err)
}

// mountsUnder lists the mount points at most two levels below dir (each
// GPU's <dir>/<GPU UUID>/shm tmpfs), found as a directory on another
// device than its parent, as package mps finds them.
func mountsUnder(dir string) ([]string, error) {
	var out []string
	var walk func(d string, depth int) error
	walk = func(d string, depth int) error {
		entries, err := os.ReadDir(d)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var parent syscall.Stat_t
		if err := syscall.Stat(d, &parent); err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(d, e.Name())
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil {
				return err
			}
			if st.Dev != parent.Dev {
				out = append(out, p)
				continue
			}
			if depth < 2 {
				if err := walk(p, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(dir, 1)
}
