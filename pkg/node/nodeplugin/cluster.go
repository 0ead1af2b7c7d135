package nodeplugin

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/nodeevents"
)

// Event reasons on the Node.
const (
	reasonFeatures        = "FacetClusterFeatures"
	reasonFeaturesUnknown = "FacetFeatureDetectionFailed"
	reasonFeaturesChanged = "FacetClusterFeaturesChanged"
	reasonModeFallback    = "FacetModeFallback"
	reasonAllocatorDefect = "FacetAllocatorDefect"
	reasonLayout          = "FacetMIGLayout"
	reasonGPUUnusable     = "FacetGPUUnusable"
	// reasonIMEXChannel: the node's GPUs report a fabric clique, but it
	// publishes no IMEX channel device, and why.
	reasonIMEXChannel = "FacetIMEXChannelUnpublished"
)

// clusterFeatures is what the cluster enforces: detected, then overridden
// by --feature-gates. When detection fails the plugin assumes a stock
// cluster (every gate off): the shapes it then publishes are correct on
// every cluster, and the failure is logged and raised as an Event.
func clusterFeatures(ctx context.Context, client kubernetes.Interface, node string, overrides features.Overrides, ev *nodeevents.Recorder) features.Set {
	logger := klog.FromContext(ctx)
	s, err := features.Detect(ctx, client, node)
	if err != nil {
		version := s.ServerVersion
		s = features.Stock(fmt.Sprintf("assumed off: detection failed: %v", err))
		s.ServerVersion = version
		logger.Error(err, "Cannot detect the cluster's DRA features; assuming none of the alpha gates is on (set --feature-gates to say otherwise)")
		ev.Warning(reasonFeaturesUnknown, fmt.Sprintf("Cannot detect the cluster's DRA features (%v); publishing only shapes that need no alpha gate", err))
	}
	return s.Apply(overrides)
}

// watchFeatures re-detects the cluster's features every interval and
// returns when they differ from start: the plugin then restarts and
// republishes, rather than change its devices under live allocations.
func watchFeatures(ctx context.Context, client kubernetes.Interface, node string, overrides features.Overrides, start features.Set, every time.Duration, ev *nodeevents.Recorder) error {
	var changed error
	_ = wait.PollUntilContextCancel(ctx, every, false, func(ctx context.Context) (bool, error) {
		s, err := features.Detect(ctx, client, node)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Re-detecting cluster features failed; keeping what was detected at start", "err", err)
			return false, nil
		}
		s = s.Apply(overrides)
		if !s.Equal(start) {
			msg := fmt.Sprintf("The cluster's DRA features changed from %s to %s; restarting to republish", start, s)
			ev.Warning(reasonFeaturesChanged, msg)
			changed = fmt.Errorf("%s", msg)
			return true, nil
		}
		// An upgrade (or downgrade) of the control plane past a fix of
		// the allocator changes which modes are refused or warned about.
		if was, now := inventory.DefectsAt(start.ServerVersion), inventory.DefectsAt(s.ServerVersion); !slices.Equal(was, now) {
			msg := fmt.Sprintf("The cluster's Kubernetes version changed from %s to %s, and with it the allocator's known defects (from %v to %v); restarting to republish",
				start.ServerVersion, s.ServerVersion, was, now)
			ev.Warning(reasonFeaturesChanged, msg)
			changed = fmt.Errorf("%s", msg)
			return true, nil
		}
		return false, nil
	})
	// nil when ctx ended first.
	return changed
}

// applyLayouts puts each configured MIG layout on its GPU, before the
// inventory is built from the instances that then exist. A GPU that
// prepared claims hold, or that has instances Facet did not make, keeps what
// it has; a failure on one GPU is reported and the others go on.
func applyLayouts(ctx context.Context, lib *nvmlgpu.Library, node *nvmlgpu.Node, layouts map[int]string, modes inventory.Config, store *checkpoint.Store, layoutStore *miglayout.Store, ev *nodeevents.Recorder) error {
	if len(layouts) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	claims, _, err := store.List()
	if err != nil {
		return err
	}
	busy := map[string]bool{}
	for _, c := range claims {
		for _, d := range c.Devices {
			busy[d.GPUUUID] = true
		}
	}
	existing, err := lib.ListMIG()
	if err != nil {
		return fmt.Errorf("list MIG instances: %w", err)
	}
	for idx, layout := range layouts {
		if idx < 0 || idx >= len(node.GPUs) {
			return fmt.Errorf("--mig-layouts: GPU %d, but the node has GPUs 0-%d", idx, len(node.GPUs)-1)
		}
		mode := modes.DefaultMode
		if m, ok := modes.PerGPU[idx]; ok {
			mode = m
		}
		if mode != inventory.ModeStaticMIG && mode != inventory.ModeAuto {
			return fmt.Errorf("--mig-layouts: GPU %d has mode %s; a layout needs mode static-mig (or auto)", idx, mode)
		}
		g := node.GPUs[idx]
		var mine []nvmlgpu.MIGInstance
		for _, in := range existing {
			if in.ParentUUID == g.UUID {
				mine = append(mine, in)
			}
		}
		out, err := miglayout.Apply(lib, layoutStore, g, layout, mine, busy[g.UUID])
		switch {
		case err != nil:
			logger.Error(err, "MIG layout not applied", "gpu", idx)
			ev.Warning(reasonLayout, fmt.Sprintf("GPU %d: %v", idx, err))
		case out.Note != "":
			logger.Info("MIG layout not applied", "gpu", idx, "why", out.Note)
			ev.Warning(reasonLayout, fmt.Sprintf("GPU %d: %s", idx, out.Note))
		case out.Changed:
			logger.Info("MIG layout applied", "gpu", idx, "layout", layout)
			ev.Normal(reasonLayout, fmt.Sprintf("GPU %d: MIG layout %s applied", idx, layout))
		}
	}
	return nil
}
