package allocator

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/internal/nvml/sim"
)

var facetctl string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "facetctl")
	if err != nil {
		panic(err)
	}
	facetctl = filepath.Join(dir, "facetctl")
	build := exec.Command("go", "build", "-o", facetctl, "github.com/facet-gpu/facet/cmd/facetctl")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build facetctl:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const repo = "../.."

// nodeSlices runs `facetctl slices` for a demo machine file, as an operator
// would; "<machine>+mig" is the machine with MIG mode on at boot.
func nodeSlices(t testing.TB, machine, node string, args ...string) []*resourceapi.ResourceSlice {
	t.Helper()
	path := filepath.Join(repo, "demo/machines", strings.TrimSuffix(machine, "+mig")+".yaml")
	if strings.HasSuffix(machine, "+mig") {
		// The machine with MIG mode on at boot, as an admin leaves an
		// A100 for MIG: Facet does not change an A100's MIG mode.
		m, err := sim.LoadMachine(path)
		if err != nil {
			t.Fatal(err)
		}
		m.Name += "-mig-on"
		for i := range m.GPUs {
			m.GPUs[i].MIGEnabled = true
		}
		return machineSlices(t, m, node, args...)
	}
	return facetctlSlices(t, path, node, args...)
}

// facetctlSlices runs `facetctl slices` on a machine file and decodes its
// output.
func facetctlSlices(t testing.TB, path, node string, args ...string) []*resourceapi.ResourceSlice {
	t.Helper()
	cmd := exec.Command(facetctl, append([]string{"slices", "--machine", path, "--node", node}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("facetctl slices %s: %v\n%s", path, err, stderr.String())
	}
	slices, _, _, err := ReadObjects(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	return slices
}

func deviceClasses(t testing.TB) []*resourceapi.DeviceClass {
	t.Helper()
	_, classes, _, err := ReadFile(filepath.Join(repo, "deployments/deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return classes
}

func demoClaim(t testing.TB, file string) *resourceapi.ResourceClaim {
	t.Helper()
	claims := demoClaims(t, file)
	if len(claims) != 1 {
		t.Fatalf("%s: %d claims, want 1", file, len(claims))
	}
	return claims[0]
}

// demoClaims reads the claims of a demo file, in file order (for a pod's
// claim templates, the order its resourceClaims list them in).
func demoClaims(t testing.TB, file string) []*resourceapi.ResourceClaim {
	t.Helper()
	_, _, claims, err := ReadFile(filepath.Join(repo, "demo", file))
	if err != nil || len(claims) == 0 {
		t.Fatalf("%s: %d claims, %v", file, len(claims), err)
	}
	return claims
}

func gpuClaim(name string, count int64, selectors ...string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.facet.dev", Count: count, AllocationMode: resourceapi.DeviceAllocationModeExactCount}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metaName(name),
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}},
		}},
	}
}

// TestWholeGPUClaims allocates claims one after another on one node and
// checks where each lands, or that it does not fit. The GPUs are in
// exclusive mode; TestWholeGPUInEveryMode covers the others.
func TestWholeGPUClaims(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine string
		steps   []step
	}{
		{"demo claims on a DGX H100", "dgx-h100", []step{
			{demoClaim(t, "gpu/one-gpu.yaml"), []string{"gpu-0"}},
			// gpu-1 is free but shares no PCIe root with gpu-2: the
			// matchAttribute constraint moves the pair to gpu-2 and gpu-3.
			{demoClaim(t, "examples/pair-one-pcie-root.yaml"), []string{"gpu-2", "gpu-3"}},
			{gpuClaim("rest", 4), []string{"gpu-1", "gpu-4", "gpu-5", "gpu-6"}},
			{gpuClaim("last", 1), []string{"gpu-7"}},
			{gpuClaim("none-left", 1), nil},
		}},
		{"more GPUs than the node has", "dgx-h100", []step{
			{gpuClaim("nine", 9), nil},
			{gpuClaim("eight", 8), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
		}},
		{"selectors on attributes and capacity", "l4x4", []step{
			{gpuClaim("hopper", 1, `device.attributes["gpu.facet.dev"].architecture == "hopper"`), nil},
			{gpuClaim("40g", 1, `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("40Gi")) >= 0`), nil},
			{gpuClaim("l4", 1, `device.attributes["gpu.facet.dev"].productName == "NVIDIA L4"`), []string{"gpu-0"}},
			{gpuClaim("numa1", 1, `device.attributes["gpu.facet.dev"].numaNode == 1`), []string{"gpu-2"}},
			{gpuClaim("cc", 1, `device.attributes["gpu.facet.dev"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))`), []string{"gpu-1"}},
			{gpuClaim("uuid", 1, `device.attributes["gpu.facet.dev"].uuid.startsWith("GPU-")`), []string{"gpu-3"}},
		}},
		{"80 GB on an H100 node", "dgx-h100", []step{
			// An 80 GB H100 gives 81079 MiB (79.2 GiB): its 81559 less 480 reserved.
			{gpuClaim("80g", 1, `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("79Gi")) >= 0`, `device.attributes["gpu.facet.dev"].driverVersion.isGreaterThan(semver("535.0.0"))`), []string{"gpu-0"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCluster(nodeSlices(t, tc.machine, "node-a", "--mode", "exclusive"), deviceClasses(t))
			run(t, c, "node-a", tc.steps)
		})
	}
}

// TestSlicesBelongToTheirNode: a node's devices are never offered to another.
func TestSlicesBelongToTheirNode(t *testing.T) {
	c := NewCluster(nodeSlices(t, "dgx-h100", "node-a"), deviceClasses(t))
	res, err := c.Allocate(context.Background(), "node-b", gpuClaim("elsewhere", 1))
	if err != nil || res != nil {
		t.Fatalf("allocated on the wrong node: %v %v", Devices(res), err)
	}
}

func metaName(name string) (m metav1.ObjectMeta) {
	m.Name, m.Namespace, m.UID = name, "default", types.UID("uid-"+name)
	return m
}

// TestWholeGPUInEveryMode: gpu.facet.dev means a whole GPU in every mode;
// in shared and dynamic mode it is a share of all of the GPU's capacity.
func TestWholeGPUInEveryMode(t *testing.T) {
	for _, mode := range []string{"exclusive", "mig", "shared", "dynamic"} {
		t.Run(mode, func(t *testing.T) {
			c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", mode), deviceClasses(t))
			run(t, c, "node-a", []step{
				{demoClaim(t, "gpu/one-gpu.yaml"), []string{"gpu-0"}},
				{gpuClaim("four", 4), []string{"gpu-1", "gpu-2", "gpu-3", "gpu-4"}},
				{gpuClaim("three", 3), []string{"gpu-5", "gpu-6", "gpu-7"}},
				{gpuClaim("none-left", 1), nil},
			})
			c = NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", mode), deviceClasses(t))
			run(t, c, "node-a", []step{
				{demoClaim(t, "gpu/two-gpus.yaml"), []string{"gpu-0", "gpu-1"}},
				{demoClaim(t, "gpu/two-gpus.yaml"), []string{"gpu-2", "gpu-3"}},
			})
		})
	}
}
