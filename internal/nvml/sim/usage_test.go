package sim

import (
	"testing"
)

// TestUsage: nvml.Usage on the simulator as on a real H100: an idle GPU
// reports 0 % and no memory in use (v2 leaves the reserved memory out);
// with MIG mode on NVML reports no utilization per GPU, and each MIG
// device's memory by its GPU instance ID.
func TestUsage(t *testing.T) {
	lib, g := migGPU(t, "H100-SXM5-80GB", 2)
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	idle, err := lib.Usage(node.GPUs[1].UUID)
	if err != nil || idle.UtilizationPercent != 0 || idle.MemoryUsedBytes != 0 || len(idle.MIG) != 0 {
		t.Fatalf("idle GPU: %+v, %v", idle, err)
	}
	inst := mustCreate(t, lib, g.UUID, profileNamed(t, g, "1g.10gb"), 6)
	u, err := lib.Usage(g.UUID)
	if err != nil || u.UtilizationPercent != -1 || len(u.MIG) != 1 || u.MIG[0].GIID != inst.GIID || u.MIG[0].MemoryUsedBytes != 0 {
		t.Fatalf("MIG GPU with one instance (GI %d): %+v, %v", inst.GIID, u, err)
	}
	if _, err := lib.Usage("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("a GPU NVML does not know: no error")
	}
}
