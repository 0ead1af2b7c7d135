// Package cdi writes and removes the transient CDI spec of each prepared
// ResourceClaim (tags.cncf.io/container-device-interface).
//
// One claim is one spec file, named after the claim's UID, so a claim's
// CDI device IDs are never reused by another claim and the runtime's CDI
// cache cannot serve a stale hit. The spec's top-level edits (driver
// libraries, control nodes, claim-wide environment) apply whenever any of
// its devices is injected; each DRA device is one CDI device with its own
// edits (its device nodes).
package cdi

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/names"
)

const (
	// Vendor and Class form the CDI kind of Facet's specs,
	// "gpu.facet.dev/claim".
	Vendor = names.Driver
	Class  = "claim"
	Kind   = Vendor + "/" + Class
)

// Device is one DRA device of a claim and its edits.
type Device struct {
	// Name is the DRA device name, e.g. "gpu-3".
	Name string
	// Edits for this device only (device nodes, per-device env).
	Edits *cdispec.ContainerEdits
}

// Writer owns Facet's specs in one CDI spec directory.
type Writer struct {
	dir   string
	cache *cdiapi.Cache
}

// NewWriter uses dir (created 0755 if missing) as the CDI spec directory;
// it must be one of the container runtime's cdi_spec_dirs.
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("CDI spec directory: %w", err)
	}
	// No auto refresh: this cache only writes; the runtime reads.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache on %s: %w", dir, err)
	}
	return &Writer{dir: dir, cache: cache}, nil
}

// SpecName is the spec file name (without extension) of a claim.
func SpecName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, string(claimUID))
}

// DeviceID is the fully qualified CDI device ID of a claim's device, e.g.
// "gpu.facet.dev/claim=4f6c...-gpu-3".
func DeviceID(claimUID types.UID, device string) string {
	return parser.QualifiedName(Vendor, Class, cdiDeviceName(claimUID, device))
}

func cdiDeviceName(claimUID types.UID, device string) string {
	return string(claimUID) + "-" + device
}

// WriteClaim writes (or replaces) the claim's spec with common edits at the
// top level and one CDI device per DRA device. It returns the spec's file
// name and the CDI device IDs in the order of devices.
func (w *Writer) WriteClaim(claimUID types.UID, common *cdispec.ContainerEdits, devices []Device) (string, []string, error) {
	spec := &cdispec.Spec{Kind: Kind}
	if common != nil {
		spec.ContainerEdits = *common
	}
	ids := make([]string, 0, len(devices))
	for _, d := range devices {
		dev := cdispec.Device{Name: cdiDeviceName(claimUID, d.Name)}
		if d.Edits != nil {
			dev.ContainerEdits = *d.Edits
		}
		spec.Devices = append(spec.Devices, dev)
		ids = append(ids, DeviceID(claimUID, d.Name))
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", nil, fmt.Errorf("CDI spec version for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	name := SpecName(claimUID) + ".json"
	if err := w.cache.WriteSpec(spec, name); err != nil {
		return "", nil, fmt.Errorf("write CDI spec %s: %w", filepath.Join(w.dir, name), err)
	}
	return name, ids, nil
}

// RemoveClaim deletes the claim's spec; a missing spec is not an error.
func (w *Writer) RemoveClaim(claimUID types.UID) error {
	name := SpecName(claimUID) + ".json"
	if err := w.cache.RemoveSpec(name); err != nil {
		return fmt.Errorf("remove CDI spec %s: %w", filepath.Join(w.dir, name), err)
	}
	return nil
}

// ClaimSpecs lists the claim UIDs that have a Facet spec in the directory,
// so specs without a checkpoint record (orphans) can be found.
func (w *Writer) ClaimSpecs() ([]types.UID, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("list CDI specs in %s: %w", w.dir, err)
	}
	prefix := cdiapi.GenerateSpecName(Vendor, Class) + "_"
	var uids []types.UID
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		if uid, ok := strings.CutSuffix(name, ".json"); ok {
			uids = append(uids, types.UID(uid))
		}
	}
	return uids, nil
}

// Dir is the spec directory.
func (w *Writer) Dir() string { return w.dir }
