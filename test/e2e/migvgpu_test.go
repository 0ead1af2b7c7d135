package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// The demo node's layout: MIG on GPUs 0-3, vGPU shares on 4-7.
var demoModes = []string{"--gpu-modes", "0-3=mig,4-7=shared"}

func demoMode(index int64) string {
	if index < 4 {
		return "mig"
	}
	return "shared"
}

// simInstances reads the simulated NVML's MIG instances from the plugin's
// state file: "what is carved on the hardware", independent of the plugin.
func simInstances(t testing.TB) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.runDir, "facet-state", "simulated-nvml.json"))
	if os.IsNotExist(err) {
		return map[string]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs []struct {
			Index        int `json:"index"`
			GpuInstances []struct {
				Placement struct{ Start int } `json:"placement"`
				ProfileID int                 `json:"profileId"`
			} `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, g := range st.GPUs {
		for _, gi := range g.GpuInstances {
			out[fmt.Sprintf("gpu-%d/profile-%d/start-%d", g.Index, gi.ProfileID, gi.Placement.Start)]++
		}
	}
	return out
}

// checkCapNodes checks the MIG capability nodes a container sees (lines
// "capnode <path> <major hex> <minor hex>" of stat): the GI's and the CI's,
// created by the runtime from the CDI spec with the simulated driver's
// nvidia-caps major (63, sim.LayoutDriverRoot's proc/devices) and the minor
// their name says, while the simulated dev root on the host has no node for
// either: the case of an instance carved at prepare on a real node.
func checkCapNodes(t testing.TB, out string) {
	t.Helper()
	var nodes []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "capnode" {
			continue
		}
		nodes = append(nodes, f[1])
		major, err1 := strconv.ParseUint(f[2], 16, 32)
		minor, err2 := strconv.ParseUint(f[3], 16, 32)
		if err1 != nil || err2 != nil || major != 63 || fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor) != f[1] {
			t.Errorf("capability node %s is %s:%s (hex), want 3f and the minor its name gives", f[1], f[2], f[3])
		}
		if _, err := os.Lstat(filepath.Join(e.runDir, "driver-root", f[1])); !os.IsNotExist(err) {
			t.Errorf("%s exists under the simulated dev root (%v): the test needs an instance with no host node", f[1], err)
		}
	}
	if len(nodes) != 2 {
		t.Fatalf("%d MIG capability nodes in the container, want the GI's and the CI's:\n%s", len(nodes), out)
	}
}

func execIn(t testing.TB, pod, container, script string) string {
	t.Helper()
	args := []string{"exec", "-n", namespace, pod}
	if container != "" {
		args = append(args, "-c", container)
	}
	return kubectl(t, append(args, "--", "sh", "-c", script)...)
}

func envOf(out string) map[string]string {
	env := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

func waitEvent(t testing.TB, pod, reason, contains string) {
	t.Helper()
	waitFor(t, reason+" event for "+pod, 2*time.Minute, func() (bool, error) {
		evs, err := e.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, contains) {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events", len(evs.Items))
	})
}

func TestMIGAndShares(t *testing.T) {
	needGates(t, features.PartitionableDevices, features.ConsumableCapacity)
	setupNamespace(t)
	p := startPlugin(t, "dgx-h100", demoModes...)
	deleteNamespaceAtEnd(t)
	waitModes(t, demoMode)

	t.Run("a MIG pod runs on an instance carved at prepare, destroyed after", func(t *testing.T) {
		kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "mig", "one-1g10gb.yaml"))
		pod := waitPodRunning(t, "one-1g10gb")
		var device string
		for _, c := range podClaims(t, pod) {
			device = c.Status.Allocation.Devices.Results[0].Device
		}
		if !strings.Contains(device, "-mig-1g10gb-") {
			t.Fatalf("allocated %q, want a 1g.10gb MIG device", device)
		}
		if n := len(simInstances(t)); n != 1 {
			t.Fatalf("%d MIG instances carved, want 1: %v", n, simInstances(t))
		}
		out := execIn(t, "one-1g10gb", "", "env; stat -c 'capnode %n %t %T' /dev/nvidia-caps/*")
		if env := envOf(out); !strings.HasPrefix(env["FACET_GPU_UUIDS"], "MIG-") || env["FACET_DEVICES"] != device {
			t.Fatalf("container env: %v", env)
		}
		checkCapNodes(t, out)
		kubectl(t, "delete", "pod", "-n", namespace, "one-1g10gb", "--wait=true", "--timeout=120s")
		waitFor(t, "instance destroyed", time.Minute, func() (bool, error) { return len(simInstances(t)) == 0, nil })
	})

	t.Run("three vGPU shares on one GPU, each with its own limits", func(t *testing.T) {
		for _, f := range []string{"volcano-share.yaml", "notebook.yaml", "shared-by-two-containers.yaml"} {
			kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "vgpu", f))
		}
		// MPS partitions the SMs (the simulated driver root has the
		// stand-in control daemon): HAMi-core's SM throttle is off.
		type view struct{ pod, container, mem, sm, pct string }
		want := []view{
			{"volcano-share", "", "2000m", "0", "20"},
			{"notebook", "", "4096m", "0", "100"},
		}
		gpus := map[string]bool{}
		caches := map[string]string{}
		for _, w := range want {
			waitPodRunning(t, w.pod)
			env := envOf(execIn(t, w.pod, w.container, "env"))
			if env["CUDA_DEVICE_MEMORY_LIMIT_0"] != w.mem || env["CUDA_DEVICE_SM_LIMIT_0"] != w.sm || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != w.pct {
				t.Errorf("%s: limits %q %q %q, want %s %s %s", w.pod, env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], w.mem, w.sm, w.pct)
			}
			gpus[env["FACET_GPU_UUIDS"]] = true
			caches[w.pod] = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
		}
		pod := waitPodRunning(t, "shared-by-two-containers")
		var seen []string
		for _, c := range pod.Spec.Containers {
			env := envOf(execIn(t, pod.Name, c.Name, "env; touch \"$CUDA_DEVICE_MEMORY_SHARED_CACHE\" && echo WRITABLE=yes"))
			if env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "" || env["WRITABLE"] != "yes" {
				t.Errorf("%s/%s: no limit or cache not writable: %v", pod.Name, c.Name, env)
			}
			gpus[env["FACET_GPU_UUIDS"]] = true
			seen = append(seen, env["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
		}
		// Two containers of one claim: one budget, one accounting region.
		if len(seen) != 2 || seen[0] != seen[1] {
			t.Errorf("containers of one claim see caches %v, want one", seen)
		}
		caches["shared"] = seen[0]
		if len(gpus) != 1 {
			t.Errorf("shares landed on %d GPUs (%v), want one", len(gpus), gpus)
		}
		distinct := map[string]bool{}
		for _, c := range caches {
			distinct[c] = true
		}
		if len(distinct) != 3 {
			t.Errorf("caches %v: want one per claim", caches)
		}
	})

	t.Run("four 25 % shares fit on one GPU, a fifth and a whole GPU do not", func(t *testing.T) {
		// All on gpu-5, which no other pod of this test uses.
		onGPU5 := `selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 5'}}]`
		quarter := `{name: vgpu, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU5 + `, capacity: {requests: {memory: 8Gi, cores: "25"}}}}`
		for i := 1; i <= 4; i++ {
			applyYAML(t, claimPod(fmt.Sprintf("quarter-%d", i), quarter))
		}
		for i := 1; i <= 4; i++ {
			pod := waitPodRunning(t, fmt.Sprintf("quarter-%d", i))
			for _, c := range podClaims(t, pod) {
				if r := c.Status.Allocation.Devices.Results[0]; r.Device != "gpu-5" || r.ShareID == nil {
					t.Fatalf("%s: allocated %+v", pod.Name, r)
				}
			}
			if env := envOf(execIn(t, pod.Name, "", "env")); env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || env["CUDA_DEVICE_SM_LIMIT_0"] != "0" || env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "8192m" {
				t.Errorf("%s: limits %v", pod.Name, env)
			}
		}
		applyYAML(t, claimPod("quarter-5", quarter))
		waitEvent(t, "quarter-5", "FailedScheduling", "cannot allocate all claims")
		applyYAML(t, claimPod("whole-beside-shares", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev, `+onGPU5+`}}`))
		waitEvent(t, "whole-beside-shares", "FailedScheduling", "cannot allocate all claims")
		for _, pod := range []string{"quarter-5", "whole-beside-shares"} {
			p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), pod, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodPending {
				t.Fatalf("%s: %v %v", pod, err, p.Status.Phase)
			}
		}
	})

	t.Run("a share that cannot fit stays Pending", func(t *testing.T) {
		applyYAML(t, claimPod("too-big", `{name: vgpu, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 200Gi, cores: "10"}}}}`))
		waitEvent(t, "too-big", "FailedScheduling", "cannot allocate all claims")
		pod, _ := e.client.CoreV1().Pods(namespace).Get(context.Background(), "too-big", metav1.GetOptions{})
		if pod.Status.Phase != corev1.PodPending {
			t.Fatalf("phase %s", pod.Status.Phase)
		}
	})

	outer := t
	t.Run("a plugin killed mid-prepare leaves nothing behind", func(t *testing.T) {
		p.stop()
		armed := startPluginEnv(outer, "dgx-h100", []string{"FACET_FAILPOINT=after-mig-create"}, demoModes...)
		kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "mig", "at-least-20gb.yaml"))
		waitFor(t, "failpoint", 2*time.Minute, func() (bool, error) {
			return strings.Contains(armed.logText(), "Failpoint reached"), nil
		})
		armed.kill(t)
		if n := len(simInstances(t)); n != 1 {
			t.Fatalf("%d instances at the kill, want the one being carved", n)
		}
		// Started on the outer test so the namespace cleanup, registered
		// after it, can unprepare the share pods through it. The
		// instance's IDs were never recorded, so only an operator's
		// --destroy-unowned-mig lets the plugin destroy it.
		p2 := startPlugin(outer, "dgx-h100", append(append([]string(nil), demoModes...), "--destroy-unowned-mig")...)
		deleteNamespaceAtEnd(outer)
		waitFor(t, "recovery", time.Minute, func() (bool, error) {
			return strings.Contains(p2.logText(), "Destroying MIG instance not owned by any prepared claim"), nil
		})
		// Recovery ran at start, before the kubelet's next retry: nothing
		// of the interrupted prepare is left.
		if n := len(simInstances(t)); n != 0 {
			t.Fatalf("%d instances after recovery, want 0: %v", n, simInstances(t))
		}
		pod, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), "at-least-20gb", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range podClaims(t, pod) {
			if hasRecord(t, c.UID) || fileExists(specPath(c.UID)) {
				t.Fatalf("claim %s kept a checkpoint record or CDI spec after recovery", c.Name)
			}
		}
		kubectl(t, "delete", "pod", "-n", namespace, "at-least-20gb", "--wait=true", "--timeout=120s")
		if n := len(simInstances(t)); n != 0 {
			t.Fatalf("%d instances after the pod went", n)
		}
	})
}

// TestMIGPreferExisting: GPUs 0-1 hold static instances (all-balanced), the
// others carve at prepare (on Kubernetes 1.37 auto gives them mig; before
// it they are named). demo/mig/prefer-existing.yaml asks for 3 GiB with the
// existing instances listed first: the pod gets one of GPUs 0-1's
// instances through the `existing` subrequest, and nothing is carved.
func TestMIGPreferExisting(t *testing.T) {
	needGates(t, features.PartitionableDevices)
	setupNamespace(t)
	modes := "0-1=static-mig"
	if !utilversion.MustParseGeneric(e.gates.ServerVersion).AtLeast(utilversion.MustParseGeneric("1.37.0")) {
		modes += ",2-7=mig"
	}
	p := startPlugin(t, "dgx-h100", "--gpu-modes", modes, "--mig-layouts", "0-1=all-balanced")
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	waitFor(t, "GPUs 0-1 static-mig, 2-7 mig", time.Minute, func() (bool, error) {
		modes := map[int64]map[string]bool{}
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				i := *d.Attributes["index"].IntValue
				if modes[i] == nil {
					modes[i] = map[string]bool{}
				}
				modes[i][*d.Attributes["mode"].StringValue] = true
			}
		}
		for i := int64(0); i < 8; i++ {
			want := "mig"
			if i < 2 {
				want = "static-mig"
			}
			if len(modes[i]) != 1 || !modes[i][want] {
				return false, fmt.Errorf("GPU %d in modes %v, want %s", i, modes[i], want)
			}
		}
		return true, nil
	})
	before := simInstances(t)
	if len(before) != 8 {
		t.Fatalf("%d MIG instances after the layouts, want 8: %v", len(before), before)
	}

	kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "mig", "prefer-existing.yaml"))
	pod := waitPodRunning(t, "prefer-existing")
	modeOf := map[string]string{}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			modeOf[d.Name] = *d.Attributes["mode"].StringValue
		}
	}
	for _, c := range podClaims(t, pod) {
		r := c.Status.Allocation.Devices.Results[0]
		if r.Request != "mig/existing" || modeOf[r.Device] != "static-mig" {
			t.Errorf("allocated %s (mode %s) through %s, want a static instance through mig/existing", r.Device, modeOf[r.Device], r.Request)
		}
		t.Logf("allocated %s through %s", r.Device, r.Request)
	}
	if after := simInstances(t); !maps.Equal(after, before) {
		t.Errorf("MIG instances %v after the claim, want the layouts' %v: nothing carved", after, before)
	}

	// The second preference: a GPU where a claim already holds a carved
	// instance. A 1g.10gb carved on GPU 4 brings GPU 4 into MIG use; the
	// plugin republishes its migInUse; a claim with the demo's split and
	// carved subrequests then lands there, through split.
	applyYAML(t, claimPod("carve-on-4", `{name: mig, exactly: {deviceClassName: mig-1g.10gb.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4'}}]}}`))
	waitPodRunning(t, "carve-on-4")
	waitMIGInUse(t, map[int64]bool{4: true})
	applyYAML(t, claimPod("split", `{name: mig, firstAvailable: [`+
		`{name: split, deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].mode in ["mig", "dynamic"] && device.attributes["gpu.facet.dev"].migInUse'}}]}, `+
		`{name: carved, deviceClassName: mig.facet.dev}]}`))
	for _, c := range podClaims(t, waitPodRunning(t, "split")) {
		r := c.Status.Allocation.Devices.Results[0]
		if r.Request != "mig/split" || !strings.HasPrefix(r.Device, "gpu-4-") {
			t.Errorf("allocated %s through %s, want a carve on gpu-4 through mig/split", r.Device, r.Request)
		}
	}
	kubectl(t, "delete", "pod", "-n", namespace, "carve-on-4", "split", "--wait=true", "--timeout=120s")
	waitMIGInUse(t, map[int64]bool{})
}

// waitMIGInUse waits until the published migInUse is true on exactly the
// GPUs of want (by index) among those that carry it.
func waitMIGInUse(t testing.TB, want map[int64]bool) {
	t.Helper()
	waitFor(t, fmt.Sprintf("migInUse on GPUs %v", want), time.Minute, func() (bool, error) {
		got := map[int64]bool{}
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes["migInUse"]; ok && *a.BoolValue {
					got[*d.Attributes["index"].IntValue] = true
				}
			}
		}
		if !maps.Equal(got, want) {
			return false, fmt.Errorf("true on %v", got)
		}
		return true, nil
	})
}
