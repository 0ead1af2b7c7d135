package resourceslices

import (
	"fmt"
	"io"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/yamlstream"
)

// WriteYAML prints slices as a YAML stream separated by "---", with a
// comment above each counter-only slice that says why it has no devices
// when explain is true (pkg/model/yamlstream).
func WriteYAML(w io.Writer, objs []*resourceapi.ResourceSlice, explain bool) error {
	docs := make([]yamlstream.Doc, 0, len(objs))
	for _, o := range objs {
		d := yamlstream.Doc{Object: o, Name: "ResourceSlice " + o.Name}
		if explain && CounterOnly(o) {
			d.Comment = ExplainCounterOnly(o)
		}
		docs = append(docs, d)
	}
	return yamlstream.Write(w, docs)
}

// CounterOnly reports whether a slice publishes counter sets and no
// devices. The API keeps counter sets and the devices that consume them in
// separate slices of one pool, so every node with GPUs in mig mode (or any
// mode with counters) has one; `kubectl get resourceslices` shows it with
// DEVICES <none>, which looks like a fault to a newcomer.
func CounterOnly(s *resourceapi.ResourceSlice) bool {
	return len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) == 0
}

// ExplainCounterOnly says in one sentence why a counter-only slice has no
// devices, naming its counter sets.
func ExplainCounterOnly(s *resourceapi.ResourceSlice) string {
	sets := make([]string, 0, len(s.Spec.SharedCounters))
	for _, cs := range s.Spec.SharedCounters {
		sets = append(sets, cs.Name)
	}
	return fmt.Sprintf("counter-only slice: it has no devices (kubectl get resourceslices shows DEVICES <none>) because it holds the GPUs' counter sets (%s), "+
		"which the MIG, whole-GPU and vGPU devices in the pool's other slices consume, so that the scheduler never hands out the same part of a GPU twice",
		strings.Join(sets, ", "))
}
