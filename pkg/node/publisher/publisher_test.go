package publisher

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

type sink struct {
	last  *resourceslice.DriverResources
	calls int
	err   error
}

func (s *sink) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	s.calls++
	if s.err != nil {
		return s.err
	}
	s.last = &res
	return nil
}

type faultSink struct{ faults map[string]gpuhealth.Fault }

func (f *faultSink) SetFaults(faults map[string]gpuhealth.Fault) { f.faults = faults }

type rig struct {
	p      *Publisher
	sink   *sink
	faults *faultSink
	mon    *gpuhealth.Monitor
	gpus   []string
}

// newRig is a Publisher of the l4x4 machine (4 GPUs, exclusive: one
// device each) whose last GPU is unusable.
func newRig(t *testing.T, gates features.Set) *rig {
	t.Helper()
	node, err := sim.DiscoverMachine("../../../demo/machines/l4x4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeExclusive, Features: &gates})
	if err != nil {
		t.Fatal(err)
	}
	var gpus []string
	for _, g := range inv.GPUs {
		gpus = append(gpus, g.UUID)
	}
	mon, _, err := gpuhealth.Open(gpuhealth.Options{GPUs: gpus, QuietPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{sink: &sink{}, faults: &faultSink{}, mon: mon, gpus: gpus}
	r.p = New(Options{
		Sink: r.sink, Inventory: inv, Unusable: map[string]string{gpus[3]: "broken at start"},
		Gates: gates, Node: "node-a", Faults: r.faults, Monitor: mon, Metrics: nodemetrics.New(),
	})
	return r
}

// published returns the published devices' GPU UUIDs with their taints.
func (r *rig) published(t *testing.T) map[string][]resourceapi.DeviceTaint {
	t.Helper()
	if r.sink.last == nil {
		t.Fatal("nothing published")
	}
	out := map[string][]resourceapi.DeviceTaint{}
	for _, s := range r.sink.last.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			uuid := d.Attributes[names.AttrUUID].StringValue
			if uuid == nil {
				t.Fatalf("device %s has no %s", d.Name, names.AttrUUID)
			}
			out[*uuid] = append(out[*uuid], d.Taints...)
		}
	}
	return out
}

func taintGates() features.Set {
	s := features.Stock("test")
	s.Enabled[features.DeviceTaints] = true
	return s
}

// TestPublish: faulted GPUs are tainted where the cluster enforces
// DRADeviceTaints (NoSchedule when recoverable, NoExecute when fatal) and
// left out where it does not; an unusable GPU is never published; the
// driver gets the faults either way.
func TestPublish(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gates features.Set
		// want is, by GPU index, "" (published, untainted), "out", or the
		// taint's effect.
		want [4]string
	}{
		{"taints enforced", taintGates(), [4]string{"", "NoSchedule", "NoExecute", "out"}},
		{"stock cluster", features.Stock("test"), [4]string{"", "out", "out", "out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.gates)
			if _, err := r.mon.Observe(nvmlgpu.HealthEvent{GPU: r.gpus[1], Reason: "xid-13", Detail: "XID 13"}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.mon.Observe(nvmlgpu.HealthEvent{GPU: r.gpus[2], Reason: "xid-79", Detail: "fell off the bus", Fatal: true}); err != nil {
				t.Fatal(err)
			}
			n, err := r.p.Publish(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if n != len(r.sink.last.Pools["node-a"].Slices) || n == 0 {
				t.Errorf("Publish returned %d slices, published %d", n, len(r.sink.last.Pools["node-a"].Slices))
			}
			got := r.published(t)
			for i, want := range tc.want {
				taints, in := got[r.gpus[i]]
				switch {
				case want == "out":
					if in {
						t.Errorf("GPU %d published, want it left out", i)
					}
				case !in:
					t.Errorf("GPU %d not published", i)
				case want == "":
					if len(taints) != 0 {
						t.Errorf("GPU %d tainted %v, want none", i, taints)
					}
				default:
					if len(taints) != 1 || taints[0].Key != names.TaintUnhealthy || string(taints[0].Effect) != want || taints[0].TimeAdded == nil {
						t.Errorf("GPU %d taints %+v, want one %s=...:%s with a time", i, taints, names.TaintUnhealthy, want)
					}
				}
			}
			if len(r.faults.faults) != 2 || !r.faults.faults[r.gpus[2]].Fatal {
				t.Errorf("driver's faults %v, want GPUs 1 and 2, 2 fatal", r.faults.faults)
			}
		})
	}
	r := newRig(t, taintGates())
	r.sink.err = errors.New("API server gone")
	if _, err := r.p.Publish(context.Background()); err == nil || !strings.Contains(err.Error(), "API server gone") {
		t.Errorf("a failing sink: %v", err)
	}
}

type migUse struct {
	mu  sync.Mutex
	set map[string]bool
}

func (m *migUse) MIGInUse() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.set)
}

type lockedSink struct {
	mu   sync.Mutex
	last *resourceslice.DriverResources
}

func (s *lockedSink) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &res
	return nil
}

// inUse returns each published device's migInUse by GPU index ("-" where
// the device has none).
func (s *lockedSink) inUse() map[int64]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]string{}
	for _, sl := range s.last.Pools["node-a"].Slices {
		for _, d := range sl.Devices {
			v := "-"
			if a, ok := d.Attributes[names.AttrMIGInUse]; ok {
				v = strconv.FormatBool(*a.BoolValue)
			}
			i := *d.Attributes[names.AttrIndex].IntValue
			if prev, ok := out[i]; ok && prev != v {
				v = "mixed"
			}
			out[i] = v
		}
	}
	return out
}

// TestWatchMIGUse: every device of a GPU in mig mode carries migInUse, true
// exactly on the GPUs the driver says hold carved instances, and a signal
// on the driver's channel republishes with the new set. GPUs in other
// modes carry none.
func TestWatchMIGUse(t *testing.T) {
	node, err := sim.DiscoverMachine("../../../demo/machines/dgx-h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeMIG, PerGPU: map[int]inventory.Mode{7: inventory.ModeExclusive}})
	if err != nil {
		t.Fatal(err)
	}
	mon, _, err := gpuhealth.Open(gpuhealth.Options{QuietPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	use := &migUse{set: map[string]bool{}}
	s := &lockedSink{}
	p := New(Options{Sink: s, Inventory: inv, Gates: features.Stock("test"), Node: "node-a", Faults: &faultSink{}, Monitor: mon, MIGUse: use})
	p.gates.Enabled[features.PartitionableDevices] = true
	if _, err := p.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{0: "false", 1: "false", 2: "false", 3: "false", 4: "false", 5: "false", 6: "false", 7: "-"}
	if got := s.inUse(); !maps.Equal(got, want) {
		t.Fatalf("migInUse by GPU %v, want %v", got, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := make(chan struct{}, 1)
	go p.WatchMIGUse(ctx, changes)
	use.mu.Lock()
	use.set[inv.GPUs[2].UUID] = true
	use.mu.Unlock()
	changes <- struct{}{}
	want[2] = "true"
	deadline := time.Now().Add(10 * time.Second)
	for got := s.inUse(); !maps.Equal(got, want); got = s.inUse() {
		if time.Now().After(deadline) {
			t.Fatalf("after the signal: migInUse by GPU %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
