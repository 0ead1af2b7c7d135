package nodecheck

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

func TestIdleGPU(t *testing.T) {
	node := &nvmlgpu.Node{GPUs: []nvmlgpu.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}, {Index: 2, UUID: "GPU-c"}}}
	claim := func(name string, uuids ...string) *checkpoint.Claim {
		c := &checkpoint.Claim{Namespace: "ns", Name: name}
		for _, u := range uuids {
			c.Devices = append(c.Devices, checkpoint.Device{GPUUUID: u})
		}
		return c
	}
	migOn := &nvmlgpu.Node{GPUs: append([]nvmlgpu.GPU(nil), node.GPUs...)}
	migOn.GPUs[0].MIGEnabled = true
	for _, tc := range []struct {
		name    string
		node    *nvmlgpu.Node
		claims  []*checkpoint.Claim
		corrupt map[types.UID]error
		want    int
		wantErr []string
		noIdle  bool
	}{
		{name: "all idle", node: node, want: 0},
		{name: "first held", node: node, claims: []*checkpoint.Claim{claim("x", "GPU-a")}, want: 1},
		{name: "MIG mode on", node: migOn, claims: []*checkpoint.Claim{claim("x", "GPU-b")}, want: 2},
		{name: "every GPU busy", node: migOn, claims: []*checkpoint.Claim{claim("two-shares", "GPU-b", "GPU-b"), claim("y", "GPU-c"), claim("z", "GPU-c")},
			wantErr: []string{"no idle GPU", "GPU 0 has MIG mode on", "GPU 1 holds claim ns/two-shares;", "GPU 2 holds claim ns/y, ns/z"}, noIdle: true},
		{name: "no GPU", node: &nvmlgpu.Node{}, wantErr: []string{"the node has no GPU"}, noIdle: true},
		{name: "corrupt record", node: node, corrupt: map[types.UID]error{"u1": errors.New("bad checksum")},
			wantErr: []string{"cannot tell which GPUs are idle", "u1: bad checksum"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IdleGPU(tc.node, tc.claims, tc.corrupt)
			if len(tc.wantErr) == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("GPU %d, %v; want %d", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("GPU %d, want an error", got)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if errors.Is(err, ErrNoIdleGPU) != tc.noIdle {
				t.Errorf("errors.Is(ErrNoIdleGPU) = %v, want %v", !tc.noIdle, tc.noIdle)
			}
		})
	}
}
