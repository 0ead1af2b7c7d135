//go:build !facetsim

package main

import (
	"errors"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// The shipped build links neither the simulator (internal/nvml/sim) nor
// go-nvml's mock, so it cannot simulate a node.
var errNoSimulator = errors.New("--machine: this facet-kubeletplugin is built without the simulator (build with -tags facetsim, as `make build` does)")

func openMachine(string, string) (*nvmlgpu.Library, error) { return nil, errNoSimulator }

func bindSimulatedProcDriver(string) error { return errNoSimulator }
