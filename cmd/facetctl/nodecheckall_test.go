package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeCheckArgsFor: node-check in the plugin's container gets the
// plugin's own paths as that container sees them.
func TestNodeCheckArgsFor(t *testing.T) {
	const hook = "--nvidia-cdi-hook=/host-nvidia-cdi-hook/nvidia-cdi-hook"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{
			name: "the chart's defaults",
			args: []string{"--driver-root=/", "--container-driver-root=/driver-root", "--dev-root=/",
				"--nvidia-cdi-hook=/var/lib/facet-cdi-hook/nvidia-cdi-hook", "--container-nvidia-cdi-hook=/host-nvidia-cdi-hook/nvidia-cdi-hook",
				"--cdi-dir=/var/run/cdi", "--state-dir=/var/lib/facet", "--hami-library=/var/lib/facet-hami-core/libvgpu.so", "--mps=auto", "--mode=auto", "-v=2"},
			want: []string{"--gpu=idle", "--state-dir=/var/lib/facet", "--driver-root=/driver-root", "--dev-root=/driver-root", hook,
				"--hami-library=/var/lib/facet-hami-core/libvgpu.so", "--seconds=0"},
		},
		{
			name: "the GPU Operator's driver root, device nodes in the host's /dev",
			args: []string{"--driver-root=/run/nvidia/driver", "--container-driver-root=/driver-root", "--dev-root=/",
				"--nvml-library=/driver-root/usr/lib64/libnvidia-ml.so.1", "--container-nvidia-cdi-hook=/host-nvidia-cdi-hook/nvidia-cdi-hook",
				"--state-dir=/var/lib/facet", "--hami-library=/var/lib/facet-hami-core/libvgpu.so", "--slots=2x40Gi/50"},
			want: []string{"--gpu=idle", "--state-dir=/var/lib/facet", "--driver-root=/driver-root", "--dev-root=/", hook,
				"--hami-library=/var/lib/facet-hami-core/libvgpu.so", "--nvml-library=/driver-root/usr/lib64/libnvidia-ml.so.1", "--slots=2x40Gi/50", "--seconds=0"},
		},
		{
			name: "MPS off, no HAMi-core, a simulated node, flags with separate values",
			args: []string{"--driver-root", "/sim/root", "--container-driver-root=/driver-root", "--state-dir", "/run/facet-state",
				"--mps=off", "--gpu-slots", "0=4", "--machine=/usr/share/facet/machines/dgx-h100.yaml", "--destroy-unowned-mig"},
			want: []string{"--gpu=idle", "--state-dir=/run/facet-state", "--driver-root=/driver-root", "--dev-root=/driver-root",
				"--nvidia-cdi-hook=/usr/bin/nvidia-cdi-hook", "--hami-library=", "--gpu-slots=0=4", "--machine=/usr/share/facet/machines/dgx-h100.yaml", "--mps=false", "--seconds=0"},
		},
		{
			name: "the plugin's own defaults",
			args: nil,
			want: []string{"--gpu=idle", "--state-dir=/var/lib/facet", "--driver-root=/", "--dev-root=/", "--nvidia-cdi-hook=/usr/bin/nvidia-cdi-hook", "--hami-library=", "--seconds=0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &corev1.Container{Name: "plugin", Command: []string{"facet-kubeletplugin"}, Args: tc.args}
			got, err := nodeCheckArgsFor(c, []string{"--seconds=0"})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n  %q\nwant\n  %q", got, tc.want)
			}
			// Every argument is one node-check takes.
			fs, _ := nodeCheckFlags(&bytes.Buffer{})
			if err := fs.Parse(got); err != nil || fs.NArg() > 0 {
				t.Errorf("node-check refuses %q: %v", got, err)
			}
		})
	}
	if _, err := nodeCheckArgsFor(&corev1.Container{Name: "plugin"}, nil); err == nil {
		t.Error("a container without a command line: no error")
	}
}

func TestPickPluginPods(t *testing.T) {
	now := time.Now()
	pod := func(name, node string, phase corev1.PodPhase, ready bool, age time.Duration) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if !ready {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "plugin", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
		}
		return p
	}
	for _, tc := range []struct {
		name       string
		pods       []corev1.Pod
		wantPicked []string
		wantFailed []string
	}{
		{name: "one per node", pods: []corev1.Pod{pod("b", "n2", corev1.PodRunning, true, time.Hour), pod("a", "n1", corev1.PodRunning, true, time.Hour)},
			wantPicked: []string{"a", "b"}},
		{name: "a rolling update: the newest Ready pod", pods: []corev1.Pod{pod("old", "n1", corev1.PodRunning, true, time.Hour), pod("new", "n1", corev1.PodRunning, true, time.Minute), pod("newest", "n1", corev1.PodRunning, false, time.Second)},
			wantPicked: []string{"new"}},
		{name: "no Ready pod on a node", pods: []corev1.Pod{pod("a", "n1", corev1.PodRunning, false, time.Hour), pod("b", "n2", corev1.PodRunning, true, time.Hour)},
			wantPicked: []string{"b"}, wantFailed: []string{"n1: no Ready kubelet plugin pod: a (phase Running, plugin: CrashLoopBackOff)"}},
		{name: "not scheduled", pods: []corev1.Pod{pod("a", "", corev1.PodPending, false, time.Hour)},
			wantFailed: []string{"(none): pod a is not scheduled to a node (phase Pending)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			picked, failed := pickPluginPods(tc.pods)
			var names, why []string
			for _, p := range picked {
				names = append(names, p.Name)
			}
			for _, r := range failed {
				if r.result != nodeFailed {
					t.Errorf("%s: result %s, want %s", r.node, r.result, nodeFailed)
				}
				why = append(why, r.node+": "+r.why)
			}
			if !slices.Equal(names, tc.wantPicked) || !slices.Equal(why, tc.wantFailed) {
				t.Errorf("picked %q, failed %q; want %q, %q", names, why, tc.wantPicked, tc.wantFailed)
			}
		})
	}
}

// TestSummarize: a failed node fails the run and is named; a skipped one
// (no idle GPU) does not.
func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		results []*nodeResult
		wantErr string
		want    []string
	}{
		{name: "all ok, one skipped", results: []*nodeResult{{node: "n2", pod: "p2", result: nodeSkipped, why: "no idle GPU"}, {node: "n1", pod: "p1", result: nodeOK}},
			want: []string{"n1    p1   ok\n", "n2    p2   skipped: no idle GPU\n", "1 of 2 nodes checked", "1 skipped"}},
		{name: "one failed", results: []*nodeResult{{node: "n1", pod: "p1", result: nodeOK}, {node: "n2", pod: "p2", result: nodeFailed, why: "node-check exited with status 1"}},
			wantErr: "1 of 2 nodes do not deliver what they publish, or could not be checked: n2", want: []string{"n2    p2   FAILED: node-check exited with status 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := summarize(&out, tc.results)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err %v, want %q", err, tc.wantErr)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestCleanupPod: node-cleanup --node runs the cleanup's own flags in its
// pod on the node, against the host's / at /host, as root with no more
// than it needs: privileged only to destroy MIG instances on real GPUs.
func TestCleanupPod(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		wantCommand    []string
		wantPrivileged bool
	}{
		{name: "defaults", args: []string{"--node=n1", "--image=facet.local/facet:1"},
			wantCommand: []string{"facetctl", "node-cleanup", "--host-root=/host"}},
		{name: "paths and MIG kept", args: []string{"--node=n1", "--image=i", "--state-dir=/x/state", "--hami-core-dir=", "--mig-instances=keep", "--namespace=ops"},
			wantCommand: []string{"facetctl", "node-cleanup", "--host-root=/host", "--hami-core-dir=", "--mig-instances=keep", "--state-dir=/x/state"}},
		{name: "MIG destroyed on a real GPU", args: []string{"--node=n1", "--image=i", "--mig-instances=destroy", "--driver-root=/run/nvidia/driver"},
			wantCommand: []string{"facetctl", "node-cleanup", "--host-root=/host", "--driver-root=/run/nvidia/driver", "--mig-instances=destroy"}, wantPrivileged: true},
		{name: "MIG destroyed on a simulated node", args: []string{"--node=n1", "--image=i", "--mig-instances=destroy", "--machine=/m.yaml"},
			wantCommand: []string{"facetctl", "node-cleanup", "--host-root=/host", "--machine=/m.yaml", "--mig-instances=destroy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, err := parseNodeCleanupFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			p := cleanupPod(f, "n1")
			c := p.Spec.Containers[0]
			if !slices.Equal(c.Command, tc.wantCommand) {
				t.Errorf("command %q, want %q", c.Command, tc.wantCommand)
			}
			if p.Spec.NodeName != "n1" || p.Namespace != f.ns || p.Spec.RestartPolicy != corev1.RestartPolicyNever || *p.Spec.AutomountServiceAccountToken {
				t.Errorf("pod %+v: want on n1, in %s, never restarted, no API token", p.Spec, f.ns)
			}
			if len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Operator != corev1.TolerationOpExists || p.Spec.Tolerations[0].Key != "" {
				t.Errorf("tolerations %+v: want every taint tolerated (GPU nodes are tainted)", p.Spec.Tolerations)
			}
			sc := c.SecurityContext
			privileged := sc.Privileged != nil && *sc.Privileged
			if privileged != tc.wantPrivileged || *sc.RunAsUser != 0 {
				t.Errorf("privileged %v, user %d; want privileged %v, root", privileged, *sc.RunAsUser, tc.wantPrivileged)
			}
			if !privileged && (!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"DAC_OVERRIDE", "FOWNER"}) ||
				!*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || sc.SeccompProfile == nil) {
				t.Errorf("security context %+v: want every capability dropped but DAC_OVERRIDE and FOWNER, read-only, RuntimeDefault", sc)
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want memory requested and limited", c.Resources)
			}
		})
	}
}
