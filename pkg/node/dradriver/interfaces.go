package dradriver

import (
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
)

// The driver reaches NVML, the CDI spec directory and the checkpoint only
// through these interfaces (the sharing mechanisms through package
// sharing's), each with just the methods it
// calls. The production types satisfy them (checked below); tests may
// substitute in-memory fakes.

// EditSource yields the NVIDIA driver's CDI edits (package nvmlgpu, via nvcdi).
type EditSource interface {
	// CommonEdits are what every GPU container needs: control device
	// nodes, driver libraries and binaries, hooks.
	CommonEdits() (*cdispec.ContainerEdits, error)
	// GPUEdits are one whole GPU's own edits (its /dev/nvidiaN).
	GPUEdits(uuid string) (*cdispec.ContainerEdits, error)
	// MIGEdits are one MIG device's edits (parent node, nvidia-caps nodes).
	MIGEdits(parentUUID string, giID, ciID int) (*cdispec.ContainerEdits, error)
}

// MIGManager creates and destroys MIG instances (package nvmlgpu).
type MIGManager interface {
	EnableMIG(parentUUID string) (bool, error)
	DisableMIG(parentUUID string) (bool, error)
	CreateMIG(parentUUID string, giProfileID, placementStart int) (nvmlgpu.MIGInstance, error)
	DestroyMIG(parentUUID string, giID, ciID int) error
	// ListMIGOn lists one GPU's instances, so an NVML error on one GPU
	// fails that GPU alone.
	ListMIGOn(parentUUID string) ([]nvmlgpu.MIGInstance, error)
}

// SpecWriter writes and removes the claims' CDI specs (package claimcdi).
type SpecWriter interface {
	// WriteClaim writes a claim's spec atomically, returning its name,
	// the CDI device IDs (one per device, in order) and its content hash.
	WriteClaim(claimUID types.UID, common *cdispec.ContainerEdits, devices []claimcdi.Device) (name string, ids []string, hash string, err error)
	// Verify fails unless the claim's spec exists with the given hash.
	Verify(claimUID types.UID, hash string) error
	// RemoveClaim removes a claim's spec; a missing one is no error.
	RemoveClaim(claimUID types.UID) error
	// SweepTemp removes temporary files a crashed write left.
	SweepTemp() ([]string, error)
	// ClaimSpecs lists the claims that have a Facet spec.
	ClaimSpecs() ([]types.UID, error)
	// Dir is the CDI spec directory (for records without a hash).
	Dir() string
}

// Store is the checkpoint of prepared claims (package checkpoint).
type Store interface {
	// Get returns a claim's record, nil if there is none.
	Get(uid types.UID) (*checkpoint.Claim, error)
	// Salvage reads what it can of a corrupt record.
	Salvage(uid types.UID) (*checkpoint.Claim, error)
	Put(c *checkpoint.Claim) error
	Delete(uid types.UID) error
	// List returns the readable records and, by UID, why the others
	// cannot be read.
	List() (claims []*checkpoint.Claim, corrupt map[types.UID]error, err error)
}

var (
	_ EditSource = (*nvmlgpu.DriverEditor)(nil)
	_ MIGManager = (*nvmlgpu.Library)(nil)
	_ SpecWriter = (*claimcdi.Writer)(nil)
	_ Store      = (*checkpoint.Store)(nil)
)
