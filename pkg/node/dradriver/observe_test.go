package dradriver

import (
	"encoding/binary"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/facet-gpu/facet/internal/driver/fake"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// statusLog records ClaimStatus.Changed calls.
type statusLog struct {
	mu      sync.Mutex
	changed []types.UID
}

func (s *statusLog) Changed(_, _ string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changed = append(s.changed, uid)
}

func (s *statusLog) count(uid types.UID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.changed {
		if u == uid {
			n++
		}
	}
	return n
}

// event is one recorded Event.
type event struct {
	ref               corev1.ObjectReference
	kind, reason, msg string
}

// eventLog is an EventRecorder that keeps what it is given.
type eventLog struct {
	mu     sync.Mutex
	events []event
}

func (e *eventLog) Event(obj runtime.Object, eventtype, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, event{*obj.(*corev1.ObjectReference), eventtype, reason, message})
}

// observed restarts the unit's driver with metrics, a fake event recorder
// and a status log.
func (u *unit) observed() (*nodemetrics.Metrics, *eventLog, *statusLog) {
	u.t.Helper()
	m, rec, st := nodemetrics.New(), &eventLog{}, &statusLog{}
	var err error
	u.d, err = New(u.ctx, Options{NodeName: node, Inventory: u.inv, Store: u.store, CDI: u.specs, Edits: fake.Edits{}, MIG: u.mig, HAMi: u.hami, BootIDPath: u.bootIDFile,
		Metrics: m, Events: rec, Status: st})
	if err != nil {
		u.t.Fatal(err)
	}
	return m, rec, st
}

// sample finds a metric family's sample with the given label value.
func sample(t *testing.T, m *nodemetrics.Metrics, name, label, value string) *dto.Metric {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.Metric {
			for _, l := range s.Label {
				if l.GetName() == label && l.GetValue() == value {
					return s
				}
			}
		}
	}
	return nil
}

// TestUnitObserved prepares and unprepares one claim of each kind and
// checks the latency histograms, the per-GPU state a scrape reads, and the
// status writes queued.
func TestUnitObserved(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   func(*testing.T) inventory.Config
		claim func(*unit) *resourceapi.ResourceClaim
		kind  string
		gpu   int
		// want is the GPU's state while the claim is prepared.
		memory  int64
		compute int64
		mig     map[string]int
		// shape and partition are the claim's per-claim series labels.
		shape, partition string
	}{
		{
			name:  "whole GPU",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeExclusive} },
			claim: func(*unit) *resourceapi.ResourceClaim { return claim("whole", "gpu-2") },
			kind:  kindWhole, gpu: 2, memory: 81079 << 20, compute: 100, shape: "whole", partition: "none",
		},
		{
			name:  "vGPU share",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeShared} },
			claim: func(*unit) *resourceapi.ResourceClaim { return share("volcano", "gpu-3", "2000Mi", 20) },
			kind:  kindShare, gpu: 3, memory: 2000 << 20, compute: 20, shape: "share", partition: "time-sliced",
		},
		{
			name:  "vGPU slot",
			cfg:   slotCfg,
			claim: func(*unit) *resourceapi.ResourceClaim { return claim("small", "gpu-3-slot-0") },
			kind:  kindSlot, gpu: 3, memory: 20059 << 20, compute: 25, shape: "slot", partition: "time-sliced",
		},
		{
			name:  "MIG device",
			cfg:   func(*testing.T) inventory.Config { return inventory.Config{DefaultMode: inventory.ModeMIG} },
			claim: func(u *unit) *resourceapi.ResourceClaim { return claim("mig", u.migDevice(0, "3g.40gb", 0)) },
			kind:  kindMIG, gpu: 0, compute: 42, mig: map[string]int{"3g.40gb": 1}, shape: "mig", partition: "mig",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, tc.cfg(t))
			m, _, st := u.observed()
			c := tc.claim(u)
			if err := u.prepare(c)[c.UID].Err; err != nil {
				t.Fatal(err)
			}
			g := u.d.GPUState()[tc.gpu]
			memory := tc.memory
			if tc.mig != nil {
				// The simulated H100's 3g.40gb, whatever NVML calls its size.
				dev, _ := u.inv.Device(c.Status.Allocation.Devices.Results[0].Device)
				memory = int64(dev.MIG.MemoryBytes)
			}
			if g.UUID != u.inv.GPUs[tc.gpu].UUID || g.AllocatedMemoryBytes != memory || g.AllocatedComputePercent != tc.compute || len(g.MIGInUse) != len(tc.mig) {
				t.Errorf("GPU state %+v, want %d bytes, %d%%, MIG %v", g, memory, tc.compute, tc.mig)
			}
			for p, n := range tc.mig {
				if g.MIGInUse[p] != n {
					t.Errorf("MIG in use %v, want %v", g.MIGInUse, tc.mig)
				}
			}
			if n := u.d.PreparedClaims(); n != 1 {
				t.Errorf("%d prepared claims, want 1", n)
			}
			claims, _ := u.d.ClaimState()
			if len(claims) != 1 {
				t.Fatalf("ClaimState %+v, want the one device", claims)
			}
			cl := claims[0]
			if cl.Namespace != c.Namespace || cl.Name != c.Name || cl.GPUUUID != g.UUID || cl.GPUIndex != tc.gpu ||
				cl.Shape != tc.shape || cl.Compute != tc.partition || cl.MemoryBytes != memory || cl.ComputePercent != tc.compute {
				t.Errorf("ClaimState %+v, want %s/%s on GPU %d, %s, %s, %d bytes, %d%%", cl, c.Namespace, c.Name, tc.gpu, tc.shape, tc.partition, memory, tc.compute)
			}
			if mig := tc.mig != nil; mig != (cl.GIID >= 0) || mig != strings.HasPrefix(cl.MIGUUID, "MIG-") {
				t.Errorf("ClaimState GI %d, MIG UUID %q for a MIG device: %v", cl.GIID, cl.MIGUUID, mig)
			}
			if s := sample(t, m, "facet_prepare_duration_seconds", "kind", tc.kind); s.GetHistogram().GetSampleCount() != 1 {
				t.Errorf("prepare histogram for kind %s: %v", tc.kind, s)
			}
			if st.count(c.UID) != 1 {
				t.Errorf("%d status writes queued after prepare, want 1", st.count(c.UID))
			}
			if res := u.unprepare(c.UID); res[c.UID] != nil {
				t.Fatal(res[c.UID])
			}
			if s := sample(t, m, "facet_unprepare_duration_seconds", "kind", tc.kind); s.GetHistogram().GetSampleCount() != 1 {
				t.Errorf("unprepare histogram for kind %s: %v", tc.kind, s)
			}
			if g := u.d.GPUState()[tc.gpu]; g.AllocatedMemoryBytes != 0 || g.AllocatedComputePercent != 0 || len(g.MIGInUse) != 0 || u.d.PreparedClaims() != 0 {
				t.Errorf("after unprepare: %+v, %d claims", g, u.d.PreparedClaims())
			}
			if claims, usage := u.d.ClaimState(); len(claims) != 0 || len(usage) != 0 {
				t.Errorf("after unprepare: ClaimState %+v, %+v: a claim's series must go with it", claims, usage)
			}
			if st.count(c.UID) != 2 {
				t.Errorf("%d status writes queued after unprepare, want 2", st.count(c.UID))
			}
			if s := sample(t, m, "facet_prepare_errors_total", "kind", tc.kind); s != nil {
				t.Errorf("errors counted for a good claim: %v", s)
			}
		})
	}
}

// TestUnitPrepareFailedEvent: a failed prepare raises a Warning Event, naming
// the bad field or the holder, on the claim and on each pod it is reserved
// for, counts an error, and queues no status write.
func TestUnitPrepareFailedEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		first *resourceapi.ResourceClaim
		bad   *resourceapi.ResourceClaim
		kind  string
		want  string
	}{
		{
			name: "bad opaque config",
			bad:  withConfig(claim("configured", "gpu-4"), `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig","x":1}`),
			kind: kindWhole,
			want: `devices.config[0] (from claim): GpuConfig: strict decoding error: unknown field "x"`,
		},
		{
			name:  "conflict",
			first: claim("first", "gpu-1"),
			bad:   claim("second", "gpu-1"),
			kind:  kindWhole,
			want:  "device gpu-1: conflicts with whole GPU gpu-1 of claim ns/first (uid-first)",
		},
		{
			name: "not allocated",
			bad:  func() *resourceapi.ResourceClaim { c := claim("unallocated"); c.Status.Allocation = nil; return c }(),
			kind: nodemetrics.KindUnknown,
			want: "not allocated",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeExclusive})
			m, rec, st := u.observed()
			if tc.first != nil {
				if err := u.prepare(tc.first)[tc.first.UID].Err; err != nil {
					t.Fatal(err)
				}
			}
			tc.bad.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
				{Resource: "pods", Name: "pod-a", UID: "pod-uid-a"},
				{APIGroup: "example.com", Resource: "things", Name: "not-a-pod", UID: "x"},
			}
			if err := u.prepare(tc.bad)[tc.bad.UID].Err; err == nil {
				t.Fatal("prepare succeeded")
			}
			events := rec.events
			if len(events) != 2 {
				t.Fatalf("events %+v, want one on the claim and one on its pod", events)
			}
			for i, want := range []corev1.ObjectReference{
				{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim", Namespace: "ns", Name: tc.bad.Name, UID: tc.bad.UID},
				{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: "pod-a", UID: "pod-uid-a"},
			} {
				e := events[i]
				if e.ref != want || e.kind != corev1.EventTypeWarning || e.reason != ReasonPrepareFailed || !strings.Contains(e.msg, tc.want) {
					t.Errorf("event %d: %+v\nwant a Warning %s on %+v saying %q", i, e, ReasonPrepareFailed, want, tc.want)
				}
			}
			if s := sample(t, m, "facet_prepare_errors_total", "kind", tc.kind); s.GetCounter().GetValue() != 1 {
				t.Errorf("errors for kind %s: %v", tc.kind, s)
			}
			if st.count(tc.bad.UID) != 0 {
				t.Error("a failed prepare queued a status write")
			}
		})
	}
}

// The broadcaster's recorder, which the plugin passes, is an EventRecorder.
var _ EventRecorder = record.EventRecorder(nil)

// TestClaimUsageFromRegion: a share's memory in use is read from its
// HAMi-core accounting region (written here at the offsets HAMi-core's
// struct has; pkg/node/hami TestRegionLayout checks them against the C
// struct), and a claim whose region has no process yet reports none.
func TestClaimUsageFromRegion(t *testing.T) {
	u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeShared})
	c := share("lab", "gpu-3", "2000Mi", 20)
	if err := u.prepare(c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	if _, usage := u.d.ClaimState(); len(usage) != 0 {
		t.Fatalf("usage %+v before any process wrote the region", usage)
	}
	h, _ := u.d.sharing.HAMi()
	dir, err := h.CacheDir(c.UID)
	if err != nil {
		t.Fatal(err)
	}
	// initialized_flag, major_version 1, device_num 1, proc_num 1, slot 0
	// live (status 1) with 1500 MiB in used[0].total.
	region := make([]byte, 1856+1024*1960+64)
	le := binary.LittleEndian
	le.PutUint32(region[0:], 19920718)
	le.PutUint32(region[4:], 1)
	le.PutUint64(region[56:], 1)
	le.PutUint32(region[1856+1024*1960:], 1)
	le.PutUint32(region[1856+1928:], 1)
	le.PutUint64(region[1856+8+32:], 1500<<20)
	// sm_limit[0] 20, slot 0's host PID found and 41 % in its
	// device_util[0].sm_util: HAMi-core's utilization watcher wrote it.
	le.PutUint64(region[1728:], 20)
	le.PutUint32(region[1856+4:], 4242)
	le.PutUint64(region[1856+1160+16:], 41)
	if err := os.WriteFile(filepath.Join(dir, hami.CacheFileName), region, 0o644); err != nil {
		t.Fatal(err)
	}
	_, usage := u.d.ClaimState()
	if len(usage) != 1 || usage[0].Name != c.Name || usage[0].Namespace != c.Namespace || usage[0].UsedBytes != 1500<<20 || usage[0].ComputeUsedPercent != 41 {
		t.Fatalf("usage %+v, want %s/%s at 1500 MiB and 41 %%", usage, c.Namespace, c.Name)
	}
}

// TestClaimPods: the per-claim series name the pods the claim is reserved
// for, as recorded at prepare; a prepare for another pod joining the claim
// records it, and the names outlive a plugin restart.
func TestClaimPods(t *testing.T) {
	u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeExclusive})
	c := claim("shared", "gpu-1")
	reserve := func(pods ...string) {
		c.Status.ReservedFor = nil
		for _, p := range pods {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("uid-" + p)})
		}
	}
	pods := func() []string {
		t.Helper()
		claims, _ := u.d.ClaimState()
		if len(claims) != 1 {
			t.Fatalf("ClaimState %+v, want one device", claims)
		}
		return claims[0].Pods
	}
	reserve("worker-b")
	// A consumer that is not a pod is no pod.
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{APIGroup: "batch", Resource: "jobs", Name: "j", UID: "uid-j"})
	if err := u.prepare(c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	if got := pods(); !slices.Equal(got, []string{"worker-b"}) {
		t.Fatalf("pods %v after the first prepare, want [worker-b]", got)
	}
	reserve("worker-b", "worker-a")
	if err := u.prepare(c)[c.UID].Err; err != nil {
		t.Fatal(err)
	}
	if got := pods(); !slices.Equal(got, []string{"worker-a", "worker-b"}) {
		t.Fatalf("pods %v after a second pod's prepare, want [worker-a worker-b]", got)
	}
	u.start()
	if got := pods(); !slices.Equal(got, []string{"worker-a", "worker-b"}) {
		t.Fatalf("pods %v after a restart, want [worker-a worker-b]", got)
	}
}
