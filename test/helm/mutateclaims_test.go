package helm

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/facet-gpu/facet/pkg/cluster/webhook"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// TestClaimMutator: on by default, the claim mutator's configuration sends
// the webhook new claims and templates with a plain MIG request and
// without the opt-out annotation, not the resourceclaim controller's
// claims, and fails open; off, nothing of it renders.
func TestClaimMutator(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         bool
		wantPolicy   admissionregistrationv1.FailurePolicyType
		wantTimeout  int32
	}{
		{name: "defaults", want: true, wantPolicy: admissionregistrationv1.Ignore, wantTimeout: 5},
		{name: "failing closed", values: "admission: {webhook: {mutateClaims: {failurePolicy: Fail, timeoutSeconds: 3}}}", want: true, wantPolicy: admissionregistrationv1.Fail, wantTimeout: 3},
		{name: "off", values: "admission: {webhook: {mutateClaims: {enabled: false}}}"},
		{name: "the webhook off", values: "admission: {webhook: {enabled: false}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, values(t, tc.values))
			var mwcs []object
			for _, o := range ofKind(objs, "MutatingWebhookConfiguration") {
				if o.GetName() == "facet-webhook-claims" {
					mwcs = append(mwcs, o)
				}
			}
			if deps := ofKind(objs, "Deployment"); len(deps) > 0 {
				for _, d := range deps {
					if d.GetName() != "facet-webhook" {
						continue
					}
					dep := &appsv1.Deployment{}
					into(t, d, dep)
					if got := slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--mutate-claims"); got != tc.want {
						t.Errorf("--mutate-claims %v, want %v", got, tc.want)
					}
				}
			}
			if !tc.want {
				if len(mwcs) != 0 {
					t.Errorf("%d claim mutator configurations rendered", len(mwcs))
				}
				return
			}
			if len(mwcs) != 1 {
				t.Fatalf("%d claim mutator configurations, want 1", len(mwcs))
			}
			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
			into(t, mwcs[0], mwc)
			devices := map[string]string{"resourceclaims": "object.spec.devices", "resourceclaimtemplates": "object.spec.spec.devices"}
			var resources []string
			for _, w := range mwc.Webhooks {
				// UPDATE only to restore a rewritten object's requests
				// (createdOrRewritten): re-applying its manifest.
				if len(w.Rules) != 1 || len(w.Rules[0].Resources) != 1 || !slices.Equal(w.Rules[0].APIGroups, []string{"resource.k8s.io"}) ||
					!slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}) {
					t.Fatalf("%s: rules %+v, want one kind of resource.k8s.io on CREATE and UPDATE", w.Name, w.Rules)
				}
				res := w.Rules[0].Resources[0]
				resources = append(resources, res)
				if s := w.ClientConfig.Service; s == nil || s.Name != "facet-webhook" || s.Namespace != releaseNamespace || s.Path == nil || *s.Path != webhook.MutateClaimsPath {
					t.Errorf("%s: clientConfig %+v", w.Name, w.ClientConfig)
				}
				if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
					t.Errorf("%s: sideEffects %v", w.Name, w.SideEffects)
				}
				if w.FailurePolicy == nil || *w.FailurePolicy != tc.wantPolicy || w.TimeoutSeconds == nil || *w.TimeoutSeconds != tc.wantTimeout {
					t.Errorf("%s: failurePolicy %v, timeout %v; want %s, %d", w.Name, w.FailurePolicy, w.TimeoutSeconds, tc.wantPolicy, tc.wantTimeout)
				}
				conds := map[string]string{}
				for _, c := range w.MatchConditions {
					conds[c.Name] = c.Expression
				}
				if e := conds["notOptedOut"]; !strings.Contains(e, "'"+names.AnnotationPreferExistingMIG+"'") || !strings.Contains(e, "!= 'false'") {
					t.Errorf("%s: notOptedOut %q does not read %s", w.Name, e, names.AnnotationPreferExistingMIG)
				}
				if e := conds["createdOrRewritten"]; !strings.HasPrefix(e, "request.operation == 'CREATE' ||") ||
					!strings.Contains(e, "oldObject.metadata.annotations['"+names.AnnotationPreferExistingMIG+"'].startsWith('rewritten: ')") {
					t.Errorf("%s: createdOrRewritten %q: UPDATEs only of objects the webhook rewrote", w.Name, e)
				}
				if e := conds["hasPlainMIGRequest"]; !strings.Contains(e, devices[res]+".requests") || !strings.Contains(e, "has(r.exactly)") ||
					!strings.Contains(e, "r.exactly.deviceClassName == 'mig.facet.dev'") || !strings.Contains(e, "r.exactly.deviceClassName.startsWith('mig-')") {
					t.Errorf("%s: hasPlainMIGRequest %q", w.Name, e)
				}
				want := 3
				if res == "resourceclaims" {
					want = 4
					checkNotClaimController(t, w.Name, w.MatchConditions, defaultControllerUsers)
				}
				if len(conds) != want {
					t.Errorf("%s: matchConditions %v, want %d", w.Name, conds, want)
				}
				if got := excludedNamespaces(w.NamespaceSelector); !slices.Equal(got, []string{"kube-system", releaseNamespace}) {
					t.Errorf("%s: excluded namespaces %v", w.Name, got)
				}
			}
			if !slices.Equal(resources, []string{"resourceclaims", "resourceclaimtemplates"}) {
				t.Errorf("resources %v, want claims and templates", resources)
			}
		})
	}
}
