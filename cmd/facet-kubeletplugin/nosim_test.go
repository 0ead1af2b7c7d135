//go:build !facetsim

package main

import (
	"context"
	"errors"
	"testing"
)

// TestShippedBuildRefusesMachine: without the simulator, --machine is an
// error that says how to get one.
func TestShippedBuildRefusesMachine(t *testing.T) {
	f, err := parseFlags([]string{"--node-name", "n", "--state-dir", t.TempDir(), "--machine", "demo/machines/dgx-h100.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), f); !errors.Is(err, errNoSimulator) {
		t.Fatalf("run: %v, want errNoSimulator", err)
	}
	if err := bindSimulatedProcDriver("/"); !errors.Is(err, errNoSimulator) {
		t.Fatalf("bindSimulatedProcDriver: %v", err)
	}
}
