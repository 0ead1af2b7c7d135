package webhook

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/pkg/cluster/classes"
)

// kueueClasses are the stock classes with the sized classes of `facetctl
// classes`, and optionally one that keeps extendedResourceName (the gate on).
func kueueClasses(gateOn bool) []*resourceapi.DeviceClass {
	out := stock()
	if gateOn {
		out[0] = deviceClass("gpu.facet.dev", "nvidia.com/gpu")
	}
	for _, s := range []classes.Size{{MemoryMiB: 10240, Cores: 10}, {MemoryMiB: 20480, Cores: 25}, {MemoryMiB: 40960, Cores: 50}} {
		out = append(out, classes.SlotClass(s))
	}
	for _, s := range []classes.Size{{MemoryMiB: 2000, Cores: 20}, {MemoryMiB: 10240, Cores: 50}} {
		c, _ := classes.ShareClass(s)
		out = append(out, c)
	}
	return out
}

func newKueueMutator(t *testing.T, mode KueueMode, table ExtendedResourceMap, cls []*resourceapi.DeviceClass, kueueServed bool) (*Mutator, *fake.Clientset) {
	t.Helper()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range cls {
		if err := indexer.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	client := fake.NewClientset()
	if kueueServed {
		client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
			GroupVersion: KueueGroup + "/v1beta2",
			APIResources: []metav1.APIResource{{Name: "clusterqueues", Kind: "ClusterQueue"}},
		}}
	}
	m, err := NewMutator(ktesting.NewLogger(t, ktesting.NewConfig()), MutatorOptions{
		Map: table, RewriteMode: RewriteAuto, Kueue: mode,
		Classes: resourcelisters.NewDeviceClassLister(indexer), Client: client,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, client
}

func TestKueueMode(t *testing.T) {
	shareTable := DefaultExtendedResourceMap()
	shareTable.VGPUs[0].DeviceClassName = "vgpu.facet.dev"
	for _, tc := range []struct {
		name   string
		mode   KueueMode
		served bool // the API server serves kueue.x-k8s.io
		gateOn bool
		table  *ExtendedResourceMap
		res    []string
		// want: the one template's class and count, its capacity
		// ("memory/cores" or ""), and whether it carries CEL or config.
		wantClass    string
		wantCount    int64
		wantCapacity string
		wantCELOrCfg bool
		wantNoPatch  bool
		wantErr      string
	}{
		{name: "whole GPU", mode: KueueOn, res: []string{"nvidia.com/gpu=1"}, wantClass: "gpu.facet.dev", wantCount: 1},
		{name: "MIG profile", mode: KueueOn, res: []string{"nvidia.com/mig-1g.10gb=2"}, wantClass: "mig-1g.10gb.facet.dev", wantCount: 2},
		// 10240/10 has the memory but not the cores.
		{name: "Volcano size to the smallest slot that holds it", mode: KueueOn,
			res: []string{"volcano.sh/vgpu-number=1", "volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"}, wantClass: "vgpu-slot-20480mi-25.facet.dev", wantCount: 1},
		{name: "HAMi memory only", mode: KueueOn,
			res: []string{"nvidia.com/gpu=2", "nvidia.com/gpumem=3000"}, wantClass: "vgpu-slot-10240mi-10.facet.dev", wantCount: 2},
		{name: "Volcano size to a share class, with its capacity", mode: KueueOn, table: &shareTable,
			res: []string{"volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"}, wantClass: "vgpu-2000mi-20.facet.dev", wantCount: 1, wantCapacity: "2000Mi/20"},
		{name: "too large for every slot", mode: KueueOn,
			res: []string{"volcano.sh/vgpu-memory=50000"}, wantErr: "no vgpu-slot DeviceClass is that large; the sizes are 10240Mi/10, 20480Mi/25, 40960Mi/50"},
		{name: "memory percentage", mode: KueueOn,
			res: []string{"volcano.sh/vgpu-memory-percentage=50"}, wantErr: "a percentage of a GPU's memory"},
		// Kueue counts claims: the pod is rewritten though the scheduler
		// would serve nvidia.com/gpu from the class.
		{name: "gate on", mode: KueueOn, gateOn: true, res: []string{"nvidia.com/gpu=1"}, wantClass: "gpu.facet.dev", wantCount: 1},
		{name: "auto, Kueue served", mode: KueueAuto, served: true,
			res: []string{"volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"}, wantClass: "vgpu-slot-20480mi-25.facet.dev", wantCount: 1},
		{name: "auto, no Kueue", mode: KueueAuto,
			res: []string{"volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"}, wantClass: "vgpu-slot.facet.dev", wantCount: 1, wantCELOrCfg: true},
		{name: "off", mode: KueueOff, served: true,
			res: []string{"volcano.sh/vgpu-memory=2000", "volcano.sh/vgpu-cores=20"}, wantClass: "vgpu-slot.facet.dev", wantCount: 1, wantCELOrCfg: true},
		{name: "off, gate on", mode: KueueOff, gateOn: true, res: []string{"nvidia.com/gpu=1"}, wantNoPatch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := DefaultExtendedResourceMap()
			if tc.table != nil {
				table = *tc.table
			}
			m, client := newKueueMutator(t, tc.mode, table, kueueClasses(tc.gateOn), tc.served)
			pod := testPod(ctr("main", res(tc.res...)))
			resp := m.Review(context.Background(), podRequest(t, pod, admissionv1.Create))
			if tc.wantErr != "" {
				if resp.Allowed || !strings.Contains(resp.Result.Message, tc.wantErr) {
					t.Fatalf("allowed %v, %v; want a denial with %q", resp.Allowed, resp.Result, tc.wantErr)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("denied: %s", resp.Result.Message)
			}
			if tc.wantNoPatch {
				if resp.Patch != nil {
					t.Fatalf("patched: %s", resp.Patch)
				}
				return
			}
			patched := applyPatch(t, pod, resp)
			if len(patched.Spec.ResourceClaims) != 1 || len(patched.Spec.Containers[0].Resources.Limits) != 0 {
				t.Fatalf("patched pod: claims %v, limits %v", patched.Spec.ResourceClaims, patched.Spec.Containers[0].Resources.Limits)
			}
			tmpl, err := client.ResourceV1().ResourceClaimTemplates("ns").Get(context.Background(), *patched.Spec.ResourceClaims[0].ResourceClaimTemplateName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			spec := tmpl.Spec.Spec.Devices
			req := spec.Requests[0].Exactly
			if req.DeviceClassName != tc.wantClass || req.Count != tc.wantCount {
				t.Errorf("template asks for %d of %s, want %d of %s", req.Count, req.DeviceClassName, tc.wantCount, tc.wantClass)
			}
			if got := len(req.Selectors) > 0 || len(spec.Config) > 0; got != tc.wantCELOrCfg {
				t.Errorf("template has CEL or config: %v, want %v (%+v)", got, tc.wantCELOrCfg, spec)
			}
			gotCap := ""
			if req.Capacity != nil {
				mem, cores := req.Capacity.Requests["memory"], req.Capacity.Requests["cores"]
				gotCap = mem.String() + "/" + cores.String()
			}
			if gotCap != tc.wantCapacity {
				t.Errorf("template capacity %q, want %q", gotCap, tc.wantCapacity)
			}
		})
	}
}

func TestParseKueueMode(t *testing.T) {
	for _, s := range []string{"auto", "on", "off"} {
		if m, err := ParseKueueMode(s); err != nil || string(m) != s {
			t.Errorf("ParseKueueMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseKueueMode("yes"); err == nil {
		t.Error(`ParseKueueMode("yes"): no error`)
	}
}
