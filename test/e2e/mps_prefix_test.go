package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

// TestMPSDriverPrefix: on a node whose driver is under a prefix of its own
// (GKE's /home/kubernetes/bin/nvidia, a runfile's /usr/local/nvidia), a
// share partitioned by MPS runs. The plugin reads the simulated prefix as
// its --driver-root, the device nodes from the host's root (--dev-root);
// facet-mps, given the host's root (--host-root) as the chart gives it
// /host, runs the GPU's daemon chrooted there, executing the prefix's
// nvidia-cuda-mps-control with the prefix's libraries, and the share's
// container talks to it as an MPS client; the daemon quits with the claim.
func TestMPSDriverPrefix(t *testing.T) {
	if e.runtime == "fake" {
		t.Skip("needs a real container runtime: the share's container talks to the daemon")
	}
	lib, err := sim.OpenMachine(filepath.Join(e.repo, "demo", "machines", "dgx-h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := lib.Discover()
	lib.Close()
	if err != nil {
		t.Fatal(err)
	}
	var minors []int
	for _, g := range node.GPUs {
		minors = append(minors, g.Minor)
	}
	shares := e.gates.Has(features.ConsumableCapacity)
	args := []string{"--gpu-modes", "4=slots", "--gpu-slots", "4=1x40Gi/50+2"}
	onGPU4 := `selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.attributes["gpu.facet.dev"].computePartitioning == "mps"'}}]`
	request, wantPct := `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, `+onGPU4+`}}`, "25"
	if shares {
		args = []string{"--gpu-modes", "4=shared"}
		request, wantPct = `{name: req, exactly: {deviceClassName: vgpu.facet.dev, `+onGPU4+`, capacity: {requests: {memory: 2000Mi, cores: "20"}}}}`, "20"
	}
	for i, prefix := range mpssim.Prefixes {
		t.Run(prefix, func(t *testing.T) {
			setupNamespace(t)
			host := filepath.Join(e.runDir, fmt.Sprintf("prefix-host-%d", i))
			if err := sim.LayoutPrefixDriverRoot(host, prefix, node.DriverVersion, minors); err != nil {
				t.Fatal(err)
			}
			driverRoot := filepath.Join(host, prefix)
			mpsDir := filepath.Join(e.runDir, fmt.Sprintf("mps-prefix-%d", i))
			startPrefixMPS(t, driverRoot, host, mpsDir)
			name := fmt.Sprintf("mps-prefix-%d", i)
			p := startPlugin(t, "dgx-h100", append([]string{"--driver-root", driverRoot, "--dev-root", host, "--mps-dir", mpsDir}, args...)...)
			deleteNamespaceAtEnd(t)
			if !strings.Contains(p.logText(), `hostRoot="`+host+`"`) {
				t.Errorf("the plugin did not reach a facet-mps running the prefix's daemons from the host's root %s:\n%s", host, p.logText())
			}
			applyYAML(t, claimPod(name, request))
			waitPodRunning(t, name)
			out := execIn(t, name, "", "env; echo get_server_list | nvidia-cuda-mps-control && echo CLIENT=ok")
			env := envOf(out)
			for k, v := range map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": wantPct, "CLIENT": "ok"} {
				if env[k] != v {
					t.Errorf("%s: %s=%q, want %q\n%s", name, k, env[k], v, out)
				}
			}
			gpuDir := filepath.Join(mpsDir, env["FACET_GPU_UUIDS"])
			pid := daemonPID(gpuDir)
			if pid == 0 {
				t.Fatalf("no live MPS daemon in %s", gpuDir)
			}
			if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || root != host {
				t.Errorf("the daemon's root %q (%v), want the host's root %s", root, err, host)
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if !strings.Contains(string(cmdline), prefix+"/bin/nvidia-cuda-mps-control") {
				t.Errorf("the daemon runs %q, want the prefix's %s/bin/nvidia-cuda-mps-control", cmdline, prefix)
			}
			waitFor(t, "the daemon logging the share's client at "+wantPct+" %", 30*time.Second, func() (bool, error) {
				log := controlLog(gpuDir)
				return strings.Contains(log, "libcuda="+prefix+"/lib64/libcuda.so.1") && strings.Contains(log, "pct="+wantPct+" cmd=get_server_list"), fmt.Errorf("log:\n%s", log)
			})
			kubectl(t, "delete", "pod", "-n", namespace, name, "--wait=true", "--timeout=120s")
			waitFor(t, "the daemon stopped with the claim", 2*time.Minute, func() (bool, error) {
				return daemonPID(gpuDir) == 0, fmt.Errorf("daemon %d alive", daemonPID(gpuDir))
			})
		})
	}
}

// startPrefixMPS runs a facet-mps of the test's own, on mpsDir, for the
// driver root under the host root host, until the test ends, and kills
// what daemons it leaves.
func startPrefixMPS(t *testing.T, driverRoot, host, mpsDir string) {
	t.Helper()
	log := filepath.Join(e.runDir, "logs", filepath.Base(mpsDir)+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e.repo, "bin", "facet-mps"),
		"--driver-root", driverRoot, "--host-root", host,
		"--mps-dir", mpsDir, "--shm-size", mpsShmSize, "-v", "4")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		f.Close()
		entries, _ := os.ReadDir(mpsDir)
		for _, en := range entries {
			if pid := daemonPID(filepath.Join(mpsDir, en.Name())); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			_ = syscall.Unmount(filepath.Join(mpsDir, en.Name(), "shm"), syscall.MNT_DETACH)
		}
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("facet-mps (%s):\n%s", mpsDir, b)
		}
	})
	waitFor(t, "facet-mps answering with the prefix's control program", 30*time.Second, func() (bool, error) {
		if cmd.ProcessState != nil {
			b, _ := os.ReadFile(log)
			t.Fatalf("facet-mps exited:\n%s", b)
		}
		info, err := service.NewClient(mpsDir).Info(t.Context())
		if err != nil {
			return false, err
		}
		return info.Control != "" && info.HostRoot == host, fmt.Errorf("info %+v", info)
	})
}
