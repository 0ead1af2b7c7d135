// Package hami turns a claim's vGPU shares into the CDI edits that make
// HAMi-core (libvgpu.so, Project-HAMi/HAMi-core) enforce them inside the
// claim's containers. The contract it implements is
// docs/design/hami-core.md: the environment HAMi-core reads, the files it
// needs, and its pitfalls (quantity suffixes, octal, index order, one cache
// file per budget).
package hami

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/node/claimuid"
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
	// ContainerLockDir is HAMi-core's cross-process lock directory: a
	// build of HAMi-core that cannot open its lock file there at start
	// runs without the SM throttle and the context charge. Like HAMi's
	// device plugin, which mounts the host's /tmp/vgpulock into every
	// container (pkg/device-plugin/nvidiadevice/nvinternal/plugin), Facet
	// mounts one host directory, <StateDir>/vgpulock, into every share:
	// one node-wide lock.
	ContainerLockDir = "/tmp/vgpulock"
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
	// chart's hami-core DaemonSet, beside the plugin: package sharing
	// opens an Editor once it is there).
	LibraryPath string
	// StateDir is a host directory Facet owns: it holds the ld.so.preload
	// file and one cache directory per claim.
	StateDir string
	// LibrarySHA256, when set, is the SHA-256 (64 hex digits) the library
	// must have: the hash of the libvgpu.so an operator has vetted, since
	// it is preloaded into every tenant's container. Checked once, in
	// NewEditor: the file is written only by the DaemonSet's init
	// container, before the plugin starts.
	LibrarySHA256 string
}

// Editor builds and cleans up the HAMi-core part of claims' CDI specs.
type Editor struct {
	opts             Options
	preload, lockDir string
}

// NewEditor checks that libvgpu.so exists and writes the preload file the
// containers mount. A missing library is an error, not a silent fallback to
// unenforced shares.
func NewEditor(opts Options) (*Editor, error) {
	if st, err := os.Stat(opts.LibraryPath); err != nil || st.IsDir() {
		return nil, fmt.Errorf("HAMi-core library %s: not a file (%v); vGPU shares cannot be enforced", opts.LibraryPath, err)
	}
	if opts.LibrarySHA256 != "" {
		if err := checkSHA256(opts.LibraryPath, opts.LibrarySHA256); err != nil {
			return nil, fmt.Errorf("HAMi-core library %s: %w; it is not the library this node was set to preload into tenants' containers, so vGPU shares cannot be enforced", opts.LibraryPath, err)
		}
	}
	// The per-claim directories must be writable by any container user
	// (0777), so nothing but root on the host may reach them: their
	// parents are 0700, set explicitly because MkdirAll leaves an
	// existing directory's mode alone. The runtime bind-mounts each
	// claim's directory by its host path as root, which needs no search
	// permission for anyone else.
	for _, dir := range []string{opts.StateDir, filepath.Join(opts.StateDir, "claims")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("HAMi-core state directory: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("HAMi-core state directory: %w", err)
		}
	}
	preload := filepath.Join(opts.StateDir, "ld.so.preload")
	if err := os.WriteFile(preload, []byte(ContainerLibrary+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", preload, err)
	}
	// Sticky and world-writable, as /tmp: containers of any UID create
	// the lock file, none removes another's.
	lockDir := filepath.Join(opts.StateDir, "vgpulock")
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		return nil, fmt.Errorf("HAMi-core lock directory: %w", err)
	}
	if err := os.Chmod(lockDir, 0o777|os.ModeSticky); err != nil {
		return nil, fmt.Errorf("HAMi-core lock directory: %w", err)
	}
	return &Editor{opts: opts, preload: preload, lockDir: lockDir}, nil
}

// CacheDir is the host directory of a claim's accounting region. A UID
// that is not one safe path element has none.
func (e *Editor) CacheDir(claimUID types.UID) (string, error) {
	if err := claimuid.Validate(claimUID); err != nil {
		return "", err
	}
	return filepath.Join(e.opts.StateDir, "claims", string(claimUID)), nil
}

// Edits returns the claim-wide edits for its shares: per-device limits,
// the claim's own accounting region (created fresh here), the library and
// the preload file, and the knobs of cfg. With enforcement disabled it
// returns nil: the shares are scheduled but not enforced, as asked.
//
// Index n of CUDA_DEVICE_*_LIMIT_<n> is the position of the share's GPU
// among the claim's GPUs in PCI bus order, which is how the container
// enumerates them. Shares of one GPU in one claim are one GPU to the
// container, so they get one index and their sum. Containers that also see
// GPUs of another claim are not supported by HAMi-core's indexing: the
// plugin cannot tell which claims a container sees (see docs/guarantees.md).
func (e *Editor) Edits(claimUID types.UID, shares []Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	return e.edits(claimUID, shares, cfg, true)
}

// RebuildEdits is Edits for a claim prepared before, whose spec is being
// rebuilt: an existing accounting region is kept, because containers of
// the claim may be using it and its limits are the same.
func (e *Editor) RebuildEdits(claimUID types.UID, shares []Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	return e.edits(claimUID, shares, cfg, false)
}

func (e *Editor) edits(claimUID types.UID, shares []Share, cfg *configapi.VgpuConfig, fresh bool) (*cdispec.ContainerEdits, error) {
	if !cfg.EnforcementEnabled() {
		return nil, nil
	}
	for _, s := range shares {
		if s.MemoryBytes <= 0 || s.MemoryBytes%(1<<20) != 0 {
			return nil, fmt.Errorf("share on %s: memory %d bytes is not a positive whole number of MiB", s.Device, s.MemoryBytes)
		}
		if s.Cores < 0 || s.Cores > 100 {
			return nil, fmt.Errorf("share on %s: cores %d%% is outside 0-100", s.Device, s.Cores)
		}
	}
	ordered := perGPU(shares)

	cacheDir, err := e.CacheDir(claimUID)
	if err != nil {
		return nil, err
	}
	// A fresh region: the first process to create it fixes the limits, so
	// a stale file from an earlier claim would carry wrong ones.
	if fresh {
		if err := os.RemoveAll(cacheDir); err != nil {
			return nil, fmt.Errorf("reset HAMi-core cache %s: %w", cacheDir, err)
		}
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
			{HostPath: e.lockDir, ContainerPath: ContainerLockDir, Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}},
		},
	}
	for n, s := range ordered {
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

// perGPU orders shares by PCI bus ID and merges the shares of one GPU:
// memory adds up; SM time adds up to at most 100 %, and a best-effort
// share (0, no throttle) leaves the GPU unthrottled for the container.
func perGPU(shares []Share) []Share {
	ordered := append([]Share(nil), shares...)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].PCIBusID < ordered[j].PCIBusID })
	var out []Share
	for _, s := range ordered {
		if n := len(out); n > 0 && out[n-1].PCIBusID == s.PCIBusID {
			last := &out[n-1]
			last.MemoryBytes += s.MemoryBytes
			switch {
			case last.Cores == 0 || s.Cores == 0:
				last.Cores = 0
			default:
				last.Cores = min(100, last.Cores+s.Cores)
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

// Cleanup removes a claim's accounting region; a missing one is fine.
func (e *Editor) Cleanup(claimUID types.UID) error {
	dir, err := e.CacheDir(claimUID)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
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
		if en.IsDir() && claimuid.Validate(types.UID(en.Name())) == nil {
			uids = append(uids, types.UID(en.Name()))
		}
	}
	return uids, nil
}

// checkSHA256 compares a file's SHA-256 with want (hex, either case).
func checkSHA256(path, want string) error {
	if len(want) != sha256.Size*2 {
		return fmt.Errorf("the expected SHA-256 %q is not %d hex digits", want, sha256.Size*2)
	}
	if _, err := hex.DecodeString(want); err != nil {
		return fmt.Errorf("the expected SHA-256 %q is not hex", want)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, want) {
		return fmt.Errorf("SHA-256 %s, want %s", got, strings.ToLower(want))
	}
	return nil
}
