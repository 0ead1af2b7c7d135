package nodecheck

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// ErrNoIdleGPU: every GPU of the node holds a prepared claim or has MIG
// mode on, so none may be checked now. It is not a failure of the node.
var ErrNoIdleGPU = errors.New("no idle GPU to check")

// IdleGPU picks the GPU a check may take on a node whose plugin is
// running: the lowest NVML index with MIG mode off that no claim in the
// plugin's checkpoint holds (claims and corrupt as checkpoint.PeekAll
// returns them). A corrupt record may hold any GPU, so it is an error
// naming the record, not a guess. Where no GPU is idle the error wraps
// ErrNoIdleGPU and says what holds each one.
//
// Processes outside Facet's claims are not seen: NVML's process list is
// not read. A claim the plugin prepares after the pick shares the GPU
// with the check until it ends (docs/node-check.md).
func IdleGPU(node *nvmlgpu.Node, claims []*checkpoint.Claim, corrupt map[types.UID]error) (int, error) {
	if len(corrupt) > 0 {
		var names []string
		for uid, err := range corrupt {
			names = append(names, fmt.Sprintf("%s: %v", uid, err))
		}
		sort.Strings(names)
		return 0, fmt.Errorf("cannot tell which GPUs are idle: %d checkpoint records are unreadable, and their claims may hold any GPU: %s", len(names), strings.Join(names, "; "))
	}
	holders := map[string][]string{}
	for _, c := range claims {
		for _, d := range c.Devices {
			holders[d.GPUUUID] = append(holders[d.GPUUUID], c.Namespace+"/"+c.Name)
		}
	}
	var busy []string
	for _, g := range node.GPUs {
		switch {
		case g.MIGEnabled:
			busy = append(busy, fmt.Sprintf("GPU %d has MIG mode on", g.Index))
		case len(holders[g.UUID]) > 0:
			busy = append(busy, fmt.Sprintf("GPU %d holds claim %s", g.Index, strings.Join(slices.Compact(slices.Sorted(slices.Values(holders[g.UUID]))), ", ")))
		default:
			return g.Index, nil
		}
	}
	if len(node.GPUs) == 0 {
		return 0, fmt.Errorf("%w: the node has no GPU", ErrNoIdleGPU)
	}
	return 0, fmt.Errorf("%w: %s", ErrNoIdleGPU, strings.Join(busy, "; "))
}
