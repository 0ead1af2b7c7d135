package nodecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestNewProcess(t *testing.T) {
	dir := t.TempDir()
	host := func(p string) string { return filepath.Join(dir, p) }
	// libc.so.6 beside libcuda: the host's, which no container sees.
	for _, f := range []string{"driver/usr/lib/libcuda.so.580.1", "driver/usr/lib/libc.so.6", "hami/libvgpu.so", "dev/nvidia0", "hook"} {
		if err := os.MkdirAll(filepath.Dir(host(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(host(f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libcuda.so.580.1", host("driver/usr/lib/libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host("hami/ld.so.preload"), []byte("/usr/local/vgpu/libvgpu.so\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	libcuda := &cdispec.Mount{HostPath: host("driver/usr/lib/libcuda.so.580.1"), ContainerPath: "/usr/lib/libcuda.so.580.1"}
	hamiMounts := []*cdispec.Mount{
		{HostPath: host("hami/libvgpu.so"), ContainerPath: "/usr/local/vgpu/libvgpu.so"},
		{HostPath: host("hami/ld.so.preload"), ContainerPath: "/etc/ld.so.preload"},
		{HostPath: host("hami/claims/c1"), ContainerPath: "/usr/local/vgpu/claims/c1"},
	}
	for _, tc := range []struct {
		name        string
		spec        cdispec.Spec
		wantEnv     []string
		wantMissing []string
		wantHooks   []string
		wantErr     string
		nvmlIndex   map[string]int
	}{
		{
			name: "GPUs by NVML index in PCI order, as HAMi-core's atoi reads them",
			spec: cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{
				Env:    []string{"FACET_GPU_UUIDS=GPU-b,GPU-a"},
				Mounts: []*cdispec.Mount{libcuda},
			}},
			nvmlIndex: map[string]int{"GPU-a": 0, "GPU-b": 3},
			wantEnv:   []string{"FACET_GPU_UUIDS=GPU-b,GPU-a", "LD_LIBRARY_PATH=LIBDIR", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=3,0"},
		},
		{
			name: "a GPU of unknown index: UUIDs, as before",
			spec: cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{
				Env:    []string{"FACET_GPU_UUIDS=GPU-b,GPU-a"},
				Mounts: []*cdispec.Mount{libcuda},
			}},
			nvmlIndex: map[string]int{"GPU-a": 0},
			wantEnv:   []string{"FACET_GPU_UUIDS=GPU-b,GPU-a", "LD_LIBRARY_PATH=LIBDIR", "CUDA_VISIBLE_DEVICES=GPU-b,GPU-a"},
		},
		{
			name: "whole GPU",
			spec: cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{
				Env:         []string{"NVIDIA_VISIBLE_DEVICES=void", "FACET_GPU_UUIDS=GPU-a"},
				Mounts:      []*cdispec.Mount{libcuda},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", HostPath: host("dev/nvidia0")}},
				Hooks:       []*cdispec.Hook{{HookName: "createContainer", Path: host("hook")}},
			}},
			wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void", "FACET_GPU_UUIDS=GPU-a", "LD_LIBRARY_PATH=LIBDIR", "CUDA_VISIBLE_DEVICES=GPU-a"},
		},
		{
			name: "vGPU share: container paths become host paths, the preload list LD_PRELOAD",
			spec: cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{
				Env: []string{"FACET_GPU_UUIDS=GPU-a,GPU-b", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/c1/vgpu.cache",
					"CUDA_DEVICE_MEMORY_LIMIT_0=2000m", "LD_LIBRARY_PATH=/usr/local/vgpu:/opt/x"},
				Mounts: append([]*cdispec.Mount{libcuda}, hamiMounts...),
			}},
			wantEnv: []string{"FACET_GPU_UUIDS=GPU-a,GPU-b", "CUDA_DEVICE_MEMORY_SHARED_CACHE=" + host("hami/claims/c1/vgpu.cache"),
				"CUDA_DEVICE_MEMORY_LIMIT_0=2000m",
				// /usr/local/vgpu itself is no mount: kept; /opt/x too.
				"LD_LIBRARY_PATH=LIBDIR" + ":/usr/local/vgpu:/opt/x",
				"LD_PRELOAD=" + host("hami/libvgpu.so"), "CUDA_REDIRECT=" + host("hami/libvgpu.so"), "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"},
			// The claim's region is made by prepare; here it is not.
			wantMissing: []string{"mount source " + host("hami/claims/c1")},
		},
		{
			name: "a device's edits and the spec's own CUDA_VISIBLE_DEVICES",
			spec: cdispec.Spec{
				ContainerEdits: cdispec.ContainerEdits{Env: []string{"CUDA_VISIBLE_DEVICES=0", "FACET_GPU_UUIDS=GPU-a"}},
				Devices: []cdispec.Device{{Name: "d", ContainerEdits: cdispec.ContainerEdits{
					Mounts: []*cdispec.Mount{libcuda}, DeviceNodes: []*cdispec.DeviceNode{{Path: host("dev/nvidia9")}},
					Hooks: []*cdispec.Hook{{HookName: "createContainer", Path: "/usr/bin/no-such-hook"}}}}},
			},
			wantEnv:     []string{"CUDA_VISIBLE_DEVICES=0", "FACET_GPU_UUIDS=GPU-a", "LD_LIBRARY_PATH=LIBDIR"},
			wantMissing: []string{"device node " + host("dev/nvidia9")},
			wantHooks:   []string{"/usr/bin/no-such-hook"},
		},
		{
			name:    "no libcuda",
			spec:    cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}},
			wantErr: "mounts no libcuda.so",
		},
		{
			name: "unreadable preload list",
			spec: cdispec.Spec{ContainerEdits: cdispec.ContainerEdits{Mounts: []*cdispec.Mount{libcuda,
				{HostPath: host("missing/ld.so.preload"), ContainerPath: "/etc/ld.so.preload"}}}},
			wantErr: "the preload list the spec mounts at /etc/ld.so.preload",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProcess(&tc.spec, tc.nvmlIndex)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got, want := strings.Join(p.Env, "\n"), strings.ReplaceAll(strings.Join(tc.wantEnv, "\n"), "LIBDIR", p.LibDir); got != want {
				t.Errorf("env:\n%s\nwant:\n%s", got, want)
			}
			if got, want := strings.Join(p.Missing, "\n"), strings.Join(tc.wantMissing, "\n"); got != want {
				t.Errorf("missing:\n%s\nwant:\n%s", got, want)
			}
			if got, want := strings.Join(p.MissingHooks, "\n"), strings.Join(tc.wantHooks, "\n"); got != want {
				t.Errorf("missing hooks:\n%s\nwant:\n%s", got, want)
			}
			if p.LibCUDA != libcuda.HostPath {
				t.Errorf("libcuda %s, want %s", p.LibCUDA, libcuda.HostPath)
			}
			mounted := map[string]bool{}
			for _, m := range append(tc.spec.ContainerEdits.Mounts, libcuda) {
				mounted[m.HostPath] = true
			}
			var names []string
			entries, _ := os.ReadDir(p.LibDir)
			for _, en := range entries {
				names = append(names, en.Name())
				if target, _ := os.Readlink(filepath.Join(p.LibDir, en.Name())); !mounted[target] {
					t.Errorf("%s links to %s, not to a library the spec mounts", en.Name(), target)
				}
			}
			if got := strings.Join(names, " "); !strings.HasPrefix(got, "libcuda.so.1 libcuda.so.580.1") || strings.Contains(got, "libc.so.6") {
				t.Errorf("library directory holds %q, want libcuda.so.1 and libcuda.so.580.1 and no host libc", got)
			}
			dir := p.LibDir
			p.Close()
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("Close left %s (%v)", dir, err)
			}
		})
	}
}
