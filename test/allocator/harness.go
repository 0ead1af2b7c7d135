// Package allocator runs Facet's slices and DeviceClasses through the
// upstream structured allocator (k8s.io/dynamic-resource-allocation/structured),
// the same code the kube-scheduler runs, so that what the slice model claims
// is checked against Kubernetes rather than against assumptions.
//
// The wrapper around the allocator lives in pkg/cluster/fit, which `facetctl fit`
// also runs against a live cluster; these names keep the tests short.
package allocator

import "github.com/facet-gpu/facet/pkg/cluster/fit"

// Cluster is a set of nodes' slices, DeviceClasses and allocations so far.
type Cluster = fit.Cluster

var (
	// Features are a 1.35 cluster's DRA features with Facet's gates on.
	Features = fit.Features
	// StockFeatures are a stock 1.35 cluster's.
	StockFeatures = fit.StockFeatures
	NewCluster    = fit.NewCluster
	Devices       = fit.Devices
	ReadObjects   = fit.ReadObjects
	ReadFile      = fit.ReadFile
)
