package webhook

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

// TestPrioritizedListProbe: the probe's answer for each way the API
// server can answer its dry run, as a 1.35 API server answers with
// DRAPrioritizedList on (the field kept) and off (the field dropped, the
// request left empty refused), and for failures that tell nothing.
func TestPrioritizedListProbe(t *testing.T) {
	claims := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}
	for _, tc := range []struct {
		name string
		// The API server's answer: the claim sent, without its
		// firstAvailable with drop, or err.
		drop          bool
		err           error
		wantSupported bool
		wantWhy       string
	}{
		{name: "kept", wantSupported: true, wantWhy: "a server-side dry run of a claim kept its firstAvailable"},
		{name: "dropped, and still admitted", drop: true, wantWhy: "a server-side dry run of a claim dropped its firstAvailable"},
		{name: "dropped, and the empty request refused (the gate off)",
			err: apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "facet-webhook-probe-x", field.ErrorList{
				field.Required(field.NewPath("spec", "devices", "requests").Index(0), "exactly one of `exactly` or `firstAvailable` is required"),
			}),
			wantWhy: "the API server dropped a claim's firstAvailable and refused the request left empty (DRAPrioritizedList is off)"},
		{name: "refused for another reason (a policy)",
			err: apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "facet-webhook-probe-x", field.ErrorList{
				field.Invalid(field.NewPath("metadata", "labels"), "x", "a policy wants a team label"),
			}),
			wantWhy: "cannot tell: the server-side dry run of a claim failed"},
		{name: "forbidden (no RBAC)", err: apierrors.NewForbidden(claims, "", nil),
			wantWhy: "cannot tell: the server-side dry run of a claim failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var opts []metav1.CreateOptions
			var sent *resourceapi.ResourceClaim
			client.PrependReactor("create", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				c := a.(k8stesting.CreateActionImpl)
				opts = append(opts, c.CreateOptions)
				sent = c.Object.(*resourceapi.ResourceClaim).DeepCopy()
				if tc.err != nil {
					return true, nil, tc.err
				}
				got := sent.DeepCopy()
				if tc.drop {
					got.Spec.Devices.Requests[0].FirstAvailable = nil
				}
				return true, got, nil
			})
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			p := NewPrioritizedListProbe(logger, client, "facet-system")
			if ok, why := p.Supported(); ok || why != "not probed yet" {
				t.Errorf("before a probe: %v, %q", ok, why)
			}
			for range 3 {
				p.Check(context.Background())
			}
			ok, why := p.Supported()
			if ok != tc.wantSupported || !strings.HasPrefix(why, tc.wantWhy) {
				t.Errorf("supported %v (%s), want %v (%s)", ok, why, tc.wantSupported, tc.wantWhy)
			}
			if len(opts) != 3 || len(opts[0].DryRun) != 1 || opts[0].DryRun[0] != metav1.DryRunAll {
				t.Errorf("create options %+v: every probe must be a dry run", opts)
			}
			if sent.GenerateName == "" || len(sent.Spec.Devices.Requests) != 1 || len(sent.Spec.Devices.Requests[0].FirstAvailable) != 1 || sent.Spec.Devices.Requests[0].Exactly != nil {
				t.Errorf("probe claim %+v: want one request with only firstAvailable", sent)
			}
			if acts := client.Actions(); len(acts) != 3 || acts[0].GetNamespace() != "facet-system" {
				t.Errorf("actions %v, want three creates in facet-system", acts)
			}
			log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if n := strings.Count(log, "Does the API server keep firstAvailable"); n != 1 {
				t.Errorf("answer logged %d times, want once (it did not change):\n%s", n, log)
			}
		})
	}
}
