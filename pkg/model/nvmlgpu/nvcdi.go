package nvmlgpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/go-logr/logr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultNvidiaCDIHookPath is where the NVIDIA Container Toolkit installs
// nvidia-cdi-hook, and nvcdi's default.
const DefaultNvidiaCDIHookPath = "/usr/bin/nvidia-cdi-hook"

// MIGMinorsPath is the driver's MIG capability table on a node
// (DefaultProcRoot); ReadMIGCapDevices reads it under
// DriverEditorOptions.ProcRoot.
const MIGMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// DriverEditorOptions configures a DriverEditor.
type DriverEditorOptions struct {
	// DriverRoot is the host path where the driver's files are: "/" for a
	// driver installed in the host's own root (the default when empty),
	// /run/nvidia/driver with the GPU Operator, /usr/local/nvidia or
	// another prefix of its own, a LayoutDriverRoot directory on a
	// simulated node. Host paths in the edits are below it, container paths
	// are relative to it.
	DriverRoot string
	// ContainerDriverRoot is where this process reads DriverRoot: a mount of
	// it in the plugin's container (the chart mounts it at /driver-root).
	// nvcdi discovers the driver there, and the edits' host paths are
	// rewritten from it to DriverRoot with nvcdi's own root transformer, as
	// NVIDIA's DRA driver does. Empty means DriverRoot itself: a process on
	// the host, or a mount at the same path. It cannot be "/" unless
	// DriverRoot is, since every host path would then be rewritten.
	ContainerDriverRoot string
	// DevRoot is the host path whose dev/ holds the nvidia device nodes ("/"
	// with the GPU Operator, whose driver container creates them on the
	// host, and for a driver under a prefix such as /usr/local/nvidia).
	// Empty means DriverRoot. When it is DriverRoot this process reads it
	// under ContainerDriverRoot, otherwise at its own path (a mount at the
	// same path).
	DevRoot string
	// NvidiaCDIHookPath is the host path of nvidia-cdi-hook, the program the
	// edits' hooks run (create-symlinks, update-ldcache, ...). Empty means
	// DefaultNvidiaCDIHookPath. The file must be named nvidia-cdi-hook: nvcdi
	// derives the hook's argv[0] from the base name.
	NvidiaCDIHookPath string
	// LdconfigPath is the host ldconfig the update-ldcache hook runs inside
	// the container; empty lets nvidia-cdi-hook use /sbin/ldconfig.
	LdconfigPath string
	// DisabledHooks names nvcdi hooks to leave out of the edits:
	// "create-symlinks", "update-ldcache", "enable-cuda-compat",
	// "disable-device-node-modification", or "all". Empty keeps nvcdi's
	// defaults, which is what a GPU node running the NVIDIA Container Toolkit
	// gets.
	DisabledHooks []string
	// ProcRoot is where the driver's proc files are read (ReadMIGCapDevices):
	// devices, driver/nvidia/capabilities and driver/nvidia-caps/mig-minors.
	// Empty means DefaultProcRoot, the proc file system, which shows the
	// host driver's files in a container too. A simulated node uses its
	// driver root's proc/ (sim.LayoutDriverRoot).
	ProcRoot string
	// Logger receives nvcdi's messages: errors as errors, warnings at V(1),
	// info at V(4), debug at V(6) and trace at V(7). The zero value discards
	// them. nvcdi warns about every optional file it does not find (graphics
	// configs, IPC sockets, ldcache, firmware class path), so V(1) is noisy on
	// a compute-only or simulated node.
	Logger logr.Logger
}

// DriverEditor produces CDI container edits for the NVIDIA driver through
// nvcdi (github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi) in NVML
// mode: the same discovery `nvidia-ctk cdi generate` performs, on the NVML
// library Facet already holds (real or simulated) and on a driver root.
//
// nvsandboxutils is disabled, so device discovery always goes through the
// given NVML library; on a real node nvcdi would otherwise ask
// libnvidia-sandboxutils instead, which the simulated backend cannot stand
// in for.
//
// A DriverEditor is safe for concurrent use; calls are serialized.
type DriverEditor struct {
	mu  sync.Mutex
	lib nvml.Interface
	cdi nvcdi.Interface
	// toHost rewrites the host paths nvcdi found under the container's
	// roots to the host's; nil when they are the same.
	toHost transform.Transformer
	// driverRoot names the driver root in errors: the host path, and where
	// this process reads it when that differs.
	driverRoot string
	devRoot    string
	procRoot   string
}

// NewDriverEditor returns a DriverEditor over lib, an NVML library that is
// already initialised (nvcdi calls Init and Shutdown around its queries,
// which NVML reference-counts).
//
// It asks NVML for the driver version at once, because nvcdi does: the
// driver libraries it then looks for are <name>.so.<that version> under
// DriverRoot.
func NewDriverEditor(lib nvml.Interface, opts DriverEditorOptions) (*DriverEditor, error) {
	if lib == nil {
		return nil, errors.New("nvcdi driver editor: no NVML library")
	}
	hostRoot := opts.DriverRoot
	if hostRoot == "" {
		hostRoot = "/"
	}
	ctrRoot := opts.ContainerDriverRoot
	if ctrRoot == "" {
		ctrRoot = hostRoot
	}
	hostDev := opts.DevRoot
	if hostDev == "" {
		hostDev = hostRoot
	}
	hookPath := opts.NvidiaCDIHookPath
	if hookPath == "" {
		hookPath = DefaultNvidiaCDIHookPath
	}
	// nvcdi makes container paths by trimming the root off host paths, so
	// the roots must be absolute and clean ("/x/" would leave "usr/lib/...").
	for _, root := range []*string{&hostRoot, &ctrRoot, &hostDev} {
		if !filepath.IsAbs(*root) {
			return nil, fmt.Errorf("nvcdi driver editor: root %q is not an absolute path", *root)
		}
		*root = filepath.Clean(*root)
	}
	ctrDev := hostDev
	if hostDev == hostRoot {
		ctrDev = ctrRoot
	}
	if ctrRoot == "/" && hostRoot != "/" {
		return nil, fmt.Errorf("nvcdi driver editor: driver root %s read at / in the container: mount it at a directory of its own (every host path under / would be rewritten to %s)", hostRoot, hostRoot)
	}
	if hostDev != hostRoot && ctrRoot != hostRoot && (ctrDev == ctrRoot || strings.HasPrefix(ctrDev, ctrRoot+"/")) {
		// Its device nodes would be rewritten as the driver root's files.
		return nil, fmt.Errorf("nvcdi driver editor: dev root %s is under %s, where driver root %s is read: use the driver root as the dev root, or a dev root outside it", hostDev, ctrRoot, hostRoot)
	}
	where := func(host, ctr string) string {
		if host == ctr {
			return host
		}
		return fmt.Sprintf("%s (read at %s)", host, ctr)
	}
	driverRoot, devRoot := where(hostRoot, ctrRoot), where(hostDev, ctrDev)
	for _, root := range []string{ctrRoot, ctrDev} {
		if fi, err := os.Stat(root); err != nil {
			return nil, fmt.Errorf("nvcdi driver editor for driver root %s: %w", driverRoot, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("nvcdi driver editor for driver root %s: %s is not a directory", driverRoot, root)
		}
	}

	nvcdiOpts := []nvcdi.Option{
		nvcdi.WithLogger(nvcdiLogger{opts.Logger}),
		nvcdi.WithNvmlLib(lib),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(ctrRoot),
		nvcdi.WithDevRoot(ctrDev),
		nvcdi.WithNVIDIACDIHookPath(hookPath),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	}
	if opts.LdconfigPath != "" {
		nvcdiOpts = append(nvcdiOpts, nvcdi.WithLdconfigPath(opts.LdconfigPath))
	}
	if len(opts.DisabledHooks) > 0 {
		nvcdiOpts = append(nvcdiOpts, nvcdi.WithDisabledHooks(opts.DisabledHooks...))
	}
	var cdilib nvcdi.Interface
	err := recoverNvcdi(func() error {
		var err error
		cdilib, err = nvcdi.New(nvcdiOpts...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nvcdi driver editor for driver root %s: %w", driverRoot, err)
	}
	procRoot := opts.ProcRoot
	if procRoot == "" {
		procRoot = DefaultProcRoot
	}
	e := &DriverEditor{lib: lib, cdi: cdilib, driverRoot: driverRoot, devRoot: devRoot, procRoot: procRoot}
	if ctrRoot != hostRoot {
		e.toHost = transformroot.NewDriverTransformer(
			transformroot.WithDriverRoot(ctrRoot), transformroot.WithTargetDriverRoot(hostRoot),
			transformroot.WithDevRoot(ctrDev), transformroot.WithTargetDevRoot(hostDev),
		)
	}
	return e, nil
}

// hostPaths rewrites the host paths of edits that nvcdi found under the
// container's roots to the host's, in place.
func (e *DriverEditor) hostPaths(edits *cdispec.ContainerEdits) error {
	if e.toHost == nil {
		return nil
	}
	spec := &cdispec.Spec{ContainerEdits: *edits}
	if err := e.toHost.Transform(spec); err != nil {
		return fmt.Errorf("rewrite host paths for driver root %s: %w", e.driverRoot, err)
	}
	*edits = spec.ContainerEdits
	return nil
}

// DriverEditor returns a DriverEditor over this library's NVML, real or
// simulated (see NewDriverEditor).
func (l *Library) DriverEditor(opts DriverEditorOptions) (*DriverEditor, error) {
	return NewDriverEditor(l.lib, opts)
}

// CommonEdits returns the edits every container with any NVIDIA GPU needs,
// from nvcdi's GetCommonEdits:
//   - the control device nodes /dev/nvidiactl, /dev/nvidia-uvm,
//     /dev/nvidia-uvm-tools (and /dev/nvidia-modeset where present) under
//     DevRoot;
//   - read-only bind mounts of every driver library <name>.so.<driver
//     version> in libcuda.so's directory, the driver's executables
//     (nvidia-smi, ...), GSP firmware, IPC sockets and graphics configs that
//     exist under DriverRoot;
//   - the hooks create-symlinks (SONAME and .so links of the libraries),
//     update-ldcache, enable-cuda-compat and
//     disable-device-node-modification, unless disabled;
//   - the environment NVIDIA_CTK_LIBCUDA_DIR=<libcuda.so's directory> and
//     NVIDIA_VISIBLE_DEVICES=void (the latter stops a legacy NVIDIA runtime
//     hook in the container runtime from injecting GPUs of its own).
//
// It fails when /dev/nvidiactl is missing from the edits: without it no
// GPU is usable, and nvcdi itself skips missing files silently.
func (e *DriverEditor) CommonEdits() (*cdispec.ContainerEdits, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var edits *cdiapi.ContainerEdits
	err := recoverNvcdi(func() error {
		var err error
		edits, err = e.cdi.GetCommonEdits()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nvcdi common edits for driver root %s: %w", e.driverRoot, err)
	}
	if edits == nil || edits.ContainerEdits == nil {
		return nil, fmt.Errorf("nvcdi common edits for driver root %s: nvcdi returned none", e.driverRoot)
	}
	if !hasDeviceNode(edits.ContainerEdits, func(p string) bool { return p == "/dev/nvidiactl" }) {
		return nil, fmt.Errorf("nvcdi common edits for driver root %s: no /dev/nvidiactl under dev root %s", e.driverRoot, e.devRoot)
	}
	if err := e.hostPaths(edits.ContainerEdits); err != nil {
		return nil, err
	}
	return edits.ContainerEdits, nil
}

// GPUEdits returns the edits for the whole GPU with this UUID ("GPU-..."),
// from nvcdi's device spec for that UUID (GetDeviceSpecsByID): the device
// node /dev/nvidia<minor> (minor from NVML's GetMinorNumber) under DevRoot,
// plus the GPU's /dev/dri nodes and a create-symlinks hook for their by-path
// links where the host's sysfs has DRM devices for its PCI bus ID.
//
// It fails for a MIG device UUID, an index, or a UUID NVML does not know,
// and when the GPU's device node is missing under DevRoot.
func (e *DriverEditor) GPUEdits(uuid string) (*cdispec.ContainerEdits, error) {
	if !strings.HasPrefix(uuid, "GPU-") {
		return nil, fmt.Errorf("nvcdi edits for GPU %q: not a GPU UUID", uuid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	edits, err := e.deviceEdits(uuid)
	if err != nil {
		return nil, fmt.Errorf("nvcdi edits for GPU %s (driver root %s): %w", uuid, e.driverRoot, err)
	}
	if !hasDeviceNode(edits, gpuNodePattern.MatchString) {
		return nil, fmt.Errorf("nvcdi edits for GPU %s: no /dev/nvidiaN node under dev root %s", uuid, e.devRoot)
	}
	return edits, nil
}

// MIGEdits returns the edits for the MIG device that is compute instance
// ciID of GPU instance giID on the GPU parentUUID, as NVML numbers them
// (GpuInstanceInfo.Id and ComputeInstanceInfo.Id, at hand right after
// creating the instances): the parent's /dev/nvidia<minor> from nvcdi's
// device spec for the parent (under DevRoot), and the two nvidia-caps
// nodes /dev/nvidia-caps/nvidia-cap<N> granting access to the GI and to the
// CI, as character devices with the major and minors the driver gives them
// (ReadMIGCapDevices, under ProcRoot). The runtime creates those two in the
// container: the host needs no node for them, which it has for an instance
// carved a moment before only when something created one. NVIDIA's DRA
// driver builds MIG edits the same way (cmd/gpu-kubelet-plugin/cdi.go,
// GetDevNodesForMigDevice); unlike it, Facet keeps nothing else of the
// parent's spec (its /dev/dri nodes), which a compute MIG device does not
// need.
//
// The MIG device is found through NVML first: the parent's MIG device
// handles (GetMaxMigDeviceCount, GetMigDeviceHandleByIndex) are searched
// for the one whose GetGpuInstanceId and GetComputeInstanceId match.
//
// It fails when the MIG device does not exist, when the parent's device
// node is missing under DevRoot, and when the driver's capability files do
// not show the instance (ReadMIGCapDevices names the file).
func (e *DriverEditor) MIGEdits(parentUUID string, giID, ciID int) (*cdispec.ContainerEdits, error) {
	what := fmt.Sprintf("MIG device GI %d CI %d on GPU %s", giID, ciID, parentUUID)
	e.mu.Lock()
	defer e.mu.Unlock()
	migUUID, err := e.findMIGDevice(parentUUID, giID, ciID)
	if err != nil {
		return nil, fmt.Errorf("nvcdi edits for %s: %w", what, err)
	}
	parent, ret := e.lib.DeviceGetHandleByUUID(parentUUID)
	if err := nvmlError("nvmlDeviceGetHandleByUUID", ret); err != nil {
		return nil, fmt.Errorf("edits for %s: %w", what, err)
	}
	minor, ret := parent.GetMinorNumber()
	if err := nvmlError("nvmlDeviceGetMinorNumber", ret); err != nil {
		return nil, fmt.Errorf("edits for %s: %w", what, err)
	}
	parentEdits, err := e.deviceEdits(parentUUID)
	if err != nil {
		return nil, fmt.Errorf("nvcdi edits for %s (%s, driver root %s): %w", what, migUUID, e.driverRoot, err)
	}
	parentNode := fmt.Sprintf("/dev/nvidia%d", minor)
	edits := &cdispec.ContainerEdits{}
	for _, n := range parentEdits.DeviceNodes {
		if n != nil && n.Path == parentNode {
			edits.DeviceNodes = append(edits.DeviceNodes, n)
		}
	}
	if len(edits.DeviceNodes) == 0 {
		return nil, fmt.Errorf("nvcdi edits for %s (%s): no %s under dev root %s", what, migUUID, parentNode, e.devRoot)
	}
	giCap, ciCap, err := ReadMIGCapDevices(e.procRoot, minor, giID, ciID)
	if err != nil {
		return nil, fmt.Errorf("edits for %s (%s): %w", what, migUUID, err)
	}
	edits.DeviceNodes = append(edits.DeviceNodes, giCap.DeviceNode(), ciCap.DeviceNode())
	return edits, nil
}

// deviceEdits returns the edits of nvcdi's single device spec for id.
func (e *DriverEditor) deviceEdits(id string) (*cdispec.ContainerEdits, error) {
	var devices []cdispec.Device
	err := recoverNvcdi(func() error {
		var err error
		devices, err = e.cdi.GetDeviceSpecsByID(id)
		return err
	})
	if err != nil {
		return nil, err
	}
	// With nvcdi's default index namer there is one spec per device.
	if len(devices) != 1 {
		return nil, fmt.Errorf("nvcdi returned %d device specs, want 1", len(devices))
	}
	edits := devices[0].ContainerEdits
	if err := e.hostPaths(&edits); err != nil {
		return nil, err
	}
	return &edits, nil
}

// findMIGDevice returns the UUID of the MIG device giID/ciID on parentUUID.
func (e *DriverEditor) findMIGDevice(parentUUID string, giID, ciID int) (string, error) {
	parent, ret := e.lib.DeviceGetHandleByUUID(parentUUID)
	if err := nvmlError("nvmlDeviceGetHandleByUUID", ret); err != nil {
		return "", err
	}
	var uuid string
	err := recoverNvcdi(func() error {
		count, ret := parent.GetMaxMigDeviceCount()
		if err := nvmlError("nvmlDeviceGetMaxMigDeviceCount", ret); err != nil {
			return err
		}
		for i := 0; i < count; i++ {
			mig, ret := parent.GetMigDeviceHandleByIndex(i)
			if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue // no MIG device at this index
			}
			if err := nvmlError("nvmlDeviceGetMigDeviceHandleByIndex", ret); err != nil {
				return err
			}
			gi, ret := mig.GetGpuInstanceId()
			if err := nvmlError("nvmlDeviceGetGpuInstanceId", ret); err != nil {
				return err
			}
			ci, ret := mig.GetComputeInstanceId()
			if err := nvmlError("nvmlDeviceGetComputeInstanceId", ret); err != nil {
				return err
			}
			if gi != giID || ci != ciID {
				continue
			}
			uuid, ret = mig.GetUUID()
			return nvmlError("nvmlDeviceGetUUID", ret)
		}
		return fmt.Errorf("no such MIG device among the GPU's %d MIG device handles", count)
	})
	return uuid, err
}

// gpuNodePattern matches a whole GPU's device node.
var gpuNodePattern = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

func hasDeviceNode(e *cdispec.ContainerEdits, match func(string) bool) bool {
	for _, n := range e.DeviceNodes {
		if n != nil && match(n.Path) {
			return true
		}
	}
	return false
}

// recoverNvcdi runs f and turns a panic into an error. go-nvml's mock
// panics when nvcdi calls an NVML function the simulated backend has not
// set ("XxxFunc: method is nil but Device.Xxx was just called"); that must
// fail one claim, not the plugin.
func recoverNvcdi(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("nvcdi panicked (a simulated NVML function is probably missing): %v", r)
		}
	}()
	return f()
}

// nvcdiLogger adapts a logr.Logger to nvcdi's logger interface.
type nvcdiLogger struct{ l logr.Logger }

func (n nvcdiLogger) Errorf(format string, args ...interface{}) {
	n.l.Error(nil, fmt.Sprintf(format, args...), "source", "nvcdi")
}
func (n nvcdiLogger) Warningf(format string, args ...interface{}) {
	n.l.V(1).Info(fmt.Sprintf(format, args...), "source", "nvcdi", "level", "warning")
}
func (n nvcdiLogger) Infof(format string, args ...interface{}) {
	n.l.V(4).Info(fmt.Sprintf(format, args...), "source", "nvcdi")
}
func (n nvcdiLogger) Debugf(format string, args ...interface{}) {
	n.l.V(6).Info(fmt.Sprintf(format, args...), "source", "nvcdi")
}
func (n nvcdiLogger) Tracef(format string, args ...interface{}) {
	n.l.V(7).Info(fmt.Sprintf(format, args...), "source", "nvcdi")
}
