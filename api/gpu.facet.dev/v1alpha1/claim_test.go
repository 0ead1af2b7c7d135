package v1alpha1

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/model/names"
)

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     driver,
			Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func fromClass(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClass, names.Driver, params, requests...)
}

func fromClaim(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClaim, names.Driver, params, requests...)
}

// defaulted returns the defaults overridden by the given fields.
func defaulted(enforcement *Enforcement, policy *CoreUtilizationPolicy, priority, logLevel *int32) *VgpuConfig {
	c := vgpu(enforcement, policy, priority, logLevel)
	c.Default()
	return c
}

func TestEffectiveVgpuConfig(t *testing.T) {
	gpuConfig := `{` + apiVersion + `,"kind":"GpuConfig"}`
	tests := []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		request string
		want    *VgpuConfig
		wantErr string
	}{
		{
			name:    "no configs: defaults",
			request: "gpu",
			want:    defaulted(nil, nil, nil, nil),
		},
		{
			name:    "class config applies",
			configs: []resourceapi.DeviceAllocationConfiguration{fromClass(vgpuJSON(`"coreUtilizationPolicy":"force"`), "gpu")},
			request: "gpu",
			want:    defaulted(nil, ptr.To(CoreUtilizationPolicyForce), nil, nil),
		},
		{
			name: "claim overrides class field by field",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"coreUtilizationPolicy":"force","taskPriority":1,"logLevel":3`), "gpu"),
				fromClaim(vgpuJSON(`"taskPriority":0`)),
			},
			request: "gpu",
			want:    defaulted(nil, ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](3)),
		},
		{
			name: "claim wins even when listed before the class",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":0`)),
				fromClass(vgpuJSON(`"logLevel":4`), "gpu"),
			},
			request: "gpu",
			want:    defaulted(nil, nil, nil, ptr.To[int32](0)),
		},
		{
			name: "later claim config wins over earlier claim config",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":1,"taskPriority":0`)),
				fromClaim(vgpuJSON(`"logLevel":4`)),
			},
			request: "gpu",
			want:    defaulted(nil, nil, ptr.To[int32](0), ptr.To[int32](4)),
		},
		{
			name: "later class config wins over earlier class config",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"coreUtilizationPolicy":"force"`), "gpu"),
				fromClass(vgpuJSON(`"coreUtilizationPolicy":"disable"`), "gpu"),
			},
			request: "gpu",
			want:    defaulted(nil, ptr.To(CoreUtilizationPolicyDisable), nil, nil),
		},
		{
			name: "claim opts out of enforcement set by the class",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"enforcement":"enabled"`), "gpu"),
				fromClaim(vgpuJSON(`"enforcement":"disabled"`), "gpu"),
			},
			request: "gpu",
			want:    defaulted(ptr.To(EnforcementDisabled), nil, nil, nil),
		},
		{
			name: "config restricted to another request does not apply",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "other"),
				fromClaim(vgpuJSON(`"taskPriority":0`), "gpu"),
			},
			request: "gpu",
			want:    defaulted(nil, nil, ptr.To[int32](0), nil),
		},
		{
			name: "config listing several requests applies to each",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "a", "gpu", "b"),
			},
			request: "gpu",
			want:    defaulted(nil, nil, nil, ptr.To[int32](4)),
		},
		{
			name: "main request name covers its subrequests",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "gpu"),
			},
			request: "gpu/small",
			want:    defaulted(nil, nil, nil, ptr.To[int32](4)),
		},
		{
			name: "subrequest name covers only that subrequest",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "gpu/large"),
				fromClaim(vgpuJSON(`"taskPriority":0`), "gpu/small"),
			},
			request: "gpu/small",
			want:    defaulted(nil, nil, ptr.To[int32](0), nil),
		},
		{
			name: "subrequest name does not cover the main request",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "gpu/small"),
			},
			request: "gpu",
			want:    defaulted(nil, nil, nil, nil),
		},
		{
			name: "a request name is not a prefix match",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"logLevel":4`), "gp"),
				fromClaim(vgpuJSON(`"logLevel":3`), "gpu-2"),
			},
			request: "gpu",
			want:    defaulted(nil, nil, nil, nil),
		},
		{
			name: "class config as the allocator records it for a subrequest",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"coreUtilizationPolicy":"disable"`), "gpu/small"),
				fromClaim(vgpuJSON(`"logLevel":0`), "gpu"),
			},
			request: "gpu/small",
			want:    defaulted(nil, ptr.To(CoreUtilizationPolicyDisable), nil, ptr.To[int32](0)),
		},
		{
			name: "configs of other drivers are ignored, even malformed ones",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{}}`),
				opaque(resourceapi.AllocationConfigSourceClass, "net.example.com", `not json at all`),
				opaque(resourceapi.AllocationConfigSourceClaim, "facet.dev", vgpuJSON(`"logLevel":4`)),
				fromClaim(vgpuJSON(`"taskPriority":0`)),
			},
			request: "gpu",
			want:    defaulted(nil, nil, ptr.To[int32](0), nil),
		},
		{
			name: "non-opaque entries are ignored",
			configs: []resourceapi.DeviceAllocationConfiguration{
				{Source: resourceapi.AllocationConfigSourceClaim},
				fromClaim(vgpuJSON(`"taskPriority":0`)),
			},
			request: "gpu",
			want:    defaulted(nil, nil, ptr.To[int32](0), nil),
		},
		{
			name: "gpu configs do not affect the vgpu config",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"logLevel":3`)),
				fromClaim(gpuConfig),
			},
			request: "gpu",
			want:    defaulted(nil, nil, nil, ptr.To[int32](3)),
		},
		{
			name: "in-process object instead of raw JSON",
			configs: []resourceapi.DeviceAllocationConfiguration{{
				Source: resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver:     names.Driver,
					Parameters: runtime.RawExtension{Object: vgpu(nil, nil, ptr.To[int32](0), nil)},
				}},
			}},
			request: "gpu",
			want:    defaulted(nil, nil, ptr.To[int32](0), nil),
		},

		// Errors.
		{
			name: "malformed claim entry names its index and source",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"logLevel":3`)),
				fromClaim(vgpuJSON(`"taskPriority":7`)),
			},
			request: "gpu",
			wantErr: `devices.config[1] (from claim): VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive`,
		},
		{
			name: "malformed class entry",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(vgpuJSON(`"coreUtilizationPolicy":"turbo"`)),
			},
			request: "gpu",
			wantErr: `devices.config[0] (from class): VgpuConfig: coreUtilizationPolicy: Unsupported value: "turbo": supported values: "default", "force", "disable"`,
		},
		{
			name: "malformed entry for another request still fails",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(vgpuJSON(`"unknown":1`), "other"),
			},
			request: "gpu",
			wantErr: `devices.config[0] (from claim): VgpuConfig: strict decoding error: unknown field "unknown"`,
		},
		{
			name: "every malformed entry is reported",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClass(`apiVersion: gpu.facet.dev/v1alpha1`),
				fromClaim(vgpuJSON("")),
				fromClaim(`{"apiVersion":"gpu.facet.dev/v1","kind":"VgpuConfig"}`),
			},
			request: "gpu",
			wantErr: `[devices.config[0] (from class): parameters: must be a JSON object (YAML is not accepted), devices.config[2] (from claim): apiVersion: Unsupported value: "gpu.facet.dev/v1": supported values: "gpu.facet.dev/v1alpha1"]`,
		},
		{
			name: "empty parameters",
			configs: []resourceapi.DeviceAllocationConfiguration{
				fromClaim(``),
			},
			request: "gpu",
			wantErr: `devices.config[0] (from claim): parameters: Required value`,
		},
		{
			name: "unknown source",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque("FromNowhere", names.Driver, vgpuJSON("")),
			},
			request: "gpu",
			wantErr: `devices.config[0]: source: Unsupported value: "FromNowhere": supported values: "FromClass", "FromClaim"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EffectiveVgpuConfig(tc.configs, tc.request)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("got %+v, want error %q", got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error:\n  %v\nwant it to contain:\n  %s", err, tc.wantErr)
				}
				if _, gerr := EffectiveGpuConfig(tc.configs, tc.request); gerr == nil || gerr.Error() != err.Error() {
					t.Fatalf("EffectiveGpuConfig error %v, want the same error", gerr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
			g, err := EffectiveGpuConfig(tc.configs, tc.request)
			if err != nil || !equality.Semantic.DeepEqual(g, NewGpuConfig()) {
				t.Fatalf("EffectiveGpuConfig = %+v, %v", g, err)
			}
		})
	}
}

func TestAppliesTo(t *testing.T) {
	tests := []struct {
		requests []string
		request  string
		want     bool
	}{
		{nil, "a", true},
		{nil, "a/b", true},
		{[]string{}, "a", true},
		{[]string{"a"}, "a", true},
		{[]string{"a"}, "a/b", true},
		{[]string{"a/b"}, "a/b", true},
		{[]string{"a/b"}, "a/c", false},
		{[]string{"a/b"}, "a", false},
		{[]string{"b"}, "a", false},
		{[]string{"b"}, "a/b", false},
		{[]string{"a/"}, "a/b", false},
		{[]string{"x", "a"}, "a/b", true},
	}
	for _, tc := range tests {
		if got := appliesTo(tc.requests, tc.request); got != tc.want {
			t.Errorf("appliesTo(%q, %q) = %v, want %v", tc.requests, tc.request, got, tc.want)
		}
	}
}
