package sim

import (
	"fmt"
	"path"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// simulateTopology makes the simulated GPUs answer NVML's topology, NVLink
// and fabric calls from the machine file, as the real driver answers them:
//
//   - nvmlDeviceGetNvLinkState: "Not Supported" on a GPU without NVLink (no
//     nvlink, or in no bridge); enabled for links below linksPerGPU, and
//     an invalid argument past them;
//   - the version, remote PCI info and remote device type of each link;
//   - nvmlDeviceGetP2PStatus over NVLink: OK between GPUs of one bridge,
//     and between any two GPUs when the machine has NVSwitches; not
//     supported otherwise (and for every other P2P capability, which Facet
//     does not ask for);
//   - nvmlDeviceGetTopologyCommonAncestor: one switch (PIX) under one
//     pcieSwitch, the host bridge (PHB) in one root complex, NODE on one
//     NUMA node, SYS across them;
//   - nvmlDeviceGetGpuFabricInfo: the fabric, registered, or "Not
//     Supported" without one.
func simulateTopology(srv *server.Server, m *Machine) {
	index := map[nvml.Device]int{}
	for i, d := range srv.Devices {
		index[d] = i
	}
	bridge := map[int][]int{}
	if m.NVLink != nil {
		for _, b := range m.NVLink.Bridges {
			for _, i := range b {
				bridge[i] = b
			}
		}
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		remotes := nvlinkRemotes(m, i, bridge[i])
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			switch {
			case len(remotes) == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case l < 0 || l >= len(remotes):
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		linkOK := func(l int) nvml.Return {
			switch {
			case len(remotes) == 0:
				return nvml.ERROR_NOT_SUPPORTED
			case l < 0 || l >= len(remotes):
				return nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.SUCCESS
		}
		dev.GetNvLinkVersionFunc = func(l int) (uint32, nvml.Return) {
			if ret := linkOK(l); ret != nvml.SUCCESS {
				return 0, ret
			}
			return uint32(nvlinkVersions[m.NVLink.Version]), nvml.SUCCESS
		}
		dev.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			if ret := linkOK(l); ret != nvml.SUCCESS {
				return nvml.PciInfo{}, ret
			}
			return pciInfo(remotes[l].busID), nvml.SUCCESS
		}
		dev.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if ret := linkOK(l); ret != nvml.SUCCESS {
				return 0, ret
			}
			if remotes[l].nvswitch {
				return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
			}
			return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
		}
		dev.GetP2PStatusFunc = func(other nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			j, ok := index[other]
			if !ok || j == i {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if caps == nvml.P2P_CAPS_INDEX_NVLINK && nvlinkPeers(m, bridge, i, j) {
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		dev.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j, ok := index[other]
			if !ok {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return commonAncestor(m.GPUs[i], m.GPUs[j]), nvml.SUCCESS
		}
		dev.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			if m.Fabric == nil {
				return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			info := nvml.GpuFabricInfo{
				ClusterUuid: uuid.MustParse(m.Fabric.ClusterUUID),
				Status:      uint32(nvml.SUCCESS),
				CliqueId:    m.Fabric.CliqueID,
				State:       nvml.GPU_FABRIC_STATE_COMPLETED,
			}
			return info, nvml.SUCCESS
		}
	}
}

type nvlinkRemote struct {
	busID    string
	nvswitch bool
}

// nvlinkRemotes is what each active link of GPU i reaches: the NVSwitches
// in turn, or the other GPUs of its bridge in turn.
func nvlinkRemotes(m *Machine, i int, bridge []int) []nvlinkRemote {
	nl := m.NVLink
	if nl == nil {
		return nil
	}
	var peers []nvlinkRemote
	for _, sw := range nl.NVSwitches {
		peers = append(peers, nvlinkRemote{busID: sw, nvswitch: true})
	}
	for _, j := range bridge {
		if j != i {
			peers = append(peers, nvlinkRemote{busID: m.GPUs[j].PCIBusID})
		}
	}
	if len(peers) == 0 {
		return nil
	}
	out := make([]nvlinkRemote, nl.LinksPerGPU)
	for l := range out {
		out[l] = peers[l%len(peers)]
	}
	return out
}

func nvlinkPeers(m *Machine, bridge map[int][]int, i, j int) bool {
	if m.NVLink == nil {
		return false
	}
	if len(m.NVLink.NVSwitches) > 0 {
		return true
	}
	for _, k := range bridge[i] {
		if k == j {
			return true
		}
	}
	return false
}

// commonAncestor is NVML's answer for two GPUs of the machine.
func commonAncestor(a, b MachineGPU) nvml.GpuTopologyLevel {
	switch {
	case a.PCIBusID == b.PCIBusID:
		return nvml.TOPOLOGY_INTERNAL
	case a.PCIeSwitch != "" && a.PCIeSwitch == b.PCIeSwitch:
		return nvml.TOPOLOGY_SINGLE
	case a.PCIeRoot == b.PCIeRoot:
		return nvml.TOPOLOGY_HOSTBRIDGE
	case a.NUMANode != nil && b.NUMANode != nil && *a.NUMANode >= 0 && *a.NUMANode == *b.NUMANode:
		return nvml.TOPOLOGY_NODE
	}
	return nvml.TOPOLOGY_SYSTEM
}

// pciInfo is NVML's PCI info for a sysfs bus ID.
func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	// NVML reports an 8-digit domain.
	id := "0000" + busID
	for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(id[i])
	}
	_, _ = fmt.Sscanf(busID, "%x:%x:%x", &p.Domain, &p.Bus, &p.Device)
	return p
}

// pciPaths lays out each GPU's place in sysfs's device tree, as
// /sys/bus/pci/devices/<bus ID> links to it: under its root complex, a
// root port, then, for a GPU under a PCIe switch, the switch's upstream
// port and a downstream port (bus switch+1, one device number per GPU).
// Each switch of a root complex has its own root port; a GPU without one
// has a root port of its own.
func pciPaths(m *Machine) map[string]string {
	paths := map[string]string{}
	rootPorts := map[string]int{}     // per root complex, ports handed out
	switchPort := map[string]string{} // switch -> its root port
	downstream := map[string]int{}    // per switch, downstream ports handed out
	rootPort := func(root string) string {
		rootPorts[root]++
		// pci0000:17 -> 0000:17:NN.0
		return fmt.Sprintf("%s:%s:%02x.0", root[3:7], root[8:10], rootPorts[root])
	}
	for _, g := range m.GPUs {
		if g.PCIeSwitch == "" {
			paths[g.PCIBusID] = path.Join("/sys/devices", g.PCIeRoot, rootPort(g.PCIeRoot), g.PCIBusID)
			continue
		}
		rp, ok := switchPort[g.PCIeSwitch]
		if !ok {
			rp = rootPort(g.PCIeRoot)
			switchPort[g.PCIeSwitch] = rp
		}
		bus, _ := strconv.ParseUint(g.PCIeSwitch[5:7], 16, 8)
		down := fmt.Sprintf("%s:%02x:%02x.0", g.PCIeSwitch[:4], (bus+1)&0xff, downstream[g.PCIeSwitch])
		downstream[g.PCIeSwitch]++
		paths[g.PCIBusID] = path.Join("/sys/devices", g.PCIeRoot, rp, g.PCIeSwitch, down, g.PCIBusID)
	}
	return paths
}
