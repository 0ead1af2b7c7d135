package webhook

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// ExtendedResourceMap is the table the pod mutator rewrites extended
// resources by. It is read from the file given by --extended-resource-map
// (YAML or JSON); DefaultExtendedResourceMap is used without one.
type ExtendedResourceMap struct {
	// Devices are extended resources that count whole devices of a class.
	Devices []DeviceMapping `json:"devices,omitempty"`
	// VGPUs are groups of extended resources that together describe N
	// vGPUs of a size (HAMi's and Volcano's). They are matched before
	// Devices, so that HAMi's nvidia.com/gpu, which counts vGPUs when
	// gpumem or gpucores is present, is not taken for whole GPUs.
	VGPUs []VGPUMapping `json:"vgpus,omitempty"`
}

// DeviceMapping maps `Resource: N` to a claim for N devices of
// DeviceClassName.
type DeviceMapping struct {
	// Resource is an extended resource name, or a prefix ending in "*"
	// (nvidia.com/mig-*) whose remainder replaces the "*" of
	// DeviceClassName: one entry covers every MIG profile, including
	// profiles added to the DeviceClasses later.
	Resource        string `json:"resource"`
	DeviceClassName string `json:"deviceClassName"`
}

// VGPUMapping maps Count: N (default 1) of a size to a claim for N devices
// of DeviceClassName whose capacity is at least that size. The size
// resources are optional; each one given adds a CEL selector.
type VGPUMapping struct {
	// Count is the number of vGPUs.
	Count string `json:"count"`
	// Memory is in MiB, compared with the device's capacity
	// gpu.facet.dev/memory.
	Memory string `json:"memory,omitempty"`
	// Cores is a percentage of the GPU's SMs, compared with the device's
	// capacity gpu.facet.dev/cores.
	Cores string `json:"cores,omitempty"`
	// MemoryPercentage is a percentage of the GPU's memory. A fixed-size
	// slot has no "percent of its GPU" to compare with, so such a pod is
	// refused unless MemoryPercentageSelector says how to select for it.
	MemoryPercentage string `json:"memoryPercentage,omitempty"`
	// MemoryPercentageSelector is a CEL expression in which "{percent}" is
	// replaced by the requested percentage.
	MemoryPercentageSelector string `json:"memoryPercentageSelector,omitempty"`
	// SizeRequired: the entry applies only when a size resource is present.
	// HAMi's count is nvidia.com/gpu, which alone means whole GPUs.
	SizeRequired    bool   `json:"sizeRequired,omitempty"`
	DeviceClassName string `json:"deviceClassName"`
}

// DefaultExtendedResourceMap is NVIDIA's device plugin (whole GPUs, MIG's
// mixed strategy), Volcano's vGPU device plugin and HAMi, mapped to Facet's
// DeviceClasses (deployments/deviceclasses.yaml) and the fixed-size vGPU
// slots of stock clusters.
func DefaultExtendedResourceMap() ExtendedResourceMap {
	return ExtendedResourceMap{
		Devices: []DeviceMapping{
			{Resource: "nvidia.com/gpu", DeviceClassName: "gpu.facet.dev"},
			// nvidia.com/mig-1g.10gb.me -> mig-1g.10gb.me.facet.dev: the
			// device plugin and Facet's classes both spell "+me" as ".me".
			{Resource: "nvidia.com/mig-*", DeviceClassName: "mig-*.facet.dev"},
		},
		VGPUs: []VGPUMapping{
			{
				Count:            "volcano.sh/vgpu-number",
				Memory:           "volcano.sh/vgpu-memory",
				Cores:            "volcano.sh/vgpu-cores",
				MemoryPercentage: "volcano.sh/vgpu-memory-percentage",
				DeviceClassName:  "vgpu-slot.facet.dev",
			},
			{
				Count:            "nvidia.com/gpu",
				Memory:           "nvidia.com/gpumem",
				Cores:            "nvidia.com/gpucores",
				MemoryPercentage: "nvidia.com/gpumem-percentage",
				SizeRequired:     true,
				DeviceClassName:  "vgpu-slot.facet.dev",
			},
		},
	}
}

// LoadExtendedResourceMap reads and checks a table file.
func LoadExtendedResourceMap(path string) (ExtendedResourceMap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ExtendedResourceMap{}, fmt.Errorf("extended resource map: %w", err)
	}
	var m ExtendedResourceMap
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return ExtendedResourceMap{}, fmt.Errorf("extended resource map %s: %w", path, err)
	}
	if err := m.Validate(); err != nil {
		return ExtendedResourceMap{}, fmt.Errorf("extended resource map %s: %w", path, err)
	}
	return m, nil
}

// Validate checks the table once, at start, so that a bad table stops the
// webhook instead of producing claims the API server refuses pod by pod.
func (m ExtendedResourceMap) Validate() error {
	var errs []error
	exact := map[string]string{} // resource name -> where it is used
	use := func(where, name string) {
		if name == "" {
			return
		}
		if prev, ok := exact[name]; ok {
			errs = append(errs, fmt.Errorf("%s: %s is already used by %s", where, name, prev))
			return
		}
		exact[name] = where
	}
	checkName := func(where, name string) {
		if !strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("%s: %q is not an extended resource name (domain/name)", where, name))
		}
	}
	checkClass := func(where, class string) {
		c := strings.Replace(class, "*", "x", 1)
		if class == "" {
			errs = append(errs, fmt.Errorf("%s: deviceClassName is required", where))
		} else if msgs := validation.IsDNS1123Subdomain(c); len(msgs) > 0 || strings.Count(class, "*") > 1 {
			errs = append(errs, fmt.Errorf("%s: deviceClassName %q is not a DeviceClass name (at most one \"*\"): %s", where, class, strings.Join(msgs, "; ")))
		}
	}
	// A vGPU entry with SizeRequired shares its count resource with a
	// device entry (HAMi's nvidia.com/gpu); all other names are used once.
	shared := map[string]bool{}
	for i, v := range m.VGPUs {
		where := fmt.Sprintf("vgpus[%d]", i)
		checkName(where+".count", v.Count)
		checkClass(where, v.DeviceClassName)
		if strings.Contains(v.DeviceClassName, "*") {
			errs = append(errs, fmt.Errorf("%s: deviceClassName %q: \"*\" is only for devices entries", where, v.DeviceClassName))
		}
		if v.Memory == "" && v.Cores == "" && v.MemoryPercentage == "" && v.SizeRequired {
			errs = append(errs, fmt.Errorf("%s: sizeRequired needs memory, cores or memoryPercentage", where))
		}
		if v.SizeRequired {
			shared[v.Count] = true
		} else {
			use(where+".count", v.Count)
		}
		for _, r := range []struct{ field, name string }{{"memory", v.Memory}, {"cores", v.Cores}, {"memoryPercentage", v.MemoryPercentage}} {
			if r.name != "" {
				checkName(where+"."+r.field, r.name)
				use(where+"."+r.field, r.name)
			}
		}
		if v.MemoryPercentageSelector != "" && !strings.Contains(v.MemoryPercentageSelector, "{percent}") {
			errs = append(errs, fmt.Errorf("%s: memoryPercentageSelector does not contain {percent}", where))
		}
	}
	var prefixes []string
	for i, d := range m.Devices {
		where := fmt.Sprintf("devices[%d]", i)
		checkName(where, d.Resource)
		checkClass(where, d.DeviceClassName)
		if prefix, ok := strings.CutSuffix(d.Resource, "*"); ok {
			if strings.Contains(prefix, "*") || strings.Count(d.DeviceClassName, "*") != 1 {
				errs = append(errs, fmt.Errorf("%s: a resource ending in \"*\" needs exactly one \"*\" in it and in deviceClassName", where))
			}
			prefixes = append(prefixes, prefix)
			continue
		}
		if strings.Contains(d.Resource, "*") || strings.Contains(d.DeviceClassName, "*") {
			errs = append(errs, fmt.Errorf("%s: \"*\" is only allowed at the end of resource, with one in deviceClassName", where))
		}
		if shared[d.Resource] {
			delete(shared, d.Resource)
			exact[d.Resource] = where
			continue
		}
		use(where, d.Resource)
	}
	for name, where := range exact {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				errs = append(errs, fmt.Errorf("%s: %s also matches the prefix %s*", where, name, p))
			}
		}
	}
	return errors.Join(errs...)
}

// names reports whether the table mentions name at all.
func (m ExtendedResourceMap) names(name corev1.ResourceName) bool {
	n := string(name)
	for _, v := range m.VGPUs {
		if n == v.Count || n == v.Memory || n == v.Cores || n == v.MemoryPercentage {
			return true
		}
	}
	_, _, ok := m.deviceClassFor(n)
	return ok
}

// allServed reports whether every resource of a container that the table
// names is in served (the scheduler serves it from a DeviceClass); false
// for a container that asks for none.
func (m ExtendedResourceMap) allServed(res corev1.ResourceRequirements, served map[corev1.ResourceName]string) bool {
	asked := false
	for _, list := range []corev1.ResourceList{res.Limits, res.Requests} {
		for n := range list {
			if !m.names(n) {
				continue
			}
			if _, ok := served[n]; !ok {
				return false
			}
			asked = true
		}
	}
	return asked
}

// servedBy reports whether the scheduler serves every resource of the
// shape from a DeviceClass. A vGPU shape with a size is not, unless a
// class names the size resource itself, which Facet's never do: a
// mapping counts devices.
func (s shape) servedBy(served map[corev1.ResourceName]string) bool {
	for _, n := range s.resources {
		if _, ok := served[n]; !ok {
			return false
		}
	}
	return len(s.resources) > 0
}

// deviceClassFor returns the device entry for name and the class it maps to.
func (m ExtendedResourceMap) deviceClassFor(name string) (DeviceMapping, string, bool) {
	for _, d := range m.Devices {
		if prefix, ok := strings.CutSuffix(d.Resource, "*"); ok {
			if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
				return d, strings.Replace(d.DeviceClassName, "*", rest, 1), true
			}
			continue
		}
		if name == d.Resource {
			return d, d.DeviceClassName, true
		}
	}
	return DeviceMapping{}, "", false
}

// shape is what one container asks for through one table entry: count
// devices of class, each matching every selector.
type shape struct {
	class     string
	count     int64
	selectors []string
	// resources are the container's resource names the shape replaces,
	// with their values, for the pod's annotation and the log.
	resources []corev1.ResourceName
	values    map[corev1.ResourceName]int64
	// memoryMiB and cores, when not zero, are the vGPU size asked for: the
	// template's VgpuConfig lowers the slot's HAMi-core limits to them, so
	// the container gets what the pod asked, not the whole slot.
	memoryMiB, cores int64
	// capacity is what a vGPU share's claim asks for (Kueue mode).
	capacity *resourceapi.CapacityRequirements
	// preferExisting writes the claim as MIG's prioritized list
	// (MutatorOptions.PreferExistingMIG).
	preferExisting bool
}

// containerError is a refusal that names the container and the resource.
func containerError(container string, name corev1.ResourceName, format string, args ...any) error {
	return fmt.Errorf("container %q: %s: %s", container, name, fmt.Sprintf(format, args...))
}

// amount returns the whole, consistent value of name in a container's
// limits and requests. The API server's defaulting copies limits into
// requests before admission, and validation would later refuse requests
// that differ from limits, but the refusal here names what to fix.
func amount(container string, res corev1.ResourceRequirements, name corev1.ResourceName) (int64, error) {
	lim, hasLim := res.Limits[name]
	req, hasReq := res.Requests[name]
	if hasLim && hasReq && lim.Cmp(req) != 0 {
		return 0, containerError(container, name, "requests (%s) differ from limits (%s); an extended resource must have equal requests and limits", req.String(), lim.String())
	}
	q := lim
	if !hasLim {
		q = req
	}
	v, ok := wholeValue(q)
	if !ok {
		return 0, containerError(container, name, "%s is not a whole number", q.String())
	}
	if v < 0 {
		return 0, containerError(container, name, "%s is negative", q.String())
	}
	return v, nil
}

func wholeValue(q resource.Quantity) (int64, bool) {
	v, ok := q.AsInt64()
	if ok {
		return v, true
	}
	// AsInt64 refuses some whole values in other scales, such as "1e3".
	if q.MilliValue()%1000 == 0 && q.CmpInt64(1<<53) < 0 {
		return q.MilliValue() / 1000, true
	}
	return 0, false
}

// shapes returns what one container's mapped extended resources become. It
// returns no shape for a container without any, and an error naming the
// container and the resource for one the table cannot map.
func (m ExtendedResourceMap) shapes(container string, res corev1.ResourceRequirements) ([]shape, error) {
	present := map[corev1.ResourceName]bool{}
	for n := range res.Limits {
		present[n] = true
	}
	for n := range res.Requests {
		present[n] = true
	}
	values := map[corev1.ResourceName]int64{}
	var errs []error
	for n := range present {
		if !m.names(n) {
			continue
		}
		v, err := amount(container, res, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		values[n] = v
	}
	if len(errs) > 0 {
		return nil, joinSorted(errs)
	}
	used := map[corev1.ResourceName]bool{}
	var out []shape
	for _, v := range m.VGPUs {
		s, ok, err := v.shape(container, values)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			for _, n := range s.resources {
				used[n] = true
			}
			out = append(out, s)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(values)) {
		if used[n] {
			continue
		}
		_, class, ok := m.deviceClassFor(string(n))
		if !ok {
			// A vGPU size resource whose entry did not apply.
			continue
		}
		if values[n] == 0 {
			// Asking for none of a resource fits any node, with or
			// without a device plugin: nothing to replace.
			continue
		}
		out = append(out, shape{class: class, count: values[n], resources: []corev1.ResourceName{n}, values: map[corev1.ResourceName]int64{n: values[n]}})
	}
	if len(errs) > 0 {
		return nil, joinSorted(errs)
	}
	return out, nil
}

func (v VGPUMapping) shape(container string, values map[corev1.ResourceName]int64) (shape, bool, error) {
	get := func(name string) (int64, bool) {
		if name == "" {
			return 0, false
		}
		x, ok := values[corev1.ResourceName(name)]
		return x, ok
	}
	count, hasCount := get(v.Count)
	mem, hasMem := get(v.Memory)
	cores, hasCores := get(v.Cores)
	pct, hasPct := get(v.MemoryPercentage)
	hasSize := hasMem || hasCores || hasPct
	if !hasSize && (!hasCount || v.SizeRequired) {
		return shape{}, false, nil
	}
	s := shape{class: v.DeviceClassName, count: 1, values: map[corev1.ResourceName]int64{}}
	for _, r := range []struct {
		name string
		has  bool
		val  int64
	}{{v.Count, hasCount, count}, {v.Memory, hasMem, mem}, {v.Cores, hasCores, cores}, {v.MemoryPercentage, hasPct, pct}} {
		if r.has {
			s.resources = append(s.resources, corev1.ResourceName(r.name))
			s.values[corev1.ResourceName(r.name)] = r.val
		}
	}
	sizeNames := func() string {
		var names []string
		for _, n := range s.resources {
			if string(n) != v.Count {
				names = append(names, string(n))
			}
		}
		return strings.Join(names, ", ")
	}
	if hasCount {
		if count == 0 {
			if !hasSize {
				// As for a device count of 0: asks for nothing.
				return shape{}, false, nil
			}
			return shape{}, false, containerError(container, corev1.ResourceName(v.Count), "is 0, but %s asks for a vGPU size; set it to the number of vGPUs", sizeNames())
		}
		s.count = count
	}
	if hasMem && hasPct {
		return shape{}, false, containerError(container, corev1.ResourceName(v.MemoryPercentage), "conflicts with %s; give the memory once, in MiB", v.Memory)
	}
	if hasMem && mem > 0 {
		s.selectors = append(s.selectors, fmt.Sprintf(`device.capacity[%q].memory.compareTo(quantity("%dMi")) >= 0`, names.Driver, mem))
		s.memoryMiB = mem
	}
	if hasCores {
		if cores > 100 {
			return shape{}, false, containerError(container, corev1.ResourceName(v.Cores), "%d is more than 100 percent", cores)
		}
		// 0 asks for no share of the SMs, which every device has.
		if cores > 0 {
			s.selectors = append(s.selectors, fmt.Sprintf(`device.capacity[%q].cores.compareTo(quantity("%d")) >= 0`, names.Driver, cores))
			s.cores = cores
		}
	}
	if hasPct {
		if pct > 100 {
			return shape{}, false, containerError(container, corev1.ResourceName(v.MemoryPercentage), "%d is more than 100 percent", pct)
		}
		if v.MemoryPercentageSelector == "" {
			return shape{}, false, containerError(container, corev1.ResourceName(v.MemoryPercentage),
				"a percentage of a GPU's memory has no fixed-size vGPU slot to map to; ask for %s in MiB instead, or set memoryPercentageSelector in the webhook's extended resource map", orDefault(v.Memory, "memory"))
		}
		if pct > 0 {
			s.selectors = append(s.selectors, strings.ReplaceAll(v.MemoryPercentageSelector, "{percent}", fmt.Sprint(pct)))
		}
	}
	return s, true, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
