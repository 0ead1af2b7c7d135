package hami

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

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
			want := []string{"/usr/local/vgpu/libvgpu.so:ro", "/etc/ld.so.preload:ro", "/usr/local/vgpu/claims/uid-1:rw"}
			if !reflect.DeepEqual(paths, want) {
				t.Errorf("mounts %v, want %v", paths, want)
			}
			st, err := os.Stat(e.CacheDir("uid-1"))
			if err != nil || st.Mode().Perm() != 0o777 {
				t.Fatalf("cache dir: %v %v", st, err)
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
	stale := filepath.Join(e.CacheDir("uid-1"), CacheFileName)
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
	if _, err := os.Stat(e.CacheDir("uid-1")); !os.IsNotExist(err) {
		t.Fatal("cache dir survived cleanup")
	}
}

func TestMissingLibraryIsAnError(t *testing.T) {
	_, err := NewEditor(Options{LibraryPath: "/nonexistent/libvgpu.so", StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "vGPU shares cannot be enforced") {
		t.Fatalf("got %v", err)
	}
}
