package mps

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
)

// The daemon's lifecycle on the simulated driver root's stand-in (a shell
// script): Facet's own costs plus a few process starts, not NVIDIA's
// daemon's. Run: go test ./pkg/node/mps -run '^$' -bench . -benchtime 20x

// BenchmarkStart times a GPU's first Acquire: fresh directories, "-d",
// the pid file read back and checked, the record written.
func BenchmarkStart(b *testing.B) {
	n := newNode(b)
	_, ctx := ktesting.NewTestContext(b)
	m := n.plugin(nil)
	for b.Loop() {
		if err := m.Acquire(ctx, gpuA, "claim", 0); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := m.Release(ctx, "claim"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkAdopt times a restarted plugin's Restore of a GPU whose daemon
// runs: the record read, the process checked in /proc.
func BenchmarkAdopt(b *testing.B) {
	n := newNode(b)
	_, ctx := ktesting.NewTestContext(b)
	if err := n.plugin(nil).Acquire(ctx, gpuA, "claim", 0); err != nil {
		b.Fatal(err)
	}
	holders := map[string]map[types.UID]int64{gpuA: {"claim": 0}}
	for b.Loop() {
		restarted, err := n.plugin(nil).Restore(ctx, holders)
		if err != nil || len(restarted) != 0 {
			b.Fatal(restarted, err)
		}
	}
}

// BenchmarkStop times the last Release: "quit" through the control
// program, the wait for the daemon to end, the directories removed.
func BenchmarkStop(b *testing.B) {
	n := newNode(b)
	_, ctx := ktesting.NewTestContext(b)
	m := n.plugin(nil)
	for b.Loop() {
		b.StopTimer()
		if err := m.Acquire(ctx, gpuA, "claim", 0); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := m.Release(ctx, "claim"); err != nil {
			b.Fatal(err)
		}
	}
}
