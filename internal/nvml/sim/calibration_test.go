package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// measuredProfile is one row of a measured card's MIG table
// (../shared/hardware/*.md): memory in MiB as NVML reports it.
type measuredProfile struct {
	name                    string
	memMiB                  uint64
	sms                     int
	ce, dec, jpeg, enc, ofa int
	placements              []nvmlgpu.Placement
}

func pls(size int, starts ...int) []nvmlgpu.Placement {
	var out []nvmlgpu.Placement
	for _, s := range starts {
		out = append(out, nvmlgpu.Placement{Start: s, Size: size})
	}
	return out
}

// measuredCard is what was read on a real card.
type measuredCard struct {
	model, product, cc         string
	totalMiB, usableMiB        uint64
	reservedMiB                uint64 // NVML v2 Reserved, whole MiB (floor)
	driverVersion, cudaVersion string
	profiles                   []measuredProfile
}

// measuredCards transcribes ../shared/hardware/h100-80gb-hbm3.md and
// h200.md. The simulator must match them field by field: a difference is a
// simulator bug, not a reason to change this table.
var measuredCards = []measuredCard{
	{
		model: "H100-SXM5-80GB", product: "NVIDIA H100 80GB HBM3", cc: "9.0",
		totalMiB: 81559, reservedMiB: 480, usableMiB: 81079,
		driverVersion: "580.159.04", cudaVersion: "13.0",
		profiles: []measuredProfile{
			{"1g.10gb", 9984, 16, 1, 1, 1, 0, 0, pls(1, 0, 1, 2, 3, 4, 5, 6)},
			{"1g.10gb+me", 9984, 16, 1, 1, 1, 0, 1, pls(1, 0, 1, 2, 3, 4, 5, 6)},
			{"1g.20gb", 20096, 26, 1, 1, 1, 0, 0, pls(2, 0, 2, 4, 6)},
			{"2g.20gb", 20096, 32, 2, 2, 2, 0, 0, pls(2, 0, 2, 4)},
			{"3g.40gb", 40448, 60, 3, 3, 3, 0, 0, pls(4, 0, 4)},
			{"4g.40gb", 40448, 64, 4, 4, 4, 0, 0, pls(4, 0)},
			{"7g.80gb", 81152, 132, 8, 7, 7, 0, 1, pls(8, 0)},
		},
	},
	{
		model: "H200-141GB", product: "NVIDIA H200", cc: "9.0",
		totalMiB: 143771, reservedMiB: 615, usableMiB: 143155,
		driverVersion: "580.159.04", cudaVersion: "13.0",
		profiles: []measuredProfile{
			{"1g.18gb", 16384, 16, 1, 1, 1, 0, 0, pls(1, 0, 1, 2, 3, 4, 5, 6)},
			{"1g.18gb+me", 16384, 16, 1, 1, 1, 0, 1, pls(1, 0, 1, 2, 3, 4, 5, 6)},
			{"1g.35gb", 33280, 26, 1, 1, 1, 0, 0, pls(2, 0, 2, 4, 6)},
			{"2g.35gb", 33280, 32, 2, 2, 2, 0, 0, pls(2, 0, 2, 4)},
			{"3g.71gb", 71424, 60, 3, 3, 3, 0, 0, pls(4, 0, 4)},
			{"4g.71gb", 71424, 64, 4, 4, 4, 0, 0, pls(4, 0)},
			{"7g.141gb", 143360, 132, 8, 7, 7, 0, 1, pls(8, 0)},
		},
	},
}

func TestSimulatedCardsMatchMeasured(t *testing.T) {
	for _, card := range measuredCards {
		t.Run(card.model, func(t *testing.T) {
			m := &Machine{Name: "calibration", DriverVersion: card.driverVersion, CUDADriverVersion: card.cudaVersion,
				GPUs: []MachineGPU{{Model: card.model}}}
			srv, node := discoverSimulated(t, m)
			g := node.GPUs[0]
			for _, f := range []struct {
				field     string
				got, want any
			}{
				{"product name", g.ProductName, card.product},
				{"compute capability", g.CUDAComputeCapability, card.cc},
				{"total MiB", g.TotalMemoryBytes >> 20, card.totalMiB},
				{"reserved MiB", g.ReservedMemoryBytes >> 20, card.reservedMiB},
				{"usable MiB (published)", g.MemoryBytes >> 20, card.usableMiB},
				{"usable is whole MiB", g.MemoryBytes % (1 << 20), uint64(0)},
				{"memory source", g.MemorySource, nvmlgpu.MemorySourceV2},
				{"profiles", len(g.MIGProfiles), len(card.profiles)},
			} {
				if f.got != f.want {
					t.Errorf("%s: simulated %v, measured %v", f.field, f.got, f.want)
				}
			}
			// What CUDA would see on the idle card: v1 free.
			v1, _ := srv.Devices[0].(*server.Device).GetMemoryInfo()
			if v1.Free>>20 != card.usableMiB || v1.Total>>20 != card.totalMiB {
				t.Errorf("memory info v1: total %d MiB free %d MiB, measured %d and %d", v1.Total>>20, v1.Free>>20, card.totalMiB, card.usableMiB)
			}
			byName := map[string]nvmlgpu.MIGProfile{}
			for _, p := range g.MIGProfiles {
				byName[p.Name] = p
			}
			for _, want := range card.profiles {
				p, ok := byName[want.name]
				if !ok {
					t.Errorf("%s: not published (have %v)", want.name, names(g.MIGProfiles))
					continue
				}
				for _, f := range []struct {
					field     string
					got, want any
				}{
					{"memory MiB", p.MemoryBytes >> 20, want.memMiB},
					{"multiprocessors", p.Multiprocessors, want.sms},
					{"copy engines", p.CopyEngines, want.ce},
					{"decoders", p.Decoders, want.dec},
					{"JPEG", p.JPEGs, want.jpeg},
					{"encoders", p.Encoders, want.enc},
					{"OFA", p.OFAs, want.ofa},
					{"placements", len(p.Placements), len(want.placements)},
				} {
					if f.got != f.want {
						t.Errorf("%s %s: simulated %v, measured %v", want.name, f.field, f.got, f.want)
					}
				}
				for i := range min(len(p.Placements), len(want.placements)) {
					if p.Placements[i] != want.placements[i] {
						t.Errorf("%s placements: simulated %v, measured %v", want.name, p.Placements, want.placements)
						break
					}
				}
			}
		})
	}
}

func names(ps []nvmlgpu.MIGProfile) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// TestMemoryFallsBackToV1Total: a driver without memory info v2 gets v1's
// total published, and says so in MemorySource; any other v2 error fails
// discovery rather than guessing.
func TestMemoryFallsBackToV1Total(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ret     nvml.Return
		wantErr bool
		driver  string
	}{
		{name: "not supported", ret: nvml.ERROR_NOT_SUPPORTED},
		{name: "function not found", ret: nvml.ERROR_FUNCTION_NOT_FOUND},
		{name: "unknown error", ret: nvml.ERROR_UNKNOWN, wantErr: true},
		// A driver before R510 has no nvmlDeviceGetMemoryInfo_v2 at all:
		// the simulated one panics if it is called, as the real loader
		// ends the process.
		{name: "R470, no v2 symbol", driver: "470.256.02"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Machine{Name: "old-driver", DriverVersion: "580.159.04", CUDADriverVersion: "13.0",
				GPUs: []MachineGPU{{Model: "H100-SXM5-80GB"}}}
			if tc.driver != "" {
				m.DriverVersion, m.CUDADriverVersion = tc.driver, "11.4"
			}
			lib, srv, err := openSimulated(m)
			if err != nil {
				t.Fatal(err)
			}
			defer lib.Close()
			if tc.driver == "" {
				srv.Devices[0].(*server.Device).GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
					return nvml.Memory_v2{}, tc.ret
				}
			}
			node, err := lib.Discover()
			if tc.wantErr {
				if err == nil {
					t.Fatalf("discovered %+v, want an error", node.GPUs[0])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g := node.GPUs[0]
			if g.MemorySource != nvmlgpu.MemorySourceV1Total || g.MemoryBytes != 81559<<20 || g.ReservedMemoryBytes != 0 {
				t.Errorf("memory %d bytes, reserved %d, source %s; want v1's 81559 MiB", g.MemoryBytes, g.ReservedMemoryBytes, g.MemorySource)
			}
			// MIG profile names derive from the total either way.
			if g.MIGProfiles[0].Name != "1g.10gb" {
				t.Errorf("smallest MIG profile %q", g.MIGProfiles[0].Name)
			}
		})
	}
}

// TestDriverBranches: a driver older than R470 is refused with the branch
// Facet needs; each NVML function newer than R470 is missing from a
// simulated driver before its branch and present from it on.
func TestDriverBranches(t *testing.T) {
	open := func(t *testing.T, driver string) (*nvmlgpu.Library, *server.Server) {
		m := &Machine{Name: "branch", DriverVersion: driver, CUDADriverVersion: "11.4", GPUs: []MachineGPU{{Model: "A100-SXM4-40GB"}}}
		lib, srv, err := openSimulated(m)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lib.Close() })
		return lib, srv
	}
	lib, _ := open(t, "460.106.00")
	if _, err := lib.Discover(); err == nil || !strings.Contains(err.Error(), "R470") {
		t.Errorf("R460: error %v, want one naming R470", err)
	}
	for name, first := range nvmlgpu.NewerSymbols {
		for _, branch := range []int{nvmlgpu.OldestSupportedDriver, first - 1, first} {
			_, srv := open(t, fmt.Sprintf("%d.10.01", branch))
			if got, want := nvmlgpu.HasSymbol(srv, name), branch >= first; got != want {
				t.Errorf("R%d: HasSymbol(%s) = %v, want %v", branch, name, got, want)
			}
		}
	}
}

// TestEveryModelSaysWhereReservedComesFrom: each model reserves some but
// not all of its memory, and says where the figure comes from; only the
// measured cards may claim a measurement.
func TestEveryModelSaysWhereReservedComesFrom(t *testing.T) {
	measured := map[string]bool{}
	for _, c := range measuredCards {
		measured[c.model] = true
	}
	for _, name := range Models() {
		m := models[name]
		if m.ReservedBytes == 0 || m.ReservedBytes >= m.MemoryMB<<20 {
			t.Errorf("%s: reserves %d of %d MiB", name, m.ReservedBytes>>20, m.MemoryMB)
		}
		wantPrefix := "estimate: "
		if measured[name] {
			wantPrefix = "measured: "
		}
		if !strings.HasPrefix(m.ReservedSource, wantPrefix) {
			t.Errorf("%s: reserved memory's source %q, want it to start with %q", name, m.ReservedSource, wantPrefix)
		}
	}
}

// TestMIGCapFilesMatchTheH200: the simulated driver's MIG capability files
// are what a real H200 (driver 580.159.04, MIG off) showed on 2026-11-27,
// and Facet's reader takes nvidia-caps, not nvidia-caps-imex-channels, for
// the major.
func TestMIGCapFilesMatchTheH200(t *testing.T) {
	minors := strings.Split(strings.TrimSpace(string(migMinorsFile())), "\n")
	if len(minors) != 4322 {
		t.Errorf("mig-minors has %d lines; the H200's had 4322", len(minors))
	}
	// Lines as the H200 listed them (line number: text).
	for n, want := range map[int]string{
		1: "config 1", 2: "monitor 2", 3: "gpu0/gi0/access 3", 4: "gpu0/gi0/ci0/access 4",
		11: "gpu0/gi0/ci7/access 11", 12: "gpu0/gi1/access 12",
		129: "gpu0/gi14/access 129", 130: "gpu0/gi14/ci0/access 130", 131: "gpu0/gi14/ci1/access 131",
	} {
		if got := minors[n-1]; got != want {
			t.Errorf("mig-minors line %d: %q, the H200's %q", n, got, want)
		}
	}
	files := capAccessFiles([]int{0})
	for path, want := range map[string]string{
		"mig/config":  "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
		"mig/monitor": "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
	} {
		if got := string(files[path]); got != want {
			t.Errorf("%s: %q, the H200's %q", path, got, want)
		}
	}
	root := t.TempDir()
	for path, data := range map[string][]byte{"devices": procDevicesFile(), "driver/nvidia-caps/mig-minors": migMinorsFile()} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range files {
		p := filepath.Join(root, "driver/nvidia/capabilities", path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gi, ci, err := nvmlgpu.ReadMIGCapDevices(root, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gi.Major != simCapsMajor || gi.Minor != 12 || ci.Minor != 13 {
		t.Errorf("gpu0/gi1/ci0: major %d minors %d, %d; want major %d (nvidia-caps), minors 12 and 13 as on the H200", gi.Major, gi.Minor, ci.Minor, simCapsMajor)
	}
}
