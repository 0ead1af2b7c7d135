package dradriver

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/inventory"
)

// modeSpy records the MIG mode changes the driver asks for, and what NVML
// answered.
type modeSpy struct {
	MIGManager
	mu    sync.Mutex
	calls []string
}

func (s *modeSpy) record(verb, uuid string, changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, fmt.Sprintf("%s %s: changed %v, error %v", verb, uuid, changed, err))
}

func (s *modeSpy) EnableMIG(uuid string) (bool, error) {
	changed, err := s.MIGManager.EnableMIG(uuid)
	s.record("enable", uuid, changed, err)
	return changed, err
}

func (s *modeSpy) DisableMIG(uuid string) (bool, error) {
	changed, err := s.MIGManager.DisableMIG(uuid)
	s.record("disable", uuid, changed, err)
	return changed, err
}

func (s *modeSpy) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.calls
	s.calls = nil
	return out
}

// spyOnModes puts a modeSpy between the driver and the simulated NVML.
func (r *rig) spyOnModes() *modeSpy {
	r.t.Helper()
	spy := &modeSpy{}
	r.wrapMIG = func(m MIGManager) MIGManager { spy.MIGManager = m; return spy }
	r.restart()
	return spy
}

// migEnabled reads GPU i's MIG mode from NVML.
func (r *rig) migEnabled(i int) bool {
	r.t.Helper()
	n, err := r.lib.Discover()
	if err != nil {
		r.t.Fatal(err)
	}
	return n.GPUs[i].MIGEnabled
}

// TestWholeGPUOnAmpereWithMIGModeOff: an A100's MIG mode is not Facet's to
// change (it would apply only after a GPU reset). With it off, a whole GPU
// and a vGPU share (dynamic falls back to shared) are prepared: the driver
// asks to leave MIG mode, and NVML answers at once that there is nothing
// to change, without trying to change it (nvml.DisableMIG returns before
// SetMigMode when the mode is what is wanted, which internal/nvml/sim's
// TestMIGModeFixedBeforeHopper counts).
func TestWholeGPUOnAmpereWithMIGModeOff(t *testing.T) {
	r := newRigOn(t, "dgx-a100-80gb", false, inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{2: inventory.ModeDynamic}})
	if g := r.inv.GPUs[2]; g.Mode != inventory.ModeShared || !strings.Contains(g.ModeNote, "MIG mode is off and stays so") {
		t.Fatalf("GPU 2: mode %s (%s), want shared", g.Mode, g.ModeNote)
	}
	spy := r.spyOnModes()
	whole := claim("whole", "gpu-0", "gpu-1")
	if err := r.prepare(whole)[whole.UID].Err; err != nil {
		t.Fatal(err)
	}
	sh := share("share", "gpu-2", "8Gi", 20)
	if err := r.prepare(sh)[sh.UID].Err; err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, i := range []int{0, 1, 2} {
		want = append(want, "disable "+r.inv.GPUs[i].UUID+": changed false, error <nil>")
	}
	if got := spy.take(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MIG mode calls:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, i := range []int{0, 1, 2} {
		if r.migEnabled(i) {
			t.Errorf("GPU %d: MIG mode on", i)
		}
	}
	for uid, err := range r.unprepare(whole.UID, sh.UID) {
		if err != nil {
			t.Errorf("unprepare %s: %v", uid, err)
		}
	}
	if got := spy.take(); len(got) != 0 {
		t.Errorf("MIG mode calls at unprepare: %q", got)
	}
}

// TestMIGOnAmpereWithMIGModeOn: an A100 whose admin turned MIG mode on
// publishes MIG devices and no whole GPU; the driver carves there without
// changing the mode (EnableMIG finds it on), and leaves it on after.
func TestMIGOnAmpereWithMIGModeOn(t *testing.T) {
	needMIGEdits(t)
	r := newRigOn(t, "dgx-a100-80gb", true, inventory.Config{DefaultMode: inventory.ModeMIG})
	if _, ok := r.inv.Device("gpu-0"); ok {
		t.Fatal("gpu-0 published on an A100 with MIG mode on")
	}
	spy := r.spyOnModes()
	small := claim("small", r.migDevice(0, "1g.10gb", 6))
	if err := r.prepare(small)[small.UID].Err; err != nil {
		t.Fatal(err)
	}
	if in, _ := r.lib.ListMIG(); len(in) != 1 || in[0].Profile != "1g.10gb" || in[0].Placement.Start != 6 {
		t.Fatalf("instances after prepare: %+v", in)
	}
	if got, want := spy.take(), []string{"enable " + r.inv.GPUs[0].UUID + ": changed false, error <nil>"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MIG mode calls %q, want %q", got, want)
	}
	if err := r.unprepare(small.UID)[small.UID]; err != nil {
		t.Fatal(err)
	}
	if n := r.migCount(); n != 0 || !r.migEnabled(0) {
		t.Fatalf("after unprepare: %d instances, MIG mode on %v; want 0 and on", n, r.migEnabled(0))
	}
	// gpu-0 is not this node's device: a claim for it is refused.
	whole := claim("whole", "gpu-0")
	if err := r.prepare(whole)[whole.UID].Err; err == nil || !strings.Contains(err.Error(), "gpu-0") {
		t.Fatalf("whole GPU: %v", err)
	}
	if got := spy.take(); len(got) != 0 {
		t.Errorf("MIG mode calls for the refused claim: %q", got)
	}
}
