// Package install installs the chart with Helm's install action into the
// local node. A package of its own: Helm's action package links Go's
// plugin package, which makes the test binary bind every symbol at load
// time (BIND_NOW), and go-nvml's unresolved NVML symbols, which the chart
// tests' imports of pkg/model/inventory bring, then fail to load.
package install

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/test/helm/helmtest"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

const chartDir = "../../../deployments/helm/facet"

// live is the local node (helmtest.LiveCluster).
type live = helmtest.Live

func liveCluster(t *testing.T) *live { return helmtest.LiveCluster(t) }

func loadChart(t testing.TB) *chart.Chart { return helmtest.LoadChart(t, chartDir) }

func values(t testing.TB, y string) map[string]any { return helmtest.Values(t, y) }

// simImageArchive is the demo's image (hack/image.sh --sim): the plugin
// built with the simulator, and the demo's machine files in
// /usr/share/facet/machines.
func simImageArchive() string {
	if p := os.Getenv("FACET_SIM_IMAGE_ARCHIVE"); p != "" {
		return p
	}
	return filepath.Join("..", "..", "..", "_output", "facet-image-sim.tar")
}

// chartRig is the chart installed with Helm's install action into the
// local node (hack/e2e.sh's), the simulator image imported into its
// containerd.
type chartRig struct {
	*live
	ch                                             *chart.Chart
	repo, kubeletRoot, cdiDir, stateDir, sock, ctr string
	// tag is the image's tag: facet.local/facet:<appVersion>-sim.
	tag string
	cfg *action.Configuration
	// stock: the node runs stock Kubernetes 1.35's gates (the alpha DRA
	// gates of shares and MIG partitions off).
	stock bool
	start time.Time
}

const (
	chartNS      = "facet-chart-live"
	chartRelease = "facet"
	pluginPods   = "app.kubernetes.io/component=kubelet-plugin"
	hamiCorePods = "app.kubernetes.io/component=hami-core"
)

func newChartRig(t *testing.T) *chartRig {
	t.Helper()
	l := liveCluster(t)
	archive := simImageArchive()
	if _, err := os.Stat(archive); err != nil {
		t.Skipf("no simulator image %s: build it with `make image-sim` (hack/image.sh --sim)", archive)
	}
	r := &chartRig{live: l, kubeletRoot: os.Getenv("FACET_KUBELET_ROOT"), cdiDir: os.Getenv("FACET_CDI_DIR"), sock: os.Getenv("FACET_CRI_SOCKET"), start: time.Now()}
	if os.Getenv("FACET_RUNTIME") != "containerd" || r.kubeletRoot == "" || r.cdiDir == "" || r.sock == "" {
		t.Skip("needs the local node with RUNTIME=containerd (FACET_RUNTIME, FACET_KUBELET_ROOT, FACET_CDI_DIR, FACET_CRI_SOCKET)")
	}
	if _, err := os.Stat(filepath.Join(l.RunDir, "driver-root", "dev")); err != nil {
		t.Skipf("no simulated driver root (hack/sim-node.sh): %v", err)
	}
	gates := "," + os.Getenv("FACET_FEATURE_GATES") + ","
	r.stock = !strings.Contains(gates, ",DRAPartitionableDevices=true,") || !strings.Contains(gates, ",DRAConsumableCapacity=true,")
	var err error
	if r.repo, err = filepath.Abs(filepath.Join("..", "..", "..")); err != nil {
		t.Fatal(err)
	}
	r.ch = loadChart(t)
	r.tag = r.ch.Metadata.AppVersion + "-sim"
	r.ctr = filepath.Join(os.Getenv("FACET_BIN_DIR"), "ctr")
	r.ctrRun(t, "images", "import", archive)
	t.Logf("imported facet.local/facet:%s (%s)", r.tag, r.since())

	// A host-process plugin of test/e2e may have left this node's slices;
	// the DaemonSet's plugin must publish its own.
	_, _ = l.Run("", "delete", "resourceslices", "--field-selector", "spec.driver=gpu.facet.dev,spec.nodeName=localhost", "--wait=true")
	l.Must(t, "", "apply", "-f", filepath.Join(r.repo, "deployments", "deviceclasses.yaml"))

	// The chart mounts the driver root with HostToContainer propagation
	// (the GPU Operator mounts it after boot), which containerd refuses
	// on a private mount: make the simulated root a shared mount of its own.
	// facet-mps mounts each GPU's /dev/shm tmpfs in the MPS directory,
	// Bidirectional, which needs a shared mount too (systemd makes a real
	// node's / one).
	driverRoot := filepath.Join(l.RunDir, "driver-root")
	if err := os.MkdirAll(r.mpsDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	// facet-mps mounts the host's / itself at /host, HostToContainer,
	// where the driver root is not / (templates/mps.yaml): as on a real
	// node, / must be a shared mount for containerd to allow it.
	if err := sharedRoot(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{driverRoot, r.mpsDir()} {
		for _, args := range [][]string{{"--bind", dir, dir}, {"--make-rshared", dir}} {
			if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
				t.Fatalf("mount %v: %v\n%s", args, err, out)
			}
		}
		t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	}

	l.Namespace(t, chartNS)
	r.stateDir = filepath.Join(l.RunDir, "facet-state-chart")
	os.RemoveAll(r.stateDir)

	kubeconfig, namespace := l.Kubeconfig, chartNS
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &kubeconfig, &namespace
	r.cfg = new(action.Configuration)
	if err := r.cfg.Init(getter, chartNS, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *chartRig) since() time.Duration { return time.Since(r.start).Round(time.Millisecond) }

// mpsDir is the chart's MPS directory on the local node (values
// kubeletPlugin.mps.dir), in the run directory that hack/cluster/down.sh
// cleans.
func (r *chartRig) mpsDir() string { return filepath.Join(r.RunDir, "mps-chart") }

func (r *chartRig) ctrRun(t testing.TB, args ...string) {
	t.Helper()
	args = append([]string{"--address", r.sock, "-n", "k8s.io"}, args...)
	if out, err := exec.Command(r.ctr, args...).CombinedOutput(); err != nil {
		t.Fatalf("ctr %v: %v\n%s", args, err, out)
	}
}

// values are the chart's values for the local node, with the image tag
// and the default node group's fields (YAML flow mapping entries, without
// the machine file, which is added).
func (r *chartRig) values(t testing.TB, tag, group string) map[string]any {
	t.Helper()
	return values(t, fmt.Sprintf(`
image: {repository: facet.local/facet, tag: %[1]q, pullPolicy: Never}
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
  - {name: KUBERNETES_SERVICE_PORT, value: "%[10]d"}
  kubeletDir: %[2]q
  cdiDir: %[3]q
  stateDir: %[4]q
  # The simulated driver root, which the plugin's container reads at
  # /driver-root, and the nvidia-cdi-hook of the image, installed on the
  # node by the chart's init container.
  driver: {root: %[5]q, devRoot: %[5]q}
  nvidiaCDIHook: {install: true, hostDir: %[6]q}
  # The simulator image plays HAMi's: the demo's stand-in libvgpu.so at
  # HAMi's path, copied to the node by the chart's hami-core DaemonSet.
  hamiCore:
    enabled: true
    hostDir: %[7]q
    image: {repository: facet.local/facet, tag: %[1]q, pullPolicy: Never}
    librarySource: /k8s-vgpu/lib/nvidia/libvgpu.so*
  logVerbosity: 4
  mps: {dir: %[9]q}
  # The local node carries none of the GPU labels of NFD or the GPU
  # Operator: it is the GPU node by name (up.sh's --hostname-override).
  gpuNodeSelectorTerms:
  - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [localhost]}]
  nodeGroups:
    default: {%[8]s, extraArgs: [--machine=/usr/share/facet/machines/dgx-h100.yaml]}
%[11]s`, tag, r.kubeletRoot, r.cdiDir, r.stateDir, filepath.Join(r.RunDir, "driver-root"),
		filepath.Join(r.RunDir, "cdi-hook-chart"), filepath.Join(r.RunDir, "hami-chart"), group, r.mpsDir(), r.APIServerPort(), r.computeDomains(t)))
}

// computeDomains are the values under which facet-controller and the
// IMEX daemons work on the local node: as the plugin, in the host's
// network (the controller's by choice, the daemons' always), reaching the
// API server on the host's 127.0.0.1 (there is no kube-proxy), the
// controller's metrics port moved with the node's ports.
func (r *chartRig) computeDomains(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf(`computeDomains:
  controller:
    hostNetwork: true
    metricsPort: %[1]d
    extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
    - {name: KUBERNETES_SERVICE_PORT, value: "%[2]d"}
  imex:
    extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
    - {name: KUBERNETES_SERVICE_PORT, value: "%[2]d"}
`, r.Port(t, 8090), r.APIServerPort())
}

// install runs `helm install` and removes the release when the test ends,
// waiting for the plugin's pods to go.
func (r *chartRig) install(t *testing.T, vals map[string]any) {
	t.Helper()
	install := action.NewInstall(r.cfg)
	install.ReleaseName, install.Namespace, install.Timeout = chartRelease, chartNS, 2*time.Minute
	rel, err := install.Run(r.ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	t.Logf("helm install: release %s revision %d, %s (%s)", rel.Name, rel.Version, rel.Info.Status, r.since())
	t.Cleanup(func() {
		// A test that uninstalls itself (TestLiveChartUninstall) leaves
		// no release.
		if _, err := action.NewUninstall(r.cfg).Run(chartRelease); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			t.Errorf("helm uninstall: %v", err)
		}
		// Wait for the plugin's pods to go: later tests start their own.
		testenv.WaitFor(t, "plugin, facet-mps and hami-core pods gone", 2*time.Minute, func() (bool, error) {
			pods, err := r.Client.CoreV1().Pods(chartNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component in (kubelet-plugin,mps,hami-core)"})
			return err == nil && len(pods.Items) == 0, err
		})
	})
}

func (r *chartRig) pluginLog(pod string) string {
	args := []string{"logs", "-n", chartNS, "-c", "plugin", "--tail=-1"}
	if pod != "" {
		args = append(args, pod)
	} else {
		args = append(args, "-l", pluginPods)
	}
	out, _ := r.Run("", args...)
	return out
}

// waitPlugin waits for the one plugin pod whose image has tag, Running and
// Ready (its /readyz: registered with the kubelet, all slices published),
// with no other plugin pod left, and returns it.
func (r *chartRig) waitPlugin(t testing.TB, tag string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testenv.WaitFor(t, "the DaemonSet's plugin pod with tag "+tag+" Running and Ready, and no other", timeout, func() (bool, error) {
		pods, err := r.Client.CoreV1().Pods(chartNS).List(context.Background(), metav1.ListOptions{LabelSelector: pluginPods})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d plugin pods: %v", len(pods.Items), err)
		}
		p := &pods.Items[0]
		pod = p
		if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) {
			return false, fmt.Errorf("pod %s has image %s", p.Name, p.Spec.Containers[0].Image)
		}
		return p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil,
			fmt.Errorf("phase %s, container statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	if pod.Spec.Containers[0].ReadinessProbe == nil {
		t.Fatalf("plugin pod %s has no readiness probe", pod.Name)
	}
	return pod
}

// waitHAMiCore waits for the one hami-core pod Ready, which it is only once
// its init containers installed libvgpu.so on the node, and returns it.
func (r *chartRig) waitHAMiCore(t testing.TB, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testenv.WaitFor(t, "the hami-core pod Ready (libvgpu.so installed)", timeout, func() (bool, error) {
		pods, err := r.Client.CoreV1().Pods(chartNS).List(context.Background(), metav1.ListOptions{LabelSelector: hamiCorePods})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d hami-core pods: %v", len(pods.Items), err)
		}
		pod = &pods.Items[0]
		return podReady(pod) && pod.DeletionTimestamp == nil, fmt.Errorf("phase %s, init container statuses %+v", pod.Status.Phase, pod.Status.InitContainerStatuses)
	})
	return pod
}

// hamiLibrary is libvgpu.so where the chart's values (values) install it on
// the local node.
func (r *chartRig) hamiLibrary() string { return filepath.Join(r.RunDir, "hami-chart", "libvgpu.so") }

// claimOf returns the pod's only claim.
func (r *chartRig) claimOf(t testing.TB, ns, pod string) *resourceapi.ResourceClaim {
	t.Helper()
	p, err := r.Client.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s claims: %+v", pod, p.Status.ResourceClaimStatuses)
	}
	c, err := r.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) == 0 {
		t.Fatalf("claim %s: allocation %+v", c.Name, c.Status.Allocation)
	}
	return c
}

func (r *chartRig) specPath(uid types.UID) string {
	return filepath.Join(r.cdiDir, "gpu.facet.dev-claim_"+string(uid)+".json")
}

// record is the plugin's checkpoint record of uid (nil if none), read as
// the plugin reads it: its journal's entries over its record files.
func (r *chartRig) record(uid types.UID) (*checkpoint.Claim, error) {
	return checkpoint.Peek(filepath.Join(r.stateDir, "claims"), uid)
}

// TestLiveChartPlugin installs the chart with Helm's install action into
// the local node, with the simulator image imported into its containerd,
// and the webhook with its default settings: the DaemonSet's pod
// registers with the kubelet and publishes the node's slices, and the
// demo's pods run with claims prepared through it (CDI specs, the
// containers run): with the alpha gates on, whole GPUs, a MIG instance
// carved at prepare and vGPU shares enforced by the stand-in HAMi-core
// that the chart's hami-core DaemonSet installed; on stock 1.35, whole
// GPUs, a static MIG device and vGPU slots. Each claim is unprepared when
// its pod goes.
//
// Existing MIG instances first: GPUs 0-1 hold static instances, and other
// GPUs can carve at prepare: with the alpha gates on 1.35 (the gated
// round), GPUs 2-3 in mig mode beside two 3g.40gb on each of GPUs 0-1;
// elsewhere (r.stock: FACET_FEATURE_GATES names no alpha gate, so also the
// 1.36 and 1.37 rounds, with their default gates) all-balanced on GPUs
// 0-1, and on 1.37 auto puts the GPUs without instances in mig mode. The
// README's plain example (demo/mig/at-least-20gb.yaml, one `exactly`
// request of mig.facet.dev) is rewritten by the webhook's claim mutator
// into the existing-first list: it lands on a free static instance through
// mig/existing and carves nothing, where the allocator's first fit carves
// on an untouched GPU in most slice orders (docs/admins.md); on the gated
// round and on 1.37 the node offers such carves (checked). one-1g10gb,
// for which no static instance fits, still carves, through mig/carved.
func TestLiveChartPlugin(t *testing.T) {
	r := newChartRig(t)
	group := `mode: auto, gpuModes: "0-1=static-mig,2-3=mig,4-7=shared", migLayouts: "0-1=all-3g.40gb"`
	// The MIG pods first, Running before the others are applied: a
	// whole-GPU claim may take any free GPU, GPUs 2-3 included, and two of
	// them would leave one-1g10gb nothing to carve on.
	migExamples := []string{"demo/mig/one-1g10gb.yaml", "demo/mig/at-least-20gb.yaml"}
	examples := []string{"demo/gpu/", "demo/vgpu/"}
	pods := map[string]string{"one-gpu": "gpu", "two-gpus": "gpu", "one-1g10gb": "mig", "at-least-20gb": "mig", "volcano-share": "share", "notebook": "share", "shared-by-two-containers": "share"}
	// The subrequest each MIG pod's claim is allocated through.
	migVia := map[string]string{"one-1g10gb": "mig/carved", "at-least-20gb": "mig/existing"}
	if r.stock {
		group = `mode: auto, gpuModes: "0-1=static-mig,4=slots", migLayouts: "0-1=all-balanced", gpuSlots: "4=1x40Gi/50+2"`
		migExamples = []string{"demo/stock/mig-3gb.yaml", "demo/mig/at-least-20gb.yaml"}
		examples = []string{"demo/gpu/", "demo/stock/"}
		pods = map[string]string{"one-gpu": "gpu", "two-gpus": "gpu", "mig-3gb": "mig", "at-least-20gb": "mig", "volcano-slot": "share", "hami-slot": "share"}
		migVia = map[string]string{"mig-3gb": "mig/existing", "at-least-20gb": "mig/existing"}
	}
	const demoNS = "facet-demo"
	vals := r.values(t, r.tag, group)
	vals["admission"].(map[string]any)["webhook"] = r.webhookValues(t, demoNS, "")
	r.install(t, vals)
	plugin := r.waitPlugin(t, r.tag, 2*time.Minute)
	t.Logf("plugin pod %s Running and Ready: registered, slices published (%s)", plugin.Name, r.since())
	if log := r.pluginLog(plugin.Name); strings.Contains(log, "MIG devices cannot get CDI edits") {
		t.Errorf("the plugin pod could not bind the simulated /proc/driver:\n%s", log)
	}
	// The shares need HAMi-core, which its own pod installs beside the
	// plugin's (the plugin adopts it when it appears).
	hami := r.waitHAMiCore(t, 2*time.Minute)
	t.Logf("hami-core pod %s Ready: libvgpu.so installed (%s)", hami.Name, r.since())

	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, "demo", "gpu", "namespace.yaml"))
	t.Cleanup(func() { _, _ = r.Run("", "delete", "namespace", demoNS, "--wait=true", "--timeout=120s") })
	r.claimMutatorServes(t, demoNS)
	ctx := context.Background()
	running := func(kind string) {
		for name, k := range pods {
			if kind != "" && k != kind {
				continue
			}
			testenv.WaitFor(t, "pod "+name+" Running", 3*time.Minute, func() (bool, error) {
				p, err := r.Client.CoreV1().Pods(demoNS).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
			})
		}
	}
	for _, ex := range migExamples {
		r.Must(t, "", "apply", "-f", filepath.Join(r.repo, ex))
	}
	running("mig")
	for _, ex := range examples {
		r.Must(t, "", "apply", "-f", filepath.Join(r.repo, ex))
	}
	running("")
	specs := map[string]string{}
	for name, kind := range pods {
		c := r.claimOf(t, demoNS, name)
		spec := r.specPath(c.UID)
		data, err := os.ReadFile(spec)
		if err != nil {
			t.Fatalf("pod %s: the plugin pod wrote no CDI spec for claim %s: %v\nplugin log:\n%s", name, c.Name, err, r.pluginLog(""))
		}
		specs[name] = spec
		var devices []string
		for _, res := range c.Status.Allocation.Devices.Results {
			devices = append(devices, res.Device)
		}
		out := r.Must(t, "", "exec", "-n", demoNS, name, "--", "sh", "-c", "env; echo ---; ls /dev; echo ---; cat /etc/ld.so.preload 2>/dev/null; echo ---; ls /usr/lib/*-linux-gnu/; nvidia-smi; true")
		env := map[string]string{}
		for _, line := range strings.Split(strings.SplitN(out, "---", 2)[0], "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		}
		if want := strings.Join(devices, ","); env["FACET_DEVICES"] != want {
			t.Errorf("pod %s: FACET_DEVICES=%q, want %q (its claim's devices)", name, env["FACET_DEVICES"], want)
		}
		if !strings.Contains(out, "\nnvidiactl\n") {
			t.Errorf("pod %s: no /dev/nvidiactl from the CDI spec:\n%s", name, out)
		}
		// The plugin read the simulated driver root at /driver-root in its
		// container, and wrote the host's paths into the spec, which the
		// container runtime applied: the driver's files are in the pod.
		if strings.Contains(string(data), `"/driver-root/`) || !strings.Contains(string(data), filepath.Join(r.RunDir, "driver-root", "usr", "lib")) {
			t.Errorf("pod %s: the CDI spec names no host path under %s, or the plugin container's /driver-root:\n%s", name, filepath.Join(r.RunDir, "driver-root"), data)
		}
		if !strings.Contains(out, "\nlibcuda.so.1\n") || !strings.Contains(out, "NVIDIA-SMI (simulated by Facet)") {
			t.Errorf("pod %s: the driver's files (libcuda.so.1, nvidia-smi) are not in the container:\n%s", name, out)
		}
		if !strings.Contains(string(data), filepath.Join(r.RunDir, "cdi-hook-chart", "nvidia-cdi-hook")) {
			t.Errorf("pod %s: the CDI spec's hooks do not run the nvidia-cdi-hook the chart installed:\n%s", name, data)
		}
		switch kind {
		case "mig":
			// The MIG capability device nodes come from nvcdi's MIG edits,
			// which need the simulated /proc/driver/nvidia-caps bound in
			// the plugin pod's mount namespace.
			if !strings.HasPrefix(env["FACET_GPU_UUIDS"], "MIG-") || !strings.Contains(string(data), "nvidia-caps") {
				t.Errorf("pod %s: FACET_GPU_UUIDS=%q, want a MIG device's, and nvidia-caps in its spec:\n%s", name, env["FACET_GPU_UUIDS"], data)
			}
			r.checkMIGVia(t, c, migVia[name])
			if name == "at-least-20gb" {
				r.checkCarvable(t, !r.stock || r.atLeast(t, "1.37.0"))
			}
		case "share":
			if env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "" || !strings.Contains(out, "libvgpu.so") {
				t.Errorf("pod %s: want HAMi-core's memory limit and libvgpu.so preloaded:\n%s", name, out)
			}
		}
		t.Logf("pod %s Running with %v (%s) through the chart's plugin", name, devices, kind)
	}
	if _, err := os.Stat(r.hamiLibrary()); err != nil {
		t.Errorf("the hami-core DaemonSet installed no libvgpu.so: %v", err)
	}
	log := r.pluginLog(plugin.Name)
	if !strings.Contains(log, "nvidia-cdi-hook runs") {
		t.Errorf("the plugin did not check its nvidia-cdi-hook:\n%s", log)
	}
	// facet-mps runs MPS's control daemons, chrooted into its view of
	// the driver root: a root of its own, not the host's /, which it
	// reads under its mount of the host's / (templates/mps.yaml); the
	// plugin reaches it.
	if want := fmt.Sprintf(`control="/usr/bin/nvidia-cuda-mps-control" driverRoot=%q hostRoot=""`, "/host"+filepath.Join(r.RunDir, "driver-root")); !strings.Contains(log, want) {
		t.Errorf("the plugin did not reach a facet-mps with nvidia-cuda-mps-control in its driver root (%s):\n%s", want, log)
	}
	t.Logf("%d demo pods Running (%s)", len(pods), r.since())

	r.Must(t, "", "delete", "namespace", demoNS, "--wait=true", "--timeout=120s")
	for name, spec := range specs {
		testenv.WaitFor(t, "pod "+name+"'s claim unprepared (CDI spec removed)", time.Minute, func() (bool, error) {
			_, err := os.Stat(spec)
			return os.IsNotExist(err), err
		})
	}
	t.Logf("claims unprepared; total %s", r.since())
}

// explainWebhookOnFailure logs, when t fails, what the webhook's pods went
// through: their status and Events, and their logs (the previous
// container's too, for a crash), so that a webhook that never became
// Available is explained in the test's own output.
func (r *chartRig) explainWebhookOnFailure(t *testing.T) {
	r.explainPodsOnFailure(t, "app.kubernetes.io/component=webhook")
}

// explainPodsOnFailure logs, when t fails, what the release namespace's
// pods of the label selector sel went through: their status and Events,
// and their logs (the previous container's too, for a crash). It runs
// before the cleanups registered earlier, which may take the pods away.
func (r *chartRig) explainPodsOnFailure(t *testing.T, sel string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"describe", "pods", "-n", chartNS, "-l", sel},
			{"logs", "-n", chartNS, "-l", sel, "--all-containers", "--tail=60"},
			{"logs", "-n", chartNS, "-l", sel, "--all-containers", "--tail=60", "--previous"},
		} {
			out, err := r.Run("", args...)
			t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
		}
	})
}

// claimMutatorServes waits for the chart's webhook Deployment and for its
// claim mutator to write a plain MIG template in ns existing instances
// first (a server-side dry run): the webhook has found that the API
// server keeps firstAvailable, and the API server calls it.
func (r *chartRig) claimMutatorServes(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	r.explainWebhookOnFailure(t)
	testenv.WaitFor(t, "the webhook Deployment available", 2*time.Minute, func() (bool, error) {
		d, err := r.Client.AppsV1().Deployments(chartNS).Get(ctx, "facet-webhook", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.AvailableReplicas == 1, fmt.Errorf("status %+v", d.Status)
	})
	probe := "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: probe, namespace: " + ns + "}\n" +
		"spec: {spec: {devices: {requests: [{name: mig, exactly: {deviceClassName: mig.facet.dev}}]}}}\n"
	testenv.WaitFor(t, "the claim mutator writing plain MIG requests existing instances first", 2*time.Minute, func() (bool, error) {
		out, err := r.Run(probe, "create", "--dry-run=server", "-o", "jsonpath={.spec.spec.devices.requests[0].firstAvailable[*].name}", "-f", "-")
		return err == nil && out == "existing split carved", fmt.Errorf("%v: %q", err, out)
	})
	t.Logf("the claim mutator answers (%s)", r.since())
}

// checkMIGVia: claim c was allocated through subrequest via (the claim
// mutator rewrote its template), and an allocation through mig/existing is
// a static instance, which prepare did not carve (its checkpoint record).
func (r *chartRig) checkMIGVia(t *testing.T, c *resourceapi.ResourceClaim, via string) {
	t.Helper()
	res := c.Status.Allocation.Devices.Results
	if len(res) != 1 || res[0].Request != via {
		t.Errorf("claim %s allocated %+v, want one device through %s", c.Name, res, via)
		return
	}
	rec, err := r.record(c.UID)
	if err != nil || rec == nil || len(rec.Devices) != 1 {
		t.Errorf("claim %s: checkpoint record %+v, %v", c.Name, rec, err)
		return
	}
	carved := rec.Devices[0].Kind != names.KindStaticMIG
	if want := via != "mig/existing"; carved != want {
		t.Errorf("claim %s through %s: device %s prepared as %q, want carved: %v", c.Name, via, res[0].Device, rec.Devices[0].Kind, want)
	}
	t.Logf("claim %s: %s through %s (%s)", c.Name, res[0].Device, via, rec.Devices[0].Kind)
}

// checkCarvable: the node publishes MIG devices of 20 GB (decimal) or more
// on GPUs in mig or dynamic mode, instances a plain at-least-20gb request
// could have carved; with want, there must be some, else "carves nothing"
// would show nothing.
func (r *chartRig) checkCarvable(t *testing.T, want bool) {
	t.Helper()
	slices, err := r.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=gpu.facet.dev"})
	if err != nil {
		t.Fatal(err)
	}
	min := resource.MustParse("20G")
	n := 0
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			mode, memory := d.Attributes[names.AttrMode].StringValue, d.Capacity[names.CapacityMemory].Value
			if d.Attributes[names.AttrType].StringValue != nil && *d.Attributes[names.AttrType].StringValue == names.KindMIG &&
				mode != nil && (*mode == names.ModeMIG || *mode == names.ModeDynamic) && memory.Cmp(min) >= 0 {
				n++
			}
		}
	}
	t.Logf("%d MIG devices of at least 20G on GPUs that carve at prepare", n)
	if want && n == 0 {
		t.Errorf("no MIG device of at least 20G on a GPU that carves: the plain request had nothing to carve, so carving nothing shows nothing")
	}
}

// atLeast says whether the API server's version is at least v.
func (r *chartRig) atLeast(t *testing.T, v string) bool {
	t.Helper()
	info, err := r.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return utilversion.MustParseGeneric(info.GitVersion).AtLeast(utilversion.MustParseGeneric(v))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sharedRoot makes / a shared mount, as systemd makes a real node's, where
// it is private (a container or chroot running the test node); a no-op
// where it is shared already.
func sharedRoot() error {
	out, err := exec.Command("findmnt", "-n", "-o", "PROPAGATION", "/").Output()
	if err != nil {
		return fmt.Errorf("findmnt /: %w", err)
	}
	if strings.Contains(string(out), "shared") {
		return nil
	}
	if out, err := exec.Command("mount", "--make-rshared", "/").CombinedOutput(); err != nil {
		return fmt.Errorf("mount --make-rshared /: %v\n%s", err, out)
	}
	return nil
}
