package allocator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/internal/nvml/sim"
)

// domain is Facet's attribute and capacity domain.
const domain = "gpu.facet.dev"

// oneGPU is a machine with one GPU of a model, MIG mode on.
func oneGPU(model string) *sim.Machine {
	return &sim.Machine{
		Name: "one-" + model, DriverVersion: "580.159.04", CUDADriverVersion: "13.0",
		GPUs: []sim.MachineGPU{{Model: model, MIGEnabled: true}},
	}
}

// machineSlices writes m as a machine file and runs `facetctl slices` on it.
func machineSlices(t testing.TB, m *sim.Machine, node string, args ...string) []*resourceapi.ResourceSlice {
	t.Helper()
	data, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), m.Name+".yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return facetctlSlices(t, path, node, args...)
}

// request builds an exact-count request of a class with CEL selectors.
func request(name, class string, count int64, selectors ...string) resourceapi.DeviceRequest {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count, AllocationMode: resourceapi.DeviceAllocationModeExactCount}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return resourceapi.DeviceRequest{Name: name, Exactly: &req}
}

// claim builds a claim of requests.
func claim(name string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metaName(name),
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
}

// migClaim asks for one MIG instance matching selectors.
func migClaim(name string, selectors ...string) *resourceapi.ResourceClaim {
	return claim(name, request("mig", "mig.facet.dev", 1, selectors...))
}

// profileClaim asks for one MIG instance of a profile.
func profileClaim(name, profile string) *resourceapi.ResourceClaim {
	return migClaim(name, fmt.Sprintf(`device.attributes["%s"].profile == %q`, domain, profile))
}

// share asks for a vGPU share; an empty memory or cores leaves it to the
// device's default.
func share(name, memory, cores string, selectors ...string) *resourceapi.ResourceClaim {
	return shareOfClass(name, "vgpu.facet.dev", memory, cores, selectors...)
}

// shareOfClass is share through another DeviceClass.
func shareOfClass(name, class, memory, cores string, selectors ...string) *resourceapi.ResourceClaim {
	req := request("vgpu", class, 1, selectors...)
	caps := map[resourceapi.QualifiedName]resource.Quantity{}
	if memory != "" {
		caps["memory"] = resource.MustParse(memory)
	}
	if cores != "" {
		caps["cores"] = resource.MustParse(cores)
	}
	if len(caps) > 0 {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
	}
	return claim(name, req)
}

// onGPU is a selector for devices of GPU i.
func onGPU(i int) string { return fmt.Sprintf(`device.attributes["%s"].index == %d`, domain, i) }

// device looks a device up by name in slices.
func device(slices []*resourceapi.ResourceSlice, name string) *resourceapi.Device {
	for _, s := range slices {
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == name {
				return &s.Spec.Devices[i]
			}
		}
	}
	return nil
}

// gpuIndex is the `index` attribute of a device.
func gpuIndex(slices []*resourceapi.ResourceSlice, name string) int {
	d := device(slices, name)
	if d == nil {
		return -1
	}
	return int(*d.Attributes["index"].IntValue)
}

// step is one claim of a sequence and where it must land: the device
// names, or nil when it must not fit.
type step struct {
	claim *resourceapi.ResourceClaim
	want  []string
}

// run allocates steps one after another (one scheduling cycle each).
func run(t *testing.T, c *Cluster, node string, steps []step) {
	t.Helper()
	for i, s := range steps {
		res, err := c.Allocate(context.Background(), node, s.claim)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, s.claim.Name, err)
		}
		if got := Devices(res); fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Fatalf("step %d (%s): allocated %v, want %v", i, s.claim.Name, got, s.want)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
