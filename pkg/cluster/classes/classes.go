// Package classes makes the DeviceClasses that let a quota system count
// every shape Facet offers by a plain deviceClassName: whole GPUs per
// product family, MIG devices per profile, vGPU slots per size and vGPU
// shares per size. The class, not the claim, carries the CEL selector and
// (for shares) the VgpuConfig, so a claim for one of them names only the
// class and a count, which is what Kueue's deviceClassMappings count: Kueue
// v0.17 refuses claims with CEL selectors, device config, firstAvailable,
// allocationMode All or admin access (its pkg/dra/claims.go).
//
// Generate reads the classes off a cluster's ResourceSlices (what the
// nodes publish), so that only shapes the nodes have get a class; `facetctl
// classes` prints them. docs/kueue.md lists what Kueue then counts.
package classes

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

const (
	// LabelShape is on every generated class: the shape it counts, one of
	// the Shape constants. The pod mutator's Kueue mode finds the sized
	// classes by it.
	LabelShape = names.Driver + "/shape"
	// AnnotationMemory is a sized class's memory, a quantity in Mi
	// ("2000Mi"): every device of a slot class has exactly this much; a
	// share of a share class is limited to it.
	AnnotationMemory = names.Driver + "/memory"
	// AnnotationCores is a sized class's SM share in percent ("20").
	AnnotationCores = names.Driver + "/cores"
	// LabelManagedBy marks the generated classes.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "facetctl"
)

// Shape is what a class counts.
type Shape string

const (
	// ShapeGPU is a whole GPU of one product family.
	ShapeGPU Shape = "gpu"
	// ShapeMIG is a MIG device of one profile.
	ShapeMIG Shape = "mig"
	// ShapeSlot is a fixed-size vGPU slot (slots mode, stock 1.35).
	ShapeSlot Shape = "vgpu-slot"
	// ShapeShare is a vGPU share of one size (shared or dynamic mode,
	// DRAConsumableCapacity).
	ShapeShare Shape = "vgpu"
)

// Size is a vGPU size: memory in MiB (HAMi-core counts in MiB) and the
// SM share in percent, 1-100.
type Size struct {
	MemoryMiB int64
	Cores     int64
}

// String is the size as ParseSizes reads it, "2000Mi/20".
func (s Size) String() string { return fmt.Sprintf("%dMi/%d", s.MemoryMiB, s.Cores) }

// Memory is the size's memory as a quantity.
func (s Size) Memory() resource.Quantity { return resource.MustParse(fmt.Sprintf("%dMi", s.MemoryMiB)) }

// suffix is the size in a class name, "2000mi-20".
func (s Size) suffix() string { return fmt.Sprintf("%dmi-%d", s.MemoryMiB, s.Cores) }

// ParseSizes parses a comma-separated list of MEMORY/PERCENT, MEMORY a
// quantity ("2000Mi", "10Gi") that is a whole number of MiB, PERCENT the SM
// share 1-100: "2000Mi/20,10Gi/50". Errors name the entry.
func ParseSizes(s string) ([]Size, error) {
	var out []Size
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		mem, pct, ok := strings.Cut(part, "/")
		if !ok {
			return nil, fmt.Errorf("share size %q: want MEMORY/PERCENT, e.g. 2000Mi/20", part)
		}
		q, err := resource.ParseQuantity(mem)
		if err != nil || q.Sign() <= 0 || q.Value()%(1<<20) != 0 {
			return nil, fmt.Errorf("share size %q: memory %q is not a positive whole number of MiB such as 2000Mi", part, mem)
		}
		c, err := strconv.ParseInt(pct, 10, 64)
		if err != nil || c < 1 || c > 100 {
			return nil, fmt.Errorf("share size %q: SM share %q is not a percentage from 1 to 100", part, pct)
		}
		sz := Size{MemoryMiB: q.Value() >> 20, Cores: c}
		if slices.Contains(out, sz) {
			return nil, fmt.Errorf("share size %q is given twice", part)
		}
		out = append(out, sz)
	}
	return out, nil
}

// Options says which classes Generate makes beyond what the slices show.
type Options struct {
	// ShareSizes are the vGPU share sizes a platform offers. A share's size
	// is free, so the slices cannot say which sizes to count; each size
	// gets a class vgpu-<memory>mi-<cores>.facet.dev.
	ShareSizes []Size
}

// Result is Generate's output.
type Result struct {
	// Classes are sorted by shape (gpu, mig, vgpu-slot, vgpu), then name.
	Classes []*resourceapi.DeviceClass
	// Notes say what was seen but not made into a class, and why.
	Notes []string
}

// Generate returns the classes for the shapes in slices (those of other
// drivers are ignored) and opts.
func Generate(in []*resourceapi.ResourceSlice, opts Options) (Result, error) {
	products := map[string][]string{} // family -> product names
	profiles := map[string]bool{}
	slots := map[Size]bool{}
	var shareGPUs []int64 // memory of each shared or dynamic GPU, bytes
	var notes []string
	for _, s := range in {
		if s.Spec.Driver != names.Driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			switch str(d, names.AttrType) {
			case names.KindGPU:
				p := str(d, names.AttrProductName)
				fam := Family(p)
				if fam == "" {
					notes = append(notes, fmt.Sprintf("device %s of pool %s: productName %q has no product family; no class counts it by family", d.Name, s.Spec.Pool.Name, p))
				} else if !slices.Contains(products[fam], p) {
					products[fam] = append(products[fam], p)
				}
				if m := str(d, names.AttrMode); m == names.ModeShared || m == names.ModeDynamic {
					if q, ok := d.Capacity[names.CapacityMemory]; ok {
						shareGPUs = append(shareGPUs, q.Value.Value())
					}
				}
			case names.KindMIG:
				if p := str(d, names.AttrProfile); p != "" {
					profiles[p] = true
				}
			case names.KindVGPUSlot:
				mem, okm := d.Capacity[names.CapacityMemory]
				cores, okc := d.Capacity[names.CapacityCores]
				if !okm || !okc || mem.Value.Value()%(1<<20) != 0 {
					notes = append(notes, fmt.Sprintf("vGPU slot %s of pool %s: no whole-MiB memory and cores capacity; no class counts it", d.Name, s.Spec.Pool.Name))
					continue
				}
				slots[Size{MemoryMiB: mem.Value.Value() >> 20, Cores: cores.Value.Value()}] = true
			}
		}
	}
	var out []*resourceapi.DeviceClass
	for _, fam := range slices.Sorted(maps.Keys(products)) {
		ps := products[fam]
		sort.Strings(ps)
		out = append(out, GPUClass(fam, ps))
	}
	for _, p := range slices.Sorted(maps.Keys(profiles)) {
		out = append(out, MIGClass(p))
	}
	var slotSizes []Size
	for s := range slots {
		slotSizes = append(slotSizes, s)
	}
	sortSizes(slotSizes)
	for _, s := range slotSizes {
		out = append(out, SlotClass(s))
	}
	shares := slices.Clone(opts.ShareSizes)
	sortSizes(shares)
	if len(shares) > 0 && len(shareGPUs) == 0 {
		notes = append(notes, "no GPU is in shared or dynamic mode: the share classes match nothing until one is")
	}
	for _, sz := range shares {
		fits := false
		for _, m := range shareGPUs {
			fits = fits || sz.MemoryMiB<<20 <= m
		}
		if len(shareGPUs) > 0 && !fits {
			notes = append(notes, fmt.Sprintf("share size %s is larger than every shared or dynamic GPU: its class matches nothing", sz))
		}
		c, err := ShareClass(sz)
		if err != nil {
			return Result{}, err
		}
		out = append(out, c)
	}
	for _, c := range out {
		if msgs := validation.IsDNS1123Subdomain(c.Name); len(msgs) > 0 {
			return Result{}, fmt.Errorf("DeviceClass name %q: %s", c.Name, strings.Join(msgs, "; "))
		}
	}
	return Result{Classes: out, Notes: notes}, nil
}

var familyRE = regexp.MustCompile(`^[a-z]+[0-9]+[a-z]*`)

// Family is a product name's family as a DNS label, "" if it has none:
// "NVIDIA H100 80GB HBM3" and "NVIDIA H100 PCIe" are "h100",
// "NVIDIA A100-SXM4-80GB" is "a100", "NVIDIA L4" is "l4".
func Family(productName string) string {
	p := strings.ToLower(strings.TrimSpace(productName))
	p = strings.TrimPrefix(p, "nvidia ")
	p = strings.TrimPrefix(p, "tesla ")
	return familyRE.FindString(p)
}

func meta(name string, shape Shape) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelShape: string(shape), LabelManagedBy: ManagedByValue}}
}

// GPUClass is gpu-<family>.facet.dev: one whole GPU whose productName is
// one of products. Like gpu.facet.dev it matches GPUs in every mode; on a
// shared or dynamic GPU a claim without capacity takes all of it.
func GPUClass(family string, products []string) *resourceapi.DeviceClass {
	quoted := make([]string, len(products))
	for i, p := range products {
		quoted[i] = strconv.Quote(p)
	}
	c := &resourceapi.DeviceClass{ObjectMeta: meta("gpu-"+family+".facet.dev", ShapeGPU)}
	c.Spec.Selectors = cel(typeIs(names.KindGPU),
		fmt.Sprintf("device.attributes[%q].%s in [%s]", names.Driver, names.AttrProductName, strings.Join(quoted, ", ")))
	return c
}

// MIGClass is mig-<profile>.facet.dev, exactly as
// deployments/deviceclasses.yaml ships it, with the device plugin's
// extended resource name: "+" becomes "." in both names.
func MIGClass(profile string) *resourceapi.DeviceClass {
	dotted := strings.ReplaceAll(profile, "+", ".")
	c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "mig-" + dotted + ".facet.dev"}}
	c.Spec.ExtendedResourceName = ptr.To("nvidia.com/mig-" + dotted)
	c.Spec.Selectors = cel(typeIs(names.KindMIG), fmt.Sprintf("device.attributes[%q].%s == %q", names.Driver, names.AttrProfile, profile))
	return c
}

// SlotClass is vgpu-slot-<memory>mi-<cores>.facet.dev: one vGPU slot of
// exactly that size.
func SlotClass(s Size) *resourceapi.DeviceClass {
	c := &resourceapi.DeviceClass{ObjectMeta: meta("vgpu-slot-"+s.suffix()+".facet.dev", ShapeSlot)}
	c.Annotations = sizeAnnotations(s)
	c.Spec.Selectors = cel(typeIs(names.KindVGPUSlot), mpsPartitioned(),
		fmt.Sprintf("device.capacity[%q].%s.compareTo(quantity(%q)) == 0", names.Driver, names.CapacityMemory, fmt.Sprintf("%dMi", s.MemoryMiB)),
		fmt.Sprintf("device.capacity[%q].%s.compareTo(quantity(%q)) == 0", names.Driver, names.CapacityCores, strconv.FormatInt(s.Cores, 10)))
	return c
}

// ShareClass is vgpu-<memory>mi-<cores>.facet.dev: a vGPU share of a GPU
// in shared or dynamic mode with at least that much memory, whose
// HAMi-core limits the class's VgpuConfig sets to the size. A claim of it
// should still ask for the size as capacity (ShareCapacity), so that the
// scheduler accounts the share at its size and not at the device's
// default, all of the GPU; Kueue counts the claim's device and ignores
// the capacity.
func ShareClass(s Size) (*resourceapi.DeviceClass, error) {
	cfg := configapi.NewVgpuConfig()
	cfg.Memory = ptr.To(s.Memory())
	cfg.Cores = ptr.To(int32(s.Cores))
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("share size %s: VgpuConfig: %w", s, err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	c := &resourceapi.DeviceClass{ObjectMeta: meta("vgpu-"+s.suffix()+".facet.dev", ShapeShare)}
	c.Annotations = sizeAnnotations(s)
	c.Spec.Selectors = cel(typeIs(names.KindGPU),
		fmt.Sprintf(`device.attributes[%q].%s in [%q, %q]`, names.Driver, names.AttrMode, names.ModeShared, names.ModeDynamic), mpsPartitioned(),
		fmt.Sprintf("device.capacity[%q].%s.compareTo(quantity(%q)) >= 0", names.Driver, names.CapacityMemory, fmt.Sprintf("%dMi", s.MemoryMiB)))
	c.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: names.Driver, Parameters: runtime.RawExtension{Raw: raw}},
	}}}
	return c, nil
}

// ShareCapacity is the capacity a claim of a share class asks for.
func ShareCapacity(s Size) *resourceapi.CapacityRequirements {
	return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		names.CapacityMemory: s.Memory(),
		names.CapacityCores:  *resource.NewQuantity(s.Cores, resource.DecimalSI),
	}}
}

// SizeOf reads a sized class's shape and size from its label and
// annotations; ok is false for a class that is not a generated slot or
// share class.
func SizeOf(c *resourceapi.DeviceClass) (Shape, Size, bool) {
	shape := Shape(c.Labels[LabelShape])
	if shape != ShapeSlot && shape != ShapeShare {
		return "", Size{}, false
	}
	mem, err := resource.ParseQuantity(c.Annotations[AnnotationMemory])
	if err != nil || mem.Value()%(1<<20) != 0 || mem.Sign() <= 0 {
		return "", Size{}, false
	}
	cores, err := strconv.ParseInt(c.Annotations[AnnotationCores], 10, 64)
	if err != nil || cores < 1 || cores > 100 {
		return "", Size{}, false
	}
	return shape, Size{MemoryMiB: mem.Value() >> 20, Cores: cores}, true
}

func sizeAnnotations(s Size) map[string]string {
	return map[string]string{AnnotationMemory: fmt.Sprintf("%dMi", s.MemoryMiB), AnnotationCores: strconv.FormatInt(s.Cores, 10)}
}

// mpsPartitioned keeps a sized share or slot class to GPUs whose SMs MPS
// partitions now, as the shipped vgpu.facet.dev and vgpu-slot.facet.dev
// do: a quota counts cores that hold (docs/mps.md, "Compute policy").
func mpsPartitioned() string {
	return fmt.Sprintf("device.attributes[%q].%s == %q", names.Driver, names.AttrComputePartitioning, names.PartitioningMPS)
}

func typeIs(kind string) string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q", names.Driver, names.Driver, names.AttrType, kind)
}

// cel is one selector, the conditions joined by &&, as
// deployments/deviceclasses.yaml writes them (folded to one line).
func cel(conds ...string) []resourceapi.DeviceSelector {
	return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: strings.Join(conds, " && ")}}}
}

func str(d resourceapi.Device, attr string) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(attr)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// sortSizes orders by memory, then cores: the smallest first.
func sortSizes(s []Size) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].MemoryMiB != s[j].MemoryMiB {
			return s[i].MemoryMiB < s[j].MemoryMiB
		}
		return s[i].Cores < s[j].Cores
	})
}
