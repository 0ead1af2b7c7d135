package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/test/helm/helmtest"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testValues are the values of `helm test`'s pod on the local node: its
// pods have no network that reaches the API server, which the test pod
// then reaches in the host's network, as the plugin does.
func (r *chartRig) testValues() map[string]any {
	return map[string]any{"nodeCheck": map[string]any{
		"hostNetwork": true,
		"extraEnv": []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": fmt.Sprint(r.APIServerPort())},
		},
	}}
}

// helmTest runs `helm test` through Helm's action package, as the helm
// CLI does, and returns the test pods' logs as `helm test --logs` prints
// them.
func (r *chartRig) helmTest(t *testing.T) (string, error) {
	t.Helper()
	rt := action.NewReleaseTesting(r.cfg)
	rt.Namespace, rt.Timeout = chartNS, 5*time.Minute
	rel, err := rt.Run(chartRelease)
	var logs bytes.Buffer
	if rel != nil {
		if lerr := rt.GetPodLogs(&logs, rel); lerr != nil {
			t.Errorf("helm test --logs: %v", lerr)
		}
	}
	return logs.String(), err
}

// wantAll fails t for each of wants that text (what) lacks.
func wantAll(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
}

// facetctl is the operator's CLI as `make build` left it in bin/.
func (r *chartRig) facetctl(t *testing.T) string {
	t.Helper()
	return helmtest.FacetBinary(t, r.repo, "facetctl")
}

// TestLiveChartNodeCheck: `helm test` of the release runs the node check
// in the plugin pod of the local node, through pods/exec, and passes with
// the node's report; once the node's HAMi-core library is gone (its vGPU
// shares and slots are still published, and cannot be prepared) it fails,
// with the report saying why. `facetctl node-check-all`, the same check
// from an operator's machine, agrees, and its peak memory is measured (the
// test pod's request).
func TestLiveChartNodeCheck(t *testing.T) {
	r := newChartRig(t)
	vals := r.values(t, r.tag, `mode: auto`)
	vals["tests"] = r.testValues()
	r.install(t, vals)
	plugin := r.waitPlugin(t, r.tag, 2*time.Minute)
	r.waitHAMiCore(t, 2*time.Minute)
	t.Logf("plugin pod %s Ready, HAMi-core installed (%s)", plugin.Name, r.since())

	start := time.Now()
	logs, err := r.helmTest(t)
	t.Logf("helm test: %v in %s\n%s", err, time.Since(start).Round(time.Millisecond), logs)
	if err != nil {
		t.Fatalf("helm test failed on a node that delivers what it publishes: %v", err)
	}
	wantAll(t, "helm test's log", logs,
		"POD LOGS: "+chartRelease+"-node-check",
		"=== node localhost, pod "+plugin.Name+": facetctl node-check --gpu=idle",
		"GPU 0 is idle",
		"whole GPU   gpu-0",
		"vGPU share  gpu-0 (share)",
		"vGPU slot   gpu-0-slot-0",
		"prepared, probe skipped",
		"Left nothing behind",
		"=== node localhost: ok",
		"1 of 1 nodes checked: each delivers what it publishes")

	// The same check from the operator's machine, through the API server.
	facetctl := r.facetctl(t)
	cmd := exec.Command(facetctl, "node-check-all", "--kubeconfig", r.Kubeconfig, "--namespace", chartNS)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "=== node localhost: ok") {
		t.Errorf("facetctl node-check-all: %v\n%s", err, out)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		t.Logf("facetctl node-check-all checking one node: peak RSS %d MiB", ru.Maxrss/1024)
	}

	// The node loses HAMi-core's library (the hami-core pod installed it
	// once, and stays Ready): the plugin still publishes its shares and
	// slots, and cannot prepare them.
	if err := os.Remove(r.hamiLibrary()); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	logs, err = r.helmTest(t)
	t.Logf("helm test without HAMi-core: %v in %s\n%s", err, time.Since(start).Round(time.Millisecond), logs)
	if err == nil {
		t.Fatal("helm test passed on a node without HAMi-core, whose vGPU shares cannot be prepared")
	}
	wantAll(t, "the failed helm test's log", logs,
		"FAILED (prepare)",
		"vGPU share prepare failed",
		"HAMi-core",
		"=== node localhost: FAILED: node-check exited with status 1",
		"1 of 1 nodes do not deliver what they publish, or could not be checked: localhost")
	t.Logf("total %s", r.since())
}

// TestLiveChartUninstall follows docs/operations.md's uninstall: with a
// vGPU slot's pod running (HAMi-core state, an MPS daemon and its tmpfs)
// and a static MIG layout carved, `helm uninstall` alone leaves Facet's
// files on the node. `facetctl node-cleanup --node` refuses while the
// slot's claim is still prepared, naming it, and while the plugin runs;
// once the pod is gone (the chart installed again to unprepare it) and the
// chart uninstalled, it destroys the MIG instances Facet recorded and
// removes every Facet file on the node, and its pod is gone.
func TestLiveChartUninstall(t *testing.T) {
	r := newChartRig(t)
	facetctl := r.facetctl(t)
	group := `mode: auto, gpuModes: "0=static-mig,1=slots", migLayouts: "0=all-balanced", gpuSlots: "1=1x40Gi/50+2"`
	vals := r.values(t, r.tag, group)
	ctx := context.Background()
	uninstall := func() {
		t.Helper()
		if _, err := action.NewUninstall(r.cfg).Run(chartRelease); err != nil {
			t.Fatalf("helm uninstall: %v", err)
		}
		testenv.WaitFor(t, "plugin, facet-mps and hami-core pods gone", 2*time.Minute, func() (bool, error) {
			pods, err := r.Client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component in (kubelet-plugin,mps,hami-core)"})
			return err == nil && len(pods.Items) == 0, fmt.Errorf("%d pods: %v", len(pods.Items), err)
		})
		t.Logf("helm uninstall: its pods are gone (%s)", r.since())
	}
	cleanup := func() (string, error) {
		t.Helper()
		args := []string{"node-cleanup", "--kubeconfig", r.Kubeconfig, "--node", "localhost", "--namespace", chartNS,
			"--image", "facet.local/facet:" + r.tag, "--image-pull-policy", "Never", "--timeout", "3m",
			"--state-dir", r.stateDir, "--cdi-dir", r.cdiDir, "--kubelet-dir", r.kubeletRoot, "--mps-dir", r.mpsDir(),
			"--nvidia-cdi-hook-dir", filepath.Join(r.RunDir, "cdi-hook-chart"), "--hami-core-dir", filepath.Join(r.RunDir, "hami-chart"),
			"--mig-instances", "destroy", "--machine", "/usr/share/facet/machines/dgx-h100.yaml"}
		start := time.Now()
		out, err := exec.Command(facetctl, args...).CombinedOutput()
		t.Logf("facetctl node-cleanup: %v in %s\n%s", err, time.Since(start).Round(time.Millisecond), out)
		return string(out), err
	}

	r.install(t, vals)
	r.waitPlugin(t, r.tag, 2*time.Minute)
	r.waitHAMiCore(t, 2*time.Minute)
	const demoNS = "facet-demo"
	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, "demo", "gpu", "namespace.yaml"))
	t.Cleanup(func() { _, _ = r.Run("", "delete", "namespace", demoNS, "--wait=true", "--timeout=120s") })
	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, "demo", "stock", "hami-slot.yaml"))
	testenv.WaitFor(t, "pod hami-slot Running", 3*time.Minute, func() (bool, error) {
		p, err := r.Client.CoreV1().Pods(demoNS).Get(ctx, "hami-slot", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
	})
	claim := r.claimOf(t, demoNS, "hami-slot")
	spec := r.specPath(claim.UID)
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the slot's CDI spec: %v", err)
	}
	t.Logf("pod hami-slot Running with claim %s (%s)", claim.Name, r.since())

	// Uninstalled with the pod running: its claim is still prepared.
	uninstall()
	out, err := cleanup()
	if err == nil || !strings.Contains(out, "claims are still prepared on this node") || !strings.Contains(out, demoNS+"/"+claim.Name) {
		t.Errorf("node-cleanup with claim %s/%s still prepared: %v, want a refusal naming it", demoNS, claim.Name, err)
	}
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("node-cleanup refused, and the claim's CDI spec is gone: %v", err)
	}

	// The plugin unprepares it: installed again, the pod deleted.
	r.install(t, vals)
	r.waitPlugin(t, r.tag, 2*time.Minute)
	out, err = cleanup()
	if err == nil || !strings.Contains(out, "a Facet process still runs on this node") {
		t.Errorf("node-cleanup with the plugin running: %v, want a refusal", err)
	}
	r.Must(t, "", "delete", "namespace", demoNS, "--wait=true", "--timeout=120s")
	testenv.WaitFor(t, "the slot's claim unprepared (CDI spec removed)", time.Minute, func() (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err), err
	})
	r.waitHAMiCore(t, 2*time.Minute)
	uninstall()

	// What helm uninstall left, by host path.
	facetPaths := map[string]string{
		"state directory":          r.stateDir,
		"MPS directory":            r.mpsDir(),
		"nvidia-cdi-hook":          filepath.Join(r.RunDir, "cdi-hook-chart"),
		"HAMi-core":                filepath.Join(r.RunDir, "hami-chart"),
		"kubelet plugin directory": filepath.Join(r.kubeletRoot, "plugins", "gpu.facet.dev"),
	}
	var left []string
	for what, p := range facetPaths {
		if _, err := os.Stat(p); err == nil {
			left = append(left, what+" "+p)
		}
	}
	t.Logf("helm uninstall left: %s", strings.Join(left, ", "))
	if len(left) == 0 {
		t.Error("helm uninstall left no Facet file: the cleanup below proves nothing")
	}
	// The test's own bind mount of the MPS directory (newChartRig) is no
	// Facet file; a node's MPS directory is no mount.
	if out, err := exec.Command("umount", "-l", r.mpsDir()).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v\n%s", r.mpsDir(), err, out)
	}

	out, err = cleanup()
	if err != nil {
		t.Fatalf("node-cleanup after uninstall: %v", err)
	}
	wantAll(t, "node-cleanup's output", out, "destroyed MIG instance GPU-", "no Facet file is left on this node", "=== node localhost: done")
	for what, p := range facetPaths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			entries, _ := os.ReadDir(p)
			t.Errorf("node-cleanup left the %s %s (%v): %v", what, p, err, entries)
		}
	}
	for _, pattern := range []string{
		filepath.Join(r.cdiDir, "gpu.facet.dev-*"),
		filepath.Join(r.kubeletRoot, "plugins_registry", "gpu.facet.dev-*"),
	} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("node-cleanup left %v", m)
		}
	}
	pods, err := r.Client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node-cleanup"})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("node-cleanup pods left: %d (%v)", len(pods.Items), err)
	}
	t.Logf("total %s", r.since())
}
