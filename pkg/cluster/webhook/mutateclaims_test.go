package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/pkg/model/names"
)

const (
	existingCEL = `device.attributes["gpu.facet.dev"].mode == "static-mig"`
	splitCEL    = `device.attributes["gpu.facet.dev"].mode in ["mig", "dynamic"] && device.attributes["gpu.facet.dev"].migInUse`
	memoryCEL   = `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("20G")) >= 0`
)

func newClaimMutator(t *testing.T, mode KueueMode, kueueServed, supported bool) *ClaimMutator {
	t.Helper()
	d := fake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	if kueueServed {
		d.Resources = []*metav1.APIResourceList{{GroupVersion: KueueGroup + "/v1beta2", APIResources: []metav1.APIResource{{Name: "clusterqueues", Kind: "ClusterQueue"}}}}
	}
	m, err := NewClaimMutator(ktesting.NewLogger(t, ktesting.NewConfig()), ClaimMutatorOptions{Kueue: mode, Discovery: d, PrioritizedList: listSupport(supported)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// claimReview is an AdmissionRequest creating kind (ResourceClaim or
// ResourceClaimTemplate) whose devices.requests are requests (YAML) and
// whose metadata is meta (YAML flow mapping entries, may be empty).
func claimReview(t *testing.T, kind, meta, requests string) *admissionv1.AdmissionRequest {
	t.Helper()
	devices := "devices:\n  requests:\n" + indentLines(requests, "  ")
	spec := "spec:\n" + indentLines(devices, "  ")
	if kind == "ResourceClaimTemplate" {
		spec = "spec:\n  spec:\n" + indentLines(devices, "    ")
	}
	y := "apiVersion: resource.k8s.io/v1\nkind: " + kind + "\nmetadata: {name: c, namespace: ns" + meta + "}\n" + spec
	raw, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	return &admissionv1.AdmissionRequest{
		UID:       "uid",
		Kind:      metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: kind},
		Operation: admissionv1.Create, Namespace: "ns", Name: "c",
		UserInfo: authenticationv1.UserInfo{Username: "alice"},
		Object:   runtime.RawExtension{Raw: raw},
	}
}

func indentLines(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// patchedClaimSpec applies resp's patch to req's object and returns the
// claim spec (a template's spec.spec) and the annotations.
func patchedClaimSpec(t *testing.T, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) (resourceapi.ResourceClaimSpec, map[string]string) {
	t.Helper()
	raw := req.Object.Raw
	if resp.Patch != nil {
		if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("patch type %v", resp.PatchType)
		}
		p, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("decode patch %s: %v", resp.Patch, err)
		}
		if raw, err = p.Apply(raw); err != nil {
			t.Fatalf("apply patch %s: %v", resp.Patch, err)
		}
	}
	if req.Kind.Kind == "ResourceClaimTemplate" {
		var tpl resourceapi.ResourceClaimTemplate
		if err := json.Unmarshal(raw, &tpl); err != nil {
			t.Fatal(err)
		}
		return tpl.Spec.Spec, tpl.Annotations
	}
	var c resourceapi.ResourceClaim
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.Spec, c.Annotations
}

// describeRequests is each request as "name=class*count[sel && ...]", a
// firstAvailable one as "name=sub:class*count[...] | ...".
func describeRequests(spec resourceapi.ResourceClaimSpec) []string {
	one := func(class string, count int64, sels []resourceapi.DeviceSelector) string {
		var cel []string
		for _, s := range sels {
			cel = append(cel, s.CEL.Expression)
		}
		return fmt.Sprintf("%s*%d[%s]", class, count, strings.Join(cel, " && "))
	}
	var out []string
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, r.Name+"="+one(r.Exactly.DeviceClassName, r.Exactly.Count, r.Exactly.Selectors))
			continue
		}
		var subs []string
		for _, s := range r.FirstAvailable {
			subs = append(subs, s.Name+":"+one(s.DeviceClassName, s.Count, s.Selectors))
		}
		out = append(out, r.Name+"="+strings.Join(subs, " | "))
	}
	return out
}

func TestClaimMutator(t *testing.T) {
	const plain = "- name: mig\n  exactly:\n    deviceClassName: mig.facet.dev\n    allocationMode: ExactCount\n    count: 1\n    selectors: [{cel: {expression: '" + memoryCEL + "'}}]\n"
	rewritten := []string{"mig=existing:mig.facet.dev*1[" + memoryCEL + " && " + existingCEL + "] | split:mig.facet.dev*1[" + memoryCEL + " && " + splitCEL + "] | carved:mig.facet.dev*1[" + memoryCEL + "]"}
	for _, tc := range []struct {
		name, kind, meta, requests string
		kueue                      KueueMode
		kueueServed, unsupported   bool
		want                       []string
		// wantNote: the annotation the webhook writes; "" for no patch.
		wantNote string
		// wantAnnotations: others kept.
		wantAnnotations map[string]string
		wantWarning     string
	}{
		{name: "a plain claim (the README's at-least-20gb)", kind: "ResourceClaim", requests: plain, want: rewritten, wantNote: "rewritten: mig"},
		{name: "a plain template", kind: "ResourceClaimTemplate", requests: plain, want: rewritten, wantNote: "rewritten: mig"},
		{name: "a profile's class, no selectors, two devices, among other requests and annotations", kind: "ResourceClaimTemplate",
			meta: ", annotations: {team: a}",
			requests: "- {name: gpu, exactly: {deviceClassName: gpu.facet.dev, allocationMode: ExactCount, count: 1}}\n" +
				"- {name: small, exactly: {deviceClassName: mig-1g.10gb.facet.dev, allocationMode: ExactCount, count: 2, adminAccess: false}}\n",
			want: []string{"gpu=gpu.facet.dev*1[]",
				"small=existing:mig-1g.10gb.facet.dev*2[" + existingCEL + "] | split:mig-1g.10gb.facet.dev*2[" + splitCEL + "] | carved:mig-1g.10gb.facet.dev*2[]"},
			wantNote: "rewritten: small", wantAnnotations: map[string]string{"team": "a"}},
		{name: "two MIG requests", kind: "ResourceClaim",
			requests: "- {name: b, exactly: {deviceClassName: mig-1g.10gb.facet.dev, count: 1}}\n- {name: a, exactly: {deviceClassName: mig.facet.dev, count: 1}}\n",
			want: []string{"b=existing:mig-1g.10gb.facet.dev*1[" + existingCEL + "] | split:mig-1g.10gb.facet.dev*1[" + splitCEL + "] | carved:mig-1g.10gb.facet.dev*1[]",
				"a=existing:mig.facet.dev*1[" + existingCEL + "] | split:mig.facet.dev*1[" + splitCEL + "] | carved:mig.facet.dev*1[]"},
			wantNote: "rewritten: a,b"},
		{name: "opted out", kind: "ResourceClaimTemplate", meta: ", annotations: {" + names.AnnotationPreferExistingMIG + ": \"false\"}", requests: plain,
			want: []string{"mig=mig.facet.dev*1[" + memoryCEL + "]"}, wantAnnotations: map[string]string{names.AnnotationPreferExistingMIG: "false"}},
		{name: "Kueue mode on", kind: "ResourceClaim", kueue: KueueOn, requests: plain, want: []string{"mig=mig.facet.dev*1[" + memoryCEL + "]"}},
		{name: "Kueue served, --kueue off", kind: "ResourceClaim", kueue: KueueOff, kueueServed: true, requests: plain, want: []string{"mig=mig.facet.dev*1[" + memoryCEL + "]"}},
		{name: "Kueue served, --kueue auto", kind: "ResourceClaimTemplate", kueue: KueueAuto, kueueServed: true, requests: plain, want: []string{"mig=mig.facet.dev*1[" + memoryCEL + "]"}},
		{name: "the API server drops firstAvailable", kind: "ResourceClaim", unsupported: true, requests: plain,
			want:        []string{"mig=mig.facet.dev*1[" + memoryCEL + "]"},
			wantWarning: "Facet's webhook left the MIG requests of spec.devices.requests as written, not existing instances first (existing, split, carved), as the API server may not keep firstAvailable: the test's API server drops firstAvailable"},
		{name: "allocationMode All", kind: "ResourceClaim", requests: "- {name: all, exactly: {deviceClassName: mig.facet.dev, allocationMode: All}}\n",
			want:        []string{"all=mig.facet.dev*0[]"},
			wantWarning: `Facet's webhook left spec.devices.requests[0] ("all") as written, not existing instances first: allocationMode All: only ExactCount requests are written as a prioritized list`},
		{name: "admin access", kind: "ResourceClaimTemplate", requests: "- {name: admin, exactly: {deviceClassName: mig.facet.dev, count: 1, adminAccess: true}}\n",
			want:        []string{"admin=mig.facet.dev*1[]"},
			wantWarning: `Facet's webhook left spec.spec.devices.requests[0] ("admin") as written, not existing instances first: it sets adminAccess, which a subrequest of firstAvailable does not have`},
		{name: "a field of a later Kubernetes, beside a plain request", kind: "ResourceClaim",
			requests:    "- {name: later, exactly: {deviceClassName: mig.facet.dev, count: 1, someFutureField: [x]}}\n- {name: mig, exactly: {deviceClassName: mig.facet.dev, count: 1}}\n",
			want:        []string{"later=mig.facet.dev*1[]", "mig=existing:mig.facet.dev*1[" + existingCEL + "] | split:mig.facet.dev*1[" + splitCEL + "] | carved:mig.facet.dev*1[]"},
			wantNote:    "rewritten: mig",
			wantWarning: `Facet's webhook left spec.devices.requests[0] ("later") as written, not existing instances first: it sets someFutureField, which a subrequest of firstAvailable does not have`},
		{name: "whole GPUs and another driver's MIG-like class", kind: "ResourceClaim",
			requests: "- {name: gpu, exactly: {deviceClassName: gpu.facet.dev, count: 1}}\n- {name: other, exactly: {deviceClassName: mig.example.com, count: 1}}\n",
			want:     []string{"gpu=gpu.facet.dev*1[]", "other=mig.example.com*1[]"}},
		{name: "already a prioritized list", kind: "ResourceClaim",
			requests: "- {name: mig, firstAvailable: [{name: one, deviceClassName: mig.facet.dev, count: 1}]}\n",
			want:     []string{"mig=one:mig.facet.dev*1[]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newClaimMutator(t, tc.kueue, tc.kueueServed, !tc.unsupported)
			req := claimReview(t, tc.kind, tc.meta, tc.requests)
			resp := m.Review(context.Background(), req)
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if (resp.Patch != nil) != (tc.wantNote != "") {
				t.Fatalf("patch %s, want one: %v", resp.Patch, tc.wantNote != "")
			}
			if got := strings.Join(resp.Warnings, "\n"); got != tc.wantWarning {
				t.Errorf("warnings:\n%s\nwant:\n%s", got, tc.wantWarning)
			}
			spec, annotations := patchedClaimSpec(t, req, resp)
			if got := describeRequests(spec); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			want := map[string]string{}
			for k, v := range tc.wantAnnotations {
				want[k] = v
			}
			if tc.wantNote != "" {
				want[names.AnnotationPreferExistingMIG] = tc.wantNote
			}
			if fmt.Sprint(annotations) != fmt.Sprint(want) && (len(annotations) != 0 || len(want) != 0) {
				t.Errorf("annotations %v, want %v", annotations, want)
			}
		})
	}
}

// TestClaimMutatorKeepsFields: every field a subrequest shares with an
// `exactly` request is copied into each subrequest, in the JSON form the
// API server sent (a quantity, a toleration), and the selector lists of
// the subrequests are their own.
func TestClaimMutatorKeepsFields(t *testing.T) {
	m := newClaimMutator(t, KueueOff, false, true)
	req := claimReview(t, "ResourceClaim", "", `- name: mig
  exactly:
    deviceClassName: mig.facet.dev
    count: 3
    selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].profile == "1g.10gb"'}}]
    tolerations: [{key: gpu.facet.dev/unhealthy, operator: Exists, effect: NoSchedule}]
    capacity: {requests: {memory: 10Gi}}
`)
	resp := m.Review(context.Background(), req)
	spec, _ := patchedClaimSpec(t, req, resp)
	subs := spec.Devices.Requests[0].FirstAvailable
	if len(subs) != 3 {
		t.Fatalf("subrequests %+v", subs)
	}
	for i, s := range subs {
		var memory resource.Quantity
		if s.Capacity != nil {
			memory = s.Capacity.Requests["memory"]
		}
		if s.Count != 3 || len(s.Tolerations) != 1 || s.Tolerations[0].Key != "gpu.facet.dev/unhealthy" || memory.Cmp(resource.MustParse("10Gi")) != 0 {
			t.Errorf("subrequest %s: %+v", s.Name, s)
		}
		if want := 1 + min(1, 2-i); len(s.Selectors) != want || s.Selectors[0].CEL.Expression != `device.attributes["gpu.facet.dev"].profile == "1g.10gb"` {
			t.Errorf("subrequest %s: selectors %+v, want the request's, then its own", s.Name, s.Selectors)
		}
	}
}

func TestClaimMutatorOtherRequests(t *testing.T) {
	m := newClaimMutator(t, KueueOff, false, true)
	plain := "- {name: mig, exactly: {deviceClassName: mig.facet.dev, count: 1}}\n"

	del := claimReview(t, "ResourceClaim", "", plain)
	del.Operation = admissionv1.Delete
	if resp := m.Review(context.Background(), del); !resp.Allowed || resp.Patch != nil {
		t.Errorf("DELETE: %+v", resp)
	}

	pod := claimReview(t, "ResourceClaim", "", plain)
	pod.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	if resp := m.Review(context.Background(), pod); !resp.Allowed || resp.Patch != nil || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "does not handle /v1, Kind=Pod") {
		t.Errorf("a pod: %+v", resp)
	}

	bad := claimReview(t, "ResourceClaim", "", plain)
	bad.Object.Raw = []byte(`{"spec": [`)
	if resp := m.Review(context.Background(), bad); resp.Allowed || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, "decode ResourceClaim") {
		t.Errorf("bad JSON: %+v", resp)
	}

	if _, err := NewClaimMutator(ktesting.NewLogger(t, ktesting.NewConfig()), ClaimMutatorOptions{Kueue: "yes", Discovery: fake.NewClientset().Discovery(), PrioritizedList: listSupport(true)}); err == nil {
		t.Error("--kueue yes accepted")
	}
	if _, err := NewClaimMutator(ktesting.NewLogger(t, ktesting.NewConfig()), ClaimMutatorOptions{}); err == nil {
		t.Error("no discovery client and no PrioritizedListSupport accepted")
	}
}

// applyReviewPatch is raw with resp's JSON patch applied (raw if none).
func applyReviewPatch(t *testing.T, raw []byte, resp *admissionv1.AdmissionResponse) []byte {
	t.Helper()
	if resp.Patch == nil {
		return raw
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("apply patch %s: %v", resp.Patch, err)
	}
	return out
}

// TestClaimMutatorUpdate: an update of an object the mutator rewrote that
// sends its plain request again (kubectl apply, a GitOps tool's sync, or
// server-side apply, which also drops the annotation the applier did not
// write) gets the stored requests back, so that applying an unchanged
// manifest is no change of the immutable spec; every other update is left
// alone, for the API server to judge.
func TestClaimMutatorUpdate(t *testing.T) {
	const plain = "- {name: mig, exactly: {deviceClassName: mig.facet.dev, allocationMode: ExactCount, count: 1, selectors: [{cel: {expression: '" + memoryCEL + "'}}]}}\n"
	for _, kind := range []string{"ResourceClaim", "ResourceClaimTemplate"} {
		m := newClaimMutator(t, KueueOff, false, true)
		create := claimReview(t, kind, "", plain)
		stored := applyReviewPatch(t, create.Object.Raw, m.Review(context.Background(), create))
		for _, tc := range []struct {
			name string
			// new is the object the update sends (meta, requests);
			// old is the stored one, the rewrite unless oldRaw is set.
			meta, requests string
			oldRaw         []byte
			wantRestored   bool
		}{
			{name: "the manifest applied again", meta: ", labels: {team: a}", requests: plain, wantRestored: true},
			{name: "server-side apply of the manifest, the note dropped", requests: plain, wantRestored: true},
			{name: "a changed request", requests: strings.Replace(plain, "count: 1", "count: 2", 1)},
			{name: "an object the mutator did not rewrite", requests: plain, oldRaw: create.Object.Raw},
			{name: "a metadata update of the rewritten object", requests: "- {name: mig, firstAvailable: [{name: existing, deviceClassName: mig.facet.dev}]}\n"},
		} {
			t.Run(kind+": "+tc.name, func(t *testing.T) {
				req := claimReview(t, kind, tc.meta, tc.requests)
				req.Operation = admissionv1.Update
				req.OldObject.Raw = stored
				if tc.oldRaw != nil {
					req.OldObject.Raw = tc.oldRaw
				}
				resp := m.Review(context.Background(), req)
				if !resp.Allowed || len(resp.Warnings) != 0 {
					t.Fatalf("%+v", resp)
				}
				if got := resp.Patch != nil; got != tc.wantRestored {
					t.Fatalf("patch %s, want one: %v", resp.Patch, tc.wantRestored)
				}
				if !tc.wantRestored {
					return
				}
				gotSpec, gotAnnotations := patchedClaimSpec(t, req, resp)
				wantReq := &admissionv1.AdmissionRequest{Kind: req.Kind, Object: runtime.RawExtension{Raw: stored}}
				wantSpec, wantAnnotations := patchedClaimSpec(t, wantReq, &admissionv1.AdmissionResponse{})
				if g, w := strings.Join(describeRequests(gotSpec), "\n"), strings.Join(describeRequests(wantSpec), "\n"); g != w {
					t.Errorf("requests:\n%s\nwant the stored:\n%s", g, w)
				}
				if gotAnnotations[names.AnnotationPreferExistingMIG] != wantAnnotations[names.AnnotationPreferExistingMIG] {
					t.Errorf("annotations %v, want the stored note %v", gotAnnotations, wantAnnotations)
				}
			})
		}
	}

	m := newClaimMutator(t, KueueOff, false, true)
	req := claimReview(t, "ResourceClaim", "", plain)
	req.Operation = admissionv1.Update
	if resp := m.Review(context.Background(), req); resp.Allowed || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, "decode old ResourceClaim") {
		t.Errorf("an update without its old object: %+v", resp)
	}
}
