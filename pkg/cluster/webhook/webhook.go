// Package webhook is Facet's admission webhook server: the validating
// webhook for opaque configs (this file, server.go) and the pod mutator
// that rewrites extended resources into claims (mutate.go, kueue.go,
// extresmap.go). The validating webhook refuses, at
// `kubectl apply` time, a ResourceClaim, ResourceClaimTemplate or DeviceClass
// whose opaque config for the driver gpu.facet.dev the kubelet plugin would
// refuse at prepare time, long after the pod was scheduled.
//
// It decodes each config with the plugin's own decoder
// (api/gpu.facet.dev/v1alpha1 Decode: strict decoding, then Validate), so what
// it admits is exactly what the plugin accepts. The refusal names the field,
// e.g.
//
//	spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive
//
// What it checks, per kind (group resource.k8s.io, any served version: the
// config fields have the same shape in v1, v1beta2 and v1beta1):
//   - ResourceClaim: spec.devices.config[*].opaque
//   - ResourceClaimTemplate: spec.spec.devices.config[*].opaque
//   - DeviceClass: spec.config[*].opaque
//
// Only entries whose opaque.driver is gpu.facet.dev are decoded; other
// drivers' configs and non-opaque entries are left alone. CREATE and UPDATE
// are checked, but the chart registers claims and templates for CREATE
// only: their spec is immutable, so an UPDATE is a metadata write (the
// scheduler's finalizer) that must not wait on the webhook. DeviceClasses
// can be edited and are sent on both. On UPDATE an entry identical to one
// of the old object's is allowed with a warning, so that an object
// admitted before the webhook existed can still be updated.
//
// The HTTP side speaks admission.k8s.io/v1 AdmissionReview only (the
// ValidatingWebhookConfiguration must list admissionReviewVersions: [v1]).
package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// ValidatePath is where the handler is served.
const ValidatePath = "/validate"

// maxReviewBytes bounds a request body. The API server sends at most one
// object and its old version, each at most its own request limit (3 MiB by
// default), plus the review's envelope.
const maxReviewBytes = 7 << 20

const resourceGroup = "resource.k8s.io"

// Handler serves AdmissionReviews. The zero value is not usable; use
// NewHandler.
type Handler struct {
	logger klog.Logger
}

// NewHandler returns the webhook's HTTP handler. Refusals are logged at the
// default level, admissions at V(2), with the object, the operation and the
// user.
func NewHandler(logger klog.Logger) *Handler {
	return &Handler{logger: logger}
}

// ServeHTTP decodes an AdmissionReview, reviews its request and writes the
// review back with the response. Malformed HTTP requests get a plain HTTP
// error, which the API server treats as a webhook failure (failurePolicy).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serveAdmission(w, r, func(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		resp := Review(req)
		h.log(req, resp)
		return resp
	})
}

// serveAdmission is the HTTP side shared by the validating and the mutating
// handler: it checks and decodes the AdmissionReview, has review decide,
// and writes the review back with the response and the request's UID.
func serveAdmission(w http.ResponseWriter, r *http.Request, review func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "only POST is allowed", http.StatusMethodNotAllowed)
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxReviewBytes {
		http.Error(w, fmt.Sprintf("body larger than %d bytes", maxReviewBytes), http.StatusRequestEntityTooLarge)
		return
	}
	var in admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, "decode AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if gv := in.APIVersion; gv != admissionv1.SchemeGroupVersion.String() || in.Kind != "AdmissionReview" {
		http.Error(w, fmt.Sprintf("want an AdmissionReview of %s, got kind %q of %q", admissionv1.SchemeGroupVersion, in.Kind, gv), http.StatusBadRequest)
		return
	}
	if in.Request == nil {
		http.Error(w, "AdmissionReview has no request", http.StatusBadRequest)
		return
	}

	resp := review(in.Request)
	resp.UID = in.Request.UID

	out := admissionv1.AdmissionReview{TypeMeta: in.TypeMeta, Response: resp}
	data, err := json.Marshal(out)
	if err != nil {
		http.Error(w, "encode AdmissionReview: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

func (h *Handler) log(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	kv := []any{
		"kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name,
		"operation", req.Operation, "user", req.UserInfo.Username, "uid", req.UID, "dryRun", req.DryRun != nil && *req.DryRun,
	}
	if len(resp.Warnings) > 0 {
		kv = append(kv, "warnings", resp.Warnings)
	}
	if !resp.Allowed {
		h.logger.Info("Denied", append(kv, "reason", resp.Result.Message)...)
		return
	}
	h.logger.V(2).Info("Allowed", kv...)
}

// Review decides one admission request. It never returns nil; the caller
// sets the response's UID.
func Review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	if req.Kind.Group != resourceGroup {
		return allowedWithWarning(fmt.Sprintf("Facet's webhook does not check %s; its webhook configuration should not send it", req.Kind))
	}
	newConfigs, err := configsOf(req.Kind.Kind, req.Object.Raw)
	if err != nil {
		return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
	}
	var oldConfigs []located
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if oldConfigs, err = configsOf(req.Kind.Kind, req.OldObject.Raw); err != nil {
			return denied(http.StatusBadRequest, metav1.StatusReasonBadRequest, "old object: "+err.Error())
		}
	}
	errs, warnings := validate(newConfigs, oldConfigs)
	if len(errs) > 0 {
		return denied(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, strings.Join(errs, "; "))
	}
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings}
}

// located is one opaque config of this driver and where it is.
type located struct {
	path *field.Path // .../opaque.parameters
	// key identifies the entry (requests and parameters) for ratcheting.
	key string
	raw []byte
}

var errNoObject = errors.New("the request carries no object")

// configsOf returns the opaque configs of this driver in an object of the
// given kind, in list order. Kinds other than the three are an error: the
// webhook configuration must not send them.
func configsOf(kind string, raw []byte) ([]located, error) {
	if len(raw) == 0 {
		return nil, errNoObject
	}
	switch kind {
	case "ResourceClaim":
		var obj resourceapi.ResourceClaim
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("decode ResourceClaim: %w", err)
		}
		return claimConfigs(field.NewPath("spec", "devices", "config"), obj.Spec.Devices.Config), nil
	case "ResourceClaimTemplate":
		var obj resourceapi.ResourceClaimTemplate
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("decode ResourceClaimTemplate: %w", err)
		}
		return claimConfigs(field.NewPath("spec", "spec", "devices", "config"), obj.Spec.Spec.Devices.Config), nil
	case "DeviceClass":
		var obj resourceapi.DeviceClass
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("decode DeviceClass: %w", err)
		}
		var out []located
		for i, c := range obj.Spec.Config {
			if l, ok := locate(field.NewPath("spec", "config").Index(i), nil, c.DeviceConfiguration); ok {
				out = append(out, l)
			}
		}
		return out, nil
	default:
		return nil, fmt.Errorf("kind %s of %s is not one Facet's webhook checks (ResourceClaim, ResourceClaimTemplate, DeviceClass)", kind, resourceGroup)
	}
}

func claimConfigs(path *field.Path, configs []resourceapi.DeviceClaimConfiguration) []located {
	var out []located
	for i, c := range configs {
		if l, ok := locate(path.Index(i), c.Requests, c.DeviceConfiguration); ok {
			out = append(out, l)
		}
	}
	return out
}

func locate(path *field.Path, requests []string, c resourceapi.DeviceConfiguration) (located, bool) {
	if c.Opaque == nil || c.Opaque.Driver != names.Driver {
		return located{}, false
	}
	raw := c.Opaque.Parameters.Raw
	key, _ := json.Marshal(struct {
		Requests   []string        `json:"requests"`
		Parameters json.RawMessage `json:"parameters"`
	}{requests, compactJSON(raw)})
	return located{path: path.Child("opaque", "parameters"), key: string(key), raw: raw}, true
}

// compactJSON normalises whitespace so that a re-serialised but unchanged
// entry still matches its old self; invalid JSON is returned as a JSON
// string, which cannot equal a valid entry's parameters by accident.
func compactJSON(raw []byte) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err == nil {
		return b.Bytes()
	}
	q, _ := json.Marshal(string(raw))
	return q
}

// validate decodes every config with the plugin's decoder. An invalid entry
// that is identical to one of old's (an UPDATE that did not touch it) is a
// warning, not an error.
func validate(configs, old []located) (errs, warnings []string) {
	unchanged := map[string]bool{}
	for _, o := range old {
		unchanged[o.key] = true
	}
	for _, c := range configs {
		if _, err := configapi.Decode(c.raw); err != nil {
			msg := fmt.Sprintf("%s: %v", c.path, err)
			if unchanged[c.key] {
				warnings = append(warnings, msg+" (unchanged by this update, so allowed; the kubelet plugin will refuse claims it applies to)")
				continue
			}
			errs = append(errs, msg)
		}
	}
	return errs, warnings
}

func denied(code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg},
	}
}

func allowedWithWarning(msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{msg}}
}
