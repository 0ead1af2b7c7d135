package fit

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// explainer says why requests do not fit on a node, from the occupancy
// model: for each request, the devices that match its class and selectors
// (CEL evaluated as the allocator does) and why each GPU holding them
// cannot serve it. It reasons about one request at a time; when every
// request alone has free devices, it says so rather than guess which
// combination the allocator refused.
type explainer struct {
	occ     *occupancy.Cluster
	cluster *Cluster
	domains []v1alpha1.ComputeDomain
	// claims are the cluster's, for who holds a channel.
	claims []*resourceapi.ResourceClaim
	cache  *cel.Cache
}

// request is one exact request (or subrequest of a firstAvailable list).
type request struct {
	name  string
	claim string
	req   resourceapi.ExactDeviceRequest
	// channel is the claim's ComputeDomainChannelConfig, where it is a
	// ComputeDomain's channel claim.
	channel *v1alpha1.ComputeDomainChannelConfig
	ns      string
}

// requestsOf lists a claim's exact requests and the subrequests of its
// firstAvailable lists, each as an exact request named "request" or
// "request/subrequest".
func requestsOf(c *resourceapi.ResourceClaim) []request {
	ref := c.Namespace + "/" + c.Name
	channel := computedomain.ChannelConfigOf(c)
	var out []request
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, request{name: r.Name, claim: ref, req: *r.Exactly, channel: channel, ns: c.Namespace})
		}
		for _, sub := range r.FirstAvailable {
			out = append(out, request{name: r.Name + "/" + sub.Name, claim: ref, channel: channel, ns: c.Namespace, req: resourceapi.ExactDeviceRequest{
				DeviceClassName: sub.DeviceClassName, Selectors: sub.Selectors, AllocationMode: sub.AllocationMode,
				Count: sub.Count, Capacity: sub.Capacity,
			}})
		}
	}
	return out
}

func (e explainer) explain(ctx context.Context, node string, claims []*resourceapi.ResourceClaim) ([]string, error) {
	var reqs []request
	// matchAttr is each exact request's matchAttribute constraints (those
	// naming it alone, or all the claim's requests when it has one).
	matchAttr := map[string][]string{}
	for _, c := range claims {
		ref := c.Namespace + "/" + c.Name
		for _, con := range c.Spec.Devices.Constraints {
			if con.MatchAttribute == nil {
				continue
			}
			names := con.Requests
			if len(names) == 0 && len(c.Spec.Devices.Requests) == 1 {
				names = []string{c.Spec.Devices.Requests[0].Name}
			}
			if len(names) == 1 {
				matchAttr[ref+" "+names[0]] = append(matchAttr[ref+" "+names[0]], string(*con.MatchAttribute))
			}
		}
		reqs = append(reqs, requestsOf(c)...)
	}
	var out []string
	allFree := true
	for _, r := range reqs {
		why, free, freeDevs, err := e.request(ctx, node, r)
		if err != nil {
			return nil, err
		}
		allFree = allFree && free
		out = append(out, why...)
		if free {
			for _, attr := range matchAttr[r.claim+" "+r.name] {
				if line := alignment(r, attr, freeDevs); line != "" {
					out = append(out, line)
					allFree = false
				}
			}
		}
	}
	if allFree {
		out = append(out, "each request alone has free matching devices: the allocator refused them together (a constraint such as matchAttribute, or requests that compete for the same GPUs)")
	}
	return out, nil
}

// request explains one request; free says it has enough free candidates,
// freeDevs are those free candidates.
func (e explainer) request(ctx context.Context, node string, r request) (why []string, free bool, freeDevs []*occupancy.Device, err error) {
	prefix := fmt.Sprintf("%s request %s:", r.claim, r.name)
	class, err := e.cluster.Get(r.req.DeviceClassName)
	if err != nil {
		return []string{fmt.Sprintf("%s DeviceClass %s does not exist", prefix, r.req.DeviceClassName)}, false, nil, nil
	}
	var candidates []*occupancy.Device
	for _, d := range append(e.occ.NodeDevices(node), e.occ.NodeChannels(node)...) {
		ok, err := e.matches(ctx, class.Spec.Selectors, d)
		if err == nil && ok {
			ok, err = e.matches(ctx, r.req.Selectors, d)
		}
		if err != nil {
			return nil, false, nil, fmt.Errorf("%s device %s: %w", prefix, d.Device.Name, err)
		}
		if ok {
			candidates = append(candidates, d)
		}
	}
	if len(candidates) == 0 {
		why := []string{fmt.Sprintf("%s no device on the node matches DeviceClass %s and the request's selectors", prefix, class.Name)}
		if r.channel != nil || r.req.DeviceClassName == computedomain.DeviceClass {
			why = append(why, "  "+e.nodeChannel(node, r))
		}
		return why, false, nil, nil
	}
	need := int(r.req.Count)
	if r.req.AllocationMode == resourceapi.DeviceAllocationModeAll {
		need = len(candidates)
	}
	need = max(need, 1)
	if need > len(candidates) {
		// No eviction or wait helps: say so before who holds what.
		return []string{fmt.Sprintf("%s only %d device(s) on the node match DeviceClass %s and the request's selectors, need %d", prefix, len(candidates), class.Name, need)}, false, nil, nil
	}
	nfree := 0
	var reasons []string
	seen := map[string]bool{}
	tooSmall := 0
	for _, d := range candidates {
		reason, small := e.blocked(d, r.req)
		if reason == "" {
			nfree++
			freeDevs = append(freeDevs, d)
			continue
		}
		if small {
			tooSmall++
		}
		if !seen[reason] {
			seen[reason] = true
			reasons = append(reasons, reason)
		}
	}
	if nfree >= need {
		return nil, true, freeDevs, nil
	}
	head := fmt.Sprintf("%s %d of %d matching devices free, need %d", prefix, nfree, len(candidates), need)
	if nfree == 0 {
		head = fmt.Sprintf("%s none of the %d matching device(s) is free", prefix, len(candidates))
		if tooSmall == len(candidates) {
			head = fmt.Sprintf("%s none of the %d matching device(s) is large enough", prefix, len(candidates))
		}
	}
	out := []string{head}
	for _, reason := range reasons {
		out = append(out, "  "+reason)
	}
	return out, false, freeDevs, nil
}

// matches evaluates CEL selectors on a device, as the allocator does.
func (e explainer) matches(ctx context.Context, selectors []resourceapi.DeviceSelector, d *occupancy.Device) (bool, error) {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		res := e.cache.GetOrCompile(s.CEL.Expression)
		if res.Error != nil {
			return false, fmt.Errorf("selector %q: %w", s.CEL.Expression, res.Error)
		}
		ok, _, err := res.DeviceMatches(ctx, cel.Device{
			Driver: names.Driver, Attributes: d.Device.Attributes, Capacity: d.Device.Capacity,
			AllowMultipleAllocations: d.Device.AllowMultipleAllocations,
		})
		if err != nil {
			return false, fmt.Errorf("selector %q: %w", s.CEL.Expression, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// blocked says why a candidate device cannot serve the request now, at the
// level an operator acts on (the GPU, or the device where devices are held
// one by one); "" when it is free. tooSmall: it never can, however free.
func (e explainer) blocked(d *occupancy.Device, req resourceapi.ExactDeviceRequest) (why string, tooSmall bool) {
	if d.Type == occupancy.TypeIMEXChannel {
		if len(d.Holders) > 0 {
			return fmt.Sprintf("%s: held by %s%s (one channel claim of one ComputeDomain per node)", d.Device.Name, d.Holders[0], e.domainOf(d.Holders[0])), false
		}
		return "", false
	}
	g := d.GPU
	gpu := g.Name()
	switch d.Type {
	case occupancy.TypeSlot:
		if len(d.Holders) > 0 {
			return fmt.Sprintf("%s: held by %s", d.Device.Name, d.Holders[0]), false
		}
	case occupancy.TypeMIG:
		if g.Mode == names.ModeStaticMIG {
			if len(d.Holders) > 0 {
				return fmt.Sprintf("%s: held by %s", d.Device.Name, d.Holders[0]), false
			}
			return "", false
		}
		return e.migBlocked(d), false
	default:
		if g.Whole != nil {
			return fmt.Sprintf("%s: whole GPU held by %s", gpu, g.Whole), false
		}
		if len(g.MIG) > 0 {
			what := "the whole GPU needs every memory slice free"
			if d.Device.AllowMultipleAllocations != nil && *d.Device.AllowMultipleAllocations {
				what = "vGPU shares and MIG instances exclude each other on a GPU"
			}
			return fmt.Sprintf("%s: %d MIG instance(s) in use (%s); %s", gpu, len(g.MIG), claimList(g), what), false
		}
		if d.Device.AllowMultipleAllocations == nil || !*d.Device.AllowMultipleAllocations {
			if len(d.Holders) > 0 {
				return fmt.Sprintf("%s: whole GPU held by %s", gpu, d.Holders[0]), false
			}
			return "", false
		}
		return shareBlocked(d, req)
	}
	return "", false
}

// migBlocked explains a dynamic MIG placement (mig and dynamic mode) that
// cannot be carved, per GPU and profile so that all placements of one
// profile on one GPU give one line.
func (e explainer) migBlocked(d *occupancy.Device) string {
	g := d.GPU
	gpu := g.Name()
	profile := d.Attr("profile")
	if g.Whole != nil {
		return fmt.Sprintf("%s: whole GPU held by %s", gpu, g.Whole)
	}
	if len(g.Shares) > 0 {
		return fmt.Sprintf("%s: %d vGPU share(s) in use (%s); vGPU shares and MIG instances exclude each other on a GPU", gpu, len(g.Shares), claimList(g))
	}
	if strings.Contains(profile, "+me") {
		for _, m := range g.MIG {
			if strings.Contains(m.Profile, "+me") {
				return fmt.Sprintf("%s: the media extensions (one +me instance per GPU) are held by %s (%s)", gpu, m.Claim, m.Device)
			}
		}
	}
	p, ok := e.occ.Profile(g, profile)
	if !ok || g.MemorySlices == nil {
		// Without the product's MIG table the placement's size is unknown:
		// say what is known.
		if len(g.MIG) > 0 {
			return fmt.Sprintf("%s: %s overlaps MIG instances in use (%s)", gpu, profile, claimList(g))
		}
		return ""
	}
	start := d.IntAttr("placementStart")
	if free(g.MemorySlices, start, start+p.MemorySlices) {
		return ""
	}
	var places []string
	for _, name := range g.Devices {
		o, _ := e.occ.Device(g.Node, name)
		if o.Type == occupancy.TypeMIG && o.Attr("profile") == profile {
			s := o.IntAttr("placementStart")
			places = append(places, fmt.Sprintf("%d-%d", s, s+p.MemorySlices-1))
		}
	}
	nfree := g.FreeSlices()
	if nfree < p.MemorySlices {
		return fmt.Sprintf("%s: %d of %d memory slices free, need %d (%s)", gpu, nfree, len(g.MemorySlices), p.MemorySlices, profile)
	}
	return fmt.Sprintf("%s: %d of %d memory slices free, but none of %s's placements (slices %s) is free", gpu, nfree, len(g.MemorySlices), profile, strings.Join(places, ", "))
}

// free reports whether memory slices [from, to) are free.
func free(slices []string, from, to int) bool {
	if from < 0 || to > len(slices) {
		return false
	}
	for _, h := range slices[from:to] {
		if h != "" {
			return false
		}
	}
	return true
}

// shareBlocked compares a share request with what is left of the GPU. A
// request that names no capacity takes the device's default, all of it.
func shareBlocked(d *occupancy.Device, req resourceapi.ExactDeviceRequest) (why string, tooSmall bool) {
	g := d.GPU
	needMem, needCores := g.Memory.Total, int64(100)
	if req.Capacity != nil {
		if q, ok := req.Capacity.Requests["memory"]; ok {
			needMem = q.Value()
		}
		if q, ok := req.Capacity.Requests["cores"]; ok {
			needCores = q.Value()
		}
	}
	// Too small is not "not free": no eviction or wait makes room, so it
	// is said first and on its own.
	if needMem > g.Memory.Total {
		return fmt.Sprintf("%s: too small, %s of memory in all, need %s", g.Name(), gib(g.Memory.Total), gib(needMem)), true
	}
	if needCores > 100 {
		return fmt.Sprintf("%s: %d%% SM asked for, more than a whole GPU", g.Name(), needCores), true
	}
	var parts []string
	if needMem > g.Memory.Free() {
		parts = append(parts, fmt.Sprintf("%s of %s memory free, need %s", gib(g.Memory.Free()), gib(g.Memory.Total), gib(needMem)))
	}
	if needCores > g.Cores.Free() {
		parts = append(parts, fmt.Sprintf("%d%% SM free, need %d%%", g.Cores.Free(), needCores))
	}
	if len(parts) == 0 {
		return "", false
	}
	out := fmt.Sprintf("%s: %s", g.Name(), strings.Join(parts, "; "))
	if held := claimList(g); held != "" {
		out += " (held by " + held + ")"
	}
	return out, false
}

func claimList(g *occupancy.GPU) string {
	var s []string
	for _, c := range g.Claims() {
		s = append(s, c.String())
	}
	return strings.Join(s, ", ")
}

// gib formats bytes as GiB, to two decimals where needed.
func gib(b int64) string {
	v := float64(b) / (1 << 30)
	if v == float64(int64(v)) {
		return fmt.Sprintf("%dGi", int64(v))
	}
	return fmt.Sprintf("%.2fGi", v)
}

// alignment says why enough free devices still do not satisfy a request's
// matchAttribute on attr (a topology constraint such as
// gpu.facet.dev/nvlinkDomain): how many share each value, and that fewer
// than the request needs share any one. "" when some value has enough.
func alignment(r request, attr string, free []*occupancy.Device) string {
	need := max(int(r.req.Count), 1)
	key := strings.TrimPrefix(attr, names.Driver+"/")
	count := map[string]int{}
	var values []string
	without := 0
	for _, d := range free {
		v := d.Attr(key)
		if v == "" {
			if n := d.IntAttr(key); n >= 0 {
				v = fmt.Sprint(n)
			}
		}
		if v == "" {
			without++
			continue
		}
		if count[v] == 0 {
			values = append(values, v)
		}
		count[v]++
	}
	most := 0
	var groups []string
	for _, v := range values {
		most = max(most, count[v])
		groups = append(groups, fmt.Sprintf("%s: %d", v, count[v]))
	}
	if most >= need {
		return ""
	}
	line := fmt.Sprintf("%s request %s: %d matching devices are free, at most %d with one %s, need %d", r.claim, r.name, len(free), most, attr, need)
	if len(groups) > 0 {
		line += " (" + strings.Join(groups, ", ") + ")"
	}
	if without > 0 {
		line += fmt.Sprintf("; %d free without it", without)
	}
	return line
}
