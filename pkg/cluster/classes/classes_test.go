package classes

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/fit"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// slicesOf reads golden slices of pkg/model/resourceslices (what the plugin publishes
// for each mode of a simulated machine).
func slicesOf(t *testing.T, files ...string) []*resourceapi.ResourceSlice {
	t.Helper()
	var out []*resourceapi.ResourceSlice
	for _, f := range files {
		s, _, _, err := fit.ReadFile(filepath.Join("..", "..", "model", "resourceslices", "testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s...)
	}
	return out
}

func TestGenerateGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		slices []string
		sizes  string
	}{
		// GPUs 0-1 mig, 2 dynamic, 3 shared, 4-7 exclusive.
		{name: "dgx-h100-mixed", slices: []string{"dgx-h100-mixed.yaml"}, sizes: "2000Mi/20,10Gi/50"},
		{name: "dgx-h100-slots", slices: []string{"dgx-h100-slots.yaml"}},
		{name: "dgx-h100-static-mig", slices: []string{"dgx-h100-static-mig.yaml"}},
		// Two product families; share sizes with no shared GPU.
		{name: "h100-and-l4", slices: []string{"dgx-h100-exclusive.yaml", "l4x4-exclusive.yaml"}, sizes: "2000Mi/20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes, err := ParseSizes(tc.sizes)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Generate(slicesOf(t, tc.slices...), Options{ShareSizes: sizes})
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := WriteYAML(&got, res); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".yaml")
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/cluster/classes -update)", err)
			}
			if got.String() != string(want) {
				t.Errorf("%s differs from Generate's output (go test ./pkg/cluster/classes -update rewrites it):\n%s", path, got.String())
			}
			// What the golden file holds must read back as the classes.
			_, back, _, err := fit.ReadObjects(bytes.NewReader(got.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if len(back) != len(res.Classes) {
				t.Fatalf("read back %d classes, wrote %d", len(back), len(res.Classes))
			}
		})
	}
}

// The MIG classes Generate makes are the ones deployments/deviceclasses.yaml
// ships, so applying both changes nothing and claims written for either
// count the same in Kueue.
func TestMIGClassesMatchShipped(t *testing.T) {
	_, shipped, _, err := fit.ReadFile(filepath.Join("..", "..", "..", "deployments", "deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range shipped {
		if !strings.HasPrefix(c.Name, "mig-") {
			continue
		}
		n++
		sel := c.Spec.Selectors[0].CEL.Expression
		i := strings.Index(sel, `.profile == "`)
		if i < 0 {
			t.Fatalf("%s: no profile in %q", c.Name, sel)
		}
		profile := strings.TrimSuffix(sel[i+len(`.profile == "`):], `"`)
		got := MIGClass(profile)
		if got.Name != c.Name || !equality.Semantic.DeepEqual(got.Spec, c.Spec) {
			t.Errorf("MIGClass(%q) = %s %+v, shipped %s %+v", profile, got.Name, got.Spec, c.Name, c.Spec)
		}
	}
	if n < 30 {
		t.Fatalf("found %d MIG classes in deployments/deviceclasses.yaml, want the ~32 shipped", n)
	}
}

func TestParseSizes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []Size
		wantErr string
	}{
		{in: "", want: nil},
		{in: "2000Mi/20", want: []Size{{2000, 20}}},
		{in: "10Gi/50, 2000Mi/20", want: []Size{{10240, 50}, {2000, 20}}},
		{in: "2000Mi", wantErr: "want MEMORY/PERCENT"},
		{in: "2000/20", wantErr: "whole number of MiB"},
		{in: "0Mi/20", wantErr: "positive"},
		{in: "2000Mi/0", wantErr: "from 1 to 100"},
		{in: "2000Mi/101", wantErr: "from 1 to 100"},
		{in: "2000Mi/20,2000Mi/20", wantErr: "given twice"},
	} {
		got, err := ParseSizes(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSizes(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !equality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("ParseSizes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestFamily(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3": "h100",
		"NVIDIA H100 PCIe":      "h100",
		"NVIDIA A100-SXM4-80GB": "a100",
		"NVIDIA A100-SXM4-40GB": "a100",
		"NVIDIA L4":             "l4",
		"NVIDIA H200":           "h200",
		"NVIDIA B200":           "b200",
		"Tesla T4":              "t4",
		"NVIDIA RTX A6000":      "",
		"":                      "",
	} {
		if got := Family(in); got != want {
			t.Errorf("Family(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestShareClassCarriesItsSize(t *testing.T) {
	c, err := ShareClass(Size{MemoryMiB: 2000, Cores: 20})
	if err != nil {
		t.Fatal(err)
	}
	shape, size, ok := SizeOf(c)
	if !ok || shape != ShapeShare || size != (Size{2000, 20}) {
		t.Fatalf("SizeOf = %v %v %v", shape, size, ok)
	}
	cfgs := []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: c.Spec.Config[0].DeviceConfiguration}}
	cfg, err := configapi.EffectiveVgpuConfig(cfgs, "any")
	if err != nil {
		t.Fatal(err)
	}
	mem, cores, err := cfg.Limit(80<<30, 100)
	if err != nil || mem != 2000<<20 || cores != 20 {
		t.Fatalf("the class's VgpuConfig limits a GPU to %d bytes, %d%%, %v; want 2000 MiB, 20%%", mem, cores, err)
	}
	if _, err := ShareClass(Size{MemoryMiB: 2000, Cores: 0}); err == nil {
		t.Error("ShareClass with 0% cores: no error")
	}
	slot := SlotClass(Size{MemoryMiB: 20480, Cores: 25})
	if shape, size, ok := SizeOf(slot); !ok || shape != ShapeSlot || size != (Size{20480, 25}) {
		t.Fatalf("SizeOf(slot class) = %v %v %v", shape, size, ok)
	}
	if _, _, ok := SizeOf(MIGClass("1g.10gb")); ok {
		t.Error("SizeOf(MIG class) is ok")
	}
}
