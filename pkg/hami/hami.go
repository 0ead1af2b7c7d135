// Package hami turns a claim's vGPU shares into the CDI edits that make
// HAMi-core (libvgpu.so, Project-HAMi/HAMi-core) enforce them inside the
// claim's containers. The contract it implements is
// docs/design/hami-core.md: the environment HAMi-core reads, the files it
// needs, and its pitfalls (quantity suffixes, octal, index order, one cache
// file per budget).
package hami

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// Container paths, as HAMi's own device plugins use them.
const (
	// ContainerLibrary is where libvgpu.so is mounted (HAMi-core's default
	// CUDA_REDIRECT location).
	ContainerLibrary = "/usr/local/vgpu/libvgpu.so"
	// containerClaimsDir holds one directory per claim for the shared
	// accounting region.
	containerClaimsDir = "/usr/local/vgpu/claims"
	preloadFile        = "/etc/ld.so.preload"
	// CacheFileName is the accounting region's file inside a claim's cache
	// directory.
	CacheFileName = "vgpu.cache"
)

// Share is one vGPU share of a claim, as the allocator recorded it.
type Share struct {
	// Device is the DRA device name, e.g. "gpu-3".
	Device string
	// PCIBusID orders shares the way the container enumerates GPUs.
	PCIBusID string
	// MemoryBytes is the consumed memory capacity in bytes; a multiple of
	// 1 MiB (the device's requestPolicy step).
	MemoryBytes int64
	// Cores is the consumed SM time in percent, 0 to 100. 0 means best
	// effort: no throttle.
	Cores int64
}

// Options locate HAMi-core on the host.
type Options struct {
	// LibraryPath is the host path of libvgpu.so (installed by the
	// DaemonSet's init container).
	LibraryPath string
	// StateDir is a host directory Facet owns: it holds the ld.so.preload
	// file and one cache directory per claim.
	StateDir string
}

// Editor builds and cleans up the HAMi-core part of claims' CDI specs.
type Editor struct {
	opts    Options
	preload string
}

// NewEditor checks that libvgpu.so exists and writes the preload file the
// containers mount. A missing library is an error, not a silent fallback to
// unenforced shares.
func NewEditor(opts Options) (*Editor, error) {
	if st, err := os.Stat(opts.LibraryPath); err != nil || st.IsDir() {
		return nil, fmt.Errorf("HAMi-core library %s: not a file (%v); vGPU shares cannot be enforced", opts.LibraryPath, err)
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "claims"), 0o755); err != nil {
		return nil, fmt.Errorf("HAMi-core state directory: %w", err)
	}
	preload := filepath.Join(opts.StateDir, "ld.so.preload")
	if err := os.WriteFile(preload, []byte(ContainerLibrary+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", preload, err)
	}
	return &Editor{opts: opts, preload: preload}, nil
}

// CacheDir is the host directory of a claim's accounting region.
func (e *Editor) CacheDir(claimUID types.UID) string {
	return filepath.Join(e.opts.StateDir, "claims", string(claimUID))
}

// Edits returns the claim-wide edits for its shares: per-device limits,
// the claim's own accounting region (created fresh here), the library and
// the preload file, and the knobs of cfg. With enforcement disabled it
// returns nil: the shares are scheduled but not enforced, as asked.
//
// Index n of CUDA_DEVICE_*_LIMIT_<n> is the share's position among the
// claim's GPUs in PCI bus order, which is how the container enumerates
// them. Containers that also see GPUs of another claim are not supported
// by HAMi-core's indexing.
func (e *Editor) Edits(claimUID types.UID, shares []Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	if !cfg.EnforcementEnabled() {
		return nil, nil
	}
	ordered := append([]Share(nil), shares...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].PCIBusID < ordered[j].PCIBusID })

	cacheDir := e.CacheDir(claimUID)
	// A fresh region: the first process to create it fixes the limits, so
	// a stale file from an earlier claim would carry wrong ones.
	if err := os.RemoveAll(cacheDir); err != nil {
		return nil, fmt.Errorf("reset HAMi-core cache %s: %w", cacheDir, err)
	}
	if err := os.MkdirAll(cacheDir, 0o777); err != nil {
		return nil, fmt.Errorf("HAMi-core cache %s: %w", cacheDir, err)
	}
	// 0777 regardless of umask, so non-root containers can create the file.
	if err := os.Chmod(cacheDir, 0o777); err != nil {
		return nil, err
	}
	containerCache := filepath.Join(containerClaimsDir, string(claimUID))
	edits := &cdispec.ContainerEdits{
		Env: []string{"CUDA_DEVICE_MEMORY_SHARED_CACHE=" + filepath.Join(containerCache, CacheFileName)},
		Mounts: []*cdispec.Mount{
			{HostPath: e.opts.LibraryPath, ContainerPath: ContainerLibrary, Options: []string{"ro", "nosuid", "nodev", "bind"}},
			{HostPath: e.preload, ContainerPath: preloadFile, Options: []string{"ro", "nosuid", "nodev", "bind"}},
			{HostPath: cacheDir, ContainerPath: containerCache, Options: []string{"rw", "nosuid", "nodev", "bind"}},
		},
	}
	for n, s := range ordered {
		if s.MemoryBytes <= 0 || s.MemoryBytes%(1<<20) != 0 {
			return nil, fmt.Errorf("share on %s: memory %d bytes is not a positive whole number of MiB", s.Device, s.MemoryBytes)
		}
		if s.Cores < 0 || s.Cores > 100 {
			return nil, fmt.Errorf("share on %s: cores %d%% is outside 0-100", s.Device, s.Cores)
		}
		// "<MiB>m": a bare number is bytes, a Kubernetes "Mi" suffix is
		// misread as bytes, and a leading 0 as octal.
		edits.Env = append(edits.Env, fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d=%dm", n, s.MemoryBytes>>20))
		// 0 (best effort) and 100 both mean "no throttle" to HAMi-core;
		// writing the value keeps the spec self-explanatory.
		edits.Env = append(edits.Env, "CUDA_DEVICE_SM_LIMIT_"+strconv.Itoa(n)+"="+strconv.FormatInt(s.Cores, 10))
	}
	// A nil config means the defaults, which HAMiCoreEnv fills in.
	edits.Env = append(edits.Env, cfg.HAMiCoreEnv()...)
	return edits, nil
}

// Cleanup removes a claim's accounting region; a missing one is fine.
func (e *Editor) Cleanup(claimUID types.UID) error {
	if err := os.RemoveAll(e.CacheDir(claimUID)); err != nil {
		return fmt.Errorf("remove HAMi-core cache of claim %s: %w", claimUID, err)
	}
	return nil
}

// ClaimCaches lists the claim UIDs that have an accounting region, so that
// regions no prepared claim owns (left by a crash) can be removed.
func (e *Editor) ClaimCaches() ([]types.UID, error) {
	entries, err := os.ReadDir(filepath.Join(e.opts.StateDir, "claims"))
	if err != nil {
		return nil, fmt.Errorf("list HAMi-core caches: %w", err)
	}
	var uids []types.UID
	for _, en := range entries {
		if en.IsDir() {
			uids = append(uids, types.UID(en.Name()))
		}
	}
	return uids, nil
}
