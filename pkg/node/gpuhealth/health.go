// Package gpuhealth is the node's GPU health, in one place: the GPUs'
// faults (Monitor: which GPU is out of scheduling, why, since when, and
// how it comes back), the watch that keeps them current (Watch: NVML's
// health events and the operator's recovery requests, each change an
// Event on the Node), the device taint a fault puts on the slices
// (Fault.Taint), and the devices' health as the kubelet streams it
// (Kubelet). NVML itself is read in package nvmlgpu, the only door to it;
// the slices are published by package publisher, and claims on a GPU
// with a fatal fault are refused by package dradriver, both with the
// faults they are handed (Monitor.Faults).
//
// Faults come from NVML (nvmlgpu.Library.WatchHealth: XIDs, double-bit ECC
// errors, a GPU fallen off the bus, failing queries). Two classes:
//
//   - fatal (NVIDIA's documented resolution is a GPU reset or a reboot):
//     the GPU's devices get the NoExecute taint where DRADeviceTaints is
//     enforced, and prepare refuses new claims on it. It comes back only
//     when an operator asks (Recover, from the Node annotation
//     names.AnnotationRecover) and the GPU then answers NVML.
//   - recoverable (other critical XIDs, failing queries): NoSchedule. It
//     comes back by itself once the GPU has answered every probe for the
//     quiet period without a new fault, or when an operator asks.
//
// Faults are kept in a file with the boot ID, so a plugin restart keeps
// them and a reboot (which resets every GPU) drops them. A file that
// cannot be read fails closed: every GPU gets a recoverable fault, so
// nothing new lands on a GPU whose history is unknown until it has
// proven itself for a quiet period.
package gpuhealth

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// Fault is why a GPU is out of scheduling.
type Fault struct {
	// GPU is the physical GPU's UUID.
	GPU string `json:"gpu"`
	// Reason is short and stable ("xid-79", "ecc-dbe", "gpu-lost",
	// "nvml-query-failed"): the device taint's value.
	Reason string `json:"reason"`
	// Detail is a sentence for Events.
	Detail string `json:"detail"`
	// Fatal faults need an operator's Recover.
	Fatal bool `json:"fatal"`
	// Since is the first observation of this fault episode.
	Since time.Time `json:"since"`
	// Last is the latest observation of a fault on the GPU.
	Last time.Time `json:"last"`
	// Count is how many fault observations the episode has had.
	Count int `json:"count"`
}

// Effect is the device taint effect of the fault.
func (f Fault) Effect() resourceapi.DeviceTaintEffect {
	if f.Fatal {
		return resourceapi.DeviceTaintEffectNoExecute
	}
	return resourceapi.DeviceTaintEffectNoSchedule
}

// Taint is the device taint the fault puts on its GPU's devices where the
// cluster enforces DRADeviceTaints: names.TaintUnhealthy, valued with the
// reason, with Effect, added at Since.
func (f Fault) Taint() resourceapi.DeviceTaint {
	t := metav1.NewTime(f.Since)
	return resourceapi.DeviceTaint{Key: names.TaintUnhealthy, Value: f.Reason, Effect: f.Effect(), TimeAdded: &t}
}

// String is the fault in one line, for Events and logs.
func (f Fault) String() string {
	class := "recoverable"
	if f.Fatal {
		class = "fatal"
	}
	return fmt.Sprintf("%s (%s, %s) since %s", f.Detail, f.Reason, class, f.Since.UTC().Format(time.RFC3339))
}

// Change is a fault that began, grew fatal, or ended.
type Change struct {
	GPU string
	// Fault is the GPU's fault now; nil when it recovered.
	Fault *Fault
	// Why says what happened, in a sentence.
	Why string
}

// Options configure Open.
type Options struct {
	// Path is the fault file; empty keeps faults in memory only.
	Path string
	// BootID is this boot's ID; faults recorded under another are dropped.
	// Empty: the file's faults are kept whatever boot wrote them.
	BootID string
	// GPUs are the node's GPU UUIDs; an unreadable file faults them all.
	GPUs []string
	// QuietPeriod is how long a GPU with a recoverable fault must answer
	// its probes without a new fault before it comes back.
	QuietPeriod time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Monitor holds the faults. Safe for concurrent use.
type Monitor struct {
	o  Options
	mu sync.Mutex
	// faults by GPU UUID.
	faults map[string]*Fault
	// okSince is the first healthy probe after a GPU's latest fault.
	okSince map[string]time.Time
}

type file struct {
	Version int     `json:"version"`
	BootID  string  `json:"bootID"`
	Faults  []Fault `json:"faults"`
}

const fileVersion = 1

// Open reads the fault file. It returns the Changes that opening made:
// faults dropped because they were recorded before a reboot, or every GPU
// faulted because the file could not be read (the file is then moved
// aside to <path>.corrupt). Only a file that cannot be written is an
// error.
func Open(o Options) (*Monitor, []Change, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Monitor{o: o, faults: map[string]*Fault{}, okSince: map[string]time.Time{}}
	if o.Path == "" {
		return m, nil, nil
	}
	data, err := os.ReadFile(o.Path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil, nil
	}
	var f file
	if err == nil {
		err = json.Unmarshal(data, &f)
		if err == nil && f.Version != fileVersion {
			err = fmt.Errorf("version %d, want %d", f.Version, fileVersion)
		}
	}
	var changes []Change
	switch {
	case err != nil:
		_ = os.Rename(o.Path, o.Path+".corrupt")
		now := o.Now()
		for _, gpu := range o.GPUs {
			ft := &Fault{GPU: gpu, Reason: "health-record-unreadable", Detail: fmt.Sprintf("the GPU fault record %s could not be read (%v); the GPU returns after answering NVML for the quiet period", o.Path, err), Since: now, Last: now, Count: 1}
			m.faults[gpu] = ft
			changes = append(changes, Change{GPU: gpu, Fault: ft, Why: ft.Detail})
		}
	case o.BootID != "" && f.BootID != "" && f.BootID != o.BootID:
		// A reboot resets every GPU; what failed before may work now, and
		// the probes will find out.
		for i := range f.Faults {
			changes = append(changes, Change{GPU: f.Faults[i].GPU, Why: fmt.Sprintf("fault %s was recorded before the node rebooted, which reset the GPU", f.Faults[i].String())})
		}
	default:
		for i := range f.Faults {
			ft := f.Faults[i]
			m.faults[ft.GPU] = &ft
		}
	}
	if len(changes) > 0 {
		if err := m.saveLocked(); err != nil {
			return nil, nil, err
		}
	}
	return m, changes, nil
}

// Observe takes one NVML health observation and returns the Change it
// makes, nil if none. A save failure is returned with the change, which
// is kept in memory regardless: the fault is real even if the disk is not.
func (m *Monitor) Observe(ev nvmlgpu.HealthEvent) (*Change, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.o.Now()
	f := m.faults[ev.GPU]
	if ev.Healthy {
		if f == nil {
			return nil, nil
		}
		ok, seen := m.okSince[ev.GPU]
		if !seen || ok.Before(f.Last) {
			m.okSince[ev.GPU] = now
			ok = now
		}
		if f.Fatal || now.Sub(ok) < m.o.QuietPeriod || now.Sub(f.Last) < m.o.QuietPeriod {
			return nil, nil
		}
		delete(m.faults, ev.GPU)
		delete(m.okSince, ev.GPU)
		c := &Change{GPU: ev.GPU, Why: fmt.Sprintf("recovered: the GPU answered NVML for %s without a fault after %s", m.o.QuietPeriod, f.String())}
		return c, m.saveLocked()
	}
	delete(m.okSince, ev.GPU)
	if f == nil {
		f = &Fault{GPU: ev.GPU, Reason: ev.Reason, Detail: ev.Detail, Fatal: ev.Fatal, Since: now, Last: now, Count: 1}
		m.faults[ev.GPU] = f
		c := &Change{GPU: ev.GPU, Fault: copyFault(f), Why: f.String()}
		return c, m.saveLocked()
	}
	f.Last = now
	f.Count++
	if ev.Fatal && !f.Fatal {
		f.Reason, f.Detail, f.Fatal = ev.Reason, ev.Detail, true
		c := &Change{GPU: ev.GPU, Fault: copyFault(f), Why: "grew fatal: " + f.String()}
		return c, m.saveLocked()
	}
	return nil, nil
}

// Recover clears a GPU's fault on an operator's request made at
// requested: the GPU must answer probe, and no fault may have been seen
// after the request (one that came later is not what the operator
// fixed). A GPU without a fault is no error and no Change.
func (m *Monitor) Recover(gpu string, requested time.Time, probe func(uuid string) error) (*Change, error) {
	m.mu.Lock()
	f := m.faults[gpu]
	if f == nil {
		m.mu.Unlock()
		return nil, nil
	}
	last := f.Last
	m.mu.Unlock()
	if last.After(requested) {
		return nil, fmt.Errorf("GPU %s: its latest fault (%s) came after the recovery request at %s; fix it and request again", gpu, last.UTC().Format(time.RFC3339), requested.UTC().Format(time.RFC3339))
	}
	if err := probe(gpu); err != nil {
		return nil, fmt.Errorf("GPU %s does not answer NVML, so it stays out of scheduling: %w", gpu, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if f2 := m.faults[gpu]; f2 == nil || f2.Last.After(requested) {
		// Cleared or faulted again while probing.
		return nil, nil
	}
	delete(m.faults, gpu)
	delete(m.okSince, gpu)
	c := &Change{GPU: gpu, Why: fmt.Sprintf("recovered at the operator's request of %s: the GPU answers NVML; was %s", requested.UTC().Format(time.RFC3339), f.String())}
	return c, m.saveLocked()
}

// Faults returns a copy of the current faults by GPU UUID.
func (m *Monitor) Faults() map[string]Fault {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Fault, len(m.faults))
	for k, f := range m.faults {
		out[k] = *f
	}
	return out
}

func copyFault(f *Fault) *Fault { c := *f; return &c }

// saveLocked rewrites the file. m.mu is held.
func (m *Monitor) saveLocked() error {
	if m.o.Path == "" {
		return nil
	}
	f := file{Version: fileVersion, BootID: m.o.BootID, Faults: []Fault{}}
	for _, ft := range m.faults {
		f.Faults = append(f.Faults, *ft)
	}
	sort.Slice(f.Faults, func(i, j int) bool { return f.Faults[i].GPU < f.Faults[j].GPU })
	return atomicfile.WriteJSON(m.o.Path, ".health-", f, 0o600)
}

// RecoverRequest is one entry of the names.AnnotationRecover annotation.
type RecoverRequest struct {
	// GPU is a UUID, an NVML index, or "all".
	GPU string
	// At is when the operator asked.
	At time.Time
}

// ParseRecoverRequests parses the annotation's value: entries
// "<gpu>@<RFC 3339 time>" separated by commas, where <gpu> is a GPU UUID,
// its NVML index or "all"; e.g. "GPU-5d2c...@2026-11-23T16:00:00Z,3@...".
// `facetctl health recover` writes it.
func ParseRecoverRequests(value string) ([]RecoverRequest, error) {
	var out []RecoverRequest
	for entry := range strings.SplitSeq(value, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		gpu, at, ok := strings.Cut(entry, "@")
		if !ok || gpu == "" {
			return nil, fmt.Errorf("entry %q: want <gpu uuid|index|all>@<RFC 3339 time>", entry)
		}
		if gpu != "all" && !strings.HasPrefix(gpu, "GPU-") {
			if _, err := strconv.ParseUint(gpu, 10, 16); err != nil {
				return nil, fmt.Errorf("entry %q: %q is neither a GPU UUID, an index nor \"all\"", entry, gpu)
			}
		}
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return nil, fmt.Errorf("entry %q: time: %w", entry, err)
		}
		out = append(out, RecoverRequest{GPU: gpu, At: t})
	}
	return out, nil
}

// FormatRecoverRequests is ParseRecoverRequests' inverse.
func FormatRecoverRequests(reqs []RecoverRequest) string {
	parts := make([]string, len(reqs))
	for i, r := range reqs {
		parts[i] = r.GPU + "@" + r.At.UTC().Format(time.RFC3339Nano)
	}
	return strings.Join(parts, ",")
}
