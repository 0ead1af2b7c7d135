package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestLiveChartHAMiCoreUnpullable: a node that cannot pull HAMi's image
// still runs the plugin. With kubeletPlugin.hamiCore.image naming an image
// the node does not have (pullPolicy Never: as an air-gapped node that
// cannot reach the registry), the plugin pod becomes Ready and a whole
// GPU's pod runs, while the hami-core pod waits for its image and no
// libvgpu.so is on the node. `helm upgrade` to an image the node has then
// installs the library, without restarting the plugin's pod, which adopts
// it: a vGPU share's pod runs with HAMi-core preloaded.
func TestLiveChartHAMiCoreUnpullable(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	group := `mode: auto, gpuModes: "4=shared"`
	share, sharePod := "demo/vgpu/volcano-share.yaml", "volcano-share"
	if r.stock {
		group = `mode: auto, gpuModes: "4=slots", gpuSlots: "4=1x40Gi/50+2"`
		share, sharePod = "demo/stock/volcano-slot.yaml", "volcano-slot"
	}
	// An earlier test's library would make the missing one look installed.
	if err := os.Remove(r.hamiLibrary()); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	vals := r.values(t, r.tag, group)
	vals["kubeletPlugin"].(map[string]any)["hamiCore"].(map[string]any)["image"].(map[string]any)["repository"] = "facet.local/no-such-hami"
	r.install(t, vals)
	plugin := r.waitPlugin(t, r.tag, 2*time.Minute)
	t.Logf("plugin pod %s Ready without HAMi's image (%s)", plugin.Name, r.since())
	testenv.WaitFor(t, "the hami-core pod waiting for HAMi's image", 2*time.Minute, func() (bool, error) {
		pods, err := r.Client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{LabelSelector: hamiCorePods})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d hami-core pods: %v", len(pods.Items), err)
		}
		for _, s := range pods.Items[0].Status.InitContainerStatuses {
			if s.Name == "install-hami-core" && s.State.Waiting != nil && s.State.Waiting.Reason == "ErrImageNeverPull" {
				return true, nil
			}
		}
		return false, fmt.Errorf("init container statuses %+v", pods.Items[0].Status.InitContainerStatuses)
	})
	if _, err := os.Stat(r.hamiLibrary()); !os.IsNotExist(err) {
		t.Fatalf("libvgpu.so on the node though HAMi's image cannot be pulled: %v", err)
	}

	const demoNS = "facet-demo"
	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, "demo", "gpu", "namespace.yaml"))
	t.Cleanup(func() { _, _ = r.Run("", "delete", "namespace", demoNS, "--wait=true", "--timeout=120s") })
	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, "demo", "gpu", "one-gpu.yaml"))
	r.waitRunning(t, demoNS, "one-gpu", 3*time.Minute)
	t.Logf("a whole GPU's pod runs without HAMi-core (%s)", r.since())

	up := action.NewUpgrade(r.cfg)
	up.Namespace, up.Timeout = chartNS, 3*time.Minute
	rel, err := up.Run(chartRelease, r.ch, r.values(t, r.tag, group))
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	hami := r.waitHAMiCore(t, 2*time.Minute)
	if _, err := os.Stat(r.hamiLibrary()); err != nil {
		t.Fatalf("hami-core pod %s Ready, and no libvgpu.so: %v", hami.Name, err)
	}
	t.Logf("helm upgrade (revision %d): hami-core pod %s installed libvgpu.so (%s)", rel.Version, hami.Name, r.since())

	// The plugin adopts the library at its next check (--mps-check-interval):
	// a share prepared before that fails, and the kubelet's retry backs off.
	testenv.WaitFor(t, "the plugin adopting HAMi-core", 2*time.Minute, func() (bool, error) {
		log := r.pluginLog(plugin.Name)
		return strings.Contains(log, `"Sharing mechanism available" mechanism="hami-core"`), fmt.Errorf("not yet in the plugin's log")
	})
	t.Logf("the plugin adopted HAMi-core without a restart (%s)", r.since())
	r.Must(t, "", "apply", "-f", filepath.Join(r.repo, share))
	r.waitRunning(t, demoNS, sharePod, 3*time.Minute)
	out := r.Must(t, "", "exec", "-n", demoNS, sharePod, "--", "sh", "-c", "env; cat /etc/ld.so.preload")
	if !strings.Contains(out, "CUDA_DEVICE_MEMORY_LIMIT_0=") || !strings.Contains(out, "libvgpu.so") {
		t.Errorf("pod %s: want HAMi-core's memory limit and libvgpu.so preloaded:\n%s\nplugin log:\n%s", sharePod, out, r.pluginLog(plugin.Name))
	}
	if cur := r.waitPlugin(t, r.tag, time.Minute); cur.UID != plugin.UID {
		t.Errorf("plugin pod %s replaced by %s: it must adopt the library without a restart", plugin.Name, cur.Name)
	}
}
