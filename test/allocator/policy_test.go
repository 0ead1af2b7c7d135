package allocator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/internal/nvml/sim"
)

// The demo node's layout: MIG on GPUs 0-3, vGPU shares on 4-7.
var demoModes = []string{"--gpu-modes", "0-3=mig,4-7=shared"}

// migClassName is the DeviceClass Facet ships for a MIG profile: '+' is not
// allowed in a DNS subdomain, and becomes '.', as NVIDIA's device plugin
// does for its mixed-strategy resource names.
func migClassName(profile string) string {
	return "mig-" + strings.ReplaceAll(profile, "+", ".") + ".facet.dev"
}

// migResourceName is NVIDIA's device-plugin resource name for a profile
// (k8s-device-plugin internal/rm/rm.go, mixed strategy).
func migResourceName(profile string) string {
	return "nvidia.com/mig-" + strings.ReplaceAll(profile, "+", ".")
}

// validExtendedResourceName is k8s.io/kubernetes
// pkg/apis/core/v1/helper.IsExtendedResourceName, which the apiserver
// applies to DeviceClass spec.extendedResourceName: not in the
// kubernetes.io namespace, and a qualified name once "requests." is put in
// front of it (the quota's name for it).
func validExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// exampleClasses are deployments/deviceclasses.yaml plus the tier classes
// of demo/examples.
func exampleClasses(t testing.TB) []*resourceapi.DeviceClass {
	t.Helper()
	_, tiers, _, err := ReadFile(filepath.Join(repo, "demo/examples/tier-classes.yaml"))
	if err != nil || len(tiers) != 2 {
		t.Fatalf("tier classes: %d, %v", len(tiers), err)
	}
	return append(deviceClasses(t), tiers...)
}

func exampleClaim(t testing.TB, file string) *resourceapi.ResourceClaim {
	t.Helper()
	return demoClaim(t, filepath.Join("examples", file))
}

// migModels are the MIG-capable models a machine file can name: those
// whose GPU publishes MIG devices in the default (auto) mode, booted as an
// admin leaves it for MIG: MIG mode off from Hopper on (Facet turns it
// on), on before Hopper, whose MIG mode Facet does not change.
func migModels(t *testing.T) []string {
	var out []string
	for _, m := range sim.Models() {
		machine := oneGPU(m)
		machine.GPUs[0].MIGEnabled = false
		node, err := sim.DiscoverSimulated(machine)
		if err != nil {
			t.Fatal(err)
		}
		machine.GPUs[0].MIGEnabled = node.GPUs[0].MIGModeFixed != ""
		for _, s := range machineSlices(t, machine, "node-a") {
			if len(s.Spec.Devices) > 1 {
				out = append(out, m)
				break
			}
		}
	}
	return out
}

// profilesOf lists the MIG profiles among slices' devices.
func profilesOf(sl []*resourceapi.ResourceSlice) []string {
	seen := map[string]bool{}
	for _, s := range sl {
		for _, d := range s.Spec.Devices {
			if p := d.Attributes["profile"].StringValue; p != nil {
				seen[*p] = true
			}
		}
	}
	var out []string
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// TestMIGProfileClasses: deployments/deviceclasses.yaml has exactly one
// class per MIG profile of the supported GPUs, valid names, NVIDIA's
// resource name as extendedResourceName, and each class allocates its
// profile, alone, on every model that has it.
func TestMIGProfileClasses(t *testing.T) {
	classes := deviceClasses(t)
	byName := map[string]*resourceapi.DeviceClass{}
	resourceNames := map[string]string{}
	for _, cl := range classes {
		byName[cl.Name] = cl
		if errs := validation.IsDNS1123Subdomain(cl.Name); len(errs) > 0 {
			t.Errorf("class %s: %v", cl.Name, errs)
		}
		if n := cl.Spec.ExtendedResourceName; n != nil {
			if !validExtendedResourceName(*n) {
				t.Errorf("class %s: invalid extendedResourceName %q", cl.Name, *n)
			}
			if other, dup := resourceNames[*n]; dup {
				t.Errorf("classes %s and %s both claim %s", other, cl.Name, *n)
			}
			resourceNames[*n] = cl.Name
		}
	}
	if got := resourceNames["nvidia.com/gpu"]; got != "gpu.facet.dev" {
		t.Errorf("nvidia.com/gpu maps to %q, want gpu.facet.dev", got)
	}
	// Why '+' must be mapped: neither name would be accepted.
	if len(validation.IsDNS1123Subdomain("mig-1g.10gb+me.facet.dev")) == 0 || validExtendedResourceName("nvidia.com/mig-1g.10gb+me") {
		t.Error("a '+' would be valid in a class or resource name")
	}

	used := map[string]bool{}
	models := migModels(t)
	if len(models) < 6 {
		t.Fatalf("MIG models %v", models)
	}
	for _, model := range models {
		sl := machineSlices(t, oneGPU(model), "node-a", "--mode", "mig")
		for _, p := range profilesOf(sl) {
			name := migClassName(p)
			used[name] = true
			cl := byName[name]
			if cl == nil {
				t.Errorf("%s: no class %s for profile %s", model, name, p)
				continue
			}
			if n := cl.Spec.ExtendedResourceName; n == nil || *n != migResourceName(p) {
				t.Errorf("class %s: extendedResourceName %v, want %s", name, n, migResourceName(p))
			}
			// The claim the scheduler makes for `nvidia.com/mig-<p>: 1`:
			// the class alone, count 1.
			c := NewCluster(sl, classes)
			res, err := c.Allocate(context.Background(), "node-a", claim("ext", request("container-0-request-0", name, 1)))
			if err != nil || res == nil {
				t.Errorf("%s: class %s allocates nothing: %v", model, name, err)
				continue
			}
			d := device(sl, res.Devices.Results[0].Device)
			if got := *d.Attributes["profile"].StringValue; got != p {
				t.Errorf("%s: class %s allocated %s (profile %s)", model, name, d.Name, got)
			}
		}
	}
	for name := range byName {
		if strings.HasPrefix(name, "mig-") && !used[name] {
			t.Errorf("class %s matches no profile of any supported GPU", name)
		}
	}
	t.Logf("%d MIG models, %d profile classes", len(models), len(used))
}

// TestTierTraining: four whole GPUs on one PCIe root, else on one NUMA
// node.
func TestTierTraining(t *testing.T) {
	subrequests := func(res *resourceapi.AllocationResult) []string {
		var out []string
		for _, r := range res.Devices.Results {
			if !slices.Contains(out, r.Request) {
				out = append(out, r.Request)
			}
		}
		return out
	}
	t.Run("dgx-h100 exclusive: two GPUs per root, so one NUMA node", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", "exclusive"), exampleClasses(t))
		// The first alternative alone never fits: no root has four GPUs.
		sameRoot := gpuClaim("same-root-only", 4)
		sameRoot.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptrTo(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}
		run(t, c, "node-a", []step{{sameRoot, nil}})

		ctx := context.Background()
		res, err := c.Allocate(ctx, "node-a", exampleClaim(t, "training.yaml"))
		if err != nil || res == nil {
			t.Fatalf("training: %v %v", res, err)
		}
		if got := Devices(res); fmt.Sprint(got) != "[gpu-0 gpu-1 gpu-2 gpu-3]" || fmt.Sprint(subrequests(res)) != "[gpus/same-numa]" {
			t.Fatalf("training: %v through %v", got, subrequests(res))
		}
		run(t, c, "node-a", []step{
			{exampleClaim(t, "training.yaml"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{exampleClaim(t, "training.yaml"), nil},
		})
	})
	// kubernetes#140436 on 1.35: the GPUs that the pcieRoot constraint
	// rejects keep their counters, so on mig-mode GPUs the NUMA alternative
	// finds none. v0.37 allocates gpu-0..3 here in both layouts.
	t.Run("dgx-h100 demo layout: only the shared-mode GPUs (1.35 bug)", func(t *testing.T) {
		fixed := fixedIn(t, "v0.36.3")
		c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", demoModes...), exampleClasses(t))
		res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "training.yaml"))
		want := "[gpu-4 gpu-5 gpu-6 gpu-7]"
		if fixed {
			want = "[gpu-0 gpu-1 gpu-2 gpu-3]"
		}
		if err != nil || res == nil || fmt.Sprint(Devices(res)) != want || fmt.Sprint(subrequests(res)) != "[gpus/same-numa]" {
			t.Fatalf("training: %v %v, want %s", res, err, want)
		}
		if fixed {
			run(t, c, "node-a", []step{
				{exampleClaim(t, "training.yaml"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
				{exampleClaim(t, "training-numa.yaml"), nil},
			})
		} else {
			run(t, c, "node-a", []step{
				{exampleClaim(t, "training.yaml"), nil}, // correct: gpu-0..3
				{exampleClaim(t, "training-numa.yaml"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
			})
		}
		c = NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", "mig"), exampleClasses(t))
		if fixed {
			run(t, c, "node-a", []step{
				{exampleClaim(t, "training.yaml"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
				{exampleClaim(t, "training-numa.yaml"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
				{exampleClaim(t, "training-numa.yaml"), nil},
			})
		} else {
			run(t, c, "node-a", []step{
				{exampleClaim(t, "training.yaml"), nil}, // correct: gpu-0..3
				{exampleClaim(t, "training-numa.yaml"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
				{exampleClaim(t, "training-numa.yaml"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			})
		}
	})
	t.Run("training-numa on a partly used mig-mode node (1.35 bug)", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", "mig"), exampleClasses(t))
		var want []string // correct: gpu-4..7
		if fixedIn(t, "v0.36.3") {
			want = []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}
		}
		run(t, c, "node-a", []step{
			{gpuClaim("one", 1), []string{"gpu-0"}},
			{exampleClaim(t, "training-numa.yaml"), want},
		})
	})
	t.Run("a node with four GPUs behind one root takes the first alternative", func(t *testing.T) {
		// Eight H100s on one NUMA node: 0-1, 2-5 (four) and 6-7 behind
		// three roots.
		m := &sim.Machine{Name: "four-per-root", DriverVersion: "580.159.04", CUDADriverVersion: "13.0"}
		roots := []string{"10", "10", "30", "30", "30", "30", "50", "50"}
		for i, r := range roots {
			numa := 0
			m.GPUs = append(m.GPUs, sim.MachineGPU{
				Model:    "H100-SXM5-80GB",
				PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x10+i*8),
				PCIeRoot: "pci0000:" + r,
				NUMANode: &numa,
			})
		}
		c := NewCluster(machineSlices(t, m, "node-a", "--mode", "exclusive"), exampleClasses(t))
		res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "training.yaml"))
		if err != nil || res == nil {
			t.Fatalf("training: %v", err)
		}
		if got := Devices(res); fmt.Sprint(got) != "[gpu-2 gpu-3 gpu-4 gpu-5]" || fmt.Sprint(subrequests(res)) != "[gpus/same-root]" {
			t.Fatalf("training: %v through %v", got, subrequests(res))
		}
	})
	t.Run("dgx-a100-80gb in exclusive mode", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-a100-80gb", "node-a", "--mode", "exclusive"), exampleClasses(t))
		run(t, c, "node-a", []step{
			{gpuClaim("one", 1), []string{"gpu-0"}},
			// NUMA node 0 has three free GPUs left: node 1.
			{exampleClaim(t, "training.yaml"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{exampleClaim(t, "training.yaml"), nil},
		})
	})
}

func ptrTo[T any](v T) *T { return &v }

// TestTierInference: MIG instances of at most 20 GB.
func TestTierInference(t *testing.T) {
	inference := func(name string, selectors ...string) *resourceapi.ResourceClaim {
		return claim(name, request("mig", "inference-mig.facet.dev", 1, selectors...))
	}
	for _, tc := range []struct {
		name, machine string
		modes         []string
		steps         []step
	}{
		{"H100, demo layout", "dgx-h100", demoModes, []step{
			{inference("smallest"), []string{"gpu-0-mig-1g10gb-6"}},
			{exampleClaim(t, "inference.yaml"), []string{"gpu-0-mig-1g20gb-4"}},
			{inference("2g", `device.attributes["gpu.facet.dev"].profile == "2g.20gb"`), []string{"gpu-0-mig-2g20gb-2"}},
			// Larger than 20 GB: the class refuses it, whatever the claim says...
			{inference("3g", `device.attributes["gpu.facet.dev"].profile == "3g.40gb"`), nil},
			{inference("30g", memAtLeast("30G")), nil},
			// ...but mig.facet.dev does not: keep the namespace off it (quota).
			{profileClaim("3g-direct", "3g.40gb"), []string{"gpu-1-mig-3g40gb-4"}},
			// Never on the shared-mode GPUs 4-7, which publish no MIG devices.
			{inference("on-gpu-4", onGPU(4)), nil},
		}},
		{"A100 80GB", "dgx-a100-80gb+mig", nil, []step{
			{inference("smallest"), []string{"gpu-0-mig-1g10gb-6"}},
			{exampleClaim(t, "inference.yaml"), []string{"gpu-0-mig-1g20gb-4"}},
			{inference("3g", `device.attributes["gpu.facet.dev"].profile == "3g.40gb"`), nil},
		}},
		{"A100 40GB", "dgx-a100-40gb+mig", nil, []step{
			{inference("smallest"), []string{"gpu-0-mig-1g5gb-6"}},
			{exampleClaim(t, "inference.yaml"), []string{"gpu-0-mig-3g20gb-0"}},
			{inference("7g", `device.attributes["gpu.facet.dev"].profile == "7g.40gb"`), nil},
		}},
		{"H200", "dgx-h200", nil, []step{
			{exampleClaim(t, "inference.yaml"), []string{"gpu-0-mig-1g18gb-6"}},
			{inference("1g.35gb", `device.attributes["gpu.facet.dev"].profile == "1g.35gb"`), nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCluster(nodeSlices(t, tc.machine, "node-a", tc.modes...), exampleClasses(t))
			run(t, c, "node-a", tc.steps)
		})
	}
	t.Run("B200: no profile is that small", func(t *testing.T) {
		c := NewCluster(machineSlices(t, oneGPU("B200-180GB"), "node-a", "--mode", "mig"), exampleClasses(t))
		run(t, c, "node-a", []step{{inference("any"), nil}})
	})
}

// notebook asks for a share through the notebook tier's class.
func notebook(name, memory, cores string) *resourceapi.ResourceClaim {
	return shareOfClass(name, "notebook-vgpu.facet.dev", memory, cores)
}

// TestTierNotebook: what the notebook class enforces (where shares go, and
// the class's VgpuConfig), and what it does not (the size of a share).
func TestTierNotebook(t *testing.T) {
	c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", demoModes...), exampleClasses(t))
	ctx := context.Background()
	var shares []*resourceapi.AllocationResult
	for i := 0; i < 4; i++ {
		res, err := c.Allocate(ctx, "node-a", exampleClaim(t, "notebook.yaml"))
		if err != nil || fmt.Sprint(Devices(res)) != "[gpu-4]" {
			t.Fatalf("notebook %d: %v %v", i, Devices(res), err)
		}
		shares = append(shares, res)
	}
	// The class's config reaches the driver with every share.
	cfg := shares[0].Devices.Config
	if len(cfg) != 1 || cfg[0].Source != resourceapi.AllocationConfigSourceClass || !strings.Contains(string(cfg[0].Opaque.Parameters.Raw), `"coreUtilizationPolicy":"force"`) {
		t.Errorf("allocation config %+v", cfg)
	}
	if got := consumed(t, shares[0]); got != "8Gi/25" {
		t.Errorf("consumed %s", got)
	}
	run(t, c, "node-a", []step{
		// gpu-4's SM time is all taken: the fifth goes to gpu-5.
		{exampleClaim(t, "notebook.yaml"), []string{"gpu-5"}},
		// Not enforced by the class: a share larger than the tier's caps...
		{notebook("too-big", "40Gi", "75"), []string{"gpu-5"}},
		// ...and a share that names no capacity, which takes a whole GPU.
		{notebook("whole", "", ""), []string{"gpu-6"}},
		// Enforced: never on a mig-mode GPU, whose gpu-<i> is not shareable.
		{claim("on-gpu-0", request("vgpu", "notebook-vgpu.facet.dev", 1, onGPU(0))), nil},
	})
	t.Run("a node without shared-mode GPUs", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-a100-80gb", "node-a"), exampleClasses(t))
		run(t, c, "node-a", []step{{exampleClaim(t, "notebook.yaml"), nil}})
	})
}

// TestTierAtLeast40GB: a MIG instance of at least 40 GB, else a whole GPU.
func TestTierAtLeast40GB(t *testing.T) {
	taken := func(res *resourceapi.AllocationResult) string {
		r := res.Devices.Results[0]
		return r.Device + " via " + r.Request
	}
	t.Run("dgx-h100 demo layout", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", demoModes...), exampleClasses(t))
		var got []string
		for i := 0; ; i++ {
			res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "at-least-40gb.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if res == nil {
				break
			}
			got = append(got, taken(res))
		}
		want := []string{
			// Two 3g.40gb per MIG-mode GPU, from the end of each GPU...
			"gpu-0-mig-3g40gb-4 via gpu/mig", "gpu-0-mig-3g40gb-0 via gpu/mig",
			"gpu-1-mig-3g40gb-4 via gpu/mig", "gpu-1-mig-3g40gb-0 via gpu/mig",
			"gpu-2-mig-3g40gb-4 via gpu/mig", "gpu-2-mig-3g40gb-0 via gpu/mig",
			"gpu-3-mig-3g40gb-4 via gpu/mig", "gpu-3-mig-3g40gb-0 via gpu/mig",
			// ...then the shared-mode GPUs, whole.
			"gpu-4 via gpu/whole", "gpu-5 via gpu/whole", "gpu-6 via gpu/whole", "gpu-7 via gpu/whole",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("allocated\n%v\nwant\n%v", got, want)
		}
	})
	t.Run("dgx-a100-80gb exclusive: whole GPUs only", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-a100-80gb", "node-a", "--mode", "exclusive"), exampleClasses(t))
		res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "at-least-40gb.yaml"))
		if err != nil || res == nil || taken(res) != "gpu-0 via gpu/whole" {
			t.Fatalf("%v %v", res, err)
		}
	})
	t.Run("dgx-a100-40gb: a 7g.40gb spanning the GPU", func(t *testing.T) {
		// MIG mode on, which Facet leaves on an A100: a 7g.40gb on each
		// GPU, and no whole GPU after them (mig mode publishes none).
		c := NewCluster(nodeSlices(t, "dgx-a100-40gb+mig", "node-a"), exampleClasses(t))
		for i := 0; ; i++ {
			res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "at-least-40gb.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if i == 8 {
				if res != nil {
					t.Fatalf("a ninth claim got %s", taken(res))
				}
				break
			}
			if res == nil || taken(res) != fmt.Sprintf("gpu-%d-mig-7g40gb-0 via gpu/mig", i) {
				t.Fatalf("claim %d: %v", i, res)
			}
		}
	})
	t.Run("dgx-a100-40gb, MIG mode off: whole GPUs only", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "dgx-a100-40gb", "node-a"), exampleClasses(t))
		res, err := c.Allocate(context.Background(), "node-a", exampleClaim(t, "at-least-40gb.yaml"))
		if err != nil || res == nil || taken(res) != "gpu-0 via gpu/whole" {
			t.Fatalf("%v %v", res, err)
		}
	})
	t.Run("l4x4: nothing that large", func(t *testing.T) {
		c := NewCluster(nodeSlices(t, "l4x4", "node-a"), exampleClasses(t))
		run(t, c, "node-a", []step{{exampleClaim(t, "at-least-40gb.yaml"), nil}})
	})
}

// TestQuotaExamplesCloseEveryClass: ResourceQuota counts devices per class
// name, and a class a quota leaves out is unlimited; so a quota example
// that caps devices names every class of deployments/deviceclasses.yaml.
func TestQuotaExamplesCloseEveryClass(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repo, "deployments/quota/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no quota examples: %v", err)
	}
	known := map[string]bool{}
	for _, cl := range exampleClasses(t) {
		known[cl.Name] = true
	}
	for _, f := range files {
		for _, q := range readQuotas(t, f) {
			caps := false
			for name := range q {
				if class, ok := strings.CutSuffix(name, ".deviceclass.resource.k8s.io/devices"); ok {
					caps = true
					if !known[class] {
						t.Errorf("%s: no class %s", filepath.Base(f), class)
					}
				}
			}
			if !caps {
				continue
			}
			for _, cl := range deviceClasses(t) {
				if _, ok := q[cl.Name+".deviceclass.resource.k8s.io/devices"]; !ok {
					t.Errorf("%s: caps devices but leaves class %s unlimited", filepath.Base(f), cl.Name)
				}
			}
		}
	}
}

// readQuotas returns the spec.hard of each ResourceQuota in a file.
func readQuotas(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]string
	dec := utilyaml.NewYAMLReader(bufioReader(f))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var q corev1.ResourceQuota
		if err := yaml.UnmarshalStrict(doc, &q); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if q.Kind != "ResourceQuota" {
			continue
		}
		hard := map[string]string{}
		for name, v := range q.Spec.Hard {
			hard[string(name)] = v.String()
		}
		out = append(out, hard)
	}
}

// TestMigrationExamples: the "after" claims of docs/migration.md
// (demo/examples/migration) on the demo node.
func TestMigrationExamples(t *testing.T) {
	m := func(file string) *resourceapi.ResourceClaim {
		return exampleClaim(t, filepath.Join("migration", file))
	}
	c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", demoModes...), exampleClasses(t))
	run(t, c, "node-a", []step{
		{m("gpu.yaml"), []string{"gpu-0", "gpu-1"}},
		{m("mig-1g10gb.yaml"), []string{"gpu-2-mig-1g10gb-6"}},
		// Time-slicing's four replicas: four 20253Mi shares fill the 81013 MiB
		// an H100 publishes for shares under MPS (81079 less the server's 66).
		{m("time-slicing.yaml"), []string{"gpu-4"}},
		{m("time-slicing.yaml"), []string{"gpu-4"}},
		{m("time-slicing.yaml"), []string{"gpu-4"}},
		{m("time-slicing.yaml"), []string{"gpu-4"}},
		{m("time-slicing.yaml"), []string{"gpu-5"}},
		// Two vGPUs on two GPUs.
		{m("volcano.yaml"), []string{"gpu-5", "gpu-6"}},
		{m("hami.yaml"), []string{"gpu-5"}},
		{m("hami-percentage.yaml"), []string{"gpu-6"}},
	})
	// Without distinctAttribute, both shares of a count-2 request may share
	// one GPU: that is not Volcano's vgpu-number 2.
	c = NewCluster(nodeSlices(t, "dgx-h100", "node-a", demoModes...), exampleClasses(t))
	same := m("volcano.yaml")
	same.Spec.Devices.Constraints = nil
	// v0.36 tries another device for the second share before the same
	// one again; either is a valid answer.
	wantSame := []string{"gpu-4", "gpu-4"}
	if fixedIn(t, "v0.36.0") {
		wantSame = []string{"gpu-4", "gpu-5"}
	}
	run(t, c, "node-a", []step{{same, wantSame}})
	// gpumem-percentage 50 written as half an H100 80GB: no A100 40GB.
	c = NewCluster(nodeSlices(t, "dgx-a100-40gb", "node-a", "--mode", "shared"), exampleClasses(t))
	run(t, c, "node-a", []step{{m("hami-percentage.yaml"), nil}})
}
