package nodeplugin

import (
	"github.com/facet-gpu/facet/pkg/model/features"
)

// featureMetrics is the cluster's DRA feature gates, by name, for
// facet_cluster_feature_enabled.
func featureMetrics(s features.Set) map[string]bool {
	out := make(map[string]bool, len(features.Gates))
	for _, g := range features.Gates {
		out[string(g)] = s.Enabled[g]
	}
	return out
}
