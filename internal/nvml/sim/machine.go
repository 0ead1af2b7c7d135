package sim

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"
	"sigs.k8s.io/yaml"
)

// Machine describes a simulated GPU node. It is read from a machine file
// (YAML), e.g. demo/machines/dgx-h100.yaml:
//
//	name: dgx-h100
//	driverVersion: "580.159.04"
//	cudaDriverVersion: "13.0"
//	gpus:
//	- model: H100-SXM5-80GB
//	  pciBusID: "0000:18:00.0"
//	  pcieRoot: pci0000:17
//	  numaNode: 0
type Machine struct {
	// Name identifies the machine; it seeds the GPUs' default UUIDs, so two
	// machines with the same name and layout have the same UUIDs.
	Name string `json:"name"`
	// DriverVersion is the NVIDIA kernel driver version, e.g. "580.159.04".
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is "major.minor", e.g. "13.0".
	CUDADriverVersion string `json:"cudaDriverVersion"`
	// GPUs in NVML index order.
	GPUs []MachineGPU `json:"gpus"`
	// CIInfoParentDevice makes nvmlComputeInstanceGetInfo report the
	// parent GPU as the compute instance's device, as nvml.h documents the
	// field, instead of the MIG device, which is what the driver gives and
	// NVIDIA's DRA driver reads the MIG device's UUID from. It is there to
	// test Facet's fallback (nvml.Library.CreateMIG).
	CIInfoParentDevice bool `json:"ciInfoParentDevice,omitempty"`
	// NVLink joins the GPUs, through NVSwitches or bridges; none: the GPUs
	// have no NVLink and NVML answers its NVLink calls "Not Supported".
	NVLink *MachineNVLink `json:"nvlink,omitempty"`
	// Fabric puts every GPU in a multi-node NVLink fabric (GB200 NVL72),
	// as nvmlDeviceGetGpuFabricInfo reports it once the fabric manager
	// has registered the GPU; none: "Not Supported".
	Fabric *MachineFabric `json:"fabric,omitempty"`
}

// MachineNVLink is the machine's NVLink layout: every GPU reaches the
// NVSwitches, or the GPUs of each bridge reach each other.
type MachineNVLink struct {
	// Version is the NVLink generation: "3.0" (A100), "4.0" (Hopper),
	// "5.0" (Blackwell).
	Version string `json:"version"`
	// LinksPerGPU is the number of active links of each NVLinked GPU.
	LinksPerGPU int `json:"linksPerGPU"`
	// NVSwitches are the bus IDs the GPUs' links report as their remote
	// end; a GPU's links go to them in turn (link l to NVSwitches[l mod
	// n]).
	NVSwitches []string `json:"nvswitches,omitempty"`
	// Bridges are sets of GPU indices joined directly, each GPU's links
	// going to the other GPUs of its bridge in turn. A GPU in no bridge
	// (and no NVSwitches) has no NVLink.
	Bridges [][]int `json:"bridges,omitempty"`
}

// MachineFabric is a multi-node NVLink fabric's identity.
type MachineFabric struct {
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueID"`
}

// MachineGPU is one simulated GPU.
type MachineGPU struct {
	// Model is one of Models(), e.g. "H100-SXM5-80GB" or "L4".
	Model string `json:"model"`
	// UUID overrides the default, which is derived from the machine name
	// and the GPU's index.
	UUID string `json:"uuid,omitempty"`
	// PCIBusID in sysfs form "dddd:bb:dd.f"; default "0000:<index+1>:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// PCIeRoot is the root complex the bus ID hangs off, e.g. "pci0000:17";
	// default "pci<domain>:00".
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is what the GPU's sysfs numa_node says: the NUMA node its
	// PCI device is attached to, or -1 for none. Omitted is -1, as on a VM
	// (measured on an H100 80GB HBM3 VM).
	NUMANode *int `json:"numaNode,omitempty"`
	// PCIeSwitch is the bus ID of the upstream port of the PCIe switch the
	// GPU sits under; omitted: the GPU sits on a root port of PCIeRoot.
	// GPUs under one switch are one PCIe hop apart (NVML's PIX).
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// MIGEnabled is the GPU's MIG mode at boot (MIG-capable models only).
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// VGPUGuest makes the GPU a vGPU in a virtual machine, as NVML's
	// virtualization mode says on one: its MIG mode is not the guest's to
	// change.
	VGPUGuest bool `json:"vgpuGuest,omitempty"`
}

// maxNUMANodes is Linux's largest MAX_NUMNODES (1 << 10).
const maxNUMANodes = 1024

var (
	busIDPattern    = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	pcieRootPattern = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)
	versionPattern  = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,2}$`)
)

// LoadMachine reads and validates a machine file. Unknown fields are errors.
func LoadMachine(path string) (*Machine, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read machine file: %w", err)
	}
	m, err := ParseMachine(data)
	if err != nil {
		return nil, fmt.Errorf("machine file %s: %w", path, err)
	}
	return m, nil
}

// ParseMachine decodes and validates a machine file's content.
func ParseMachine(data []byte) (*Machine, error) {
	var m Machine
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks the machine and fills defaults in place. Errors name the
// offending field, e.g. "gpus[3].model".
func (m *Machine) Validate() error {
	if m.Name == "" {
		return fmt.Errorf("name: required")
	}
	if !versionPattern.MatchString(m.DriverVersion) {
		return fmt.Errorf("driverVersion: %q is not a version like 580.159.04", m.DriverVersion)
	}
	if _, err := cudaVersionInt(m.CUDADriverVersion); err != nil {
		return fmt.Errorf("cudaDriverVersion: %w", err)
	}
	if len(m.GPUs) == 0 {
		return fmt.Errorf("gpus: at least one GPU is required")
	}
	seenBus := map[string]int{}
	seenUUID := map[string]int{}
	for i := range m.GPUs {
		g := &m.GPUs[i]
		field := fmt.Sprintf("gpus[%d]", i)
		cfg, ok := models[g.Model]
		if !ok {
			return fmt.Errorf("%s.model: unknown model %q (known: %s)", field, g.Model, strings.Join(Models(), ", "))
		}
		if g.MIGEnabled && !migCapable(cfg.Config) {
			return fmt.Errorf("%s.migEnabled: model %s does not support MIG", field, g.Model)
		}
		if g.PCIBusID == "" {
			g.PCIBusID = fmt.Sprintf("0000:%02x:00.0", i+1)
		}
		if !busIDPattern.MatchString(g.PCIBusID) {
			return fmt.Errorf("%s.pciBusID: %q is not a lower-case bus ID like 0000:18:00.0", field, g.PCIBusID)
		}
		if j, dup := seenBus[g.PCIBusID]; dup {
			return fmt.Errorf("%s.pciBusID: %s already used by gpus[%d]", field, g.PCIBusID, j)
		}
		seenBus[g.PCIBusID] = i
		if g.PCIeRoot == "" {
			g.PCIeRoot = "pci" + g.PCIBusID[:4] + ":00"
		}
		if !pcieRootPattern.MatchString(g.PCIeRoot) {
			return fmt.Errorf("%s.pcieRoot: %q is not a root complex like pci0000:00", field, g.PCIeRoot)
		}
		if g.NUMANode != nil && (*g.NUMANode < -1 || *g.NUMANode >= maxNUMANodes) {
			return fmt.Errorf("%s.numaNode: %d is not a NUMA node (0-%d) nor -1 (none)", field, *g.NUMANode, maxNUMANodes-1)
		}
		if g.UUID == "" {
			g.UUID = defaultUUID(m.Name, i)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") {
			return fmt.Errorf("%s.uuid: %q must start with GPU-", field, g.UUID)
		}
		if j, dup := seenUUID[g.UUID]; dup {
			return fmt.Errorf("%s.uuid: %s already used by gpus[%d]", field, g.UUID, j)
		}
		seenUUID[g.UUID] = i
	}
	for i, g := range m.GPUs {
		if g.PCIeSwitch == "" {
			continue
		}
		if !busIDPattern.MatchString(g.PCIeSwitch) {
			return fmt.Errorf("gpus[%d].pcieSwitch: %q is not a lower-case bus ID like 0000:18:00.0", i, g.PCIeSwitch)
		}
		if j, dup := seenBus[g.PCIeSwitch]; dup {
			return fmt.Errorf("gpus[%d].pcieSwitch: %s is gpus[%d]'s bus ID", i, g.PCIeSwitch, j)
		}
	}
	if err := m.validateNVLink(seenBus); err != nil {
		return err
	}
	if f := m.Fabric; f != nil {
		if _, err := uuid.Parse(f.ClusterUUID); err != nil || f.ClusterUUID == uuid.Nil.String() {
			return fmt.Errorf("fabric.clusterUUID: %q is not a non-zero UUID", f.ClusterUUID)
		}
		if m.NVLink == nil || len(m.NVLink.NVSwitches) == 0 {
			return fmt.Errorf("fabric: a multi-node NVLink fabric needs nvlink.nvswitches")
		}
	}
	return nil
}

// nvlinkVersions maps a machine file's NVLink version to NVML's enum.
var nvlinkVersions = map[string]nvml.NvlinkVersion{
	"2.0": nvml.NVLINK_VERSION_2_0, "3.0": nvml.NVLINK_VERSION_3_0,
	"4.0": nvml.NVLINK_VERSION_4_0, "5.0": nvml.NVLINK_VERSION_5_0,
}

func (m *Machine) validateNVLink(buses map[string]int) error {
	nl := m.NVLink
	if nl == nil {
		return nil
	}
	if _, ok := nvlinkVersions[nl.Version]; !ok {
		return fmt.Errorf("nvlink.version: %q is not one of 2.0, 3.0, 4.0, 5.0", nl.Version)
	}
	if nl.LinksPerGPU < 1 || nl.LinksPerGPU > nvml.NVLINK_MAX_LINKS {
		return fmt.Errorf("nvlink.linksPerGPU: %d is not 1-%d", nl.LinksPerGPU, nvml.NVLINK_MAX_LINKS)
	}
	if (len(nl.NVSwitches) == 0) == (len(nl.Bridges) == 0) {
		return fmt.Errorf("nvlink: give nvswitches or bridges, not both nor neither")
	}
	for k, sw := range nl.NVSwitches {
		if !busIDPattern.MatchString(sw) {
			return fmt.Errorf("nvlink.nvswitches[%d]: %q is not a lower-case bus ID like 0000:18:00.0", k, sw)
		}
		if j, dup := buses[sw]; dup {
			return fmt.Errorf("nvlink.nvswitches[%d]: %s is gpus[%d]'s bus ID", k, sw, j)
		}
	}
	in := map[int]int{}
	for k, b := range nl.Bridges {
		if len(b) < 2 {
			return fmt.Errorf("nvlink.bridges[%d]: a bridge joins at least two GPUs", k)
		}
		for _, i := range b {
			if i < 0 || i >= len(m.GPUs) {
				return fmt.Errorf("nvlink.bridges[%d]: no GPU %d", k, i)
			}
			if j, dup := in[i]; dup {
				return fmt.Errorf("nvlink.bridges[%d]: GPU %d is already in bridges[%d]", k, i, j)
			}
			in[i] = k
		}
	}
	return nil
}

// cudaVersionInt encodes "12.4" the way NVML does: 12040.
func cudaVersionInt(v string) (int, error) {
	major, minor, ok := strings.Cut(v, ".")
	if !ok {
		return 0, fmt.Errorf("%q is not major.minor", v)
	}
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || ma <= 0 || mi < 0 || mi > 99 {
		return 0, fmt.Errorf("%q is not major.minor", v)
	}
	return ma*1000 + mi*10, nil
}
