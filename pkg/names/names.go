// Package names holds the words Facet publishes, each declared once: the
// driver name, which is also the domain of every attribute and capacity.
package names

// DriverName is Facet's DRA driver name, the domain of its attributes and
// capacities, and the prefix of its CDI device IDs.
const DriverName = "gpu.facet.dev"
