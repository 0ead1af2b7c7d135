// Package nvml is Facet's only door to NVIDIA's management library.
//
// Nothing else in Facet imports github.com/NVIDIA/go-nvml (or nvcdi, which is
// built on it). The package has two backends behind one code path:
//
//   - the real libnvidia-ml.so.1, used in production (OpenReal);
//   - a simulated node described by a machine file (OpenMachine), built on
//     go-nvml's own mock GPUs (github.com/NVIDIA/go-nvml/pkg/nvml/mock), with
//     Facet-defined models for GPUs the mock lacks (see models.go).
//
// Both backends hand the same gonvml.Interface to the same discovery code, so
// what the tests exercise is what runs on a GPU node.
//
// Dynamic MIG (mig.go) goes through the same seam: EnableMIG, CreateMIG
// (a GPU instance at a placement and the compute instance spanning it),
// DestroyMIG, ListMIG and CanCreateTogether. The simulated backend refuses
// what the hardware refuses (sim_mig.go: MIG mode, placements, overlapping
// memory slices, one media extension per GPU, the driver's instance IDs)
// and, with WithStateFile, keeps MIG state across processes (sim_state.go).
package nvml
