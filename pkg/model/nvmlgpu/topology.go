package nvmlgpu

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"
	"k8s.io/klog/v2"
)

// NVLink is one active NVLink of a GPU, as NVML reports it.
type NVLink struct {
	// Link is the link's number on the GPU (0 to NVML_NVLINK_MAX_LINKS-1).
	Link int
	// Version is the NVLink generation, e.g. "4.0"
	// (nvmlDeviceGetNvLinkVersion), or "" where NVML does not say.
	Version string
	// Remote is what the link reaches: RemoteGPU, RemoteSwitch or
	// RemoteOther (nvmlDeviceGetNvLinkRemoteDeviceType; where NVML does
	// not say, a remote bus ID that is one of the node's GPUs is a GPU).
	Remote string
	// RemoteBusID is the remote end's PCI bus ID in sysfs form
	// (nvmlDeviceGetNvLinkRemotePciInfo), or "" where NVML does not say.
	RemoteBusID string
}

// What an NVLink reaches.
const (
	RemoteGPU    = "gpu"
	RemoteSwitch = "nvswitch"
	RemoteOther  = "other"
)

// Fabric is a GPU's place in a multi-node NVLink fabric (GB200 NVL72), as
// nvmlDeviceGetGpuFabricInfo reports it once the fabric manager has
// registered the GPU: the GPUs of one NVLink partition share the cluster
// UUID and clique ID.
type Fabric struct {
	// ClusterUUID identifies the NVLink domain (the rack's fabric).
	ClusterUUID string
	// CliqueID is the GPU's fabric clique in that cluster.
	CliqueID uint32
}

// TopologyLevel is the deepest PCIe element two GPUs share, as NVML's
// nvmlDeviceGetTopologyCommonAncestor reports it, under the names `nvidia-smi
// topo -m` prints.
type TopologyLevel string

// The levels, closest first. TopologyBoard is NVML's TOPOLOGY_INTERNAL (two
// GPUs on one board), which nvidia-smi's legend does not name.
const (
	TopologyUnknown    TopologyLevel = ""
	TopologyBoard      TopologyLevel = "BRD"  // NVML_TOPOLOGY_INTERNAL
	TopologySingle     TopologyLevel = "PIX"  // NVML_TOPOLOGY_SINGLE: one PCIe switch
	TopologyMultiple   TopologyLevel = "PXB"  // NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
	TopologyHostBridge TopologyLevel = "PHB"  // NVML_TOPOLOGY_HOSTBRIDGE: through the host bridge
	TopologyNode       TopologyLevel = "NODE" // NVML_TOPOLOGY_NODE: host bridges of one NUMA node
	TopologySystem     TopologyLevel = "SYS"  // NVML_TOPOLOGY_SYSTEM: across sockets
)

func topologyLevel(l nvml.GpuTopologyLevel) TopologyLevel {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return TopologyBoard
	case nvml.TOPOLOGY_SINGLE:
		return TopologySingle
	case nvml.TOPOLOGY_MULTIPLE:
		return TopologyMultiple
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return TopologyHostBridge
	case nvml.TOPOLOGY_NODE:
		return TopologyNode
	case nvml.TOPOLOGY_SYSTEM:
		return TopologySystem
	}
	return TopologyUnknown
}

// Pair is what NVML says of two GPUs of the node.
type Pair struct {
	// Ancestor is their closest common PCIe ancestor, or TopologyUnknown
	// where NVML does not support the query.
	Ancestor TopologyLevel
	// NVLinks is the number of NVLinks between them: the links joining
	// them directly, or, where both reach NVSwitches and NVML reports P2P
	// over NVLink, the fewer of their two switch link counts (what
	// nvidia-smi topo -m shows as NV18 on an HGX H100). 0: none.
	NVLinks int
	// P2P is NVML's P2P status over NVLink (nvmlDeviceGetP2PStatus with
	// NVML_P2P_CAPS_INDEX_NVLINK): "OK", "NS" for not supported, or ""
	// where NVML does not answer.
	P2P string
}

// nvlinkVersions names NVML's NVLink version enum.
var nvlinkVersions = map[nvml.NvlinkVersion]string{
	nvml.NVLINK_VERSION_1_0: "1.0", nvml.NVLINK_VERSION_2_0: "2.0", nvml.NVLINK_VERSION_2_2: "2.2",
	nvml.NVLINK_VERSION_3_0: "3.0", nvml.NVLINK_VERSION_3_1: "3.1", nvml.NVLINK_VERSION_4_0: "4.0",
	nvml.NVLINK_VERSION_5_0: "5.0", nvml.NVLINK_VERSION_6_0: "6.0",
}

// NVLinkGBpsPerLink is one link's bandwidth in GB/s, both directions
// together, per NVLink generation, as NVIDIA's datasheets total it: NVLink
// 2 on V100 (6 links, 300 GB/s), 3 on A100 (12 links, 600 GB/s), 4 on H100
// (18 links, 900 GB/s), 5 on B200 and GB200 (18 links, 1.8 TB/s).
var NVLinkGBpsPerLink = map[string]int{
	"2.0": 50, "2.2": 50, "3.0": 50, "3.1": 50, "4.0": 50, "5.0": 100,
}

// discoverNVLinks lists dev's active NVLinks. A GPU without NVLink answers
// link 0 with ERROR_NOT_SUPPORTED, and links past the GPU's count with
// ERROR_INVALID_ARGUMENT; neither is an error. supported is false where
// NVML does not support NVLink on the GPU at all.
func discoverNVLinks(dev nvml.Device, haveRemoteType bool) (links []NVLink, supported bool) {
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			klog.InfoS("NVLink state unknown; the link is left out", "link", l, "error", nvml.ErrorString(ret))
			continue
		}
		supported = true
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		link := NVLink{Link: l}
		if v, ret := dev.GetNvLinkVersion(l); ret == nvml.SUCCESS {
			link.Version = nameOr(nvlinkVersions, nvml.NvlinkVersion(v), "")
		}
		if pci, ret := dev.GetNvLinkRemotePciInfo(l); ret == nvml.SUCCESS {
			link.RemoteBusID = normalizeBusID(busIDString(pci.BusId))
		}
		if haveRemoteType {
			if t, ret := dev.GetNvLinkRemoteDeviceType(l); ret == nvml.SUCCESS {
				switch t {
				case nvml.NVLINK_DEVICE_TYPE_GPU:
					link.Remote = RemoteGPU
				case nvml.NVLINK_DEVICE_TYPE_SWITCH:
					link.Remote = RemoteSwitch
				default:
					link.Remote = RemoteOther
				}
			}
		}
		links = append(links, link)
	}
	return links, supported
}

// discoverFabric reads the GPU's multi-node NVLink fabric membership: only
// a GPU whose registration with the fabric manager completed with a
// non-zero cluster UUID has one (NVIDIA's DRA driver draws the same line
// for ComputeDomains). A driver without the call (before R525), or a GPU
// that is not in such a fabric, has none.
func discoverFabric(lib nvml.Interface, dev nvml.Device) *Fabric {
	if !HasSymbol(lib, "nvmlDeviceGetGpuFabricInfo") {
		return nil
	}
	info, ret := dev.GetGpuFabricInfo()
	if ret != nvml.SUCCESS || info.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(info.Status) != nvml.SUCCESS {
		return nil
	}
	if info.ClusterUuid == ([16]uint8{}) {
		return nil
	}
	return &Fabric{ClusterUUID: uuid.UUID(info.ClusterUuid).String(), CliqueID: info.CliqueId}
}

// discoverPairs asks NVML about every pair of GPUs and completes each GPU's
// NVLink picture: what its links reach where NVML did not say, its NVLink
// domain and bandwidth.
func discoverPairs(node *Node, devs []nvml.Device) {
	n := len(devs)
	node.Pairs = make([][]Pair, n)
	byBus := map[string]int{}
	for i := range node.GPUs {
		byBus[node.GPUs[i].PCIBusID] = i
	}
	for i := range node.GPUs {
		for k := range node.GPUs[i].NVLinks {
			l := &node.GPUs[i].NVLinks[k]
			if l.Remote == "" {
				if _, ok := byBus[l.RemoteBusID]; ok && l.RemoteBusID != "" {
					l.Remote = RemoteGPU
				} else {
					l.Remote = RemoteOther
				}
			}
		}
	}
	for i := 0; i < n; i++ {
		node.Pairs[i] = make([]Pair, n)
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			p := &node.Pairs[i][j]
			if lvl, ret := devs[i].GetTopologyCommonAncestor(devs[j]); ret == nvml.SUCCESS {
				p.Ancestor = topologyLevel(lvl)
			}
			if st, ret := devs[i].GetP2PStatus(devs[j], nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS {
				p.P2P = "NS"
				if st == nvml.P2P_STATUS_OK {
					p.P2P = "OK"
				}
			}
			p.NVLinks = pairLinks(&node.GPUs[i], &node.GPUs[j], p.P2P)
		}
	}
	setDomains(node)
}

// pairLinks counts the NVLinks between a and b: direct links; else, when
// both reach NVSwitches, the fewer of their switch link counts, where NVML
// reports P2P over NVLink between them ("OK"), or does not answer (p2p "")
// and the two reach one NVSwitch (the same remote bus ID).
func pairLinks(a, b *GPU, p2p string) int {
	direct, switched, other := 0, 0, 0
	switches := map[string]bool{}
	for _, l := range a.NVLinks {
		switch {
		case l.Remote == RemoteGPU && l.RemoteBusID == b.PCIBusID:
			direct++
		case l.Remote == RemoteSwitch:
			switched++
			switches[l.RemoteBusID] = l.RemoteBusID != ""
		}
	}
	if direct > 0 {
		return direct
	}
	shared := false
	for _, l := range b.NVLinks {
		if l.Remote == RemoteSwitch {
			other++
			shared = shared || switches[l.RemoteBusID]
		}
	}
	viaSwitch := p2p == "OK" || p2p == "" && shared
	if switched == 0 || other == 0 || !viaSwitch {
		return 0
	}
	return min(switched, other)
}

// setDomains gives each GPU with an active NVLink to a GPU or an NVSwitch
// its NVLink domain: the GPUs joined on this node by NVLink, directly or
// through an NVSwitch, with P2P over NVLink between every two of them where
// NVML answers. The value is "nvl-" and the first 16 hex digits of the
// SHA-256 of the domain's GPU UUIDs, sorted and joined by commas: the same
// on every GPU of the domain, the same after a restart or a reboot (UUIDs
// are the GPUs' own, unlike indices and bus IDs, which a BIOS or slot
// change can renumber), and different for another set of GPUs. A GPU that
// is replaced changes its domain's value, as it should: the set changed.
func setDomains(node *Node) {
	n := len(node.GPUs)
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	linked := make([]bool, n)
	for i := range node.GPUs {
		for _, l := range node.GPUs[i].NVLinks {
			if l.Remote == RemoteGPU || l.Remote == RemoteSwitch {
				linked[i] = true
			}
		}
		for j := range node.GPUs {
			if i != j && node.Pairs[i][j].NVLinks > 0 && node.Pairs[i][j].P2P != "NS" {
				parent[find(i)] = find(j)
			}
		}
	}
	members := map[int][]string{}
	for i := range node.GPUs {
		if linked[i] {
			members[find(i)] = append(members[find(i)], node.GPUs[i].UUID)
		}
	}
	for i := range node.GPUs {
		g := &node.GPUs[i]
		if !linked[i] {
			continue
		}
		uuids := append([]string(nil), members[find(i)]...)
		sort.Strings(uuids)
		sum := sha256.Sum256([]byte(strings.Join(uuids, ",")))
		g.NVLinkDomain = "nvl-" + hex.EncodeToString(sum[:8])
		g.NVLinkDomainSize = len(uuids)
	}
	for i := range node.GPUs {
		g := &node.GPUs[i]
		bw := 0
		for _, l := range g.NVLinks {
			per, ok := NVLinkGBpsPerLink[l.Version]
			if !ok {
				bw = 0
				break
			}
			bw += per
		}
		g.NVLinkBandwidthGBps = bw
	}
}

// pciSegment is a PCI device's directory name in sysfs's device tree.
var pciSegment = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// PCIeSwitchFromPath returns the bus ID of the upstream port of the PCIe
// switch a device sits directly under, from the device's sysfs path
// (/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1b:00.0):
// below the root complex (pci0000:17) the first device is the root port,
// and a device behind a switch hangs off one of its downstream ports, whose
// parent is the switch's upstream port (the PCI Express Base
// Specification's switch model; Linux's Documentation/PCI/pci.rst shows
// the tree). So with at least a root port, an upstream and a downstream
// port above the device, the switch is the device's grandparent; a device
// right on a root port (most VMs, many servers) has none, and "" is
// returned.
func PCIeSwitchFromPath(p string) string {
	parts := strings.Split(filepath.ToSlash(p), "/")
	root := -1
	for i, s := range parts {
		if strings.HasPrefix(s, "pci") && pcieRootPattern.MatchString(s) {
			root = i
		}
	}
	if root < 0 {
		return ""
	}
	var chain []string
	for _, s := range parts[root+1:] {
		if !pciSegment.MatchString(s) {
			return ""
		}
		chain = append(chain, s)
	}
	// chain: root port, [upstream, downstream]..., device.
	if len(chain) < 4 {
		return ""
	}
	return chain[len(chain)-3]
}

var pcieRootPattern = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)
