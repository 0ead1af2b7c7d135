package v1alpha1

import (
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// entry is one decoded opaque config of this driver.
type entry struct {
	requests []string
	config   Config
	// where names the entry in errors: "devices.config[1] (from claim)".
	where string
}

// EffectiveVgpuConfig returns the VgpuConfig that applies to the devices
// allocated for request, given a claim's status.allocation.devices.config.
//
// request is a DeviceRequestAllocationResult.Request: a request name, or
// "<request>/<subrequest>" when a subrequest of firstAvailable was chosen.
// An entry applies when it lists no requests, lists request itself, or
// lists the main request of a subrequest.
//
// Every opaque entry whose driver is gpu.facet.dev is decoded, whichever
// request it is for, and one malformed entry makes the whole call fail: the
// error names its index and source, e.g.
// `devices.config[1] (from claim): VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive`.
// Entries of other drivers and non-opaque entries are ignored, as are
// GpuConfigs. The VgpuConfigs that apply are merged (Merge) with the class's
// entries before the claim's, so the claim wins, and in list order within
// each source; the result is defaulted. With no VgpuConfig, it is the
// defaults.
func EffectiveVgpuConfig(configs []resourceapi.DeviceAllocationConfiguration, request string) (*VgpuConfig, error) {
	entries, err := decodeConfigs(configs)
	if err != nil {
		return nil, err
	}
	var applicable []*VgpuConfig
	for _, e := range entries {
		if v, ok := e.config.(*VgpuConfig); ok && appliesTo(e.requests, request) {
			applicable = append(applicable, v)
		}
	}
	merged := Merge(applicable...)
	merged.Default()
	return merged, nil
}

// EffectiveGpuConfig is EffectiveVgpuConfig for whole GPUs and MIG devices.
// GpuConfig has no fields yet, so the result is always the defaulted empty
// config; calling it still refuses a claim with a malformed entry for this
// driver.
func EffectiveGpuConfig(configs []resourceapi.DeviceAllocationConfiguration, request string) (*GpuConfig, error) {
	if _, err := decodeConfigs(configs); err != nil {
		return nil, err
	}
	out := NewGpuConfig()
	out.Default()
	return out, nil
}

// EffectiveComputeDomainChannelConfig returns the ComputeDomainChannelConfig
// that applies to the device allocated for request (an IMEX channel), given
// a claim's status.allocation.devices.config, defaulted; nil, and no
// error, where none applies. request and which entries apply are as in
// EffectiveVgpuConfig, and so are the errors for a malformed entry of this
// driver.
//
// A channel config names one domain, so configs are not merged: where
// several apply, they must be equal once defaulted, or the claim fails,
// naming both, e.g. `devices.config[0] (from class) and devices.config[1]
// (from claim) both apply to request "channel" with different
// ComputeDomainChannelConfigs`. Other kinds are ignored here.
func EffectiveComputeDomainChannelConfig(configs []resourceapi.DeviceAllocationConfiguration, request string) (*ComputeDomainChannelConfig, error) {
	entries, err := decodeConfigs(configs)
	if err != nil {
		return nil, err
	}
	var out *ComputeDomainChannelConfig
	from := ""
	for _, e := range entries {
		c, ok := e.config.(*ComputeDomainChannelConfig)
		if !ok || !appliesTo(e.requests, request) {
			continue
		}
		c = c.DeepCopy()
		c.Default()
		if out != nil && *out != *c {
			return nil, fmt.Errorf("%s and %s both apply to request %q with different %ss", from, e.where, request, ComputeDomainChannelConfigKind)
		}
		out, from = c, e.where
	}
	return out, nil
}

// decodeConfigs decodes every opaque entry of this driver and returns them
// in order of increasing precedence: class entries, then claim entries, each
// in list order. The allocator already lists them that way; sorting here
// keeps precedence right whatever the order of the list.
func decodeConfigs(configs []resourceapi.DeviceAllocationConfiguration) ([]entry, error) {
	var class, claim []entry
	var errs []error
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != names.Driver {
			continue
		}
		var source string
		switch c.Source {
		case resourceapi.AllocationConfigSourceClass:
			source = "class"
		case resourceapi.AllocationConfigSourceClaim:
			source = "claim"
		default:
			errs = append(errs, fmt.Errorf("devices.config[%d]: source: Unsupported value: %q: supported values: %q, %q",
				i, c.Source, resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim))
			continue
		}
		cfg, err := decodeParameters(c.Opaque.Parameters.Raw, c.Opaque.Parameters.Object)
		if err != nil {
			errs = append(errs, fmt.Errorf("devices.config[%d] (from %s): %w", i, source, err))
			continue
		}
		e := entry{requests: c.Requests, config: cfg, where: fmt.Sprintf("devices.config[%d] (from %s)", i, source)}
		if source == "class" {
			class = append(class, e)
		} else {
			claim = append(claim, e)
		}
	}
	if len(errs) > 0 {
		return nil, utilerrors.NewAggregate(errs)
	}
	return append(class, claim...), nil
}

// decodeParameters decodes a RawExtension. Objects from the API server
// always carry Raw; an in-process object (tests, fakes) is encoded to JSON
// first, so that it goes through the same strict decoder.
func decodeParameters(raw []byte, obj interface{}) (Config, error) {
	if len(raw) == 0 && obj != nil {
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("parameters: %w", err)
		}
		raw = b
	}
	return Decode(raw)
}

// appliesTo reports whether a config restricted to requests applies to the
// allocation result of request ("<main>" or "<main>/<sub>"). No requests
// means every request; "<main>" covers all of its subrequests;
// "<main>/<sub>" covers only that subrequest.
func appliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	for _, r := range requests {
		if r == request {
			return true
		}
		if main, _, isSub := strings.Cut(request, "/"); isSub && r == main {
			return true
		}
	}
	return false
}
