package nvmlgpu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The NVIDIA driver's MIG capabilities, read from its proc files.
//
// A container that uses a MIG device opens the parent GPU's /dev/nvidia<N>
// and two capability device nodes, /dev/nvidia-caps/nvidia-cap<M>: one for
// the GPU instance (GI) and one for the compute instance (CI). The driver
// only numbers them; the host has a node for a capability only when
// something created it (nvidia-modprobe -f -c, nvidia-container-cli).
// nvcdi lists only nodes that exist under the dev root, so a MIG instance
// carved at prepare had none and could not be prepared on a real node.
//
// Like NVIDIA's DRA driver (internal/common/nvcaps.go, GetDevNodesForMigDevice
// in cmd/gpu-kubelet-plugin/cdi.go), Facet writes the two nodes into the
// CDI spec as character devices with their major and minor; the container
// runtime creates them inside the container and allows them in its device
// cgroup, and no node needs to exist on the host. The numbers come from:
//
//   - <proc>/devices, "Character devices:": the line "<major> nvidia-caps",
//     the major the nvidia-caps driver registered (dynamic, so read, never
//     assumed);
//   - <proc>/driver/nvidia/capabilities/gpu<G>/mig/gi<X>/access and
//     .../gi<X>/ci<Y>/access, which the driver creates with the instance:
//     "DeviceFileMinor: <M>", "DeviceFileMode: <decimal mode>" and
//     "DeviceFileModify: <0|1>" (NVIDIA's MIG user guide, "Device Nodes and
//     Capabilities");
//   - <proc>/driver/nvidia-caps/mig-minors, the whole table
//     ("gpu<G>/gi<X>/access <M>", "gpu<G>/gi<X>/ci<Y>/access <M>"), which
//     must agree with the access file.
//
// G is the parent GPU's device minor (NVML's GetMinorNumber), not its
// index; X and Y are NVML's GPU and compute instance IDs.

// DefaultProcRoot is where the driver's proc files are read: the proc file
// system, which shows /proc/driver/nvidia in a container too.
const DefaultProcRoot = "/proc"

// capsDriverName is the nvidia-caps character driver in /proc/devices.
const capsDriverName = "nvidia-caps"

// MIGCapDevice is one MIG capability device node as the driver numbers it.
type MIGCapDevice struct {
	// Path is the node in the container, /dev/nvidia-caps/nvidia-cap<Minor>.
	Path string
	// Major is nvidia-caps' character device major, from <proc>/devices.
	Major uint32
	// Minor is the capability's minor, from its access file.
	Minor uint32
	// Mode is the node's permission bits (DeviceFileMode; 0444 on a
	// default driver).
	Mode os.FileMode
	// Source is the access file it was read from, for errors and logs.
	Source string
}

// DeviceNode is the CDI device node for the capability: a character device
// the runtime creates in the container, with no host node behind it.
func (c MIGCapDevice) DeviceNode() *cdispec.DeviceNode {
	mode := c.Mode
	return &cdispec.DeviceNode{
		Path:     c.Path,
		Type:     "c",
		Major:    int64(c.Major),
		Minor:    int64(c.Minor),
		FileMode: &mode,
	}
}

// ReadMIGCapDevices returns the GI and CI capability device nodes of the
// MIG device that is compute instance ci of GPU instance gi on the GPU
// whose device minor is gpuMinor, from the driver's proc files under
// procRoot (DefaultProcRoot on a node; a simulated driver root's proc/).
//
// Errors name the file: <proc>/devices without nvidia-caps (no
// MIG-capable driver loaded), a missing access file (the driver has no
// such instance: it was destroyed, or the IDs are wrong), an access file
// without DeviceFileMinor, or one that disagrees with mig-minors.
func ReadMIGCapDevices(procRoot string, gpuMinor, gi, ci int) (giCap, ciCap MIGCapDevice, err error) {
	if procRoot == "" {
		procRoot = DefaultProcRoot
	}
	devices := filepath.Join(procRoot, "devices")
	major, found, err := readCharMajor(devices, capsDriverName)
	if err != nil {
		return giCap, ciCap, err
	}
	if !found {
		return giCap, ciCap, fmt.Errorf("%s lists no character device %s: no MIG-capable NVIDIA driver is loaded", devices, capsDriverName)
	}
	minors, err := readMIGMinors(filepath.Join(procRoot, "driver", "nvidia-caps", "mig-minors"))
	if err != nil {
		return giCap, ciCap, err
	}
	capsDir := filepath.Join(procRoot, "driver", "nvidia", "capabilities")
	giKey := fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi)
	ciKey := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci)
	// The access files live under mig/ in capabilities/, where mig-minors
	// names them without it.
	giCap, err = readCapAccess(filepath.Join(capsDir, fmt.Sprintf("gpu%d", gpuMinor), "mig", fmt.Sprintf("gi%d", gi), "access"), major, minors, giKey)
	if err != nil {
		return giCap, ciCap, err
	}
	ciCap, err = readCapAccess(filepath.Join(capsDir, fmt.Sprintf("gpu%d", gpuMinor), "mig", fmt.Sprintf("gi%d", gi), fmt.Sprintf("ci%d", ci), "access"), major, minors, ciKey)
	return giCap, ciCap, err
}

// readCapAccess parses one capability access file and checks its minor
// against mig-minors' entry key.
func readCapAccess(path string, major uint32, minors map[string]uint32, key string) (MIGCapDevice, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return MIGCapDevice{}, fmt.Errorf("MIG capability %s: %w", key, err)
	}
	c, err := parseCapAccess(data)
	if err != nil {
		return MIGCapDevice{}, fmt.Errorf("MIG capability %s: %s: %w", key, path, err)
	}
	if want, ok := minors[key]; !ok {
		return MIGCapDevice{}, fmt.Errorf("MIG capability %s: not in the driver's mig-minors table", key)
	} else if want != c.Minor {
		return MIGCapDevice{}, fmt.Errorf("MIG capability %s: %s says minor %d, mig-minors says %d", key, path, c.Minor, want)
	}
	c.Major, c.Source = major, path
	c.Path = fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", c.Minor)
	return c, nil
}

// parseCapAccess parses an access file's "Key: value" lines: the minor and
// mode (decimal, as the driver prints it: 292 is 0444). A file without a
// mode gets 0444, the driver's default.
func parseCapAccess(data []byte) (MIGCapDevice, error) {
	c := MIGCapDevice{Mode: 0o444}
	haveMinor := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "DeviceFileMinor":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return c, fmt.Errorf("DeviceFileMinor %q: %w", v, err)
			}
			c.Minor, haveMinor = uint32(n), true
		case "DeviceFileMode":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n > 0o777 {
				return c, fmt.Errorf("DeviceFileMode %q is not a permission mode in decimal", v)
			}
			c.Mode = os.FileMode(n)
		}
	}
	if err := sc.Err(); err != nil {
		return c, err
	}
	if !haveMinor {
		return c, fmt.Errorf("no DeviceFileMinor line")
	}
	return c, nil
}

// readMIGMinors parses the driver's mig-minors table: "<capability> <minor>"
// a line.
func readMIGMinors(path string) (map[string]uint32, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the driver's MIG capability table: %w", err)
	}
	minors := map[string]uint32{}
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("%s line %d: %q is not \"<capability> <minor>\"", path, i+1, line)
		}
		n, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: minor %q: %w", path, i+1, f[1], err)
		}
		minors[f[0]] = uint32(n)
	}
	return minors, nil
}

// readCharMajor returns the major of the character driver name from a
// /proc/devices file, matching the name exactly (nvidia-caps is not
// nvidia-caps-imex-channels); found is false where the file lists no such
// driver. Errors: the file cannot be read, or the major is not a number.
func readCharMajor(path, name string) (major uint32, found bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false, fmt.Errorf("the %s device major: %w", name, err)
	}
	inChar := false
	for _, line := range strings.Split(string(data), "\n") {
		switch strings.TrimSpace(line) {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		f := strings.Fields(line)
		if !inChar || len(f) != 2 || f[1] != name {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return 0, false, fmt.Errorf("%s: major %q of %s: %w", path, f[0], name, err)
		}
		return uint32(n), true, nil
	}
	return 0, false, nil
}
