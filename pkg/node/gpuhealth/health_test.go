package gpuhealth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func fault(gpu, reason string, fatal bool) nvmlgpu.HealthEvent {
	return nvmlgpu.HealthEvent{GPU: gpu, Reason: reason, Fatal: fatal, Detail: reason}
}

func ok(gpu string) nvmlgpu.HealthEvent { return nvmlgpu.HealthEvent{GPU: gpu, Healthy: true} }

func TestObserve(t *testing.T) {
	const quiet = time.Minute
	type step struct {
		after time.Duration
		ev    nvmlgpu.HealthEvent
		// want: "" no change, "fault", "fatal", "recovered"
		want string
	}
	tests := []struct {
		name  string
		steps []step
		// faulted is whether GPU-a is faulted at the end.
		faulted bool
	}{
		{"healthy probes change nothing", []step{{0, ok("GPU-a"), ""}, {time.Hour, ok("GPU-a"), ""}}, false},
		{"recoverable fault clears after the quiet period", []step{
			{0, fault("GPU-a", "nvml-query-failed", false), "fault"},
			{time.Second, ok("GPU-a"), ""},
			{30 * time.Second, ok("GPU-a"), ""},
			{31 * time.Second, ok("GPU-a"), "recovered"},
		}, false},
		{"a new fault restarts the quiet period", []step{
			{0, fault("GPU-a", "xid-92", false), "fault"},
			{50 * time.Second, ok("GPU-a"), ""},
			{5 * time.Second, fault("GPU-a", "xid-92", false), ""},
			{55 * time.Second, ok("GPU-a"), ""},
			{time.Minute, ok("GPU-a"), "recovered"},
		}, false},
		{"a fatal fault never clears by itself", []step{
			{0, fault("GPU-a", "xid-79", true), "fatal"},
			{time.Second, ok("GPU-a"), ""},
			{time.Hour, ok("GPU-a"), ""},
		}, true},
		{"a recoverable fault grows fatal", []step{
			{0, fault("GPU-a", "xid-92", false), "fault"},
			{time.Second, fault("GPU-a", "gpu-lost", true), "fatal"},
			{time.Hour, ok("GPU-a"), ""},
			{time.Hour, ok("GPU-a"), ""},
		}, true},
		{"other GPUs are unaffected", []step{
			{0, fault("GPU-b", "xid-79", true), "fatal"},
			{time.Second, ok("GPU-a"), ""},
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)}
			m, _, err := Open(Options{QuietPeriod: quiet, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				c.advance(s.after)
				ch, err := m.Observe(s.ev)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				switch {
				case ch == nil:
				case ch.Fault == nil:
					got = "recovered"
				case ch.Fault.Fatal:
					got = "fatal"
				default:
					got = "fault"
				}
				if got != s.want {
					t.Errorf("step %d (%+v): change %q, want %q", i, s.ev, got, s.want)
				}
			}
			if _, faulted := m.Faults()["GPU-a"]; faulted != tc.faulted {
				t.Errorf("GPU-a faulted = %v, want %v", faulted, tc.faulted)
			}
		})
	}
}

func TestRecover(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC)}
	m, _, err := Open(Options{QuietPeriod: time.Minute, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Observe(fault("GPU-a", "xid-79", true)); err != nil {
		t.Fatal(err)
	}
	answers := func(string) error { return nil }
	dead := func(string) error { return errors.New("ERROR_GPU_IS_LOST") }
	before := c.t.Add(-time.Second)

	if _, err := m.Recover("GPU-a", before, answers); err == nil || !strings.Contains(err.Error(), "came after the recovery request") {
		t.Errorf("request older than the fault: %v", err)
	}
	c.advance(time.Minute)
	if _, err := m.Recover("GPU-a", c.t, dead); err == nil || !strings.Contains(err.Error(), "does not answer NVML") {
		t.Errorf("GPU that does not answer: %v", err)
	}
	if len(m.Faults()) != 1 {
		t.Fatal("a failed recovery cleared the fault")
	}
	ch, err := m.Recover("GPU-a", c.t, answers)
	if err != nil || ch == nil || ch.Fault != nil {
		t.Fatalf("Recover: %+v, %v", ch, err)
	}
	if len(m.Faults()) != 0 {
		t.Error("fault still there after Recover")
	}
	if ch, err := m.Recover("GPU-a", c.t, answers); ch != nil || err != nil {
		t.Errorf("Recover of a healthy GPU: %+v, %v", ch, err)
	}
}

func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "health.json")
	gpus := []string{"GPU-a", "GPU-b"}
	m, _, err := Open(Options{Path: path, BootID: "boot-1", GPUs: gpus, QuietPeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Observe(fault("GPU-a", "xid-79", true)); err != nil {
		t.Fatal(err)
	}

	// A restart in the same boot keeps the fault.
	m, changes, err := Open(Options{Path: path, BootID: "boot-1", GPUs: gpus, QuietPeriod: time.Minute})
	if err != nil || len(changes) != 0 {
		t.Fatalf("reopen: %v, %v", changes, err)
	}
	if f, ok := m.Faults()["GPU-a"]; !ok || f.Reason != "xid-79" || f.Effect() != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("after restart: %+v", m.Faults())
	}

	// A reboot drops it, saying so.
	m, changes, err = Open(Options{Path: path, BootID: "boot-2", GPUs: gpus, QuietPeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Faults()) != 0 || len(changes) != 1 || changes[0].Fault != nil || !strings.Contains(changes[0].Why, "rebooted") {
		t.Errorf("after reboot: faults %v, changes %+v", m.Faults(), changes)
	}

	// An unreadable file faults every GPU, recoverably, and is moved aside.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, changes, err = Open(Options{Path: path, BootID: "boot-2", GPUs: gpus, QuietPeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 2 || len(m.Faults()) != 2 || m.Faults()["GPU-b"].Fatal || m.Faults()["GPU-b"].Reason != "health-record-unreadable" {
		t.Errorf("corrupt file: faults %+v, changes %+v", m.Faults(), changes)
	}
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Errorf("corrupt file not kept aside: %v", err)
	}
}

func TestParseRecoverRequests(t *testing.T) {
	at := "2026-11-23T16:00:00Z"
	tests := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"", 0, ""},
		{"GPU-5d2c@" + at, 1, ""},
		{"3@" + at + ", all@" + at, 2, ""},
		{"GPU-5d2c", 0, "want <gpu"},
		{"gpu3@" + at, 0, "neither a GPU UUID"},
		{"3@yesterday", 0, "time"},
	}
	for _, tc := range tests {
		got, err := ParseRecoverRequests(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: got %v, want error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tc.want {
			t.Errorf("%q: got %v, %v", tc.in, got, err)
			continue
		}
		if back, _ := ParseRecoverRequests(FormatRecoverRequests(got)); len(back) != len(got) {
			t.Errorf("%q does not round-trip", tc.in)
		}
	}
}
