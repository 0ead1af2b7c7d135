package helm

// Tests against a real API server: hack/e2e.sh's local node, found through
// KUBECONFIG, FACET_RUN_DIR and FACET_BIN_DIR (as test/e2e finds it). They
// are skipped when those are not set.

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	certutil "k8s.io/client-go/util/cert"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/webhook"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimstatus"
	"github.com/facet-gpu/facet/pkg/node/computedomain"
	"github.com/facet-gpu/facet/test/helm/helmtest"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// live is the local node (helmtest.LiveCluster).
type live = helmtest.Live

func liveCluster(t *testing.T) *live { return helmtest.LiveCluster(t) }

func stream(t testing.TB, objs []object) string {
	t.Helper()
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.String()
}

// TestLiveServerDryRun sends every object of every configuration through
// the API server's validation and admission (kubectl apply
// --dry-run=server): schemas, CEL of the policies and of the webhook's
// matchConditions, RBAC objects, helm test's pod. cert-manager's kinds
// are left out when the cluster does not serve them.
func TestLiveServerDryRun(t *testing.T) {
	l := liveCluster(t)
	const ns = "facet-helm-dryrun"
	l.Namespace(t, ns)
	out, _ := l.Run("", "api-resources", "--api-group=cert-manager.io", "-o", "name")
	certManager := strings.TrimSpace(out) != ""
	for name, vals := range configurations(t) {
		t.Run(name, func(t *testing.T) {
			var objs []object
			// With the IMEX DaemonSet facet-controller makes of the chart's
			// pod template: the chart deploys it too.
			for _, o := range podObjects(t, renderAs(t, vals, "facet-dryrun", ns)) {
				if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") && !certManager {
					t.Logf("skipped %s %s: cert-manager is not installed", o.GetKind(), o.GetName())
					continue
				}
				objs = append(objs, o)
			}
			// A pod's ServiceAccount must exist for its admission, which a
			// dry run of the stream that holds both does not create: the
			// ones the chart's pods (helm test's) name are made first.
			var accounts []object
			for _, o := range objs {
				if o.GetKind() != "Pod" {
					continue
				}
				var pod corev1.Pod
				into(t, o, &pod)
				for _, sa := range objs {
					if sa.GetKind() == "ServiceAccount" && sa.GetName() == pod.Spec.ServiceAccountName {
						accounts = append(accounts, sa)
					}
				}
			}
			if len(accounts) > 0 {
				l.Must(t, stream(t, accounts), "apply", "-f", "-")
				t.Cleanup(func() { _, _ = l.Run(stream(t, accounts), "delete", "--ignore-not-found", "-f", "-") })
			}
			out, err := l.Run(stream(t, objs), "apply", "--dry-run=server", "-f", "-")
			if err != nil {
				t.Fatalf("server-side dry run: %v\n%s", err, out)
			}
			if n := strings.Count(out, "(server dry run)"); n != len(objs) {
				t.Errorf("%d objects, %d dry-run results:\n%s", len(objs), n, out)
			}
		})
	}
}

// TestLiveNodeRestriction installs the chart's plugin service account,
// RBAC and ResourceSlice policy, and acts as the plugin of a pod on a real
// node with a token bound to that pod: it may write its own node's slices
// of gpu.facet.dev, and nothing else.
func TestLiveNodeRestriction(t *testing.T) {
	l := liveCluster(t)
	ctx := context.Background()
	const ns, release = "facet-helm-noderestriction", "facet-helmtest"
	l.Namespace(t, ns)

	objs := renderAs(t, values(t, `
deviceClasses: {enabled: false}
admission: {policies: {enabled: false}, webhook: {enabled: false}}
tests: {nodeCheck: {enabled: false}}
computeDomains: {enabled: false, crd: {install: false}}
`), release, ns)
	var install []object
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			install = append(install, o)
		}
	}
	if len(install) != 9 {
		t.Fatalf("%d objects to install, want 9 (three policies with their bindings)", len(install))
	}
	manifest := stream(t, install)
	t.Cleanup(func() { _, _ = l.Run(manifest, "delete", "--ignore-not-found", "-f", "-") })
	l.Must(t, manifest, "apply", "-f", "-")
	sa := release + "-kubelet-plugin"
	policy := release + "-resourceslices-own-node"

	nodes, err := l.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) == 0 {
		t.Skip("no node to bind a pod to")
	}
	node := nodes.Items[0].Name

	// A pod of the service account on the node; it need not run.
	pod, err := l.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin"},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			AutomountServiceAccountToken:  ptr.To(false),
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10", ImagePullPolicy: corev1.PullNever}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asPlugin := func(boundToPod bool) kubernetes.Interface {
		t.Helper()
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
		if boundToPod {
			req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		}
		tok, err := l.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg := rest.AnonymousClientConfig(l.Config)
		cfg.BearerToken = tok.Status.Token
		return kubernetes.NewForConfigOrDie(cfg)
	}
	plugin := asPlugin(true)

	slice := func(name, driver, nodeName string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				Pool:     resourceapi.ResourcePool{Name: "facet-helm-test", ResourceSliceCount: 1},
				NodeName: ptr.To(nodeName),
			},
		}
	}
	for _, n := range []string{"facet-helm-own", "facet-helm-other", "facet-helm-driver", "facet-helm-unbound", "facet-helm-admin"} {
		t.Cleanup(func() { _ = l.Client.ResourceV1().ResourceSlices().Delete(ctx, n, metav1.DeleteOptions{}) })
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// Until the policy is loaded the plugin could write anywhere: probe
	// with dry runs only.
	testenv.WaitFor(t, "policy "+policy+" enforced", time.Minute, func() (bool, error) {
		_, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice("facet-helm-other", "gpu.facet.dev", "not-"+node), dryRun)
		return err != nil && strings.Contains(err.Error(), policy), err
	})

	t.Run("own node: create, update, delete", func(t *testing.T) {
		s, err := plugin.ResourceV1().ResourceSlices().Create(ctx, slice("facet-helm-own", "gpu.facet.dev", node), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels = map[string]string{"updated": "yes"}
		if _, err := plugin.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := plugin.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	refused := []struct {
		name   string
		client kubernetes.Interface
		slice  *resourceapi.ResourceSlice
		want   string
	}{
		{"another node's slice", plugin, slice("facet-helm-other", "gpu.facet.dev", "not-"+node),
			fmt.Sprintf("Facet's kubelet plugin on node '%s' may only write the ResourceSlices of its own node, not those of node 'not-%s'", node, node)},
		{"another driver's slice", plugin, slice("facet-helm-driver", "other.example.com", node),
			"may only write ResourceSlices of driver gpu.facet.dev, not 'other.example.com'"},
		{"a token that names no node", asPlugin(false), slice("facet-helm-unbound", "gpu.facet.dev", node),
			"This request's token names no node"},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := tc.client.ResourceV1().ResourceSlices().Create(ctx, tc.slice, metav1.CreateOptions{})
			if err == nil {
				t.Fatal("created")
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant Forbidden with %q", err, tc.want)
			}
		})
	}

	t.Run("another node's slice cannot be deleted", func(t *testing.T) {
		if _, err := l.Client.ResourceV1().ResourceSlices().Create(ctx, slice("facet-helm-admin", "gpu.facet.dev", "not-"+node), metav1.CreateOptions{}); err != nil {
			t.Fatalf("the admin is not restricted: %v", err)
		}
		err := plugin.ResourceV1().ResourceSlices().Delete(ctx, "facet-helm-admin", metav1.DeleteOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not those of node 'not-"+node+"'") {
			t.Fatalf("delete: %v", err)
		}
	})

	// allocated creates a claim allocated on nodeName, as the scheduler
	// leaves it: one device of the node's pool, a node selector naming it.
	allocated := func(t *testing.T, name, nodeName string) *resourceapi.ResourceClaim {
		t.Helper()
		c, err := l.Client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.facet.dev"}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Status.Allocation = &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: names.Driver, Pool: nodeName, Device: "gpu-0"},
			}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}},
			}}}},
		}
		if c, err = l.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// applyDevices server-side applies, as the plugin, the status.devices
	// entries of rec (none for nil) to claim c.
	applyDevices := func(t *testing.T, c *resourceapi.ResourceClaim, rec *checkpoint.Claim) ([]resourceapi.AllocatedDeviceStatus, error) {
		t.Helper()
		ac, err := claimstatus.Apply(ns, c.Name, c.UID, rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := plugin.ResourceV1().ResourceClaims(ns).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: claimstatus.FieldManager, Force: true})
		if err != nil {
			return nil, err
		}
		return got.Status.Devices, nil
	}

	t.Run("status.devices: server-side apply of its entries", func(t *testing.T) {
		c := allocated(t, "prepared", node)
		rec := &checkpoint.Claim{UID: c.UID, Namespace: ns, Name: c.Name, State: checkpoint.StatePrepared,
			Devices: []checkpoint.Device{{Kind: names.KindGPU, Pool: node, Device: "gpu-0", GPUUUID: "GPU-test"}}}
		apply := func(rec *checkpoint.Claim) []resourceapi.AllocatedDeviceStatus {
			t.Helper()
			d, err := applyDevices(t, c, rec)
			if err != nil {
				t.Fatalf("the plugin's service account cannot apply status.devices: %v", err)
			}
			return d
		}
		if d := apply(rec); len(d) != 1 || d[0].Driver != names.Driver || d[0].Device != "gpu-0" || d[0].Data == nil ||
			!strings.Contains(string(d[0].Data.Raw), `"gpuUUID":"GPU-test"`) {
			t.Errorf("status.devices after prepare: %+v", d)
		}
		if d := apply(nil); len(d) != 0 {
			t.Errorf("status.devices after unprepare: %+v, want none", d)
		}
		// The plugin may write the status, not the claim.
		c.Labels = map[string]string{"x": "y"}
		if _, err := plugin.ResourceV1().ResourceClaims(ns).Update(ctx, c, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
			t.Errorf("updating a claim: %v, want Forbidden", err)
		}
	})

	t.Run("status.devices: refused for a claim on another node", func(t *testing.T) {
		// From 1.36 (DRAResourceClaimGranularStatusAuthorization, beta and
		// on) the API server asks resourceclaims/driver of every
		// status.devices change, and the chart grants associated-node only;
		// on 1.35 the chart's policy refuses it.
		v, err := l.Client.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		want := `resource="resourceclaims/driver"`
		if !utilversion.MustParseGeneric(v.GitVersion).AtLeast(utilversion.MajorMinor(1, 36)) {
			want = "may only write the status.devices entries of driver gpu.facet.dev in its own node's pool"
		}
		c := allocated(t, "elsewhere", "not-"+node)
		rec := &checkpoint.Claim{UID: c.UID, Namespace: ns, Name: c.Name, State: checkpoint.StatePrepared,
			Devices: []checkpoint.Device{{Kind: names.KindGPU, Pool: "not-" + node, Device: "gpu-0", GPUUUID: "GPU-test"}}}
		ac, err := claimstatus.Apply(ns, c.Name, c.UID, rec)
		if err != nil {
			t.Fatal(err)
		}
		// Dry runs, until refused: the API server loads the chart's claim
		// status policy asynchronously, like the slice policy waited for
		// above, and a write let through before then would stand (the
		// policy passes entries that do not change). Seen on stock 1.35.4
		// under load: allowed once, right after the install.
		testenv.WaitFor(t, "status.devices of a claim on node not-"+node+" refused: "+want, time.Minute, func() (bool, error) {
			_, err := plugin.ResourceV1().ResourceClaims(ns).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: claimstatus.FieldManager, Force: true, DryRun: []string{metav1.DryRunAll}})
			return err != nil && strings.Contains(err.Error(), want), err
		})
	})

	t.Run("RBAC: no more than the kubelet plugin needs", func(t *testing.T) {
		_, err := plugin.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, dryRun)
		if !apierrors.IsForbidden(err) {
			t.Errorf("creating a claim: %v, want Forbidden", err)
		}
		if _, err := plugin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
			t.Errorf("getting its node: %v", err)
		}
		if _, err := plugin.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing nodes: %v, want Forbidden", err)
		}
	})

	// The node's compute-domain label: the plugin's own code
	// (computedomain.SetNodeLabel) may set and remove it on its own Node;
	// nothing else of a Node, and no other Node.
	labels := release + "-node-label-own-node"
	const key = names.LabelComputeDomain
	labelPatch := func(k, v string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, k, v))
	}
	patchDry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	testenv.WaitFor(t, "policy "+labels+" enforced", time.Minute, func() (bool, error) {
		_, err := plugin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, labelPatch("facet.dev/helm-test", "x"), patchDry)
		return err != nil && strings.Contains(err.Error(), labels), err
	})
	t.Run("own node: the compute-domain label set and removed", func(t *testing.T) {
		t.Cleanup(func() {
			_, _ = l.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+key+`":null}}}`), metav1.PatchOptions{})
		})
		c := computedomain.New(ctx, plugin, nil, node)
		if err := c.SetNodeLabel(ctx, "", "uid-helm-test"); err != nil {
			t.Fatal(err)
		}
		if got, err := c.NodeLabel(ctx); err != nil || got != "uid-helm-test" {
			t.Fatalf("label %q, %v", got, err)
		}
		if err := c.SetNodeLabel(ctx, "uid-helm-test", ""); err != nil {
			t.Fatal(err)
		}
		if got, err := c.NodeLabel(ctx); err != nil || got != "" {
			t.Fatalf("label %q, %v after removing it", got, err)
		}
	})
	other := "facet-helm-other-node"
	if _, err := l.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Client.CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{}) })
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
		node   string
		patch  []byte
		want   string
	}{
		{"another node's label", plugin, other, labelPatch(key, "u"), "may only change its own Node, not '" + other + "'"},
		{"another label of its own node", plugin, node, labelPatch("facet.dev/helm-test", "x"), "may only change its Node's label gpu.facet.dev/compute-domain"},
		{"its own node's taints", plugin, node, []byte(`{"spec":{"taints":[{"key":"facet.dev/helm-test","effect":"NoSchedule"}]}}`), "nothing else of the Node"},
		{"a label patch with a token that names no node", asPlugin(false), node, labelPatch(key, "u"), "This request's token names no node"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := tc.client.CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, tc.patch, patchDry)
			if !apierrors.IsForbidden(err) || !strings.Contains(strings.Join(strings.Fields(err.Error()), " "), tc.want) {
				t.Fatalf("error %v\nwant Forbidden with %q", err, tc.want)
			}
		})
	}
}

// TestLiveChartWebhook runs facet-webhook as a local process behind the
// chart's own ValidatingWebhookConfiguration and the claim mutator's
// MutatingWebhookConfiguration, pointed at it by url and confined to a
// test namespace and label: the rules and matchConditions the chart ships,
// on the real API server, with its real resourceclaim controller
// (hack/cluster/up.sh runs kube-controller-manager as kubeadm does).
func TestLiveChartWebhook(t *testing.T) {
	l := liveCluster(t)
	const ns, release = "facet-helm-webhook", "facet-helmtest"
	l.Namespace(t, ns)
	dir := t.TempDir()

	bin := helmtest.FacetBinary(t, repoRoot, "facet-webhook")
	caPEM := writeServingCert(t, dir)
	logPath := filepath.Join(dir, "webhook.log")
	// The claim mutator as the chart runs it (--mutate-claims, its probe in
	// the release namespace), -v 4: every review is logged, so that the
	// log tells which objects were sent.
	addr := testenv.StartWebhook(t, bin, logPath, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), caPEM,
		"--mutate-claims", "--kubeconfig", l.Kubeconfig, "--namespace", ns, "-v", "4")

	caBundle := base64.StdEncoding.EncodeToString(caPEM)
	objs := renderAs(t, values(t, "admission: {webhook: {tls: {mode: secret, secret: {name: unused, caBundle: "+caBundle+"}}}}"), release, ns)
	vwc := find(t, objs, "ValidatingWebhookConfiguration", release+"-webhook")
	mwc := find(t, objs, "MutatingWebhookConfiguration", release+"-webhook-claims")
	for _, c := range []struct {
		obj  object
		path string
	}{{vwc, webhook.ValidatePath}, {mwc, webhook.MutateClaimsPath}} {
		for _, w := range c.obj.Object["webhooks"].([]any) {
			w := w.(map[string]any)
			w["clientConfig"] = map[string]any{"url": "https://" + addr + c.path, "caBundle": caBundle}
			if w["name"] == "deviceclasses.gpu.facet.dev" {
				w["objectSelector"] = map[string]any{"matchLabels": map[string]any{"facet.dev/helm-test": "true"}}
			} else {
				w["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}}
			}
		}
	}
	manifest := stream(t, []object{vwc, mwc})
	t.Cleanup(func() { _, _ = l.Run(manifest, "delete", "--ignore-not-found", "-f", "-") })
	l.Must(t, manifest, "apply", "-f", "-")

	claim := func(kind, name, config string) string {
		devices := "requests:\n- name: share\n  exactly:\n    deviceClassName: vgpu.facet.dev\n    capacity: {requests: {memory: 4Gi}}\n" + config
		m := "apiVersion: resource.k8s.io/v1\nkind: " + kind + "\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec:\n"
		if kind == "ResourceClaimTemplate" {
			return m + "  spec:\n    devices:\n" + indent(devices, "      ")
		}
		return m + "  devices:\n" + indent(devices, "    ")
	}
	facetConfig := func(params string) string {
		return "config:\n- opaque:\n    driver: gpu.facet.dev\n    parameters: " + params + "\n"
	}
	bad := facetConfig("{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 7}")
	testenv.WaitFor(t, "webhook registered", time.Minute, func() (bool, error) {
		out, err := l.Run(claim("ResourceClaim", "probe", bad), "apply", "--dry-run=server", "-f", "-")
		return err != nil && strings.Contains(out, "denied the request"), fmt.Errorf("%v: %s", err, out)
	})

	for _, tc := range []struct{ name, manifest, want string }{
		{"claim", claim("ResourceClaim", "bad", bad),
			`admission webhook "resourceclaims.gpu.facet.dev" denied the request: spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7`},
		{"template", claim("ResourceClaimTemplate", "bad", bad),
			`admission webhook "resourceclaimtemplates.gpu.facet.dev" denied the request: spec.spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority`},
		{"device class", `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: helm-test-bad.gpu.facet.dev, labels: {facet.dev/helm-test: "true"}}
spec:
  config:
  - opaque:
      driver: gpu.facet.dev
      parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: GpuConfig, mode: mig}
`, `admission webhook "deviceclasses.gpu.facet.dev" denied the request: spec.config[0].opaque.parameters: GpuConfig: strict decoding error: unknown field "mode"`},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			out, err := l.Run(tc.manifest, "apply", "-f", "-")
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("%v\n%s\nwant a refusal with %q", err, out, tc.want)
			}
		})
	}

	t.Run("objects without a Facet config never reach the webhook", func(t *testing.T) {
		for name, config := range map[string]string{
			"no-config":    "",
			"other-driver": "config:\n- opaque:\n    driver: gpu.example.com\n    parameters: {anything: 7}\n",
		} {
			l.Must(t, claim("ResourceClaim", name, config), "apply", "-f", "-")
			log, _ := os.ReadFile(logPath)
			if strings.Contains(string(log), `name="`+name+`"`) {
				t.Errorf("claim %s was sent to the webhook; the matchCondition should have skipped it", name)
			}
		}
		l.Must(t, claim("ResourceClaim", "good", facetConfig("{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, logLevel: 4}")), "apply", "-f", "-")
		if log, _ := os.ReadFile(logPath); !strings.Contains(string(log), `"Allowed" kind="ResourceClaim" namespace="`+ns+`" name="good"`) {
			t.Errorf("the good claim did not go through the webhook:\n%s", log)
		}
	})

	// The claims the resourceclaim controller makes for a pod copy its
	// template, which the webhook checked: they are never sent, so a
	// pod of a configured template does not wait on the webhook. The
	// matchCondition is on the authenticated user: a hand-written claim
	// that says it is a pod's (the controller's annotation, an
	// ownerReference to the pod) is still checked.
	t.Run("a pod's claim from its template never reaches the webhook; a hand-written one does", func(t *testing.T) {
		l.Must(t, claim("ResourceClaimTemplate", "configured", facetConfig("{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, logLevel: 4}")), "apply", "-f", "-")
		uid, generated := podClaim(t, l, ns, "from-template", "share", "configured")
		if c := generated.Spec.Devices.Config; len(c) != 1 || c[0].Opaque == nil || c[0].Opaque.Driver != names.Driver {
			t.Fatalf("claim %s: config %+v, want the template's", generated.Name, c)
		}
		log, _ := os.ReadFile(logPath)
		if strings.Contains(string(log), `"from-template-`) || strings.Contains(string(log), `name="`+generated.Name+`"`) {
			t.Errorf("the controller's claim %s was sent to the webhook:\n%s", generated.Name, log)
		}
		forged := strings.Replace(claim("ResourceClaim", "forged", bad), "metadata: {name: forged, namespace: "+ns+"}",
			"metadata:\n  name: forged\n  namespace: "+ns+"\n  annotations: {resource.kubernetes.io/pod-claim-name: share}\n"+
				"  ownerReferences: [{apiVersion: v1, kind: Pod, name: from-template, uid: "+uid+", controller: true, blockOwnerDeletion: true}]", 1)
		out, err := l.Run(forged, "create", "-f", "-")
		if err == nil || !strings.Contains(out, `admission webhook "resourceclaims.gpu.facet.dev" denied the request`) {
			t.Errorf("a hand-written claim dressed as the pod's was not checked: %v\n%s", err, out)
		}
	})

	t.Run("the claim mutator writes plain MIG requests existing instances first", func(t *testing.T) {
		log, _ := os.ReadFile(logPath)
		if !strings.Contains(string(log), `supported=true reason="a server-side dry run of a claim kept its firstAvailable"`) {
			t.Fatalf("the webhook did not find firstAvailable kept (every round's API server keeps it):\n%s", log)
		}
		// The README's plain example, the template of
		// demo/mig/at-least-20gb.yaml, in this namespace.
		demo, err := os.ReadFile(filepath.Join(repoRoot, "demo", "mig", "at-least-20gb.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		tplDoc, _, _ := strings.Cut(string(demo), "\n---\n")
		tplDoc = strings.Replace(tplDoc, "namespace: facet-demo", "namespace: "+ns, 1)
		if !strings.Contains(tplDoc, "kind: ResourceClaimTemplate") || !strings.Contains(tplDoc, "namespace: "+ns) {
			t.Fatalf("demo/mig/at-least-20gb.yaml's first document is no template of namespace facet-demo:\n%s", tplDoc)
		}
		l.Must(t, tplDoc, "create", "-f", "-")
		tpl, err := l.Client.ResourceV1().ResourceClaimTemplates(ns).Get(context.Background(), "at-least-20gb", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkExistingFirst(t, "template at-least-20gb", tpl.Spec.Spec.Devices.Requests)
		if got := tpl.Annotations[names.AnnotationPreferExistingMIG]; got != "rewritten: mig" {
			t.Errorf("template annotation %s=%q, want the record of the rewrite", names.AnnotationPreferExistingMIG, got)
		}

		// Applying the manifest again, client-side or server-side, is no
		// change of the immutable spec: the webhook gives the update the
		// stored requests back.
		for name, apply := range map[string][]string{
			"applied-client-side": {"apply", "-f", "-"},
			"applied-server-side": {"apply", "--server-side", "-f", "-"},
		} {
			doc := strings.Replace(tplDoc, "name: at-least-20gb", "name: "+name, 1)
			for range 2 {
				l.Must(t, doc, apply...)
			}
			got, err := l.Client.ResourceV1().ResourceClaimTemplates(ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkExistingFirst(t, "template "+name+", applied twice", got.Spec.Spec.Devices.Requests)
			if got.Annotations[names.AnnotationPreferExistingMIG] != "rewritten: mig" {
				t.Errorf("template %s, applied twice: annotations %v", name, got.Annotations)
			}
		}

		// Its pod's claim copies the rewritten spec, without the webhook.
		uid, generated := podClaim(t, l, ns, "mig-from-template", "mig", "at-least-20gb")
		checkExistingFirst(t, "claim "+generated.Name, generated.Spec.Devices.Requests)
		log, _ = os.ReadFile(logPath)
		if strings.Contains(string(log), `"mig-from-template-`) || strings.Contains(string(log), `name="`+generated.Name+`"`) {
			t.Errorf("the controller's claim %s was sent to the webhook", generated.Name)
		}

		plain := func(kind, name, annotations string) string {
			devices := "requests:\n- {name: mig, exactly: {deviceClassName: mig-1g.10gb.facet.dev}}\n"
			m := "apiVersion: resource.k8s.io/v1\nkind: " + kind + "\nmetadata:\n  name: " + name + "\n  namespace: " + ns + "\n" + annotations + "spec:\n"
			if kind == "ResourceClaimTemplate" {
				return m + "  spec:\n    devices:\n" + indent(devices, "      ")
			}
			return m + "  devices:\n" + indent(devices, "    ")
		}
		// A hand-written claim is rewritten, whatever it says of a pod.
		l.Must(t, plain("ResourceClaim", "mig-forged", "  annotations: {resource.kubernetes.io/pod-claim-name: mig}\n"+
			"  ownerReferences: [{apiVersion: v1, kind: Pod, name: mig-from-template, uid: "+uid+"}]\n"), "create", "-f", "-")
		c, err := l.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), "mig-forged", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkExistingFirst(t, "claim mig-forged", c.Spec.Devices.Requests)

		// Opted out, and not MIG: never sent, left as written.
		l.Must(t, plain("ResourceClaimTemplate", "mig-as-written", "  annotations: {"+names.AnnotationPreferExistingMIG+": \"false\"}\n"), "create", "-f", "-")
		l.Must(t, claim("ResourceClaim", "not-mig", ""), "create", "-f", "-")
		for _, name := range []string{"mig-as-written", "not-mig"} {
			if log, _ := os.ReadFile(logPath); strings.Contains(string(log), `name="`+name+`"`) {
				t.Errorf("%s was sent to the webhook; the matchConditions should have skipped it", name)
			}
		}
		kept, err := l.Client.ResourceV1().ResourceClaimTemplates(ns).Get(context.Background(), "mig-as-written", metav1.GetOptions{})
		if err != nil || kept.Spec.Spec.Devices.Requests[0].Exactly == nil {
			t.Errorf("the opted-out template was changed: %v %+v", err, kept)
		}
	})

	// A claim's spec is immutable: its UPDATEs are metadata writes (the
	// scheduler's finalizer), which must not wait on the webhook.
	t.Run("claim updates never reach the webhook", func(t *testing.T) {
		l.Must(t, "", "label", "resourceclaim", "good", "-n", ns, "facet.dev/updated=yes")
		log, _ := os.ReadFile(logPath)
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, `name="good"`) && strings.Contains(line, "UPDATE") {
				t.Errorf("a label update of a claim was sent to the webhook: %s", line)
			}
		}
	})
}

// podClaim creates a pod, never scheduled, whose claim name comes from
// template, waits for the claim the resourceclaim controller makes for it,
// and returns the pod's UID and the claim.
func podClaim(t *testing.T, l *live, ns, pod, claim, template string) (string, *resourceapi.ResourceClaim) {
	t.Helper()
	l.Must(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  # Never scheduled: only its claim is looked at.
  nodeSelector: {facet.dev/helm-test-no-node: "true"}
  containers:
  - {name: c, image: facet.local/busybox:1, imagePullPolicy: Never, command: [sleep, "1"], resources: {claims: [{name: %s}]}}
  resourceClaims:
  - {name: %s, resourceClaimTemplateName: %s}
`, pod, ns, claim, claim, template), "create", "-f", "-")
	ctx := context.Background()
	var uid string
	var c *resourceapi.ResourceClaim
	testenv.WaitFor(t, "the resourceclaim controller's claim of pod "+pod, time.Minute, func() (bool, error) {
		p, err := l.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		uid = string(p.UID)
		if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return false, fmt.Errorf("resourceClaimStatuses %+v", p.Status.ResourceClaimStatuses)
		}
		c, err = l.Client.ResourceV1().ResourceClaims(ns).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		return err == nil, err
	})
	return uid, c
}

// checkExistingFirst: requests are one request "mig" written as the
// existing-first list.
func checkExistingFirst(t *testing.T, what string, requests []resourceapi.DeviceRequest) {
	t.Helper()
	var subs []string
	for _, r := range requests {
		for _, s := range r.FirstAvailable {
			subs = append(subs, s.Name)
		}
	}
	if len(requests) != 1 || requests[0].Exactly != nil || strings.Join(subs, ",") != "existing,split,carved" {
		t.Errorf("%s: requests %+v, want one firstAvailable request existing, split, carved", what, requests)
	}
}

// writeServingCert writes tls.crt (the serving certificate for
// 127.0.0.1, then its CA) and tls.key into dir, and returns the CA's PEM.
func writeServingCert(t *testing.T, dir string) []byte {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("facet-webhook", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// GenerateSelfSignedCertKey's chain: the serving certificate, then its CA.
	_, ca := pem.Decode(certPEM)
	return ca
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}
