package occupancy

import (
	"bytes"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// node is an 8×H100 node with every mode: 0 exclusive, 1 mig, 2 shared,
// 3 static-mig (all-balanced), 4 slots (four equal), 5 dynamic, 6-7
// exclusive.
var node = occtest.Node{Name: "node-1", Model: "H100-SXM5-80GB", GPUs: 8,
	Modes: "0=exclusive,1=mig,2=shared,3=static-mig,4=slots,5=dynamic", Layout: "3=all-balanced"}

func build(t *testing.T, claims ...*resourceapi.ResourceClaim) *Cluster {
	t.Helper()
	c, err := Build(occtest.Slices(t, node), claims, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func gpu(t *testing.T, c *Cluster, idx int) *GPU {
	t.Helper()
	for _, g := range c.GPUs {
		if g.Node == "node-1" && g.Index == idx {
			return g
		}
	}
	t.Fatalf("no GPU %d in %v", idx, c.GPUs)
	return nil
}

// prepared adds the status.devices entry the plugin writes at prepare
// (package claimstatus) for each of the claim's results, with the
// partitioning the share was prepared with.
func prepared(c *resourceapi.ResourceClaim, partitioning string) *resourceapi.ResourceClaim {
	for _, r := range c.Status.Allocation.Devices.Results {
		st := resourceapi.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device,
			Data: &runtime.RawExtension{Raw: []byte(`{"kind":"share","gpuUUID":"GPU-x","computePartitioning":"` + partitioning + `"}`)}}
		if r.ShareID != nil {
			id := string(*r.ShareID)
			st.ShareID = &id
		}
		c.Status.Devices = append(c.Status.Devices, st)
	}
	return c
}

func TestBuild(t *testing.T) {
	r, share, claim := occtest.Result, occtest.Share, occtest.Allocated
	letters := func(cl Claim) string {
		return map[string]string{"default/a": "A", "default/b": "B", "ml/c": "C"}[cl.String()]
	}
	for _, tc := range []struct {
		name   string
		claims []*resourceapi.ResourceClaim
		gpu    int
		// want: the GPU's bar, memory used (MiB), SM used (percent),
		// holdings, health.
		bar    string
		memory int64
		sm     int64
		held   []string
		health string
	}{{
		name: "exclusive, free",
		gpu:  0, bar: "[................]", health: HealthOK,
	}, {
		name:   "exclusive, held",
		claims: []*resourceapi.ResourceClaim{claim("default/a", r("node-1", "gpu-0"))},
		gpu:    0, bar: "[AAAAAAAAAAAAAAAA]", memory: 81079, sm: 100, health: HealthOK,
		held: []string{"default/a: whole GPU"},
	}, {
		name: "mig, carved placements",
		claims: []*resourceapi.ResourceClaim{
			claim("default/a", r("node-1", "gpu-1-mig-3g40gb-4")),
			claim("ml/c", r("node-1", "gpu-1-mig-1g10gb-0"), r("node-1", "gpu-1-mig-1g10gb-me-1")),
		},
		gpu: 1, bar: "[CC..AAAA]", memory: 40448 + 9984 + 9984, sm: 42 + 14 + 14, health: HealthOK,
		held: []string{
			"default/a: gpu-1-mig-3g40gb-4 (3g.40gb, slices 4-7)",
			"ml/c: gpu-1-mig-1g10gb-0 (1g.10gb, slice 0)",
			"ml/c: gpu-1-mig-1g10gb-me-1 (1g.10gb+me, slice 1)",
		},
	}, {
		name:   "mig, whole GPU",
		claims: []*resourceapi.ResourceClaim{claim("default/b", r("node-1", "gpu-1"))},
		gpu:    1, bar: "[BBBBBBBB]", memory: 81079, sm: 100, health: HealthOK,
		held: []string{"default/b: whole GPU"},
	}, {
		name: "shared, two shares",
		claims: []*resourceapi.ResourceClaim{
			claim("default/a", share("node-1", "gpu-2", "s1", "20Gi", 20)),
			claim("default/b", share("node-1", "gpu-2", "s2", "4Gi", 0)),
		},
		gpu: 2, bar: "[AAAAB...........]", memory: 24 << 10, sm: 20, health: HealthOK,
		held: []string{
			// usable: less HAMi-core's 518 MiB context charge
			"default/a: share s1 of gpu-2 (20Gi, 20%; 19.5Gi usable)",
			"default/b: share s2 of gpu-2 (4Gi, best-effort SM; 3.49Gi usable)",
		},
	}, {
		name: "shared, an MPS share beside a time-sliced one: an MPS client's smaller context charge (128 MiB at 20 %)",
		claims: []*resourceapi.ResourceClaim{
			prepared(claim("default/a", share("node-1", "gpu-2", "s1", "20Gi", 20)), names.PartitioningMPS),
			prepared(claim("default/b", share("node-1", "gpu-2", "s2", "4Gi", 0)), names.PartitioningTimeSliced),
		},
		gpu: 2, bar: "[AAAAB...........]", memory: 24 << 10, sm: 20, health: HealthOK,
		held: []string{
			"default/a: share s1 of gpu-2 (20Gi, 20%; 19.9Gi usable, MPS)",
			"default/b: share s2 of gpu-2 (4Gi, best-effort SM; 3.49Gi usable)",
		},
	}, {
		name:   "slots, an MPS slot",
		claims: []*resourceapi.ResourceClaim{prepared(claim("default/a", r("node-1", "gpu-4-slot-2")), names.PartitioningMPS)},
		gpu:    4, bar: "[....|....|AAAA|....]", memory: 20269, sm: 25, health: HealthOK,
		held: []string{"default/a: gpu-4-slot-2 (19.8Gi, 25%; 19.6Gi usable, MPS)", "3 of 4 slots free"},
	}, {
		name:   "static-mig, one of the all-balanced instances",
		claims: []*resourceapi.ResourceClaim{claim("default/a", r("node-1", "gpu-3-mig-2g20gb-0"))},
		gpu:    3, bar: "[AA......]", memory: 20096, sm: 28, health: HealthOK,
		held: []string{"default/a: gpu-3-mig-2g20gb-0 (2g.20gb, slices 0-1)"},
	}, {
		name:   "slots, one of four held",
		claims: []*resourceapi.ResourceClaim{claim("default/a", r("node-1", "gpu-4-slot-2"))},
		gpu:    4, bar: "[....|....|AAAA|....]", memory: 20269, sm: 25, health: HealthOK,
		held: []string{"default/a: gpu-4-slot-2 (19.8Gi, 25%; 19.3Gi usable)", "3 of 4 slots free"},
	}, {
		name:   "dynamic, a share keeps MIG off",
		claims: []*resourceapi.ResourceClaim{claim("default/a", share("node-1", "gpu-5", "s1", "10Gi", 50))},
		gpu:    5, bar: "[~~~~~~~~]", memory: 10 << 10, sm: 50, health: HealthOK,
		held: []string{"default/a: share s1 of gpu-5 (10Gi, 50%; 9.49Gi usable)"},
	}, {
		name:   "a held device no slice publishes",
		claims: []*resourceapi.ResourceClaim{claim("default/a", r("node-1", "gpu-9"))},
		gpu:    9, bar: "[?]", health: HealthAbsent,
	}, {
		name: "another driver's claim",
		claims: []*resourceapi.ResourceClaim{func() *resourceapi.ResourceClaim {
			c := claim("default/a", r("node-1", "gpu-6"))
			c.Status.Allocation.Devices.Results[0].Driver = "gpu.nvidia.com"
			return c
		}()},
		gpu: 6, bar: "[................]", health: HealthOK,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := gpu(t, build(t, tc.claims...), tc.gpu)
			if got := Bar(g, letters); got != tc.bar {
				t.Errorf("bar %s, want %s", got, tc.bar)
			}
			if got := g.Memory.Used >> 20; got != tc.memory || g.Memory.Used%(1<<20) != 0 {
				t.Errorf("memory used %d bytes (%d MiB), want %d MiB", g.Memory.Used, got, tc.memory)
			}
			if g.Cores.Used != tc.sm {
				t.Errorf("SM used %d%%, want %d%%", g.Cores.Used, tc.sm)
			}
			if got := holdings(g); strings.Join(got, "\n") != strings.Join(tc.held, "\n") {
				t.Errorf("holdings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.held, "\n"))
			}
			if g.Health != tc.health {
				t.Errorf("health %s (%s), want %s", g.Health, g.HealthReason, tc.health)
			}
		})
	}
}

// TestOneNode: --node keeps other nodes' slices and claims out.
func TestOneNode(t *testing.T) {
	other := node
	other.Name = "node-2"
	all := append(occtest.Slices(t, node), occtest.Slices(t, other)...)
	claims := []*resourceapi.ResourceClaim{occtest.Allocated("default/a", occtest.Result("node-2", "gpu-0"))}
	c, err := Build(all, claims, "node-1", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	if nodes := c.Nodes(); len(nodes) != 1 || nodes[0] != "node-1" {
		t.Fatalf("nodes %v, want node-1 only", nodes)
	}
	if g := gpu(t, c, 0); g.Whole != nil {
		t.Errorf("node-1 gpu-0 held by %s, a claim on node-2", g.Whole)
	}
}

// TestPicture prints the picture and table of a busy node (README sample)
// and checks the legend names every claim once.
func TestPicture(t *testing.T) {
	r, share := occtest.Result, occtest.Share
	c := build(t,
		occtest.Allocated("default/train", r("node-1", "gpu-0")),
		occtest.Allocated("default/big", r("node-1", "gpu-1-mig-3g40gb-4")),
		occtest.Allocated("ml/small", r("node-1", "gpu-1-mig-1g10gb-0")),
		occtest.Allocated("default/volcano", share("node-1", "gpu-2", "s1", "2000Mi", 20)),
		occtest.Allocated("default/notebook", share("node-1", "gpu-2", "s2", "4Gi", 0)),
		occtest.Allocated("default/static", r("node-1", "gpu-3-mig-3g40gb-4")),
		occtest.Allocated("default/slot", r("node-1", "gpu-4-slot-0")),
	)
	var pic, table bytes.Buffer
	if err := Picture(&pic, c); err != nil {
		t.Fatal(err)
	}
	if err := Table(&table, c); err != nil {
		t.Fatal(err)
	}
	t.Logf("picture:\n%s\ntable:\n%s", pic.String(), table.String())
	for _, want := range []string{"A default/train", "B ml/small", "C default/big", "[B...CCCC]", "3 of 8 memory slices free", "[....FFFF]", "[GGGG|....|....|....]"} {
		if !strings.Contains(pic.String(), want) {
			t.Errorf("picture lacks %q", want)
		}
	}
	// A share says what a workload can use of it (2000 MiB less the 518
	// MiB context HAMi-core charges), and the table names the source.
	for _, want := range []string{"default/volcano: share s1 of gpu-2 (1.95Gi, 20%; 1.45Gi usable)", "usable: a vGPU share's or slot's memory less the CUDA context", "measured on an H100 80GB HBM3 (518 MiB)"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	var y bytes.Buffer
	if err := YAML(&y, c); err != nil || !strings.Contains(y.String(), "memorySlices:") {
		t.Errorf("yaml: %v\n%s", err, y.String())
	}
}

// TestUnhealthyTaint: a GPU whose devices carry Facet's health taint is
// unhealthy, with the taint's reason and effect; the others stay ok.
func TestUnhealthyTaint(t *testing.T) {
	slices := occtest.Slices(t, node)
	for _, s := range slices {
		for i := range s.Spec.Devices {
			if strings.HasPrefix(s.Spec.Devices[i].Name, "gpu-2") {
				s.Spec.Devices[i].Taints = []resourceapi.DeviceTaint{{Key: names.TaintUnhealthy, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute}}
			}
		}
	}
	c, err := Build(slices, nil, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	if g := gpu(t, c, 2); g.Health != HealthUnhealthy || g.HealthReason != "xid-79 (NoExecute)" {
		t.Errorf("gpu 2: %s (%s)", g.Health, g.HealthReason)
	}
	if g := gpu(t, c, 3); g.Health != HealthOK {
		t.Errorf("gpu 3: %s (%s)", g.Health, g.HealthReason)
	}
}

// TestNVLinkDomains: on H100 NVL cards in bridged pairs, the table lists
// each domain with its GPUs that hold nothing, so a pair broken up by one
// claim shows; a node without NVLink lists none.
func TestNVLinkDomains(t *testing.T) {
	n := occtest.Node{Name: "n1", Machine: "h100-nvl-pairs"}
	c, err := Build(occtest.Slices(t, n), []*resourceapi.ResourceClaim{occtest.Allocated("ml/one", occtest.Result("n1", "gpu-1"))}, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Table(&out, c); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{"NVLink domains", "1 of 2 GPUs free  gpu-0", "2 of 2 GPUs free  gpu-2 gpu-3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	out.Reset()
	if err := Table(&out, build(t)); err != nil || strings.Contains(out.String(), "NVLink domains") {
		t.Errorf("a node without NVLink: %v\n%s", err, out.String())
	}
}

// TestComputePartitioning: each GPU says how its shares and slots are held
// to their cores, from their computePartitioning attribute, and the table
// names the GPUs that are only time-sliced.
func TestComputePartitioning(t *testing.T) {
	slices := occtest.Slices(t, node)
	for _, s := range slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if a, ok := d.Attributes[names.AttrComputePartitioning]; ok && *d.Attributes[names.AttrIndex].IntValue == 4 {
				a.StringValue = ptr.To(names.PartitioningTimeSliced)
				d.Attributes[names.AttrComputePartitioning] = a
			}
		}
	}
	c, err := Build(slices, nil, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	for idx, want := range map[int]string{0: "", 1: "", 2: names.PartitioningMPS, 4: names.PartitioningTimeSliced, 5: names.PartitioningMPS} {
		if got := gpu(t, c, idx).Compute; got != want {
			t.Errorf("gpu-%d: compute %q, want %q", idx, got, want)
		}
	}
	var out strings.Builder
	if err := Table(&out, c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "time-sliced, not MPS-partitioned: node-1/gpu-4.") {
		t.Errorf("the table does not name the time-sliced GPU:\n%s", out.String())
	}
}
