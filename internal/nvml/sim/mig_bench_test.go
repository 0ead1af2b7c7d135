package sim

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// BenchmarkCarveAndPrepareFullGPU is the NVML side of preparing the last
// 1g MIG device of a full GPU (six 1g instances exist): carve it
// (CreateMIG), look it up as a re-prepare or unprepare does (ListMIGOn,
// driver.findOwnMIG), and destroy it. Simulated NVML calls cost
// microseconds, where a real driver under load takes far longer per call,
// so the figures to compare between builds are walk/op, the
// nvmlDeviceGetMigDeviceHandleByIndex calls of one cycle, and
// carve-walk/op, those of its CreateMIG.
func BenchmarkCarveAndPrepareFullGPU(b *testing.B) {
	for _, model := range []string{"A100-SXM4-40GB", "H100-SXM5-80GB"} {
		b.Run(model, func(b *testing.B) {
			m := &Machine{Name: "bench-" + strings.ToLower(model), DriverVersion: simDriverVersion, CUDADriverVersion: "13.0",
				GPUs: []MachineGPU{{Model: model, PCIBusID: "0000:80:00.0", MIGEnabled: true}}}
			lib, srv, err := openSimulated(m)
			if err != nil {
				b.Fatal(err)
			}
			defer lib.Close()
			dev := srv.Devices[0].(*server.Device)
			var walk atomic.Int64
			byIndex := dev.GetMigDeviceHandleByIndexFunc
			dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				walk.Add(1)
				return byIndex(i)
			}
			node, err := lib.Discover()
			if err != nil {
				b.Fatal(err)
			}
			g := node.GPUs[0]
			var oneSlice = -1
			for _, p := range g.MIGProfiles {
				if p.SliceCount == 1 && p.MemorySlices == 1 && !strings.Contains(p.Name, "+") {
					oneSlice = p.GIProfileID
				}
			}
			if oneSlice < 0 {
				b.Fatalf("%s: no 1g profile", model)
			}
			for start := 0; start < 6; start++ {
				if _, err := lib.CreateMIG(g.UUID, oneSlice, start); err != nil {
					b.Fatal(err)
				}
			}
			walk.Store(0)
			n, carveWalk := 0, int64(0)
			for b.Loop() {
				before := walk.Load()
				in, err := lib.CreateMIG(g.UUID, oneSlice, 6)
				if err != nil {
					b.Fatal(err)
				}
				carveWalk += walk.Load() - before
				list, err := lib.ListMIGOn(g.UUID)
				if err != nil || len(list) != 7 {
					b.Fatalf("ListMIGOn: %d instances, %v", len(list), err)
				}
				if err := lib.DestroyMIG(g.UUID, in.GIID, in.CIID); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(carveWalk)/float64(n), "carve-walk/op")
			b.ReportMetric(float64(walk.Load())/float64(n), "walk/op")
		})
	}
}
