package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// cdNamespace is where TestComputeDomain's domains and facet-controller's
// DaemonSets go (the controller runs as Facet's namespace's).
const cdNamespace = "facet-cd-e2e"

// cdFabric is the fabric cluster UUID of the test's hand-written channel.
const cdFabric = "e2e0c0de-0000-4000-8000-000000000001"

// imexPodTemplate is the IMEX daemons' pod for the test: busybox standing
// in for facet-imex (the controller's arguments go to sh -c as positional
// parameters, unused), Ready at once, in the host's network as the chart's.
const imexPodTemplate = `metadata:
  labels: {app.kubernetes.io/component: imex}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: imex
    image: facet.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "exec sleep 86400", facet-imex]
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
`

// applyComputeDomainCRD applies the chart's generated CRD and waits until
// it is served. A CRD it created goes when t ends: the chart's live tests,
// which follow on the same node, install it with Helm, which adopts no
// object it did not make.
func applyComputeDomainCRD(t *testing.T) {
	t.Helper()
	if _, err := kubectlErr("get", "crd", "computedomains.gpu.facet.dev"); err != nil {
		t.Cleanup(func() {
			_, _ = kubectlErr("delete", "crd", "computedomains.gpu.facet.dev", "--wait=true", "--timeout=60s")
		})
	}
	kubectl(t, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(e.repo, "deployments", "helm", "facet", "files", "crds", "gpu.facet.dev_computedomains.yaml"))
	kubectl(t, "wait", "--for=condition=Established", "--timeout=60s", "crd/computedomains.gpu.facet.dev")
}

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return dynamic.NewForConfigOrDie(cfg)
}

func cdManifest(name string, numNodes int, extra string) string {
	return fmt.Sprintf(`apiVersion: gpu.facet.dev/v1alpha1
kind: ComputeDomain
metadata: {name: %s, namespace: %s}
spec:
  numNodes: %d
  channel:
    resourceClaimTemplate: {name: %s-channel}
%s`, name, cdNamespace, numNodes, name, extra)
}

// TestComputeDomainCRD: the generated CRD on the real API server refuses
// what ComputeDomainSpec's validation refuses, defaults allocationMode,
// keeps the spec immutable, and serves status apart.
func TestComputeDomainCRD(t *testing.T) {
	applyComputeDomainCRD(t)
	cdSetup(t)
	for _, tc := range []struct {
		name, manifest, err string
	}{
		{"numNodes 0", cdManifest("zero", 0, ""), "spec.numNodes: Invalid value: 0"},
		{"numNodes 65", cdManifest("many", 65, ""), "spec.numNodes: Invalid value: 65"},
		{"no numNodes", strings.Replace(cdManifest("none", 1, ""), "  numNodes: 1\n", "", 1), "spec.numNodes: Required value"},
		{"an unknown allocation mode", cdManifest("mode", 2, "    allocationMode: Some\n"), `spec.channel.allocationMode: Unsupported value: "Some": supported values: "Single", "All"`},
		{"a template name that is no DNS subdomain", strings.Replace(cdManifest("bad", 2, ""), "bad-channel", "Bad_Channel", 1), "spec.channel.resourceClaimTemplate.name: Invalid value: \"Bad_Channel\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := kubectlErrIn(tc.manifest, "create", "-f", "-")
			if err == nil || !strings.Contains(out, tc.err) {
				t.Errorf("kubectl create: %v\n%s\nwant an error with %q", err, out, tc.err)
			}
		})
	}
	// A valid one; allocationMode defaults to Single.
	kubectlIn(t, cdManifest("ok", 2, ""), "create", "-f", "-")
	dyn := dynamicClient(t)
	u, err := dyn.Resource(occupancy.ComputeDomains).Namespace(cdNamespace).Get(context.Background(), "ok", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mode, _, _ := unstructured.NestedString(u.Object, "spec", "channel", "allocationMode"); mode != "Single" {
		t.Errorf("allocationMode %q, want the default Single", mode)
	}
	// The spec is immutable, the status a subresource of its own.
	if out, err := kubectlErr("patch", "computedomain", "ok", "-n", cdNamespace, "--type=merge", "-p", `{"spec":{"numNodes":3}}`); err == nil || !strings.Contains(out, "spec is immutable") {
		t.Errorf("a spec edit: %v\n%s", err, out)
	}
	if out, err := kubectlErr("patch", "computedomain", "ok", "-n", cdNamespace, "--type=merge", "-p", `{"status":{"clique":"x.1"}}`); err != nil || strings.Contains(kubectl(t, "get", "computedomain", "ok", "-n", cdNamespace, "-o", "jsonpath={.status.clique}"), "x.1") {
		t.Errorf("a status patch on the main resource must not change status: %v\n%s", err, out)
	}
	if out, err := kubectlErr("patch", "computedomain", "ok", "-n", cdNamespace, "--subresource=status", "--type=merge", "-p", `{"status":{"status":"Maybe"}}`); err == nil || !strings.Contains(out, `Unsupported value: "Maybe"`) {
		t.Errorf("a status out of its enum: %v\n%s", err, out)
	}
	// The printer columns.
	if out := kubectl(t, "get", "computedomains", "-n", cdNamespace); !strings.Contains(out, "NODES") || !strings.Contains(out, "CLIQUE") || !strings.Contains(out, "ok-channel") {
		t.Errorf("kubectl get:\n%s", out)
	}
}

// kubectlErrIn runs kubectl with stdin.
func kubectlErrIn(stdin string, args ...string) (string, error) {
	dir, err := os.MkdirTemp("", "facet-e2e-stdin-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "in.yaml")
	if err := os.WriteFile(path, []byte(stdin), 0o644); err != nil {
		return "", err
	}
	for i, a := range args {
		if a == "-" {
			args[i] = path
		}
	}
	return kubectlErr(args...)
}

func kubectlIn(t *testing.T, stdin string, args ...string) {
	t.Helper()
	if out, err := kubectlErrIn(stdin, args...); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// controllerRuns counts TestComputeDomain's facet-controller logs.
var controllerRuns int

// startController runs bin/facet-controller as a host process against
// the node's API server, as the chart's Deployment runs it, with the
// test's pod template, and returns its log's path once it serves its
// metrics.
func startController(t *testing.T) string {
	t.Helper()
	controllerRuns++
	dir := t.TempDir()
	tpl := filepath.Join(dir, "imex-pod-template.yaml")
	if err := os.WriteFile(tpl, []byte(imexPodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(e.runDir, "logs", fmt.Sprintf("facet-controller-e2e-%d.log", controllerRuns))
	testenv.StartProcess(t, log, filepath.Join(e.repo, "bin", "facet-controller"), "--kubeconfig", e.kubeconfig,
		"--namespace", cdNamespace, "--leader-elect-namespace", cdNamespace, "--imex-pod-template", tpl,
		"--metrics-addr", "127.0.0.1:0", "--resync", "2s", "-v", "2")
	waitFor(t, "facet-controller's metrics address in "+log, 30*time.Second, func() (bool, error) {
		b, _ := os.ReadFile(log)
		return preemptorMetricsRE.Match(b), fmt.Errorf("log:\n%s", b)
	})
	return log
}

// channelSlice is a hand-written ResourceSlice of one imex-channel
// device in clique <cdFabric>.1, in a pool of its own: the single node's
// plugin publishes no channel (its machine has no NVLink fabric).
func channelSlice(t *testing.T) {
	t.Helper()
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "compute-domain-e2e"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: names.Driver, Pool: resourceapi.ResourcePool{Name: "compute-domain-e2e", ResourceSliceCount: 1}, NodeName: ptr.To(nodeName),
			Devices: []resourceapi.Device{{Name: "imex-channel", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				names.AttrType:          {StringValue: ptr.To(occupancy.TypeIMEXChannel)},
				names.AttrFabricCluster: {StringValue: ptr.To(cdFabric)},
				names.AttrFabricClique:  {IntValue: ptr.To[int64](1)},
			}}},
		},
	}
	ctx := context.Background()
	_ = e.client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{})
	if _, err := e.client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
}

// TestComputeDomain runs facet-controller against the real API server,
// kube-controller-manager and kubelet: a domain of one node is pinned to
// the one clique, gets its channel template and IMEX DaemonSet; the node's
// label (the kubelet plugin's, set here by hand) brings a daemon pod,
// whose readiness makes the domain Ready; deleted while the node is
// labelled, the domain waits; unlabelled, its DaemonSet, its pod, its
// template and its finalizer go, and nothing is left.
func TestComputeDomain(t *testing.T) {
	applyComputeDomainCRD(t)
	cdSetup(t)
	channelSlice(t)
	ctx := context.Background()
	t.Cleanup(func() {
		// Whatever happened: no label, no domain, no DaemonSet left on the
		// node for the tests that follow.
		_, _ = kubectlErr("label", "node", nodeName, computedomain.Label+"-")
		_, _ = kubectlErr("delete", "computedomains", "--all", "-n", cdNamespace, "--wait=true", "--timeout=60s")
		_, _ = kubectlErr("delete", "daemonsets", "--all", "-n", cdNamespace, "--wait=true", "--timeout=60s")
	})
	log := startController(t)
	dump := func() string { b, _ := os.ReadFile(log); return string(b) }
	dyn := dynamicClient(t).Resource(occupancy.ComputeDomains).Namespace(cdNamespace)
	get := func() (*v1alpha1.ComputeDomain, error) {
		u, err := dyn.Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cd := &v1alpha1.ComputeDomain{}
		return cd, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd)
	}

	start := time.Now()
	applyYAML(t, cdManifest("train", 1, ""))
	var cd *v1alpha1.ComputeDomain
	waitFor(t, "the domain pinned, its template and DaemonSet made", time.Minute, func() (bool, error) {
		var err error
		if cd, err = get(); err != nil {
			return false, err
		}
		_, tplErr := e.client.ResourceV1().ResourceClaimTemplates(cdNamespace).Get(ctx, "train-channel", metav1.GetOptions{})
		_, dsErr := e.client.AppsV1().DaemonSets(cdNamespace).Get(ctx, computedomain.DaemonSetName(cd), metav1.GetOptions{})
		return slices.Contains(cd.Finalizers, computedomain.Finalizer) && cd.Status.Clique == cdFabric+".1" && tplErr == nil && dsErr == nil,
			fmt.Errorf("finalizers %v, status %+v, template %v, DaemonSet %v\n%s", cd.Finalizers, cd.Status, tplErr, dsErr, dump())
	})
	t.Logf("pinned, template and DaemonSet in %s", time.Since(start).Round(time.Millisecond))
	tpl, err := e.client.ResourceV1().ResourceClaimTemplates(cdNamespace).Get(ctx, "train-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := tpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression; !strings.Contains(sel, `fabricClusterUUID == "`+cdFabric+`"`) || !computedomain.OwnedBy(tpl, cd) {
		t.Errorf("template: selector %s, owners %v", sel, tpl.OwnerReferences)
	}
	// The API server's validation of the template's selector and config
	// passed (it was created); the config decodes as the plugin decodes it.
	if cfg := computedomain.ChannelConfigOf(&resourceapi.ResourceClaim{Spec: tpl.Spec.Spec}); cfg == nil || cfg.DomainUID != string(cd.UID) {
		t.Errorf("template's channel config %+v", cfg)
	}

	// The plugin's label on the node brings the daemon; its readiness the
	// domain's.
	start = time.Now()
	kubectl(t, "label", "node", nodeName, computedomain.Label+"="+string(cd.UID))
	waitFor(t, "the domain Ready with the node's daemon", 2*time.Minute, func() (bool, error) {
		var err error
		if cd, err = get(); err != nil {
			return false, err
		}
		return cd.Status.Status == v1alpha1.ComputeDomainReady && len(cd.Status.Nodes) == 1 && cd.Status.Nodes[0].Name == nodeName && cd.Status.Nodes[0].IPAddress != "",
			fmt.Errorf("status %+v", cd.Status)
	})
	t.Logf("daemon pod Ready and the domain Ready %s after the label", time.Since(start).Round(time.Millisecond))
	// The controller serves its metrics as facet-preemptor does
	// (daemon.Serve), and its log says where. They count the domains of
	// its informer, which may see the Ready status a moment after the API
	// server answered the wait above: waited for, not read once.
	waitFor(t, `facet_controller_compute_domains{state="ready"} 1`, 30*time.Second, func() (bool, error) {
		v := (&preemptor{log: log}).metric(t, `facet_controller_compute_domains{state="ready"}`)
		return v == 1, fmt.Errorf("%v", v)
	})

	// Deleted while the node is labelled (a channel still prepared): it
	// waits, the DaemonSet stays, the template goes at once.
	if err := dyn.Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the WaitingForPods Event and the template gone", time.Minute, func() (bool, error) {
		_, tplErr := e.client.ResourceV1().ResourceClaimTemplates(cdNamespace).Get(ctx, "train-channel", metav1.GetOptions{})
		return hasEvent(t, cd.UID, computedomain.ReasonWaitingForPods) && apierrors.IsNotFound(tplErr), fmt.Errorf("template %v", tplErr)
	})
	if _, err := get(); err != nil {
		t.Fatalf("the domain went while its node was labelled: %v", err)
	}
	if _, err := e.client.AppsV1().DaemonSets(cdNamespace).Get(ctx, computedomain.DaemonSetName(cd), metav1.GetOptions{}); err != nil {
		t.Fatalf("the DaemonSet went while its node was labelled: %v", err)
	}

	// The plugin unprepared the last channel: the label goes, and with it
	// everything.
	start = time.Now()
	kubectl(t, "label", "node", nodeName, computedomain.Label+"-")
	waitFor(t, "the domain, its DaemonSet and its daemon pods gone", 2*time.Minute, func() (bool, error) {
		_, cdErr := get()
		_, dsErr := e.client.AppsV1().DaemonSets(cdNamespace).Get(ctx, computedomain.DaemonSetName(cd), metav1.GetOptions{})
		pods, err := e.client.CoreV1().Pods(cdNamespace).List(ctx, metav1.ListOptions{LabelSelector: computedomain.Label + "=" + string(cd.UID)})
		if err != nil {
			return false, err
		}
		return apierrors.IsNotFound(cdErr) && apierrors.IsNotFound(dsErr) && len(pods.Items) == 0,
			fmt.Errorf("domain %v, DaemonSet %v, %d pods", cdErr, dsErr, len(pods.Items))
	})
	t.Logf("torn down %s after the label went", time.Since(start).Round(time.Millisecond))
	for _, reason := range []string{computedomain.ReasonCliqueAssigned, computedomain.ReasonNodeJoined, computedomain.ReasonDaemonReady, computedomain.ReasonReady, computedomain.ReasonTornDown} {
		if !hasEvent(t, cd.UID, reason) {
			t.Errorf("no %s Event on the domain", reason)
		}
	}
}

// hasEvent reports whether an Event of the reason names the domain.
func hasEvent(t *testing.T, uid types.UID, reason string) bool {
	t.Helper()
	evs, err := e.client.CoreV1().Events(cdNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.UID == uid {
			return true
		}
	}
	return false
}

// cdSetup makes a fresh cdNamespace, first waiting out one an earlier test
// left terminating, and deletes it when t ends.
func cdSetup(t *testing.T) {
	t.Helper()
	waitFor(t, "namespace "+cdNamespace+" gone", 3*time.Minute, func() (bool, error) {
		ns, err := e.client.CoreV1().Namespaces().Get(context.Background(), cdNamespace, metav1.GetOptions{})
		return err != nil || ns.DeletionTimestamp == nil, err
	})
	applyYAML(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+cdNamespace+"}\n")
	t.Cleanup(func() {
		_, _ = kubectlErr("delete", "computedomains", "--all", "-n", cdNamespace, "--wait=true", "--timeout=60s")
		_, _ = kubectlErr("delete", "namespace", cdNamespace, "--wait=false")
	})
}
