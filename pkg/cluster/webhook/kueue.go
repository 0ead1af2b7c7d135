package webhook

// Kueue mode: the pod mutator writes templates that Kueue's
// deviceClassMappings can count. Kueue v0.17 refuses to account a claim
// with CEL selectors or device config (its pkg/dra/claims.go), so a vGPU
// size, which the plain mutator writes as CEL selectors and a VgpuConfig,
// becomes instead a claim for one of the sized DeviceClasses of `facetctl
// classes` (pkg/cluster/classes): the smallest that holds the size asked for. The
// class carries the selector and the config; the template names the class,
// a count and, for a share, its size as capacity, which Kueue ignores and
// the scheduler accounts. Whole GPUs and MIG devices need nothing: their
// templates already name only a class.

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/classes"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// KueueMode says whether the pod mutator writes templates for Kueue.
type KueueMode string

const (
	// KueueAuto is KueueOn while the API server serves Kueue's API
	// (kueue.x-k8s.io), KueueOff otherwise.
	KueueAuto KueueMode = "auto"
	// KueueOn rewrites pods whatever the DRAExtendedResource gate (Kueue
	// counts claims, and extended resources only behind its own alpha
	// gate), into templates with no CEL and no config.
	KueueOn KueueMode = "on"
	// KueueOff is the mutator as it is without Kueue.
	KueueOff KueueMode = "off"
)

// KueueGroup is Kueue's API group, whose presence KueueAuto looks for.
const KueueGroup = "kueue.x-k8s.io"

// ParseKueueMode parses --kueue.
func ParseKueueMode(s string) (KueueMode, error) {
	return names.Parse(s, "Kueue mode", KueueAuto, KueueOn, KueueOff)
}

// kueueOption is a mutator's Kueue option checked: KueueOff when unset, an
// error naming the option ("kueue: ...") when it is no mode.
func kueueOption(m KueueMode) (KueueMode, error) {
	if m == "" {
		return KueueOff, nil
	}
	if _, err := ParseKueueMode(string(m)); err != nil {
		return "", fmt.Errorf("kueue: %w", err)
	}
	return m, nil
}

// sizedKinds are the general vGPU classes of the extended resource map
// and the shape of the sized classes that replace them in Kueue mode.
var sizedKinds = map[string]classes.Shape{
	"vgpu-slot.facet.dev": classes.ShapeSlot,
	"vgpu.facet.dev":      classes.ShapeShare,
}

// kueueDetector caches whether Kueue's API is served, asked at most every
// kueueRecheck, so that an admission costs no discovery call.
type kueueDetector struct {
	discovery discovery.ServerGroupsInterface
	logger    klog.Logger
	// consequence says, in the log line, what Kueue's API changes.
	consequence string

	mu     sync.Mutex
	at     time.Time
	served bool
}

const kueueRecheck = 30 * time.Second

// kueueServed reports whether the API server serves KueueGroup, asking at
// most every kueueRecheck and logging a change. A discovery error counts as
// not served, and is logged with the answer.
func (d *kueueDetector) kueueServed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.at.IsZero() && time.Since(d.at) < kueueRecheck {
		return d.served
	}
	groups, err := d.discovery.ServerGroups()
	served := false
	if err == nil {
		for _, g := range groups.Groups {
			served = served || g.Name == KueueGroup
		}
	}
	if served != d.served || d.at.IsZero() {
		d.logger.Info("Kueue's API", "served", served, "group", KueueGroup, "consequence", d.consequence, "err", err)
	}
	d.at, d.served = time.Now(), served
	return served
}

// kueue reports whether pods are written for Kueue now.
func (m *Mutator) kueue() bool {
	switch m.opts.Kueue {
	case KueueOn:
		return true
	case KueueAuto:
		return m.kueueState.kueueServed()
	default:
		return false
	}
}

// kueueShapes turns a container's vGPU shapes into claims of sized
// classes. A shape without a size (whole GPUs, MIG devices) is kept: its
// template names only its class already.
func (m *Mutator) kueueShapes(container string, in []shape) ([]shape, error) {
	out := make([]shape, 0, len(in))
	for _, s := range in {
		if len(s.selectors) == 0 && s.memoryMiB == 0 && s.cores == 0 {
			out = append(out, s)
			continue
		}
		kind, ok := sizedKinds[s.class]
		if !ok {
			return nil, containerError(container, s.resources[0], "Kueue counts only claims without CEL selectors, and DeviceClass %s has no sized classes to use instead (vgpu-slot.facet.dev and vgpu.facet.dev have, from facetctl classes)", s.class)
		}
		if s.memoryMiB == 0 && s.cores == 0 {
			// Only a memory percentage: no size in MiB to compare.
			return nil, containerError(container, s.resources[0], "Kueue mode maps a vGPU size to a sized DeviceClass by memory in MiB and cores in percent; a percentage of a GPU's memory cannot be mapped")
		}
		c, size, err := m.smallestClass(kind, s.memoryMiB, s.cores)
		if err != nil {
			return nil, containerError(container, s.resources[0], "%v", err)
		}
		s.class, s.selectors, s.memoryMiB, s.cores = c, nil, 0, 0
		if kind == classes.ShapeShare {
			s.capacity = classes.ShareCapacity(size)
		}
		out = append(out, s)
	}
	return out, nil
}

// smallestClass is the sized class of kind with the least memory, then
// cores, that holds memoryMiB and cores (0: any).
func (m *Mutator) smallestClass(kind classes.Shape, memoryMiB, cores int64) (string, classes.Size, error) {
	all, err := m.opts.Classes.List(labels.SelectorFromSet(labels.Set{classes.LabelShape: string(kind)}))
	if err != nil {
		return "", classes.Size{}, err
	}
	type cand struct {
		name string
		size classes.Size
	}
	var fits []cand
	var sizes []string
	for _, c := range all {
		sh, size, ok := classes.SizeOf(c)
		if !ok || sh != kind {
			continue
		}
		sizes = append(sizes, size.String())
		if size.MemoryMiB >= memoryMiB && size.Cores >= cores {
			fits = append(fits, cand{c.Name, size})
		}
	}
	if len(fits) == 0 {
		sort.Strings(sizes)
		if len(sizes) == 0 {
			return "", classes.Size{}, fmt.Errorf("%dMi/%d%%: Kueue mode needs sized DeviceClasses (label %s=%s, from facetctl classes) and there are none", memoryMiB, cores, classes.LabelShape, kind)
		}
		return "", classes.Size{}, fmt.Errorf("%dMi/%d%%: no %s DeviceClass is that large; the sizes are %s", memoryMiB, cores, kind, strings.Join(sizes, ", "))
	}
	sort.Slice(fits, func(i, j int) bool {
		a, b := fits[i].size, fits[j].size
		if a.MemoryMiB != b.MemoryMiB {
			return a.MemoryMiB < b.MemoryMiB
		}
		if a.Cores != b.Cores {
			return a.Cores < b.Cores
		}
		return fits[i].name < fits[j].name
	})
	return fits[0].name, fits[0].size, nil
}
