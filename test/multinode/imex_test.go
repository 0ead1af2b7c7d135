package multinode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/node/imex"
)

// rackNode is a node of the simulated GB200 NVL72-class rack
// (hack/cluster/add-rack.sh) and its clique.
type rackNode struct{ name, clique string }

// rack reads RUN_DIR/rack.txt; without one (FACET_MULTINODE_RACK=0) the
// test skips.
func rack(t *testing.T) []rackNode {
	t.Helper()
	f, err := os.Open(filepath.Join(e.runDir, "rack.txt"))
	if os.IsNotExist(err) {
		t.Skip("no simulated rack in this cluster (hack/multinode.sh with FACET_MULTINODE_RACK=0)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var nodes []rackNode
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, clique, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("rack.txt: line %q", sc.Text())
		}
		nodes = append(nodes, rackNode{name, clique})
	}
	return nodes
}

var computeDomains = schema.GroupVersionResource{Group: v1alpha1.GroupName, Version: v1alpha1.Version, Resource: v1alpha1.ComputeDomainResource}

// domainLabel is the node label that pulls a domain's IMEX daemon onto a
// node (docs/design/compute-domains.md); the kubelet plugin sets it at a
// channel claim's prepare, this test by hand.
const domainLabel = "gpu.facet.dev/compute-domain"

// imexStateDir is where the DaemonSet mounts the stand-in's state
// directory, an emptyDir.
const imexStateDir = "/run/facet-imex"

// TestIMEXStandIn: facet-imex --simulate, as a DaemonSet's container on
// two nodes of the rack, really runs on their fake CRIs (exec mode): its
// probe's verdict on the peer list reaches the pods' readiness, and the
// kubelet's Events say why a pod is not ready; a daemon that crashes is
// restarted by the kubelet and is ready again; once the DaemonSet is gone
// no process is left. The ComputeDomain is made by hand and its status
// written here, as the controller will.
func TestIMEXStandIn(t *testing.T) {
	nodes := rack(t)
	if len(nodes) < 2 || nodes[0].clique != nodes[1].clique {
		t.Fatalf("rack %v: want two nodes of one clique first", nodes)
	}
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	applyChartCRD(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	ns := newNamespace(t)
	cds := dyn.Resource(computeDomains).Namespace(ns)

	cd := &v1alpha1.ComputeDomain{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: "train"},
		Spec: v1alpha1.ComputeDomainSpec{NumNodes: 2, Channel: v1alpha1.ComputeDomainChannelSpec{
			ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: "train-channel"}}},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
	if err != nil {
		t.Fatal(err)
	}
	created, err := cds.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := string(created.GetUID())
	// The controller's status.nodes: the nodes' InternalIPs, by index.
	setNodes := func(names ...string) {
		t.Helper()
		var status v1alpha1.ComputeDomainStatus
		for i, n := range names {
			status.Nodes = append(status.Nodes, v1alpha1.ComputeDomainNode{
				Name: n, IPAddress: internalIP(t, n), CliqueID: a.clique, Index: int32(i), Status: v1alpha1.ComputeDomainNotReady,
			})
		}
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
		if err != nil {
			t.Fatal(err)
		}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := cds.Get(ctx, "train", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Object["status"] = st
			_, err = cds.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	setNodes(a.name)
	for _, n := range []rackNode{a, b} {
		labelNode(t, n.name, uid)
	}
	createIMEXDaemonSet(t, ns, "train", uid)

	// Node b is not in the list, and a's list is short: neither is ready,
	// and the kubelet's Events say why.
	podA, podB := imexPod(t, ns, a.name), imexPod(t, ns, b.name)
	waitUnhealthy(t, ns, podA, fmt.Sprintf("not ready: ComputeDomain %s/train: the peer list holds 1 of spec.numNodes 2 nodes (%s)", ns, a.name))
	waitUnhealthy(t, ns, podB, fmt.Sprintf("not ready: ComputeDomain %s/train: node %s is not in status.nodes (%s)", ns, b.name, a.name))

	setNodes(a.name, b.name)
	waitReady(t, ns, podA, 0)
	waitReady(t, ns, podB, 0)
	state := readIMEXState(t, ns, podA)
	if want := []string{internalIP(t, a.name), internalIP(t, b.name)}; !slices.Equal(state.Peers, want) {
		t.Errorf("node %s's peer list %q, want %q", a.name, state.Peers, want)
	}

	// A crash: the kubelet restarts the container, and it is ready again.
	pid := imexPID(t, uid, a.name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p := waitReady(t, ns, podA, 1)
	if last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.ExitCode != 128+int32(syscall.SIGKILL) {
		t.Errorf("pod %s's last termination %+v, want exit code 137", podA, last)
	}
	if again := imexPID(t, uid, a.name); again == pid {
		t.Errorf("the restarted stand-in has the killed one's pid %d", pid)
	}

	// Nothing outlives the DaemonSet.
	if err := e.client.AppsV1().DaemonSets(ns).Delete(ctx, "imex-"+uid, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the DaemonSet's pods gone", 2*time.Minute, func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=imex"})
		return err == nil && len(pods.Items) == 0, err
	})
	waitFor(t, "no stand-in process left", time.Minute, func() (bool, error) {
		left := imexPIDs(t, uid)
		return len(left) == 0, fmt.Errorf("processes %v", left)
	})
}

// internalIP is the node's InternalIP.
func internalIP(t *testing.T, node string) string {
	t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no InternalIP: %v", node, n.Status.Addresses)
	return ""
}

// labelNode puts the domain label on the node until the test ends.
func labelNode(t *testing.T, node, uid string) {
	t.Helper()
	patch := func(value any) error {
		b := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, domainLabel, value)
		_, err := e.client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	if err := patch(strconv.Quote(uid)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := patch("null"); err != nil {
			t.Errorf("unlabelling node %s: %v", node, err)
		}
	})
}

// createIMEXDaemonSet creates the domain's DaemonSet as the contract
// names it (docs/design/compute-domains.md): imex-<UID>, on the labelled
// nodes, facet-imex --simulate in Facet's simulator image, its probe
// `facet-imex probe`. The state directory is passed to both, as the fake
// CRI maps only paths it sees in arguments.
func createIMEXDaemonSet(t *testing.T, ns, name, uid string) {
	t.Helper()
	version := chartAppVersion(t)
	labels := map[string]string{"app": "imex"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "imex-" + uid, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{domainLabel: uid},
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Volumes:                       []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					Containers: []corev1.Container{{
						Name:            "imex",
						Image:           "facet.local/facet:" + version + "-sim",
						ImagePullPolicy: corev1.PullNever,
						Command: []string{"facet-imex", "--domain-namespace", ns, "--domain-name", name, "--domain-uid", uid,
							"--node-name", "$(NODE_NAME)", "--simulate", "--state-dir", imexStateDir},
						Env:          []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
						VolumeMounts: []corev1.VolumeMount{{Name: "state", MountPath: imexStateDir}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"facet-imex", "probe", "--state-dir", imexStateDir}}},
							PeriodSeconds: 1, TimeoutSeconds: 10, FailureThreshold: 1, SuccessThreshold: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := e.client.AppsV1().DaemonSets(ns).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// chartAppVersion is the chart's appVersion, the simulator image's tag
// before "-sim".
func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.repo, "deployments/helm/facet/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	t.Fatal("no appVersion in the chart")
	return ""
}

// imexPod waits for the DaemonSet's pod on node and returns its name.
func imexPod(t *testing.T, ns, node string) string {
	t.Helper()
	var name string
	waitFor(t, "the IMEX daemon's pod on "+node, 2*time.Minute, func() (bool, error) {
		pods, err := e.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
			LabelSelector: "app=imex", FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
		})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		name = pods.Items[0].Name
		return true, nil
	})
	return name
}

// waitUnhealthy waits for the kubelet's Unhealthy Event on the pod with
// the probe's output.
func waitUnhealthy(t *testing.T, ns, pod, output string) {
	t.Helper()
	want := "Readiness probe failed: " + output
	var seen []string
	waitFor(t, "Event "+want, 2*time.Minute, func() (bool, error) {
		events, err := e.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod, "reason": "Unhealthy"}.AsSelector().String(),
		})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range events.Items {
			seen = append(seen, ev.Message)
			if strings.TrimSpace(ev.Message) == want {
				return true, nil
			}
		}
		return false, fmt.Errorf("events %q", seen)
	})
	if p := getPod(t, ns, pod); podReady(p) {
		t.Errorf("pod %s is Ready", pod)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitReady waits for the pod to be Ready with at least restarts restarts.
func waitReady(t *testing.T, ns, pod string, restarts int32) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	waitFor(t, fmt.Sprintf("pod %s Ready after %d restarts", pod, restarts), 2*time.Minute, func() (bool, error) {
		p = getPod(t, ns, pod)
		cs := p.Status.ContainerStatuses
		return podReady(p) && len(cs) == 1 && cs[0].RestartCount >= restarts, fmt.Errorf("conditions %v, containers %v", p.Status.Conditions, cs)
	})
	return p
}

// imexPIDs are the host processes of the domain's stand-ins (fake CRI
// exec mode), by the node each serves: those whose --domain-uid is uid,
// given as "--domain-uid UID" (TestIMEXStandIn's DaemonSet) or
// "--domain-uid=UID" (facet-controller's).
func imexPIDs(t *testing.T, uid string) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if filepath.Base(args[0]) != "facet-imex" || slices.Contains(args, "probe") {
			continue
		}
		if flagValue(args, "--domain-uid") == uid {
			out[pid] = flagValue(args, "--node-name")
		}
	}
	return out
}

// flagValue is the value of a flag given as "--name value" or
// "--name=value" in args; "" if absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// imexPID is the pid of the domain's stand-in on node.
func imexPID(t *testing.T, uid, node string) int {
	t.Helper()
	var pid int
	waitFor(t, "the stand-in process of node "+node, time.Minute, func() (bool, error) {
		for p, n := range imexPIDs(t, uid) {
			if n == node {
				pid = p
				return true, nil
			}
		}
		return false, nil
	})
	return pid
}

// readIMEXState is the state the stand-in on the pod's node wrote, read
// from the pod's emptyDir under the node's kubelet root.
func readIMEXState(t *testing.T, ns, pod string) imex.State {
	t.Helper()
	p := getPod(t, ns, pod)
	path := filepath.Join(e.runDir, "nodes", p.Spec.NodeName, "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "state")
	s, err := imex.ReadState(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
