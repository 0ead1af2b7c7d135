package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/features"
	"github.com/facet-gpu/facet/pkg/mps/mpssim"
)

// TestMPS: two shares of one GPU (consumable capacity with the gates on,
// vGPU slots on stock 1.35) join its one MPS control daemon, the simulated
// driver root's stand-in: each container sees the GPU's pipe directory,
// the daemon's /dev/shm and its share's active thread percentage, and
// talks to the daemon as an MPS client. A plugin killed in the middle is
// replaced by one that adopts the daemon; the daemon stops with the last
// claim.
//
// It runs only with FACET_E2E_MPS=1: on its first live run (2026-11-25) the
// daemon was started twice for one GPU and a restarted plugin started a new
// daemon instead of adopting the running one, so it is not yet a round of
// make test (issue 20).
func TestMPS(t *testing.T) {
	if os.Getenv("FACET_E2E_MPS") == "" {
		t.Skip("FACET_E2E_MPS is not set: the MPS daemon's adoption has not yet passed live (issue 20)")
	}
	ctx := context.Background()
	setupNamespace(t)
	mpsDir := filepath.Join(e.runDir, "mps")
	shares := e.gates.Has(features.ConsumableCapacity)
	args := []string{"--gpu-modes", "4=slots", "--gpu-slots", "4=1x40Gi/50+2"}
	onGPU4 := `selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.attributes["gpu.facet.dev"].computePartitioning == "mps"'}}]`
	requests := map[string]string{
		"mps-small": `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, ` + onGPU4 + `}}`,
		"mps-big":   `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.capacity["gpu.facet.dev"].cores.compareTo(quantity("50")) >= 0'}}]}}`,
	}
	want := map[string]string{"mps-small": "25", "mps-big": "50"}
	if shares {
		args = []string{"--gpu-modes", "4=shared"}
		requests = map[string]string{
			"mps-small": `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 2000Mi, cores: "20"}}}}`,
			"mps-big":   `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 3000Mi, cores: "50"}}}}`,
		}
		want = map[string]string{"mps-small": "20", "mps-big": "50"}
	}
	p := startPlugin(t, "dgx-h100", args...)
	deleteNamespaceAtEnd(t)
	// No daemon outlives the test, whatever happened.
	t.Cleanup(func() {
		entries, _ := os.ReadDir(mpsDir)
		for _, en := range entries {
			if pid := daemonPID(filepath.Join(mpsDir, en.Name())); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	for name, req := range requests {
		applyYAML(t, claimPod(name, req))
	}
	var gpu string
	for name, pct := range want {
		waitPodRunning(t, name)
		out := execIn(t, name, "", "env; echo SHM=$(ls /dev/shm | tr '\\n' ' '); echo PIPE=$(ls /tmp/nvidia-mps | tr '\\n' ' '); echo get_server_list | nvidia-cuda-mps-control && echo CLIENT=ok")
		env := envOf(out)
		for k, v := range map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct, "CUDA_DEVICE_SM_LIMIT_0": "0", "CLIENT": "ok"} {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q\n%s", name, k, env[k], v, out)
			}
		}
		if !strings.Contains(env["SHM"], mpssim.ShmMarker) {
			t.Errorf("%s: /dev/shm (%q) is not the GPU daemon's", name, env["SHM"])
		}
		if !strings.Contains(env["PIPE"], "control") {
			t.Errorf("%s: pipe directory holds %q, no control pipe", name, env["PIPE"])
		}
		if gpu != "" && env["FACET_GPU_UUIDS"] != gpu {
			t.Fatalf("shares on GPUs %s and %s, want one", gpu, env["FACET_GPU_UUIDS"])
		}
		gpu = env["FACET_GPU_UUIDS"]
	}
	dir := filepath.Join(mpsDir, gpu)
	pid := daemonPID(dir)
	if pid == 0 {
		t.Fatalf("no live MPS daemon for %s", gpu)
	}
	log := controlLog(dir)
	if n := strings.Count(log, " startup "); n != 1 || !strings.Contains(log, "gpu="+gpu) {
		t.Errorf("%d daemon starts, want 1 for %s:\n%s", n, gpu, log)
	}
	for _, pct := range want {
		if !strings.Contains(log, "pct="+pct+" cmd=get_server_list") {
			t.Errorf("the daemon saw no client at %s %%:\n%s", pct, log)
		}
	}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["computePartitioning"]; ok && *d.Attributes["index"].IntValue == 4 && *a.StringValue != "mps" {
				t.Errorf("%s: computePartitioning %q", d.Name, *a.StringValue)
			}
		}
	}

	// A plugin killed in the middle: its successor adopts the daemon.
	p.kill(t)
	p = startPlugin(t, "dgx-h100", args...)
	if got := daemonPID(dir); got != pid || strings.Count(controlLog(dir), " startup ") != 1 {
		t.Fatalf("after a plugin restart: daemon %d, want %d adopted:\n%s", got, pid, controlLog(dir))
	}
	if !strings.Contains(p.logText(), "Adopted the running MPS control daemon") {
		t.Error("the restarted plugin does not say it adopted the daemon")
	}

	kubectl(t, "delete", "pod", "-n", namespace, "mps-small", "--wait=true", "--timeout=120s")
	waitFor(t, "mps-small's claim unprepared", 2*time.Minute, func() (bool, error) {
		list, err := e.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range list.Items {
			if strings.HasPrefix(c.Name, "mps-small") {
				return false, fmt.Errorf("claim %s still exists", c.Name)
			}
		}
		return true, nil
	})
	if daemonPID(dir) != pid {
		t.Fatal("the daemon stopped while a claim still holds its GPU")
	}
	kubectl(t, "delete", "pod", "-n", namespace, "mps-big", "--wait=true", "--timeout=120s")
	waitFor(t, "daemon stopped with the last claim", 2*time.Minute, func() (bool, error) {
		return daemonPID(dir) == 0, fmt.Errorf("daemon %d alive", daemonPID(dir))
	})
	if log := controlLog(dir); !strings.Contains(log, " quit") {
		t.Errorf("the daemon was not stopped by quit:\n%s", log)
	}
}

// daemonPID is the live stand-in daemon a GPU's pipe directory names, 0 if
// none.
func daemonPID(gpuDir string) int {
	b, err := os.ReadFile(filepath.Join(gpuDir, "pipe", "nvidia-cuda-mps-control.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(st), ") Z ") {
		return 0
	}
	return pid
}

func controlLog(gpuDir string) string {
	b, _ := os.ReadFile(filepath.Join(gpuDir, "log", "control.log"))
	return string(b)
}
