package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestSimulatedIMEXChannels: the simulated driver's proc files describe
// its IMEX channels as a real driver's do, and Facet's readers take the
// channels' major for the channels and nvidia-caps' for MIG, though the
// channels' line comes first and begins with "nvidia-caps".
func TestSimulatedIMEXChannels(t *testing.T) {
	root := t.TempDir()
	for path, data := range map[string][]byte{
		"devices":                       procDevicesFile(),
		"driver/nvidia/params":          procParamsFile(),
		"driver/nvidia-caps/mig-minors": migMinorsFile(),
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), data, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range capAccessFiles([]int{0}) {
		p := filepath.Join(root, "driver/nvidia/capabilities", path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	c, err := nvmlgpu.ReadIMEXChannels(root)
	if err != nil {
		t.Fatal(err)
	}
	major, count := SimulatedIMEXChannels()
	if c == nil || c.Major != major || c.Count != count || c.CountFrom != filepath.Join(root, "driver/nvidia/params") {
		t.Fatalf("ReadIMEXChannels = %+v, want major %d and %d channels from the params file", c, major, count)
	}
	if major == simCapsMajor || major != 62 || count != nvmlgpu.DefaultIMEXChannelCount {
		t.Errorf("simulated channels: major %d (nvidia-caps %d), %d channels; want 62 and the driver's default", major, simCapsMajor, count)
	}
	gi, _, err := nvmlgpu.ReadMIGCapDevices(root, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gi.Major != simCapsMajor {
		t.Errorf("MIG capability major %d, want nvidia-caps' %d", gi.Major, simCapsMajor)
	}
}

// TestRackOfTrays: a GB200 NVL72-class rack is several copies of the tray's
// machine file, each with its own name (so its GPUs' UUIDs differ from the
// other trays') and the clique of its node group: one fabric cluster, two
// cliques here, each tray publishing its channel in its own clique.
func TestRackOfTrays(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "demo", "machines", "gb200-nvl72-tray.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	major, count := SimulatedIMEXChannels()
	channels := &nvmlgpu.IMEXChannels{Major: major, Count: count}
	uuids := map[string]string{}
	cliques := map[string][]string{}
	for i, clique := range []uint32{1, 1, 2, 2} {
		m, err := ParseMachine(data)
		if err != nil {
			t.Fatal(err)
		}
		m.Name = fmt.Sprintf("gb200-tray-%d", i)
		m.Fabric.CliqueID = clique
		for j := range m.GPUs {
			m.GPUs[j].UUID = "" // derived from the name again
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		node, err := DiscoverSimulated(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range node.GPUs {
			if other, dup := uuids[g.UUID]; dup {
				t.Errorf("%s GPU %d has %s's UUID %s", m.Name, g.Index, other, g.UUID)
			}
			uuids[g.UUID] = m.Name
		}
		ch, note := inventory.IMEXChannelOf(node.GPUs, channels)
		if ch == nil {
			t.Fatalf("%s: no channel: %s", m.Name, note)
		}
		cliques[ch.Clique()] = append(cliques[ch.Clique()], m.Name)
	}
	want := map[string][]string{
		"6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.1": {"gb200-tray-0", "gb200-tray-1"},
		"6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b.2": {"gb200-tray-2", "gb200-tray-3"},
	}
	if fmt.Sprint(cliques) != fmt.Sprint(want) || len(uuids) != 16 {
		t.Errorf("cliques %v, %d GPU UUIDs; want %v and 16", cliques, len(uuids), want)
	}
}
