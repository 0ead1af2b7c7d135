package sim

import (
	"fmt"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestDiscoverTopology discovers each topology machine file and checks what
// discovery makes of the simulated NVML and sysfs answers: the NVLink
// domains (which GPUs share one), bandwidth, PCIe switch, fabric, and the
// nvidia-smi topo -m matrix.
func TestDiscoverTopology(t *testing.T) {
	for _, tc := range []struct {
		machine string
		// domains groups GPU indices by NVLink domain ("-" for none).
		domains   string
		bandwidth int // GB/s per NVLinked GPU
		switches  []string
		fabric    string
		// matrix rows as facetctl topo prints the GPU-to-GPU part.
		matrix map[int]string
	}{
		{
			machine: "hgx-h100", domains: "a a a a a a a a", bandwidth: 900,
			switches: []string{"0000:16:00.0", "0000:16:00.0", "0000:36:00.0", "0000:36:00.0", "0000:96:00.0", "0000:96:00.0", "0000:b6:00.0", "0000:b6:00.0"},
			matrix: map[int]string{
				0: "X NV18 NV18 NV18 NV18 NV18 NV18 NV18",
				7: "NV18 NV18 NV18 NV18 NV18 NV18 NV18 X",
			},
		},
		{
			machine: "h100-nvl-pairs", domains: "a a b b", bandwidth: 600,
			switches: []string{"", "", "", ""},
			matrix: map[int]string{
				0: "X NV12 SYS SYS",
				1: "NV12 X SYS SYS",
				2: "SYS SYS X NV12",
			},
		},
		{
			machine: "l40s-8", domains: "- - - - - - - -", bandwidth: 0,
			switches: []string{"0000:16:00.0", "0000:16:00.0", "0000:36:00.0", "0000:36:00.0", "0000:96:00.0", "0000:96:00.0", "0000:b6:00.0", "0000:b6:00.0"},
			matrix: map[int]string{
				0: "X PIX NODE NODE SYS SYS SYS SYS",
				1: "PIX X NODE NODE SYS SYS SYS SYS",
				2: "NODE NODE X PIX SYS SYS SYS SYS",
				4: "SYS SYS SYS SYS X PIX NODE NODE",
			},
		},
		{
			machine: "gb200-nvl72-tray", domains: "a a a a", bandwidth: 1800,
			switches: []string{"", "", "", ""},
			fabric:   "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b/32766",
			matrix: map[int]string{
				0: "X NV18 NV18 NV18",
			},
		},
		{
			// A DGX H100's NVSwitches as an HGX's, on a PCIe layout
			// without switches.
			machine: "dgx-h100", domains: "a a a a a a a a", bandwidth: 900,
			switches: []string{"", "", "", "", "", "", "", ""},
			matrix: map[int]string{
				0: "X NV18 NV18 NV18 NV18 NV18 NV18 NV18",
				5: "NV18 NV18 NV18 NV18 NV18 X NV18 NV18",
			},
		},
	} {
		t.Run(tc.machine, func(t *testing.T) {
			_, node := discoverMachine(t, tc.machine)
			letters := map[string]string{}
			var doms, sw []string
			for _, g := range node.GPUs {
				d := "-"
				if g.NVLinkDomain != "" {
					if letters[g.NVLinkDomain] == "" {
						letters[g.NVLinkDomain] = string(rune('a' + len(letters)))
					}
					d = letters[g.NVLinkDomain]
					if !strings.HasPrefix(g.NVLinkDomain, "nvl-") || len(g.NVLinkDomain) != 20 {
						t.Errorf("GPU %d: domain %q is not nvl- and 16 hex digits", g.Index, g.NVLinkDomain)
					}
				}
				doms = append(doms, d)
				sw = append(sw, g.PCIeSwitch)
				wantBW := tc.bandwidth
				if d == "-" {
					wantBW = 0
				}
				if g.NVLinkBandwidthGBps != wantBW {
					t.Errorf("GPU %d: NVLink bandwidth %d GB/s, want %d", g.Index, g.NVLinkBandwidthGBps, wantBW)
				}
				fab := ""
				if g.Fabric != nil {
					fab = fmt.Sprintf("%s/%d", g.Fabric.ClusterUUID, g.Fabric.CliqueID)
				}
				if fab != tc.fabric {
					t.Errorf("GPU %d: fabric %q, want %q", g.Index, fab, tc.fabric)
				}
			}
			if got := strings.Join(doms, " "); got != tc.domains {
				t.Errorf("domains %q, want %q", got, tc.domains)
			}
			if got, want := strings.Join(sw, ","), strings.Join(tc.switches, ","); got != want {
				t.Errorf("PCIe switches %s, want %s", got, want)
			}
			for i, want := range tc.matrix {
				var row []string
				for j := range node.GPUs {
					row = append(row, cell(node, i, j))
				}
				if got := strings.Join(row, " "); got != want {
					t.Errorf("row %d: %q, want %q", i, got, want)
				}
			}
		})
	}
}

func cell(node *nvmlgpu.Node, i, j int) string {
	if i == j {
		return "X"
	}
	p := node.Pairs[i][j]
	if p.NVLinks > 0 {
		return fmt.Sprintf("NV%d", p.NVLinks)
	}
	return string(p.Ancestor)
}

// TestTopologyOnAnOldDriver: a driver before R525 lacks
// nvmlDeviceGetGpuFabricInfo; discovery does not call it (the simulated
// library would panic as the real one ends the process) and publishes no
// fabric, while NVLink still is.
func TestTopologyOnAnOldDriver(t *testing.T) {
	m, err := LoadMachine(machinePath("gb200-nvl72-tray"))
	if err != nil {
		t.Fatal(err)
	}
	m.DriverVersion = "520.61.05"
	srv, node := discoverSimulated(t, m)
	for _, g := range node.GPUs {
		if g.Fabric != nil {
			t.Errorf("GPU %d: fabric %+v on a driver without the call", g.Index, g.Fabric)
		}
		if g.NVLinkDomain == "" {
			t.Errorf("GPU %d: no NVLink domain", g.Index)
		}
	}
	if err := srv.LookupSymbol("nvmlDeviceGetGpuFabricInfo"); err == nil {
		t.Error("the simulated R520 has nvmlDeviceGetGpuFabricInfo")
	}
}

func TestMachineTopologyValidation(t *testing.T) {
	base := func() *Machine {
		return &Machine{Name: "m", DriverVersion: "580.159.04", CUDADriverVersion: "13.0",
			GPUs: []MachineGPU{{Model: "H100-NVL-94GB"}, {Model: "H100-NVL-94GB"}}}
	}
	for _, tc := range []struct {
		name    string
		edit    func(m *Machine)
		wantErr string
	}{
		{"valid bridge", func(m *Machine) { m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 12, Bridges: [][]int{{0, 1}}} }, ""},
		{"unknown version", func(m *Machine) { m.NVLink = &MachineNVLink{Version: "4.5", LinksPerGPU: 12, Bridges: [][]int{{0, 1}}} }, "nvlink.version"},
		{"too many links", func(m *Machine) { m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 37, Bridges: [][]int{{0, 1}}} }, "nvlink.linksPerGPU"},
		{"neither switches nor bridges", func(m *Machine) { m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 12} }, "not both nor neither"},
		{"bridge to no GPU", func(m *Machine) { m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 12, Bridges: [][]int{{0, 2}}} }, "no GPU 2"},
		{"GPU in two bridges", func(m *Machine) {
			m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 12, Bridges: [][]int{{0, 1}, {1, 0}}}
		}, "already in bridges[0]"},
		{"NVSwitch at a GPU's bus ID", func(m *Machine) {
			m.NVLink = &MachineNVLink{Version: "4.0", LinksPerGPU: 18, NVSwitches: []string{"0000:01:00.0"}}
		}, "is gpus[0]'s bus ID"},
		{"switch at a GPU's bus ID", func(m *Machine) { m.GPUs[1].PCIeSwitch = "0000:01:00.0" }, "gpus[1].pcieSwitch"},
		{"fabric without NVSwitches", func(m *Machine) {
			m.Fabric = &MachineFabric{ClusterUUID: "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b"}
		}, "needs nvlink.nvswitches"},
		{"zero cluster UUID", func(m *Machine) {
			m.NVLink = &MachineNVLink{Version: "5.0", LinksPerGPU: 18, NVSwitches: []string{"0010:01:00.0"}}
			m.Fabric = &MachineFabric{ClusterUUID: "00000000-0000-0000-0000-000000000000"}
		}, "fabric.clusterUUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.edit(m)
			err := m.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
