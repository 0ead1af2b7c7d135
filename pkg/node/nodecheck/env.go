package nodecheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/mps"
	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
)

// preloadFile is the container path of the loader's preload list, which
// HAMi-core's edits mount (package hami).
const preloadFile = "/etc/ld.so.preload"

// Process is how a process on this machine stands in for a container
// started from a claim's CDI spec.
type Process struct {
	// Env is the process's whole environment: the spec's, with container
	// paths turned into the host paths mounted there, plus what the
	// container's mount namespace would have done:
	//   - LD_PRELOAD: the libraries the mounted /etc/ld.so.preload lists
	//     (libvgpu.so for HAMi-core), by host path;
	//   - LD_LIBRARY_PATH: LibDir first, so that libvgpu.so's own
	//     dlopen("libcuda.so.1") finds the driver's, and nothing else
	//     of the driver root's library directory (its libc.so.6 is the
	//     host's, which the process's loader may not load, as no
	//     container's loader does);
	//   - CUDA_VISIBLE_DEVICES: the claim's GPUs (FACET_GPU_UUIDS), which
	//     stand for the container's device nodes: on the host every GPU's
	//     node is there. By NVML index, with CUDA_DEVICE_ORDER=PCI_BUS_ID,
	//     where NewProcess is given the indices: HAMi-core maps CUDA's
	//     device n to NVML's by atoi of the n-th entry (parse_cuda_visible_env
	//     in HAMi-core's src/utils.c), so a UUID there reads as NVML 0 and
	//     the probe of any other GPU would be lost from its accounting;
	//   - CUDA_REDIRECT: the host path of the libvgpu.so mounted at
	//     hami.ContainerLibrary, where HAMi-core looks for itself.
	Env []string
	// LibCUDA is the host path of the libcuda.so the spec mounts.
	LibCUDA string
	// Binds are the spec's mounts the process needs at their container
	// paths, not only by host path: an MPS share's /dev/shm, which its
	// client shares with the MPS server (probe.Params.Binds).
	Binds []probe.Bind
	// LibDir is a directory of links to the libraries the spec mounts,
	// by their container names, and to each under the names its host
	// directory's links give it (its SONAME, as ldconfig makes them in a
	// container): what a container's library path holds of the driver.
	// Close removes it.
	LibDir string
	// Missing lists the device nodes and mount sources the spec names
	// that do not exist: a container runtime would fail to create a
	// container from it.
	Missing []string
	// MissingHooks lists the hook binaries the spec names that do not
	// exist here. Only a note: run from the plugin's pod, the check sees
	// the host's driver root, device nodes and HAMi-core directory at
	// their host paths, but not the host's /usr/bin.
	MissingHooks []string
}

// NewProcess reads a claim's spec. nvmlIndex maps a GPU UUID to its NVML
// index (nil: the UUIDs stand in CUDA_VISIBLE_DEVICES). It fails when the
// spec mounts no libcuda.so or its preload list cannot be read.
func NewProcess(spec *cdispec.Spec, nvmlIndex map[string]int) (*Process, error) {
	edits := []cdispec.ContainerEdits{spec.ContainerEdits}
	for _, d := range spec.Devices {
		edits = append(edits, d.ContainerEdits)
	}
	var env []string
	var mounts []*cdispec.Mount
	p := &Process{}
	exists := func(what, path string) {
		if _, err := os.Lstat(path); err != nil {
			p.Missing = append(p.Missing, fmt.Sprintf("%s %s", what, path))
		}
	}
	for _, e := range edits {
		env = append(env, e.Env...)
		mounts = append(mounts, e.Mounts...)
		for _, n := range e.DeviceNodes {
			host := n.HostPath
			if host == "" {
				host = n.Path
			}
			exists("device node", host)
		}
		for _, h := range e.Hooks {
			if _, err := os.Stat(h.Path); err != nil && !slices.Contains(p.MissingHooks, h.Path) {
				p.MissingHooks = append(p.MissingHooks, h.Path)
			}
		}
	}
	for _, m := range mounts {
		exists("mount source", m.HostPath)
		if filepath.Clean(m.ContainerPath) == mps.ContainerShmDir {
			p.Binds = append(p.Binds, probe.Bind{Host: m.HostPath, Container: mps.ContainerShmDir})
		}
	}
	hostPath := func(container string) (string, bool) {
		best := -1
		for i, m := range mounts {
			c := filepath.Clean(m.ContainerPath)
			if (container == c || strings.HasPrefix(container, c+"/")) && (best < 0 || len(c) > len(filepath.Clean(mounts[best].ContainerPath))) {
				best = i
			}
		}
		if best < 0 {
			return container, false
		}
		m := mounts[best]
		return m.HostPath + strings.TrimPrefix(container, filepath.Clean(m.ContainerPath)), true
	}
	for _, m := range mounts {
		if strings.HasPrefix(filepath.Base(m.ContainerPath), "libcuda.so") && p.LibCUDA == "" {
			p.LibCUDA = m.HostPath
		}
	}
	if p.LibCUDA == "" {
		return p, errors.New("the CDI spec mounts no libcuda.so: nvcdi found no CUDA driver library under the driver root")
	}
	vars := map[string]string{}
	var order []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, seen := vars[k]; !seen {
			order = append(order, k)
		}
		// As in a container, the last value of a name wins.
		vars[k] = mapPaths(v, hostPath)
	}
	set := func(k, v string) {
		if _, seen := vars[k]; !seen {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, m := range mounts {
		if filepath.Clean(m.ContainerPath) != preloadFile {
			continue
		}
		data, err := os.ReadFile(m.HostPath)
		if err != nil {
			return p, fmt.Errorf("the preload list the spec mounts at %s: %w", preloadFile, err)
		}
		var libs []string
		for _, l := range strings.Fields(string(data)) {
			h, _ := hostPath(l)
			libs = append(libs, h)
		}
		if len(libs) > 0 {
			set("LD_PRELOAD", strings.Join(libs, ":"))
		}
	}
	// HAMi-core dlopens itself by this container path to find its
	// hooks, unless CUDA_REDIRECT names another.
	if lib, mounted := hostPath(hami.ContainerLibrary); mounted && vars["CUDA_REDIRECT"] == "" {
		set("CUDA_REDIRECT", lib)
	}
	var err error
	if p.LibDir, err = mountedLibraries(mounts); err != nil {
		return p, err
	}
	libDirs := p.LibDir
	if v := vars["LD_LIBRARY_PATH"]; v != "" {
		libDirs += ":" + v
	}
	set("LD_LIBRARY_PATH", libDirs)
	if _, ok := vars["CUDA_VISIBLE_DEVICES"]; !ok && vars["FACET_GPU_UUIDS"] != "" {
		visible := vars["FACET_GPU_UUIDS"]
		var indices []string
		for _, uuid := range strings.Split(visible, ",") {
			i, ok := nvmlIndex[uuid]
			if !ok {
				indices = nil
				break
			}
			indices = append(indices, strconv.Itoa(i))
		}
		if indices != nil {
			visible = strings.Join(indices, ",")
			set("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
		}
		set("CUDA_VISIBLE_DEVICES", visible)
	}
	for _, k := range order {
		p.Env = append(p.Env, k+"="+vars[k])
	}
	sort.Strings(p.Missing)
	return p, nil
}

// Close removes LibDir.
func (p *Process) Close() error {
	if p == nil || p.LibDir == "" {
		return nil
	}
	return os.RemoveAll(p.LibDir)
}

// mountedLibraries makes LibDir (Process): a link for each mounted shared
// library (a container path named lib*.so*), and one for each link of its
// host directory that resolves to it.
func mountedLibraries(mounts []*cdispec.Mount) (string, error) {
	dir, err := os.MkdirTemp("", "facet-node-check-libs-")
	if err != nil {
		return "", err
	}
	link := func(name, target string) error {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return nil
		}
		return os.Symlink(target, filepath.Join(dir, name))
	}
	for _, m := range mounts {
		name := filepath.Base(m.ContainerPath)
		if !strings.HasPrefix(name, "lib") || !strings.Contains(name, ".so") {
			continue
		}
		if err := link(name, m.HostPath); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
		real, err := filepath.EvalSymlinks(m.HostPath)
		if err != nil {
			continue
		}
		siblings, _ := os.ReadDir(filepath.Dir(m.HostPath))
		for _, sib := range siblings {
			if sib.Type()&os.ModeSymlink == 0 {
				continue
			}
			if t, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(m.HostPath), sib.Name())); err == nil && t == real {
				if err := link(sib.Name(), m.HostPath); err != nil {
					os.RemoveAll(dir)
					return "", err
				}
			}
		}
	}
	return dir, nil
}

// mapPaths turns the absolute container paths of a value (one path, or
// a colon-separated list of them) into host paths; other values are kept.
func mapPaths(v string, hostPath func(string) (string, bool)) string {
	parts := strings.Split(v, ":")
	for _, p := range parts {
		if !filepath.IsAbs(p) {
			return v
		}
	}
	for i, p := range parts {
		parts[i], _ = hostPath(filepath.Clean(p))
	}
	return strings.Join(parts, ":")
}
