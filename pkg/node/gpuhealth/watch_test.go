package gpuhealth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

type event struct{ typ, reason, msg string }

type events struct{ got []event }

func (e *events) Normal(reason, msg string)  { e.got = append(e.got, event{"Normal", reason, msg}) }
func (e *events) Warning(reason, msg string) { e.got = append(e.got, event{"Warning", reason, msg}) }

// fakeNVML reports evs from WatchHealth, then returns watchErr; ProbeGPU
// fails for the GPUs in dead.
type fakeNVML struct {
	evs      []nvmlgpu.HealthEvent
	watchErr error
	watched  []string
	dead     map[string]bool
}

func (f *fakeNVML) WatchHealth(_ context.Context, uuids []string, _ time.Duration, report func(nvmlgpu.HealthEvent)) error {
	f.watched = uuids
	for _, ev := range f.evs {
		report(ev)
	}
	return f.watchErr
}

func (f *fakeNVML) ProbeGPU(uuid string) error {
	if f.dead[uuid] {
		return errors.New("GPU is lost")
	}
	return nil
}

type watchRig struct {
	w    *Watch
	mon  *Monitor
	ev   *events
	gpus []string
	// changed are the faults the monitor had at each Changed call.
	changed []map[string]Fault
}

// newWatchRig watches the l4x4 machine (4 GPUs) whose last GPU is
// unusable.
func newWatchRig(t *testing.T, tainted bool) *watchRig {
	t.Helper()
	node, err := sim.DiscoverMachine("../../../demo/machines/l4x4.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeExclusive})
	if err != nil {
		t.Fatal(err)
	}
	r := &watchRig{ev: &events{}}
	for _, g := range inv.GPUs {
		r.gpus = append(r.gpus, g.UUID)
	}
	if r.mon, _, err = Open(Options{GPUs: r.gpus, QuietPeriod: time.Hour}); err != nil {
		t.Fatal(err)
	}
	r.w = NewWatch(WatchOptions{
		Monitor: r.mon, Inventory: inv, Unusable: map[string]string{r.gpus[3]: "broken at start"}, Node: "node-a",
		Tainted: tainted, Events: r.ev,
		Changed: func(context.Context) { r.changed = append(r.changed, r.mon.Faults()) },
	})
	return r
}

// TestWatchNVML: NVML's fault reports reach the monitor, the Node's
// Events and the plugin (Changed); the unusable GPU is not watched; a
// degraded watch is a Warning.
func TestWatchNVML(t *testing.T) {
	r := newWatchRig(t, true)
	lib := &fakeNVML{
		evs: []nvmlgpu.HealthEvent{
			{GPU: r.gpus[0], Reason: "xid-48", Detail: "double-bit ECC", Fatal: true},
			{GPU: r.gpus[1], Healthy: true},
		},
		watchErr: errors.New("event set unsupported"),
	}
	r.w.WatchNVML(context.Background(), lib, time.Second)
	if strings.Join(lib.watched, ",") != strings.Join(r.gpus[:3], ",") {
		t.Errorf("watched %v, want the usable GPUs %v", lib.watched, r.gpus[:3])
	}
	if len(r.changed) != 1 || !r.changed[0][r.gpus[0]].Fatal {
		t.Errorf("Changed saw faults %v, want once, GPU 0 fatal", r.changed)
	}
	if len(r.ev.got) != 2 || r.ev.got[0].reason != ReasonGPUUnhealthy || !strings.Contains(r.ev.got[0].msg, "facetctl health recover --node node-a") ||
		!strings.Contains(r.ev.got[0].msg, "carry the taint "+names.TaintUnhealthy+"=xid-48:NoExecute") || r.ev.got[1].reason != ReasonHealthWatch {
		t.Errorf("events %+v, want %s (the taint, how to recover) then %s", r.ev.got, ReasonGPUUnhealthy, ReasonHealthWatch)
	}
}

// TestRecoverRequests: each request is acted on once; a malformed
// annotation is one Warning; a GPU that does not answer NVML stays out;
// one that does is offered again.
func TestRecoverRequests(t *testing.T) {
	r := newWatchRig(t, false)
	ctx := context.Background()
	for _, i := range []int{0, 1} {
		if _, err := r.mon.Observe(nvmlgpu.HealthEvent{GPU: r.gpus[i], Reason: "xid-79", Detail: "fell off the bus", Fatal: true}); err != nil {
			t.Fatal(err)
		}
	}
	lib := &fakeNVML{dead: map[string]bool{r.gpus[1]: true}}
	done := map[RecoverRequest]bool{}

	r.w.handleRecoverRequests(ctx, lib, "nonsense", done)
	r.w.handleRecoverRequests(ctx, lib, "nonsense", done)
	if len(r.ev.got) != 1 || r.ev.got[0].reason != ReasonGPURecoveryFailed || !strings.Contains(r.ev.got[0].msg, names.AnnotationRecover) {
		t.Fatalf("malformed annotation twice: events %+v, want one %s", r.ev.got, ReasonGPURecoveryFailed)
	}

	// A request from before the faults recovers nothing.
	old := FormatRecoverRequests([]RecoverRequest{{GPU: "all", At: time.Now().Add(-time.Hour)}})
	r.ev.got = nil
	r.w.handleRecoverRequests(ctx, lib, old, done)
	if len(r.mon.Faults()) != 2 || len(r.ev.got) != 2 || len(r.changed) != 0 {
		t.Fatalf("a request older than the faults: faults %v, events %+v, %d changes", r.mon.Faults(), r.ev.got, len(r.changed))
	}

	value := FormatRecoverRequests([]RecoverRequest{{GPU: "all", At: time.Now().Add(time.Second)}})
	r.ev.got = nil
	r.w.handleRecoverRequests(ctx, lib, value, done)
	if len(r.changed) != 1 {
		t.Fatalf("%d changes after recovering GPU 0, want 1", len(r.changed))
	}
	if _, still := r.changed[0][r.gpus[0]]; still {
		t.Error("GPU 0 answers NVML but kept its fault")
	}
	if _, still := r.changed[0][r.gpus[1]]; !still {
		t.Error("GPU 1 does not answer NVML but lost its fault")
	}
	var reasons []string
	for _, e := range r.ev.got {
		reasons = append(reasons, e.reason)
	}
	if len(reasons) != 2 || !strings.Contains(strings.Join(reasons, ","), ReasonGPURecovered) || !strings.Contains(strings.Join(reasons, ","), ReasonGPURecoveryFailed) {
		t.Errorf("events %v, want one %s and one %s", reasons, ReasonGPURecovered, ReasonGPURecoveryFailed)
	}
	r.w.handleRecoverRequests(ctx, lib, value, done)
	if len(r.changed) != 1 || len(r.ev.got) != 2 {
		t.Error("the same request was acted on twice")
	}
}
