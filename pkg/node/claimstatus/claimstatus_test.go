package claimstatus

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

func TestDataOf(t *testing.T) {
	share := types.UID("share-1")
	for _, tc := range []struct {
		name string
		dev  checkpoint.Device
		want string
	}{
		{
			name: "whole GPU",
			dev:  checkpoint.Device{Kind: names.KindGPU, Device: "gpu-0", GPUUUID: "GPU-a"},
			want: `{"kind":"gpu","gpuUUID":"GPU-a"}`,
		},
		{
			name: "record from before kinds",
			dev:  checkpoint.Device{Device: "gpu-0", GPUUUID: "GPU-a"},
			want: `{"kind":"gpu","gpuUUID":"GPU-a"}`,
		},
		{
			name: "MIG",
			dev: checkpoint.Device{Kind: names.KindMIG, Device: "gpu-0-mig-1g10gb-6", GPUUUID: "GPU-a",
				MIG: &checkpoint.MIG{Profile: "1g.10gb", Start: 6, Size: 1, GIID: 13, CIID: 0, UUID: "MIG-x", Created: true}},
			want: `{"kind":"mig","gpuUUID":"GPU-a","migUUID":"MIG-x","profile":"1g.10gb","placement":{"start":6,"size":1},"gpuInstanceID":13,"computeInstanceID":0}`,
		},
		{
			name: "share",
			dev: checkpoint.Device{Kind: names.KindShare, Device: "gpu-3", GPUUUID: "GPU-b", ShareID: &share,
				Share: &checkpoint.Share{MemoryBytes: 2 << 30, Cores: 20, Enforced: true}},
			want: `{"kind":"share","gpuUUID":"GPU-b","memoryLimitBytes":2147483648,"computeLimitPercent":20,"enforced":true,"computePartitioning":"time-sliced"}`,
		},
		{
			name: "share, an MPS client",
			dev: checkpoint.Device{Kind: names.KindShare, Device: "gpu-3", GPUUUID: "GPU-b", ShareID: &share,
				Share: &checkpoint.Share{MemoryBytes: 2 << 30, Cores: 20, Enforced: true, MPS: true}},
			want: `{"kind":"share","gpuUUID":"GPU-b","memoryLimitBytes":2147483648,"computeLimitPercent":20,"enforced":true,"computePartitioning":"mps"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(DataOf(tc.dev))
			if err != nil || string(got) != tc.want {
				t.Errorf("got %s, %v\nwant %s", got, err, tc.want)
			}
		})
	}
}

// TestApplyIMEXChannel: a prepared channel's entry says its kind and its
// ComputeDomain's UID, and no GPU; a waiting one has no entry yet.
func TestApplyIMEXChannel(t *testing.T) {
	rec := &checkpoint.Claim{UID: "u", Namespace: "ns", Name: "c", State: checkpoint.StatePrepared,
		Devices:       []checkpoint.Device{{Kind: names.KindIMEXChannel, Pool: "node-a", Device: names.IMEXChannelDevice}},
		ComputeDomain: &checkpoint.ComputeDomain{UID: "uid-train", Namespace: "ns", Name: "train"}}
	for _, tc := range []struct {
		state checkpoint.State
		want  string
	}{
		{checkpoint.StatePrepared, `{"kind":"imex-channel","computeDomainUID":"uid-train"}`},
		{checkpoint.StatePreparing, ""},
	} {
		rec.State = tc.state
		ac, err := Apply("ns", "c", "u", rec)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if devs := ac.Status.Devices; len(devs) == 1 {
			got = string(devs[0].Data.Raw)
		} else if len(devs) > 1 {
			t.Fatalf("%d entries", len(devs))
		}
		if got != tc.want {
			t.Errorf("%s: entry %s, want %s", tc.state, got, tc.want)
		}
	}
}

// records is an in-memory Records.
type records struct {
	mu  sync.Mutex
	m   map[types.UID]*checkpoint.Claim
	err error
}

func (r *records) Get(uid types.UID) (*checkpoint.Claim, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[uid], r.err
}

func (r *records) set(c *checkpoint.Claim, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c != nil {
		r.m[c.UID] = c
	}
	r.err = err
}

func (r *records) drop(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, uid)
}

// TestWriter runs the writer against a fake API server: entries appear
// after a prepare, another driver's entry survives, a failed write is
// retried, and unprepare removes Facet's entries only.
func TestWriter(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	other := resourceapi.AllocatedDeviceStatus{Driver: "other.example.com", Pool: "node", Device: "nic-0"}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "uid-c"},
		Status:     resourceapi.ResourceClaimStatus{Devices: []resourceapi.AllocatedDeviceStatus{other}},
	}
	client := fake.NewClientset(claim)
	var failures int
	var mu sync.Mutex
	var patchedGone, patchedC int
	client.PrependReactor("patch", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if a.(k8stesting.PatchAction).GetName() == "c" {
			patchedC++
		}
		if a.(k8stesting.PatchAction).GetName() == "gone" {
			// The fake creates what an apply names; the API server
			// does not, for a status.
			patchedGone++
			return true, nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaims"), "gone")
		}
		if failures > 0 {
			failures--
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	recs := &records{m: map[types.UID]*checkpoint.Claim{}}
	w := NewWriter(client, recs)
	// The worker logs through t: it must be gone before the test ends.
	ran := make(chan struct{})
	go func() { defer close(ran); w.Run(ctx, 1) }()
	defer func() { cancel(); <-ran }()

	devices := func() []resourceapi.AllocatedDeviceStatus {
		c, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Status.Devices
	}
	waitFor := func(what string, ok func([]resourceapi.AllocatedDeviceStatus) bool) {
		t.Helper()
		waitUntil(t, what, func() bool { return ok(devices()) })
	}

	share := types.UID("s-1")
	recs.set(&checkpoint.Claim{UID: "uid-c", Namespace: "ns", Name: "c", State: checkpoint.StatePrepared, Devices: []checkpoint.Device{
		{Kind: names.KindGPU, Pool: "node", Device: "gpu-0", GPUUUID: "GPU-a"},
		{Kind: names.KindShare, Pool: "node", Device: "gpu-1", GPUUUID: "GPU-b", ShareID: &share, Share: &checkpoint.Share{MemoryBytes: 1 << 30, Cores: 10, Enforced: true}},
	}}, nil)
	mu.Lock()
	failures = 2 // the first two writes fail and are retried
	mu.Unlock()
	w.Changed("ns", "c", "uid-c")
	waitFor("after prepare", func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 3 })
	got := map[string]resourceapi.AllocatedDeviceStatus{}
	for _, d := range devices() {
		got[d.Device] = d
	}
	if !reflect.DeepEqual(got["nic-0"], other) {
		t.Errorf("another driver's entry changed: %+v", got["nic-0"])
	}
	data := func(d resourceapi.AllocatedDeviceStatus) Data {
		var out Data
		if d.Data == nil || json.Unmarshal(d.Data.Raw, &out) != nil {
			t.Errorf("entry %s: data %v", d.Device, d.Data)
		}
		return out
	}
	if g := got["gpu-1"]; g.Driver != names.Driver || g.Pool != "node" || !reflect.DeepEqual(g.ShareID, ptr.To(string(share))) ||
		!reflect.DeepEqual(data(g), Data{Kind: "share", GPUUUID: "GPU-b", MemoryLimitBytes: ptr.To[int64](1 << 30), ComputeLimitPercent: ptr.To[int64](10), Enforced: ptr.To(true), ComputePartitioning: "time-sliced"}) {
		t.Errorf("share entry: %+v %+v", g, data(g))
	}
	if g := got["gpu-0"]; g.Driver != names.Driver || g.ShareID != nil || !reflect.DeepEqual(data(g), Data{Kind: "gpu", GPUUUID: "GPU-a"}) {
		t.Errorf("whole GPU entry: %+v", g)
	}
	mu.Lock()
	if failures != 0 {
		t.Errorf("%d injected failures left: the writer did not retry", failures)
	}
	mu.Unlock()

	// Unprepared: the record is gone, Facet's entries go, the other stays.
	recs.drop("uid-c")
	w.Changed("ns", "c", "uid-c")
	waitFor("after unprepare", func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 1 })
	if d := devices(); !reflect.DeepEqual(d[0], other) {
		t.Errorf("left %+v, want only the other driver's entry", d)
	}

	// A claim that no longer exists needs nothing and is not retried. The
	// one worker takes the queue in order: once the claim queued after it
	// is written, the missing claim's turn is over, and a retry would
	// show as a requeue.
	mu.Lock()
	before := patchedC
	mu.Unlock()
	w.Changed("ns", "gone", "uid-gone")
	w.Changed("ns", "c", "uid-c")
	waitUntil(t, "the claim queued after the missing one is written", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return patchedC > before
	})
	if n := w.queue.NumRequeues(key{"ns", "gone", "uid-gone"}); n != 0 {
		t.Errorf("a missing claim was requeued %d times, want none", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if patchedGone != 1 {
		t.Errorf("a missing claim was written %d times, want once", patchedGone)
	}
}

// waitUntil polls ok until it holds. The bound only turns a hang into a
// failure; nothing here is timed.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return ok(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
