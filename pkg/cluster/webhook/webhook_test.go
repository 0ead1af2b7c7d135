package webhook

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
)

const (
	goodVgpu  = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","taskPriority":0,"logLevel":3}`
	badVgpu   = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","taskPriority":7}`
	goodGpu   = `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig"}`
	otherJSON = `{"anything":"goes","for":"another driver"}`
)

// opaque is one config entry of a claim, template or class.
func opaque(driver, params string, requests ...string) string {
	req := ""
	if len(requests) > 0 {
		b, _ := json.Marshal(requests)
		req = `"requests":` + string(b) + `,`
	}
	return `{` + req + `"opaque":{"driver":"` + driver + `","parameters":` + params + `}}`
}

func claim(configs ...string) string {
	return `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c","namespace":"ns"},
"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"vgpu.facet.dev"}}],"config":[` + strings.Join(configs, ",") + `]}}}`
}

func template(configs ...string) string {
	return `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimTemplate","metadata":{"name":"t","namespace":"ns"},
"spec":{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"vgpu.facet.dev"}}],"config":[` + strings.Join(configs, ",") + `]}}}}`
}

func class(configs ...string) string {
	return `{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"vgpu.facet.dev"},
"spec":{"selectors":[{"cel":{"expression":"true"}}],"config":[` + strings.Join(configs, ",") + `]}}`
}

func request(kind string, op admissionv1.Operation, obj, old string) *admissionv1.AdmissionRequest {
	r := &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-1"),
		Kind:      metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: kind},
		Operation: op,
		Namespace: "ns",
		Name:      "x",
		UserInfo:  authnv1.UserInfo{Username: "alice"},
	}
	if obj != "" {
		r.Object.Raw = []byte(obj)
	}
	if old != "" {
		r.OldObject.Raw = []byte(old)
	}
	return r
}

func TestReview(t *testing.T) {
	tests := []struct {
		name string
		req  *admissionv1.AdmissionRequest
		// wantDenied lists substrings of the refusal; none means allowed.
		wantDenied []string
		wantCode   int32
		// wantWarning is a substring of the one warning expected.
		wantWarning string
	}{
		{
			name: "claim with valid vgpu and gpu configs",
			req:  request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", goodVgpu, "gpu"), opaque("gpu.facet.dev", goodGpu)), ""),
		},
		{
			name: "claim without configs",
			req:  request("ResourceClaim", admissionv1.Create, claim(), ""),
		},
		{
			name: "another driver's config is not ours to judge",
			req:  request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.example.com", otherJSON)), ""),
		},
		{
			name:       "claim with an out-of-range taskPriority names the field",
			req:        request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", badVgpu)), ""),
			wantDenied: []string{"spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive"},
			wantCode:   http.StatusUnprocessableEntity,
		},
		{
			name: "the index is the entry's own, past other drivers' entries",
			req: request("ResourceClaim", admissionv1.Create, claim(
				opaque("gpu.example.com", otherJSON), opaque("gpu.facet.dev", goodVgpu),
				opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","coreUtilizationPolicy":"turbo"}`)), ""),
			wantDenied: []string{`spec.devices.config[2].opaque.parameters: VgpuConfig: coreUtilizationPolicy: Unsupported value: "turbo"`},
			wantCode:   http.StatusUnprocessableEntity,
		},
		{
			name: "every bad entry is reported",
			req: request("ResourceClaim", admissionv1.Create, claim(
				opaque("gpu.facet.dev", badVgpu),
				opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","logLevel":9}`)), ""),
			wantDenied: []string{"config[0].opaque.parameters: VgpuConfig: taskPriority", "; spec.devices.config[1].opaque.parameters: VgpuConfig: logLevel: Invalid value: 9"},
			wantCode:   http.StatusUnprocessableEntity,
		},
		{
			name:       "unknown field (strict decoding)",
			req:        request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","taskpriority":1}`)), ""),
			wantDenied: []string{"spec.devices.config[0].opaque.parameters: VgpuConfig:", `unknown field "taskpriority"`},
		},
		{
			name:       "unknown kind",
			req:        request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"MigConfig"}`)), ""),
			wantDenied: []string{`spec.devices.config[0].opaque.parameters: kind: Unsupported value: "MigConfig"`},
		},
		{
			name:       "missing apiVersion",
			req:        request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", `{"kind":"VgpuConfig"}`)), ""),
			wantDenied: []string{"spec.devices.config[0].opaque.parameters: apiVersion: Required value"},
		},
		{
			name:       "fields on a GpuConfig",
			req:        request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig","taskPriority":0}`)), ""),
			wantDenied: []string{"spec.devices.config[0].opaque.parameters: GpuConfig:", `unknown field "taskPriority"`},
		},
		{
			name: "template valid",
			req:  request("ResourceClaimTemplate", admissionv1.Create, template(opaque("gpu.facet.dev", goodVgpu)), ""),
		},
		{
			name:       "template invalid",
			req:        request("ResourceClaimTemplate", admissionv1.Create, template(opaque("gpu.facet.dev", badVgpu)), ""),
			wantDenied: []string{"spec.spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7"},
		},
		{
			name: "device class valid",
			req:  request("DeviceClass", admissionv1.Create, class(opaque("gpu.facet.dev", goodVgpu)), ""),
		},
		{
			name:       "device class invalid",
			req:        request("DeviceClass", admissionv1.Create, class(opaque("gpu.facet.dev", goodVgpu), opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","enforcement":"off"}`)), ""),
			wantDenied: []string{`spec.config[1].opaque.parameters: VgpuConfig: enforcement: Unsupported value: "off"`},
		},
		{
			name:       "device class update that breaks a config",
			req:        request("DeviceClass", admissionv1.Update, class(opaque("gpu.facet.dev", badVgpu)), class(opaque("gpu.facet.dev", goodVgpu))),
			wantDenied: []string{"spec.config[0].opaque.parameters: VgpuConfig: taskPriority"},
		},
		{
			name:        "update that leaves an old bad config alone is allowed with a warning",
			req:         request("DeviceClass", admissionv1.Update, class(opaque("gpu.facet.dev", badVgpu)), class(opaque("gpu.facet.dev", badVgpu))),
			wantWarning: "spec.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7",
		},
		{
			name:        "whitespace does not make an old config new",
			req:         request("ResourceClaim", admissionv1.Update, claim(opaque("gpu.facet.dev", badVgpu)), claim(opaque("gpu.facet.dev", strings.ReplaceAll(badVgpu, ",", " , ")))),
			wantWarning: "unchanged by this update",
		},
		{
			name:       "an old bad config does not excuse a new one",
			req:        request("DeviceClass", admissionv1.Update, class(opaque("gpu.facet.dev", badVgpu), opaque("gpu.facet.dev", `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","logLevel":-1}`)), class(opaque("gpu.facet.dev", badVgpu))),
			wantDenied: []string{"spec.config[1].opaque.parameters: VgpuConfig: logLevel: Invalid value: -1"},
		},
		{
			name:       "the same parameters restricted to other requests are a new entry",
			req:        request("ResourceClaim", admissionv1.Update, claim(opaque("gpu.facet.dev", badVgpu, "gpu")), claim(opaque("gpu.facet.dev", badVgpu))),
			wantDenied: []string{"spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority"},
		},
		{
			name: "delete is not checked",
			req:  request("ResourceClaim", admissionv1.Delete, "", claim(opaque("gpu.facet.dev", badVgpu))),
		},
		{
			name:        "a kind of another group is allowed with a warning",
			req:         &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create},
			wantWarning: "does not check /v1, Kind=Pod",
		},
		{
			name:       "an unexpected kind of resource.k8s.io is refused",
			req:        request("ResourceSlice", admissionv1.Create, `{}`, ""),
			wantDenied: []string{"kind ResourceSlice of resource.k8s.io is not one Facet's webhook checks"},
			wantCode:   http.StatusBadRequest,
		},
		{
			name:       "an object that does not decode is refused",
			req:        request("ResourceClaim", admissionv1.Create, `{"spec":{"devices":{"config":"nope"}}}`, ""),
			wantDenied: []string{"decode ResourceClaim"},
			wantCode:   http.StatusBadRequest,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := Review(tc.req)
			if len(tc.wantDenied) == 0 {
				if !resp.Allowed {
					t.Fatalf("denied: %v", resp.Result)
				}
			} else {
				if resp.Allowed {
					t.Fatalf("allowed, want denied with %q", tc.wantDenied)
				}
				for _, want := range tc.wantDenied {
					if !strings.Contains(resp.Result.Message, want) {
						t.Errorf("message %q\ndoes not contain %q", resp.Result.Message, want)
					}
				}
				if want := tc.wantCode; want != 0 && resp.Result.Code != want {
					t.Errorf("code %d, want %d", resp.Result.Code, want)
				}
			}
			switch {
			case tc.wantWarning == "" && len(resp.Warnings) > 0:
				t.Errorf("unexpected warnings %q", resp.Warnings)
			case tc.wantWarning != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.wantWarning)):
				t.Errorf("warnings %q, want one containing %q", resp.Warnings, tc.wantWarning)
			}
		})
	}
}

func review(req *admissionv1.AdmissionRequest) string {
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestHandlerHTTP(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	srv := httptest.NewServer(NewHandler(logger))
	defer srv.Close()

	tests := []struct {
		name        string
		method      string
		contentType string
		body        string
		wantStatus  int
		// For 200: the response's Allowed and a substring of its message.
		wantAllowed bool
		wantMessage string
	}{
		{
			name: "allowed", method: http.MethodPost, contentType: "application/json",
			body:       review(request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", goodVgpu)), "")),
			wantStatus: http.StatusOK, wantAllowed: true,
		},
		{
			name: "denied names the field", method: http.MethodPost, contentType: "application/json; charset=utf-8",
			body:        review(request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", badVgpu)), "")),
			wantStatus:  http.StatusOK,
			wantMessage: "spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive",
		},
		{name: "GET", method: http.MethodGet, wantStatus: http.StatusMethodNotAllowed},
		{name: "not JSON", method: http.MethodPost, contentType: "text/plain", body: "{}", wantStatus: http.StatusUnsupportedMediaType},
		{name: "garbage", method: http.MethodPost, contentType: "application/json", body: "{", wantStatus: http.StatusBadRequest},
		{name: "no request", method: http.MethodPost, contentType: "application/json", body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, wantStatus: http.StatusBadRequest},
		{name: "v1beta1 review", method: http.MethodPost, contentType: "application/json", body: `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}`, wantStatus: http.StatusBadRequest},
		{name: "too large", method: http.MethodPost, contentType: "application/json", body: strings.Repeat(" ", maxReviewBytes+1), wantStatus: http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+ValidatePath, bytes.NewBufferString(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.wantStatus, body)
			}
			if resp.StatusCode != http.StatusOK {
				return
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatalf("response is not an AdmissionReview: %v\n%s", err, body)
			}
			if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil {
				t.Fatalf("bad response envelope: %s", body)
			}
			if out.Response.UID != "uid-1" {
				t.Errorf("response UID %q, want the request's", out.Response.UID)
			}
			if out.Response.Allowed != tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v: %s", out.Response.Allowed, tc.wantAllowed, body)
			}
			if tc.wantMessage != "" && (out.Response.Result == nil || !strings.Contains(out.Response.Result.Message, tc.wantMessage)) {
				t.Errorf("message does not contain %q: %s", tc.wantMessage, body)
			}
		})
	}
}
