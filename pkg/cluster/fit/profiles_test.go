package fit

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// firstAvailable builds a claim of one request whose subrequests are
// "class[:selector]" in order, named s0, s1, ...
func firstAvailable(subs ...string) *resourceapi.ResourceClaim {
	c := ask("mig.facet.dev", nil)
	r := &c.Spec.Devices.Requests[0]
	r.Exactly = nil
	for i, s := range subs {
		class, sel, _ := strings.Cut(s, ":")
		sub := resourceapi.DeviceSubRequest{Name: fmt.Sprint("s", i), DeviceClassName: class}
		if sel != "" {
			sub.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
		}
		r.FirstAvailable = append(r.FirstAvailable, sub)
	}
	return c
}

// TestRequestProfiles: a request is for one MIG profile exactly when every
// device of the cluster it can match is a MIG instance of that profile,
// whatever its selectors say it in, and whoever holds the devices.
func TestRequestProfiles(t *testing.T) {
	mig := occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2, Modes: "0=mig"}
	static := occtest.Node{Name: "n2", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=static-mig", Layout: "0=all-balanced"}
	exclusive := occtest.Node{Name: "n3", Model: "H100-SXM5-80GB", GPUs: 1}
	shared := occtest.Node{Name: "n4", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"}
	for _, tc := range []struct {
		name  string
		nodes []occtest.Node
		held  []*resourceapi.ResourceClaim
		claim *resourceapi.ResourceClaim
		want  []string // "request class profile"
	}{{
		name:  "mig.facet.dev and a profile selector",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		want:  []string{"gpu mig.facet.dev 3g.40gb"},
	}, {
		name:  "a per-profile DeviceClass, no selector of its own",
		nodes: []occtest.Node{mig},
		claim: ask("mig-1g.10gb.facet.dev", nil),
		want:  []string{"gpu mig-1g.10gb.facet.dev 1g.10gb"},
	}, {
		name:  "the profile on mig and static-mig nodes, its devices held",
		nodes: []occtest.Node{mig, static},
		held:  []*resourceapi.ResourceClaim{occtest.Allocated("ml/a", occtest.Result("n1", "gpu-0-mig-3g40gb-4"), occtest.Result("n2", "gpu-0-mig-3g40gb-4"))},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")),
		want:  []string{"gpu mig.facet.dev 3g.40gb"},
	}, {
		name:  "a memory selector only one profile meets",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil, `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("70Gi")) > 0`),
		want:  []string{"gpu mig.facet.dev 7g.80gb"},
	}, {
		name:  "a memory selector several profiles meet",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil, `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("30Gi")) > 0`),
		want:  []string{"gpu mig.facet.dev "},
	}, {
		name:  "mig.facet.dev without a selector: any profile",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil),
		want:  []string{"gpu mig.facet.dev "},
	}, {
		name:  "a whole GPU, on a node with MIG devices too",
		nodes: []occtest.Node{mig, exclusive},
		claim: ask("gpu.facet.dev", nil),
		want:  []string{"gpu gpu.facet.dev "},
	}, {
		name:  "a vGPU share",
		nodes: []occtest.Node{mig, shared},
		claim: ask("vgpu.facet.dev", map[string]string{"memory": "10Gi"}),
		want:  []string{"gpu vgpu.facet.dev "},
	}, {
		name:  "no device matches",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil, profile("9g.999gb")),
		want:  []string{"gpu mig.facet.dev "},
	}, {
		name:  "no such DeviceClass",
		nodes: []occtest.Node{mig},
		claim: ask("nic.example.com", nil),
		want:  []string{"gpu nic.example.com "},
	}, {
		// It holds on the 3g.40gb devices and fails on the others, where
		// the allocator fails the claim.
		name:  "a selector that fails on some devices",
		nodes: []occtest.Node{mig},
		claim: ask("mig.facet.dev", nil, profile("3g.40gb")+` || device.attributes["gpu.facet.dev"].noSuchAttribute == "x"`),
		want:  []string{"gpu mig.facet.dev "},
	}, {
		name:  "firstAvailable: each subrequest",
		nodes: []occtest.Node{mig, exclusive},
		claim: firstAvailable("mig.facet.dev:"+profile("3g.40gb"), "mig-1g.10gb.facet.dev", "gpu.facet.dev"),
		want:  []string{"gpu/s0 mig.facet.dev 3g.40gb", "gpu/s1 mig-1g.10gb.facet.dev 1g.10gb", "gpu/s2 gpu.facet.dev "},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var slices []*resourceapi.ResourceSlice
			for _, n := range tc.nodes {
				slices = append(slices, occtest.Slices(t, n)...)
			}
			in := Input{Slices: slices, Classes: classes(t), Claims: tc.held, Features: FeaturesOf(features.AllOn("test"))}
			got, err := RequestProfiles(context.Background(), in, []*resourceapi.ResourceClaim{tc.claim})
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, p := range got {
				if p.Claim != "default/pending" {
					t.Errorf("claim %q, want default/pending", p.Claim)
				}
				lines = append(lines, p.Request+" "+p.DeviceClass+" "+p.MIGProfile)
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
