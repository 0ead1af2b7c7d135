package webhook

// The claim mutator writes a plain MIG request, an `exactly` request of
// mig.facet.dev or mig-<profile>.facet.dev, as the existing-first list
// (migfirst.go) when a ResourceClaim or ResourceClaimTemplate is created.
// The upstream allocator takes the first device that fits in an order
// Facet does not set, so a plain request may carve an instance on an
// untouched GPU while static instances are free (docs/admins.md, "Existing
// MIG instances first"); the list makes "existing instances first" the
// claim's own.
//
// Templates are rewritten, not the claims the resourceclaim controller
// makes from them: a claim copies its template's spec, so the rewrite is
// done once, where most users write their requests, and a pod's claim
// never waits on the webhook (the chart's matchConditions skip the
// controller's claims).
//
// A request is left as written, and the author told why in a warning
// where it is not their choice, when:
//   - the object is annotated names.AnnotationPreferExistingMIG "false";
//   - Kueue is in use (--kueue=on, or the API server serves kueue.x-k8s.io,
//     whatever --kueue says): Kueue counts a claim's `exactly` requests by
//     DeviceClass and refuses to admit one with firstAvailable, so the class
//     must stay visible;
//   - the API server drops firstAvailable (PrioritizedListSupport);
//   - the request is not ExactCount, asks for admin access, or has a field
//     that a subrequest lacks (existingFirst).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// MutateClaimsPath is where the claim mutator is served.
const MutateClaimsPath = "/mutate-claims"

// ClaimMutatorOptions configures NewClaimMutator.
type ClaimMutatorOptions struct {
	// Kueue is the webhook's --kueue. Any mode but on still looks for
	// Kueue's API: a rewritten claim is one Kueue cannot count.
	Kueue KueueMode
	// Discovery asks whether Kueue's API is served.
	Discovery discovery.ServerGroupsInterface
	// PrioritizedList says whether the API server keeps firstAvailable.
	PrioritizedList PrioritizedListSupport
}

// ClaimMutator is the HTTP handler of MutateClaimsPath.
type ClaimMutator struct {
	logger     klog.Logger
	opts       ClaimMutatorOptions
	kueueState *kueueDetector
}

// NewClaimMutator checks opts and returns the handler.
func NewClaimMutator(logger klog.Logger, opts ClaimMutatorOptions) (*ClaimMutator, error) {
	var err error
	if opts.Kueue, err = kueueOption(opts.Kueue); err != nil {
		return nil, err
	}
	if opts.Discovery == nil || opts.PrioritizedList == nil {
		return nil, errors.New("the claim mutator needs a discovery client and a PrioritizedListSupport")
	}
	return &ClaimMutator{logger: logger, opts: opts, kueueState: &kueueDetector{
		discovery: opts.Discovery, logger: logger,
		consequence: "while served, MIG requests of claims and templates are left as written (Kueue counts `exactly` requests by DeviceClass)",
	}}, nil
}

// kueue reports whether claims are left to Kueue now.
func (m *ClaimMutator) kueue() bool {
	return m.opts.Kueue == KueueOn || m.kueueState.kueueServed()
}

// ServeHTTP serves AdmissionReviews of ResourceClaims and
// ResourceClaimTemplates.
func (m *ClaimMutator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveAdmission(w, r, func(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		resp := m.Review(r.Context(), req)
		logMutation(m.logger, req, resp, "Denied", "Wrote MIG requests existing instances first", "Left claim alone")
		return resp
	})
}

// requestsPath is where a kind keeps its device requests: the JSON
// pointer and the field path for messages.
var requestsPath = map[string][]string{
	"ResourceClaim":         {"spec", "devices", "requests"},
	"ResourceClaimTemplate": {"spec", "spec", "devices", "requests"},
}

// Review decides one claim or template. It never returns nil.
//
// On CREATE it rewrites. On UPDATE it only restores: a claim's and a
// template's spec is immutable, and `kubectl apply` (or a GitOps tool) of
// the manifest the object was created from sends its plain request again,
// which the API server would refuse as a change of spec. Where the object
// was rewritten (its old annotation says so) and rewriting the new one
// gives back the old requests exactly, the update gets them, so that
// applying an unchanged manifest changes nothing; any other update is left
// alone.
func (m *ClaimMutator) Review(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	path, ok := requestsPath[req.Kind.Kind]
	if req.Kind.Group != resourceGroup || !ok || req.SubResource != "" {
		return allowedWithWarning(fmt.Sprintf("Facet's claim mutator does not handle %s; its webhook configuration should not send it", req.Kind))
	}
	update := req.Operation == admissionv1.Update
	if req.Operation != admissionv1.Create && !update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	obj, err := decodeObject(req.Object.Raw)
	if err != nil {
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, "decode "+req.Kind.Kind+": "+err.Error())
	}
	annotations, hasAnnotations := dig(obj, "metadata", "annotations").(map[string]any)
	if annotations[names.AnnotationPreferExistingMIG] == "false" {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	requests, _ := dig(obj, path...).([]any)
	type candidate struct {
		index   int
		name    string
		exactly map[string]any
	}
	var candidates []candidate
	for i, r := range requests {
		r, _ := r.(map[string]any)
		exactly, _ := r["exactly"].(map[string]any)
		if class, _ := exactly["deviceClassName"].(string); isMIGClass(class) {
			name, _ := r["name"].(string)
			candidates = append(candidates, candidate{i, name, exactly})
		}
	}
	if len(candidates) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	field := strings.Join(path, ".")
	var oldRequests []any
	if update {
		old, err := decodeObject(req.OldObject.Raw)
		if err != nil {
			return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, "decode old "+req.Kind.Kind+": "+err.Error())
		}
		if note, _ := dig(old, "metadata", "annotations", names.AnnotationPreferExistingMIG).(string); !strings.HasPrefix(note, rewrittenNote) {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		oldRequests, _ = dig(old, path...).([]any)
	} else {
		if m.kueue() {
			return &admissionv1.AdmissionResponse{Allowed: true}
		}
		if ok, why := m.opts.PrioritizedList.Supported(); !ok {
			return allowedWithWarning(fmt.Sprintf("Facet's webhook left the MIG requests of %s as written, not existing instances first (%s), as the API server may not keep firstAvailable: %s",
				field, migPreferenceNames(), why))
		}
	}
	var ops []jsonPatchOp
	var rewritten, warnings []string
	restored := append([]any(nil), requests...)
	for _, c := range candidates {
		subs, err := existingFirst(c.exactly)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("Facet's webhook left %s[%d] (%q) as written, not existing instances first: %v", field, c.index, c.name, err))
			continue
		}
		base := fmt.Sprintf("/%s/%d", strings.Join(path, "/"), c.index)
		ops = append(ops, jsonPatchOp{Op: "remove", Path: base + "/exactly"}, jsonPatchOp{Op: "add", Path: base + "/firstAvailable", Value: subs})
		rewritten = append(rewritten, c.name)
		r := map[string]any{}
		for k, v := range requests[c.index].(map[string]any) {
			if k != "exactly" {
				r[k] = v
			}
		}
		r["firstAvailable"] = subs
		restored[c.index] = r
	}
	if update && (len(ops) == 0 || !reflect.DeepEqual(restored, oldRequests)) {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if len(ops) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings}
	}
	sort.Strings(rewritten)
	note := rewrittenNote + strings.Join(rewritten, ",")
	if hasAnnotations {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + pointerEscape(names.AnnotationPreferExistingMIG), Value: note})
	} else {
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{names.AnnotationPreferExistingMIG: note}})
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return denied(http.StatusInternalServerError, metav1.StatusReasonInternalError, "encode patch: "+err.Error())
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt, Warnings: warnings}
}

// rewrittenNote starts the value of names.AnnotationPreferExistingMIG on
// an object the claim mutator rewrote; the requests' names follow.
const rewrittenNote = "rewritten: "

// decodeObject decodes a JSON object, numbers as json.Number, so that
// they are written back as they came.
func decodeObject(raw []byte) (map[string]any, error) {
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("not a JSON object")
	}
	return obj, nil
}

// dig returns the value at path in a JSON object, nil where any step is
// missing or not an object.
func dig(obj map[string]any, path ...string) any {
	var cur any = obj
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}
