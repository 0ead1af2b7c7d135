package nvmlgpu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The NVIDIA driver's IMEX channels, read from its proc files.
//
// A process imports another node's GPU memory over a multi-node NVLink
// fabric (GB200 NVL72) only through an IMEX channel: the character device
// /dev/nvidia-caps-imex-channels/channel<N>, which processes of one IMEX
// domain that hold the same channel share. The driver (nv-caps-imex.c in
// NVIDIA's open kernel modules) registers one character driver,
// nvidia-caps-imex-channels, with NVreg_ImexChannelCount minors starting
// at 0, so channel N is minor N; its major is dynamic, read from
// <proc>/devices, never assumed. It creates no device node (only
// channel0, with NVreg_CreateImexChannel0=1): like the MIG capability
// nodes (nvcaps.go), Facet writes a claim's channel into its CDI spec as
// a character device with the driver's numbers, and the container runtime
// creates it in the container. NVIDIA's DRA driver does the same
// (cmd/compute-domain-kubelet-plugin/nvlib.go,
// getNVCapIMEXChannelDeviceInfo), with mode 0666.
//
// NVreg_ImexChannelCount is in <proc>/driver/nvidia/params as the line
// "ImexChannelCount: <n>" (drivers from R550). 0 disables the channels:
// the driver then registers no major. The default is 2048.

// IMEXChannelsDriverName is the IMEX channels' character driver in
// /proc/devices.
const IMEXChannelsDriverName = "nvidia-caps-imex-channels"

// IMEXChannelDir is where the channels' device nodes are in a container.
const IMEXChannelDir = "/dev/nvidia-caps-imex-channels"

// DefaultIMEXChannelCount is the driver's default NVreg_ImexChannelCount
// (nv-reg.h), taken where <proc>/driver/nvidia/params has no
// ImexChannelCount line (drivers before it was listed there).
const DefaultIMEXChannelCount = 2048

// imexChannelMode is the mode of a channel's node in a container: any user
// of the container may open it, as NVIDIA's DRA driver gives it.
const imexChannelMode os.FileMode = 0o666

// IMEXChannels is the node's IMEX channel driver as its proc files
// describe it.
type IMEXChannels struct {
	// Major is nvidia-caps-imex-channels' character device major.
	Major uint32
	// Count is how many channels the driver offers, minors 0 to Count-1
	// (NVreg_ImexChannelCount).
	Count int
	// CountFrom says where Count came from: the params file, or
	// "driver default" where the file has no ImexChannelCount line.
	CountFrom string
	// Source is the /proc/devices file the major was read from.
	Source string
}

// ReadIMEXChannels reads the IMEX channel driver from the proc files under
// procRoot (DefaultProcRoot on a node; a simulated driver root's proc/):
// the nvidia-caps-imex-channels major from <proc>/devices, and the channel
// count from <proc>/driver/nvidia/params (DefaultIMEXChannelCount where the
// file has no ImexChannelCount line).
//
// It returns nil and no error where <proc>/devices lists no such driver
// (no NVIDIA driver, one before R550, or NVreg_ImexChannelCount=0).
// Errors name the file: <proc>/devices or the params file cannot be read,
// a major or count that is not a number, or a count of 0 beside a
// registered major (the driver registers none then).
func ReadIMEXChannels(procRoot string) (*IMEXChannels, error) {
	if procRoot == "" {
		procRoot = DefaultProcRoot
	}
	devices := filepath.Join(procRoot, "devices")
	major, found, err := readCharMajor(devices, IMEXChannelsDriverName)
	if err != nil || !found {
		return nil, err
	}
	params := filepath.Join(procRoot, "driver", "nvidia", "params")
	data, err := os.ReadFile(params)
	if err != nil {
		return nil, fmt.Errorf("IMEX channel count: %w", err)
	}
	count, ok, err := parseParam(data, "ImexChannelCount")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", params, err)
	}
	c := &IMEXChannels{Major: major, Count: count, CountFrom: params, Source: devices}
	if !ok {
		c.Count, c.CountFrom = DefaultIMEXChannelCount, "driver default"
	}
	if c.Count < 1 {
		return nil, fmt.Errorf("%s: ImexChannelCount is %d, but %s lists %s at major %d: the driver registers the major only with channels", params, c.Count, devices, IMEXChannelsDriverName, major)
	}
	return c, nil
}

// parseParam finds "<key>: <decimal>" in the driver's params file.
func parseParam(data []byte, key string) (int, bool, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil {
			return 0, false, fmt.Errorf("%s %q is not a number", key, strings.TrimSpace(v))
		}
		return int(n), true, nil
	}
	return 0, false, sc.Err()
}

// ChannelPath is channel n's device node in a container,
// /dev/nvidia-caps-imex-channels/channel<n>.
func ChannelPath(n int) string { return fmt.Sprintf("%s/channel%d", IMEXChannelDir, n) }

// DeviceNode is the CDI device node of channel n: a character device with
// the driver's major and minor n, mode 0666, which the runtime creates in
// the container (no host node behind it). A channel outside 0 to Count-1
// is an error.
func (c IMEXChannels) DeviceNode(n int) (*cdispec.DeviceNode, error) {
	if n < 0 || n >= c.Count {
		return nil, fmt.Errorf("IMEX channel %d: the driver offers channels 0-%d", n, c.Count-1)
	}
	mode := imexChannelMode
	return &cdispec.DeviceNode{
		Path:     ChannelPath(n),
		Type:     "c",
		Major:    int64(c.Major),
		Minor:    int64(n),
		FileMode: &mode,
	}, nil
}

// ChannelNode is an IMEX channel's device node as a host has it.
type ChannelNode struct {
	// Path is the node's path, under the dev root.
	Path string
	// Channel is the channel its name says, channel<N>; -1 for a name
	// that says none.
	Channel int
	// Major and Minor are the node's device numbers (0 for a file that is
	// no character device).
	Major, Minor uint32
	// Problem says what is wrong with the node against the driver's
	// numbers; empty when nothing is.
	Problem string
}

// CheckIMEXChannelNodes lists the channel device nodes under
// <devRoot>/dev/nvidia-caps-imex-channels and checks each against c: a
// character device of c's major whose minor is the channel its name gives,
// below c.Count. It only reads (stat, no open): a check of Facet's reader
// on a real node. A host without the directory has no nodes, which is
// usual: the driver creates only channel0 (NVreg_CreateImexChannel0=1),
// and Facet's CDI specs have the container runtime create the node in the
// container. Errors: the directory cannot be read.
func CheckIMEXChannelNodes(devRoot string, c *IMEXChannels) ([]ChannelNode, error) {
	dir := filepath.Join(devRoot, IMEXChannelDir)
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("IMEX channel nodes: %w", err)
	}
	var out []ChannelNode
	for _, e := range entries {
		n := ChannelNode{Path: filepath.Join(dir, e.Name()), Channel: -1}
		if s, ok := strings.CutPrefix(e.Name(), "channel"); ok {
			if v, err := strconv.Atoi(s); err == nil && v >= 0 && strconv.Itoa(v) == s {
				n.Channel = v
			}
		}
		var st unix.Stat_t
		switch err := unix.Lstat(n.Path, &st); {
		case err != nil:
			n.Problem = err.Error()
		case st.Mode&unix.S_IFMT != unix.S_IFCHR:
			n.Problem = "not a character device"
		default:
			n.Major, n.Minor = unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
			switch {
			case n.Channel < 0:
				n.Problem = "its name is not channel<N>"
			case n.Major != c.Major:
				n.Problem = fmt.Sprintf("major %d, but %s is %d", n.Major, IMEXChannelsDriverName, c.Major)
			case n.Minor != uint32(n.Channel):
				n.Problem = fmt.Sprintf("minor %d, but channel %d is minor %d", n.Minor, n.Channel, n.Channel)
			case n.Channel >= c.Count:
				n.Problem = fmt.Sprintf("the driver offers channels 0-%d", c.Count-1)
			}
		}
		out = append(out, n)
	}
	return out, nil
}
