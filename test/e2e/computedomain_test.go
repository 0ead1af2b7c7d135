package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// TestComputeDomainChannel runs the node side of a ComputeDomain
// (docs/design/compute-domains.md, flow steps 3, 5 and 6) on the local
// node, simulated as a GB200 NVL72 tray whose driver offers IMEX
// channels, through the live scheduler, kubelet and containerd. The test
// plays the controller: it installs the chart's ComputeDomain CRD
// (applyComputeDomainCRD), creates a domain, writes its channel template and its
// status. A pod of the domain, with a GPU claim beside its channel claim:
//   - waits, with the reason in its Events, while the domain's status
//     has no Ready IMEX daemon on the node, and the node is labelled
//     with the domain's UID, which would pull the daemon onto it;
//   - runs once the node's entry is Ready, with the channel's device node
//     in its container (the driver's major, minor 0) and the domain's
//     environment beside its GPU claim's;
//   - once deleted, leaves no label, CDI spec or checkpoint record;
//   - a second pod, whose daemon turns Ready a moment after the label
//     appears (as a controller's would), runs: its prepare waits for it.
func TestComputeDomainChannel(t *testing.T) {
	ctx := context.Background()
	setupNamespace(t)
	// Another machine than the other tests': their simulated NVML state
	// (dgx-h100) would be refused.
	for _, f := range []string{"simulated-nvml.json", "mig-layouts.json"} {
		if err := os.Remove(filepath.Join(e.runDir, "facet-state", f)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	applyComputeDomainCRD(t)
	t.Cleanup(func() { _, _ = kubectlErr("label", "node", nodeName, names.LabelComputeDomain+"-") })
	p := startPlugin(t, "gb200-nvl72-tray", "--mode", "exclusive")
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)

	// The node publishes its channel, in its GPUs' fabric clique.
	const cluster, clique = "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b", 32766
	waitFor(t, "the imex-channel device published", time.Minute, func() (bool, error) {
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				if d.Name != names.IMEXChannelDevice {
					continue
				}
				a := d.Attributes
				ok := *a[names.AttrType].StringValue == names.KindIMEXChannel && *a[names.AttrFabricCluster].StringValue == cluster &&
					*a[names.AttrFabricClique].IntValue == clique
				return ok, fmt.Errorf("attributes %v", a)
			}
		}
		return false, fmt.Errorf("no %s device", names.IMEXChannelDevice)
	})

	applyYAML(t, `
apiVersion: gpu.facet.dev/v1alpha1
kind: ComputeDomain
metadata: {name: train, namespace: facet-demo}
spec:
  numNodes: 1
  channel:
    resourceClaimTemplate: {name: train-channel}
`)
	uid := strings.TrimSpace(kubectl(t, "get", "computedomain", "-n", namespace, "train", "-o", "jsonpath={.metadata.uid}"))
	// The controller's template: the class, the domain's clique, the
	// domain in the opaque config.
	applyYAML(t, fmt.Sprintf(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: train-channel, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - name: channel
        exactly:
          deviceClassName: imex-channel.facet.dev
          selectors:
          - cel:
              expression: >-
                device.attributes["gpu.facet.dev"].fabricClusterUUID == %q &&
                device.attributes["gpu.facet.dev"].fabricCliqueID == %d
      config:
      - requests: [channel]
        opaque:
          driver: gpu.facet.dev
          parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: ComputeDomainChannelConfig, domainUID: %q, domainName: train}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: train-gpu, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.facet.dev}}
`, cluster, clique, uid)+podManifest)

	// No daemon yet: the pod waits, saying why, and the node is labelled.
	notReady := "ComputeDomain facet-demo/train: IMEX daemon on node " + nodeName + " is not ready yet"
	waitEvent(t, "trainer", "FailedPrepareDynamicResources", notReady)
	waitEvent(t, "trainer", "FacetWaitingForIMEXDaemon", notReady)
	node, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Labels[names.LabelComputeDomain]; got != uid {
		t.Fatalf("node label %s=%q while the pod waits, want the domain's UID %s", names.LabelComputeDomain, got, uid)
	}
	if pod, err := e.client.CoreV1().Pods(namespace).Get(ctx, "trainer", metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodPending {
		t.Fatalf("pod %v, %v; want it Pending without its daemon", pod.Status.Phase, err)
	}
	// The failed prepare keeps its claim waiting for the kubelet's retry
	// (51 to 88 s later; not waited for here): the checkpoint holds the
	// channel claim with its domain, not Prepared, and the pod still waits.
	waiting, err := e.client.CoreV1().Pods(namespace).Get(ctx, "trainer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitingClaim := podClaims(t, waiting)["channel"]
	if waitingClaim == nil {
		t.Fatalf("pod trainer has no channel claim: %+v", waiting.Status.ResourceClaimStatuses)
	}
	rec, err := checkpoint.Peek(filepath.Join(e.runDir, "facet-state", "claims"), waitingClaim.UID)
	if err != nil || rec == nil || rec.ComputeDomain == nil || rec.ComputeDomain.UID != uid || rec.State == checkpoint.StatePrepared {
		t.Fatalf("checkpoint record of the waiting channel claim %s: %+v, %v; want one of domain %s, not Prepared", waitingClaim.Name, rec, err, uid)
	}
	if pod, err := e.client.CoreV1().Pods(namespace).Get(ctx, "trainer", metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodPending {
		t.Fatalf("pod %v, %v after a failed prepare; want it Pending without its daemon", pod.Status.Phase, err)
	}

	// The controller's part: the node's daemon is Ready.
	readyStatus := fmt.Sprintf(`{"status":{"status":"Ready","clique":"%s.%d","nodes":[{"name":%q,"ipAddress":"127.0.0.1","cliqueID":"%s.%d","index":0,"status":"Ready"}]}}`,
		cluster, clique, nodeName, cluster, clique)
	kubectl(t, "patch", "computedomain", "-n", namespace, "train", "--subresource=status", "--type=merge", "-p", readyStatus)
	start := time.Now()
	pod := waitPodRunning(t, "trainer")
	t.Logf("pod Running %s after the node's daemon was Ready", time.Since(start).Round(time.Second))

	major, _ := sim.SimulatedIMEXChannels()
	ls := execIn(t, "trainer", "", "ls -l /dev/nvidia-caps-imex-channels/")
	t.Logf("ls -l /dev/nvidia-caps-imex-channels/:\n%s", ls)
	// busybox: "crw-rw-rw-    1 root     root       62,   0 Nov 29 04:16 channel0"
	if m := channelLine.FindStringSubmatch(lastLine(ls)); m == nil || m[1] != "crw-rw-rw-" || m[2] != fmt.Sprint(major) || m[3] != "0" || m[4] != "channel0" {
		t.Errorf("the container's channels:\n%s\nwant channel0 alone, a character device %d:0 of mode 0666", ls, major)
	}
	env := envOf(execIn(t, "trainer", "", "env"))
	for k, want := range map[string]string{
		names.EnvComputeDomainUID:    uid,
		names.EnvComputeDomainName:   "train",
		names.EnvComputeDomainClique: fmt.Sprintf("%s.%d", cluster, clique),
		// The GPU claim's environment is there too, unclobbered.
		"FACET_CLAIM": namespace + "/" + podClaims(t, pod)["gpu"].Name,
	} {
		if env[k] != want {
			t.Errorf("container env %s=%q, want %q", k, env[k], want)
		}
	}
	channelClaim := podClaims(t, pod)["channel"]

	// The pod goes: the channel is unprepared and the label removed.
	kubectl(t, "delete", "pod", "-n", namespace, "trainer", "--wait=true", "--timeout=120s")
	waitFor(t, "the node's compute-domain label removed", time.Minute, func() (bool, error) {
		node, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		v, ok := node.Labels[names.LabelComputeDomain]
		return !ok, fmt.Errorf("label %q", v)
	})
	if specs, _ := filepath.Glob(filepath.Join(e.cdiDir, "*"+string(channelClaim.UID)+"*")); len(specs) > 0 {
		t.Errorf("CDI specs of the channel claim left: %v", specs)
	}
	if rec, err := checkpoint.Peek(filepath.Join(e.runDir, "facet-state", "claims"), channelClaim.UID); rec != nil || err != nil {
		t.Errorf("checkpoint record of the channel claim: %+v, %v; want none", rec, err)
	}

	// As a controller does: the daemon turns Ready a moment after the
	// label pulled it onto the node, which the prepare waits for (up to
	// 20 s) rather than fail for the kubelet's slow retry.
	kubectl(t, "patch", "computedomain", "-n", namespace, "train", "--subresource=status", "--type=merge", "-p", `{"status":{"status":"NotReady","nodes":null}}`)
	applyYAML(t, strings.Replace(podManifest, "name: trainer,", "name: trainer-2,", 1))
	waitFor(t, "the node labelled for the second pod", time.Minute, func() (bool, error) {
		node, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		return err == nil && node.Labels[names.LabelComputeDomain] == uid, err
	})
	start = time.Now()
	kubectl(t, "patch", "computedomain", "-n", namespace, "train", "--subresource=status", "--type=merge", "-p", readyStatus)
	waitPodRunning(t, "trainer-2")
	t.Logf("second pod Running %s after its daemon was Ready", time.Since(start).Round(time.Second))
}

// channelLine is a device node's line of ls -l: mode, major, minor, name.
var channelLine = regexp.MustCompile(`^(c\S+)\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(\S+)$`)

// podManifest is a pod of the domain: a GPU claim and the channel claim.
var podManifest = "\n---\n" + testenv.ClaimsPod("trainer", "facet-demo",
	testenv.PodClaim{Name: "gpu", Template: "train-gpu"}, testenv.PodClaim{Name: "channel", Template: "train-channel"})

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
