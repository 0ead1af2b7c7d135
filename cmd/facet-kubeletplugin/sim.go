//go:build facetsim

package main

import (
	"path/filepath"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// openMachine simulates the node of a machine file; its MIG state lives in
// stateFile, so that plugin restarts see the instances, as on a real GPU.
// Faults injected with `facetctl fault` reach it through the state
// directory's sim.FaultFileName.
func openMachine(path, stateFile string) (*nvmlgpu.Library, error) {
	return sim.OpenMachine(path, sim.WithStateFile(stateFile), sim.WithFaultFile(filepath.Join(filepath.Dir(stateFile), sim.FaultFileName)))
}

// bindSimulatedProcDriver binds the simulated driver root's
// /proc/driver/nvidia-caps where nvcdi reads it (see sim.BindSimulatedProcDriver).
func bindSimulatedProcDriver(driverRoot string) error {
	return sim.BindSimulatedProcDriver(driverRoot)
}
