package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// stockClasses are Facet's classes as a cluster without DRAExtendedResource
// stores them: no extendedResourceName.
var stockClasses = []string{"gpu.facet.dev", "mig.facet.dev", "mig-1g.10gb.facet.dev", "mig-1g.10gb.me.facet.dev", "vgpu-slot.facet.dev"}

func deviceClass(name, extendedResourceName string) *resourceapi.DeviceClass {
	c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if extendedResourceName != "" {
		c.Spec.ExtendedResourceName = &extendedResourceName
	}
	return c
}

func newTestMutator(t *testing.T, mode RewriteMode, classes []*resourceapi.DeviceClass, objects ...runtime.Object) (*Mutator, *fake.Clientset) {
	t.Helper()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range classes {
		if err := indexer.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	client := fake.NewClientset(objects...)
	m, err := NewMutator(ktesting.NewLogger(t, ktesting.NewConfig()), MutatorOptions{
		Map: DefaultExtendedResourceMap(), RewriteMode: mode,
		Classes: resourcelisters.NewDeviceClassLister(indexer), Client: client,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, client
}

// facetOn are Facet's classes as a cluster with DRAExtendedResource keeps
// them (deployments/deviceclasses.yaml), and mig-3g.40gb.facet.dev, a
// class an admin installed without extendedResourceName.
func facetOn() []*resourceapi.DeviceClass {
	return []*resourceapi.DeviceClass{
		deviceClass("gpu.facet.dev", "nvidia.com/gpu"),
		deviceClass("mig.facet.dev", ""),
		deviceClass("mig-1g.10gb.facet.dev", "nvidia.com/mig-1g.10gb"),
		deviceClass("mig-1g.10gb.me.facet.dev", "nvidia.com/mig-1g.10gb.me"),
		deviceClass("mig-3g.40gb.facet.dev", ""),
		deviceClass("vgpu-slot.facet.dev", ""),
	}
}

func stock() []*resourceapi.DeviceClass {
	var out []*resourceapi.DeviceClass
	for _, n := range stockClasses {
		out = append(out, deviceClass(n, ""))
	}
	return out
}

// res is a container's limits (and, as the API server defaults them,
// equal requests) from "name=value" pairs.
func res(pairs ...string) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	for _, p := range pairs {
		n, v, _ := strings.Cut(p, "=")
		r.Limits[corev1.ResourceName(n)] = resource.MustParse(v)
		r.Requests[corev1.ResourceName(n)] = resource.MustParse(v)
	}
	return r
}

func testPod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func ctr(name string, r corev1.ResourceRequirements) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox", Resources: r}
}

func podRequest(t *testing.T, pod *corev1.Pod, op admissionv1.Operation) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Operation: op, Namespace: "ns", Name: pod.Name,
		Object: runtime.RawExtension{Raw: raw},
	}
}

// applyPatch applies a response's patch as the API server does.
func applyPatch(t *testing.T, pod *corev1.Pod, resp *admissionv1.AdmissionResponse) *corev1.Pod {
	t.Helper()
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v", resp.PatchType)
	}
	raw, _ := json.Marshal(pod)
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("decode patch %s: %v", resp.Patch, err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("apply patch %s: %v", resp.Patch, err)
	}
	var patched corev1.Pod
	if err := json.Unmarshal(out, &patched); err != nil {
		t.Fatal(err)
	}
	return &patched
}

// wantClaim is what one container gets: a claim entry and its template's
// one request.
type wantClaim struct {
	container string // "c/<name>" or "i/<name>"
	claim     string
	class     string
	count     int64
	selectors []string
}

func TestMutatePods(t *testing.T) {
	memSel := func(mi string) string {
		return `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("` + mi + `")) >= 0`
	}
	coreSel := func(pct string) string {
		return `device.capacity["gpu.facet.dev"].cores.compareTo(quantity("` + pct + `")) >= 0`
	}
	withClaims := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "own"}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "own", ResourceClaimName: ref("own-claim")}}
		return p
	}
	withInit := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.InitContainers = []corev1.Container{ctr("setup", res("nvidia.com/gpu=1"))}
		return p
	}
	tests := []struct {
		name string
		// classes are the cluster's DeviceClasses; nil is stock().
		classes []*resourceapi.DeviceClass
		pod     *corev1.Pod
		want    []wantClaim
		// kept are resources that must stay in the first container; no
		// other container keeps them either.
		kept []corev1.ResourceName
	}{
		{
			name: "whole GPUs",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpu=2", "cpu=500m", "memory=1Gi"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "gpu.facet.dev", 2, nil}},
			kept: []corev1.ResourceName{"cpu", "memory"},
		},
		{
			name: "a MIG profile",
			pod:  testPod(ctr("cuda", res("nvidia.com/mig-1g.10gb=3"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "mig-1g.10gb.facet.dev", 3, nil}},
		},
		{
			name: "a +me MIG profile, spelt .me as the device plugin does",
			pod:  testPod(ctr("cuda", res("nvidia.com/mig-1g.10gb.me=1"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "mig-1g.10gb.me.facet.dev", 1, nil}},
		},
		{
			name: "Volcano vGPUs",
			pod:  testPod(ctr("cuda", res("volcano.sh/vgpu-number=2", "volcano.sh/vgpu-memory=4000", "volcano.sh/vgpu-cores=30"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 2, []string{memSel("4000Mi"), coreSel("30")}}},
		},
		{
			name: "Volcano vGPU without a size: any slot",
			pod:  testPod(ctr("cuda", res("volcano.sh/vgpu-number=1"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 1, nil}},
		},
		{
			name: "HAMi: nvidia.com/gpu with gpumem counts vGPUs",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpu=1", "nvidia.com/gpumem=8000"))),
			want: []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 1, []string{memSel("8000Mi")}}},
		},
		{
			name: "HAMi: gpucores alone is one vGPU; 0 cores selects nothing",
			pod:  testPod(ctr("a", res("nvidia.com/gpucores=50")), ctr("b", res("nvidia.com/gpu=2", "nvidia.com/gpucores=0"))),
			want: []wantClaim{
				{"c/a", "facet-c0-0", "vgpu-slot.facet.dev", 1, []string{coreSel("50")}},
				{"c/b", "facet-c1-0", "vgpu-slot.facet.dev", 2, nil},
			},
		},
		{
			name: "two resources in one container: two claims",
			pod:  testPod(ctr("cuda", res("nvidia.com/mig-1g.10gb=1", "nvidia.com/gpu=1"))),
			want: []wantClaim{
				{"c/cuda", "facet-c0-0", "gpu.facet.dev", 1, nil},
				{"c/cuda", "facet-c0-1", "mig-1g.10gb.facet.dev", 1, nil},
			},
		},
		{
			name: "init containers too, and existing claims are kept",
			pod:  withInit(withClaims(testPod(ctr("cuda", res("nvidia.com/gpu=1"))))),
			want: []wantClaim{
				{"i/setup", "facet-i0-0", "gpu.facet.dev", 1, nil},
				{"c/cuda", "facet-c0-0", "gpu.facet.dev", 1, nil},
			},
		},
		{
			name: "no extended resources: no patch",
			pod:  testPod(ctr("web", res("cpu=1"))),
		},
		{
			name: "nvidia.com/gpu: 0 asks for nothing: no patch",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpu=0"))),
			kept: []corev1.ResourceName{"nvidia.com/gpu"},
		},
		{
			name: "another vendor's resource is not Facet's business",
			pod:  testPod(ctr("x", res("example.com/fpga=1"))),
			kept: []corev1.ResourceName{"example.com/fpga"},
		},
		// DRAExtendedResource on (1.36 and later): what a class maps is the
		// scheduler's, the rest is rewritten.
		{
			name:    "gate on: whole GPUs are left to the scheduler",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("nvidia.com/gpu=2"))),
			kept:    []corev1.ResourceName{"nvidia.com/gpu"},
		},
		{
			name:    "gate on: a mapped MIG profile is left to the scheduler",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("nvidia.com/mig-1g.10gb.me=1"))),
			kept:    []corev1.ResourceName{"nvidia.com/mig-1g.10gb.me"},
		},
		{
			name:    "gate on: a MIG profile whose class maps nothing is rewritten",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("nvidia.com/mig-3g.40gb=1"))),
			want:    []wantClaim{{"c/cuda", "facet-c0-0", "mig-3g.40gb.facet.dev", 1, nil}},
		},
		{
			name:    "gate on: Volcano vGPUs are rewritten, no class can map a size",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("volcano.sh/vgpu-number=1", "volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"))),
			want:    []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 1, []string{memSel("2000Mi"), coreSel("20")}}},
		},
		{
			name:    "gate on: HAMi vGPUs are rewritten whole, their mapped nvidia.com/gpu count with them",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("nvidia.com/gpu=1", "nvidia.com/gpumem=3000", "nvidia.com/gpucores=50"))),
			want:    []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 1, []string{memSel("3000Mi"), coreSel("50")}}},
		},
		{
			name:    "gate on: whole GPUs left, another container's Volcano vGPU rewritten",
			classes: facetOn(),
			pod:     testPod(ctr("train", res("nvidia.com/gpu=1", "cpu=1")), ctr("infer", res("volcano.sh/vgpu-number=1", "volcano.sh/vgpu-memory=4000"))),
			want:    []wantClaim{{"c/infer", "facet-c1-0", "vgpu-slot.facet.dev", 1, []string{memSel("4000Mi")}}},
			kept:    []corev1.ResourceName{"nvidia.com/gpu", "cpu"},
		},
		{
			name:    "gate on: in one container, the mapped profile left and the vGPU rewritten",
			classes: facetOn(),
			pod:     testPod(ctr("cuda", res("nvidia.com/mig-1g.10gb=1", "volcano.sh/vgpu-number=1", "volcano.sh/vgpu-cores=30"))),
			want:    []wantClaim{{"c/cuda", "facet-c0-0", "vgpu-slot.facet.dev", 1, []string{coreSel("30")}}},
			kept:    []corev1.ResourceName{"nvidia.com/mig-1g.10gb"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			classes := tc.classes
			if classes == nil {
				classes = stock()
			}
			m, client := newTestMutator(t, RewriteAuto, classes)
			resp := m.Review(context.Background(), podRequest(t, tc.pod, admissionv1.Create))
			if !resp.Allowed {
				t.Fatalf("denied: %s", resp.Result.Message)
			}
			if len(tc.want) == 0 {
				if resp.Patch != nil {
					t.Fatalf("patched, want no patch: %s", resp.Patch)
				}
				return
			}
			pod := applyPatch(t, tc.pod, resp)
			for _, n := range tc.kept {
				if _, ok := pod.Spec.Containers[0].Resources.Limits[n]; !ok {
					t.Errorf("limit %s was removed: %v", n, pod.Spec.Containers[0].Resources.Limits)
				}
			}
			mayKeep := func(n corev1.ResourceName) bool {
				return n == "cpu" || n == "memory" || slices.Contains(tc.kept, n)
			}
			for i, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
				for j, c := range list {
					first := i == 1 && j == 0
					for n := range c.Resources.Limits {
						if !mayKeep(n) || (!first && slices.Contains(tc.kept, n)) {
							t.Errorf("container %s still has limit %s", c.Name, n)
						}
					}
					for n := range c.Resources.Requests {
						if !mayKeep(n) || (!first && slices.Contains(tc.kept, n)) {
							t.Errorf("container %s still has request %s", c.Name, n)
						}
					}
				}
			}
			if pod.Annotations[RewrittenAnnotation] == "" {
				t.Errorf("no %s annotation", RewrittenAnnotation)
			}
			for _, w := range tc.want {
				kind, name, _ := strings.Cut(w.container, "/")
				list := pod.Spec.Containers
				if kind == "i" {
					list = pod.Spec.InitContainers
				}
				var c *corev1.Container
				for i := range list {
					if list[i].Name == name {
						c = &list[i]
					}
				}
				if c == nil || !containsClaim(c.Resources.Claims, w.claim) {
					t.Errorf("container %s does not use claim %s: %+v", w.container, w.claim, c)
				}
				var tmplName string
				for _, rc := range pod.Spec.ResourceClaims {
					if rc.Name == w.claim && rc.ResourceClaimTemplateName != nil {
						tmplName = *rc.ResourceClaimTemplateName
					}
				}
				if tmplName == "" {
					t.Fatalf("no resourceClaims entry %s from a template: %+v", w.claim, pod.Spec.ResourceClaims)
				}
				tmpl, err := client.ResourceV1().ResourceClaimTemplates("ns").Get(context.Background(), tmplName, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("template %s: %v", tmplName, err)
				}
				if tmpl.Labels[ManagedByLabel] != ManagedByValue || tmpl.Spec.Labels[ManagedByLabel] != ManagedByValue {
					t.Errorf("template %s labels %v, claim labels %v", tmplName, tmpl.Labels, tmpl.Spec.Labels)
				}
				reqs := tmpl.Spec.Spec.Devices.Requests
				if len(reqs) != 1 || reqs[0].Exactly == nil {
					t.Fatalf("template %s requests %+v", tmplName, reqs)
				}
				ex := reqs[0].Exactly
				var sels []string
				for _, s := range ex.Selectors {
					sels = append(sels, s.CEL.Expression)
				}
				if ex.DeviceClassName != w.class || ex.Count != w.count || ex.AllocationMode != resourceapi.DeviceAllocationModeExactCount || strings.Join(sels, " && ") != strings.Join(w.selectors, " && ") {
					t.Errorf("template %s: %s x %d (%s) selectors %q, want %s x %d selectors %q", tmplName, ex.DeviceClassName, ex.Count, ex.AllocationMode, sels, w.class, w.count, w.selectors)
				}
				// A vGPU size asked for becomes the slot's HAMi-core limits,
				// through a VgpuConfig the plugin decodes strictly.
				var limits []string
				for _, s := range w.selectors {
					if _, rest, ok := strings.Cut(s, `quantity("`); ok {
						v, _, _ := strings.Cut(rest, `"`)
						if strings.Contains(s, ".memory.") {
							limits = append(limits, `"memory":"`+v+`"`)
						} else {
							limits = append(limits, `"cores":`+v)
						}
					}
				}
				cfgs := tmpl.Spec.Spec.Devices.Config
				if len(limits) == 0 != (len(cfgs) == 0) {
					t.Fatalf("template %s: configs %+v for limits %v", tmplName, cfgs, limits)
				}
				if len(cfgs) > 0 {
					raw := string(cfgs[0].Opaque.Parameters.Raw)
					if _, err := configapi.Decode(cfgs[0].Opaque.Parameters.Raw); err != nil || cfgs[0].Opaque.Driver != "gpu.facet.dev" || len(cfgs[0].Requests) != 1 {
						t.Errorf("template %s: config %s for %v: %v", tmplName, raw, cfgs[0].Requests, err)
					}
					for _, l := range limits {
						if !strings.Contains(raw, l) {
							t.Errorf("template %s: config %s lacks %s", tmplName, raw, l)
						}
					}
				}
			}
			if got, want := len(pod.Spec.ResourceClaims), len(tc.want)+len(tc.pod.Spec.ResourceClaims); got != want {
				t.Errorf("%d resourceClaims, want %d", got, want)
			}

			// Reinvocation (reinvocationPolicy IfNeeded) and a pod
			// re-created from the patched spec change nothing more.
			again := m.Review(context.Background(), podRequest(t, pod, admissionv1.Create))
			if !again.Allowed || again.Patch != nil {
				t.Errorf("second review of the patched pod: allowed %v, patch %s", again.Allowed, again.Patch)
			}
		})
	}
}

func containsClaim(claims []corev1.ResourceClaim, name string) bool {
	for _, c := range claims {
		if c.Name == name {
			return true
		}
	}
	return false
}

func ref[T any](v T) *T { return &v }

func TestMutatePodsDenied(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{
			name: "a fraction of a GPU",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpu=1500m"))),
			want: []string{`container "cuda": nvidia.com/gpu: 1500m is not a whole number`},
		},
		{
			name: "requests that differ from limits",
			pod: testPod(ctr("cuda", corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")},
				Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			})),
			want: []string{`container "cuda": nvidia.com/gpu: requests (1) differ from limits (2)`},
		},
		{
			name: "a MIG profile without a class",
			pod:  testPod(ctr("cuda", res("nvidia.com/mig-9g.99gb=1"))),
			want: []string{`container "cuda": nvidia.com/mig-9g.99gb: there is no DeviceClass mig-9g.99gb.facet.dev`},
		},
		{
			name: "a percentage of memory",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpu=1", "nvidia.com/gpumem-percentage=50"))),
			want: []string{`container "cuda": nvidia.com/gpumem-percentage: a percentage of a GPU's memory has no fixed-size vGPU slot to map to; ask for nvidia.com/gpumem in MiB instead`},
		},
		{
			name: "zero vGPUs of a size",
			pod:  testPod(ctr("cuda", res("volcano.sh/vgpu-number=0", "volcano.sh/vgpu-memory=1000"))),
			want: []string{`container "cuda": volcano.sh/vgpu-number: is 0, but volcano.sh/vgpu-memory asks for a vGPU size`},
		},
		{
			name: "memory given twice",
			pod:  testPod(ctr("cuda", res("nvidia.com/gpumem=1000", "nvidia.com/gpumem-percentage=10"))),
			want: []string{`container "cuda": nvidia.com/gpumem-percentage: conflicts with nvidia.com/gpumem`},
		},
		{
			name: "more than all the cores",
			pod:  testPod(ctr("cuda", res("volcano.sh/vgpu-number=1", "volcano.sh/vgpu-cores=150"))),
			want: []string{`container "cuda": volcano.sh/vgpu-cores: 150 is more than 100 percent`},
		},
		{
			name: "every container's problem in one refusal",
			pod:  testPod(ctr("a", res("nvidia.com/gpu=500m")), ctr("b", res("nvidia.com/mig-0g.0gb=1"))),
			want: []string{`container "a": nvidia.com/gpu: 500m is not a whole number`, `; container "b": nvidia.com/mig-0g.0gb: there is no DeviceClass`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, client := newTestMutator(t, RewriteAuto, stock())
			resp := m.Review(context.Background(), podRequest(t, tc.pod, admissionv1.Create))
			if resp.Allowed {
				t.Fatalf("allowed (patch %s), want denied", resp.Patch)
			}
			if resp.Result.Code != http.StatusUnprocessableEntity || resp.Result.Reason != metav1.StatusReasonInvalid {
				t.Errorf("code %d reason %s", resp.Result.Code, resp.Result.Reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q does not contain %q", resp.Result.Message, w)
				}
			}
			if l, _ := client.ResourceV1().ResourceClaimTemplates("ns").List(context.Background(), metav1.ListOptions{}); len(l.Items) > 0 {
				t.Errorf("a denied pod left %d templates", len(l.Items))
			}
		})
	}
}

func TestMutatePodsGate(t *testing.T) {
	gateOn := facetOn()
	gpuPod := testPod(ctr("cuda", res("nvidia.com/gpu=1")))
	volcanoPod := testPod(ctr("cuda", res("volcano.sh/vgpu-number=1", "volcano.sh/vgpu-memory=2000")))
	for _, tc := range []struct {
		name    string
		mode    RewriteMode
		classes []*resourceapi.DeviceClass
		pod     *corev1.Pod
		mutated bool
	}{
		{"auto, gate off: rewritten", RewriteAuto, stock(), gpuPod, true},
		{"auto, gate on: a mapped resource is left to the scheduler", RewriteAuto, gateOn, gpuPod, false},
		{"auto, gate on: a vGPU size is rewritten", RewriteAuto, gateOn, volcanoPod, true},
		{"auto, only another driver's class keeps the field: nvidia.com/gpu is nobody's, rewritten", RewriteAuto, append(stock(), deviceClass("gpu.example.com", "example.com/gpu")), gpuPod, true},
		{"always, gate on: rewritten", RewriteAlways, gateOn, gpuPod, true},
		{"never, gate off: left alone", RewriteNever, stock(), gpuPod, false},
		{"never, gate on: a vGPU size is left alone too", RewriteNever, gateOn, volcanoPod, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTestMutator(t, tc.mode, tc.classes)
			resp := m.Review(context.Background(), podRequest(t, tc.pod, admissionv1.Create))
			if !resp.Allowed {
				t.Fatalf("denied: %s", resp.Result.Message)
			}
			if got := resp.Patch != nil; got != tc.mutated {
				t.Errorf("mutated %v, want %v (patch %s)", got, tc.mutated, resp.Patch)
			}
		})
	}

	t.Run("gate on: a malformed mapped resource is left to the API server", func(t *testing.T) {
		m, _ := newTestMutator(t, RewriteAuto, gateOn)
		resp := m.Review(context.Background(), podRequest(t, testPod(ctr("cuda", res("nvidia.com/gpu=500m"))), admissionv1.Create))
		if !resp.Allowed || resp.Patch != nil {
			t.Errorf("allowed %v patch %s", resp.Allowed, resp.Patch)
		}
	})

	t.Run("gate on: a malformed vGPU size is refused", func(t *testing.T) {
		m, _ := newTestMutator(t, RewriteAuto, gateOn)
		resp := m.Review(context.Background(), podRequest(t, testPod(ctr("cuda", res("nvidia.com/gpu=1", "nvidia.com/gpumem=1500m"))), admissionv1.Create))
		if resp.Allowed || !strings.Contains(resp.Result.Message, `container "cuda": nvidia.com/gpumem: 1500m is not a whole number`) {
			t.Errorf("allowed %v: %+v", resp.Allowed, resp.Result)
		}
	})
}

func TestMutatePodsTemplates(t *testing.T) {
	pod := testPod(ctr("cuda", res("nvidia.com/gpu=1")))

	t.Run("one template per shape and namespace, created once", func(t *testing.T) {
		m, client := newTestMutator(t, RewriteAuto, stock())
		for range 3 {
			if resp := m.Review(context.Background(), podRequest(t, pod, admissionv1.Create)); resp.Patch == nil {
				t.Fatalf("no patch: %+v", resp.Result)
			}
		}
		creates := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "create" {
				creates++
			}
		}
		l, _ := client.ResourceV1().ResourceClaimTemplates("ns").List(context.Background(), metav1.ListOptions{})
		if creates != 1 || len(l.Items) != 1 {
			t.Fatalf("%d creates, %d templates", creates, len(l.Items))
		}
		if n := l.Items[0].Name; !strings.HasPrefix(n, "facet-gpu-facet-dev-1-") {
			t.Errorf("template name %s", n)
		}
	})

	t.Run("dry run creates nothing", func(t *testing.T) {
		m, client := newTestMutator(t, RewriteAuto, stock())
		req := podRequest(t, pod, admissionv1.Create)
		req.DryRun = ref(true)
		if resp := m.Review(context.Background(), req); resp.Patch == nil {
			t.Fatalf("no patch: %+v", resp.Result)
		}
		if n := len(client.Actions()); n != 0 {
			t.Errorf("%d API calls on a dry run: %v", n, client.Actions())
		}
	})

	t.Run("a template of the name that the webhook did not make is refused", func(t *testing.T) {
		tpl, err := templateFor(shape{class: "gpu.facet.dev", count: 1, resources: []corev1.ResourceName{"nvidia.com/gpu"}, values: map[corev1.ResourceName]int64{"nvidia.com/gpu": 1}})
		if err != nil {
			t.Fatal(err)
		}
		name := tpl.Name
		other := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
		m, _ := newTestMutator(t, RewriteAuto, stock(), other)
		resp := m.Review(context.Background(), podRequest(t, pod, admissionv1.Create))
		if resp.Allowed || !strings.Contains(resp.Result.Message, `container "cuda": ResourceClaimTemplate ns/`+name+` exists without the label`) {
			t.Errorf("allowed %v: %+v", resp.Allowed, resp.Result)
		}
	})

	t.Run("a pod that already has the claim name is left alone with a warning", func(t *testing.T) {
		m, _ := newTestMutator(t, RewriteAuto, stock())
		p := testPod(ctr("cuda", res("nvidia.com/gpu=1")))
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "facet-c0-0", ResourceClaimName: ref("x")}}
		resp := m.Review(context.Background(), podRequest(t, p, admissionv1.Create))
		if !resp.Allowed || resp.Patch != nil || len(resp.Warnings) != 1 {
			t.Errorf("allowed %v patch %s warnings %q", resp.Allowed, resp.Patch, resp.Warnings)
		}
	})

	t.Run("updates and other kinds are not touched", func(t *testing.T) {
		m, _ := newTestMutator(t, RewriteAuto, stock())
		if resp := m.Review(context.Background(), podRequest(t, pod, admissionv1.Update)); !resp.Allowed || resp.Patch != nil {
			t.Errorf("update: %+v", resp)
		}
		req := podRequest(t, pod, admissionv1.Create)
		req.Kind.Kind = "Deployment"
		req.Kind.Group = "apps"
		if resp := m.Review(context.Background(), req); !resp.Allowed || resp.Patch != nil || len(resp.Warnings) != 1 {
			t.Errorf("deployment: %+v", resp)
		}
	})
}

func TestMutatorHTTP(t *testing.T) {
	m, _ := newTestMutator(t, RewriteAuto, stock())
	srv := httptest.NewServer(m)
	defer srv.Close()
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  podRequest(t, testPod(ctr("cuda", res("nvidia.com/gpu=1"))), admissionv1.Create),
	}
	body, _ := json.Marshal(review)
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if out.Response == nil || out.Response.UID != "uid-1" || !out.Response.Allowed || out.Response.PatchType == nil || len(out.Response.Patch) == 0 {
		t.Fatalf("response %s", data)
	}
}

func TestExtendedResourceMap(t *testing.T) {
	if err := DefaultExtendedResourceMap().Validate(); err != nil {
		t.Fatalf("default table: %v", err)
	}
	for _, tc := range []struct {
		name, file, want string
	}{
		{"the default table as YAML", `
devices:
- {resource: nvidia.com/gpu, deviceClassName: gpu.facet.dev}
- {resource: nvidia.com/mig-*, deviceClassName: mig-*.facet.dev}
vgpus:
- {count: volcano.sh/vgpu-number, memory: volcano.sh/vgpu-memory, cores: volcano.sh/vgpu-cores, deviceClassName: vgpu-slot.facet.dev}
- {count: nvidia.com/gpu, memory: nvidia.com/gpumem, cores: nvidia.com/gpucores, sizeRequired: true, deviceClassName: vgpu-slot.facet.dev}
`, ""},
		{"a misspelt field", "devices:\n- {resource: nvidia.com/gpu, deviceClass: gpu.facet.dev}\n", `unknown field "deviceClass"`},
		{"a name used twice", "devices:\n- {resource: nvidia.com/gpu, deviceClassName: a}\n- {resource: nvidia.com/gpu, deviceClassName: b}\n", "devices[1]: nvidia.com/gpu is already used by devices[0]"},
		{"not an extended resource", "devices:\n- {resource: gpu, deviceClassName: a}\n", `devices[0]: "gpu" is not an extended resource name`},
		{"a wildcard without its class", "devices:\n- {resource: nvidia.com/mig-*, deviceClassName: mig.facet.dev}\n", "needs exactly one"},
		{"an exact name under a prefix", "devices:\n- {resource: nvidia.com/mig-*, deviceClassName: mig-*.facet.dev}\n- {resource: nvidia.com/mig-1g.10gb, deviceClassName: x}\n", "also matches the prefix nvidia.com/mig-*"},
		{"a bad class name", "devices:\n- {resource: nvidia.com/gpu, deviceClassName: GPU_Class}\n", "is not a DeviceClass name"},
		{"a vGPU count shared without sizeRequired", "devices:\n- {resource: nvidia.com/gpu, deviceClassName: a}\nvgpus:\n- {count: nvidia.com/gpu, memory: nvidia.com/gpumem, deviceClassName: b}\n", "devices[0]: nvidia.com/gpu is already used by vgpus[0].count"},
		{"a percentage selector without the placeholder", "vgpus:\n- {count: a.b/n, memoryPercentage: a.b/p, memoryPercentageSelector: 'true', deviceClassName: b}\n", "does not contain {percent}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "map.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadExtendedResourceMap(path)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestMemoryPercentageSelector(t *testing.T) {
	table := DefaultExtendedResourceMap()
	table.VGPUs[1].MemoryPercentageSelector = `device.attributes["gpu.facet.dev"].memoryPercent >= {percent}`
	shapes, err := table.shapes("cuda", res("nvidia.com/gpu=1", "nvidia.com/gpumem-percentage=25"))
	if err != nil {
		t.Fatal(err)
	}
	if len(shapes) != 1 || len(shapes[0].selectors) != 1 || shapes[0].selectors[0] != `device.attributes["gpu.facet.dev"].memoryPercent >= 25` {
		t.Errorf("shapes %+v", shapes)
	}
}

// TestMutatorLogsDecisionChanges: the decision is logged once, and again
// only when it changes (the gate turned on: a class now keeps the field).
func TestMutatorLogsDecisionChanges(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range stock() {
		if err := indexer.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	m, err := NewMutator(logger, MutatorOptions{
		Map: DefaultExtendedResourceMap(), RewriteMode: RewriteAuto,
		Classes: resourcelisters.NewDeviceClassLister(indexer), Client: fake.NewClientset(),
	})
	if err != nil {
		t.Fatal(err)
	}
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer()
	for range 3 {
		if active, _ := m.Active(); !active {
			t.Fatal("inactive with the gate off")
		}
	}
	if err := indexer.Update(deviceClass("gpu.facet.dev", "nvidia.com/gpu")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		// Still active: what no class maps (vGPU sizes) is rewritten.
		if active, _ := m.Active(); !active {
			t.Fatal("inactive with the gate on")
		}
	}
	log := buf.String()
	if n := strings.Count(log, "Extended resources:"); n != 2 {
		t.Errorf("%d decisions logged, want 2:\n%s", n, log)
	}
	for _, want := range []string{
		"Extended resources: rewriting pods into claims", "DRAExtendedResource is off",
		"Extended resources: rewriting into claims those that no DeviceClass maps",
		"kept spec.extendedResourceName of DeviceClass gpu.facet.dev, so the scheduler serves nvidia.com/gpu from the classes",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log does not say %q:\n%s", want, log)
		}
	}
}

// listSupport is a PrioritizedListSupport with a fixed answer.
type listSupport bool

func (l listSupport) Supported() (bool, string) {
	if l {
		return true, "the test's API server keeps firstAvailable"
	}
	return false, "the test's API server drops firstAvailable"
}

// TestMutatePreferExistingMIG: with PreferExistingMIG, a MIG resource
// becomes one request with the three subrequests of
// demo/mig/prefer-existing.yaml (the class and count in each, the profile's
// class kept); whole GPUs stay `exactly`; Kueue mode keeps MIG `exactly`,
// which Kueue counts, and so does an API server that drops firstAvailable.
// A MIG template left `exactly` opts out of the claim mutator.
func TestMutatePreferExistingMIG(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kueue       bool
		unsupported bool
		res         string
		want        []string // "sub:class:count:extra CEL" per subrequest, or "exactly:class:count"
		// wantOptOut: the template's names.AnnotationPreferExistingMIG.
		wantOptOut string
		// wantTemplate: its name, the same as before the claim mutator
		// existed (a new name would make every namespace a new template).
		wantTemplate string
	}{
		{name: "a MIG profile", res: "nvidia.com/mig-1g.10gb=2", want: []string{
			`existing:mig-1g.10gb.facet.dev:2:device.attributes["gpu.facet.dev"].mode == "static-mig"`,
			`split:mig-1g.10gb.facet.dev:2:device.attributes["gpu.facet.dev"].mode in ["mig", "dynamic"] && device.attributes["gpu.facet.dev"].migInUse`,
			`carved:mig-1g.10gb.facet.dev:2:`,
		}, wantTemplate: "facet-mig-1g-10gb-facet-dev-2-a145b55c"},
		{name: "whole GPUs", res: "nvidia.com/gpu=1", want: []string{"exactly:gpu.facet.dev:1"}},
		{name: "a MIG profile in Kueue mode", kueue: true, res: "nvidia.com/mig-1g.10gb=1", want: []string{"exactly:mig-1g.10gb.facet.dev:1"}, wantOptOut: "false"},
		{name: "a MIG profile where the API server drops firstAvailable", unsupported: true, res: "nvidia.com/mig-1g.10gb=2",
			want: []string{"exactly:mig-1g.10gb.facet.dev:2"}, wantOptOut: "false", wantTemplate: "facet-mig-1g-10gb-facet-dev-2-437fe945"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, client := newTestMutator(t, RewriteAlways, stock())
			m.opts.PreferExistingMIG = true
			m.opts.PrioritizedList = listSupport(!tc.unsupported)
			if tc.kueue {
				m.opts.Kueue = KueueOn
			}
			pod := testPod(ctr("cuda", res(tc.res)))
			resp := m.Review(context.Background(), podRequest(t, pod, admissionv1.Create))
			if !resp.Allowed {
				t.Fatalf("denied: %s", resp.Result.Message)
			}
			patched := applyPatch(t, pod, resp)
			name := *patched.Spec.ResourceClaims[0].ResourceClaimTemplateName
			if tc.wantTemplate != "" && name != tc.wantTemplate {
				t.Errorf("template %s, want %s", name, tc.wantTemplate)
			}
			tmpl, err := client.ResourceV1().ResourceClaimTemplates("ns").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := tmpl.Annotations[names.AnnotationPreferExistingMIG]; got != tc.wantOptOut {
				t.Errorf("annotation %s=%q, want %q", names.AnnotationPreferExistingMIG, got, tc.wantOptOut)
			}
			reqs := tmpl.Spec.Spec.Devices.Requests
			if len(reqs) != 1 {
				t.Fatalf("requests %+v", reqs)
			}
			var got []string
			if ex := reqs[0].Exactly; ex != nil {
				got = append(got, fmt.Sprintf("exactly:%s:%d", ex.DeviceClassName, ex.Count))
			}
			for _, sub := range reqs[0].FirstAvailable {
				var extra []string
				for _, s := range sub.Selectors {
					extra = append(extra, s.CEL.Expression)
				}
				got = append(got, fmt.Sprintf("%s:%s:%d:%s", sub.Name, sub.DeviceClassName, sub.Count, strings.Join(extra, " && ")))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("request %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNewMutatorNeedsPrioritizedList: PreferExistingMIG without a way to
// tell whether the API server keeps firstAvailable is a setup error.
func TestNewMutatorNeedsPrioritizedList(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_, err := NewMutator(ktesting.NewLogger(t, ktesting.NewConfig()), MutatorOptions{
		Map: DefaultExtendedResourceMap(), Classes: resourcelisters.NewDeviceClassLister(indexer), Client: fake.NewClientset(),
		PreferExistingMIG: true,
	})
	if err == nil || !strings.Contains(err.Error(), "PreferExistingMIG needs PrioritizedList") {
		t.Errorf("got %v", err)
	}
}
