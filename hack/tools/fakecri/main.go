// Command fakecri serves k8s.io/cri-client's in-memory fake CRI runtime on a
// unix socket, so a real kubelet can run pods without containerd.
//
// It is used by hack/cluster/up.sh (RUNTIME=fake) and hack/cluster/add-node.sh.
// Containers do not run: the fake only records them, except in exec mode
// (below). What matters to Facet's fast end-to-end tests is which CDI
// devices the kubelet asked the runtime for, so every CreateContainer
// request is appended to a JSON-lines log (--cdi-log):
//
//	{"time":"...","namespace":"default","pod":"p","podUID":"...","container":"c",
//	 "sandboxID":"...","cdiDevices":["gpu.facet.dev/gpu=gpu-0"],"annotations":{...}}
//
// Exec mode (--exec-images): the containers of images that match one of
// the patterns (path.Match, e.g. "facet.local/facet:*-sim") run for real,
// as processes on this host, so a daemon the cluster deploys (facet-imex's
// stand-in) really runs, crashes and is restarted by the kubelet. The
// contract, simpler than a container's:
//   - the command is the container's command and args (the kubelet has
//     expanded $(VAR) in them); the program is the file of the command's
//     base name in --exec-bin-dir (the image's binaries are Facet's own,
//     built there); a container without a command is refused, as the fake
//     knows no image entrypoint;
//   - the environment is the container's (the kubelet has resolved
//     fieldRefs), then --exec-env's, and PATH with --exec-bin-dir first;
//   - mounts are not made: an argument or an environment value that is a
//     path under a mount's container path (or "--flag=<such a path>")
//     becomes that path under the mount's host path. A program that opens
//     a fixed path (the service account token) cannot be served: give it
//     what it needs through --exec-env (e.g. KUBECONFIG);
//   - the process is its own process group, killed with fakecri;
//     StopContainer sends SIGTERM and SIGKILL after the kubelet's grace
//     period, RemoveContainer and StopPodSandbox SIGKILL; its output goes
//     to --exec-log-dir/<namespace>_<pod>_<container>_<attempt>.log;
//   - ContainerStatus reports its exit (exit code, reason Error or
//     Completed), so the kubelet restarts it as a container;
//   - ExecSync (exec probes, kubectl exec) runs the command the same way
//     as another process, with the container's environment and mounts,
//     and returns its output and exit code.
//
// The containers of every other image never run, as before.
//
// Facts it relies on (docs/design/local-cluster.md):
//   - the fake image size must be non-zero, or the kubelet reports ImageInspectError;
//   - the image filesystem must report a mountpoint that exists;
//   - images named with imagePullPolicy: Never must be preloaded.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// Labels the kubelet puts on every container config (pkg/kubelet/types/labels.go).
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// cdiRecord is one line of the --cdi-log file.
type cdiRecord struct {
	Time        string            `json:"time"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUID"`
	Container   string            `json:"container"`
	SandboxID   string            `json:"sandboxID"`
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
}

// runtime wraps the fake so CreateContainer can be logged and exec mode's
// containers run; every other CRI call goes straight to the embedded fake.
type runtime struct {
	*fake.RemoteRuntime

	mu     sync.Mutex
	cdiLog *os.File

	// exec is exec mode; nil when off.
	exec *execMode
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if err := r.logCreate(req); err != nil {
		// Losing a record would make tests assert on wrong data: fail the call
		// loudly instead, the kubelet will retry and the log shows why.
		log.Printf("writing CDI log: %v", err)
		return nil, fmt.Errorf("fakecri: writing CDI log: %w", err)
	}
	var ec *execContainer
	if r.exec != nil && r.exec.matches(req.GetConfig().GetImage().GetImage()) {
		var err error
		if ec, err = r.exec.prepare(req); err != nil {
			log.Printf("CreateContainer: %v", err)
			return nil, err
		}
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err == nil && ec != nil {
		ec.id = resp.GetContainerId()
		r.exec.add(ec)
	}
	return resp, err
}

func (r *runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	if r.exec != nil {
		if ec := r.exec.get(req.GetContainerId()); ec != nil {
			return &runtimeapi.StartContainerResponse{}, r.exec.start(ctx, ec)
		}
	}
	return r.RemoteRuntime.StartContainer(ctx, req)
}

func (r *runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if r.exec != nil {
		if ec := r.exec.get(req.GetContainerId()); ec != nil {
			ec.stop(time.Duration(req.GetTimeout()) * time.Second)
		}
	}
	return r.RemoteRuntime.StopContainer(ctx, req)
}

func (r *runtime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	if r.exec != nil {
		if ec := r.exec.remove(req.GetContainerId()); ec != nil {
			ec.stop(0)
		}
	}
	return r.RemoteRuntime.RemoveContainer(ctx, req)
}

func (r *runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	if r.exec != nil {
		// The kubelet stops a pod's containers first; a sandbox stopped
		// without that (a pod force-deleted) still leaves no process.
		for _, ec := range r.exec.ofSandbox(req.GetPodSandboxId()) {
			ec.stop(0)
		}
	}
	return r.RemoteRuntime.StopPodSandbox(ctx, req)
}

func (r *runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if r.exec != nil {
		if ec := r.exec.get(req.GetContainerId()); ec != nil {
			return r.exec.execSync(ctx, ec, req)
		}
	}
	return r.RemoteRuntime.ExecSync(ctx, req)
}

// execMode runs the containers of matching images as host processes (see
// the package's documentation).
type execMode struct {
	// images are path.Match patterns of image names.
	images []string
	// binDir holds the programs; logDir their output.
	binDir, logDir string
	// env is added to every process's environment.
	env []string
	// fake is the runtime whose container states the processes' exits
	// update.
	fake *fake.RemoteRuntime

	mu         sync.Mutex
	containers map[string]*execContainer
}

// execContainer is one container of exec mode.
type execContainer struct {
	id, sandboxID, name string
	// argv and env are the process's, resolved and rewritten; mounts
	// rewrite ExecSync's commands.
	argv, env []string
	mounts    []*runtimeapi.Mount
	dir       string
	logPath   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited and its state is recorded
}

// matches says whether image runs in exec mode.
func (m *execMode) matches(image string) bool {
	for _, p := range m.images {
		if ok, _ := path.Match(p, image); ok {
			return true
		}
	}
	return false
}

// program is the file in binDir of argv0's base name. The error names
// the image's command and the directory.
func (m *execMode) program(argv0 string) (string, error) {
	p := filepath.Join(m.binDir, filepath.Base(argv0))
	st, err := os.Stat(p)
	if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("command %q: no program %s in --exec-bin-dir %s", argv0, filepath.Base(argv0), m.binDir)
	}
	return p, nil
}

// rewrite maps s, a path under one of mounts' container paths (or
// "--flag=<path>"), to the mount's host path; anything else stays.
func rewrite(s string, mounts []*runtimeapi.Mount) string {
	prefix, p := "", s
	if i := strings.Index(s, "="); i >= 0 && strings.HasPrefix(s[i+1:], "/") {
		prefix, p = s[:i+1], s[i+1:]
	}
	if !strings.HasPrefix(p, "/") {
		return s
	}
	// The deepest mount wins, as it does in a container.
	best := -1
	for i, mt := range mounts {
		cp := filepath.Clean(mt.GetContainerPath())
		if (p == cp || strings.HasPrefix(p, strings.TrimSuffix(cp, "/")+"/")) && (best < 0 || len(cp) > len(filepath.Clean(mounts[best].GetContainerPath()))) {
			best = i
		}
	}
	if best < 0 {
		return s
	}
	cp := filepath.Clean(mounts[best].GetContainerPath())
	return prefix + mounts[best].GetHostPath() + strings.TrimPrefix(p, cp)
}

// command resolves and rewrites a container's or an exec's command line.
func (m *execMode) command(cmdline []string, mounts []*runtimeapi.Mount) ([]string, error) {
	if len(cmdline) == 0 || cmdline[0] == "" {
		return nil, errors.New("no command: the fake runtime knows no image entrypoint")
	}
	prog, err := m.program(cmdline[0])
	if err != nil {
		return nil, err
	}
	argv := []string{prog}
	for _, a := range cmdline[1:] {
		argv = append(argv, rewrite(a, mounts))
	}
	return argv, nil
}

// prepare checks a container's command and works out its process. The
// error names the image and the container.
func (m *execMode) prepare(req *runtimeapi.CreateContainerRequest) (*execContainer, error) {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	ec := &execContainer{
		sandboxID: req.GetPodSandboxId(),
		name:      fmt.Sprintf("%s_%s_%s_%d", labels[labelPodNamespace], labels[labelPodName], cfg.GetMetadata().GetName(), cfg.GetMetadata().GetAttempt()),
		mounts:    cfg.GetMounts(),
		dir:       "/",
	}
	argv, err := m.command(append(slices.Clone(cfg.GetCommand()), cfg.GetArgs()...), ec.mounts)
	if err != nil {
		return nil, fmt.Errorf("fakecri exec mode: image %s, container %s: %w", cfg.GetImage().GetImage(), ec.name, err)
	}
	ec.argv = argv
	ec.env = []string{"PATH=" + m.binDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, kv := range cfg.GetEnvs() {
		ec.env = append(ec.env, kv.GetKey()+"="+rewrite(kv.GetValue(), ec.mounts))
	}
	ec.env = append(ec.env, m.env...)
	if wd := cfg.GetWorkingDir(); wd != "" {
		if hp := rewrite(wd, ec.mounts); hp != wd {
			ec.dir = hp
		}
	}
	ec.logPath = filepath.Join(m.logDir, ec.name+".log")
	return ec, nil
}

func (m *execMode) add(ec *execContainer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.containers[ec.id] = ec
}

func (m *execMode) get(id string) *execContainer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.containers[id]
}

func (m *execMode) remove(id string) *execContainer {
	m.mu.Lock()
	defer m.mu.Unlock()
	ec := m.containers[id]
	delete(m.containers, id)
	return ec
}

func (m *execMode) ofSandbox(id string) []*execContainer {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*execContainer
	for _, ec := range m.containers {
		if ec.sandboxID == id {
			out = append(out, ec)
		}
	}
	return out
}

// all is every container, for the shutdown.
func (m *execMode) all() []*execContainer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*execContainer, 0, len(m.containers))
	for _, ec := range m.containers {
		out = append(out, ec)
	}
	return out
}

// start starts ec's process and marks the container running; when the
// process exits, the container is exited with its code.
func (m *execMode) start(ctx context.Context, ec *execContainer) error {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.cmd != nil {
		return fmt.Errorf("fakecri: container %s was started already", ec.id)
	}
	out, err := os.OpenFile(ec.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("fakecri: container %s's log: %w", ec.id, err)
	}
	cmd := exec.Command(ec.argv[0], ec.argv[1:]...)
	cmd.Args[0] = filepath.Base(ec.argv[0])
	cmd.Env, cmd.Dir = ec.env, ec.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own group, to be killed whole; and killed with fakecri.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("fakecri: start %s for container %s: %w", ec.argv[0], ec.name, err)
	}
	if _, err := m.fake.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ec.id}); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		out.Close()
		return err
	}
	ec.cmd, ec.done = cmd, make(chan struct{})
	log.Printf("exec mode: container %s (%s) runs as pid %d: %q", ec.name, ec.id, cmd.Process.Pid, ec.argv)
	go func() {
		err := cmd.Wait()
		out.Close()
		code, reason := int32(0), "Completed"
		if err != nil {
			reason, code = "Error", 128
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int32(ws.Signal())
				} else {
					code = int32(ee.ExitCode())
				}
			}
		}
		rs := m.fake.RuntimeService
		rs.Lock()
		if c := rs.Containers[ec.id]; c != nil && c.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.FinishedAt = time.Now().UnixNano()
			c.ExitCode = code
			c.Reason = reason
			c.Message = fmt.Sprintf("fakecri exec mode: pid %d: %v", cmd.Process.Pid, err)
		}
		rs.Unlock()
		log.Printf("exec mode: container %s (%s), pid %d, exited: %v (exit code %d)", ec.name, ec.id, cmd.Process.Pid, err, code)
		close(ec.done)
	}()
	return nil
}

// stop ends ec's process: SIGTERM to its group, SIGKILL after grace (at
// once for 0), and waits for it.
func (ec *execContainer) stop(grace time.Duration) {
	ec.mu.Lock()
	cmd, done := ec.cmd, ec.done
	ec.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	if grace > 0 {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
			return
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// running says whether ec's process runs.
func (ec *execContainer) running() bool {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.cmd == nil {
		return false
	}
	select {
	case <-ec.done:
		return false
	default:
		return true
	}
}

// execSync runs req's command as a process beside ec's, as a container
// runtime runs it in the container: its environment and mounts.
func (m *execMode) execSync(ctx context.Context, ec *execContainer, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if !ec.running() {
		return nil, fmt.Errorf("fakecri: container %s is not running", ec.id)
	}
	argv, err := m.command(req.GetCmd(), ec.mounts)
	if err != nil {
		return nil, fmt.Errorf("fakecri exec mode: exec in container %s: %w", ec.name, err)
	}
	if t := req.GetTimeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Second)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Args[0] = filepath.Base(argv[0])
	cmd.Env, cmd.Dir = ec.env, ec.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, fmt.Errorf("fakecri: exec %q in container %s: %w", req.GetCmd(), ec.name, ctx.Err())
	case errors.As(err, &ee):
	default:
		return nil, fmt.Errorf("fakecri: exec %q in container %s: %w", req.GetCmd(), ec.name, err)
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: int32(cmd.ProcessState.ExitCode())}, nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (r *runtime) logCreate(req *runtimeapi.CreateContainerRequest) error {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	rec := cdiRecord{
		Time:        time.Now().UTC().Format(time.RFC3339Nano),
		Namespace:   labels[labelPodNamespace],
		Pod:         labels[labelPodName],
		PodUID:      labels[labelPodUID],
		Container:   labels[labelContainerName],
		SandboxID:   req.GetPodSandboxId(),
		CDIDevices:  []string{},
		Annotations: cfg.GetAnnotations(),
	}
	if rec.Container == "" {
		rec.Container = cfg.GetMetadata().GetName()
	}
	if rec.Annotations == nil {
		rec.Annotations = map[string]string{}
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	log.Printf("CreateContainer %s/%s/%s cdiDevices=%v", rec.Namespace, rec.Pod, rec.Container, rec.CDIDevices)
	if r.cdiLog == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.cdiLog.Write(append(line, '\n')); err != nil {
		return err
	}
	return r.cdiLog.Sync()
}

func main() {
	var (
		socket    = flag.String("socket", "/run/facet/fakecri.sock", "unix socket to serve the CRI on")
		cdiLog    = flag.String("cdi-log", "", "append one JSON line per CreateContainer (CDI devices, annotations) to this file")
		imageFS   = flag.String("image-fs", "/", "existing directory reported as the image filesystem mountpoint")
		images    = flag.String("images", "facet.local/busybox:1,registry.k8s.io/pause:3.10", "comma-separated images to preload (for imagePullPolicy: Never)")
		imageSize = flag.Uint64("image-size", 1<<20, "size in bytes reported for every image (must be > 0)")
		execImgs  = flag.String("exec-images", "", "comma-separated image patterns (path.Match, e.g. 'facet.local/facet:*-sim') whose containers run as host processes (exec mode); empty: none")
		execBin   = flag.String("exec-bin-dir", "", "exec mode: the directory of the programs that containers' commands name (by base name)")
		execLogs  = flag.String("exec-log-dir", "", "exec mode: the directory of the processes' output, one file per container")
		execEnv   stringList
	)
	flag.Var(&execEnv, "exec-env", "exec mode: KEY=VALUE added to every process's environment (repeatable), e.g. KUBECONFIG=...")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	if *imageSize == 0 {
		log.Fatal("--image-size must be > 0: the kubelet reports ImageInspectError for size 0")
	}
	if st, err := os.Stat(*imageFS); err != nil || !st.IsDir() {
		log.Fatalf("--image-fs %q must be an existing directory (kubelet stats it): %v", *imageFS, err)
	}

	fr := fake.NewFakeRemoteRuntime()
	fr.ImageService.SetFakeImageSize(*imageSize)
	var preload []string
	for _, img := range strings.Split(*images, ",") {
		if img = strings.TrimSpace(img); img != "" {
			preload = append(preload, img)
		}
	}
	fr.ImageService.SetFakeImages(preload)
	now := time.Now().UnixNano()
	fsUsage := func() []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{
			Timestamp:  now,
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: *imageFS},
			UsedBytes:  &runtimeapi.UInt64Value{Value: *imageSize * uint64(len(preload))},
			InodesUsed: &runtimeapi.UInt64Value{Value: uint64(len(preload))},
		}}
	}
	fr.ImageService.SetFakeFilesystemUsage(fsUsage())
	fr.ImageService.SetFakeContainerFilesystemUsage(fsUsage())
	fr.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	// The kubelet asks the runtime for its cgroup driver; match the kubelet config.
	fr.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}

	rt := &runtime{RemoteRuntime: fr}
	if *execImgs != "" {
		em, err := newExecMode(fr, *execImgs, *execBin, *execLogs, execEnv)
		if err != nil {
			log.Fatal(err)
		}
		rt.exec = em
	}
	if *cdiLog != "" {
		if err := os.MkdirAll(filepath.Dir(*cdiLog), 0o755); err != nil {
			log.Fatal(err)
		}
		f, err := os.OpenFile(*cdiLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		rt.cdiLog = f
	}

	// fake.RemoteRuntime.Start registers the fake itself on its own gRPC
	// server; we need our CreateContainer, so we serve the wrapper instead.
	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", *socket, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	runtimeapi.RegisterImageServiceServer(srv, rt)

	// The fakes record every call in an unbounded Called slice; clear it now
	// and then so a long-running demo does not grow without limit.
	go func() {
		for range time.Tick(time.Minute) {
			fr.RuntimeService.Lock()
			fr.RuntimeService.Called = nil
			fr.RuntimeService.Unlock()
			fr.ImageService.Lock()
			fr.ImageService.Called = nil
			fr.ImageService.Unlock()
		}
	}()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.Stop()
	}()

	log.Printf("fake CRI serving on %s (images %v, image fs %s, cdi log %q, exec images %q)", *socket, preload, *imageFS, *cdiLog, *execImgs)
	err = srv.Serve(lis)
	if rt.exec != nil {
		// No process outlives fakecri.
		for _, ec := range rt.exec.all() {
			ec.stop(0)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
}

// newExecMode checks exec mode's flags. Errors name the flag.
func newExecMode(fr *fake.RemoteRuntime, images, binDir, logDir string, env []string) (*execMode, error) {
	m := &execMode{binDir: binDir, logDir: logDir, fake: fr, containers: map[string]*execContainer{}}
	for _, p := range strings.Split(images, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("--exec-images %q: %w", p, err)
		}
		m.images = append(m.images, p)
	}
	for flagName, dir := range map[string]string{"--exec-bin-dir": binDir, "--exec-log-dir": logDir} {
		if dir == "" || !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("%s %q: exec mode needs an absolute directory", flagName, dir)
		}
	}
	if st, err := os.Stat(binDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("--exec-bin-dir %s: not a directory (%v)", binDir, err)
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("--exec-log-dir: %w", err)
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("--exec-env %q: want KEY=VALUE", kv)
		}
	}
	m.env = env
	return m, nil
}
