package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
)

const apiVersion = `"apiVersion":"gpu.facet.dev/v1alpha1"`

func vgpuJSON(fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return `{` + apiVersion + `,"kind":"VgpuConfig"` + fields + `}`
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Config // nil when an error is expected
		// wantErr must be a substring of the error; for a table this size,
		// an exact match would mostly test apimachinery's wording.
		wantErr string
	}{
		{
			name: "minimal vgpu config leaves every field unset",
			in:   vgpuJSON(""),
			want: NewVgpuConfig(),
		},
		{
			name: "minimal gpu config",
			in:   `{` + apiVersion + `,"kind":"GpuConfig"}`,
			want: NewGpuConfig(),
		},
		{
			name: "every vgpu field",
			in:   vgpuJSON(`"enforcement":"enabled","coreUtilizationPolicy":"force","taskPriority":0,"logLevel":4`),
			want: &VgpuConfig{
				TypeMeta:              NewVgpuConfig().TypeMeta,
				Enforcement:           ptr.To(EnforcementEnabled),
				CoreUtilizationPolicy: ptr.To(CoreUtilizationPolicyForce),
				TaskPriority:          ptr.To[int32](0),
				LogLevel:              ptr.To[int32](4),
			},
		},
		{
			name: "zero values are set, not unset",
			in:   vgpuJSON(`"taskPriority":0,"logLevel":0`),
			want: &VgpuConfig{TypeMeta: NewVgpuConfig().TypeMeta, TaskPriority: ptr.To[int32](0), LogLevel: ptr.To[int32](0)},
		},
		{
			name: "opt-out",
			in:   vgpuJSON(`"enforcement":"disabled"`),
			want: &VgpuConfig{TypeMeta: NewVgpuConfig().TypeMeta, Enforcement: ptr.To(EnforcementDisabled)},
		},
		{
			name: "null means unset",
			in:   vgpuJSON(`"taskPriority":null,"coreUtilizationPolicy":null`),
			want: NewVgpuConfig(),
		},
		{
			name: "surrounding white space",
			in:   "\n  " + vgpuJSON(`"logLevel":3`) + "\n",
			want: &VgpuConfig{TypeMeta: NewVgpuConfig().TypeMeta, LogLevel: ptr.To[int32](3)},
		},

		// Invalid values, one field at a time.
		{
			name:    "unsupported policy",
			in:      vgpuJSON(`"coreUtilizationPolicy":"turbo"`),
			wantErr: `VgpuConfig: coreUtilizationPolicy: Unsupported value: "turbo": supported values: "default", "force", "disable"`,
		},
		{
			name:    "unsupported partitioning",
			in:      vgpuJSON(`"partitioning":"MPS"`),
			wantErr: `VgpuConfig: partitioning: Unsupported value: "MPS": supported values: "mps", "time-sliced"`,
		},
		{
			name:    "policy is case-sensitive",
			in:      vgpuJSON(`"coreUtilizationPolicy":"FORCE"`),
			wantErr: `coreUtilizationPolicy: Unsupported value: "FORCE"`,
		},
		{
			name:    "empty policy is not unset",
			in:      vgpuJSON(`"coreUtilizationPolicy":""`),
			wantErr: `coreUtilizationPolicy: Unsupported value: ""`,
		},
		{
			name:    "priority above range",
			in:      vgpuJSON(`"taskPriority":7`),
			wantErr: `VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive`,
		},
		{
			name:    "negative priority",
			in:      vgpuJSON(`"taskPriority":-1`),
			wantErr: `taskPriority: Invalid value: -1: must be between 0 and 1, inclusive`,
		},
		{
			name:    "log level above range",
			in:      vgpuJSON(`"logLevel":5`),
			wantErr: `VgpuConfig: logLevel: Invalid value: 5: must be between 0 and 4, inclusive`,
		},
		{
			name:    "negative log level",
			in:      vgpuJSON(`"logLevel":-1`),
			wantErr: `logLevel: Invalid value: -1: must be between 0 and 4, inclusive`,
		},
		{
			name:    "unsupported enforcement",
			in:      vgpuJSON(`"enforcement":"off"`),
			wantErr: `VgpuConfig: enforcement: Unsupported value: "off": supported values: "enabled", "disabled"`,
		},
		{
			name:    "every invalid field is reported",
			in:      vgpuJSON(`"enforcement":"off","coreUtilizationPolicy":"turbo","taskPriority":2,"logLevel":9`),
			wantErr: `VgpuConfig: [enforcement: Unsupported value: "off": supported values: "enabled", "disabled", coreUtilizationPolicy: Unsupported value: "turbo": supported values: "default", "force", "disable", taskPriority: Invalid value: 2: must be between 0 and 1, inclusive, logLevel: Invalid value: 9: must be between 0 and 4, inclusive]`,
		},

		// Strictness.
		{
			name:    "unknown field",
			in:      vgpuJSON(`"gpumem":"4Gi"`),
			wantErr: `VgpuConfig: strict decoding error: unknown field "gpumem"`,
		},
		{
			name:    "field names are case-sensitive",
			in:      vgpuJSON(`"TaskPriority":1`),
			wantErr: `strict decoding error: unknown field "TaskPriority"`,
		},
		{
			name:    "duplicate field",
			in:      vgpuJSON(`"logLevel":1,"logLevel":3`),
			wantErr: `strict decoding error: duplicate field "logLevel"`,
		},
		{
			name:    "field in gpu config",
			in:      `{` + apiVersion + `,"kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`,
			wantErr: `GpuConfig: strict decoding error: unknown field "sharing"`,
		},
		{
			name:    "string for integer",
			in:      vgpuJSON(`"taskPriority":"1"`),
			wantErr: `VgpuConfig: json: cannot unmarshal string into Go struct field VgpuConfig.taskPriority of type int32`,
		},
		{
			name:    "fraction for integer",
			in:      vgpuJSON(`"logLevel":1.5`),
			wantErr: `VgpuConfig: json: cannot unmarshal number 1.5 into Go struct field VgpuConfig.logLevel of type int32`,
		},
		{
			name:    "integer overflow",
			in:      vgpuJSON(`"logLevel":4294967296`),
			wantErr: `cannot unmarshal number 4294967296 into Go struct field VgpuConfig.logLevel of type int32`,
		},
		{
			name:    "number for string",
			in:      vgpuJSON(`"enforcement":0`),
			wantErr: `cannot unmarshal number into Go struct field VgpuConfig.enforcement of type v1alpha1.Enforcement`,
		},
		{
			name:    "boolean for string",
			in:      vgpuJSON(`"enforcement":false`),
			wantErr: `cannot unmarshal bool into Go struct field VgpuConfig.enforcement of type v1alpha1.Enforcement`,
		},

		// apiVersion and kind.
		{
			name:    "unknown kind",
			in:      `{` + apiVersion + `,"kind":"MigConfig"}`,
			wantErr: `kind: Unsupported value: "MigConfig": supported values: "GpuConfig", "VgpuConfig", "ComputeDomainChannelConfig"`,
		},
		{
			name:    "kind is case-sensitive",
			in:      `{` + apiVersion + `,"kind":"vgpuConfig"}`,
			wantErr: `kind: Unsupported value: "vgpuConfig"`,
		},
		{
			name:    "meta kinds are not config kinds",
			in:      `{` + apiVersion + `,"kind":"Status"}`,
			wantErr: `kind: Unsupported value: "Status"`,
		},
		{
			name:    "missing kind",
			in:      `{` + apiVersion + `,"taskPriority":1}`,
			wantErr: `kind: Required value`,
		},
		{
			name:    "other version",
			in:      `{"apiVersion":"gpu.facet.dev/v1","kind":"VgpuConfig"}`,
			wantErr: `apiVersion: Unsupported value: "gpu.facet.dev/v1": supported values: "gpu.facet.dev/v1alpha1"`,
		},
		{
			name:    "other group",
			in:      `{"apiVersion":"gpu.resource.example.com/v1alpha1","kind":"VgpuConfig"}`,
			wantErr: `apiVersion: Unsupported value: "gpu.resource.example.com/v1alpha1"`,
		},
		{
			name:    "group without version",
			in:      `{"apiVersion":"gpu.facet.dev","kind":"VgpuConfig"}`,
			wantErr: `apiVersion: Unsupported value: "gpu.facet.dev"`,
		},
		{
			name:    "missing apiVersion",
			in:      `{"kind":"VgpuConfig"}`,
			wantErr: `apiVersion: Required value: must be gpu.facet.dev/v1alpha1`,
		},
		{
			name:    "missing apiVersion and kind",
			in:      `{"taskPriority":1}`,
			wantErr: `[apiVersion: Required value: must be gpu.facet.dev/v1alpha1, kind: Required value: must be one of GpuConfig, VgpuConfig, ComputeDomainChannelConfig]`,
		},
		{
			name:    "apiVersion of the wrong type",
			in:      `{"apiVersion":1,"kind":"VgpuConfig"}`,
			wantErr: `parameters: couldn't get version/kind; json parse error`,
		},

		// Syntax.
		{
			name:    "malformed JSON",
			in:      `{` + apiVersion + `,"kind":"VgpuConfig",}`,
			wantErr: `parameters: couldn't get version/kind; json parse error`,
		},
		{
			name:    "truncated JSON",
			in:      `{` + apiVersion + `,"kind":"VgpuConfig","logLevel":`,
			wantErr: `parameters: couldn't get version/kind; json parse error`,
		},
		{
			name:    "YAML is rejected",
			in:      "apiVersion: gpu.facet.dev/v1alpha1\nkind: VgpuConfig\ntaskPriority: 1\n",
			wantErr: `parameters: must be a JSON object (YAML is not accepted)`,
		},
		{
			name:    "YAML flow mapping is rejected",
			in:      `{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig}`,
			wantErr: `parameters: couldn't get version/kind; json parse error`,
		},
		{
			name:    "JSON array",
			in:      `[` + vgpuJSON("") + `]`,
			wantErr: `parameters: must be a JSON object`,
		},
		{
			name:    "JSON null",
			in:      `null`,
			wantErr: `parameters: must be a JSON object`,
		},
		{
			name:    "empty",
			in:      "",
			wantErr: `parameters: Required value`,
		},
		{
			name:    "blank",
			in:      " \n\t",
			wantErr: `parameters: Required value`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Decode(%s) = %#v, want an error containing %q", tc.in, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode(%s) error:\n  %v\nwant it to contain:\n  %s", tc.in, err, tc.wantErr)
				}
				if got != nil {
					t.Fatalf("Decode(%s) returned %#v along with its error", tc.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode(%s): %v", tc.in, err)
			}
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("Decode(%s) = %#v, want %#v", tc.in, got, tc.want)
			}
		})
	}
}

// An error naming several fields is a field.ErrorList aggregate, so a
// webhook can turn it back into field errors.
func TestDecodeErrorIsFieldErrorList(t *testing.T) {
	_, err := Decode([]byte(vgpuJSON(`"taskPriority":2,"logLevel":9`)))
	if err == nil {
		t.Fatal("want an error")
	}
	if !strings.HasPrefix(err.Error(), "VgpuConfig: [taskPriority: ") {
		t.Fatalf("error %q", err)
	}
}

// Decoding then encoding gives the same JSON: the wire names are the
// documented ones, and unset fields are omitted.
func TestRoundTrip(t *testing.T) {
	for _, in := range []string{
		`{"kind":"VgpuConfig",` + apiVersion + `}`,
		`{"kind":"VgpuConfig",` + apiVersion + `,"enforcement":"disabled","coreUtilizationPolicy":"disable","taskPriority":0,"logLevel":0}`,
		`{"kind":"GpuConfig",` + apiVersion + `}`,
	} {
		cfg, err := Decode([]byte(in))
		if err != nil {
			t.Fatalf("Decode(%s): %v", in, err)
		}
		var b strings.Builder
		if err := decoder.Encode(cfg, &b); err != nil {
			t.Fatalf("Encode: %v", err)
		}
		if got := strings.TrimSpace(b.String()); got != in {
			t.Errorf("round trip of %s gave %s", in, got)
		}
	}
}
