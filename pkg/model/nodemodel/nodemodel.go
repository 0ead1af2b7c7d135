// Package nodemodel is the one place that assembles a node's model from
// NVML: discover the GPUs, list the MIG instances that exist, preview
// the MIG layouts not yet carved, and build the inventory. The plugin,
// facetctl, the node check and the test harnesses all go through it, so
// that what facetctl previews is what the plugin publishes.
package nodemodel

import (
	"fmt"
	"maps"
	"slices"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// Source is the NVML a node is read from (*nvmlgpu.Library, real or
// simulated).
type Source interface {
	Discover() (*nvmlgpu.Node, error)
	MIGLister
}

// MIGLister lists the MIG instances that exist on the node.
type MIGLister interface {
	ListMIG() ([]nvmlgpu.MIGInstance, error)
}

// Discover reads the node's GPUs; its error names the step.
func Discover(src Source) (*nvmlgpu.Node, error) {
	node, err := src.Discover()
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	return node, nil
}

// Options says where Build's MIG instances come from besides
// inventory.Config.MIGInstances.
type Options struct {
	// MIG, when set and some GPU is MIG-capable, replaces
	// Config.MIGInstances with the instances that exist: they decide
	// static-mig's devices and auto's choice. Nil: none are listed (a
	// simulated node fresh from its machine file has none).
	MIG MIGLister
	// Layouts, by GPU index, are MIG layouts (package miglayout) previewed
	// in place of that GPU's listed instances: what the node publishes
	// once they are carved, without carving them.
	Layouts map[int]string
}

// Build builds node's inventory in cfg's modes, with the MIG instances
// that o lists and previews. cfg is a copy: the caller's is not changed.
func Build(node *nvmlgpu.Node, cfg inventory.Config, o Options) (*inventory.Inventory, error) {
	if o.MIG != nil && migCapable(node) {
		var err error
		if cfg.MIGInstances, err = o.MIG.ListMIG(); err != nil {
			return nil, fmt.Errorf("list MIG instances: %w", err)
		}
	}
	instances, err := Preview(node, cfg.MIGInstances, o.Layouts)
	if err != nil {
		return nil, err
	}
	cfg.MIGInstances = instances
	return inventory.Build(node, cfg)
}

// Assemble discovers src's node and builds its inventory, with the MIG
// instances that exist and layouts previewed over them (Build).
func Assemble(src Source, cfg inventory.Config, layouts map[int]string) (*nvmlgpu.Node, *inventory.Inventory, error) {
	node, err := Discover(src)
	if err != nil {
		return nil, nil, err
	}
	inv, err := Build(node, cfg, Options{MIG: src, Layouts: layouts})
	if err != nil {
		return nil, nil, err
	}
	return node, inv, nil
}

// Preview returns instances with each GPU that layouts names (by index)
// holding its layout's instances instead of its own, as
// miglayout.Preview places them. An index the node lacks is an error.
func Preview(node *nvmlgpu.Node, instances []nvmlgpu.MIGInstance, layouts map[int]string) ([]nvmlgpu.MIGInstance, error) {
	// In index order, so that of several bad indices the first is named.
	for _, idx := range slices.Sorted(maps.Keys(layouts)) {
		layout := layouts[idx]
		if idx < 0 || idx >= len(node.GPUs) {
			return nil, fmt.Errorf("--mig-layouts: GPU %d, but the node has GPUs 0-%d", idx, len(node.GPUs)-1)
		}
		g := node.GPUs[idx]
		plan, err := miglayout.Plan(layout, g.MIGProfiles)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", idx, err)
		}
		var kept []nvmlgpu.MIGInstance
		for _, in := range instances {
			if in.ParentUUID != g.UUID {
				kept = append(kept, in)
			}
		}
		instances = append(kept, miglayout.Preview(g, plan)...) //nolint:gocritic // kept is a new slice: this GPU's instances replaced
	}
	return instances, nil
}

func migCapable(node *nvmlgpu.Node) bool {
	for _, g := range node.GPUs {
		if g.MIGCapable {
			return true
		}
	}
	return false
}
