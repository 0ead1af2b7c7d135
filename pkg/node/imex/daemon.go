package imex

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

// ReloadInterval is the least time between two SIGUSR1 to nvidia-imex, and
// between its start and the first: the IMEX guide ("Signal handling")
// says nvidia-imex processes SIGUSR1 at most once every 5 seconds and
// ignores the rest, so a change that comes sooner is signalled when the
// window has passed, never dropped; and a signal that arrived before
// nvidia-imex set its handler would end it (SIGUSR1's default action),
// where the peer list it read at start is already the newest.
const ReloadInterval = 6 * time.Second

// StopTimeout is how long nvidia-imex has to end after SIGTERM (it
// notifies its peers) before SIGKILL; below a pod's default grace period
// of 30 seconds.
const StopTimeout = 20 * time.Second

// ChrootStateDir is where the state directory is bound in the root
// nvidia-imex runs chrooted into, on the launcher's tmpfs over the root's
// /tmp: the paths of its configuration are these.
const ChrootStateDir = "/tmp/facet-imex"

// Programs facet-imex runs from the driver root (driverroot.Program).
var (
	imexProgram = driverroot.Program{
		Name: "nvidia-imex", Service: "IMEX", Dirs: []string{"tmp"},
		HostRootHint: "facet-imex --host-root, the host's / where the driver root is a prefix of it such as /usr/local/nvidia",
	}
	ctlProgram = driverroot.Program{
		Name: "nvidia-imex-ctl", Service: "IMEX", Dirs: []string{"tmp"},
		HostRootHint: imexProgram.HostRootHint,
	}
)

// Options are what one facet-imex serves.
type Options struct {
	// Namespace, Name and UID are the ComputeDomain's.
	Namespace, Name, UID string
	// Node is this node's name, as in the domain's status.nodes.
	Node string
	// StateDir holds the configuration, the peer list and state.json.
	StateDir string
	// Simulate runs the stand-in: no nvidia-imex.
	Simulate bool
	// DriverRoot and HostRoot are the driver's root and the host's / as
	// this process sees them (driverroot.Program.Locate).
	DriverRoot, HostRoot string
}

// domainName is "<namespace>/<name>".
func (o Options) domainName() string { return o.Namespace + "/" + o.Name }

// Daemon runs one domain's IMEX daemon on one node.
type Daemon struct {
	opts  Options
	clock clock.WithTicker
	// reloadInterval is ReloadInterval, shorter in tests.
	reloadInterval time.Duration
	// command makes nvidia-imex's command for the located layout and
	// the configuration's path inside its root; tests replace it.
	command func(l driverroot.Layout) *exec.Cmd
	// locate finds nvidia-imex and nvidia-imex-ctl; tests replace it.
	locate func(o Options) (imex, ctl driverroot.Layout, err error)

	imex, ctl driverroot.Layout
	state     State
	peers     []byte // the peer list last written; nil: none yet
	child     *exec.Cmd
	childDone chan error
	bindIP    string // the command service's address nvidia-imex started with
	// lastReload is when nvidia-imex started or was last sent SIGUSR1;
	// reloadDue, when a change waits for the window, fires then.
	lastReload time.Time
	reloadDue  clock.Timer
	reloads    int
}

// NewDaemon returns the daemon for o.
func NewDaemon(o Options) *Daemon {
	d := &Daemon{opts: o, clock: clock.RealClock{}, reloadInterval: ReloadInterval}
	d.command = d.launch
	d.locate = locatePrograms
	return d
}

// locatePrograms finds nvidia-imex and nvidia-imex-ctl under o's roots.
func locatePrograms(o Options) (imex, ctl driverroot.Layout, err error) {
	if imex, err = imexProgram.Locate(o.DriverRoot, o.HostRoot); err != nil {
		return imex, ctl, err
	}
	ctl, err = ctlProgram.Locate(o.DriverRoot, o.HostRoot)
	return imex, ctl, err
}

// launch is nvidia-imex chrooted into l.Root with the state directory at
// ChrootStateDir.
func (d *Daemon) launch(l driverroot.Layout) *exec.Cmd {
	cmd := driverroot.Command(context.Background(), chrootSpec(l, d.opts.StateDir, "-c", ChrootStateDir+"/"+ConfigName))
	cmd.Env = programEnv(l)
	return cmd
}

// chrootSpec runs l's program with args, chrooted, the state directory
// bound at ChrootStateDir.
func chrootSpec(l driverroot.Layout, stateDir string, args ...string) driverroot.Spec {
	return driverroot.Spec{
		Root: l.Root, Path: l.Path, Args: args,
		Scratch: "/tmp", ScratchName: "facet-imex",
		Binds:   []driverroot.Bind{{From: stateDir, To: ChrootStateDir}},
		Purpose: "facet-imex's state directory",
	}
}

// programEnv is a driver program's environment in its root.
func programEnv(l driverroot.Layout) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if l.LibraryPath != "" {
		env = append(env, "LD_LIBRARY_PATH="+l.LibraryPath)
	}
	return env
}

// Run serves the domain until ctx ends (nil) or nvidia-imex exits (an
// error naming its exit: the caller exits non-zero and the kubelet
// restarts the container). domains delivers the domain at each change,
// nil when it is gone; only the newest matters. Errors also: the state
// directory cannot be written, or (not simulating) nvidia-imex or
// nvidia-imex-ctl is not in the driver root.
func (d *Daemon) Run(ctx context.Context, domains *Mailbox) error {
	log := klog.FromContext(ctx)
	mode := ModeIMEX
	if d.opts.Simulate {
		mode = ModeSimulate
	}
	pid := os.Getpid()
	start, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("facet-imex's own start time: %w", err)
	}
	d.state = State{Mode: mode, PID: pid, StartTime: start, Domain: d.opts.domainName(), UID: d.opts.UID, Node: d.opts.Node,
		Reason: fmt.Sprintf("starting: waiting for ComputeDomain %s", d.opts.domainName()), Peers: []string{}}
	if err := os.MkdirAll(d.opts.StateDir, 0o755); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	// First: a state of the container's last run must not answer this
	// run's probe.
	if err := d.writeState(); err != nil {
		return err
	}
	if !d.opts.Simulate {
		if d.imex, d.ctl, err = d.locate(d.opts); err != nil {
			d.state.Reason = err.Error()
			_ = d.writeState()
			return err
		}
		log.Info("IMEX programs located", "root", d.imex.Root, "imex", d.imex.Path, "ctl", d.ctl.Path, "libraryPath", d.imex.LibraryPath)
	}
	err = d.loop(ctx, domains)
	// Whatever ended the loop, nvidia-imex ends with facet-imex.
	d.stopIMEX(ctx)
	return err
}

// loop is Run's: it returns nil when ctx ends.
func (d *Daemon) loop(ctx context.Context, domains *Mailbox) error {
	for {
		var reload <-chan time.Time
		if d.reloadDue != nil {
			reload = d.reloadDue.C()
		}
		select {
		case <-ctx.Done():
			d.state.Ready, d.state.Reason = false, "stopping"
			_ = d.writeState()
			return nil
		case err := <-d.childDone:
			d.childDone = nil
			d.state.Ready = false
			d.state.Reason = fmt.Sprintf("nvidia-imex (pid %d) exited: %v", d.child.Process.Pid, err)
			_ = d.writeState()
			return fmt.Errorf("%s; facet-imex ends with it so that the kubelet restarts the container", d.state.Reason)
		case <-reload:
			d.reloadDue = nil
			d.signalReload(ctx)
			if err := d.writeState(); err != nil {
				return err
			}
		case <-domains.Ready():
			if err := d.update(ctx, domains.Take()); err != nil {
				return err
			}
		}
	}
}

// update acts on the domain's newest version (nil: gone).
func (d *Daemon) update(ctx context.Context, cd *v1alpha1.ComputeDomain) error {
	log := klog.FromContext(ctx)
	name := d.opts.domainName()
	d.state.ResourceVersion = ""
	if cd != nil {
		d.state.ResourceVersion = cd.ResourceVersion
	}
	switch {
	case cd == nil:
		d.state.Ready = d.child != nil
		d.state.Reason = fmt.Sprintf("ComputeDomain %s is gone; the peer list stays as it was", name)
		return d.writeState()
	case string(cd.UID) != d.opts.UID:
		d.state.Ready = d.child != nil
		d.state.Reason = fmt.Sprintf("ComputeDomain %s has UID %s, not this daemon's %s (deleted and created again); the peer list stays as it was", name, cd.UID, d.opts.UID)
		return d.writeState()
	}
	peers, err := PeerList(cd.Status.Nodes, cd.Spec.NumNodes)
	if err != nil {
		// Keep the last good list: a running nvidia-imex is better
		// served by its old peers than by a list with a hole or a
		// duplicate.
		d.state.Ready = d.child != nil
		d.state.Reason = fmt.Sprintf("ComputeDomain %s: %v; the peer list stays as it was", name, err)
		return d.writeState()
	}
	changed := d.peers == nil || !bytes.Equal(peers, d.peers)
	if changed {
		if err := atomicfile.WriteWith(d.opts.StateDir, NodesName, peers, atomicfile.Options{TempPattern: tempPrefix + "*", Perm: 0o644}); err != nil {
			return fmt.Errorf("peer list: %w", err)
		}
		d.peers = peers
		d.state.Peers = strings.Fields(string(peers))
		log.Info("Peer list written", "domain", name, "peers", d.state.Peers)
	}
	if d.opts.Simulate {
		d.state.Ready, d.state.Reason = SimulatedReadiness(cd, d.opts.Node)
		return d.writeState()
	}
	own := findNode(cd, d.opts.Node)
	switch {
	case d.child == nil && own == nil:
		d.state.Reason = fmt.Sprintf("ComputeDomain %s: node %s is not in status.nodes yet; nvidia-imex starts when it is (it binds the node's address from the peer list)", name, d.opts.Node)
	case d.child == nil:
		if err := d.startIMEX(ctx, cd, own.IPAddress); err != nil {
			d.state.Reason = err.Error()
			_ = d.writeState()
			return err
		}
		d.state.Ready, d.state.Reason = true, ""
	case own != nil && own.IPAddress != d.bindIP:
		return fmt.Errorf("ComputeDomain %s: node %s's address changed from %s to %s; nvidia-imex reads its command service's address only at start, so facet-imex ends for the kubelet to restart it", name, d.opts.Node, d.bindIP, own.IPAddress)
	default:
		d.state.Ready, d.state.Reason = true, ""
		if changed {
			d.requestReload(ctx)
		}
	}
	return d.writeState()
}

// startIMEX writes the configuration and starts nvidia-imex.
func (d *Daemon) startIMEX(ctx context.Context, cd *v1alpha1.ComputeDomain, bindIP string) error {
	cfg, err := RenderConfig(ConfigData{
		Domain:    fmt.Sprintf("%s (%s)", d.opts.domainName(), cd.UID),
		StateDir:  ChrootStateDir,
		CmdBindIP: bindIP,
	})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteWith(d.opts.StateDir, ConfigName, cfg, atomicfile.Options{TempPattern: tempPrefix + "*", Perm: 0o644}); err != nil {
		return fmt.Errorf("IMEX configuration: %w", err)
	}
	cmd := d.command(d.imex)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Should facet-imex die without stopping it (SIGKILL), nvidia-imex
	// shuts down as it does on SIGTERM, telling its peers.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nvidia-imex (%s chrooted into %s): %w%s", d.imex.Path, d.imex.Root, err, driverroot.LaunchHint(err))
	}
	d.child, d.bindIP = cmd, bindIP
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	d.childDone = done
	d.lastReload = d.clock.Now()
	d.state.IMEX = &IMEXState{Root: d.ctl.Root, Ctl: d.ctl.Path, LibraryPath: d.ctl.LibraryPath, PID: cmd.Process.Pid}
	klog.FromContext(ctx).Info("nvidia-imex started", "pid", cmd.Process.Pid, "root", d.imex.Root, "path", d.imex.Path, "config", filepath.Join(d.opts.StateDir, ConfigName))
	return nil
}

// requestReload signals nvidia-imex now, or when ReloadInterval has passed
// since the last start or signal.
func (d *Daemon) requestReload(ctx context.Context) {
	if d.reloadDue != nil {
		return // the due signal will carry this change too
	}
	wait := d.reloadInterval - d.clock.Since(d.lastReload)
	if wait <= 0 {
		d.signalReload(ctx)
		return
	}
	d.reloadDue = d.clock.NewTimer(wait)
	klog.FromContext(ctx).V(2).Info("Peer list changed; SIGUSR1 waits for nvidia-imex's window", "wait", wait)
}

// signalReload sends SIGUSR1: nvidia-imex re-reads its peers and
// reconnects.
func (d *Daemon) signalReload(ctx context.Context) {
	if d.child == nil {
		return
	}
	if err := d.child.Process.Signal(syscall.SIGUSR1); err != nil {
		// It has exited: Run hears of it from childDone.
		klog.FromContext(ctx).Error(err, "SIGUSR1 to nvidia-imex failed", "pid", d.child.Process.Pid)
		return
	}
	d.lastReload = d.clock.Now()
	d.reloads++
	d.state.IMEX.Reloads = d.reloads
	klog.FromContext(ctx).Info("SIGUSR1 sent to nvidia-imex: peer list changed", "pid", d.child.Process.Pid, "peers", d.state.Peers)
}

// stopIMEX ends nvidia-imex, if it runs: SIGTERM, then SIGKILL after
// StopTimeout.
func (d *Daemon) stopIMEX(ctx context.Context) {
	if d.childDone == nil {
		return
	}
	log := klog.FromContext(ctx)
	pid := d.child.Process.Pid
	_ = d.child.Process.Signal(syscall.SIGTERM)
	t := d.clock.NewTimer(StopTimeout)
	defer t.Stop()
	select {
	case err := <-d.childDone:
		log.Info("nvidia-imex stopped", "pid", pid, "exit", err)
		return
	case <-t.C():
	}
	_ = d.child.Process.Kill()
	err := <-d.childDone
	log.Info("nvidia-imex killed: it outlived SIGTERM", "pid", pid, "timeout", StopTimeout, "exit", err)
}

// writeState writes d.state.
func (d *Daemon) writeState() error {
	if err := WriteState(d.opts.StateDir, d.state); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}
