package dradriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/driver/fake"
	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/computedomain"
)

var updateChannelGolden = flag.Bool("update-channel-golden", false, "rewrite testdata/imex-channel-*.json")

// fakeDomains stands for the cluster (package computedomain): its
// ComputeDomains by "namespace/name" and the node's label.
type fakeDomains struct {
	mu       sync.Mutex
	domains  map[string]*configapi.ComputeDomain
	label    string
	unsynced error // Domain's error while set: the informer not synced
	labelErr error // SetNodeLabel's error while set
	changes  []string
	// looked, if set, gets a value at every Domain call (never blocking):
	// a test learns that prepare has looked at the domain.
	looked chan struct{}
}

func (f *fakeDomains) Domain(_ context.Context, namespace, name string) (*configapi.ComputeDomain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.looked != nil {
		select {
		case f.looked <- struct{}{}:
		default:
		}
	}
	if f.unsynced != nil {
		return nil, f.unsynced
	}
	d, ok := f.domains[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(computedomain.Resource, name)
	}
	return d.DeepCopy(), nil
}

func (f *fakeDomains) NodeLabel(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.label, nil
}

func (f *fakeDomains) SetNodeLabel(_ context.Context, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.labelErr != nil {
		return f.labelErr
	}
	if f.label != from && f.label != to {
		return fmt.Errorf("%w: %q", computedomain.ErrLabelChanged, f.label)
	}
	if f.label != to {
		f.changes = append(f.changes, from+"->"+to)
	}
	f.label = to
	return nil
}

func (f *fakeDomains) put(d *configapi.ComputeDomain) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.domains[d.Namespace+"/"+d.Name] = d
}

func (f *fakeDomains) setReady(ns, name, nodeName string, ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[ns+"/"+name]
	st := configapi.ComputeDomainNotReady
	if ready {
		st = configapi.ComputeDomainReady
	}
	d.Status.Nodes = []configapi.ComputeDomainNode{{Name: nodeName, IPAddress: "10.0.0.1", CliqueID: gb200Clique, Index: 0, Status: st}}
}

func (f *fakeDomains) state() (string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.label, slices.Clone(f.changes)
}

// The GB200 tray's fabric clique (demo/machines/gb200-nvl72-tray.yaml).
const gb200Clique = "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.32766"

// channelUnit is a driver on a simulated GB200 tray whose driver offers
// IMEX channels, over the fakes, real CDI specs and a fake cluster.
type channelUnit struct {
	t       *testing.T
	ctx     context.Context
	inv     *inventory.Inventory
	cdiDir  string
	store   *fake.Store
	domains *fakeDomains
	events  *record.FakeRecorder
	d       *Driver
}

func newChannelUnit(t *testing.T) *channelUnit {
	t.Helper()
	major, count := sim.SimulatedIMEXChannels()
	inv, err := inventory.Build(simNode(t, "gb200-nvl72-tray"), inventory.Config{DefaultMode: inventory.ModeExclusive, IMEXChannels: &nvmlgpu.IMEXChannels{Major: major, Count: count}})
	if err != nil {
		t.Fatal(err)
	}
	if inv.IMEXChannel == nil || inv.IMEXChannel.Clique() != gb200Clique {
		t.Fatalf("the tray publishes channel %+v, note %q", inv.IMEXChannel, inv.IMEXNote)
	}
	_, ctx := ktesting.NewTestContext(t)
	u := &channelUnit{t: t, ctx: ctx, inv: inv, cdiDir: t.TempDir(), store: fake.NewStore(),
		domains: &fakeDomains{domains: map[string]*configapi.ComputeDomain{}}}
	u.domains.put(cd("ns", "train", "uid-train"))
	u.domains.put(cd("other", "eval", "uid-eval"))
	u.start()
	return u
}

// start (re)starts the driver on the fakes' current state.
func (u *channelUnit) start() {
	u.t.Helper()
	writer, err := claimcdi.NewWriter(u.cdiDir)
	if err != nil {
		u.t.Fatal(err)
	}
	u.events = record.NewFakeRecorder(100)
	bootID := filepath.Join(u.t.TempDir(), "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o600); err != nil {
		u.t.Fatal(err)
	}
	u.d, err = New(u.ctx, Options{NodeName: node, Inventory: u.inv, Store: u.store, CDI: writer, Edits: fake.Edits{},
		BootIDPath: bootID, Domains: u.domains, Events: u.events, DaemonWait: testDaemonWait})
	if err != nil {
		u.t.Fatal(err)
	}
}

func cd(ns, name, uid string) *configapi.ComputeDomain {
	return &configapi.ComputeDomain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: configapi.ComputeDomainSpec{NumNodes: 2, Channel: configapi.ComputeDomainChannelSpec{
			ResourceClaimTemplate: configapi.ComputeDomainResourceClaimTemplate{Name: name + "-channel"}}}}
}

// channelClaim is a claim of the channel device in namespace ns, with the
// channel config (JSON fields) the domain's template carries; no config
// for cfg "".
func channelClaim(ns, name, cfg string, devices ...string) *resourceapi.ResourceClaim {
	if len(devices) == 0 {
		devices = []string{names.IMEXChannelDevice}
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: types.UID("pod-" + name)}},
		},
	}
	for _, d := range devices {
		req := "channel"
		if d != names.IMEXChannelDevice {
			req = "gpu"
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: req, Driver: names.Driver, Pool: node, Device: d})
	}
	if cfg != "" {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"channel"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: names.Driver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig",` + cfg + `}`)},
			}},
		}}
	}
	return c
}

const trainCfg = `"domainUID":"uid-train","domainName":"train"`

// testDaemonWait is how long the tests' prepares wait for a daemon.
const testDaemonWait = 300 * time.Millisecond

func (u *channelUnit) prepare(c *resourceapi.ResourceClaim) error {
	u.t.Helper()
	res, err := u.d.PrepareResourceClaims(u.ctx, []*resourceapi.ResourceClaim{c})
	if err != nil {
		u.t.Fatal(err)
	}
	return res[c.UID].Err
}

func (u *channelUnit) unprepare(c *resourceapi.ResourceClaim) error {
	u.t.Helper()
	res, err := u.d.UnprepareResourceClaims(u.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}})
	if err != nil {
		u.t.Fatal(err)
	}
	return res[c.UID]
}

func (u *channelUnit) record(c *resourceapi.ResourceClaim) *checkpoint.Claim {
	u.t.Helper()
	rec, err := u.store.Get(c.UID)
	if err != nil {
		u.t.Fatal(err)
	}
	return rec
}

func (u *channelUnit) spec(c *resourceapi.ResourceClaim) []byte {
	b, err := os.ReadFile(filepath.Join(u.cdiDir, claimcdi.SpecName(c.UID)+".json"))
	if err != nil {
		return nil
	}
	return b
}

// drainEvents returns the Events recorded since the last call.
func (u *channelUnit) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-u.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestChannelPrepare prepares one channel claim in each state the design
// names (docs/design/compute-domains.md, flow and Failure): what prepare
// returns, and what it leaves (record, label, CDI spec, Events).
func TestChannelPrepare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*channelUnit)
		claim *resourceapi.ResourceClaim
		// wantErr is the prepare's error ("" for success).
		wantErr string
		// wantState is the record left ("" for none), wantLabel the
		// node's label after.
		wantState checkpoint.State
		wantLabel string
		// wantEvent is a part of an Event raised.
		wantEvent string
		golden    string
	}{
		{
			name: "daemon not ready: waits, labelled",
			setup: func(u *channelUnit) {
				u.domains.setReady("ns", "train", node, false)
			},
			claim:     channelClaim("ns", "train-channel-a", trainCfg),
			wantErr:   "claim ns/train-channel-a: ComputeDomain ns/train: IMEX daemon on node node-a is not ready yet",
			wantState: checkpoint.StatePreparing, wantLabel: "uid-train",
			wantEvent: "Normal FacetWaitingForIMEXDaemon ComputeDomain ns/train: IMEX daemon on node node-a is not ready yet",
		},
		{
			name:      "no entry for the node yet: waits",
			claim:     channelClaim("ns", "train-channel-a", trainCfg),
			wantErr:   "IMEX daemon on node node-a is not ready yet",
			wantState: checkpoint.StatePreparing, wantLabel: "uid-train",
		},
		{
			name:      "daemon ready: the channel's device node",
			setup:     func(u *channelUnit) { u.domains.setReady("ns", "train", node, true) },
			claim:     channelClaim("ns", "train-channel-a", trainCfg),
			wantState: checkpoint.StatePrepared, wantLabel: "uid-train",
			wantEvent: "Normal FacetComputeDomainLabel gpu.facet.dev/compute-domain=uid-train for channel claim ns/train-channel-a of ComputeDomain ns/train",
			golden:    "imex-channel-single.json",
		},
		{
			name:      "a domain of another namespace",
			claim:     channelClaim("ns", "eval-channel", `"domainUID":"uid-eval","domainName":"eval"`),
			wantErr:   `ComputeDomainChannelConfig: domainName: Invalid value: "eval": no ComputeDomain of that name in namespace ns, the claim's`,
			wantEvent: "Warning FacetPrepareFailed",
		},
		{
			name:    "a UID that does not match",
			claim:   channelClaim("ns", "train-channel-a", `"domainUID":"uid-old","domainName":"train"`),
			wantErr: `ComputeDomainChannelConfig: domainUID: Invalid value: "uid-old": ComputeDomain ns/train has UID uid-train`,
		},
		{
			name: "the node labelled for another domain",
			setup: func(u *channelUnit) {
				u.domains.put(cd("ns", "other", "uid-other"))
				u.domains.setReady("ns", "other", node, false)
				if err := u.prepare(channelClaim("ns", "other-channel", `"domainUID":"uid-other","domainName":"other"`)); err == nil {
					u.t.Fatal("the other domain's claim prepared without its daemon")
				}
			},
			claim:     channelClaim("ns", "train-channel-a", trainCfg),
			wantErr:   "node node-a serves ComputeDomain ns/other (UID uid-other), whose channel claim ns/other-channel (uid-other-channel) is prepared or waiting here: a node serves one domain at a time",
			wantLabel: "uid-other",
		},
		{
			name: "a stale label no record explains is replaced",
			setup: func(u *channelUnit) {
				u.domains.label = "uid-gone"
				u.domains.setReady("ns", "train", node, true)
			},
			claim:     channelClaim("ns", "train-channel-a", trainCfg),
			wantState: checkpoint.StatePrepared, wantLabel: "uid-train",
			wantEvent: "Warning FacetComputeDomainLabel gpu.facet.dev/compute-domain=uid-train for channel claim ns/train-channel-a of ComputeDomain ns/train, replacing uid-gone",
		},
		{
			name: "being deleted",
			setup: func(u *channelUnit) {
				d := cd("ns", "train", "uid-train")
				d.DeletionTimestamp = &metav1.Time{}
				u.domains.put(d)
			},
			claim:   channelClaim("ns", "train-channel-a", trainCfg),
			wantErr: "ComputeDomain ns/train is being deleted: no new channel claim joins it",
		},
		{
			name: "pinned to another clique",
			setup: func(u *channelUnit) {
				u.domains.domains["ns/train"].Status.Clique = "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.1"
			},
			claim:   channelClaim("ns", "train-channel-a", trainCfg),
			wantErr: "ComputeDomain ns/train is pinned to fabric clique 6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.1, and node node-a is in clique " + gb200Clique,
		},
		{
			name:    "no channel config",
			claim:   channelClaim("ns", "bare", ""),
			wantErr: `request "channel": device node-a/imex-channel: no ComputeDomainChannelConfig applies`,
		},
		{
			name:    "with a GPU",
			claim:   channelClaim("ns", "mixed", trainCfg, names.IMEXChannelDevice, "gpu-0"),
			wantErr: `request "gpu": device node-a/gpu-0: a claim with an IMEX channel holds it alone`,
		},
		{
			name: "ComputeDomains not listed yet",
			setup: func(u *channelUnit) {
				u.domains.unsynced = errors.New("ComputeDomains (computedomains.gpu.facet.dev) not listed yet: no CRD")
			},
			claim:   channelClaim("ns", "train-channel-a", trainCfg),
			wantErr: "not listed yet: no CRD",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newChannelUnit(t)
			if tc.setup != nil {
				tc.setup(u)
			}
			u.drainEvents()
			err := u.prepare(tc.claim)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("prepare: %v, want %q", err, tc.wantErr)
			}
			rec := u.record(tc.claim)
			switch {
			case tc.wantState == "" && rec != nil:
				t.Errorf("record %+v left", rec)
			case tc.wantState != "" && (rec == nil || rec.State != tc.wantState || rec.ComputeDomain == nil || rec.ComputeDomain.UID != "uid-train"):
				t.Errorf("record %+v, want %s of ComputeDomain uid-train", rec, tc.wantState)
			}
			if label, _ := u.domains.state(); label != tc.wantLabel {
				t.Errorf("node label %q, want %q", label, tc.wantLabel)
			}
			events := u.drainEvents()
			if tc.wantEvent != "" && !slices.ContainsFunc(events, func(e string) bool { return strings.Contains(e, tc.wantEvent) }) {
				t.Errorf("events %q, want one with %q", events, tc.wantEvent)
			}
			spec := u.spec(tc.claim)
			if (tc.wantState == checkpoint.StatePrepared) != (spec != nil) {
				t.Errorf("CDI spec %s, want one only when prepared", spec)
			}
			if tc.golden != "" {
				golden(t, tc.golden, spec)
			}
		})
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got, "", "  "); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *updateChannelGolden {
		if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-channel-golden)", err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Errorf("CDI spec differs from %s:\n%s", path, pretty.Bytes())
	}
}

// TestChannelAll: allocationMode All gives every channel the driver
// offers, minors 0 to 2047, each at its path.
func TestChannelAll(t *testing.T) {
	u := newChannelUnit(t)
	u.domains.setReady("ns", "train", node, true)
	c := channelClaim("ns", "train-channel-a", `"domainUID":"uid-train","domainName":"train","allocationMode":"All"`)
	if err := u.prepare(c); err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(u.spec(c), &spec); err != nil {
		t.Fatal(err)
	}
	nodes := spec.Devices[0].ContainerEdits.DeviceNodes
	major, count := sim.SimulatedIMEXChannels()
	if len(nodes) != count {
		t.Fatalf("%d device nodes, want %d", len(nodes), count)
	}
	for i, n := range nodes {
		if n.Path != fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", i) || n.Major != int64(major) || n.Minor != int64(i) || n.Type != "c" {
			t.Fatalf("device node %d: %+v", i, *n)
		}
	}
}

// TestChannelLifecycle plays a domain's pod on the node: it waits while
// the daemon is not ready (the label pulls the daemon), runs once it is,
// and at unprepare the spec, the record and, with the domain's last
// claim, the label go. A second claim of the domain keeps the label.
func TestChannelLifecycle(t *testing.T) {
	u := newChannelUnit(t)
	a := channelClaim("ns", "train-channel-a", trainCfg)
	b := channelClaim("ns", "train-channel-b", trainCfg)
	var notReady *DaemonNotReadyError
	if err := u.prepare(a); !errors.As(err, &notReady) {
		t.Fatalf("prepare before the daemon: %v", err)
	}
	if err := u.prepare(a); !errors.As(err, &notReady) {
		t.Fatalf("the kubelet's retry: %v", err)
	}
	u.domains.setReady("ns", "train", node, true)
	if err := u.prepare(a); err != nil {
		t.Fatal(err)
	}
	if err := u.prepare(a); err != nil {
		t.Fatalf("prepared again: %v", err)
	}
	if err := u.prepare(b); err != nil {
		t.Fatal(err)
	}
	if err := u.unprepare(a); err != nil {
		t.Fatal(err)
	}
	if label, _ := u.domains.state(); label != "uid-train" || u.record(a) != nil || u.spec(a) != nil {
		t.Fatalf("after the first claim's unprepare: label %q, record %+v, spec %s", label, u.record(a), u.spec(a))
	}
	if err := u.unprepare(b); err != nil {
		t.Fatal(err)
	}
	label, changes := u.domains.state()
	if label != "" || u.record(b) != nil || u.spec(b) != nil {
		t.Fatalf("after the last claim's unprepare: label %q, record %+v, spec %s", label, u.record(b), u.spec(b))
	}
	if want := []string{"->uid-train", "uid-train->"}; !slices.Equal(changes, want) {
		t.Errorf("label changes %q, want %q", changes, want)
	}
	if events := u.drainEvents(); !slices.ContainsFunc(events, func(e string) bool {
		return strings.Contains(e, "Normal FacetComputeDomainLabel removed gpu.facet.dev/compute-domain=uid-train: no channel claim of ComputeDomain ns/train is left on the node (the last was ns/train-channel-b)")
	}) {
		t.Errorf("events %q", events)
	}
	if err := u.unprepare(b); err != nil {
		t.Errorf("unprepared again: %v", err)
	}
}

// TestChannelWaitingPodDeleted: a pod deleted while its claim waits for
// the daemon is unprepared by the kubelet (it tracks the claim from the
// first attempt): the record and the label go, so the daemon does too.
func TestChannelWaitingPodDeleted(t *testing.T) {
	u := newChannelUnit(t)
	a := channelClaim("ns", "train-channel-a", trainCfg)
	if err := u.prepare(a); err == nil {
		t.Fatal("prepared without a daemon")
	}
	if err := u.unprepare(a); err != nil {
		t.Fatal(err)
	}
	if label, _ := u.domains.state(); label != "" || u.record(a) != nil {
		t.Fatalf("label %q, record %+v", label, u.record(a))
	}
}

// TestChannelRefusedAfterWaiting: a domain deleted and made again while
// its claim waited (a new UID): the claim fails, naming the field, and
// what its first attempt left (record, label) goes.
func TestChannelRefusedAfterWaiting(t *testing.T) {
	u := newChannelUnit(t)
	a := channelClaim("ns", "train-channel-a", trainCfg)
	if err := u.prepare(a); err == nil {
		t.Fatal("prepared without a daemon")
	}
	u.domains.put(cd("ns", "train", "uid-train-2"))
	err := u.prepare(a)
	if err == nil || !strings.Contains(err.Error(), "domainUID: Invalid value") {
		t.Fatalf("prepare: %v", err)
	}
	if label, _ := u.domains.state(); label != "" || u.record(a) != nil {
		t.Fatalf("label %q, record %+v", label, u.record(a))
	}
}

// TestChannelUnlabelFails: an unprepare that cannot remove the label
// fails and keeps the record, so the kubelet's retry removes it.
func TestChannelUnlabelFails(t *testing.T) {
	u := newChannelUnit(t)
	u.domains.setReady("ns", "train", node, true)
	a := channelClaim("ns", "train-channel-a", trainCfg)
	if err := u.prepare(a); err != nil {
		t.Fatal(err)
	}
	u.domains.labelErr = errors.New("the API server is away")
	if err := u.unprepare(a); err == nil || !strings.Contains(err.Error(), "the API server is away") {
		t.Fatalf("unprepare: %v", err)
	}
	if u.record(a) == nil {
		t.Fatal("record gone with the label still on the node")
	}
	u.domains.labelErr = nil
	if err := u.unprepare(a); err != nil {
		t.Fatal(err)
	}
	if label, _ := u.domains.state(); label != "" || u.record(a) != nil {
		t.Fatalf("label %q, record %+v", label, u.record(a))
	}
}

// TestChannelRestart: at start the label is what the checkpoint says,
// never what memory held: put back for a prepared or a waiting claim
// (which is kept, not rolled back), removed where no channel claim is
// recorded. A prepared claim prepares again as it was.
func TestChannelRestart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		setup     func(*channelUnit, *resourceapi.ResourceClaim)
		label     string // set behind the plugin's back before the restart
		wantLabel string
		wantState checkpoint.State
	}{
		{"prepared, label lost", func(u *channelUnit, c *resourceapi.ResourceClaim) {
			u.domains.setReady("ns", "train", node, true)
			if err := u.prepare(c); err != nil {
				u.t.Fatal(err)
			}
		}, "", "uid-train", checkpoint.StatePrepared},
		{"waiting, label lost", func(u *channelUnit, c *resourceapi.ResourceClaim) {
			if err := u.prepare(c); err == nil {
				u.t.Fatal("prepared without a daemon")
			}
		}, "", "uid-train", checkpoint.StatePreparing},
		{"waiting, label of another domain", func(u *channelUnit, c *resourceapi.ResourceClaim) {
			if err := u.prepare(c); err == nil {
				u.t.Fatal("prepared without a daemon")
			}
		}, "uid-else", "uid-train", checkpoint.StatePreparing},
		{"nothing recorded, label left", func(*channelUnit, *resourceapi.ResourceClaim) {}, "uid-gone", "", ""},
		{"nothing recorded, no label", func(*channelUnit, *resourceapi.ResourceClaim) {}, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newChannelUnit(t)
			c := channelClaim("ns", "train-channel-a", trainCfg)
			tc.setup(u, c)
			u.domains.label = tc.label
			u.start()
			label, _ := u.domains.state()
			if label != tc.wantLabel {
				t.Errorf("label after the restart %q, want %q", label, tc.wantLabel)
			}
			rec := u.record(c)
			if (rec == nil) != (tc.wantState == "") || rec != nil && rec.State != tc.wantState {
				t.Fatalf("record after the restart %+v, want %q", rec, tc.wantState)
			}
			if tc.wantState == "" {
				return
			}
			u.domains.setReady("ns", "train", node, true)
			if err := u.prepare(c); err != nil {
				t.Fatalf("prepare after the restart: %v", err)
			}
			if u.spec(c) == nil {
				t.Error("no CDI spec")
			}
		})
	}
}

// TestChannelRestartRetriesLabel: a start that cannot reach the API
// server to set the label keeps retrying until it can.
func TestChannelRestartRetriesLabel(t *testing.T) {
	u := newChannelUnit(t)
	c := channelClaim("ns", "train-channel-a", trainCfg)
	if err := u.prepare(c); err == nil {
		t.Fatal("prepared without a daemon")
	}
	u.domains.label = ""
	u.domains.labelErr = errors.New("the API server is away")
	u.start()
	u.domains.mu.Lock()
	u.domains.labelErr = nil
	u.domains.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for label, _ := u.domains.state(); label != "uid-train"; label, _ = u.domains.state() {
		if time.Now().After(deadline) {
			t.Fatalf("label %q 10 s after the API server came back, want uid-train", label)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChannelHoldsTheBatch: a pod's GPU claim, prepared in the same call
// as its channel claim that waits, is reported waiting too, and stays
// prepared: the kubelet (before kubernetes#140274) would otherwise hand
// the runtime its devices twice. Once the daemon is ready both succeed.
func TestChannelHoldsTheBatch(t *testing.T) {
	u := newChannelUnit(t)
	gpu := claim("trainer-gpu", "gpu-0")
	ch := channelClaim("ns", "trainer-channel", trainCfg)
	res, err := u.d.PrepareResourceClaims(u.ctx, []*resourceapi.ResourceClaim{gpu, ch})
	if err != nil {
		t.Fatal(err)
	}
	var notReady *DaemonNotReadyError
	if !errors.As(res[ch.UID].Err, &notReady) {
		t.Fatalf("channel claim: %v", res[ch.UID].Err)
	}
	if e := res[gpu.UID].Err; e == nil || !strings.Contains(e.Error(), "claim ns/trainer-gpu: prepared, and held back with the pod's channel claim ns/trainer-channel (ComputeDomain ns/train: IMEX daemon on node node-a is not ready yet)") || len(res[gpu.UID].Devices) != 0 {
		t.Fatalf("GPU claim: %+v", res[gpu.UID])
	}
	if rec := u.record(gpu); rec == nil || rec.State != checkpoint.StatePrepared {
		t.Fatalf("GPU claim's record %+v, want it prepared", rec)
	}
	u.domains.setReady("ns", "train", node, true)
	res, err = u.d.PrepareResourceClaims(u.ctx, []*resourceapi.ResourceClaim{gpu, ch})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{gpu, ch} {
		if r := res[c.UID]; r.Err != nil || len(r.Devices) != 1 {
			t.Errorf("%s: %+v", c.Name, r)
		}
	}
	// Alone, or with claims that are ready, nothing is held.
	if err := u.prepare(claim("alone", "gpu-1")); err != nil {
		t.Fatal(err)
	}
}

// TestChannelAwaitsTheDaemon: a daemon that turns Ready while the prepare
// waits for it serves the claim in that one prepare; one that does not
// fails it once the wait is over, not before.
func TestChannelAwaitsTheDaemon(t *testing.T) {
	u := newChannelUnit(t)
	// Long enough that no load makes it run out: the prepare returns as
	// soon as it sees the daemon Ready.
	u.d.daemonWait = time.Minute
	// Buffered: no look is lost while the goroutine is not yet waiting.
	u.domains.looked = make(chan struct{}, 16)
	c := channelClaim("ns", "train-channel-a", trainCfg)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		// The prepare's lookup of the domain, then its first look in the
		// wait: the daemon turns Ready while the prepare waits.
		for range 2 {
			select {
			case <-u.domains.looked:
			case <-stop:
				return
			}
		}
		u.domains.setReady("ns", "train", node, true)
	}()
	defer func() { close(stop); <-done }()
	if err := u.prepare(c); err != nil {
		t.Fatalf("prepare with the daemon turning Ready within the wait: %v", err)
	}
	u2 := newChannelUnit(t)
	start := time.Now()
	var notReady *DaemonNotReadyError
	if err := u2.prepare(c); !errors.As(err, &notReady) {
		t.Fatalf("prepare: %v", err)
	}
	if took := time.Since(start); took < testDaemonWait {
		t.Errorf("failed after %s, before the wait of %s was over", took, testDaemonWait)
	}
}

// TestChannelKillMatrix kills the plugin at every failpoint a channel
// claim's prepare (its daemon Ready) and unprepare pass, restarts it on the
// same checkpoint, CDI directory and cluster, and plays the kubelet's
// retry and then the pod's end. After each: the retry succeeds, and at the
// end no label, record or CDI spec is left. The label follows the
// checkpoint whatever step died.
func TestChannelKillMatrix(t *testing.T) {
	type point struct {
		phase, name string
		nth         int
	}
	var points []point
	{
		u := newChannelUnit(t)
		u.domains.setReady("ns", "train", node, true)
		c := channelClaim("ns", "train-channel-a", trainCfg)
		phase := "prepare"
		count := map[string]int{}
		u.d.fail = func(name string) {
			count[phase+name]++
			points = append(points, point{phase, name, count[phase+name]})
		}
		if _, err := u.d.prepareClaim(u.ctx, c); err != nil {
			t.Fatal(err)
		}
		phase = "unprepare"
		if err := u.d.unprepareClaim(u.ctx, kubeletplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(points) < 6 {
		t.Fatalf("only %d failpoints reached: %v", len(points), points)
	}
	for _, p := range points {
		t.Run(fmt.Sprintf("%s/%s#%d", p.phase, p.name, p.nth), func(t *testing.T) {
			u := newChannelUnit(t)
			u.domains.setReady("ns", "train", node, true)
			c := channelClaim("ns", "train-channel-a", trainCfg)
			obj := kubeletplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}}
			if p.phase == "unprepare" {
				if _, err := u.d.prepareClaim(u.ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			seen := 0
			u.d.fail = func(name string) {
				if name == p.name {
					if seen++; seen == p.nth {
						panic(killed{name})
					}
				}
			}
			died := call(func() {
				if p.phase == "prepare" {
					_, _ = u.d.prepareClaim(u.ctx, c)
				} else {
					_ = u.d.unprepareClaim(u.ctx, obj)
				}
			})
			if !died {
				t.Fatalf("failpoint not reached")
			}
			u.start()
			// After the restart the label is what the checkpoint says.
			label, _ := u.domains.state()
			rec := u.record(c)
			if want := map[bool]string{true: "uid-train", false: ""}[rec != nil]; label != want {
				t.Errorf("label %q after the restart with record %+v, want %q", label, rec, want)
			}
			// The kubelet's retry of the call that died, then the pod's end.
			if p.phase == "prepare" {
				if _, err := u.d.prepareClaim(u.ctx, c); err != nil {
					t.Fatalf("the kubelet's retry: %v", err)
				}
				if u.spec(c) == nil {
					t.Fatal("prepared without a CDI spec")
				}
			}
			if err := u.d.unprepareClaim(u.ctx, obj); err != nil {
				t.Fatalf("unprepare: %v", err)
			}
			if label, _ := u.domains.state(); label != "" || u.record(c) != nil || u.spec(c) != nil {
				t.Errorf("left: label %q, record %+v, spec %s", label, u.record(c), u.spec(c))
			}
		})
	}
}
