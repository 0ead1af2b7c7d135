package multinode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// rackIMEXPodTemplate is the chart's IMEX pod template (templates/
// computedomains.yaml) as the simulated rack runs it: facet-imex's
// stand-in in the simulator image, which the rack nodes' fake CRIs run as
// host processes. The state directory is named in the arguments, where the
// fake CRI maps it to the pod's emptyDir.
func rackIMEXPodTemplate(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf(`metadata:
  labels: {app.kubernetes.io/component: imex}
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - {name: state, emptyDir: {}}
  containers:
  - name: imex
    image: facet.local/facet:%s-sim
    imagePullPolicy: Never
    command: [facet-imex]
    args: [--simulate, --state-dir, %s]
    env:
    - name: NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    volumeMounts:
    - {name: state, mountPath: %s}
    readinessProbe:
      exec: {command: [facet-imex, probe, --state-dir, %s]}
      periodSeconds: 1
      timeoutSeconds: 10
      failureThreshold: 1
`, chartAppVersion(t), imexStateDir, imexStateDir, imexStateDir)
}

// startRackController runs bin/facet-controller as a host process, as the
// chart's Deployment runs it, with its DaemonSets in ns.
func startRackController(t *testing.T, ns string) string {
	t.Helper()
	dir := t.TempDir()
	tpl := filepath.Join(dir, "imex-pod-template.yaml")
	if err := os.WriteFile(tpl, []byte(rackIMEXPodTemplate(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(e.runDir, "logs", "facet-controller-multinode.log")
	testenv.StartProcess(t, log, filepath.Join(e.repo, "bin", "facet-controller"), "--kubeconfig", e.kubeconfig,
		"--namespace", ns, "--leader-elect=false", "--imex-pod-template", tpl,
		"--metrics-addr", "127.0.0.1:0", "--resync", "2s", "-v", "2")
	return log
}

// applyChartCRD applies the chart's generated ComputeDomain CRD.
func applyChartCRD(t *testing.T) {
	t.Helper()
	for _, args := range [][]string{
		{"apply", "--server-side", "--force-conflicts", "-f", filepath.Join(e.repo, "deployments", "helm", "facet", "files", "crds", "gpu.facet.dev_computedomains.yaml")},
		{"wait", "--for=condition=Established", "--timeout=60s", "crd/computedomains.gpu.facet.dev"},
	} {
		cmd := exec.Command(filepath.Join(e.binDir, "kubectl"), args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// domainPods creates n pods that each take count whole GPUs and the
// domain's channel (its template), named <prefix>-<i>.
func domainPods(t *testing.T, ns, prefix, channelTemplate string, n int, gpus int64) []string {
	t.Helper()
	ctx := context.Background()
	gpuTmpl := prefix + "-gpus"
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: gpuTmpl, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				request{class: "gpu.facet.dev", count: gpus, cel: []string{`device.attributes["gpu.facet.dev"].productName.startsWith("NVIDIA GB200")`}}.deviceRequest(),
			}},
		}},
	}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"job": prefix}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name: "c", Image: "facet.local/busybox:1", ImagePullPolicy: corev1.PullNever,
					Command:   []string{"sleep", "86400"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}, {Name: "channel"}}},
				}},
				ResourceClaims: []corev1.PodResourceClaim{
					{Name: "gpus", ResourceClaimTemplateName: ptr.To(gpuTmpl)},
					{Name: "channel", ResourceClaimTemplateName: ptr.To(channelTemplate)},
				},
			},
		}
		if _, err := e.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, name)
	}
	return pods
}

// cdiCreate is the first CreateContainer of a pod's container in a
// node's fake CRI log.
type cdiCreate struct {
	Time       time.Time `json:"time"`
	Namespace  string    `json:"namespace"`
	Pod        string    `json:"pod"`
	CDIDevices []string  `json:"cdiDevices"`
}

func cdiCreateOf(t *testing.T, node, ns, pod string) (cdiCreate, bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(e.runDir, "logs", node, "cdi.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r cdiCreate
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Namespace == ns && r.Pod == pod {
			return r, true
		}
	}
	return cdiCreate{}, false
}

// readyAt is when the pod's Ready condition last turned True.
func readyAt(p *corev1.Pod) (time.Time, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// TestComputeDomainRack runs a ComputeDomain of 4 nodes with 4 GPUs each
// on the simulated GB200 rack (hack/cluster/add-rack.sh: clique a of 4
// nodes, clique b of 2), with facet-controller, the nodes' kubelet plugins
// and facet-imex's stand-in under the fake CRIs' exec mode, all real:
//   - the domain is pinned to clique a and its 4 pods land there, one a
//     node; each pod's container is created only after its node's IMEX
//     daemon is Ready, with the channel's CDI device; the time from pods
//     created to all Running is logged;
//   - a second domain of 3 nodes fits no clique (a is taken): its pods on
//     clique b wait for daemons that cannot be ready and never start, the
//     third stays Pending, and facetctl fit names the domain's clique;
//   - a daemon crash: the node's entry goes NotReady, Events say so, and it
//     comes back; the domain's pods keep running;
//   - a node lost (its Node deleted): dropped from the domain, NodeLost;
//   - the domain deleted while its pods run: it waits for them
//     (WaitingForPods); once they go, no label, DaemonSet, daemon process,
//     template or channel CDI spec is left.
func TestComputeDomainRack(t *testing.T) {
	nodes := rack(t)
	cliques := map[string][]string{}
	for _, n := range nodes {
		cliques[n.clique] = append(cliques[n.clique], n.name)
	}
	var cliqueA, cliqueB string
	for c, members := range cliques {
		switch len(members) {
		case 4:
			cliqueA = c
		case 2:
			cliqueB = c
		}
	}
	if cliqueA == "" || cliqueB == "" {
		t.Fatalf("rack %v: want a clique of 4 nodes and one of 2", cliques)
	}
	ctx := context.Background()
	applyChartCRD(t)
	ns := newNamespace(t)
	log := startRackController(t, ns)
	dump := func() string { b, _ := os.ReadFile(log); return string(b) }
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cds := dynamic.NewForConfigOrDie(cfg).Resource(computeDomains).Namespace(ns)
	get := func(name string) (*v1alpha1.ComputeDomain, error) {
		u, err := cds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cd := &v1alpha1.ComputeDomain{}
		return cd, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd)
	}
	create := func(name string, numNodes int32) *v1alpha1.ComputeDomain {
		t.Helper()
		cd := &v1alpha1.ComputeDomain{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ComputeDomainKind},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.ComputeDomainSpec{NumNodes: numNodes, Channel: v1alpha1.ComputeDomainChannelSpec{
				ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: name + "-channel"}}},
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cds.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var got *v1alpha1.ComputeDomain
		waitFor(t, "domain "+name+" pinned and its channel template written", time.Minute, func() (bool, error) {
			var err error
			if got, err = get(name); err != nil {
				return false, err
			}
			_, tplErr := e.client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name+"-channel", metav1.GetOptions{})
			return got.Status.Clique != "" && tplErr == nil, fmt.Errorf("status %+v, template %v\n%s", got.Status, tplErr, dump())
		})
		return got
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("facet-controller's log:\n%s", dump())
		}
	})

	// The 4-node domain: clique a, the only one with 4 free channels.
	train := create("train", 4)
	if train.Status.Clique != cliqueA {
		t.Fatalf("domain train pinned to %q, want clique a %q", train.Status.Clique, cliqueA)
	}
	start := time.Now()
	pods := domainPods(t, ns, "train", "train-channel", 4, 4)
	running := map[string]*corev1.Pod{}
	waitFor(t, "the domain's 4 pods Running", 4*time.Minute, func() (bool, error) {
		for _, name := range pods {
			p := getPod(t, ns, name)
			if p.Status.Phase == corev1.PodRunning {
				running[name] = p
			}
		}
		return len(running) == len(pods), fmt.Errorf("%d of %d Running", len(running), len(pods))
	})
	t.Logf("ComputeDomain of 4 nodes x 4 GPUs: pods created to all Running in %s", time.Since(start).Round(100*time.Millisecond))
	var trainNodes []string
	for _, name := range pods {
		trainNodes = append(trainNodes, running[name].Spec.NodeName)
	}
	slices.Sort(trainNodes)
	if want := slices.Sorted(slices.Values(cliques[cliqueA])); !slices.Equal(trainNodes, want) {
		t.Errorf("the domain's pods on %v, want one on each node of clique a %v", trainNodes, want)
	}
	train, err = get("train")
	if err != nil {
		t.Fatal(err)
	}
	if train.Status.Status != v1alpha1.ComputeDomainReady || len(train.Status.Nodes) != 4 {
		t.Errorf("domain train's status %+v, want Ready with 4 nodes", train.Status)
	}
	// Each container was created after its node's daemon was Ready, with
	// the channel.
	daemons := map[string]*corev1.Pod{}
	list, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: computedomain.Label + "=" + string(train.UID)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		daemons[list.Items[i].Spec.NodeName] = &list.Items[i]
	}
	for _, name := range pods {
		node := running[name].Spec.NodeName
		c, ok := cdiCreateOf(t, node, ns, name)
		if !ok {
			t.Errorf("pod %s: no container created on %s", name, node)
			continue
		}
		if !slices.ContainsFunc(c.CDIDevices, func(d string) bool { return strings.Contains(d, names.KindIMEXChannel) }) {
			t.Errorf("pod %s's container has CDI devices %v, no IMEX channel", name, c.CDIDevices)
		}
		d, ok := daemons[node]
		if !ok {
			t.Errorf("no IMEX daemon pod of the domain on %s", node)
			continue
		}
		// The condition's time is in whole seconds, at or before the
		// daemon turned Ready.
		if at, ok := readyAt(d); !ok || c.Time.Before(at) {
			t.Errorf("pod %s's container created at %s, its node %s's IMEX daemon Ready at %v (%v)", name, c.Time, node, at, ok)
		}
	}

	// A domain that fits no clique: clique a is taken, b has 2 of 3.
	small := create("small", 3)
	if small.Status.Clique != cliqueB {
		t.Errorf("domain small pinned to %q, want the clique with the most free channels, b %q", small.Status.Clique, cliqueB)
	}
	if c := meta(small.Status.Conditions, v1alpha1.ConditionCliqueAssigned); c == nil || c.Reason != computedomain.ReasonNoCliqueFits {
		t.Errorf("domain small's CliqueAssigned condition %+v, want reason %s", c, computedomain.ReasonNoCliqueFits)
	}
	smallPods := domainPods(t, ns, "small", "small-channel", 3, 4)
	var pending string
	waitFor(t, "two of small's pods on clique b waiting for their daemons, one Pending unschedulable", 3*time.Minute, func() (bool, error) {
		bound, waiting := 0, 0
		pending = ""
		for _, name := range smallPods {
			p := getPod(t, ns, name)
			if p.Status.Phase == corev1.PodRunning {
				return false, fmt.Errorf("pod %s Running without a Ready IMEX daemon", name)
			}
			if p.Spec.NodeName == "" {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
						pending = name
					}
				}
				continue
			}
			bound++
			if !slices.Contains(cliques[cliqueB], p.Spec.NodeName) {
				return false, fmt.Errorf("pod %s on %s, outside clique b", name, p.Spec.NodeName)
			}
			if podEventContains(t, ns, name, "IMEX daemon") {
				waiting++
			}
		}
		return bound == 2 && waiting == 2 && pending != "", fmt.Errorf("%d bound, %d waiting with the reason, pending %q", bound, waiting, pending)
	})
	// facetctl fit names the domain's clique for the Pending pod.
	p := getPod(t, ns, pending)
	p.ManagedFields, p.Status = nil, corev1.PodStatus{}
	p.APIVersion, p.Kind = "v1", "Pod"
	manifest, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	fitFile := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(fitFile, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(e.repo, "bin", "facetctl"), "fit", "--kubeconfig", e.kubeconfig, "-f", fitFile).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Errorf("facetctl fit for %s: %v, want exit code 3 (fits nowhere)\n%s", pending, err, out)
	}
	if !strings.Contains(string(out), "compute domains:") || !strings.Contains(string(out), cliqueB) {
		t.Errorf("facetctl fit for %s does not name the domain's clique %s:\n%s", pending, cliqueB, out)
	}
	t.Logf("facetctl fit for %s:\n%s", pending, out)
	for _, name := range smallPods {
		if err := e.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cds.Delete(ctx, "small", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "domain small gone with its pods", 3*time.Minute, func() (bool, error) {
		_, err := get("small")
		return apierrors.IsNotFound(err), err
	})

	// A daemon crash: the kubelet restarts it, the controller follows.
	crashNode := trainNodes[0]
	pid := imexPID(t, string(train.UID), crashNode)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "DaemonRestarted on the domain and its daemon Ready again", 2*time.Minute, func() (bool, error) {
		cd, err := get("train")
		if err != nil {
			return false, err
		}
		return hasDomainEvent(t, ns, train.UID, computedomain.ReasonDaemonRestarted) && cd.Status.Status == v1alpha1.ComputeDomainReady, fmt.Errorf("status %+v", cd.Status)
	})
	for _, name := range pods {
		if p := getPod(t, ns, name); p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s after a daemon crash, want still Running", name, p.Status.Phase)
		}
	}

	// The domain deleted while its pods run: it waits.
	if err := cds.Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "WaitingForPods on the deleted domain", time.Minute, func() (bool, error) {
		return hasDomainEvent(t, ns, train.UID, computedomain.ReasonWaitingForPods), nil
	})
	if _, err := get("train"); err != nil {
		t.Fatalf("the domain went while its pods ran: %v", err)
	}

	// A node lost while the domain waits: dropped, with NodeLost. Its Node
	// is put back after (the kubelet does not register again by itself),
	// so the round's later tests see the rack whole.
	lost := trainNodes[len(trainNodes)-1]
	node, err := e.client.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Nodes().Delete(ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "NodeLost for "+lost, 2*time.Minute, func() (bool, error) {
		cd, err := get("train")
		if err != nil {
			return false, err
		}
		in := slices.ContainsFunc(cd.Status.Nodes, func(n v1alpha1.ComputeDomainNode) bool { return n.Name == lost })
		return hasDomainEvent(t, ns, train.UID, computedomain.ReasonNodeLost) && !in, fmt.Errorf("status %+v", cd.Status)
	})
	node.ResourceVersion, node.UID = "", ""
	delete(node.Labels, computedomain.Label)
	if _, err := e.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Errorf("putting node %s back: %v", lost, err)
	}

	// The pods end: everything of the domain goes.
	var channelClaims []types.UID
	claims, err := e.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if strings.Contains(c.Name, "channel") {
			channelClaims = append(channelClaims, c.UID)
		}
	}
	for _, name := range pods {
		if err := e.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	waitFor(t, "the domain, its DaemonSet, template, labels and daemons gone", 4*time.Minute, func() (bool, error) {
		_, cdErr := get("train")
		_, dsErr := e.client.AppsV1().DaemonSets(ns).Get(ctx, computedomain.DaemonSetName(train), metav1.GetOptions{})
		_, tplErr := e.client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "train-channel", metav1.GetOptions{})
		labelled, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: computedomain.Label})
		if err != nil {
			return false, err
		}
		procs := imexPIDs(t, string(train.UID))
		return apierrors.IsNotFound(cdErr) && apierrors.IsNotFound(dsErr) && apierrors.IsNotFound(tplErr) && len(labelled.Items) == 0 && len(procs) == 0,
			fmt.Errorf("domain %v, DaemonSet %v, template %v, %d labelled nodes, daemon processes %v", cdErr, dsErr, tplErr, len(labelled.Items), procs)
	})
	// No channel claim's CDI spec is left on any node of the rack.
	for _, n := range cliques[cliqueA] {
		if n == lost {
			continue
		}
		specs, _ := filepath.Glob(filepath.Join(e.runDir, "nodes", n, "cdi", "*"))
		for _, s := range specs {
			b, _ := os.ReadFile(s)
			for _, uid := range channelClaims {
				if strings.Contains(string(b), string(uid)) || strings.Contains(s, string(uid)) {
					t.Errorf("node %s: CDI spec %s of channel claim %s left", n, s, uid)
				}
			}
		}
	}
	for _, reason := range []string{computedomain.ReasonCliqueAssigned, computedomain.ReasonNodeJoined, computedomain.ReasonDaemonReady, computedomain.ReasonReady, computedomain.ReasonTornDown} {
		if !hasDomainEvent(t, ns, train.UID, reason) {
			t.Errorf("no %s Event on domain train", reason)
		}
	}
}

func meta(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// podEventContains reports whether an Event of the pod has s in its
// message.
func podEventContains(t *testing.T, ns, pod, s string) bool {
	t.Helper()
	events, err := e.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if strings.Contains(ev.Message, s) {
			return true
		}
	}
	return false
}

// hasDomainEvent reports whether an Event of the reason names the domain.
func hasDomainEvent(t *testing.T, ns string, uid types.UID, reason string) bool {
	t.Helper()
	events, err := e.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.uid": string(uid), "reason": reason}.AsSelector().String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(events.Items) > 0
}
