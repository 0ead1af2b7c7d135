package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/model/features"
)

var publishedRE = regexp.MustCompile(`"ResourceSlices published" slices=\d+ sinceStart="([^"]+)"`)

// gpu4Partitioning is the computePartitioning GPU 4's devices publish
// ("" when none publishes one).
func gpu4Partitioning(t *testing.T) string {
	t.Helper()
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if idx, ok := d.Attributes["index"]; ok && idx.IntValue != nil && *idx.IntValue == 4 {
				if a, ok := d.Attributes["computePartitioning"]; ok && a.StringValue != nil {
					return *a.StringValue
				}
			}
		}
	}
	return ""
}

// waitPartitioning waits until GPU 4's shares or slots publish want, and
// returns how long that took.
func waitPartitioning(t *testing.T, want string) time.Duration {
	t.Helper()
	start := time.Now()
	waitFor(t, "GPU 4's shares published as "+want, time.Minute, func() (bool, error) {
		got := gpu4Partitioning(t)
		return got == want, fmt.Errorf("computePartitioning %q", got)
	})
	return time.Since(start)
}

// TestSharingMechanismsArrive: the plugin waits for no sharing mechanism.
// Started with no facet-mps and no HAMi-core library, it publishes every
// GPU at once, its shares or slots as time-sliced, which the shipped
// classes leave out, so a share that asks for 20 % stays Pending rather
// than run at HAMi-core's throttle; a share needing HAMi-core fails to
// prepare naming it. HAMi-core installed later, and facet-mps started
// later, are adopted without a restart (Node Events): the Pending share
// lands and joins MPS. facet-mps stopped again: the shares are republished
// as time-sliced, with a Warning Event on the Node.
func TestSharingMechanismsArrive(t *testing.T) {
	setupNamespace(t)
	shares := e.gates.Has(features.ConsumableCapacity)
	args := []string{"--mps-check-interval", "1s", "--gpu-modes", "4=slots", "--gpu-slots", "4=1x40Gi/50+2"}
	onGPU4 := `selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4'}}]`
	request := `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, ` + onGPU4 + `}}`
	wantPct := "25"
	if shares {
		args = []string{"--mps-check-interval", "1s", "--gpu-modes", "4=shared"}
		request = `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 2000Mi, cores: "20"}}}}`
		wantPct = "20"
	}
	// HAMi-core's library where the chart's hami-core DaemonSet would
	// install it, absent at start.
	lib := filepath.Join(e.runDir, "hami-late", "libvgpu.so")
	_ = os.RemoveAll(filepath.Dir(lib))
	args = append(args, "--hami-library", lib)
	start := time.Now()
	p := startPluginAlone(t, "dgx-h100", args...)
	deleteNamespaceAtEnd(t)
	// Whatever happens below, later tests get facet-mps back.
	t.Cleanup(func() { ensureMPSHost(t) })

	// Ready means the API server holds the slices; the plugin logs the
	// publication a moment after the API answered, so its line is waited
	// for, not read once.
	var m []string
	waitFor(t, "the plugin's log line ResourceSlices published", 30*time.Second, func() (bool, error) {
		m = publishedRE.FindStringSubmatch(p.logText())
		return m != nil, fmt.Errorf("not logged yet:\n%s", p.logText())
	})
	took, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	// The figure goes in the log (docs/mps.md); the bound only catches a
	// start that waits for facet-mps again (it waited 60 s, --mps-wait).
	t.Logf("start to slices without facet-mps or HAMi-core: %v (plugin's own clock; %v of test time to ready)", took, time.Since(start).Round(time.Millisecond))
	if took > 30*time.Second {
		t.Fatalf("start to slices took %v without facet-mps: the start waits for it", took)
	}
	if got := gpu4Partitioning(t); got != "time-sliced" {
		t.Fatalf("GPU 4 publishes computePartitioning %q without facet-mps, want time-sliced", got)
	}
	nodeEvent(t, "FacetSharingMechanismUnavailable", "HAMi-core unavailable", start)
	nodeEvent(t, "FacetSharingMechanismUnavailable", "MPS unavailable", start)

	t.Log("whole GPUs are served without either mechanism")
	applyYAML(t, claimPod("whole", `{name: req, exactly: {deviceClassName: gpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 0'}}]}}`))
	waitPodRunning(t, "whole")

	t.Log("a share asking for a compute limit stays Pending on a time-sliced GPU")
	applyYAML(t, claimPod("late-share", request))
	waitUnschedulable(t, "late-share")

	t.Log("HAMi-core's library installed: adopted, with an Event")
	hamiAt := time.Now()
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(e.runDir, "hami", "libvgpu.so"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, b, 0o755); err != nil {
		t.Fatal(err)
	}
	nodeEvent(t, "FacetSharingMechanismAvailable", "HAMi-core", hamiAt)
	t.Logf("HAMi-core adopted %v after its library appeared", time.Since(hamiAt).Round(time.Millisecond))

	t.Log("facet-mps started after the plugin: adopted, the shares republished as MPS, the Pending share lands and joins it")
	mpsAt := time.Now()
	mpsd = startMPSHost(t)
	adopted := waitPartitioning(t, "mps")
	nodeEvent(t, "FacetSharingMechanismAvailable", "facet-mps answers", mpsAt)
	t.Logf("facet-mps adopted: slices say mps %v after it answered", adopted.Round(time.Millisecond))
	waitPodRunning(t, "late-share")
	env := envOf(execIn(t, "late-share", "", "env"))
	if env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != wantPct || env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || env["CUDA_DEVICE_SM_LIMIT_0"] != "0" {
		t.Errorf("late-share: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q CUDA_MPS_PIPE_DIRECTORY=%q CUDA_DEVICE_SM_LIMIT_0=%q; want %s, /tmp/nvidia-mps, 0 (MPS)",
			env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_DEVICE_SM_LIMIT_0"], wantPct)
	}

	t.Log("facet-mps stopped: the shares republished as time-sliced, with a Warning Event on the Node")
	lostAt := time.Now()
	mpsd.stop()
	lost := waitPartitioning(t, "time-sliced")
	msg := nodeEvent(t, "FacetSharingMechanismUnavailable", "MPS unavailable", lostAt)
	t.Logf("facet-mps lost: slices say time-sliced %v after it stopped; Event: %s", lost.Round(time.Millisecond), msg)
	if !strings.Contains(msg, "facet-mps unreachable") {
		t.Errorf("the Event does not say why: %s", msg)
	}

	t.Log("facet-mps back: adopted again, and the share's daemon released with its pod")
	mpsd = startMPSHost(t)
	waitPartitioning(t, "mps")
	kubectl(t, "delete", "pod", "-n", namespace, "late-share", "whole", "--wait=true", "--timeout=120s")
}
