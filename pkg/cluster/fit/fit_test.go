package fit

import (
	"bytes"
	"context"
	"fmt"
	"k8s.io/utils/ptr"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/model/features"
)

func classes(t *testing.T) []*resourceapi.DeviceClass {
	t.Helper()
	_, cls, _, err := ReadFile("../../../deployments/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cls
}

// ask builds a claim of one request of a class, with selectors and, for a
// share, capacity requests (memory, cores).
func ask(class string, capacity map[string]string, selectors ...string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pending"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
	}
}

func profile(p string) string {
	return fmt.Sprintf(`device.attributes["gpu.facet.dev"].profile == %q`, p)
}

// TestCheck runs the allocator scenarios of test/allocator through fit:
// the allocator's verdict, where it fits, and the explanation where not.
func TestCheck(t *testing.T) {
	r, share, held := occtest.Result, occtest.Share, occtest.Allocated
	all := features.AllOn("test")
	for _, tc := range []struct {
		name  string
		node  occtest.Node
		stock bool
		held  []*resourceapi.ResourceClaim
		claim *resourceapi.ResourceClaim
		fits  string // a device the allocation must hold; "" when it does not fit
		why   []string
		// never are words the explanation must not use.
		never []string
	}{{
		name:  "MIG 3g.40gb: three slices free, four needed",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		held:  []*resourceapi.ResourceClaim{held("ml/big", r("n1", "gpu-0-mig-4g40gb-0")), held("ml/small", r("n1", "gpu-0-mig-1g10gb-4"))},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		why:   []string{"none of the 2 matching device(s) is free", "gpu-0: 3 of 8 memory slices free, need 4 (3g.40gb)"},
	}, {
		name:  "MIG 3g.40gb fits once the 1g.10gb is freed",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		held:  []*resourceapi.ResourceClaim{held("ml/big", r("n1", "gpu-0-mig-4g40gb-0"))},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		fits:  "gpu-0-mig-3g40gb-4",
	}, {
		name:  "MIG: enough slices, but fragmented",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0-mig-1g10gb-1")), held("ml/b", r("n1", "gpu-0-mig-1g10gb-5"))},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		why:   []string{"gpu-0: 6 of 8 memory slices free, but none of 3g.40gb's placements (slices 4-7, 0-3) is free"},
	}, {
		name:  "MIG: the whole GPU is held",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		held:  []*resourceapi.ResourceClaim{held("ml/train", r("n1", "gpu-0"))},
		claim: ask("mig.facet.dev", nil, profile("1g.10gb")),
		why:   []string{"gpu-0: whole GPU held by ml/train"},
	}, {
		name:  "whole GPU: MIG instances in use",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0-mig-1g10gb-1"))},
		claim: ask("gpu.facet.dev", nil),
		why:   []string{"gpu-0: 1 MIG instance(s) in use (ml/a); the whole GPU needs every memory slice free"},
	}, {
		name:  "exclusive: every GPU held",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2},
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0")), held("ml/b", r("n1", "gpu-1"))},
		claim: ask("gpu.facet.dev", nil),
		why:   []string{"gpu-0: whole GPU held by ml/a", "gpu-1: whole GPU held by ml/b"},
	}, {
		name:  "a share that exceeds the memory left",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"},
		held:  []*resourceapi.ResourceClaim{held("ml/a", share("n1", "gpu-0", "s1", "70Gi", 30))},
		claim: ask("vgpu.facet.dev", map[string]string{"memory": "20Gi", "cores": "20"}),
		why:   []string{"gpu-0: 9.18Gi of 79.18Gi memory free, need 20Gi (held by ml/a)"}, // 81079 - 71680 of 81079 MiB
	}, {
		name:  "a share larger than the GPU is too small, not busy",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"},
		claim: ask("vgpu.facet.dev", map[string]string{"memory": "200Gi", "cores": "10"}),
		why:   []string{"none of the 1 matching device(s) is large enough", "gpu-0: too small, 79.18Gi of memory in all, need 200Gi"},
		never: []string{"held by", "memory free"},
	}, {
		name:  "a share on an idle GPU that lacks SM: no empty holder list",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"},
		claim: ask("vgpu.facet.dev", map[string]string{"memory": "1Gi", "cores": "101"}),
		why:   []string{"gpu-0: 101% SM asked for, more than a whole GPU"},
		never: []string{"held by ()"},
	}, {
		name: "more devices than the node has",
		node: occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2},
		claim: func() *resourceapi.ResourceClaim {
			c := ask("gpu.facet.dev", nil)
			c.Spec.Devices.Requests[0].Exactly.Count = 3
			return c
		}(),
		why:   []string{"only 2 device(s) on the node match DeviceClass gpu.facet.dev and the request's selectors, need 3"},
		never: []string{"held by", "free"},
	}, {
		name: "four GPUs in one NVLink domain on H100 NVL pairs: free GPUs, no domain of four",
		node: occtest.Node{Name: "n1", Machine: "h100-nvl-pairs"},
		claim: func() *resourceapi.ResourceClaim {
			c := ask("gpu.facet.dev", nil)
			c.Spec.Devices.Requests[0].Exactly.Count = 4
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.facet.dev/nvlinkDomain"))}}
			return c
		}(),
		why:   []string{"4 matching devices are free, at most 2 with one gpu.facet.dev/nvlinkDomain, need 4 (nvl-"},
		never: []string{"each request alone has free matching devices"},
	}, {
		name:  "a share that fits beside another",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"},
		held:  []*resourceapi.ResourceClaim{held("ml/a", share("n1", "gpu-0", "s1", "70Gi", 30))},
		claim: ask("vgpu.facet.dev", map[string]string{"memory": "8Gi", "cores": "20"}),
		fits:  "gpu-0",
	}, {
		name:  "slots: every slot held (stock 1.35)",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=slots", Slots: "0=2"},
		stock: true,
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0-slot-0")), held("ml/b", r("n1", "gpu-0-slot-1"))},
		claim: ask("vgpu-slot.facet.dev", nil),
		why:   []string{"gpu-0-slot-0: held by ml/a", "gpu-0-slot-1: held by ml/b"},
	}, {
		name:  "slots: a free slot (stock 1.35)",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=slots", Slots: "0=2"},
		stock: true,
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0-slot-0"))},
		claim: ask("vgpu-slot.facet.dev", nil),
		fits:  "gpu-0-slot-1",
	}, {
		name:  "static-mig: the only 3g.40gb is held",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=static-mig", Layout: "0=all-balanced"},
		stock: true,
		held:  []*resourceapi.ResourceClaim{held("ml/a", r("n1", "gpu-0-mig-3g40gb-4"))},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		why:   []string{"gpu-0-mig-3g40gb-4: held by ml/a"},
	}, {
		name:  "no device matches the selector",
		node:  occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"},
		claim: ask("mig.facet.dev", nil, profile("9g.999gb")),
		why:   []string{"no device on the node matches DeviceClass mig.facet.dev and the request's selectors"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Slices: occtest.Slices(t, tc.node), Classes: classes(t), Claims: tc.held, Features: FeaturesOf(all)}
			if tc.stock {
				in.Features = FeaturesOf(features.Stock("test"))
			}
			res, err := Check(context.Background(), in, "", []*resourceapi.ResourceClaim{tc.claim})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			Write(&out, res)
			t.Logf("\n%s", out.String())
			if len(res) != 1 {
				t.Fatalf("%d node results, want 1", len(res))
			}
			if got := res[0].Fits; got != (tc.fits != "") {
				t.Fatalf("fits %t, want %t", got, tc.fits != "")
			}
			for _, d := range res[0].Devices {
				if strings.HasSuffix(d, ": "+tc.fits) || strings.Contains(d, ": "+tc.fits+" ") {
					return
				}
			}
			if tc.fits != "" {
				t.Errorf("allocation %v, want %s", res[0].Devices, tc.fits)
			}
			for _, w := range tc.why {
				if !strings.Contains(out.String(), w) {
					t.Errorf("explanation lacks %q", w)
				}
			}
			for _, w := range tc.never {
				if strings.Contains(out.String(), w) {
					t.Errorf("explanation says %q", w)
				}
			}
		})
	}
}

// TestPodClaims: a pod's claims come from its templates (named as the
// resourceclaim controller names them) and from claims in the file; a
// claim that is not in the file is left for the caller to read.
func TestPodClaims(t *testing.T) {
	s, err := Decode(strings.NewReader(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-mig, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly: {deviceClassName: mig.facet.dev}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml}
spec:
  containers:
  - name: c
    image: busybox
    resources: {claims: [{name: mig}, {name: shared}]}
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: one-mig
  - name: shared
    resourceClaimName: team-gpu
`))
	if err != nil {
		t.Fatal(err)
	}
	claims, missing, err := s.PodClaims(s.Pods[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].Name != "trainer-mig" || claims[0].Namespace != "ml" || claims[0].Spec.Devices.Requests[0].Exactly.DeviceClassName != "mig.facet.dev" {
		t.Errorf("claims %+v, want trainer-mig from template one-mig", claims)
	}
	if len(missing) != 1 || missing[0] != "team-gpu" {
		t.Errorf("missing %v, want [team-gpu]", missing)
	}
	if _, err := Decode(strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec: {bogus: 1}\n")); err == nil || !strings.Contains(err.Error(), "Pod bad") {
		t.Errorf("a bad field: error %v, want one naming Pod bad", err)
	}
}
