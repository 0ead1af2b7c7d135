package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// The files of the demo node (make demo) in its run directory:
// hack/sim-node.sh copies the machine file there, and hack/plugin.sh starts
// the plugin with --state-dir <run dir>/facet-state, where the simulated
// NVML keeps its state.
const (
	demoMachineFile = "machine.yaml"
	demoStateFile   = "facet-state/simulated-nvml.json"
)

// errNoDemoNode: the run directory holds no demo node at all (as opposed
// to half of one, which is an error of its own).
var errNoDemoNode = errors.New("no demo node")

// demoNode is where a demo node keeps what facetctl reads.
type demoNode struct {
	machine, state string
}

// defaultRunDir is the demo's run directory as hack/cluster/up.sh picks
// it: $RUN_DIR, else $FACET_RUN_DIR (which the node's env.sh exports),
// else /tmp/facet-run.
func defaultRunDir() string {
	for _, env := range []string{"RUN_DIR", "FACET_RUN_DIR"} {
		if dir := os.Getenv(env); dir != "" {
			return dir
		}
	}
	return "/tmp/facet-run"
}

// findDemoNode finds the demo node's machine file and NVML state file in
// runDir. It returns an error wrapping errNoDemoNode when neither exists,
// and an error naming the missing file when only one does.
func findDemoNode(runDir string) (demoNode, error) {
	n := demoNode{machine: filepath.Join(runDir, demoMachineFile), state: filepath.Join(runDir, demoStateFile)}
	_, machineErr := os.Stat(n.machine)
	_, stateErr := os.Stat(n.state)
	switch {
	case machineErr == nil && stateErr == nil:
		return n, nil
	case machineErr != nil && stateErr != nil:
		return demoNode{}, fmt.Errorf("%w in %s (neither %s nor %s)", errNoDemoNode, runDir, demoMachineFile, demoStateFile)
	case machineErr != nil:
		return demoNode{}, fmt.Errorf("the demo node in %s has NVML state but no %s (started before hack/sim-node.sh kept it?): pass --machine FILE --nvml-state %s", runDir, demoMachineFile, n.state)
	default:
		return demoNode{}, fmt.Errorf("the demo node in %s has no %s (has its plugin run?): pass --machine %s --nvml-state FILE", runDir, demoStateFile, n.machine)
	}
}
