// Package occupancy computes, from a cluster's ResourceSlices and allocated
// ResourceClaims alone, what each Facet GPU holds: its mode, the claim that
// holds it whole, its MIG instances with their memory slices, its vGPU
// shares and slots, and the memory and compute used and free. It is what
// `facetctl occupancy` shows and what `facetctl fit` explains a claim that
// does not fit with.
//
// Everything comes from the API objects: the devices and their attributes
// from the slices, the holders from status.allocation of the claims. The
// one exception is the size of a MIG placement in memory slices, which
// slices do not publish; it comes from NVIDIA's MIG tables (ProfileTable).
package occupancy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// Device types, as published in the `type` attribute (package names has
// the words).
const (
	TypeGPU  = names.KindGPU
	TypeMIG  = names.KindMIG
	TypeSlot = names.KindVGPUSlot
)

// Health of a GPU.
const (
	// HealthOK: the GPU's devices are published untainted.
	HealthOK = "ok"
	// HealthUnhealthy: the plugin found a fault and tainted the GPU's
	// devices (names.TaintUnhealthy; clusters enforcing DRADeviceTaints).
	// On a cluster without device taints the plugin unpublishes such a
	// GPU instead: it is then absent from the slices, and HealthAbsent
	// once a claim still holds one of its devices.
	HealthUnhealthy = "unhealthy"
	// HealthAbsent: claims hold devices of the GPU that no ResourceSlice
	// publishes (the plugin stopped publishing the GPU, or its node left).
	HealthAbsent = "absent"
)

// Claim names a ResourceClaim.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// Amount is a used part of a total.
type Amount struct {
	Used  int64 `json:"used"`
	Total int64 `json:"total"`
}

// Free is Total less Used, never negative.
func (a Amount) Free() int64 { return max(a.Total-a.Used, 0) }

// MIGUse is an allocated MIG device.
type MIGUse struct {
	Device  string `json:"device"`
	Profile string `json:"profile"`
	// Start and Size are the placement in memory slices; Size is 0 when
	// the product's MIG table is unknown.
	Start       int   `json:"start"`
	Size        int   `json:"size,omitempty"`
	MemoryBytes int64 `json:"memoryBytes"`
	Claim       Claim `json:"claim"`
}

// ShareUse is one vGPU share of a multi-allocatable gpu-<i>.
type ShareUse struct {
	Device      string `json:"device"`
	ShareID     string `json:"shareID"`
	MemoryBytes int64  `json:"memoryBytes"`
	// Cores is the percent of SM time; 0 is best effort.
	Cores int64 `json:"cores"`
	Claim Claim `json:"claim"`
	// MPS: the plugin prepared the share as an MPS client (its claim's
	// status.devices says so), whose CUDA context HAMi-core does not
	// charge.
	MPS bool `json:"mps,omitempty"`
}

// SlotUse is one vGPU slot, held or free.
type SlotUse struct {
	Device      string `json:"device"`
	Slot        int    `json:"slot"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
	Claim       *Claim `json:"claim,omitempty"`
	// MPS: as ShareUse's.
	MPS bool `json:"mps,omitempty"`
}

// GPU is one physical GPU of a node.
type GPU struct {
	Node    string `json:"node"`
	Index   int    `json:"index"`
	UUID    string `json:"uuid,omitempty"`
	Product string `json:"product,omitempty"`
	Mode    string `json:"mode"`
	// Compute is how its vGPU shares and slots are held to their cores,
	// as their computePartitioning attribute says: names.PartitioningMPS,
	// or names.PartitioningTimeSliced where MPS is off or unavailable on
	// the node (its FacetSharingMechanismUnavailable Event says why).
	// Empty on a GPU without shares or slots.
	Compute string `json:"compute,omitempty"`
	Health  string `json:"health"`
	// HealthReason says why Health is not ok.
	HealthReason string `json:"healthReason,omitempty"`
	// Memory in bytes and Cores in percent of SM time: of the whole GPU in
	// exclusive, mig, shared and dynamic mode; of the published instances
	// or slots in static-mig and slots mode.
	Memory Amount `json:"memory"`
	Cores  Amount `json:"cores"`
	// Whole is the claim that holds gpu-<i> itself (not as a share).
	Whole  *Claim     `json:"whole,omitempty"`
	MIG    []MIGUse   `json:"mig,omitempty"`
	Shares []ShareUse `json:"shares,omitempty"`
	Slots  []SlotUse  `json:"slots,omitempty"`
	// MemorySlices holds, per memory slice, the holder: a claim, or
	// SharesHold when vGPU shares keep MIG off the GPU (dynamic mode), or
	// "" when free. Nil when the GPU has no MIG devices or its product's
	// MIG table is unknown.
	MemorySlices []string `json:"memorySlices,omitempty"`
	// Devices are the GPU's published devices, in slice order.
	Devices []string `json:"devices,omitempty"`
}

// Name is the GPU's device-name stem, "gpu-<index>".
func (g *GPU) Name() string { return fmt.Sprintf("gpu-%d", g.Index) }

// SharesHold marks memory slices that vGPU shares on a dynamic-mode GPU
// keep from MIG (gpu-<i> consumes every counter of the GPU).
const SharesHold = "vGPU shares"

// NoInstance marks memory slices of a static-mig GPU that no published
// MIG instance covers: nothing there can be allocated.
const NoInstance = "no instance"

// FreeSlices counts the free memory slices.
func (g *GPU) FreeSlices() int {
	n := 0
	for _, h := range g.MemorySlices {
		if h == "" {
			n++
		}
	}
	return n
}

// Claims lists the claims holding anything on the GPU, sorted.
func (g *GPU) Claims() []Claim {
	seen := map[Claim]bool{}
	if g.Whole != nil {
		seen[*g.Whole] = true
	}
	for _, m := range g.MIG {
		seen[m.Claim] = true
	}
	for _, s := range g.Shares {
		seen[s.Claim] = true
	}
	for _, s := range g.Slots {
		if s.Claim != nil {
			seen[*s.Claim] = true
		}
	}
	out := make([]Claim, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Device is one published device with its holders.
type Device struct {
	Node   string             `json:"-"`
	Device resourceapi.Device `json:"-"`
	GPU    *GPU               `json:"-"`
	// Holders are the claims allocated this device (several for a
	// multi-allocatable one).
	Holders []Claim `json:"-"`
	// Type is the `type` attribute.
	Type string `json:"-"`
	// MPS: a holder's status.devices says it was prepared under MPS.
	MPS bool `json:"-"`
}

// Attr returns a string attribute of the device in Facet's domain.
func (d *Device) Attr(name string) string {
	if a, ok := d.Device.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// IntAttr returns an int attribute, or -1.
func (d *Device) IntAttr(name string) int {
	if a, ok := d.Device.Attributes[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return int(*a.IntValue)
	}
	return -1
}

// Capacity returns a capacity's value, or 0.
func (d *Device) Capacity(name string) int64 {
	if c, ok := d.Device.Capacity[resourceapi.QualifiedName(name)]; ok {
		return c.Value.Value()
	}
	return 0
}

// Cluster is the occupancy of every Facet GPU, and of the nodes' IMEX
// channels.
type Cluster struct {
	// GPUs by node, then index.
	GPUs []*GPU `json:"gpus"`
	// Channels are the nodes' imex-channel devices, by node (Channels).
	Channels []*Channel `json:"channels,omitempty"`
	// Cliques are the NVLink fabric cliques of the channels (Cliques).
	Cliques []Clique `json:"cliques,omitempty"`
	// Domains are the cluster's ComputeDomains, where the caller read
	// them (DomainsOf); Build leaves them empty.
	Domains []Domain `json:"domains,omitempty"`
	devices map[string]map[string]*Device
	// channels are the imex-channel devices as Devices, by node, for
	// fit's selectors.
	channels map[string][]*Device
	profile  ProfileTable
}

// Device finds a published device of a node's pool.
func (c *Cluster) Device(node, name string) (*Device, bool) {
	d, ok := c.devices[node][name]
	return d, ok
}

// NodeDevices lists a node's published devices of GPUs in slice order.
func (c *Cluster) NodeDevices(node string) []*Device {
	var out []*Device
	for _, g := range c.GPUs {
		if g.Node != node {
			continue
		}
		for _, n := range g.Devices {
			out = append(out, c.devices[node][n])
		}
	}
	return out
}

// NodeChannels lists a node's imex-channel devices, their holders filled;
// their GPU is nil.
func (c *Cluster) NodeChannels(node string) []*Device {
	return c.channels[node]
}

// Channel finds a node's channel by device name.
func (c *Cluster) Channel(node, device string) *Channel {
	for _, ch := range c.Channels {
		if ch.Node == node && ch.Device == device {
			return ch
		}
	}
	return nil
}

// Nodes lists the nodes with Facet GPUs or IMEX channels, sorted.
func (c *Cluster) Nodes() []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range c.GPUs {
		if !seen[g.Node] {
			seen[g.Node] = true
			out = append(out, g.Node)
		}
	}
	for _, ch := range c.Channels {
		if !seen[ch.Node] {
			seen[ch.Node] = true
			out = append(out, ch.Node)
		}
	}
	sort.Strings(out)
	return out
}

// Profile looks a MIG profile up for a GPU.
func (c *Cluster) Profile(g *GPU, profile string) (Profile, bool) {
	return c.profile.Lookup(g.Product, profile)
}

// deviceGPU finds the GPU index in a device name that carries no
// attributes (one no slice publishes): "gpu-3", "gpu-3-mig-...".
var deviceGPU = regexp.MustCompile(`^gpu-([0-9]+)(-|$)`)

// Build computes the occupancy of the given node's GPUs (every node when
// node is empty) from the cluster's slices and claims. Only Facet's
// devices count: slices and results of other drivers are skipped.
func Build(slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, node string, profiles ProfileTable) (*Cluster, error) {
	if profiles == nil {
		profiles = tables{}
	}
	c := &Cluster{devices: map[string]map[string]*Device{}, channels: map[string][]*Device{}, profile: profiles}
	gpus := map[string]map[int]*GPU{}
	gpuOf := func(n string, idx int) *GPU {
		if gpus[n] == nil {
			gpus[n] = map[int]*GPU{}
		}
		g := gpus[n][idx]
		if g == nil {
			g = &GPU{Node: n, Index: idx, Health: HealthOK}
			gpus[n][idx] = g
		}
		return g
	}

	// Slices in a stable order: by pool and name, as a list from the API
	// server comes, so that device order is the pool's slice order.
	ordered := append([]*resourceapi.ResourceSlice(nil), slices...)
	sort.SliceStable(ordered, func(i, j int) bool {
		if ordered[i].Spec.Pool.Name != ordered[j].Spec.Pool.Name {
			return ordered[i].Spec.Pool.Name < ordered[j].Spec.Pool.Name
		}
		return ordered[i].Name < ordered[j].Name
	})
	for _, s := range ordered {
		if s.Spec.Driver != names.Driver || (node != "" && s.Spec.Pool.Name != node) {
			continue
		}
		pool := s.Spec.Pool.Name
		for _, dev := range s.Spec.Devices {
			d := &Device{Node: pool, Device: dev}
			d.Type = d.Attr("type")
			if d.Type == TypeIMEXChannel {
				// Of the node, not of a GPU: Channels models it.
				c.channels[pool] = append(c.channels[pool], d)
				continue
			}
			idx := d.IntAttr("index")
			if idx < 0 {
				return nil, fmt.Errorf("ResourceSlice %s: device %s has no index attribute", s.Name, dev.Name)
			}
			g := gpuOf(pool, idx)
			d.GPU = g
			if c.devices[pool] == nil {
				c.devices[pool] = map[string]*Device{}
			}
			c.devices[pool][dev.Name] = d
			g.Devices = append(g.Devices, dev.Name)
			for _, t := range dev.Taints {
				if t.Key == names.TaintUnhealthy {
					g.Health, g.HealthReason = HealthUnhealthy, fmt.Sprintf("%s (%s)", t.Value, t.Effect)
				}
			}
			g.Mode = d.Attr("mode")
			g.Product = d.Attr("productName")
			if p := d.Attr(names.AttrComputePartitioning); p != "" {
				g.Compute = p
			}
			switch d.Type {
			case TypeGPU:
				g.UUID = d.Attr("uuid")
			default:
				g.UUID = d.Attr("parentUUID")
			}
		}
	}

	for _, cl := range claims {
		if cl.Status.Allocation == nil {
			continue
		}
		holder := Claim{Namespace: cl.Namespace, Name: cl.Name}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != names.Driver || (node != "" && r.Pool != node) {
				continue
			}
			if ch := channelDevice(c.channels[r.Pool], r.Device); ch != nil {
				ch.Holders = append(ch.Holders, holder)
				continue
			}
			d, ok := c.devices[r.Pool][r.Device]
			if !ok {
				m := deviceGPU.FindStringSubmatch(r.Device)
				if m == nil {
					return nil, fmt.Errorf("ResourceClaim %s: allocated device %s/%s is not published and names no GPU", holder, r.Pool, r.Device)
				}
				idx, _ := strconv.Atoi(m[1])
				g := gpuOf(r.Pool, idx)
				g.Health, g.HealthReason = HealthAbsent, fmt.Sprintf("claims hold %s, which no ResourceSlice publishes", r.Device)
				if g.Mode == "" {
					g.Mode = "unknown"
				}
				continue
			}
			d.Holders = append(d.Holders, holder)
			c.use(d, holder, r, preparedMPS(cl, r))
		}
	}

	c.Channels = Channels(ordered, claims, node)
	c.Cliques = Cliques(c.Channels)
	for _, byIndex := range gpus {
		for _, g := range byIndex {
			c.GPUs = append(c.GPUs, g)
			c.totals(g)
		}
	}
	sort.Slice(c.GPUs, func(i, j int) bool {
		a, b := c.GPUs[i], c.GPUs[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.Index < b.Index
	})
	return c, nil
}

func channelDevice(devs []*Device, name string) *Device {
	for _, d := range devs {
		if d.Device.Name == name {
			return d
		}
	}
	return nil
}

// preparedMPS says whether the claim's status.devices entry for the
// result, which the plugin writes at prepare (package claimstatus), says
// the share was prepared as an MPS client. No entry (not prepared yet, or
// a plugin that writes none): false.
func preparedMPS(cl *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) bool {
	for _, st := range cl.Status.Devices {
		if st.Driver != r.Driver || st.Pool != r.Pool || st.Device != r.Device || st.Data == nil {
			continue
		}
		if (st.ShareID == nil) != (r.ShareID == nil) || (st.ShareID != nil && *st.ShareID != string(*r.ShareID)) {
			continue
		}
		var data struct {
			ComputePartitioning string `json:"computePartitioning"`
		}
		if json.Unmarshal(st.Data.Raw, &data) == nil {
			return data.ComputePartitioning == names.PartitioningMPS
		}
	}
	return false
}

// use records one allocation result on its device's GPU.
func (c *Cluster) use(d *Device, holder Claim, r resourceapi.DeviceRequestAllocationResult, mps bool) {
	g := d.GPU
	d.MPS = d.MPS || mps
	switch d.Type {
	case TypeMIG:
		u := MIGUse{Device: d.Device.Name, Profile: d.Attr("profile"), Start: d.IntAttr("placementStart"), MemoryBytes: d.Capacity("memory"), Claim: holder}
		if p, ok := c.profile.Lookup(g.Product, u.Profile); ok {
			u.Size = p.MemorySlices
		}
		g.MIG = append(g.MIG, u)
	case TypeSlot:
		// Slots are listed in totals, with or without a holder.
	default:
		if r.ShareID == nil {
			h := holder
			g.Whole = &h
			return
		}
		s := ShareUse{Device: d.Device.Name, ShareID: string(*r.ShareID), Claim: holder,
			MemoryBytes: d.Capacity("memory"), Cores: 100, MPS: mps}
		// The allocator records what a share consumed, defaults applied;
		// without it (no consumable capacity) the share took the device.
		if q, ok := r.ConsumedCapacity["memory"]; ok {
			s.MemoryBytes = q.Value()
		}
		if q, ok := r.ConsumedCapacity["cores"]; ok {
			s.Cores = q.Value()
		}
		g.Shares = append(g.Shares, s)
	}
}

// totals derives the GPU's memory, cores, slots and memory slices from
// its devices and uses.
func (c *Cluster) totals(g *GPU) {
	var whole *Device
	var migTotal, slotMem, slotCores int64
	hasMIG := false
	for _, n := range g.Devices {
		d := c.devices[g.Node][n]
		switch d.Type {
		case TypeGPU:
			whole = d
		case TypeMIG:
			hasMIG = true
			migTotal += d.Capacity("memory")
		case TypeSlot:
			u := SlotUse{Device: n, Slot: d.IntAttr("slot"), MemoryBytes: d.Capacity("memory"), Cores: d.Capacity("cores")}
			if len(d.Holders) > 0 {
				h := d.Holders[0]
				u.Claim = &h
				u.MPS = d.MPS
			}
			g.Slots = append(g.Slots, u)
			slotMem += u.MemoryBytes
			slotCores += u.Cores
		}
	}
	switch {
	case whole != nil:
		g.Memory.Total, g.Cores.Total = whole.Capacity("memory"), 100
	case len(g.Slots) > 0:
		g.Memory.Total, g.Cores.Total = slotMem, slotCores
	default: // static-mig: what the published instances add up to
		g.Memory.Total, g.Cores.Total = migTotal, 100
	}
	if g.Whole != nil {
		g.Memory.Used, g.Cores.Used = g.Memory.Total, g.Cores.Total
	}
	for _, s := range g.Shares {
		g.Memory.Used += s.MemoryBytes
		g.Cores.Used += s.Cores
	}
	for _, s := range g.Slots {
		if s.Claim != nil {
			g.Memory.Used += s.MemoryBytes
			g.Cores.Used += s.Cores
		}
	}
	for _, m := range g.MIG {
		g.Memory.Used += m.MemoryBytes
		if p, ok := c.profile.Lookup(g.Product, m.Profile); ok && p.GPUComputeSlices > 0 {
			g.Cores.Used += int64(100 * p.ComputeSlices / p.GPUComputeSlices)
		}
	}

	if !hasMIG {
		return
	}
	n := 0
	for _, name := range g.Devices {
		d := c.devices[g.Node][name]
		if d.Type == TypeMIG {
			if p, ok := c.profile.Lookup(g.Product, d.Attr("profile")); ok {
				n = p.GPUMemorySlices
				break
			}
		}
	}
	if n == 0 {
		return
	}
	g.MemorySlices = make([]string, n)
	fill := func(from, to int, who string) {
		for k := max(from, 0); k < min(to, n); k++ {
			g.MemorySlices[k] = who
		}
	}
	if whole == nil {
		// static-mig: only the slices of existing instances can be
		// allocated; the rest has no device.
		fill(0, n, NoInstance)
		for _, name := range g.Devices {
			d := c.devices[g.Node][name]
			if p, ok := c.profile.Lookup(g.Product, d.Attr("profile")); ok && d.Type == TypeMIG {
				start := d.IntAttr("placementStart")
				fill(start, start+p.MemorySlices, "")
			}
		}
	}
	if g.Whole != nil {
		fill(0, n, g.Whole.String())
	}
	if len(g.Shares) > 0 {
		fill(0, n, SharesHold)
	}
	for _, m := range g.MIG {
		if m.Size > 0 {
			fill(m.Start, m.Start+m.Size, m.Claim.String())
		}
	}
}
