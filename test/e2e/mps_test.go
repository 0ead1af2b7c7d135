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

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// TestMPS: two shares of one GPU (consumable capacity with the gates on,
// vGPU slots on stock 1.35) join its one MPS control daemon, the simulated
// driver root's stand-in: each container sees the GPU's pipe directory,
// the daemon's /dev/shm and its share's active thread percentage, and
// talks to the daemon as an MPS client. A plugin killed in the middle is
// replaced by one that adopts the daemon; a daemon killed in the middle is
// started again in the same directories, so the running containers reach
// the new one, and its claims get an Event; the daemon stops with the last
// claim.
func TestMPS(t *testing.T) {
	ctx := context.Background()
	setupNamespace(t)
	mpsDir := filepath.Join(e.runDir, "mps")
	shares := e.gates.Has(features.ConsumableCapacity)
	// A daemon killed below is found within a second.
	args := []string{"--mps-check-interval", "1s", "--gpu-modes", "4=slots", "--gpu-slots", "4=1x40Gi/50+2"}
	onGPU4 := `selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.attributes["gpu.facet.dev"].computePartitioning == "mps"'}}]`
	requests := map[string]string{
		"mps-small": `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, ` + onGPU4 + `}}`,
		"mps-big":   `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.capacity["gpu.facet.dev"].cores.compareTo(quantity("50")) >= 0'}}]}}`,
	}
	want := map[string]string{"mps-small": "25", "mps-big": "50"}
	if shares {
		args = []string{"--mps-check-interval", "1s", "--gpu-modes", "4=shared"}
		requests = map[string]string{
			"mps-small": `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 2000Mi, cores: "20"}}}}`,
			"mps-big":   `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 3000Mi, cores: "50"}}}}`,
		}
		want = map[string]string{"mps-small": "20", "mps-big": "50"}
	}
	// Earlier tests' daemons logged into the same control.log files (the
	// log directory outlives its daemon): only what follows counts here.
	logFrom := map[string]int{}
	if entries, err := os.ReadDir(mpsDir); err == nil {
		for _, en := range entries {
			logFrom[en.Name()] = len(controlLog(filepath.Join(mpsDir, en.Name())))
		}
	}
	ourLog := func(gpu string) string { return controlLog(filepath.Join(mpsDir, gpu))[logFrom[gpu]:] }

	p := startPlugin(t, "dgx-h100", args...)
	deleteNamespaceAtEnd(t)
	first := p
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, q := range []*plugin{first, p} {
			for _, l := range strings.Split(q.logText(), "\n") {
				if strings.Contains(l, "MPS") {
					t.Logf("plugin %d: %s", i, l)
				}
			}
		}
	})
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
	// client runs the stand-in's client in a pod's container: it reaches
	// the daemon through the mounted pipe directory, and the daemon logs
	// the percentage the container's environment gives it.
	client := func(pod string) map[string]string {
		out := execIn(t, pod, "", "env; echo SHM=$(ls /dev/shm | tr '\\n' ' '); echo PIPE=$(ls /tmp/nvidia-mps | tr '\\n' ' '); echo get_server_list | nvidia-cuda-mps-control && echo CLIENT=ok")
		env := envOf(out)
		for k, v := range map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": want[pod], "CUDA_DEVICE_SM_LIMIT_0": "0", "CLIENT": "ok"} {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q\n%s", pod, k, env[k], v, out)
			}
		}
		if !strings.Contains(env["SHM"], mpssim.ShmMarker) {
			t.Errorf("%s: /dev/shm (%q) is not the GPU daemon's", pod, env["SHM"])
		}
		if !strings.Contains(env["PIPE"], "control") {
			t.Errorf("%s: pipe directory holds %q, no control pipe", pod, env["PIPE"])
		}
		return env
	}
	var gpu string
	for name := range want {
		waitPodRunning(t, name)
		env := client(name)
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
	if log := ourLog(gpu); strings.Count(log, " startup ") != 1 || !strings.Contains(log, fmt.Sprintf("startup pid=%d gpu=%s", pid, gpu)) {
		t.Errorf("want one daemon start, pid %d for %s:\n%s", pid, gpu, log)
	}
	for _, pct := range want {
		// The daemon logs a command after its client has gone.
		waitFor(t, "the daemon logging a client of UID 0 at "+pct+" %", 30*time.Second, func() (bool, error) {
			return strings.Contains(ourLog(gpu), "client uid=0 pid=") && strings.Contains(ourLog(gpu), "pct="+pct+" cmd=get_server_list"), fmt.Errorf("log:\n%s", ourLog(gpu))
		})
	}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["computePartitioning"]; ok && *d.Attributes["index"].IntValue == 4 && *a.StringValue != "mps" {
				t.Errorf("%s: computePartitioning %q", d.Name, *a.StringValue)
			}
		}
	}

	t.Log("a pod of another UID on the GPU: time-sliced, with an Event, rather than waiting behind root's MPS server")
	other := `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, ` + onGPU4 + `}}`
	otherSM := "25"
	if shares {
		other = `{name: req, exactly: {deviceClassName: vgpu.facet.dev, ` + onGPU4 + `, capacity: {requests: {memory: 1000Mi, cores: "10"}}}}`
		otherSM = "10"
	}
	applyYAML(t, runAsUser(claimPod("mps-other", other), 1001))
	waitPodRunning(t, "mps-other")
	env := envOf(execIn(t, "mps-other", "", "id -u; env"))
	if env["FACET_GPU_UUIDS"] != gpu || env["CUDA_MPS_PIPE_DIRECTORY"] != "" || env["CUDA_DEVICE_SM_LIMIT_0"] != otherSM {
		t.Errorf("mps-other (UID 1001): GPU %s, CUDA_MPS_PIPE_DIRECTORY %q, CUDA_DEVICE_SM_LIMIT_0 %q; want %s, none (time-sliced), %s", env["FACET_GPU_UUIDS"], env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_DEVICE_SM_LIMIT_0"], gpu, otherSM)
	}
	waitEventLogged(t, "mps-other", "FacetMPSNotApplied", "serves UID 0")
	// Gone before the plugin restarts below: the namespace's deletion at
	// the end must not wait for the first plugin, which is no more.
	kubectl(t, "delete", "pod", "-n", namespace, "mps-other", "--wait=true", "--timeout=120s")

	t.Log("each share's /dev/shm is the GPU's tmpfs of --shm-size: filling it fails there, not on the host's /run")
	shm := execIn(t, "mps-big", "", "df -k /dev/shm | tail -n 1; dd if=/dev/zero of=/dev/shm/fill bs=1M count=32 2>&1; echo rc=$?; rm -f /dev/shm/fill")
	if f := strings.Fields(shm); len(f) < 2 || f[1] != "16384" || !strings.Contains(shm, "No space left on device") || strings.Contains(shm, "rc=0") {
		t.Errorf("mps-big's /dev/shm: want a 16384 KiB tmpfs that 32 MiB overflows with ENOSPC:\n%s", shm)
	}

	t.Log("a plugin killed in the middle: the daemon, kept by facet-mps, is untouched")
	p.kill(t)
	p = startPlugin(t, "dgx-h100", args...)
	if got := daemonPID(dir); got != pid || strings.Count(ourLog(gpu), " startup ") != 1 || strings.Contains(ourLog(gpu), " quit") {
		t.Fatalf("after a plugin restart: daemon %d, want %d untouched:\n%s", got, pid, ourLog(gpu))
	}

	t.Log("facet-mps gone: the shares are republished as time-sliced and a new share stays Pending; back, facet-mps is adopted, the share lands and joins, and the restarted facet-mps adopts the daemon")
	mpsd.stop()
	waitPartitioning(t, "time-sliced")
	applyYAML(t, claimPod("mps-late", requests["mps-small"]))
	waitUnschedulable(t, "mps-late")
	mpsd = startMPSHost(t)
	waitPartitioning(t, "mps")
	waitPodRunning(t, "mps-late")
	if env := envOf(execIn(t, "mps-late", "", "env")); env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != want["mps-small"] {
		t.Errorf("mps-late: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want %s (MPS)", env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], want["mps-small"])
	}
	waitFor(t, "the new facet-mps adopting the daemon (the plugin hands its holders over)", time.Minute, func() (bool, error) {
		return strings.Contains(mpsd.logText(), "Adopted the running MPS control daemon"), fmt.Errorf("facet-mps log:\n%s", mpsd.logText())
	})
	if got := daemonPID(dir); got != pid {
		t.Fatalf("after facet-mps restarted: daemon %d, want %d adopted", got, pid)
	}
	kubectl(t, "delete", "pod", "-n", namespace, "mps-late", "--wait=true", "--timeout=120s")

	t.Log("a daemon killed in the middle: started again, its claims told, the running containers reach the new one")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restarted int
	waitFor(t, "the killed daemon started again", time.Minute, func() (bool, error) {
		restarted = daemonPID(dir)
		return restarted != 0 && restarted != pid, fmt.Errorf("daemon %d", restarted)
	})
	waitFor(t, "a "+reasonMPSRestarted+" Event on each claim", time.Minute, func() (bool, error) {
		evs, err := e.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims := map[string]bool{}
		for _, ev := range evs.Items {
			if ev.Reason == reasonMPSRestarted && ev.InvolvedObject.Kind == "ResourceClaim" && strings.Contains(ev.Message, gpu) {
				claims[ev.InvolvedObject.Name] = true
			}
		}
		return len(claims) == len(want), fmt.Errorf("on claims %v", claims)
	})
	mark := len(ourLog(gpu))
	client("mps-big")
	// The daemon logs a command after its client has gone.
	waitFor(t, "mps-big's running container reaching the new daemon", 30*time.Second, func() (bool, error) {
		return strings.Contains(ourLog(gpu)[mark:], "pct="+want["mps-big"]+" cmd=get_server_list"), fmt.Errorf("daemon %d's log:\n%s", restarted, ourLog(gpu))
	})

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
	if daemonPID(dir) != restarted {
		t.Fatal("the daemon stopped while a claim still holds its GPU")
	}
	kubectl(t, "delete", "pod", "-n", namespace, "mps-big", "--wait=true", "--timeout=120s")
	waitFor(t, "daemon stopped with the last claim", 2*time.Minute, func() (bool, error) {
		return daemonPID(dir) == 0, fmt.Errorf("daemon %d alive", daemonPID(dir))
	})
	if log := ourLog(gpu); !strings.HasSuffix(strings.TrimSpace(log), " quit") {
		t.Errorf("the daemon was not stopped by quit:\n%s", log)
	}
}

// runAsUser sets a claimPod's pod-level securityContext.runAsUser (0 in
// testenv.ClaimPod).
func runAsUser(podYAML string, uid int) string {
	return strings.Replace(podYAML, "securityContext: {runAsUser: 0}", fmt.Sprintf("securityContext: {runAsUser: %d}", uid), 1)
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

// reasonMPSRestarted is driver.ReasonMPSRestarted.
const reasonMPSRestarted = "FacetMPSDaemonRestarted"
