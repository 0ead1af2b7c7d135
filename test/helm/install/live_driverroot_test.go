package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestLiveChartHostDriverRoot installs the chart with driver.root: / (its
// default, a driver in the host's own root) on the local node. The node
// has no NVIDIA driver in its /, only the simulated root of
// hack/sim-node.sh, so the plugin cannot serve; what this checks is that
// it gets as far as the host's root allows, in order:
//   - without an nvidia-cdi-hook on the host (nvidiaCDIHook.install=false,
//     the toolkit package's /usr/bin/nvidia-cdi-hook, absent here) the
//     plugin refuses to start, names the value to set, and raises a Node
//     Event;
//   - with the chart's own hook installed, it passes that check and reads
//     the host's / at /driver-root, where it finds no libcuda, and says so
//     naming the driver root.
func TestLiveChartHostDriverRoot(t *testing.T) {
	r := newChartRig(t)
	if _, err := os.Stat("/usr/bin/nvidia-cdi-hook"); err == nil {
		t.Skip("this host has /usr/bin/nvidia-cdi-hook: the refusal cannot be shown")
	}
	// The chart mounts the driver root with HostToContainer propagation,
	// which containerd refuses unless the root's mount is shared or a
	// slave. systemd makes a node's / shared; this host's may be private
	// (a container's): make it shared for the test, as on a real node.
	opt, err := mountPropagation("/")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(opt, "shared:") && !strings.Contains(opt, "master:") {
		if out, err := exec.Command("mount", "--make-shared", "/").CombinedOutput(); err != nil {
			t.Fatalf("mount --make-shared /: %v\n%s", err, out)
		}
		t.Logf("made the host's / shared for the test (it was private)")
		t.Cleanup(func() { _ = exec.Command("mount", "--make-private", "/").Run() })
	}
	for _, tc := range []struct {
		name, driver string
		wantLog      []string
		wantEvent    bool
	}{
		{
			name:      "no hook on the host",
			driver:    "driver: {root: /, devRoot: /}\n  nvidiaCDIHook: {install: false, hostDir: /nonexistent}",
			wantLog:   []string{"nvidia-cdi-hook at host path /usr/bin/nvidia-cdi-hook", "does not exist", "kubeletPlugin.nvidiaCDIHook.install=true"},
			wantEvent: true,
		},
		{
			name:    "the chart's hook, no driver in the host's /",
			driver:  fmt.Sprintf("driver: {root: /, devRoot: /}\n  nvidiaCDIHook: {install: true, hostDir: %q}", filepath.Join(r.RunDir, "cdi-hook-chart")),
			wantLog: []string{"nvidia-cdi-hook runs", "driver root / (read at /driver-root)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := metav1.Now()
			vals := r.values(t, r.tag, `mode: auto`)
			// Replace the simulated root and hook of the common values.
			kp := vals["kubeletPlugin"].(map[string]any)
			for k, v := range values(t, "kubeletPlugin:\n  "+tc.driver+"\n")["kubeletPlugin"].(map[string]any) {
				kp[k] = v
			}
			r.install(t, vals)
			var log string
			testenv.WaitFor(t, "the plugin's log to say why it cannot serve", 3*time.Minute, func() (bool, error) {
				log = r.pluginLog("")
				for _, s := range tc.wantLog {
					if !strings.Contains(log, s) {
						return false, fmt.Errorf("no %q in the log:\n%s", s, log)
					}
				}
				return true, nil
			})
			t.Logf("the plugin says:\n%s", lastLines(log, 3))
			if !tc.wantEvent {
				return
			}
			testenv.WaitFor(t, "the Node Event FacetCDIHookUnusable", time.Minute, func() (bool, error) {
				evs, err := r.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,reason=FacetCDIHookUnusable"})
				if err != nil {
					return false, err
				}
				for _, ev := range evs.Items {
					if !ev.LastTimestamp.Before(&start) && strings.Contains(ev.Message, "kubeletPlugin.driver.nvidiaCDIHookPath") {
						return true, nil
					}
				}
				return false, fmt.Errorf("%d such Events, none since %s naming the value", len(evs.Items), start)
			})
		})
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mountPropagation returns the propagation fields of the mount at
// mountPoint as this process sees it ("shared:N", "master:N", both, or ""
// for a private mount), from the last of its lines in /proc/self/mountinfo:
// the mount on top.
func mountPropagation(mountPoint string) (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	found := false
	var opt []string
	for _, line := range strings.Split(string(data), "\n") {
		// ID parent major:minor root mount-point options [optional...] - fstype source super-options
		f := strings.Fields(line)
		if len(f) < 7 || f[4] != mountPoint {
			continue
		}
		found, opt = true, nil
		for _, o := range f[6:] {
			if o == "-" {
				break
			}
			opt = append(opt, o)
		}
	}
	if !found {
		return "", fmt.Errorf("no mount at %s in /proc/self/mountinfo", mountPoint)
	}
	return strings.Join(opt, " "), nil
}
