// Package nvmlgpu is Facet's only door to NVIDIA's management library.
//
// Nothing else in Facet imports github.com/NVIDIA/go-nvml (or nvcdi, which is
// built on it), except its subpackage sim. The real backend is
// libnvidia-ml.so.1 (OpenReal). Any other go-nvml nvml.Interface can be wrapped
// with New: the simulator (internal/nvml/sim) hands its go-nvml mock server in
// there, so a simulated node goes through the same discovery, MIG and CDI
// code as a real one. This package itself links no mock code: the shipped
// kubelet plugin imports only it.
//
// Dynamic MIG (mig.go) goes through the same seam: EnableMIG, CreateMIG
// (a GPU instance at a placement and the compute instance spanning it),
// DestroyMIG, ListMIG and CanCreateTogether.
package nvmlgpu
