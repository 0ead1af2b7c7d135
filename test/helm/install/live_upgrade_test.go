package install

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// gpuPod is a pod of the upgrade test's namespace with one whole GPU.
func gpuPod(name string) string {
	return testenv.ClaimPod(name, upgradeNS, "gpu", "one-gpu")
}

const upgradeNS = "facet-upgrade"

// servingWatch records when some plugin instance accepts connections on
// its DRA socket (dra*.sock in the plugin's directory, one per pod with
// rolling updates), as the kubelet would dial it, every 50 ms.
type servingWatch struct {
	dir     string
	mu      sync.Mutex
	gap     time.Duration // longest stretch with no instance serving
	down    time.Time     // when the current stretch began; zero while serving
	sockets map[string]bool
}

func (w *servingWatch) run(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		serving := false
		socks, _ := filepath.Glob(filepath.Join(w.dir, "dra*.sock"))
		for _, s := range socks {
			if c, err := net.DialTimeout("unix", s, 200*time.Millisecond); err == nil {
				c.Close()
				serving = true
			}
		}
		now := time.Now()
		w.mu.Lock()
		for _, s := range socks {
			w.sockets[filepath.Base(s)] = true
		}
		switch {
		case !serving && w.down.IsZero():
			w.down = now
		case serving && !w.down.IsZero():
			w.gap = max(w.gap, now.Sub(w.down))
			w.down = time.Time{}
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *servingWatch) result() (time.Duration, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	gap := w.gap
	if !w.down.IsZero() {
		gap = max(gap, time.Since(w.down))
	}
	var socks []string
	for s := range w.sockets {
		socks = append(socks, s)
	}
	return gap, socks
}

// TestLiveChartUpgrade runs `helm upgrade` from one image tag to another
// (the simulator image tagged twice) while claims are prepared and new pods
// keep arriving. The DaemonSet surges (maxSurge 1, maxUnavailable 0) and
// the plugin runs with kubeletplugin.RollingUpdate: the new pod registers
// beside the old one, and the kubelet may call either. It proves zero
// failed prepares, zero lost checkpoint records, and that the claims the
// old pod prepared are unprepared through the new one; it prints the
// claims prepared during the upgrade, the failures, and the gap (the
// longest time no plugin instance accepted connections).
func TestLiveChartUpgrade(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	tagB := r.tag + "-b"
	r.ctrRun(t, "images", "tag", "--force", "facet.local/facet:"+r.tag, "facet.local/facet:"+tagB)
	// Whole GPUs, the shape of both gate rounds. (The simulated NVML keeps
	// MIG instances in a state file that one process at a time may use;
	// real GPUs keep them in the driver.)
	group := "mode: exclusive"
	r.install(t, r.values(t, r.tag, group))
	old := r.waitPlugin(t, r.tag, 2*time.Minute)
	t.Logf("plugin pod %s (tag %s) Ready (%s)", old.Name, r.tag, r.since())

	r.Must(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+upgradeNS+"}\n", "apply", "-f", "-")
	t.Cleanup(func() { _, _ = r.Run("", "delete", "namespace", upgradeNS, "--wait=true", "--timeout=120s") })
	r.Must(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: `+upgradeNS+`}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.facet.dev}}
`, "apply", "-f", "-")

	running := func(name string, timeout time.Duration) error {
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			p, err := r.Client.CoreV1().Pods(upgradeNS).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("pod %s not Running after %s", name, timeout)
	}

	// Four claims prepared by the old pod, kept through the upgrade.
	var before []types.UID
	for i := range 4 {
		name := fmt.Sprintf("before-%d", i)
		r.Must(t, gpuPod(name), "apply", "-f", "-")
		if err := running(name, 2*time.Minute); err != nil {
			t.Fatalf("%v\nplugin log:\n%s", err, r.pluginLog(""))
		}
		before = append(before, r.claimOf(t, upgradeNS, name).UID)
	}
	t.Logf("%d claims prepared by the old pod (%s)", len(before), r.since())

	// Churn: three workers create pods with a GPU claim each (on three of
	// the other four GPUs: a deleted pod's claim is deallocated a moment
	// after the pod is gone), wait for them to run, and delete them, until
	// stopped.
	watch := &servingWatch{dir: filepath.Join(r.kubeletRoot, "plugins", "gpu.facet.dev"), sockets: map[string]bool{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watch.run(watchCtx)
	var (
		stop                              atomic.Bool
		upgradeStart, upgradeEnd          atomic.Int64
		prepared, duringUpgrade, failures atomic.Int32
		failMu                            sync.Mutex
		failed                            []string
		wg                                sync.WaitGroup
	)
	for w := range 3 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				name := fmt.Sprintf("churn-%d-%d", w, i)
				created := time.Now()
				if out, err := r.Run(gpuPod(name), "apply", "-f", "-"); err != nil {
					failures.Add(1)
					failMu.Lock()
					failed = append(failed, fmt.Sprintf("%s: create: %v %s", name, err, out))
					failMu.Unlock()
					continue
				}
				if err := running(name, 3*time.Minute); err != nil {
					failures.Add(1)
					failMu.Lock()
					failed = append(failed, err.Error())
					failMu.Unlock()
				} else {
					prepared.Add(1)
					if s, e := upgradeStart.Load(), upgradeEnd.Load(); s != 0 && created.UnixNano() >= s && (e == 0 || created.UnixNano() <= e) {
						duringUpgrade.Add(1)
					}
				}
				_, _ = r.Run("", "delete", "pod", "-n", upgradeNS, name, "--wait=true", "--timeout=90s")
			}
		})
	}

	// Let the churn run on the old pod, then upgrade.
	time.Sleep(5 * time.Second)
	upgradeStart.Store(time.Now().UnixNano())
	up := action.NewUpgrade(r.cfg)
	up.Namespace, up.Timeout = chartNS, 3*time.Minute
	rel, err := up.Run(chartRelease, r.ch, r.values(t, tagB, group))
	if err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatalf("helm upgrade: %v", err)
	}
	t.Logf("helm upgrade: revision %d, %s (%s)", rel.Version, rel.Info.Status, r.since())
	cur := r.waitPlugin(t, tagB, 3*time.Minute)
	upgradeEnd.Store(time.Now().UnixNano())
	upgradeTook := time.Duration(upgradeEnd.Load() - upgradeStart.Load())
	t.Logf("rolled out: plugin pod %s (tag %s) Ready, %s gone, %s after helm upgrade began", cur.Name, tagB, old.Name, upgradeTook.Round(time.Millisecond))
	// New pods keep arriving at the new pod for a while.
	time.Sleep(5 * time.Second)
	stop.Store(true)
	wg.Wait()
	stopWatch()
	gap, sockets := watch.result()

	// No lost records: every claim the old pod prepared still has its
	// record and its CDI spec.
	lost := 0
	for _, uid := range before {
		if c, err := r.record(uid); c == nil || err != nil {
			lost++
			t.Errorf("claim %s: checkpoint record %v, %v", uid, c, err)
		}
		if _, err := os.Stat(r.specPath(uid)); err != nil {
			lost++
			t.Errorf("claim %s: %v", uid, err)
		}
	}
	// `helm rollback` to the first revision while claims of both pods are
	// prepared: two more claims prepared by the new pod, then the DaemonSet
	// rolls back to the old tag. The rolled-back plugin reads every record
	// (each written by this build's format: docs/guarantees.md, "Upgrade
	// and downgrade", for records of the next minor), prepares a new claim, and
	// unprepares the others below. One build tagged twice, so this shows the
	// chart's path back down, not a format change; TestRollback (pkg/
	// checkpoint) reads the next minor's records.
	var after []types.UID
	for i := range 2 {
		name := fmt.Sprintf("after-%d", i)
		r.Must(t, gpuPod(name), "apply", "-f", "-")
		if err := running(name, 2*time.Minute); err != nil {
			t.Fatalf("%v\nplugin log:\n%s", err, r.pluginLog(cur.Name))
		}
		after = append(after, r.claimOf(t, upgradeNS, name).UID)
	}
	rb := action.NewRollback(r.cfg)
	rb.Version, rb.Timeout, rb.Wait = 1, 3*time.Minute, false
	rollbackStart := time.Now()
	if err := rb.Run(chartRelease); err != nil {
		t.Fatalf("helm rollback to revision 1: %v", err)
	}
	back := r.waitPlugin(t, r.tag, 3*time.Minute)
	t.Logf("helm rollback: plugin pod %s (tag %s) Ready, %s after the rollback began, with %d claims prepared", back.Name, r.tag, time.Since(rollbackStart).Round(time.Millisecond), len(before)+len(after))
	r.Must(t, gpuPod("after-rollback"), "apply", "-f", "-")
	if err := running("after-rollback", 2*time.Minute); err != nil {
		t.Fatalf("a new claim after the rollback: %v\nplugin log:\n%s", err, r.pluginLog(back.Name))
	}
	rolledBack := append(append([]types.UID(nil), after...), r.claimOf(t, upgradeNS, "after-rollback").UID)
	for i, name := range []string{"after-0", "after-1", "after-rollback"} {
		r.Must(t, "", "delete", "pod", "-n", upgradeNS, name, "--wait=true", "--timeout=90s")
		uid := rolledBack[i]
		testenv.WaitFor(t, "claim "+string(uid)+" unprepared by the rolled-back pod", time.Minute, func() (bool, error) {
			c, e1 := r.record(uid)
			_, e2 := os.Stat(r.specPath(uid))
			return c == nil && e1 == nil && os.IsNotExist(e2), fmt.Errorf("record: %v (%v), spec: %v", c != nil, e1, e2)
		})
	}
	cur = back

	// The old pod's claims are unprepared through the rolled-back pod, the
	// only instance left.
	for i, uid := range before {
		r.Must(t, "", "delete", "pod", "-n", upgradeNS, fmt.Sprintf("before-%d", i), "--wait=true", "--timeout=90s")
		testenv.WaitFor(t, "claim "+string(uid)+" unprepared by the rolled-back pod (record and CDI spec removed)", time.Minute, func() (bool, error) {
			c, e1 := r.record(uid)
			_, e2 := os.Stat(r.specPath(uid))
			return c == nil && e1 == nil && os.IsNotExist(e2), fmt.Errorf("record: %v (%v), spec: %v", c != nil, e1, e2)
		})
	}
	newLog := r.pluginLog(cur.Name)
	unprepared := strings.Count(newLog, `"Unprepared claim"`)
	if want := len(before) + len(rolledBack); unprepared < want {
		t.Errorf("the rolled-back pod logged %d unprepares, want at least the %d claims'", unprepared, want)
	}
	evs, err := r.Client.CoreV1().Events(upgradeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		// The kubelet's FailedPrepareDynamicResources and the like;
		// FailedScheduling while a deleted pod's GPU is released is
		// not a plugin's failure.
		if strings.Contains(ev.Reason, "DynamicResources") {
			failures.Add(1)
			failed = append(failed, fmt.Sprintf("event %s %s: %s", ev.Reason, ev.InvolvedObject.Name, ev.Message))
		}
	}
	t.Logf("UPGRADE FIGURES: %d claims prepared during the upgrade (%d in all while it churned), %d failures, %d lost records, gap %.3fs (longest time no plugin instance accepted connections; rollout took %s; sockets seen: %v)",
		duringUpgrade.Load(), prepared.Load(), failures.Load(), lost, gap.Seconds(), upgradeTook.Round(time.Millisecond), sockets)
	if failures.Load() != 0 {
		t.Errorf("%d failures:\n%s", failures.Load(), strings.Join(failed, "\n"))
	}
	if duringUpgrade.Load() == 0 {
		t.Error("no claim was prepared while the upgrade ran: the test proved nothing")
	}
	if len(sockets) < 2 {
		t.Errorf("saw DRA sockets %v, want one per pod (rolling updates)", sockets)
	}
	if t.Failed() {
		t.Logf("new plugin pod's log:\n%s", newLog)
	}
}
