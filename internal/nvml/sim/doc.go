// Package sim simulates a GPU node for the demo, the tests and facetctl.
//
// A machine file (demo/machines/*.yaml, see Machine) describes the node;
// OpenMachine builds it on go-nvml's own mock GPUs
// (github.com/NVIDIA/go-nvml/pkg/nvml/mock), with Facet-defined models for
// GPUs the mock lacks, and hands the mock to nvml.New, so the simulated node
// runs Facet's production NVML code. Where the mock is not the card, Facet's
// tables (models.go) win: memory totals and the driver's reserved memory
// (NVML memory info v2), MIG profile memory in MiB as NVML reports it, SMs,
// engines and placements, held to the measured H100 and H200 by
// TestSimulatedCardsMatchMeasured.
//
// The simulated backend refuses what the hardware refuses (mig.go: MIG
// mode, placements, overlapping memory slices, one media extension per GPU,
// the driver's instance IDs) and, with WithStateFile, keeps MIG state across
// processes (state.go). root.go lays out a simulated driver root (libraries,
// binaries, device nodes) for the CDI specs.
//
// The tests here also cover package nvmlgpu's discovery, MIG and CDI code,
// which needs a node to run on.
//
// The shipped facet-kubeletplugin does not link this package: only its
// -tags facetsim build does (cmd/facet-kubeletplugin/sim.go).
package sim
