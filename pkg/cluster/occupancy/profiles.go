package occupancy

// Profile is what the occupancy picture needs of a MIG profile and that
// ResourceSlices do not carry: how many memory slices a placement spans,
// and the profile's share of the GPU's compute slices.
type Profile struct {
	// MemorySlices a placement of the profile spans.
	MemorySlices int
	// ComputeSlices of the profile ("3g" = 3).
	ComputeSlices int
	// GPUMemorySlices and GPUComputeSlices are the whole GPU's.
	GPUMemorySlices, GPUComputeSlices int
}

// ProfileTable finds a MIG profile of a GPU product. Slices publish a MIG
// device's placementStart and memory, but not the size of its placement:
// that comes from NVIDIA's MIG tables for the product.
type ProfileTable interface {
	Lookup(product, profile string) (Profile, bool)
}

// tables maps a product name to its profiles by name.
type tables map[string]map[string]Profile

func (t tables) Lookup(product, profile string) (Profile, bool) {
	p, ok := t[product][profile]
	return p, ok
}

// KnownProfiles are the MIG tables of the GPUs Facet knows (pkg/model/nvml's
// models: A100, A30, H100, H100 NVL, H200, B200), keyed by the product name NVML
// reports and Facet publishes in `productName`. A GPU of another product
// gets no memory-slice bar; everything else about it is still shown.
//
// They are data, not computed at run time by the simulator, so that the
// daemons that read them (facet-preemptor, through pkg/cluster/fit) link no test
// support. TestKnownProfilesMatchTheSimulator checks them against the
// simulated GPUs' MIG profiles (internal/nvml/sim, calibrated to NVIDIA's
// "Multi-Instance GPU User Guide", Supported MIG Profiles, and to the H100
// and H200 measured in shared/hardware/), and prints the table to paste
// when a model changes.
func KnownProfiles() ProfileTable { return knownTables }

var knownTables = tables{
	"NVIDIA A100-PCIE-40GB": {
		"1g.10gb":   {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.5gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.5gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.10gb":   {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.20gb":   {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.20gb":   {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.40gb":   {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA A100-PCIE-80GB": {
		"1g.10gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.10gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.20gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.20gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.40gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.40gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.80gb":    {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA A100-SXM4-40GB": {
		"1g.10gb":   {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.5gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.5gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.10gb":   {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.20gb":   {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.20gb":   {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.40gb":   {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA A100-SXM4-80GB": {
		"1g.10gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.10gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.20gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.20gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.40gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.40gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.80gb":    {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA A30-PCIE-24GB": {
		"1g.6gb":     {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 4, GPUComputeSlices: 4},
		"1g.6gb+me":  {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 4, GPUComputeSlices: 4},
		"2g.12gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 4, GPUComputeSlices: 4},
		"2g.12gb+me": {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 4, GPUComputeSlices: 4},
		"4g.24gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 4, GPUComputeSlices: 4},
	},
	"NVIDIA B200": {
		"1g.23gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.23gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.45gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.45gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.90gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.90gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.180gb":   {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA H100 80GB HBM3": {
		"1g.10gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.10gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.20gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.20gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.40gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.40gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.80gb":    {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA H100 NVL": {
		"1g.12gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.12gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.24gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.24gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.47gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.47gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.94gb":    {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
	"NVIDIA H200": {
		"1g.18gb":    {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.18gb+me": {MemorySlices: 1, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"1g.35gb":    {MemorySlices: 2, ComputeSlices: 1, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"2g.35gb":    {MemorySlices: 2, ComputeSlices: 2, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"3g.71gb":    {MemorySlices: 4, ComputeSlices: 3, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"4g.71gb":    {MemorySlices: 4, ComputeSlices: 4, GPUMemorySlices: 8, GPUComputeSlices: 7},
		"7g.141gb":   {MemorySlices: 8, ComputeSlices: 7, GPUMemorySlices: 8, GPUComputeSlices: 7},
	},
}
