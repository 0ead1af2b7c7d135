package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// gpuInfo is what the published slices say about each whole-GPU device.
type gpuInfo struct {
	uuid  string
	index int64
	mode  string
}

func publishedGPUs(t testing.TB) map[string]gpuInfo {
	out := map[string]gpuInfo{}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if v := d.Attributes["type"].StringValue; v != nil && *v == "gpu" {
				out[d.Name] = gpuInfo{uuid: *d.Attributes["uuid"].StringValue, index: *d.Attributes["index"].IntValue, mode: *d.Attributes["mode"].StringValue}
			}
		}
	}
	return out
}

func specPath(uid types.UID) string {
	return filepath.Join(e.cdiDir, "gpu.facet.dev-claim_"+string(uid)+".json")
}

// hasRecord says whether the plugin's checkpoint holds a record of uid,
// in its journal or its record files.
func hasRecord(t *testing.T, uid types.UID) bool {
	t.Helper()
	c, err := checkpoint.Peek(filepath.Join(e.runDir, "facet-state", "claims"), uid)
	if err != nil {
		t.Fatalf("checkpoint of claim %s: %v", uid, err)
	}
	return c != nil
}

// autoModes is the mode the plugin's auto policy (pkg/model/inventory) gives
// each GPU of the machine file demo/machines/<machine>.yaml, without MIG
// instances, on this node's cluster (e.gates, with its server version), by
// NVML index.
func autoModes(t testing.TB, machine string) map[int64]string {
	t.Helper()
	node, err := sim.DiscoverMachine(filepath.Join(e.repo, "demo", "machines", machine+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	gates := e.gates
	inv, err := inventory.Build(node, inventory.Config{Features: &gates})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, g := range inv.GPUs {
		out[int64(g.Index)] = string(g.Mode)
	}
	return out
}

// waitModes waits until the API server holds this plugin's slices: all 8
// GPUs with the mode each should have. Counting devices is not enough: a
// previous plugin's slices, in other modes, have as many until replaced,
// and a claim the scheduler allocates from them is refused at prepare.
func waitModes(t testing.TB, want func(index int64) string) {
	t.Helper()
	waitFor(t, "slices in the expected modes", time.Minute, func() (bool, error) {
		gpus := publishedGPUs(t)
		if len(gpus) != 8 {
			return false, fmt.Errorf("%d GPUs", len(gpus))
		}
		for name, g := range gpus {
			if g.mode != want(g.index) {
				return false, fmt.Errorf("%s in mode %s", name, g.mode)
			}
		}
		return true, nil
	})
}

// TestWholeGPUs runs the whole-GPU path on the real node, in order:
// publish, run pods, refuse the impossible, survive SIGKILL, clean up.
func TestWholeGPUs(t *testing.T) {
	ctx := context.Background()
	setupNamespace(t)

	// auto on H100s without MIG instances: exclusive before Kubernetes
	// 1.37, mig from 1.37 where partitionable devices are enforced. This
	// test is about whole GPUs, so where auto gives mig it names exclusive
	// (TestMIGAndShares runs mig mode).
	var args []string
	for i, m := range autoModes(t, "dgx-h100") {
		if m != "exclusive" {
			t.Logf("auto gives GPU %d %s on this cluster (%s); this test runs --mode exclusive", i, m, e.gates.ServerVersion)
			args = []string{"--mode", "exclusive"}
			break
		}
	}
	p := startPlugin(t, "dgx-h100", args...)
	deleteNamespaceAtEnd(t)
	waitModes(t, func(int64) string { return "exclusive" })
	gpus := publishedGPUs(t)

	claimUIDs := map[string]types.UID{}
	t.Run("pods run with their GPUs' CDI edits", func(t *testing.T) {
		for _, f := range []string{"one-gpu.yaml", "two-gpus.yaml"} {
			kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "gpu", f))
		}
		for pod, want := range map[string]int{"one-gpu": 1, "two-gpus": 2} {
			p := waitPodRunning(t, pod)
			claims := podClaims(t, p)
			if len(claims) != 1 {
				t.Fatalf("%s: %d claims", pod, len(claims))
			}
			for _, c := range claims {
				claimUIDs[pod] = c.UID
				checkAllocatedPod(t, p, c, gpus, want)
			}
		}
	})
	if t.Failed() {
		t.Logf("plugin log:\n%s", p.logText())
		t.FailNow()
	}

	t.Run("an impossible claim stays Pending with a scheduler event", func(t *testing.T) {
		applyYAML(t, claimPod("nine-gpus", `{name: gpus, exactly: {deviceClassName: gpu.facet.dev, count: 9}}`))
		waitEvent(t, "nine-gpus", "FailedScheduling", "cannot allocate all claims")
		pod, err := e.client.CoreV1().Pods(namespace).Get(ctx, "nine-gpus", metav1.GetOptions{})
		if err != nil || pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
			t.Fatalf("nine-gpus: %v phase %s node %q", err, pod.Status.Phase, pod.Spec.NodeName)
		}
	})

	outer := t
	t.Run("SIGKILL and restart keep prepared claims, then unprepare cleanly", func(t *testing.T) {
		p.kill(t)
		for _, uid := range claimUIDs {
			if !fileExists(specPath(uid)) || !hasRecord(t, uid) {
				t.Fatalf("claim %s lost its spec or checkpoint with the plugin down", uid)
			}
		}
		// Started on the outer test so it outlives this subtest and the
		// namespace cleanup can unprepare through it.
		p2 := startPlugin(outer, "dgx-h100")
		deleteNamespaceAtEnd(outer)
		waitFor(t, "restart restores both claims", time.Minute, func() (bool, error) {
			n := strings.Count(p2.logText(), "Restored prepared claim")
			return n == 2, fmt.Errorf("%d restored", n)
		})
		if strings.Contains(p2.logText(), "Removing orphaned CDI spec") {
			t.Fatalf("restart removed a live claim's spec:\n%s", p2.logText())
		}
		// The pods never noticed.
		for pod := range claimUIDs {
			waitPodRunning(t, pod)
		}
		for _, pod := range []string{"one-gpu", "two-gpus"} {
			uid := claimUIDs[pod]
			kubectl(t, "delete", "pod", "-n", namespace, pod, "--wait=true", "--timeout=120s")
			waitFor(t, "CDI spec and checkpoint of "+pod+" removed", time.Minute, func() (bool, error) {
				return !fileExists(specPath(uid)) && !hasRecord(t, uid), nil
			})
		}
		if got := strings.Count(p2.logText(), "Unprepared claim"); got != 2 {
			t.Fatalf("%d claims unprepared, want 2", got)
		}
	})
}

// checkAllocatedPod checks a running pod against its claim: the claim's
// devices are ours, the CDI spec exists, and the container got exactly its
// GPUs (containerd) or the kubelet handed the runtime exactly the claim's
// CDI device IDs (fake CRI).
func checkAllocatedPod(t *testing.T, pod *corev1.Pod, claim *resourceapi.ResourceClaim, gpus map[string]gpuInfo, want int) {
	t.Helper()
	if claim.Status.Allocation == nil {
		t.Fatalf("%s: claim %s not allocated", pod.Name, claim.Name)
	}
	var uuids, devices []string
	var minors []int64
	for _, r := range claim.Status.Allocation.Devices.Results {
		g, ok := gpus[r.Device]
		if r.Driver != driverName || r.Pool != nodeName || !ok {
			t.Fatalf("%s: unexpected allocation %+v", pod.Name, r)
		}
		uuids = append(uuids, g.uuid)
		devices = append(devices, r.Device)
		minors = append(minors, g.index)
	}
	if len(devices) != want {
		t.Fatalf("%s: %d devices allocated, want %d", pod.Name, len(devices), want)
	}
	t.Logf("%s: claim %s allocated %v", pod.Name, claim.Name, devices)
	if !fileExists(specPath(claim.UID)) {
		t.Fatalf("%s: no CDI spec %s", pod.Name, specPath(claim.UID))
	}
	if e.runtime == "fake" {
		checkFakeCRI(t, pod, claim, devices)
		return
	}
	out := kubectl(t, "exec", "-n", pod.Namespace, pod.Name, "--", "sh", "-c", "env; echo ---; ls /dev; echo ---; cat /proc/mounts")
	parts := strings.Split(out, "---\n")
	if len(parts) != 3 {
		t.Fatalf("%s: unexpected exec output:\n%s", pod.Name, out)
	}
	env, dev, mounts := parts[0], parts[1], parts[2]
	if !strings.Contains(env, "FACET_GPU_UUIDS="+strings.Join(uuids, ",")+"\n") {
		t.Errorf("%s: env lacks FACET_GPU_UUIDS=%s:\n%s", pod.Name, strings.Join(uuids, ","), env)
	}
	if !strings.Contains(env, "FACET_DEVICES="+strings.Join(devices, ",")+"\n") {
		t.Errorf("%s: env lacks FACET_DEVICES=%s", pod.Name, strings.Join(devices, ","))
	}
	var gotMinors []int64
	for _, m := range regexp.MustCompile(`(?m)^nvidia(\d+)$`).FindAllStringSubmatch(dev, -1) {
		var n int64
		if _, err := fmt.Sscan(m[1], &n); err != nil {
			t.Fatal(err)
		}
		gotMinors = append(gotMinors, n)
	}
	slices.Sort(gotMinors)
	slices.Sort(minors)
	if !slices.Equal(gotMinors, minors) {
		t.Errorf("%s: container has /dev/nvidia%v, want exactly %v", pod.Name, gotMinors, minors)
	}
	if !regexp.MustCompile(`(?m)^nvidiactl$`).MatchString(dev) {
		t.Errorf("%s: no /dev/nvidiactl in container:\n%s", pod.Name, dev)
	}
	if !strings.Contains(mounts, "libcuda.so.") {
		t.Errorf("%s: libcuda is not mounted:\n%s", pod.Name, mounts)
	}
}

func checkFakeCRI(t *testing.T, pod *corev1.Pod, claim *resourceapi.ResourceClaim, devices []string) {
	t.Helper()
	f, err := os.Open(os.Getenv("FACET_CDI_LOG"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	for _, d := range devices {
		want = append(want, "gpu.facet.dev/claim="+string(claim.UID)+"-"+d)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil || !strings.Contains(sc.Text(), pod.Name) {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(sc.Text(), w)
		}
		if ok {
			return
		}
	}
	t.Errorf("%s: fake CRI never received CDI devices %v", pod.Name, want)
}
