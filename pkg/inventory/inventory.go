// Package inventory is Facet's model of a node: which DRA devices each
// physical GPU offers, under which mode, and how to find a device again by
// name when a claim that names it is prepared.
//
// Data flows one way: nvml.Node (discovery) → Inventory → ResourceSlices
// (package slices) and → prepare (package driver).
package inventory

import (
	"fmt"

	"github.com/facet-gpu/facet/pkg/nvml"
)

// DriverName is Facet's DRA driver name; it is also the domain of every
// attribute and capacity Facet publishes.
const DriverName = "gpu.facet.dev"

// Mode says how a physical GPU may be used. Modes are exclusive per GPU.
type Mode string

const (
	// ModeExclusive publishes gpu-<i> alone, for one claim at a time.
	ModeExclusive Mode = "exclusive"
)

// Modes lists the modes this build supports.
var Modes = []Mode{ModeExclusive}

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q (known: %v)", s, Modes)
}

// Kind is what a device is.
type Kind string

const (
	// KindGPU is a whole physical GPU.
	KindGPU Kind = "gpu"
)

// Device is one DRA device of the inventory.
type Device struct {
	// Name is the DRA device name, unique in the node's pool, e.g. "gpu-3".
	Name string
	Kind Kind
	// GPU is the physical GPU the device lives on.
	GPU *GPU
}

// GPU is a physical GPU with the mode it is published under.
type GPU struct {
	nvml.GPU
	Mode Mode
	// Devices are this GPU's devices in publication order.
	Devices []*Device
}

// Inventory is a node's devices.
type Inventory struct {
	// DriverVersion and CUDADriverVersion as discovered.
	DriverVersion     string
	CUDADriverVersion string
	GPUs              []*GPU
	byName            map[string]*Device
}

// Config chooses each GPU's mode.
type Config struct {
	// DefaultMode applies to GPUs without an entry in PerGPU.
	DefaultMode Mode
	// PerGPU maps an NVML index to its mode.
	PerGPU map[int]Mode
}

// Build turns a discovered node into an inventory. It fails when the
// configuration names a GPU the node does not have.
func Build(node *nvml.Node, cfg Config) (*Inventory, error) {
	if cfg.DefaultMode == "" {
		cfg.DefaultMode = ModeExclusive
	}
	inv := &Inventory{
		DriverVersion:     node.DriverVersion,
		CUDADriverVersion: node.CUDADriverVersion,
		byName:            map[string]*Device{},
	}
	for idx := range cfg.PerGPU {
		if idx < 0 || idx >= len(node.GPUs) {
			return nil, fmt.Errorf("mode configured for GPU %d, but the node has GPUs 0-%d", idx, len(node.GPUs)-1)
		}
	}
	for _, g := range node.GPUs {
		mode := cfg.DefaultMode
		if m, ok := cfg.PerGPU[g.Index]; ok {
			mode = m
		}
		gpu := &GPU{GPU: g, Mode: mode}
		gpu.Devices = append(gpu.Devices, &Device{Name: WholeGPUName(g.Index), Kind: KindGPU, GPU: gpu})
		for _, d := range gpu.Devices {
			if _, dup := inv.byName[d.Name]; dup {
				return nil, fmt.Errorf("internal error: device name %s used twice", d.Name)
			}
			inv.byName[d.Name] = d
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}
	return inv, nil
}

// WholeGPUName is the device name of GPU index i.
func WholeGPUName(i int) string { return fmt.Sprintf("gpu-%d", i) }

// Device finds a device by name.
func (inv *Inventory) Device(name string) (*Device, bool) {
	d, ok := inv.byName[name]
	return d, ok
}
