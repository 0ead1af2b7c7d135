package sim

import (
	"os"
	"path/filepath"
	"testing"

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
