package fit

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// TestLive reads a cluster through client-go (a fake clientset) and checks
// a claim against it: the node's one MIG GPU has a 4g.40gb carved at 0,
// so a 3g.40gb fits only at 4. Another driver's slices are ignored.
func TestLive(t *testing.T) {
	var objs []runtime.Object
	for _, s := range occtest.Slices(t, occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"}) {
		objs = append(objs, s)
	}
	other := occtest.Slices(t, occtest.Node{Name: "n2", Model: "H100-SXM5-80GB", GPUs: 1})[0]
	other.Spec.Driver = "gpu.nvidia.com"
	other.Name = "other"
	objs = append(objs, other)
	for _, c := range classes(t) {
		objs = append(objs, c)
	}
	objs = append(objs, occtest.Allocated("ml/big", occtest.Result("n1", "gpu-0-mig-4g40gb-0")))
	client := fake.NewClientset(objs...)

	in, err := Live(context.Background(), client, "")
	if err != nil {
		t.Fatal(err)
	}
	in.Features = FeaturesOf(features.AllOn("test"))
	res, err := Check(context.Background(), in, "", []*resourceapi.ResourceClaim{ask("mig.facet.dev", nil, profile("3g.40gb"))})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Node != "n1" || !res[0].Fits || res[0].Devices[0] != "default/pending gpu: gpu-0-mig-3g40gb-4" {
		t.Fatalf("got %+v, want a fit on n1 at gpu-0-mig-3g40gb-4", res)
	}
}
