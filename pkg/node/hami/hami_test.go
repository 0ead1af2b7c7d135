package hami

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"k8s.io/utils/ptr"
)

func editor(t *testing.T) *Editor {
	t.Helper()
	dir := t.TempDir()
	lib := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := NewEditor(Options{LibraryPath: lib, StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEdits(t *testing.T) {
	disabled := configapi.NewVgpuConfig()
	disabled.Enforcement = ptr.To(configapi.EnforcementDisabled)
	force := configapi.NewVgpuConfig()
	force.CoreUtilizationPolicy = ptr.To(configapi.CoreUtilizationPolicy("force"))
	for _, tc := range []struct {
		name    string
		shares  []Share
		cfg     *configapi.VgpuConfig
		wantEnv []string // in order, after the cache path
		wantErr string
	}{
		{
			name:    "Volcano tutorial share: 20 % and 2000 MiB",
			shares:  []Share{{Device: "gpu-0", PCIBusID: "0000:1b:00.0", MemoryBytes: 2000 << 20, Cores: 20}},
			wantEnv: []string{"CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "CUDA_DEVICE_SM_LIMIT_0=20", "GPU_CORE_UTILIZATION_POLICY=default", "CUDA_TASK_PRIORITY=1", "LIBCUDA_LOG_LEVEL=2"},
		},
		{
			name: "two GPUs indexed in PCI order, not claim order",
			shares: []Share{
				{Device: "gpu-5", PCIBusID: "0000:c3:00.0", MemoryBytes: 8 << 30, Cores: 50},
				{Device: "gpu-1", PCIBusID: "0000:43:00.0", MemoryBytes: 4 << 30, Cores: 0},
			},
			cfg:     force,
			wantEnv: []string{"CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=0", "CUDA_DEVICE_MEMORY_LIMIT_1=8192m", "CUDA_DEVICE_SM_LIMIT_1=50", "GPU_CORE_UTILIZATION_POLICY=force", "CUDA_TASK_PRIORITY=1", "LIBCUDA_LOG_LEVEL=2"},
		},
		{name: "opt-out", shares: []Share{{Device: "gpu-0", MemoryBytes: 1 << 30, Cores: 10}}, cfg: disabled},
		{name: "memory not whole MiB", shares: []Share{{Device: "gpu-0", MemoryBytes: 1<<20 + 1, Cores: 10}}, wantErr: "share on gpu-0: memory 1048577 bytes is not a positive whole number of MiB"},
		{name: "cores over 100", shares: []Share{{Device: "gpu-2", MemoryBytes: 1 << 20, Cores: 101}}, wantErr: "share on gpu-2: cores 101% is outside 0-100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := editor(t)
			edits, err := e.Edits("uid-1", tc.shares, tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.cfg != nil && !tc.cfg.EnforcementEnabled() {
				if edits != nil {
					t.Fatalf("opt-out still enforced: %+v", edits)
				}
				return
			}
			if edits.Env[0] != "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/uid-1/vgpu.cache" {
				t.Errorf("cache env %q", edits.Env[0])
			}
			if !reflect.DeepEqual(edits.Env[1:], tc.wantEnv) {
				t.Errorf("env\n got %q\nwant %q", edits.Env[1:], tc.wantEnv)
			}
			var paths []string
			for _, m := range edits.Mounts {
				paths = append(paths, m.ContainerPath+":"+m.Options[0])
			}
			want := []string{"/usr/local/vgpu/libvgpu.so:ro", "/etc/ld.so.preload:ro", "/usr/local/vgpu/claims/uid-1:rw", "/tmp/vgpulock:rw"}
			if !reflect.DeepEqual(paths, want) {
				t.Errorf("mounts %v, want %v", paths, want)
			}
			st, err := os.Stat(cacheDir(e, "uid-1"))
			if err != nil || st.Mode().Perm() != 0o777 {
				t.Fatalf("cache dir: %v %v", st, err)
			}
			if st, err := os.Stat(edits.Mounts[3].HostPath); err != nil || st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
				t.Errorf("lock directory %s: %v %v, want a sticky 0777 directory any container UID can lock in", edits.Mounts[3].HostPath, st, err)
			}
			preload, _ := os.ReadFile(edits.Mounts[1].HostPath)
			if string(preload) != "/usr/local/vgpu/libvgpu.so\n" {
				t.Errorf("preload %q", preload)
			}
		})
	}
}

// A re-prepare must not inherit an old accounting region: HAMi-core's
// first process fixes the limits.
func TestCacheIsFreshAndCleaned(t *testing.T) {
	e := editor(t)
	shares := []Share{{Device: "gpu-0", MemoryBytes: 1 << 30, Cores: 25}}
	if _, err := e.Edits("uid-1", shares, nil); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(cacheDir(e, "uid-1"), CacheFileName)
	if err := os.WriteFile(stale, []byte("old limits"), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Edits("uid-1", shares, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("stale accounting region survived a re-prepare")
	}
	if err := e.Cleanup("uid-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cacheDir(e, "uid-1")); !os.IsNotExist(err) {
		t.Fatal("cache dir survived cleanup")
	}
}

func TestMissingLibraryIsAnError(t *testing.T) {
	_, err := NewEditor(Options{LibraryPath: "/nonexistent/libvgpu.so", StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "vGPU shares cannot be enforced") {
		t.Fatalf("got %v", err)
	}
}

// TestLibrarySHA256: with LibrarySHA256 set, only a library of that hash
// is served; another, or a malformed hash, is an error naming both.
func TestLibrarySHA256(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libvgpu.so")
	if err := os.WriteFile(lib, []byte("libvgpu"), 0o644); err != nil {
		t.Fatal(err)
	}
	// sha256("libvgpu")
	const good = "600b1db6d5cac9f1b6996fe9244bfbbc2de5b6e6bf07bd6c1d138cd4ee7c157f"
	for _, tc := range []struct {
		name, sha, want string
	}{
		{"unset", "", ""},
		{"the library's", strings.ToUpper(good), ""},
		{"another", strings.Repeat("ab", 32), "SHA-256 " + good + ", want " + strings.Repeat("ab", 32)},
		{"too short", "abc", `the expected SHA-256 "abc" is not 64 hex digits`},
		{"not hex", strings.Repeat("zz", 32), "is not hex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEditor(Options{LibraryPath: lib, LibrarySHA256: tc.sha, StateDir: t.TempDir()})
			if tc.want == "" {
				if err != nil || e == nil {
					t.Fatalf("got %v, %v", e, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "vGPU shares cannot be enforced") {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func cacheDir(e *Editor, uid string) string {
	dir, err := e.CacheDir(types.UID(uid))
	if err != nil {
		panic(err)
	}
	return dir
}

// TestModes: the 0777 claim directories sit below 0700 parents, even when
// the parents existed with looser modes (L2).
func TestModes(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(filepath.Join(state, "claims"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(state, "claims"), 0o777); err != nil {
		t.Fatal(err)
	}
	e, err := NewEditor(Options{LibraryPath: lib, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{state, filepath.Join(state, "claims")} {
		if st, _ := os.Stat(d); st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", d, st.Mode().Perm())
		}
	}
	if _, err := e.Edits("uid-1", []Share{{Device: "gpu-0", MemoryBytes: 1 << 30, Cores: 10}}, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(cacheDir(e, "uid-1")); st.Mode().Perm() != 0o777 {
		t.Errorf("claim dir mode %v", st.Mode().Perm())
	}
}

// TestBadUID: a claim UID that is not one safe path element never becomes
// a path that is created or removed recursively (L1).
func TestBadUID(t *testing.T) {
	e := editor(t)
	victim := filepath.Join(e.opts.StateDir, "keep")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []types.UID{"../keep", "..", "", "a/b"} {
		if err := e.Cleanup(uid); err == nil {
			t.Errorf("Cleanup(%q) accepted", uid)
		}
		if _, err := e.Edits(uid, []Share{{Device: "gpu-0", MemoryBytes: 1 << 20}}, nil); err == nil {
			t.Errorf("Edits(%q) accepted", uid)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatal("a directory outside the claims directory was removed")
	}
}

// TestTwoSharesOfOneGPU: the container sees one GPU, so two shares of it
// in one claim are one index with their sum, not _0 and _1 (M2b).
func TestTwoSharesOfOneGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shares []Share
		want   []string
	}{
		{"sum", []Share{
			{Device: "gpu-5", PCIBusID: "0000:c3:00.0", MemoryBytes: 2 << 30, Cores: 20},
			{Device: "gpu-1", PCIBusID: "0000:43:00.0", MemoryBytes: 1 << 30, Cores: 10},
			{Device: "gpu-5", PCIBusID: "0000:c3:00.0", MemoryBytes: 3 << 30, Cores: 30},
		}, []string{"CUDA_DEVICE_MEMORY_LIMIT_0=1024m", "CUDA_DEVICE_SM_LIMIT_0=10", "CUDA_DEVICE_MEMORY_LIMIT_1=5120m", "CUDA_DEVICE_SM_LIMIT_1=50"}},
		{"best effort stays unthrottled", []Share{
			{Device: "gpu-5", PCIBusID: "0000:c3:00.0", MemoryBytes: 2 << 30, Cores: 0},
			{Device: "gpu-5", PCIBusID: "0000:c3:00.0", MemoryBytes: 2 << 30, Cores: 30},
		}, []string{"CUDA_DEVICE_MEMORY_LIMIT_0=4096m", "CUDA_DEVICE_SM_LIMIT_0=0"}},
	} {
		edits, err := editor(t).Edits("uid-1", tc.shares, nil)
		if err != nil {
			t.Fatal(err)
		}
		var limits []string
		for _, env := range edits.Env {
			if strings.HasPrefix(env, "CUDA_DEVICE_MEMORY_LIMIT_") || strings.HasPrefix(env, "CUDA_DEVICE_SM_LIMIT_") {
				limits = append(limits, env)
			}
		}
		if !reflect.DeepEqual(limits, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, limits, tc.want)
		}
	}
}

// TestRebuildKeepsRegion: rebuilding a prepared claim's spec keeps the
// accounting region its running containers use.
func TestRebuildKeepsRegion(t *testing.T) {
	e := editor(t)
	shares := []Share{{Device: "gpu-0", MemoryBytes: 1 << 30, Cores: 10}}
	if _, err := e.Edits("uid-1", shares, nil); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(cacheDir(e, "uid-1"), CacheFileName)
	if err := os.WriteFile(live, []byte("in use"), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RebuildEdits("uid-1", shares, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatal("rebuild reset a live accounting region")
	}
	if _, err := e.Edits("uid-1", shares, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live); err == nil {
		t.Fatal("a fresh prepare kept a stale accounting region")
	}
}
