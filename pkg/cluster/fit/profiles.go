package fit

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// RequestProfile is what one request of a ResourceClaim asks for: its
// DeviceClass and, where the devices it can get settle it, a MIG profile.
type RequestProfile struct {
	// Claim is the claim's "namespace/name".
	Claim string
	// Request is the request's name, or "request/subrequest" for a
	// subrequest of a firstAvailable list.
	Request string
	// DeviceClass is the DeviceClass the request names, as written (it
	// may not exist).
	DeviceClass string
	// MIGProfile is the MIG profile ("3g.40gb", the devices' profile
	// attribute) when every device of the cluster that matches the
	// class's and the request's selectors is a MIG device of that one
	// profile; "" when none matches, when they are of several profiles
	// or not all MIG devices, when the DeviceClass does not exist, or when
	// a selector fails on a device (the allocator then fails the claim,
	// and says so itself).
	MIGProfile string
}

// RequestProfiles lists, for each exact request of the claims and each
// subrequest of their firstAvailable lists (in claim and request order,
// as the explanations of Check walk them), its DeviceClass and the MIG
// profile it can only be served with. Every node's Facet devices count,
// free or held, tainted or not: the answer is what the request asks for,
// not whether it fits now. Selectors are CEL evaluated as the allocator
// does (with in.Features' consumable capacity). Only in.Slices,
// in.Classes and in.Features are read. The error is the occupancy model's
// (a Facet device without an index attribute).
func RequestProfiles(ctx context.Context, in Input, claims []*resourceapi.ResourceClaim) ([]RequestProfile, error) {
	// Claims are left out: who holds a device does not change what it is.
	occ, err := occupancy.Build(in.Slices, nil, "", nil)
	if err != nil {
		return nil, err
	}
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range in.Classes {
		classes[c.Name] = c
	}
	e := explainer{occ: occ, cache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: in.Features.ConsumableCapacity})}
	var devices []*occupancy.Device
	for _, n := range occ.Nodes() {
		devices = append(devices, occ.NodeDevices(n)...)
	}
	var out []RequestProfile
	for _, c := range claims {
		for _, r := range requestsOf(c) {
			p := RequestProfile{Claim: r.claim, Request: r.name, DeviceClass: r.req.DeviceClassName}
			if class, ok := classes[p.DeviceClass]; ok {
				p.MIGProfile = e.onlyProfile(ctx, class.Spec.Selectors, r.req.Selectors, devices)
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// onlyProfile is the MIG profile of every device that matches both sets
// of selectors, or "" (see RequestProfile.MIGProfile).
func (e explainer) onlyProfile(ctx context.Context, class, request []resourceapi.DeviceSelector, devices []*occupancy.Device) string {
	profile := ""
	for _, d := range devices {
		ok, err := e.matches(ctx, class, d)
		if err == nil && ok {
			ok, err = e.matches(ctx, request, d)
		}
		if err != nil {
			return ""
		}
		if !ok {
			continue
		}
		p := d.Attr(names.AttrProfile)
		// One device that is not a MIG instance of the profile seen so
		// far is enough to say the request is not for one profile.
		if d.Type != occupancy.TypeMIG || p == "" || (profile != "" && p != profile) {
			return ""
		}
		profile = p
	}
	return profile
}
