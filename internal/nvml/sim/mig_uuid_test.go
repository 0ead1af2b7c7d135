package sim

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// migCounters counts the NVML calls a MIG device UUID lookup can make on
// GPU 0 of srv.
type migCounters struct {
	walk, byIDs atomic.Int64
}

// countMIGLookups wraps GPU 0's nvmlDeviceGetMigDeviceHandleByIndex and the
// library's nvmlDeviceGetHandleByUUID("MIG-GPU-..."); with failByIDs the
// latter fails, as on a driver that did not take that name.
func countMIGLookups(srv *server.Server, failByIDs bool) *migCounters {
	c := &migCounters{}
	dev := srv.Devices[0].(*server.Device)
	byIndex := dev.GetMigDeviceHandleByIndexFunc
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		c.walk.Add(1)
		return byIndex(i)
	}
	byUUID := srv.DeviceGetHandleByUUIDFunc
	srv.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		if strings.HasPrefix(id, "MIG-GPU-") {
			c.byIDs.Add(1)
			if failByIDs {
				return nil, nvml.ERROR_NOT_FOUND
			}
		}
		return byUUID(id)
	}
	return c
}

// openMIGMachine opens one GPU of model with MIG on.
func openMIGMachine(t *testing.T, model string, ciInfoParent bool) (*nvmlgpu.Library, *server.Server, nvmlgpu.GPU) {
	t.Helper()
	m := &Machine{Name: "uuid-" + strings.ToLower(model), DriverVersion: simDriverVersion, CUDADriverVersion: "13.0",
		GPUs: []MachineGPU{{Model: model, PCIBusID: "0000:80:00.0", MIGEnabled: true}}, CIInfoParentDevice: ciInfoParent}
	lib, srv, err := openSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	return lib, srv, node.GPUs[0]
}

// TestMIGDeviceUUIDLookup checks that CreateMIG and ListMIGOn find a MIG
// device's UUID without walking the GPU's MIG devices, from the compute
// instance's info or, where that gives the parent GPU, by the GPU and
// instance IDs; and that they still walk when neither works.
func TestMIGDeviceUUIDLookup(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ciInfoParent bool
		failByIDs    bool
		// wantByIDs is whether a lookup by "MIG-<GPU UUID>/<GI>/<CI>"
		// happens, wantWalk whether the walk does.
		wantByIDs, wantWalk bool
	}{
		{name: "compute instance info gives the MIG device"},
		{name: "compute instance info gives the parent", ciInfoParent: true, wantByIDs: true},
		{name: "neither works", ciInfoParent: true, failByIDs: true, wantByIDs: true, wantWalk: true},
	} {
		for _, model := range []string{"A100-SXM4-40GB", "H100-SXM5-80GB"} {
			t.Run(tc.name+"/"+model, func(t *testing.T) {
				lib, srv, g := openMIGMachine(t, model, tc.ciInfoParent)
				p := g.MIGProfiles[0]
				for start := 0; start < 6; start++ {
					if _, err := lib.CreateMIG(g.UUID, p.GIProfileID, start); err != nil {
						t.Fatal(err)
					}
				}
				calls := countMIGLookups(srv, tc.failByIDs)
				inst, err := lib.CreateMIG(g.UUID, p.GIProfileID, 6)
				if err != nil {
					t.Fatal(err)
				}
				walk, byIDs := calls.walk.Load(), calls.byIDs.Load()
				if (walk > 0) != tc.wantWalk || (byIDs > 0) != tc.wantByIDs {
					t.Errorf("CreateMIG made %d nvmlDeviceGetMigDeviceHandleByIndex and %d MIG-GPU-... lookups; want walk %v, lookup %v", walk, byIDs, tc.wantWalk, tc.wantByIDs)
				}
				// The UUID is the MIG device's of these instance IDs.
				dev, ret := srv.DeviceGetHandleByUUID(inst.UUID)
				if ret != nvml.SUCCESS {
					t.Fatalf("UUID %q: %s", inst.UUID, nvml.ErrorString(ret))
				}
				giID, _ := dev.GetGpuInstanceId()
				ciID, _ := dev.GetComputeInstanceId()
				if !strings.HasPrefix(inst.UUID, "MIG-") || giID != inst.GIID || ciID != inst.CIID {
					t.Errorf("UUID %s is the MIG device of GI %d CI %d, want GI %d CI %d", inst.UUID, giID, ciID, inst.GIID, inst.CIID)
				}

				calls.walk.Store(0)
				list, err := lib.ListMIGOn(g.UUID)
				if err != nil || len(list) != 7 {
					t.Fatalf("ListMIGOn: %d instances, %v", len(list), err)
				}
				seen := map[string]bool{}
				for _, in := range list {
					seen[in.UUID] = true
					dev, ret := srv.DeviceGetHandleByUUID(in.UUID)
					if ret != nvml.SUCCESS {
						t.Fatalf("listed UUID %q: %s", in.UUID, nvml.ErrorString(ret))
					}
					if giID, _ := dev.GetGpuInstanceId(); giID != in.GIID {
						t.Errorf("listed UUID %s is GI %d's, listed as GI %d's", in.UUID, giID, in.GIID)
					}
				}
				if !seen[inst.UUID] || len(seen) != 7 {
					t.Errorf("ListMIGOn UUIDs %v, want 7 distinct with %s", seen, inst.UUID)
				}
				// A list walks at most once, however many instances miss.
				if walk := calls.walk.Load(); (walk > 0) != tc.wantWalk || walk > 7 {
					t.Errorf("ListMIGOn made %d nvmlDeviceGetMigDeviceHandleByIndex calls; want walk %v, at most one walk (7)", walk, tc.wantWalk)
				}
			})
		}
	}
}

// TestMIGProfileIDAsNvidiaSMIShowsIt checks that discovery, created and
// listed instances carry the GI profile ID `nvidia-smi mig -lgip` shows
// beside NVML's index, and that errors name both.
func TestMIGProfileIDAsNvidiaSMIShowsIt(t *testing.T) {
	for _, tc := range []struct {
		model string
		// want maps profile names to the IDs NVIDIA's MIG user guide
		// gives them.
		want map[string]int
	}{
		{"A100-SXM4-40GB", map[string]int{"1g.5gb": 19, "1g.5gb+me": 20, "1g.10gb": 15, "2g.10gb": 14, "3g.20gb": 9, "4g.20gb": 5, "7g.40gb": 0}},
		{"H100-SXM5-80GB", map[string]int{"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0}},
	} {
		t.Run(tc.model, func(t *testing.T) {
			lib, _, g := openMIGMachine(t, tc.model, false)
			got := map[string]int{}
			for _, p := range g.MIGProfiles {
				got[p.Name] = p.GIProfileInfoID
			}
			for name, id := range tc.want {
				if got[name] != id {
					t.Errorf("%s: GI profile ID %d, want %d (all: %v)", name, got[name], id, got)
				}
			}
			p := g.MIGProfiles[0]
			if p.GIProfileID != nvml.GPU_INSTANCE_PROFILE_1_SLICE || p.GIProfileInfoID != 19 {
				t.Fatalf("first profile %s: index %d, ID %d; want the 1g, 0 and 19", p.Name, p.GIProfileID, p.GIProfileInfoID)
			}
			inst, err := lib.CreateMIG(g.UUID, p.GIProfileID, 0)
			if err != nil {
				t.Fatal(err)
			}
			if inst.GIProfileID != 0 || inst.GIProfileInfoID != 19 {
				t.Errorf("created: GI profile index %d, ID %d; want 0 and 19", inst.GIProfileID, inst.GIProfileInfoID)
			}
			list, err := lib.ListMIGOn(g.UUID)
			if err != nil || len(list) != 1 || list[0] != inst {
				t.Errorf("ListMIGOn: %+v, %v; want %+v", list, err, inst)
			}
			_, err = lib.CreateMIG(g.UUID, p.GIProfileID, 0)
			if want := "MIG " + p.Name + " (GI profile ID 19, NVML index 0) at placement 0:1"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("second 1g at 0: error %v, want one naming %q", err, want)
			}
		})
	}
}
