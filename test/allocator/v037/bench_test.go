// Package v037 runs BenchmarkAllocateOneMIG's shapes through the v0.37
// structured allocator (Kubernetes 1.37), for comparison with v0.35 (the
// main module's test/allocator). It is a module of its own so the main
// module keeps v0.35. Run:
//
//	cd test/allocator && FACET_BENCH_DUMP=$PWD/v037/shapes go test -run TestDumpBenchShapes .
//	cd v037 && go test -run '^$' -bench . -benchtime 30x
package v037

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"
)

type lister map[string]*resourceapi.DeviceClass

func (l lister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}
func (l lister) Get(n string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[n]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("no class %s", n)
}

func read(path string) ([]*resourceapi.ResourceSlice, []*resourceapi.DeviceClass) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		panic(err)
	}
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var sl []*resourceapi.ResourceSlice
	var cl []*resourceapi.DeviceClass
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return sl, cl
		}
		if err != nil {
			panic(err)
		}
		var m metav1.TypeMeta
		yaml.Unmarshal(doc, &m)
		switch m.Kind {
		case "ResourceSlice":
			var o resourceapi.ResourceSlice
			if err := yaml.Unmarshal(doc, &o); err != nil {
				panic(err)
			}
			sl = append(sl, &o)
		case "DeviceClass":
			var o resourceapi.DeviceClass
			if err := yaml.Unmarshal(doc, &o); err != nil {
				panic(err)
			}
			cl = append(cl, &o)
		}
	}
}

func claim(class, sel string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: 1, AllocationMode: resourceapi.DeviceAllocationModeExactCount}
	if sel != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel}}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "default", UID: types.UID("uid-one")},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &req}}}},
	}
}

func BenchmarkAllocateOneMIG(b *testing.B) {
	_, classes := read("../../../deployments/deviceclasses.yaml")
	l := lister{}
	for _, c := range classes {
		l[c.Name] = c
	}
	features := structured.Features{PrioritizedList: true, DeviceBindingAndStatus: true, AdminAccess: true, PartitionableDevices: true, ConsumableCapacity: true}
	cache := cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})
	for _, shape := range []string{"facet-mig", "nvidia-15", "facet-exclusive"} {
		node0, _ := read("shapes/" + shape + ".yaml")
		if len(node0) == 0 {
			b.Skip("no shapes: run TestDumpBenchShapes first (see the package doc)")
		}
		class, sel := "mig.facet.dev", `device.attributes["gpu.facet.dev"].profile == "1g.10gb"`
		if shape == "facet-exclusive" {
			class, sel = "gpu.facet.dev", ""
		}
		for _, nodes := range []int{100, 500} {
			b.Run(fmt.Sprintf("%s/nodes=%d", shape, nodes), func(b *testing.B) {
				var all []*resourceapi.ResourceSlice
				for i := 0; i < nodes; i++ {
					n := fmt.Sprintf("node-%d", i)
					for j, s := range node0 {
						s = s.DeepCopy()
						s.Name = fmt.Sprintf("%s-%d", n, j)
						s.Spec.NodeName = &n
						s.Spec.Pool.Name = n
						all = append(all, s)
					}
				}
				state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
				ctx := context.Background()
				for i := 0; i < b.N+1; i++ {
					if i == 1 {
						b.ResetTimer()
					}
					a, err := structured.NewAllocator(ctx, features, state, l, all, cache)
					if err != nil {
						b.Fatal(err)
					}
					n := fmt.Sprintf("node-%d", i%nodes)
					res, err := a.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, []*resourceapi.ResourceClaim{claim(class, sel)})
					if err != nil || len(res) != 1 {
						b.Fatalf("no fit: %v", err)
					}
				}
			})
		}
	}
}
