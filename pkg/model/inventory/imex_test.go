package inventory

import (
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestIMEXChannelOf: one IMEX channel device where the driver offers
// channels and every GPU reports the same fabric clique; none, with a
// note that says why, where the GPUs report a clique but no device can
// be; none, silently, outside a multi-node NVLink fabric.
func TestIMEXChannelOf(t *testing.T) {
	channels := &nvmlgpu.IMEXChannels{Major: 242, Count: 2048}
	in := func(cluster string, clique uint32) *nvmlgpu.Fabric {
		return &nvmlgpu.Fabric{ClusterUUID: cluster, CliqueID: clique}
	}
	gpus := func(fabrics ...*nvmlgpu.Fabric) []nvmlgpu.GPU {
		out := make([]nvmlgpu.GPU, len(fabrics))
		for i, f := range fabrics {
			out[i] = nvmlgpu.GPU{Index: i, Fabric: f}
		}
		return out
	}
	const u = "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b"
	for _, tc := range []struct {
		name       string
		gpus       []nvmlgpu.GPU
		channels   *nvmlgpu.IMEXChannels
		wantClique string
		wantNote   string
	}{
		{"four GPUs of one clique", gpus(in(u, 1), in(u, 1), in(u, 1), in(u, 1)), channels, u + ".1", ""},
		{"no fabric", gpus(nil, nil), channels, "", ""},
		{"no GPUs", nil, channels, "", ""},
		{"no channels from the driver", gpus(in(u, 1), in(u, 1)), nil, "", "the GPUs are in fabric clique " + u + ".1, but the driver registers no nvidia-caps-imex-channels major"},
		{"two cliques", gpus(in(u, 1), in(u, 2)), channels, "", "the GPUs do not all report one fabric clique (GPU 0: " + u + ".1, GPU 1: " + u + ".2)"},
		{"a GPU not registered yet", gpus(nil, in(u, 1)), channels, "", "(GPU 0: none, GPU 1: " + u + ".1)"},
		{"another cluster", gpus(in(u, 1), in("0e0e0e0e-0000-4000-8000-000000000001", 1)), channels, "", "do not all report one fabric clique"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, note := IMEXChannelOf(tc.gpus, tc.channels)
			if tc.wantClique == "" {
				if got != nil {
					t.Errorf("channel device %+v, want none", got)
				}
			} else if got == nil || got.Clique() != tc.wantClique || got.Major != 242 || got.Count != 2048 {
				t.Errorf("channel device %+v, want clique %s with the driver's channels", got, tc.wantClique)
			}
			if (tc.wantNote == "") != (note == "") || !strings.Contains(note, tc.wantNote) {
				t.Errorf("note %q, want %q", note, tc.wantNote)
			}
		})
	}
}
