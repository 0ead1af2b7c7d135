package main

import (
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/facet-gpu/facet/pkg/features"
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

// publishedDevices counts the devices in the published slices.
func publishedDevices(res resourceslice.DriverResources) int {
	n := 0
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			n += len(s.Devices)
		}
	}
	return n
}
