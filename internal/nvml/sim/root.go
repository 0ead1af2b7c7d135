package sim

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/node/mps"
)

// Every simulated device node is a character device with the numbers of
// /dev/null (1:3). A container must be able to open the nodes that the CDI
// spec gives it, and runc stats them for their numbers and allows them in
// the device cgroup, so they must be real, openable character devices.
// /dev/null is the harmless choice: reads return EOF at once, writes are
// discarded, ioctls fail with ENOTTY, and 1:3 is already in runc's default
// device allow-list. /dev/zero (1:5) would make a naive `cat /dev/nvidia0`
// in a demo container run forever.
//
// The MIG capability nodes are the exception: the plugin writes them into
// the CDI spec as character devices with the driver's major and minors
// (nvml.ReadMIGCapDevices), the runtime creates them in the container, and
// the simulated driver root has none (as a real host has none for an
// instance carved a moment before). Their simulated major, in the
// simulated proc/devices, is simCapsMajor.
const (
	simDeviceMajor = 1
	simDeviceMinor = 3
	// simCapsMajor is 63, a major that Linux's devices.txt reserves for
	// local and experimental use and never hands out: the nodes the
	// runtime creates with it open to ENXIO, where a major of a real
	// driver (1, mem, has /dev/mem and /dev/port among its minors) would
	// give a test container a real device.
	simCapsMajor = 63
	// simIMEXChannelMajor is the simulated nvidia-caps-imex-channels
	// major, 62, reserved for local and experimental use as 63 is: an
	// IMEX channel the runtime creates in a test container opens to
	// ENXIO. The plugin writes channels into CDI specs with it
	// (nvmlgpu.ReadIMEXChannels), as the MIG capability nodes.
	simIMEXChannelMajor = 62
	// simIMEXChannelCount is the simulated NVreg_ImexChannelCount, the
	// driver's default, in the simulated proc/driver/nvidia/params.
	simIMEXChannelCount = 2048
)

// SimulatedIMEXChannels returns the IMEX channel driver that
// LayoutDriverRoot's proc files describe: its major and channel count.
func SimulatedIMEXChannels() (major uint32, count int) {
	return simIMEXChannelMajor, simIMEXChannelCount
}

// SimulatedDeviceNumbers returns the major and minor numbers of every device
// node LayoutDriverRoot creates.
func SimulatedDeviceNumbers() (major, minor uint32) {
	return simDeviceMajor, simDeviceMinor
}

// MIG capability minors, as the NVIDIA driver numbers them in
// /proc/driver/nvidia-caps/mig-minors: "config" is 1, "monitor" is 2, then
// for each of 32 GPUs (by minor number) and each of 15 GPU instances, the
// GI's access capability followed by its 8 compute instances'.
const (
	migMaxGPUs          = 32
	migMaxGPUInstances  = 15
	migMaxComputeInsts  = 8
	migMinorsPerGI      = 1 + migMaxComputeInsts
	migMinorsPerGPU     = migMaxGPUInstances * migMinorsPerGI
	migFirstGPUCapMinor = 3
)

// MIGCapMinors returns the nvidia-caps minor numbers of the access
// capabilities of GPU instance gi and of its compute instance ci on the GPU
// whose device minor is gpuMinor, as the driver lists them in
// /proc/driver/nvidia-caps/mig-minors. The device nodes are
// /dev/nvidia-caps/nvidia-cap<minor>. IDs outside what the driver supports
// (GPU minor 0-31, GI 0-14, CI 0-7) are an error.
func MIGCapMinors(gpuMinor, gi, ci int) (giMinor, ciMinor int, err error) {
	if gpuMinor < 0 || gpuMinor >= migMaxGPUs || gi < 0 || gi >= migMaxGPUInstances || ci < 0 || ci >= migMaxComputeInsts {
		return 0, 0, fmt.Errorf("MIG capability gpu%d/gi%d/ci%d is out of the driver's range (gpu 0-%d, gi 0-%d, ci 0-%d)",
			gpuMinor, gi, ci, migMaxGPUs-1, migMaxGPUInstances-1, migMaxComputeInsts-1)
	}
	giMinor = migFirstGPUCapMinor + gpuMinor*migMinorsPerGPU + gi*migMinorsPerGI
	return giMinor, giMinor + 1 + ci, nil
}

// migMinorsFile returns the contents of /proc/driver/nvidia-caps/mig-minors
// as the driver writes it: every GPU slot, whether a GPU is there or not.
func migMinorsFile() []byte {
	var b bytes.Buffer
	b.WriteString("config 1\nmonitor 2\n")
	for g := 0; g < migMaxGPUs; g++ {
		for gi := 0; gi < migMaxGPUInstances; gi++ {
			giMinor, _, _ := MIGCapMinors(g, gi, 0)
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, giMinor)
			for ci := 0; ci < migMaxComputeInsts; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, giMinor+1+ci)
			}
		}
	}
	return b.Bytes()
}

// procDevicesFile returns the simulated /proc/devices: the character drivers
// a node with the NVIDIA driver lists, as a real H200 with driver 580.159.04
// listed them (docs/measurements/2026-11-27-h200-h100-mps.log is its run; the
// lines were read on 2026-11-27), nvidia-caps at simCapsMajor and, next to
// it, nvidia-caps-imex-channels at simIMEXChannelMajor, which the driver
// registers on every node, IMEX or not (the H200 listed it). The
// channels' line comes first, as the kernel lists majors in order: a
// reader that took a name's prefix for nvidia-caps would read the
// channels' major.
func procDevicesFile() []byte {
	return fmt.Appendf(nil, `Character devices:
  1 mem
  4 tty
  5 /dev/tty
%3d %s
%3d %s
195 nvidia
195 nvidiactl
238 nvidia-uvm
239 nvidia-nvswitch
240 nvidia-nvlink

Block devices:
  7 loop
  8 sd
`, simIMEXChannelMajor, "nvidia-caps-imex-channels", simCapsMajor, "nvidia-caps")
}

// procParamsFile returns the simulated /proc/driver/nvidia/params: the
// driver's module parameters, "Key: value" a line, of which Facet reads
// ImexChannelCount (nvmlgpu.ReadIMEXChannels). The other lines are a
// default driver's, so a reader that matched a key loosely would meet them.
func procParamsFile() []byte {
	return fmt.Appendf(nil, `ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
EnableMSI: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
RegisterPCIDriver: 1
EnableGpuFirmware: 18
ImexChannelCount: %d
CreateImexChannel0: 0
RegistryDwords: ""
TemporaryFilePath: "/var/tmp"
`, simIMEXChannelCount)
}

// capAccessFiles returns the access files of /proc/driver/nvidia/capabilities,
// by path below it, as the driver writes them: mig/config and mig/monitor,
// and gpu<G>/mig/gi<X>/access and gpu<G>/mig/gi<X>/ci<Y>/access with the
// minors of MIGCapMinors. The driver creates a GPU or compute instance's
// files with the instance; the simulation writes them for every instance
// ID of the listed GPUs, so a reader cannot tell from them alone whether an
// instance exists (NVML can).
func capAccessFiles(gpuMinors []int) map[string][]byte {
	access := func(minor, mode int) []byte {
		return fmt.Appendf(nil, "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
	}
	// As a real H200's driver wrote them: config 256 (0400, root only),
	// monitor 292 (0444). Its instances' files were not there to read (MIG
	// off); 292 is the driver's default DeviceFileMode.
	files := map[string][]byte{
		"mig/config":  access(1, 256),
		"mig/monitor": access(2, 292),
	}
	for _, g := range gpuMinors {
		for gi := 0; gi < migMaxGPUInstances; gi++ {
			giMinor, _, _ := MIGCapMinors(g, gi, 0)
			files[fmt.Sprintf("gpu%d/mig/gi%d/access", g, gi)] = access(giMinor, 292)
			for ci := 0; ci < migMaxComputeInsts; ci++ {
				files[fmt.Sprintf("gpu%d/mig/gi%d/ci%d/access", g, gi, ci)] = access(giMinor+1+ci, 292)
			}
		}
	}
	return files
}

// simLibrary is one driver library of the simulated root: the file is
// <name>.so.<driver version>; its SONAME and the symlinks the driver
// installer and ldconfig leave next to it are those of a real driver.
type simLibrary struct {
	name string
	// soname is the SONAME; "" means <name>.so.<version> itself.
	soname string
	// devLink adds the <name>.so -> SONAME symlink.
	devLink bool
}

// simLibraries are the compute and utility libraries of a data-center
// driver, the ones a CUDA container uses (nvidia-container-cli's "compute"
// and "utility" capabilities). Graphics, video and display libraries are
// left out: nvcdi mounts every *.so.<version> it finds, so the list is
// simply what the simulated node offers.
var simLibraries = []simLibrary{
	{name: "libcuda", soname: "libcuda.so.1", devLink: true},
	{name: "libcudadebugger", soname: "libcudadebugger.so.1"},
	{name: "libnvidia-allocator", soname: "libnvidia-allocator.so.1", devLink: true},
	{name: "libnvidia-cfg", soname: "libnvidia-cfg.so.1", devLink: true},
	{name: "libnvidia-gpucomp"},
	{name: "libnvidia-ml", soname: "libnvidia-ml.so.1", devLink: true},
	{name: "libnvidia-nvvm", soname: "libnvidia-nvvm.so.4", devLink: true},
	{name: "libnvidia-opencl", soname: "libnvidia-opencl.so.1"},
	{name: "libnvidia-ptxjitcompiler", soname: "libnvidia-ptxjitcompiler.so.1", devLink: true},
}

// simBinaries are the driver's executables that nvcdi looks for.
var simBinaries = []string{
	"nvidia-smi",
	"nvidia-debugdump",
	"nvidia-persistenced",
	"nvidia-cuda-mps-control",
	"nvidia-cuda-mps-server",
}

// simFirmware are the GSP firmware images of the driver version's directory.
var simFirmware = []string{"gsp_ga10x.bin", "gsp_tu10x.bin"}

// libraryTriplet returns the Debian multiarch directory and the ELF machine
// of this architecture.
func libraryTriplet() (string, elf.Machine, error) {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu", elf.EM_X86_64, nil
	case "arm64":
		return "aarch64-linux-gnu", elf.EM_AARCH64, nil
	}
	return "", 0, fmt.Errorf("no simulated NVIDIA driver for GOARCH %s", runtime.GOARCH)
}

// SimulatedLibraryDir returns the directory, relative to a simulated driver
// root, that holds the driver libraries ("usr/lib/x86_64-linux-gnu" on
// amd64). It is where nvcdi finds libcuda.so and the directory it names in
// NVIDIA_CTK_LIBCUDA_DIR.
func SimulatedLibraryDir() string {
	triplet, _, err := libraryTriplet()
	if err != nil {
		return ""
	}
	return filepath.Join("usr", "lib", triplet)
}

// LayoutDriverRoot lays out a simulated NVIDIA driver root at root (created
// if missing): a directory laid out like the part of a GPU node's
// filesystem that the NVIDIA driver installs, so that nvcdi (see
// DriverEditor, with DriverEditorOptions.DriverRoot = root) discovers it exactly
// as it discovers a real driver, and containerd and runc can apply the
// resulting CDI spec to a real container:
//
//	usr/lib/<triplet>/<lib>.so.<ver>       tiny ELF shared objects carrying the
//	                                       driver's SONAMEs, for libcuda,
//	                                       libnvidia-ml, ... (see simLibraries)
//	usr/lib/<triplet>/<SONAME>, <lib>.so   the symlinks ldconfig and the
//	                                       installer leave
//	usr/bin/nvidia-smi, ...                shell scripts that say they are simulated;
//	                                       nvidia-cuda-mps-control is a working
//	                                       stand-in (package mps/mpssim)
//	bin/sh, bin/busybox, the loader,       what the stand-in needs to run chrooted
//	usr/lib/<triplet>/libc.so.6, tmp,      into the root, with a libc that the
//	dev/shm, dev/null                      caller's loader cannot load
//	                                       (mpssim.WriteRoot)
//	lib/firmware/nvidia/<ver>/gsp_*.bin    placeholder GSP firmware
//	dev/nvidiactl, dev/nvidia-uvm, dev/nvidia-uvm-tools, dev/nvidia<minor>
//	dev/nvidia-caps/nvidia-cap1, -cap2     character devices 1:3 (like /dev/null):
//	                                       config and monitor; no node for any GPU
//	                                       or compute instance (see simCapsMajor)
//	proc/driver/nvidia-caps/mig-minors     the driver's MIG capability table
//	                                       (see BindSimulatedProcDriver)
//	proc/driver/nvidia/capabilities/...    the capabilities' access files
//	                                       (capAccessFiles)
//	proc/devices                           the character device majors,
//	                                       nvidia-caps at simCapsMajor,
//	                                       nvidia-caps-imex-channels at
//	                                       simIMEXChannelMajor
//	proc/driver/nvidia/params              the driver's parameters, with
//	                                       ImexChannelCount
//
// A process reads the proc files under <root>/proc
// (nvml.DriverEditorOptions.ProcRoot); nvcdi, which reads mig-minors at a
// fixed path, sees them through BindSimulatedProcDriver.
//
// <triplet> is x86_64-linux-gnu or aarch64-linux-gnu, after runtime.GOARCH.
// No etc/ld.so.cache is needed: nvcdi searches the standard library
// directories under the root before it consults the root's ldcache.
//
// driverVersion must be the version the NVML library reports (e.g.
// "580.159.04"): nvcdi takes the version from NVML and then looks for
// libcuda.so.<version>. gpuMinors are the GPUs' device minor numbers (NVML
// GetMinorNumber): GPU minor m gets /dev/nvidia<m> and the access files of
// all its possible MIG instances (MIGCapMinors).
//
// It is idempotent: files, symlinks and device nodes that are already right
// are left alone, wrong ones are replaced, driver libraries of another
// version and instance capability nodes of earlier layouts are removed
// (device nodes of GPUs no longer listed are not).
// Device nodes need mknod, so the caller must run as root (CAP_MKNOD); when
// it may not, the error wraps EPERM (errors.Is(err, os.ErrPermission)).
// The MPS stand-in's shell and commands are copied from this system, which
// needs dash (or a dynamically linked /bin/sh) and busybox-static.
func LayoutDriverRoot(root string, driverVersion string, gpuMinors []int) error {
	machine, err := checkLayout(root, driverVersion, gpuMinors)
	if err != nil {
		return err
	}
	triplet, _, _ := libraryTriplet()
	l := &layout{root: root}
	if err := l.driver(filepath.Join("usr", "lib", triplet), filepath.Join("usr", "bin"), driverVersion, machine); err != nil {
		return err
	}
	// The MPS control daemon runs, chrooted into the root, as the real
	// one runs chrooted into the host's driver root: its stand-in comes
	// with a shell, a loader and a libc of the root's own.
	if err := mpssim.WriteRoot(root); err != nil {
		return err
	}

	// Firmware.
	for _, fw := range simFirmware {
		content := fmt.Appendf(nil, "simulated NVIDIA GSP firmware %s for driver %s (Facet)\n", fw, driverVersion)
		if err := l.file(filepath.Join("lib", "firmware", "nvidia", driverVersion, fw), content, 0o644); err != nil {
			return err
		}
	}
	if err := l.procFiles(gpuMinors); err != nil {
		return err
	}
	return l.devices(gpuMinors)
}

// LayoutPrefixDriverRoot lays out under hostRoot a simulated host whose
// NVIDIA driver is installed under a prefix of its own, as GKE installs it
// at /home/kubernetes/bin/nvidia and a runfile install at /usr/local/nvidia
// (mpssim.Prefixes; docs/driver-roots.md): the driver root is
// <hostRoot>/<prefix>, the plugin's --driver-root, and its device nodes
// are in the host's /dev, the plugin's --dev-root hostRoot.
//
//	<prefix>/lib64/<lib>.so.<ver>, links   the driver libraries, as in
//	                                       LayoutDriverRoot
//	<prefix>/bin/nvidia-smi, ...           the driver's programs;
//	<prefix>/bin/nvidia-cuda-mps-control   the MPS stand-in (mpssim.WritePrefix)
//	<prefix>/proc/...                      the simulated node's proc files,
//	                                       where a simulated plugin reads them
//	                                       (in its driver root)
//	bin/sh, bin/busybox, the loader,       the host's own root, whose loader
//	usr/lib/<triplet>/libc.so.6, tmp,      and libc run the prefix's programs
//	dev/shm, dev/null                      (chrooted into it, mps.Locate)
//	dev/nvidiactl, dev/nvidia<minor>, ...  the device nodes, as in
//	                                       LayoutDriverRoot
//
// The prefix has no loader, libc, tmp or dev/shm, and no firmware (nvcdi
// finds none there, as on a node whose firmware is elsewhere). prefix
// must be absolute and not /. It is idempotent, and needs what
// LayoutDriverRoot needs (root for mknod; dash and busybox-static).
func LayoutPrefixDriverRoot(hostRoot, prefix, driverVersion string, gpuMinors []int) error {
	machine, err := checkLayout(hostRoot, driverVersion, gpuMinors)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(prefix) || filepath.Clean(prefix) == "/" {
		return fmt.Errorf("simulated host root %s: driver prefix %q must be an absolute path other than /", hostRoot, prefix)
	}
	l := &layout{root: filepath.Join(hostRoot, prefix)}
	if err := l.driver(mpssim.PrefixLibDir, filepath.Dir(mpssim.PrefixControlRel), driverVersion, machine); err != nil {
		return err
	}
	if err := mpssim.WritePrefix(hostRoot, prefix); err != nil {
		return err
	}
	if err := l.procFiles(gpuMinors); err != nil {
		return err
	}
	return (&layout{root: hostRoot}).devices(gpuMinors)
}

// checkLayout checks a layout's arguments and returns the ELF machine of
// its libraries.
func checkLayout(root, driverVersion string, gpuMinors []int) (elf.Machine, error) {
	if root == "" || !filepath.IsAbs(root) {
		return 0, fmt.Errorf("simulated driver root %q: must be an absolute path", root)
	}
	if driverVersion == "" || strings.ContainsAny(driverVersion, "/*?[ ") || !strings.Contains(driverVersion, ".") {
		return 0, fmt.Errorf("simulated driver root %s: invalid driver version %q", root, driverVersion)
	}
	seen := map[int]bool{}
	for _, m := range gpuMinors {
		if m < 0 || m >= migMaxGPUs {
			return 0, fmt.Errorf("simulated driver root %s: GPU minor %d out of range 0-%d", root, m, migMaxGPUs-1)
		}
		if seen[m] {
			return 0, fmt.Errorf("simulated driver root %s: GPU minor %d listed twice", root, m)
		}
		seen[m] = true
	}
	_, machine, err := libraryTriplet()
	return machine, err
}

// driver writes the driver's libraries into libDir and its programs but
// the MPS control program (the caller's, from mpssim) into binDir, both
// relative to l.root.
func (l *layout) driver(libDir, binDir, driverVersion string, machine elf.Machine) error {
	if err := l.removeOtherVersions(libDir, driverVersion); err != nil {
		return err
	}
	for _, lib := range simLibraries {
		file := lib.name + ".so." + driverVersion
		soname := lib.soname
		if soname == "" {
			soname = file
		}
		data, err := stubSharedObject(machine, soname)
		if err != nil {
			return fmt.Errorf("simulated driver root %s: %s: %w", l.root, file, err)
		}
		if err := l.file(filepath.Join(libDir, file), data, 0o755); err != nil {
			return err
		}
		if soname != file {
			if err := l.symlink(filepath.Join(libDir, soname), file); err != nil {
				return err
			}
		}
		if lib.devLink {
			if err := l.symlink(filepath.Join(libDir, lib.name+".so"), soname); err != nil {
				return err
			}
		}
	}
	for _, bin := range simBinaries {
		if bin == mps.ControlName {
			continue
		}
		if err := l.file(filepath.Join(binDir, bin), simBinary(bin, driverVersion), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// procFiles writes the driver's proc files below l.root/proc: the MIG
// capability table (also read by nvcdi at the fixed host path
// /proc/driver/nvidia-caps/mig-minors, see BindSimulatedProcDriver), the
// capabilities' access files, and the character device majors
// (nvml.ReadMIGCapDevices reads all three), and the driver's parameters
// (nvmlgpu.ReadIMEXChannels reads them with the majors).
func (l *layout) procFiles(gpuMinors []int) error {
	if err := l.file(filepath.Join("proc", "driver", "nvidia-caps", "mig-minors"), migMinorsFile(), 0o444); err != nil {
		return err
	}
	if err := l.file(filepath.Join("proc", "devices"), procDevicesFile(), 0o444); err != nil {
		return err
	}
	if err := l.file(filepath.Join("proc", "driver", "nvidia", "params"), procParamsFile(), 0o444); err != nil {
		return err
	}
	for rel, data := range capAccessFiles(gpuMinors) {
		if err := l.file(filepath.Join("proc", "driver", "nvidia", "capabilities", rel), data, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// devices makes the device nodes below l.root/dev, with the modes the
// driver gives them.
func (l *layout) devices(gpuMinors []int) error {
	// No node for a GPU or compute instance's capability (nvidia-cap3 and
	// up): a host has one only where something created it, never for an
	// instance carved at prepare. Nodes an earlier layout made are removed.
	stale, _ := filepath.Glob(l.abs("dev/nvidia-caps/nvidia-cap*"))
	for _, p := range stale {
		if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "nvidia-cap")); err == nil && n >= migFirstGPUCapMinor {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("simulated driver root %s: %w", l.root, err)
			}
		}
	}
	nodes := []struct {
		path string
		mode uint32
	}{
		{"dev/nvidiactl", 0o666},
		{"dev/nvidia-uvm", 0o666},
		{"dev/nvidia-uvm-tools", 0o666},
		{"dev/nvidia-caps/nvidia-cap1", 0o400}, // config
		{"dev/nvidia-caps/nvidia-cap2", 0o444}, // monitor
	}
	for _, m := range gpuMinors {
		nodes = append(nodes, struct {
			path string
			mode uint32
		}{fmt.Sprintf("dev/nvidia%d", m), 0o666})
	}
	for _, n := range nodes {
		if err := l.charDevice(n.path, n.mode); err != nil {
			return err
		}
	}
	return nil
}

// simBinary returns the shell script standing in for a driver executable.
func simBinary(name, driverVersion string) []byte {
	if name == "nvidia-smi" {
		return fmt.Appendf(nil, `#!/bin/sh
# Simulated by Facet: this is not NVIDIA's nvidia-smi. It reports the
# simulated driver and the NVIDIA device nodes present in this container.
echo "NVIDIA-SMI (simulated by Facet)    Driver Version: %s"
for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && echo "GPU device node: $d"; done
for d in /dev/nvidia-caps/nvidia-cap*; do [ -e "$d" ] && echo "MIG capability node: $d"; done
exit 0
`, driverVersion)
	}
	return fmt.Appendf(nil, `#!/bin/sh
echo "%s: simulated NVIDIA driver %s (Facet); this program does nothing" >&2
exit 0
`, name, driverVersion)
}

// layout writes below a root, converging on the wanted state.
type layout struct {
	root string
}

func (l *layout) abs(rel string) string { return filepath.Join(l.root, rel) }

func (l *layout) mkdirFor(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("simulated driver root %s: %w", l.root, err)
	}
	return nil
}

// file writes data with mode unless the regular file already has both.
func (l *layout) file(rel string, data []byte, mode os.FileMode) error {
	path := l.abs(rel)
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == mode {
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	if err := l.mkdirFor(path); err != nil {
		return err
	}
	if err := atomicfile.WriteWith(filepath.Dir(path), filepath.Base(path), data, atomicfile.Options{TempPattern: "." + filepath.Base(path) + ".facet-tmp*", Perm: mode, NoSync: true}); err != nil {
		return fmt.Errorf("simulated driver root %s: %w", l.root, err)
	}
	return nil
}

// symlink makes rel a symlink to target unless it already is one.
func (l *layout) symlink(rel, target string) error {
	path := l.abs(rel)
	if old, err := os.Readlink(path); err == nil && old == target {
		return nil
	}
	if err := l.mkdirFor(path); err != nil {
		return err
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("simulated driver root %s: %w", l.root, err)
	}
	if err := os.Symlink(target, path); err != nil {
		return fmt.Errorf("simulated driver root %s: %w", l.root, err)
	}
	return nil
}

// charDevice makes rel a character device 1:3 with mode unless it already
// is one.
func (l *layout) charDevice(rel string, mode uint32) error {
	path := l.abs(rel)
	want := unix.Mkdev(simDeviceMajor, simDeviceMinor)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && uint64(st.Rdev) == want {
			if st.Mode&0o7777 == mode {
				return nil
			}
			if err := os.Chmod(path, os.FileMode(mode)); err != nil {
				return fmt.Errorf("simulated driver root %s: %w", l.root, err)
			}
			return nil
		}
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("simulated driver root %s: %w", l.root, err)
		}
	}
	if err := l.mkdirFor(path); err != nil {
		return err
	}
	if err := unix.Mknod(path, unix.S_IFCHR|mode, int(want)); err != nil {
		return fmt.Errorf("simulated driver root %s: mknod %s c %d %d: %w", l.root, path, simDeviceMajor, simDeviceMinor, err)
	}
	// mknod's mode is subject to umask.
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		return fmt.Errorf("simulated driver root %s: %w", l.root, err)
	}
	return nil
}

// removeOtherVersions deletes simulated libraries (and their dangling
// links) left from another driver version, so that nvcdi, which mounts every
// *.so.<version> of the NVML-reported version, and a human looking at the
// directory see one driver.
func (l *layout) removeOtherVersions(libDir, driverVersion string) error {
	dir := l.abs(libDir)
	for _, lib := range simLibraries {
		matches, err := filepath.Glob(filepath.Join(dir, lib.name+".so.*"))
		if err != nil {
			return fmt.Errorf("simulated driver root %s: %w", l.root, err)
		}
		for _, m := range matches {
			fi, err := os.Lstat(m)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			if filepath.Base(m) == lib.name+".so."+driverVersion {
				continue
			}
			if err := os.Remove(m); err != nil {
				return fmt.Errorf("simulated driver root %s: %w", l.root, err)
			}
		}
	}
	return nil
}

// stubSharedObject returns a minimal, valid ELF64 little-endian shared
// object for machine whose only content is its SONAME: ldconfig reads it
// (and makes the SONAME link in a container), nvcdi reads its SONAME to emit
// the same create-symlinks hook as for a real driver, and dlopen accepts it
// (it has no symbols, so dlsym finds nothing).
//
// Layout: ELF header, three program headers (PT_LOAD over the whole file,
// PT_DYNAMIC, PT_GNU_STACK), .hash, .dynsym, .dynstr, .dynamic, .shstrtab,
// then the section headers. Virtual addresses equal file offsets.
func stubSharedObject(machine elf.Machine, soname string) ([]byte, error) {
	if soname == "" || strings.ContainsRune(soname, 0) {
		return nil, errors.New("invalid SONAME")
	}
	const (
		ehdrSize  = 64
		phdrSize  = 56
		shdrSize  = 64
		symSize   = 24
		dynSize   = 16
		phnum     = 3
		shnum     = 6
		pageAlign = 0x1000
	)
	align8 := func(n uint64) uint64 { return (n + 7) &^ 7 }

	dynstr := append(append([]byte{0}, soname...), 0)
	shstrtab := []byte("\x00.hash\x00.dynsym\x00.dynstr\x00.dynamic\x00.shstrtab\x00")
	shName := func(name string) uint32 { return uint32(bytes.Index(shstrtab, []byte("\x00"+name+"\x00")) + 1) }

	hashOff := uint64(ehdrSize + phnum*phdrSize)
	hashLen := uint64(4 * 4) // nbucket=1, nchain=1, bucket[0]=0, chain[0]=0
	symOff := align8(hashOff + hashLen)
	strOff := symOff + symSize // one (null) symbol
	dynOff := align8(strOff + uint64(len(dynstr)))
	dyn := []elf.Dyn64{
		{Tag: int64(elf.DT_HASH), Val: hashOff},
		{Tag: int64(elf.DT_STRTAB), Val: strOff},
		{Tag: int64(elf.DT_SYMTAB), Val: symOff},
		{Tag: int64(elf.DT_STRSZ), Val: uint64(len(dynstr))},
		{Tag: int64(elf.DT_SYMENT), Val: symSize},
		{Tag: int64(elf.DT_SONAME), Val: 1},
		{Tag: int64(elf.DT_NULL)},
	}
	dynLen := uint64(len(dyn) * dynSize)
	shstrOff := dynOff + dynLen
	shOff := align8(shstrOff + uint64(len(shstrtab)))
	total := shOff + shnum*shdrSize

	var ident [elf.EI_NIDENT]byte
	copy(ident[:], elf.ELFMAG)
	ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	ident[elf.EI_OSABI] = byte(elf.ELFOSABI_NONE)

	rw := uint32(elf.PF_R | elf.PF_W)
	parts := []any{
		elf.Header64{
			Ident: ident, Type: uint16(elf.ET_DYN), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
			Phoff: ehdrSize, Shoff: shOff, Ehsize: ehdrSize, Phentsize: phdrSize, Phnum: phnum,
			Shentsize: shdrSize, Shnum: shnum, Shstrndx: shnum - 1,
		},
		elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: rw, Off: 0, Vaddr: 0, Paddr: 0, Filesz: total, Memsz: total, Align: pageAlign},
		elf.Prog64{Type: uint32(elf.PT_DYNAMIC), Flags: rw, Off: dynOff, Vaddr: dynOff, Paddr: dynOff, Filesz: dynLen, Memsz: dynLen, Align: 8},
		elf.Prog64{Type: uint32(elf.PT_GNU_STACK), Flags: rw, Align: 16},
		[4]uint32{1, 1, 0, 0},
	}
	var b bytes.Buffer
	for _, p := range parts {
		if err := binary.Write(&b, binary.LittleEndian, p); err != nil {
			return nil, err
		}
	}
	pad := func(to uint64) { b.Write(make([]byte, to-uint64(b.Len()))) }
	pad(symOff)
	_ = binary.Write(&b, binary.LittleEndian, elf.Sym64{}) // a bytes.Buffer write cannot fail
	b.Write(dynstr)
	pad(dynOff)
	_ = binary.Write(&b, binary.LittleEndian, dyn)
	b.Write(shstrtab)
	pad(shOff)
	alloc := uint64(elf.SHF_ALLOC)
	shdrs := []elf.Section64{
		{},
		{Name: shName(".hash"), Type: uint32(elf.SHT_HASH), Flags: alloc, Addr: hashOff, Off: hashOff, Size: hashLen, Link: 2, Addralign: 8, Entsize: 4},
		{Name: shName(".dynsym"), Type: uint32(elf.SHT_DYNSYM), Flags: alloc, Addr: symOff, Off: symOff, Size: symSize, Link: 3, Info: 1, Addralign: 8, Entsize: symSize},
		{Name: shName(".dynstr"), Type: uint32(elf.SHT_STRTAB), Flags: alloc, Addr: strOff, Off: strOff, Size: uint64(len(dynstr)), Addralign: 1},
		{Name: shName(".dynamic"), Type: uint32(elf.SHT_DYNAMIC), Flags: alloc | uint64(elf.SHF_WRITE), Addr: dynOff, Off: dynOff, Size: dynLen, Link: 3, Addralign: 8, Entsize: dynSize},
		{Name: shName(".shstrtab"), Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstrtab)), Addralign: 1},
	}
	_ = binary.Write(&b, binary.LittleEndian, shdrs)
	if uint64(b.Len()) != total {
		return nil, fmt.Errorf("internal error: stub ELF is %d bytes, want %d", b.Len(), total)
	}
	return b.Bytes(), nil
}

// procDriver is where the NVIDIA kernel module publishes its /proc files.
const procDriver = "/proc/driver"

// BindSimulatedProcDriver bind-mounts root/proc/driver (written by
// LayoutDriverRoot) over /proc/driver in the calling process's mount
// namespace.
//
// nvcdi reads the MIG capability table from the fixed host path
// /proc/driver/nvidia-caps/mig-minors (internal/nvcaps in
// nvidia-container-toolkit; no option changes it). On a simulated node
// that file does not exist, and nvcdi cannot produce MIG edits. Running the
// process that uses DriverEditor in a private mount namespace with the
// simulated table bound there lets nvcdi take its real code path.
//
// Start the process with `unshare --mount --propagation private` (or
// SysProcAttr.Unshareflags = CLONE_NEWNS), a namespace every thread of the
// process then shares, or run it as a container's first process (the
// chart's DaemonSet with the simulator image). To protect the host, it
// refuses when a real NVIDIA driver is loaded (/proc/driver/nvidia exists;
// a container sees the host's) and when it runs in the mount namespace of
// the init process of the /proc it sees (where /proc/1/ns/mnt is readable),
// unless that init process is itself: a process that is PID 1 of the PID
// namespace its /proc shows runs in a container, whose runtime mounted
// that /proc in a mount namespace of the container's own (mounting it in
// the host's would hide the host's processes from the host). It needs
// CAP_SYS_ADMIN. Calling it again is a no-op.
func BindSimulatedProcDriver(root string) error {
	src := filepath.Join(root, "proc", "driver")
	if _, err := os.Stat(filepath.Join(src, "nvidia-caps", "mig-minors")); err != nil {
		return fmt.Errorf("simulated driver root %s: no MIG minors table (run LayoutDriverRoot first): %w", root, err)
	}
	// Already bound (the simulated root has a proc/driver/nvidia of its
	// own, which the check below would take for a real driver's).
	if same, err := sameFile(src, procDriver); err == nil && same {
		return nil
	}
	if _, err := os.Stat(filepath.Join(procDriver, "nvidia")); err == nil {
		return fmt.Errorf("bind simulated %s: refusing, a real NVIDIA driver is loaded (%s/nvidia exists)", procDriver, procDriver)
	}
	// PID 1's namespace may be unreadable (no CAP_SYS_PTRACE over it, or
	// another user namespace); then only the check above protects the host.
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("bind simulated %s: %w", procDriver, err)
	}
	if pid1, err := os.Readlink("/proc/1/ns/mnt"); err == nil && self == pid1 && !isProcInit("/proc") {
		return fmt.Errorf("bind simulated %s: refusing to mount over the host's %s; run in a private mount namespace (unshare --mount --propagation private)", procDriver, procDriver)
	}
	if err := unix.Mount(src, procDriver, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", src, procDriver, err)
	}
	return nil
}

// isProcInit reports whether the calling process is PID 1 of the PID
// namespace that the proc file system at proc shows: <proc>/self then
// names "1". The host's init is never a Facet plugin, so this holds only
// in a container (or a process started like one, with unshare --pid
// --fork --mount-proc, which implies a mount namespace of its own).
func isProcInit(proc string) bool {
	self, err := os.Readlink(filepath.Join(proc, "self"))
	return err == nil && self == "1" && os.Getpid() == 1
}

func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// WriteSimulatedHAMiCore writes a stand-in for HAMi-core's libvgpu.so at
// path: a valid, empty ELF shared object with SONAME libvgpu.so, so that a
// container's /etc/ld.so.preload naming it loads cleanly. It enforces
// nothing; on a simulated node there is no GPU to enforce limits on, and
// what the tests check is that the share's CDI spec carries the limits.
func WriteSimulatedHAMiCore(path string) error {
	_, machine, err := libraryTriplet()
	if err != nil {
		return err
	}
	data, err := stubSharedObject(machine, "libvgpu.so")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o755)
}
