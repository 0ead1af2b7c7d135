package v1alpha1

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func vgpu(enforcement *Enforcement, policy *CoreUtilizationPolicy, priority, logLevel *int32) *VgpuConfig {
	c := NewVgpuConfig()
	c.Enforcement, c.CoreUtilizationPolicy, c.TaskPriority, c.LogLevel = enforcement, policy, priority, logLevel
	return c
}

func TestDefault(t *testing.T) {
	tests := []struct {
		name string
		in   *VgpuConfig
		want *VgpuConfig
	}{
		{
			name: "empty gets HAMi-core's own defaults",
			in:   &VgpuConfig{},
			want: vgpu(ptr.To(EnforcementEnabled), ptr.To(CoreUtilizationPolicyDefault), ptr.To[int32](1), ptr.To[int32](2)),
		},
		{
			name: "set fields, zero values included, are kept",
			in:   vgpu(ptr.To(EnforcementDisabled), ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](0)),
			want: vgpu(ptr.To(EnforcementDisabled), ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](0)),
		},
		{
			name: "partly set",
			in:   vgpu(nil, ptr.To(CoreUtilizationPolicyDisable), nil, ptr.To[int32](4)),
			want: vgpu(ptr.To(EnforcementEnabled), ptr.To(CoreUtilizationPolicyDisable), ptr.To[int32](1), ptr.To[int32](4)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.DeepCopy()
			got.Default()
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("Default() = %+v, want %+v", got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("defaulted config does not validate: %v", err)
			}
			again := got.DeepCopy()
			again.Default()
			if !equality.Semantic.DeepEqual(got, again) {
				t.Fatal("Default is not idempotent")
			}
		})
	}

	g := &GpuConfig{}
	g.Default()
	if !equality.Semantic.DeepEqual(g, NewGpuConfig()) || g.Validate() != nil {
		t.Fatalf("GpuConfig.Default() = %+v", g)
	}
}

func TestValidateAcceptsEveryDocumentedValue(t *testing.T) {
	for _, e := range []Enforcement{EnforcementEnabled, EnforcementDisabled} {
		for _, p := range []CoreUtilizationPolicy{CoreUtilizationPolicyDefault, CoreUtilizationPolicyForce, CoreUtilizationPolicyDisable} {
			for prio := TaskPriorityHigh; prio <= TaskPriorityLow; prio++ {
				for lvl := MinLogLevel; lvl <= MaxLogLevel; lvl++ {
					if err := vgpu(&e, &p, &prio, &lvl).Validate(); err != nil {
						t.Errorf("%s %s %d %d: %v", e, p, prio, lvl, err)
					}
				}
			}
		}
	}
	if err := (&VgpuConfig{}).Validate(); err != nil {
		t.Errorf("empty config: %v", err)
	}
}

func TestMerge(t *testing.T) {
	class := vgpu(nil, ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](1), ptr.To[int32](3))
	claim := vgpu(nil, nil, ptr.To[int32](0), nil)
	tests := []struct {
		name string
		in   []*VgpuConfig
		want *VgpuConfig
	}{
		{"nothing", nil, NewVgpuConfig()},
		{"nil configs are skipped", []*VgpuConfig{nil, class, nil}, class},
		{"later set field wins, unset field keeps earlier value", []*VgpuConfig{class, claim},
			vgpu(nil, ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](3))},
		{"order matters", []*VgpuConfig{claim, class}, class},
		{"a zero value overrides", []*VgpuConfig{class, vgpu(nil, nil, nil, ptr.To[int32](0))},
			vgpu(nil, ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](1), ptr.To[int32](0))},
		{"opt-out from the last config", []*VgpuConfig{class, vgpu(ptr.To(EnforcementDisabled), nil, nil, nil)},
			vgpu(ptr.To(EnforcementDisabled), ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](1), ptr.To[int32](3))},
		{"opt back in", []*VgpuConfig{vgpu(ptr.To(EnforcementDisabled), nil, nil, nil), vgpu(ptr.To(EnforcementEnabled), nil, nil, nil)},
			vgpu(ptr.To(EnforcementEnabled), nil, nil, nil)},
		{"type meta of the inputs is not copied", []*VgpuConfig{{TaskPriority: ptr.To[int32](1)}},
			vgpu(nil, nil, ptr.To[int32](1), nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]*VgpuConfig, len(tc.in))
			for i, c := range tc.in {
				before[i] = c.DeepCopy()
			}
			got := Merge(tc.in...)
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("Merge = %+v, want %+v", got, tc.want)
			}
			if !equality.Semantic.DeepEqual(tc.in, before) {
				t.Fatal("Merge modified its arguments")
			}
			// The result shares no memory with the arguments.
			if got.TaskPriority != nil {
				*got.TaskPriority = 99
			}
			if got.CoreUtilizationPolicy != nil {
				*got.CoreUtilizationPolicy = "x"
			}
			if !equality.Semantic.DeepEqual(tc.in, before) {
				t.Fatal("Merge result aliases its arguments")
			}
		})
	}
}

func TestPartitioning(t *testing.T) {
	mps, sliced := ptr.To(PartitioningMPS), ptr.To(PartitioningTimeSliced)
	tests := []struct {
		name      string
		in        []*VgpuConfig
		available bool
		want      Partitioning
	}{
		{"unset on an MPS node", nil, true, PartitioningMPS},
		{"unset without MPS", nil, false, PartitioningTimeSliced},
		{"class asks time-sliced", []*VgpuConfig{{Partitioning: sliced}}, true, PartitioningTimeSliced},
		{"claim overrides the class", []*VgpuConfig{{Partitioning: sliced}, {Partitioning: mps}}, true, PartitioningMPS},
		{"mps asked without MPS stays asked", []*VgpuConfig{{Partitioning: mps}}, false, PartitioningMPS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Merge(tc.in...)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := c.PartitioningFor(tc.available); got != tc.want {
				t.Fatalf("PartitioningFor(%v) = %q, want %q", tc.available, got, tc.want)
			}
		})
	}
	if got := (*VgpuConfig)(nil).PartitioningFor(true); got != PartitioningMPS {
		t.Fatalf("nil config: %q", got)
	}
}

func TestHAMiCoreEnv(t *testing.T) {
	tests := []struct {
		name string
		in   *VgpuConfig
		want []string
	}{
		{"nil config: defaults", nil,
			[]string{"GPU_CORE_UTILIZATION_POLICY=default", "CUDA_TASK_PRIORITY=1", "LIBCUDA_LOG_LEVEL=2"}},
		{"unset fields: defaults", &VgpuConfig{},
			[]string{"GPU_CORE_UTILIZATION_POLICY=default", "CUDA_TASK_PRIORITY=1", "LIBCUDA_LOG_LEVEL=2"}},
		{"set fields", vgpu(ptr.To(EnforcementEnabled), ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](4)),
			[]string{"GPU_CORE_UTILIZATION_POLICY=force", "CUDA_TASK_PRIORITY=0", "LIBCUDA_LOG_LEVEL=4"}},
		{"opt-out: no variables at all", vgpu(ptr.To(EnforcementDisabled), ptr.To(CoreUtilizationPolicyForce), nil, nil), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before *VgpuConfig
			if tc.in != nil {
				before = tc.in.DeepCopy()
			}
			if got := tc.in.HAMiCoreEnv(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("HAMiCoreEnv() = %q, want %q", got, tc.want)
			}
			if tc.in != nil && !equality.Semantic.DeepEqual(tc.in, before) {
				t.Fatal("HAMiCoreEnv modified the config")
			}
		})
	}
}

func TestEnforcementEnabled(t *testing.T) {
	for _, tc := range []struct {
		in   *VgpuConfig
		want bool
	}{
		{nil, true},
		{&VgpuConfig{}, true},
		{vgpu(ptr.To(EnforcementEnabled), nil, nil, nil), true},
		{vgpu(ptr.To(EnforcementDisabled), nil, nil, nil), false},
	} {
		if got := tc.in.EnforcementEnabled(); got != tc.want {
			t.Errorf("EnforcementEnabled(%+v) = %v", tc.in, got)
		}
	}
}

// TestDeepCopyCoversEveryField fails when a field is added to VgpuConfig and
// the generated deep copy is stale (run make generate): every pointer field of a full
// config must be copied to a different address with the same value.
func TestDeepCopyCoversEveryField(t *testing.T) {
	in := vgpu(ptr.To(EnforcementDisabled), ptr.To(CoreUtilizationPolicyForce), ptr.To[int32](0), ptr.To[int32](4))
	in.Memory, in.Cores = ptr.To(resource.MustParse("3000Mi")), ptr.To[int32](50)
	in.Partitioning = ptr.To(PartitioningTimeSliced)
	v := reflect.ValueOf(in).Elem()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Pointer && f.IsNil() {
			t.Fatalf("test config leaves %s unset; set every field", v.Type().Field(i).Name)
		}
	}
	out := in.DeepCopyObject().(*VgpuConfig)
	if !equality.Semantic.DeepEqual(in, out) {
		t.Fatalf("copy %+v differs from %+v", out, in)
	}
	o := reflect.ValueOf(out).Elem()
	for i := 0; i < v.NumField(); i++ {
		switch f := v.Field(i); f.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice:
			if f.Pointer() == o.Field(i).Pointer() {
				t.Errorf("DeepCopy shares field %s", v.Type().Field(i).Name)
			}
		case reflect.Struct, reflect.String, reflect.Int32:
		default:
			t.Errorf("field %s of kind %s: teach this test about it", v.Type().Field(i).Name, f.Kind())
		}
	}

	if (*VgpuConfig)(nil).DeepCopy() != nil || (*GpuConfig)(nil).DeepCopy() != nil {
		t.Error("DeepCopy of nil is not nil")
	}
	g := NewGpuConfig()
	if gc := g.DeepCopyObject(); gc == runtime.Object(g) || !equality.Semantic.DeepEqual(gc, g) {
		t.Error("GpuConfig.DeepCopyObject")
	}
}

// The types are registered under gpu.facet.dev/v1alpha1 and only there.
func TestScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&VgpuConfig{}, &GpuConfig{}, &ComputeDomainChannelConfig{}} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0].GroupVersion() != SchemeGroupVersion {
			t.Errorf("ObjectKinds(%T) = %v, %v", obj, gvks, err)
		}
	}
	if n := len(s.AllKnownTypes()); n != 3 {
		t.Errorf("scheme has %d types, want 3: %v", n, s.AllKnownTypes())
	}
	// The served kinds stay out of the opaque configs' scheme.
	for _, obj := range []runtime.Object{&ComputeDomain{}, &ComputeDomainList{}} {
		if _, _, err := s.ObjectKinds(obj); err == nil {
			t.Errorf("opaque config scheme knows the served kind %T", obj)
		}
	}
	served := runtime.NewScheme()
	if err := AddServedToScheme(served); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&ComputeDomain{}, &ComputeDomainList{}} {
		gvks, _, err := served.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0].GroupVersion() != SchemeGroupVersion {
			t.Errorf("served ObjectKinds(%T) = %v, %v", obj, gvks, err)
		}
	}
}

func TestLimit(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name             string
		memory           string
		cores            *int32
		inMem, inCores   int64
		wantMem, wantCor int64
		wantErr          string
	}{
		{name: "nothing set", inMem: 20 * gib, inCores: 25, wantMem: 20 * gib, wantCor: 25},
		{name: "HAMi's 3000 MiB / 10 % on a 20 GiB / 25 % slot", memory: "3000Mi", cores: ptr.To[int32](10), inMem: 20 * gib, inCores: 25, wantMem: 3000 << 20, wantCor: 10},
		{name: "rounded down to MiB", memory: "3000.5Mi", inMem: 20 * gib, inCores: 25, wantMem: 3000 << 20, wantCor: 25},
		{name: "more memory than the slot", memory: "21Gi", inMem: 20 * gib, inCores: 25, wantErr: "memory: Invalid value: \"21Gi\": more than the 20480 MiB the device gives"},
		{name: "more cores than the slot", cores: ptr.To[int32](30), inMem: 20 * gib, inCores: 25, wantErr: "cores: Invalid value: 30: more than the 25% the device gives"},
		{name: "cores on a best-effort share", cores: ptr.To[int32](30), inMem: 20 * gib, inCores: 0, wantMem: 20 * gib, wantCor: 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewVgpuConfig()
			if tc.memory != "" {
				c.Memory = ptr.To(resource.MustParse(tc.memory))
			}
			c.Cores = tc.cores
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			mem, cores, err := c.Limit(tc.inMem, tc.inCores)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || mem != tc.wantMem || cores != tc.wantCor {
				t.Errorf("got %d %d %v, want %d %d", mem, cores, err, tc.wantMem, tc.wantCor)
			}
		})
	}
	bad := NewVgpuConfig()
	bad.Memory, bad.Cores = ptr.To(resource.MustParse("100Ki")), ptr.To[int32](0)
	if err := bad.Validate(); err == nil || err.Error() != `[memory: Invalid value: "100Ki": must be at least 1Mi, cores: Invalid value: 0: must be between 1 and 100, inclusive]` {
		t.Errorf("Validate: %v", err)
	}
}
