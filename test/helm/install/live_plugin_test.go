// Package install installs the chart with Helm's install action into the
// local node. A package of its own: Helm's action package links Go's
// plugin package, which makes the test binary bind every symbol at load
// time (BIND_NOW), and go-nvml's unresolved NVML symbols, which the chart
// tests' imports of pkg/inventory bring, then fail to load.
package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

const chartDir = "../../../deployments/helm/facet"

type live struct {
	kubeconfig, kubectl, runDir string
	client                      kubernetes.Interface
}

func liveCluster(t *testing.T) *live {
	t.Helper()
	l := &live{kubeconfig: os.Getenv("KUBECONFIG"), runDir: os.Getenv("FACET_RUN_DIR")}
	if l.kubeconfig == "" || l.runDir == "" || os.Getenv("FACET_BIN_DIR") == "" {
		t.Skip("needs the local node of hack/e2e.sh (KUBECONFIG, FACET_RUN_DIR, FACET_BIN_DIR)")
	}
	l.kubectl = filepath.Join(os.Getenv("FACET_BIN_DIR"), "kubectl")
	cfg, err := clientcmd.BuildConfigFromFlags("", l.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	l.client = kubernetes.NewForConfigOrDie(cfg)
	return l
}

func (l *live) run(stdin string, args ...string) (string, error) {
	cmd := exec.Command(l.kubectl, append([]string{"--kubeconfig", l.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

func (l *live) must(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := l.run(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (l *live) namespace(t *testing.T, name string) {
	t.Helper()
	l.must(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+name+"}\n", "apply", "-f", "-")
	t.Cleanup(func() { l.run("", "delete", "namespace", name, "--wait=true", "--timeout=120s") })
}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart %s: %v", chartDir, err)
	}
	return c
}

func values(t testing.TB, y string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &v); err != nil {
		t.Fatalf("values %q: %v", y, err)
	}
	return v
}

// simImageArchive is the demo's image (hack/image.sh --sim): the plugin
// built with the simulator, and the demo's machine files in
// /usr/share/facet/machines.
func simImageArchive() string {
	if p := os.Getenv("FACET_SIM_IMAGE_ARCHIVE"); p != "" {
		return p
	}
	return filepath.Join("..", "..", "..", "_output", "facet-image-sim.tar")
}

// TestLiveChartPlugin installs the chart with Helm's install action into
// the local node, with the simulator image imported into its containerd:
// the DaemonSet's pod registers with the kubelet and publishes the node's
// slices, a pod's whole-GPU claim is prepared through it (CDI spec, the
// container runs), and unprepared when the pod goes.
func TestLiveChartPlugin(t *testing.T) {
	l := liveCluster(t)
	archive := simImageArchive()
	if _, err := os.Stat(archive); err != nil {
		t.Skipf("no simulator image %s: build it with `make image-sim` (hack/image.sh --sim)", archive)
	}
	runDir, kubeletRoot, cdiDir, sock := l.runDir, os.Getenv("FACET_KUBELET_ROOT"), os.Getenv("FACET_CDI_DIR"), os.Getenv("FACET_CRI_SOCKET")
	if os.Getenv("FACET_RUNTIME") != "containerd" || kubeletRoot == "" || cdiDir == "" || sock == "" {
		t.Skip("needs the local node with RUNTIME=containerd (FACET_RUNTIME, FACET_KUBELET_ROOT, FACET_CDI_DIR, FACET_CRI_SOCKET)")
	}
	if _, err := os.Stat(filepath.Join(runDir, "driver-root", "dev")); err != nil {
		t.Skipf("no simulated driver root (hack/sim-node.sh): %v", err)
	}
	repo, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()

	ch := loadChart(t)
	image := "facet.local/facet:" + ch.Metadata.AppVersion + "-sim"
	ctr := filepath.Join(os.Getenv("FACET_BIN_DIR"), "ctr")
	if out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", archive, err, out)
	}
	t.Logf("imported %s (%s)", image, time.Since(start).Round(time.Millisecond))

	// A host-process plugin of test/e2e may have left this node's slices;
	// the DaemonSet's plugin must publish its own.
	l.run("", "delete", "resourceslices", "--field-selector", "spec.driver=gpu.facet.dev,spec.nodeName=localhost", "--wait=true")
	l.must(t, "", "apply", "-f", filepath.Join(repo, "deployments", "deviceclasses.yaml"))

	// The chart mounts the driver root with HostToContainer propagation
	// (the GPU Operator mounts it after boot), which containerd refuses
	// on a private mount: make the simulated root a shared mount of its own.
	driverRoot := filepath.Join(runDir, "driver-root")
	for _, args := range [][]string{{"--bind", driverRoot, driverRoot}, {"--make-rshared", driverRoot}} {
		if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", driverRoot).Run() })

	const ns, release = "facet-chart-live", "facet"
	l.namespace(t, ns)
	stateDir := filepath.Join(runDir, "facet-state-chart")
	os.RemoveAll(stateDir)
	vals := values(t, fmt.Sprintf(`
image: {repository: facet.local/facet, tag: %q, pullPolicy: Never}
# Installed by the test from deployments/ (Helm adopts no existing objects).
deviceClasses: {enabled: false}
admission:
  policies: {enabled: false}
  webhook: {enabled: false}
kubeletPlugin:
  # The node's pods have only a loopback network and there is no
  # kube-proxy: the plugin reaches the API server on the host's 127.0.0.1.
  hostNetwork: true
  extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
  - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
  kubeletDir: %q
  cdiDir: %q
  stateDir: %q
  driver: {root: %q, devRoot: %q, nvidiaCDIHookPath: %q}
  hamiCore: {enabled: false}
  logVerbosity: 4
  nodeGroups:
    default:
      mode: exclusive
      extraArgs: [--machine=/usr/share/facet/machines/dgx-h100.yaml]
`, ch.Metadata.AppVersion+"-sim", kubeletRoot, cdiDir, stateDir,
		filepath.Join(runDir, "driver-root"), filepath.Join(runDir, "driver-root"), filepath.Join(repo, "bin", "nvidia-cdi-hook")))

	kubeconfig, namespace := l.kubeconfig, ns
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &kubeconfig, &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(getter, ns, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.Timeout = release, ns, 2*time.Minute
	rel, err := install.Run(ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("helm install: release %s revision %d, %s", rel.Name, rel.Version, rel.Info.Status)
	t.Cleanup(func() {
		if _, err := action.NewUninstall(cfg).Run(release); err != nil {
			t.Errorf("helm uninstall: %v", err)
		}
		// Wait for the plugin's pod to go: later tests start their own.
		testenv.WaitFor(t, "plugin pods gone", 2*time.Minute, func() (bool, error) {
			pods, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
			return err == nil && len(pods.Items) == 0, err
		})
	})

	pluginLog := func() string {
		out, _ := l.run("", "logs", "-n", ns, "-l", "app.kubernetes.io/component=kubelet-plugin", "--tail=-1")
		return out
	}
	var pluginPod string
	testenv.WaitFor(t, "the DaemonSet's plugin pod Running and Ready", 2*time.Minute, func() (bool, error) {
		pods, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d plugin pods: %v", len(pods.Items), err)
		}
		p := pods.Items[0]
		pluginPod = p.Name
		return p.Status.Phase == corev1.PodRunning && podReady(&p), fmt.Errorf("phase %s, container statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	t.Logf("plugin pod %s Running (%s)", pluginPod, time.Since(start).Round(time.Millisecond))

	sel := fields.Set{"spec.driver": "gpu.facet.dev", "spec.nodeName": "localhost"}.AsSelector().String()
	testenv.WaitFor(t, "the plugin pod's ResourceSlices", time.Minute, func() (bool, error) {
		list, err := l.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(list.Items) == 0 {
			return false, fmt.Errorf("%d slices: %v", len(list.Items), err)
		}
		devices := 0
		for _, s := range list.Items {
			devices += len(s.Spec.Devices)
		}
		return devices == 8, fmt.Errorf("%d devices", devices)
	})
	// Ready is the plugin's /readyz: the kubelet registered it
	// (NotifyRegistrationStatus) and the API server holds its slices.
	pod, err := l.client.CoreV1().Pods(ns).Get(ctx, pluginPod, metav1.GetOptions{})
	if err != nil || !podReady(pod) || pod.Spec.Containers[0].ReadinessProbe == nil {
		t.Fatalf("plugin pod %s: want Ready through its readiness probe: %v", pluginPod, err)
	}
	t.Logf("slices published and plugin registered (%s)", time.Since(start).Round(time.Millisecond))

	manifest := `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: facet-chart-live}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.facet.dev}}
---
apiVersion: v1
kind: Pod
metadata: {name: one-gpu, namespace: facet-chart-live}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: facet.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "86400"]
    resources: {claims: [{name: gpu}]}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
`
	l.must(t, manifest, "apply", "-f", "-")
	testenv.WaitFor(t, "pod one-gpu Running", 2*time.Minute, func() (bool, error) {
		var err error
		pod, err = l.client.CoreV1().Pods(ns).Get(ctx, "one-gpu", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", pod.Status.Phase, pod.Status.Conditions)
	})
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod claims: %+v", pod.Status.ResourceClaimStatuses)
	}
	claim, err := l.client.ResourceV1().ResourceClaims(ns).Get(ctx, *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v", claim.Name, claim.Status.Allocation)
	}
	spec := filepath.Join(cdiDir, "gpu.facet.dev-claim_"+string(claim.UID)+".json")
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the plugin pod wrote no CDI spec for claim %s: %v\nplugin log:\n%s", claim.Name, err, pluginLog())
	}
	device := claim.Status.Allocation.Devices.Results[0].Device
	out := l.must(t, "", "exec", "-n", ns, "one-gpu", "--", "sh", "-c", "env; echo ---; ls /dev")
	if !strings.Contains(out, "FACET_DEVICES="+device+"\n") {
		t.Errorf("the container lacks FACET_DEVICES=%s from the plugin pod's CDI spec:\n%s", device, out)
	}
	if !strings.Contains(out, "\nnvidiactl\n") {
		t.Errorf("the container has no /dev/nvidiactl from the CDI spec:\n%s", out)
	}
	t.Logf("pod one-gpu Running with %s through the chart's plugin (%s)", device, time.Since(start).Round(time.Millisecond))

	l.must(t, "", "delete", "pod", "-n", ns, "one-gpu", "--wait=true", "--timeout=90s")
	testenv.WaitFor(t, "claim "+claim.Name+" unprepared (CDI spec removed)", time.Minute, func() (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err), err
	})
	if !strings.Contains(pluginLog(), "NodeUnprepareResources") && testing.Verbose() {
		t.Logf("plugin log:\n%s", pluginLog())
	}
	t.Logf("claim unprepared; total %s", time.Since(start).Round(time.Millisecond))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
