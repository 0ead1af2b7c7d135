package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
)

const mpsNS = "facet-mps-live"

// mpsClientPod is a pod of UID 1000 on GPU 4 whose container pings its MPS
// daemon through the simulated driver's client every second, logging "ok
// <unix time>" or "FAIL <unix time>".
func mpsClientPod(name string) string {
	return strings.Replace(strings.Replace(testenv.ClaimPod(name, mpsNS, "share", "share"),
		"securityContext: {runAsUser: 0}", "securityContext: {runAsUser: 1000}", 1),
		`command: ["sleep", "86400"]`,
		`command: ["sh", "-c", "while true; do if echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then echo ok $(date +%s); else echo FAIL $(date +%s); fi; sleep 1; done"]`, 1)
}

// TestLiveChartMPS: MPS shares as the chart installs them. facet-mps (the
// MPS DaemonSet) runs the GPU's daemon, chrooted into the simulated driver
// root, whose glibc the image's loader cannot load; a share pod of UID 1000
// joins it. Deleting the plugin pod, then `helm upgrade` with the chart's
// maxSurge rolling update, leave the daemon alone: the same PID, never a
// second start or a quit, the pipe directory never emptied, the connected
// client never failing a ping, and facet-mps's pod never replaced
// (OnDelete). A share created afterwards joins the same daemon. Each
// share's /dev/shm is the GPU's tmpfs of the chart's mps.shmSize.
func TestLiveChartMPS(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	tagB := r.tag + "-b"
	r.ctrRun(t, "images", "tag", "--force", "facet.local/facet:"+r.tag, "facet.local/facet:"+tagB)
	group := `mode: auto, gpuModes: "4=shared"`
	request := `{name: share, exactly: {deviceClassName: vgpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4'}}], capacity: {requests: {memory: 2000Mi, cores: "20"}}}}`
	if r.stock {
		group = `mode: auto, gpuModes: "4=slots", gpuSlots: "4=1x40Gi/50+2"`
		request = `{name: share, exactly: {deviceClassName: vgpu-slot.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 4 && device.capacity["gpu.facet.dev"].cores.compareTo(quantity("50")) < 0'}}]}}`
	}
	r.install(t, r.values(t, r.tag, group))
	plugin := r.waitPlugin(t, r.tag, 2*time.Minute)
	mpsPod := r.waitMPS(t)
	// The share needs HAMi-core, which its own pod installs.
	r.waitHAMiCore(t, 2*time.Minute)
	t.Logf("plugin pod %s, facet-mps pod %s and hami-core Ready (%s)", plugin.Name, mpsPod.Name, r.since())

	r.Must(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+mpsNS+"}\n", "apply", "-f", "-")
	t.Cleanup(func() { _, _ = r.Run("", "delete", "namespace", mpsNS, "--wait=true", "--timeout=120s") })
	r.Must(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share, namespace: `+mpsNS+`}
spec:
  spec:
    devices:
      requests:
      - `+request+`
`, "apply", "-f", "-")
	r.Must(t, mpsClientPod("client"), "apply", "-f", "-")
	r.waitRunning(t, mpsNS, "client", 3*time.Minute)
	out := r.Must(t, "", "exec", "-n", mpsNS, "client", "--", "sh", "-c", "env; echo SHM=$(df -k /dev/shm | tail -n 1)")
	env := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	gpu := env["FACET_GPU_UUIDS"]
	if env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || gpu == "" {
		t.Fatalf("client: CUDA_MPS_PIPE_DIRECTORY=%q on %q, want /tmp/nvidia-mps (MPS) on one GPU:\n%s\nplugin log:\n%s", env["CUDA_MPS_PIPE_DIRECTORY"], gpu, out, r.pluginLog(""))
	}
	if f := strings.Fields(env["SHM"]); len(f) < 2 || f[1] != "1048576" {
		t.Errorf("client's /dev/shm %q: want the GPU's tmpfs of mps.shmSize 1Gi (1048576 KiB)", env["SHM"])
	}
	dir := filepath.Join(r.mpsDir(), gpu)
	pid := daemonOf(dir)
	if pid == 0 {
		t.Fatalf("no live daemon named in %s\nfacet-mps log:\n%s", dir, r.mpsLog())
	}
	// hostPID: the daemon's PID, written by itself into the pipe
	// directory, is the host's.
	if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); !strings.Contains(string(cmd), "nvidia-cuda-mps-control") {
		t.Fatalf("PID %d of the pid file is %q on the host, not the daemon: facet-mps runs without hostPID?", pid, cmd)
	}
	logFrom := len(readFile(filepath.Join(dir, "log", "control.log")))
	untouched := func(when string) {
		t.Helper()
		log := readFile(filepath.Join(dir, "log", "control.log"))[logFrom:]
		if got := daemonOf(dir); got != pid || strings.Contains(log, " startup ") || strings.Contains(log, " quit") || strings.Contains(log, " terminated") {
			t.Fatalf("%s: daemon %d, want %d untouched; its log since:\n%s", when, got, pid, log)
		}
		if _, err := os.Stat(filepath.Join(dir, "pipe", "control")); err != nil {
			t.Fatalf("%s: the pipe directory lost its control pipe: %v", when, err)
		}
		if p := r.waitMPS(t); p.UID != mpsPod.UID {
			t.Fatalf("%s: facet-mps pod %s replaced by %s", when, mpsPod.Name, p.Name)
		}
		t.Logf("%s: daemon %d untouched (%s)", when, pid, r.since())
	}

	r.Must(t, "", "delete", "pod", "-n", chartNS, plugin.Name, "--wait=true", "--timeout=120s")
	next := r.waitPlugin(t, r.tag, 2*time.Minute)
	if next.Name == plugin.Name {
		t.Fatalf("plugin pod %s was not replaced", plugin.Name)
	}
	untouched("plugin pod " + plugin.Name + " deleted, " + next.Name + " Ready")

	up := action.NewUpgrade(r.cfg)
	up.Namespace, up.Timeout = chartNS, 3*time.Minute
	rel, err := up.Run(chartRelease, r.ch, r.values(t, tagB, group))
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	cur := r.waitPlugin(t, tagB, 3*time.Minute)
	untouched(fmt.Sprintf("helm upgrade (revision %d) rolled the plugin to %s", rel.Version, cur.Name))

	r.Must(t, mpsClientPod("late"), "apply", "-f", "-")
	r.waitRunning(t, mpsNS, "late", 3*time.Minute)
	testenv.WaitFor(t, "the late share's pings reaching the daemon", 30*time.Second, func() (bool, error) {
		out, err := r.Run("", "logs", "-n", mpsNS, "late")
		return strings.Contains(out, "ok "), fmt.Errorf("%v: %s", err, out)
	})
	untouched("a share created after the upgrade joined")

	clientLog := r.Must(t, "", "logs", "-n", mpsNS, "client")
	var last int64
	var gaps []string
	for _, l := range strings.Split(strings.TrimSpace(clientLog), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		at, _ := strconv.ParseInt(f[1], 10, 64)
		if f[0] != "ok" {
			gaps = append(gaps, l)
		} else if last != 0 && at-last > 30 {
			// A ping a second; 30 s without one is a client blocked on a
			// control pipe no daemon reads, not a busy machine.
			gaps = append(gaps, fmt.Sprintf("no ping answered for %d s before %d", at-last, at))
		}
		if f[0] == "ok" {
			last = at
		}
	}
	if len(gaps) > 0 || last == 0 {
		t.Errorf("the connected client lost its daemon: %v", gaps)
	}
	evs, err := r.Client.CoreV1().Events(mpsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Reason == "FacetMPSDaemonRestarted" || strings.Contains(ev.Reason, "DynamicResources") {
			t.Errorf("event %s on %s: %s", ev.Reason, ev.InvolvedObject.Name, ev.Message)
		}
	}
}

// waitMPS waits for the one facet-mps pod, Running with its startup probe
// passed, and returns it.
func (r *chartRig) waitMPS(t testing.TB) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testenv.WaitFor(t, "the facet-mps pod Running and started", 2*time.Minute, func() (bool, error) {
		pods, err := r.Client.CoreV1().Pods(chartNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=mps"})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d facet-mps pods: %v", len(pods.Items), err)
		}
		pod = &pods.Items[0]
		started := len(pod.Status.ContainerStatuses) == 1 && pod.Status.ContainerStatuses[0].Started != nil && *pod.Status.ContainerStatuses[0].Started
		return pod.Status.Phase == corev1.PodRunning && started, fmt.Errorf("phase %s, statuses %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
	})
	return pod
}

func (r *chartRig) mpsLog() string {
	out, _ := r.Run("", "logs", "-n", chartNS, "-l", "app.kubernetes.io/component=mps", "--tail=-1")
	return out
}

func (r *chartRig) waitRunning(t testing.TB, ns, name string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, "pod "+name+" Running", timeout, func() (bool, error) {
		p, err := r.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
	})
}

// daemonOf is the live daemon a GPU's pipe directory names, 0 if none.
func daemonOf(gpuDir string) int {
	b, err := os.ReadFile(filepath.Join(gpuDir, "pipe", "nvidia-cuda-mps-control.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(st), ") Z ") {
		return 0
	}
	return pid
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
