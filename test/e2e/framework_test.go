package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/node/mps/service"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	driverName = "gpu.facet.dev"
	nodeName   = "localhost"
	namespace  = "facet-demo"
)

// env is the node started by hack/cluster/up.sh (see hack/e2e.sh).
type env struct {
	runDir, binDir, runtime, cdiDir, kubeletRoot, kubeconfig string
	repo, pluginBin, facetctl                                string
	client                                                   kubernetes.Interface
	// gates are the DRA feature gates the node runs: its version's
	// defaults (defaultGates) with hack/cluster/up.sh's FACET_FEATURE_GATES
	// applied; none is stock Kubernetes 1.35. TestMain checks them against
	// what the API server itself enforces (features.Detect).
	gates features.Set
}

var e env

func TestMain(m *testing.M) {
	e = env{
		runDir:      os.Getenv("FACET_RUN_DIR"),
		binDir:      os.Getenv("FACET_BIN_DIR"),
		runtime:     os.Getenv("FACET_RUNTIME"),
		cdiDir:      os.Getenv("FACET_CDI_DIR"),
		kubeletRoot: os.Getenv("FACET_KUBELET_ROOT"),
		kubeconfig:  os.Getenv("KUBECONFIG"),
	}
	if e.runDir == "" || e.kubeconfig == "" {
		fmt.Println("SKIP: test/e2e needs a running node; run it through `make e2e` (hack/e2e.sh)")
		os.Exit(0)
	}
	wd, _ := os.Getwd()
	e.repo = filepath.Join(wd, "..", "..")
	e.pluginBin = filepath.Join(e.repo, "bin", "facet-kubeletplugin")
	e.facetctl = filepath.Join(e.repo, "bin", "facetctl")
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		panic(err)
	}
	e.client = kubernetes.NewForConfigOrDie(cfg)
	if e.gates, err = clusterGates(context.Background(), e.client, os.Getenv("FACET_FEATURE_GATES")); err != nil {
		fmt.Printf("FAIL: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("e2e: Kubernetes %s, cluster feature gates %s\n", e.gates.ServerVersion, e.gates)
	code := m.Run()
	mpsd.stop()
	os.Exit(code)
}

// defaultGates says, per Kubernetes minor, whether the DRA gates of
// features.Gates are on by default (k8s.io/kubernetes
// pkg/features/kube_features.go of each): all four are alpha (off) in
// v1.35.4 and beta (on) in v1.36.3; in v1.37.2 DRADeviceTaints and
// DRAExtendedResource are GA (on; DRAExtendedResource locked on) and
// DRAPartitionableDevices and DRAConsumableCapacity still beta and on. A
// minor missing here is one the e2e suite has not been run on.
var defaultGates = map[string]bool{"1.35": false, "1.36": true, "1.37": true}

// clusterGates is what the node's cluster should enforce: its version's
// defaults with the gates hack/cluster/up.sh was given (FACET_FEATURE_GATES)
// applied. It asks the API server for its version, and checks the result
// against what the server keeps of gated fields (features.Detect), so that
// a node that runs other gates than the suite assumes fails here instead of
// skipping or misjudging the gated tests. An error names the difference.
func clusterGates(ctx context.Context, client kubernetes.Interface, flag string) (features.Set, error) {
	overrides, err := features.ParseOverrides(flag)
	if err != nil {
		return features.Set{}, err
	}
	detected, err := features.Detect(ctx, client, nodeName)
	if err != nil {
		return features.Set{}, fmt.Errorf("asking the API server which DRA gates it enforces: %w", err)
	}
	v, err := utilversion.ParseSemantic(detected.ServerVersion)
	if err != nil {
		return features.Set{}, fmt.Errorf("API server version: %w", err)
	}
	minor := fmt.Sprintf("%d.%d", v.Major(), v.Minor())
	on, ok := defaultGates[minor]
	if !ok {
		return features.Set{}, fmt.Errorf("Kubernetes %s: no default DRA gates known for %s; add them to defaultGates from its pkg/features/kube_features.go", detected.ServerVersion, minor)
	}
	source := "defaults of " + minor
	want := features.Stock(source)
	if on {
		want = features.AllOn(source)
	}
	want = want.Apply(overrides)
	want.ServerVersion = detected.ServerVersion
	if !want.Equal(detected) {
		return features.Set{}, fmt.Errorf("Kubernetes %s should enforce %s (%s with FACET_FEATURE_GATES=%q) but its API server enforces %s",
			detected.ServerVersion, want, source, flag, detected)
	}
	return want, nil
}

// needGates skips a test whose modes the node's cluster does not enforce:
// the plugin refuses to start in them (TestStock covers that cluster).
func needGates(t testing.TB, gates ...features.Gate) {
	t.Helper()
	if missing := e.gates.Missing(gates...); len(missing) > 0 {
		t.Skipf("needs %v, off on this cluster (%s)", missing, e.gates)
	}
}

// mpsHost is the node's facet-mps, as the chart's MPS DaemonSet runs it:
// one per node, started with the first plugin and left running across
// plugin processes, as it is across plugin pods. Unlike the chart's pod,
// the daemons it starts outlive it (no container to take them along).
type mpsHost struct {
	cmd *exec.Cmd
	log string
}

var (
	mpsd     *mpsHost
	mpsdRuns int
)

// ensureMPSHost starts facet-mps unless it runs.
func ensureMPSHost(t testing.TB) {
	t.Helper()
	if mpsd != nil && !mpsd.exited() {
		return
	}
	mpsd = startMPSHost(t)
}

// startMPSHost starts facet-mps on the node's MPS directory and simulated
// driver root, and waits until it answers. Each GPU's /dev/shm is 16 MiB,
// so that a test fills one quickly.
func startMPSHost(t testing.TB) *mpsHost {
	t.Helper()
	mpsdRuns++
	log := filepath.Join(e.runDir, "logs", fmt.Sprintf("facet-mps-e2e-%d.log", mpsdRuns))
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.repo, "bin", "facet-mps"),
		"--driver-root", filepath.Join(e.runDir, "driver-root"),
		"--mps-dir", filepath.Join(e.runDir, "mps"),
		"--shm-size", mpsShmSize,
		"-v", "4")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &mpsHost{cmd: cmd, log: log}
	client := service.NewClient(filepath.Join(e.runDir, "mps"))
	waitFor(t, "facet-mps answering on its socket", 30*time.Second, func() (bool, error) {
		if h.exited() {
			b, _ := os.ReadFile(log)
			t.Fatalf("facet-mps exited:\n%s", b)
		}
		_, err := client.Info(context.Background())
		return err == nil, err
	})
	return h
}

// mpsShmSize is the e2e node's --shm-size.
const mpsShmSize = "16Mi"

func (h *mpsHost) exited() bool {
	return h.cmd.ProcessState != nil || h.cmd.Process.Signal(syscall.Signal(0)) != nil
}

// stop ends facet-mps (SIGTERM); the daemons stay, as the simulated node
// has no container to take them along.
func (h *mpsHost) stop() {
	if h == nil || h.cmd.ProcessState != nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	_ = h.cmd.Wait()
}

func (h *mpsHost) logText() string {
	b, _ := os.ReadFile(h.log)
	return string(b)
}

// plugin is a running facet-kubeletplugin.
type plugin struct {
	cmd *exec.Cmd
	log string
}

var pluginRuns int

func startPlugin(t testing.TB, machine string, extra ...string) *plugin {
	t.Helper()
	return startPluginEnv(t, machine, nil, extra...)
}

// startPluginEnv starts the plugin with extra environment variables.
func startPluginEnv(t testing.TB, machine string, env []string, extra ...string) *plugin {
	t.Helper()
	return launchPlugin(t, machine, env, false, extra...)
}

// startPluginAlone starts the plugin with no facet-mps on the node (one
// that runs is stopped first), and waits until it is ready.
func startPluginAlone(t testing.TB, machine string, extra ...string) *plugin {
	t.Helper()
	mpsd.stop()
	return launch(t, machine, nil, false, false, extra...)
}

// launchPlugin starts the plugin and, unless noWait, waits until it is
// ready; with noWait, for a plugin expected to refuse its configuration.
// facet-mps is started beside it unless it runs, as the chart runs it.
func launchPlugin(t testing.TB, machine string, env []string, noWait bool, extra ...string) *plugin {
	t.Helper()
	return launch(t, machine, env, noWait, true, extra...)
}

func launch(t testing.TB, machine string, env []string, noWait, withMPS bool, extra ...string) *plugin {
	t.Helper()
	pluginRuns++
	log := filepath.Join(e.runDir, "logs", fmt.Sprintf("facet-plugin-e2e-%d.log", pluginRuns))
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	// A private mount namespace, where the plugin binds the simulated
	// /proc/driver/nvidia-caps that nvcdi reads for MIG devices.
	bin := e.pluginBin
	for _, kv := range env {
		if strings.HasPrefix(kv, "FACET_FAILPOINT=") {
			// Failpoints are compiled into this build only.
			bin = filepath.Join(e.repo, "bin", "failpoints", "facet-kubeletplugin")
			if _, err := os.Stat(bin); err != nil {
				t.Fatalf("%v: the plugin with failpoints is built by make build (go build -tags facet_failpoints)", err)
			}
		}
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", bin,
		"--node-name", nodeName,
		"--kubeconfig", e.kubeconfig,
		"--machine", filepath.Join(e.repo, "demo", "machines", machine+".yaml"),
		"--driver-root", filepath.Join(e.runDir, "driver-root"),
		"--nvidia-cdi-hook", filepath.Join(e.repo, "bin", "nvidia-cdi-hook"),
		"--cdi-dir", e.cdiDir,
		"--state-dir", filepath.Join(e.runDir, "facet-state"),
		"--kubelet-registrar-dir", filepath.Join(e.kubeletRoot, "plugins_registry"),
		"--kubelet-plugins-dir", filepath.Join(e.kubeletRoot, "plugins"),
		"--hami-library", filepath.Join(e.runDir, "hami", "libvgpu.so"),
		// MPS daemons' directories in the run directory, which
		// hack/cluster/down.sh cleans up.
		"--mps-dir", filepath.Join(e.runDir, "mps"),
		// Any free port; waitReady reads it from the log.
		"--health-addr", "127.0.0.1:0",
		"-v", "4",
	)
	cmd.Args = append(cmd.Args, extra...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &plugin{cmd: cmd, log: log}
	t.Cleanup(func() { p.stop() })
	if withMPS {
		ensureMPSHost(t)
	}
	if !noWait {
		p.waitReady(t)
	}
	return p
}

var healthAddrRE = regexp.MustCompile(`"Serving health probes" addr="([^"]+)"`)

// waitReady waits until the plugin's /readyz answers 200: the kubelet has
// registered it and the API server holds all its slices. Pods created
// before that meet "driver not registered" and the kubelet's back-off
// (up to 80 s was seen), the flake this avoids.
func (p *plugin) waitReady(t testing.TB) {
	t.Helper()
	start := time.Now()
	client := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, "plugin registered with the kubelet and slices published (/readyz)", 2*time.Minute, func() (bool, error) {
		if p.exited() {
			t.Fatalf("the plugin exited before it was ready:\n%s", p.logText())
		}
		m := healthAddrRE.FindStringSubmatch(p.logText())
		if m == nil {
			return false, fmt.Errorf("no health address in the log yet")
		}
		resp, err := client.Get("http://" + m[1] + "/readyz")
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("/readyz %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	})
	t.Logf("plugin ready (registered, slices published) %s after start", time.Since(start).Round(time.Millisecond))
}

// exited reports whether the plugin's process has ended, without reaping it.
func (p *plugin) exited() bool {
	if p.cmd.ProcessState != nil {
		return true
	}
	// Signal 0: does the process (or a zombie of it) exist?
	return p.cmd.Process.Signal(syscall.Signal(0)) != nil
}

// kill sends SIGKILL: no chance to clean up, as in a node crash or OOM kill.
func (p *plugin) kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
}

func (p *plugin) stop() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
		}
	}
}

func (p *plugin) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	testenv.WaitFor(t, what, timeout, cond)
}

func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := kubectlErr(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlErr(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(e.binDir, "kubectl"), append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

func ourSlices(t testing.TB) []resourceapi.ResourceSlice {
	t.Helper()
	sel := fields.Set{"spec.driver": driverName, "spec.nodeName": nodeName}.AsSelector().String()
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func waitPodRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, "pod "+name+" Running", 3*time.Minute, func() (bool, error) {
		var err error
		pod, err = e.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", pod.Status.Phase, pod.Status.Conditions)
	})
	return pod
}

// podClaims returns the allocated claims of a pod, by the pod's claim name.
func podClaims(t *testing.T, pod *corev1.Pod) map[string]*resourceapi.ResourceClaim {
	t.Helper()
	out := map[string]*resourceapi.ResourceClaim{}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		c, err := e.client.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), *s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[s.Name] = c
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// applyYAML applies a manifest given inline.
func applyYAML(t testing.TB, manifest string) {
	t.Helper()
	// Not t.TempDir(): it holds the test's name, and kubectl -f splits a
	// path at commas.
	dir, err := os.MkdirTemp("", "facet-e2e-manifest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", path)
}

// deleteNamespaceAtEnd deletes the demo namespace when t ends. Register it
// after the last plugin has been started on t: cleanups run last-in
// first-out, and the kubelet needs a plugin to unprepare the pods' claims.
func deleteNamespaceAtEnd(t testing.TB) {
	t.Cleanup(func() {
		// The pods first, and waited for: left to the namespace
		// controller, which polls for them with back-off, a test's
		// cleanup took about 11 s; this way about 10 s (4 s for the
		// pods, 5 s for the rest of the namespace).
		start := time.Now()
		_, _ = kubectlErr("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=180s")
		t.Logf("pods deleted in %s", time.Since(start).Round(time.Millisecond))
		_, _ = kubectlErr("delete", "namespace", namespace, "--wait=true", "--timeout=180s")
		t.Logf("namespace deleted in %s", time.Since(start).Round(time.Millisecond))
	})
}

// setupNamespace applies the DeviceClasses and a fresh demo namespace,
// first waiting out a namespace an earlier test left terminating.
func setupNamespace(t testing.TB) {
	t.Helper()
	waitFor(t, "namespace "+namespace+" gone", 3*time.Minute, func() (bool, error) {
		ns, err := e.client.CoreV1().Namespaces().Get(context.Background(), namespace, metav1.GetOptions{})
		return err != nil || ns.DeletionTimestamp == nil, err
	})
	kubectl(t, "apply", "-f", filepath.Join(e.repo, "deployments", "deviceclasses.yaml"))
	kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "gpu", "namespace.yaml"))
}

// claimPod is the manifest of a ResourceClaimTemplate called name with one
// request (YAML flow mappings for `name` and `exactly`) and a busybox pod in
// the demo namespace that uses it.
func claimPod(name, request string) string {
	return strings.NewReplacer("NAME", name, "REQUEST", request).Replace(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: NAME, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - REQUEST
---
`) + testenv.ClaimPod(name, "facet-demo", "req", name)
}
