package allocator

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/cluster/classes"
)

// The classes of `facetctl classes` (pkg/cluster/classes) are what a quota system
// such as Kueue counts by name: a claim that names one of them and nothing
// else must get exactly the shape the class stands for, as many times as
// the node has it, and no other. Each class is tried on a fresh node until
// its claims stop fitting.
func TestQuotaClasses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		stock bool
		want  map[string]int // class -> claims that fit
		kind  map[string]string
	}{
		{
			name: "gates on",
			args: []string{"--gpu-modes", "0-1=mig,2-3=slots,4=shared,5-7=exclusive", "--gpu-slots", "3=2x10Gi/10+1x40Gi/50"},
			want: map[string]int{
				// GPUs 0-1 (mig, whole while no MIG device is taken),
				// 4 (shared: a claim without capacity takes all of it)
				// and 5-7; slots-mode GPUs publish no whole GPU.
				"gpu-h100.facet.dev":    6,
				"mig-1g.10gb.facet.dev": 14,
				"mig-7g.80gb.facet.dev": 2,
				// GPU 2's four equal slots; GPU 3's mixed layout.
				"vgpu-slot-20253mi-25.facet.dev": 4,
				"vgpu-slot-10240mi-10.facet.dev": 2,
				"vgpu-slot-40960mi-50.facet.dev": 1,
				// GPU 4: 20 % of the SMs each, five fit.
				"vgpu-2000mi-20.facet.dev": 5,
			},
		},
		{
			name:  "stock 1.35",
			stock: true,
			args:  []string{"--feature-gates", "", "--gpu-modes", "0-3=static-mig,4-7=slots", "--mig-layouts", "0-3=all-1g.10gb"},
			want: map[string]int{
				"gpu-h100.facet.dev":             0,
				"mig-1g.10gb.facet.dev":          28,
				"vgpu-slot-20253mi-25.facet.dev": 16,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out, err := exec.Command(facetctl, append([]string{"slices", "--machine", filepath.Join(repo, "demo/machines/dgx-h100.yaml"), "--node", "n"}, tc.args...)...).Output()
			if err != nil {
				t.Fatalf("facetctl slices: %v", err)
			}
			path := filepath.Join(dir, "slices.yaml")
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(facetctl, "classes", "--slices", path, "--share-sizes", "2000Mi/20")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			gen, err := cmd.Output()
			if err != nil {
				t.Fatalf("facetctl classes: %v\n%s", err, stderr.String())
			}
			slices, _, _, err := ReadObjects(bytes.NewReader(out))
			if err != nil {
				t.Fatal(err)
			}
			_, cls, _, err := ReadObjects(bytes.NewReader(gen))
			if err != nil {
				t.Fatal(err)
			}
			byName := map[string]*resourceapi.DeviceClass{}
			for _, c := range cls {
				byName[c.Name] = c
			}
			for class, want := range tc.want {
				c, ok := byName[class]
				if !ok {
					if want > 0 {
						t.Errorf("facetctl classes made no %s; it made %v", class, keys(byName))
					}
					continue
				}
				cluster := NewCluster(slices, cls)
				if tc.stock {
					cluster.Features = &StockFeatures
				}
				got := 0
				for ; got <= want; got++ {
					req := request("r", class, 1)
					if shape, size, ok := classes.SizeOf(c); ok && shape == classes.ShapeShare {
						req.Exactly.Capacity = classes.ShareCapacity(size)
					}
					res, err := cluster.Allocate(context.Background(), "n", claim("c"+itoa(got), req))
					if err != nil {
						t.Fatalf("%s: %v", class, err)
					}
					if res == nil {
						break
					}
					checkShape(t, slices, c, res)
				}
				if got != want {
					t.Errorf("%s: %d claims naming only the class fit, want %d", class, got, want)
				}
			}
		})
	}
}

// checkShape checks that an allocation of class c is one device of c's
// shape, and that a share class hands its VgpuConfig to the driver.
func checkShape(t *testing.T, slices []*resourceapi.ResourceSlice, c *resourceapi.DeviceClass, res *resourceapi.AllocationResult) {
	t.Helper()
	if len(res.Devices.Results) != 1 {
		t.Fatalf("%s: %d devices allocated, want 1", c.Name, len(res.Devices.Results))
	}
	d := device(slices, res.Devices.Results[0].Device)
	typ := *d.Attributes["type"].StringValue
	shape := classes.Shape(c.Labels[classes.LabelShape])
	switch shape {
	case classes.ShapeGPU, classes.ShapeShare:
		if typ != "gpu" {
			t.Errorf("%s allocated %s of type %s", c.Name, d.Name, typ)
		}
	case classes.ShapeSlot:
		if typ != "vgpu-slot" {
			t.Errorf("%s allocated %s of type %s", c.Name, d.Name, typ)
		}
	default:
		if typ != "mig" {
			t.Errorf("%s allocated %s of type %s", c.Name, d.Name, typ)
		}
	}
	if shape == classes.ShapeShare {
		n := 0
		for _, cfg := range res.Devices.Config {
			if cfg.Source == resourceapi.AllocationConfigSourceClass && cfg.Opaque != nil && cfg.Opaque.Driver == domain {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d VgpuConfigs from the class in the allocation, want 1", c.Name, n)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
