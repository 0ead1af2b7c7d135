package nvmlgpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// Sysfs is where discovery learns what the kernel knows of a GPU's PCI
// device and NVML does not say: its PCIe root complex and its NUMA node.
// These feed the standard attributes resource.kubernetes.io/pcieRoot and
// resource.kubernetes.io/numaNode, which other drivers publish from the
// same sysfs, so that a claim can align a GPU with their devices.
type Sysfs struct {
	// FS is rooted at sysfs's mount point (/sys on a host); NUMANode reads
	// bus/pci/devices/<bus ID>/numa_node in it.
	FS fs.FS
	// PCIeRoot resolves a bus ID "dddd:bb:dd.f" to its root complex
	// "pci0000:00".
	PCIeRoot func(busID string) (string, error)
	// PCIPath resolves a bus ID to the PCI device's path in sysfs's device
	// tree (/sys/devices/pci0000:17/0000:17:01.0/.../0000:1b:00.0): the
	// target of bus/pci/devices/<bus ID>. nil: unknown.
	PCIPath func(busID string) (string, error)
}

// HostSysfs is the host's /sys. The PCIe root comes from
// deviceattribute.GetPCIeRootAttributeByPCIBusID, which reads /sys itself
// (k8s.io/dynamic-resource-allocation v0.35 takes no other root; v0.37's
// helpers take deviceattribute.WithFS).
func HostSysfs() Sysfs {
	return Sysfs{FS: os.DirFS("/sys"), PCIeRoot: hostPCIeRoot, PCIPath: hostPCIPath}
}

// hostPCIPath resolves /sys/bus/pci/devices/<bus ID>, a symlink into
// /sys/devices.
func hostPCIPath(busID string) (string, error) {
	return filepath.EvalSymlinks(filepath.Join("/sys/bus/pci/devices", busID))
}

func hostPCIeRoot(busID string) (string, error) {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID)
	if err != nil {
		return "", err
	}
	if attr.Value.StringValue == nil {
		return "", fmt.Errorf("no PCIe root for %s", busID)
	}
	return *attr.Value.StringValue, nil
}

// maxNUMANodes bounds a NUMA node ID: Linux's MAX_NUMNODES is
// 1 << CONFIG_NODES_SHIFT, and CONFIG_NODES_SHIFT is at most 10 on every
// architecture (the same bound as k8s.io/dynamic-resource-allocation
// v0.37.2 deviceattribute/numa_linux.go).
const maxNUMANodes = 1024

// NUMANode returns the NUMA node of the PCI device busID ("dddd:bb:dd.f")
// from sysfs's numa_node, or -1 when the device has no NUMA affinity: the
// kernel writes -1 on a machine without NUMA information (a VM: measured
// on an H100 80GB HBM3 VM, where NVML's query is "Not Supported"), and a kernel
// without CONFIG_NUMA has no numa_node file. An unreadable or malformed
// file is an error naming it.
//
// This is the kernel's affinity, the value deviceattribute's
// GetNUMANodeAttributeByPCIBusID (v0.37) publishes. NVML's
// nvmlDeviceGetNumaNodeId is not: it answers only where the GPU's own
// memory is a NUMA node (Grace Hopper), and "Not Supported" on x86.
func (s Sysfs) NUMANode(busID string) (int, error) {
	if s.FS == nil {
		return -1, nil
	}
	file := path.Join("bus", "pci", "devices", busID, "numa_node")
	data, err := fs.ReadFile(s.FS, file)
	if errors.Is(err, fs.ErrNotExist) {
		if _, derr := fs.Stat(s.FS, path.Dir(file)); derr != nil {
			return -1, fmt.Errorf("PCI device %s is not in sysfs: %w", busID, derr)
		}
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("read sysfs %s: %w", file, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return -1, fmt.Errorf("sysfs %s: %q is not a NUMA node", file, strings.TrimSpace(string(data)))
	}
	if n >= maxNUMANodes {
		return -1, fmt.Errorf("sysfs %s: NUMA node %d is beyond the kernel's limit of %d", file, n, maxNUMANodes-1)
	}
	if n < 0 {
		return -1, nil
	}
	return n, nil
}
