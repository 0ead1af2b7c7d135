package webhook

// Existing MIG instances first: the one home of the prioritized list that
// asks for a MIG device with an instance that exists first, then a carve on
// a GPU already in MIG use, then any carve (docs/admins.md, "Existing MIG
// instances first"; demo/mig/prefer-existing.yaml writes it by hand). The
// pod mutator writes its MIG templates so (templateFor), and the claim
// mutator (mutateclaims.go) rewrites plain MIG requests of claims and
// templates into it.

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// migPreferences are the subrequests of the existing-first list, in order:
// each adds its CEL to the request's selectors (none for the last).
var migPreferences = []struct{ name, cel string }{
	{"existing", fmt.Sprintf("device.attributes[%q].%s == %q", names.Driver, names.AttrMode, names.ModeStaticMIG)},
	{"split", fmt.Sprintf("device.attributes[%q].%s in [%q, %q] && device.attributes[%q].%s", names.Driver, names.AttrMode, names.ModeMIG, names.ModeDynamic, names.Driver, names.AttrMIGInUse)},
	{"carved", ""},
}

// migPreferenceNames is "existing, split, carved", for messages.
func migPreferenceNames() string {
	n := make([]string, len(migPreferences))
	for i, p := range migPreferences {
		n[i] = p.name
	}
	return strings.Join(n, ", ")
}

// subrequestFields are the fields of an `exactly` request that a
// firstAvailable subrequest has too, with the same meaning
// (resource.k8s.io/v1 ExactDeviceRequest and DeviceSubRequest, Kubernetes
// 1.35 to 1.37; derivedAttributes is 1.37's). A request with any other
// field (adminAccess true, or one of a later Kubernetes) is left as
// written: copying it into a subrequest would drop or misplace it.
var subrequestFields = map[string]bool{
	"deviceClassName": true, "selectors": true, "allocationMode": true, "count": true,
	"tolerations": true, "capacity": true, "derivedAttributes": true,
}

// isMIGClass says whether a DeviceClass name is one of Facet's MIG classes:
// mig.facet.dev or mig-<profile>.facet.dev (deployments/deviceclasses.yaml).
func isMIGClass(class string) bool {
	return class == "mig.facet.dev" || (strings.HasPrefix(class, "mig-") && strings.HasSuffix(class, ".facet.dev"))
}

// existingFirst returns the firstAvailable subrequests (JSON objects) that
// ask for what exactly, an `exactly` request as a JSON object, asks for,
// one per migPreferences: each a copy of exactly's fields with its name
// and its CEL added to the selectors. The error says why exactly cannot be
// written so: allocationMode All (a subrequest of "all static instances"
// would mean something else), adminAccess, or a field that subrequests do
// not have.
func existingFirst(exactly map[string]any) ([]any, error) {
	if mode, ok := exactly["allocationMode"]; ok && mode != string(resourceapi.DeviceAllocationModeExactCount) {
		return nil, fmt.Errorf("allocationMode %v: only ExactCount requests are written as a prioritized list", mode)
	}
	var unknown []string
	for k, v := range exactly {
		if k == "adminAccess" && v == false {
			continue
		}
		if !subrequestFields[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("it sets %s, which a subrequest of firstAvailable does not have", strings.Join(unknown, ", "))
	}
	var selectors []any
	if s, ok := exactly["selectors"]; ok && s != nil {
		if selectors, ok = s.([]any); !ok {
			return nil, fmt.Errorf("selectors is a %T, not a list", s)
		}
	}
	subs := make([]any, 0, len(migPreferences))
	for _, p := range migPreferences {
		sub := make(map[string]any, len(exactly)+1)
		for k, v := range exactly {
			if k != "adminAccess" {
				sub[k] = v
			}
		}
		sub["name"] = p.name
		sels := append([]any(nil), selectors...)
		if p.cel != "" {
			sels = append(sels, map[string]any{"cel": map[string]any{"expression": p.cel}})
		}
		if len(sels) > 0 {
			sub["selectors"] = sels
		} else {
			delete(sub, "selectors")
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// existingFirstRequest is req, a typed `exactly` request, written as the
// existing-first list under name.
func existingFirstRequest(name string, req resourceapi.ExactDeviceRequest) (resourceapi.DeviceRequest, error) {
	var exactly map[string]any
	data, err := json.Marshal(req)
	if err == nil {
		err = json.Unmarshal(data, &exactly)
	}
	if err != nil {
		return resourceapi.DeviceRequest{}, err
	}
	subs, err := existingFirst(exactly)
	if err != nil {
		return resourceapi.DeviceRequest{}, err
	}
	out := resourceapi.DeviceRequest{Name: name}
	if data, err = json.Marshal(subs); err == nil {
		err = json.Unmarshal(data, &out.FirstAvailable)
	}
	return out, err
}
