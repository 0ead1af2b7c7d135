// Package claimcdi writes and removes the transient CDI spec of each prepared
// ResourceClaim (tags.cncf.io/container-device-interface).
//
// One claim is one spec file, named after the claim's UID, so a claim's
// CDI device IDs are never reused by another claim and the runtime's CDI
// cache cannot serve a stale hit. The spec's top-level edits (driver
// libraries, control nodes, claim-wide environment) apply whenever any of
// its devices is injected; each DRA device is one CDI device with its own
// edits (its device nodes).
package claimcdi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/claimuid"
)

const (
	// Vendor and Class form the CDI kind of Facet's specs,
	// "gpu.facet.dev/claim".
	Vendor = names.Driver
	Class  = "claim"
	Kind   = Vendor + "/" + Class
)

// TempPrefix marks this writer's temporary files. They end in ".tmp" so
// the runtime's CDI cache, which reads *.json and *.yaml, never parses a
// half-written one.
const TempPrefix = ".facet-spec-"

// legacyTmpAge is how old a "spec.*.tmp" file (the CDI library's own temp
// name, which Facet used before) must be before a sweep removes it: other
// CDI writers in the same directory use that name too, and one may be
// writing right now.
const legacyTmpAge = 10 * time.Minute

// Device is one DRA device of a claim and its edits.
type Device struct {
	// Name is the DRA device name, e.g. "gpu-3".
	Name string
	// Edits for this device only (device nodes, per-device env).
	Edits *cdispec.ContainerEdits
}

// Writer owns Facet's specs in one CDI spec directory.
type Writer struct {
	dir string
}

// NewWriter uses dir (created 0755 if missing) as the CDI spec directory;
// it must be one of the container runtime's cdi_spec_dirs.
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("CDI spec directory: %w", err)
	}
	return &Writer{dir: dir}, nil
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

// DeviceNames returns the CDI device names of a claim's devices, in order.
// A DRA device can appear more than once in a claim (two shares of one
// GPU); its later occurrences get "_<n>", a separator that DRA device
// names (DNS labels) cannot contain, so no two names of a claim collide.
func DeviceNames(claimUID types.UID, devices []string) []string {
	seen := map[string]int{}
	out := make([]string, len(devices))
	for i, d := range devices {
		n := seen[d]
		seen[d] = n + 1
		out[i] = cdiDeviceName(claimUID, d)
		if n > 0 {
			out[i] += "_" + strconv.Itoa(n)
		}
	}
	return out
}

// WriteClaim writes (or replaces) the claim's spec with common edits at the
// top level and one CDI device per DRA device, atomically: a temp file is
// written and renamed, so after a plugin crash the spec is either the old
// one, the new one or absent, never truncated. It is not fsynced: the
// spec is derived state that the driver never trusts after a power loss
// (the record's boot ID then forces a rebuild, Verify checks the content
// hash, and specs without a record are removed at start), and on a tmpfs
// such as /var/run/cdi an fsync would not outlive a reboot anyway.
// It returns the spec's file name, the CDI device IDs in the order of
// devices, and the SHA-256 of the file's content (see Verify).
func (w *Writer) WriteClaim(claimUID types.UID, common *cdispec.ContainerEdits, devices []Device) (name string, ids []string, hash string, err error) {
	if err := claimuid.Validate(claimUID); err != nil {
		return "", nil, "", err
	}
	spec := &cdispec.Spec{Kind: Kind}
	if common != nil {
		spec.ContainerEdits = *common
	}
	names := make([]string, len(devices))
	for i, d := range devices {
		names[i] = d.Name
	}
	cdiNames := DeviceNames(claimUID, names)
	ids = make([]string, 0, len(devices))
	for i, d := range devices {
		dev := cdispec.Device{Name: cdiNames[i]}
		if d.Edits != nil {
			dev.ContainerEdits = *d.Edits
		}
		spec.Devices = append(spec.Devices, dev)
		ids = append(ids, parser.QualifiedName(Vendor, Class, cdiNames[i]))
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", nil, "", fmt.Errorf("CDI spec version for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	name = SpecName(claimUID) + ".json"
	if err := validate(spec); err != nil {
		return "", nil, "", fmt.Errorf("write CDI spec %s: %w", filepath.Join(w.dir, name), err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return "", nil, "", fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	if err := w.writeAtomic(name, data); err != nil {
		return "", nil, "", fmt.Errorf("CDI spec of claim %s: %w", claimUID, err)
	}
	return name, ids, Hash(data), nil
}

// Hash is the content hash WriteClaim returns and Verify checks.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// writeAtomic replaces name with data: a temporary file, renamed, not
// fsynced (a prepare's latency; the plugin verifies every claim's spec
// against its checkpoint record at start and rewrites a lost one).
func (w *Writer) writeAtomic(name string, data []byte) error {
	return atomicfile.WriteWith(w.dir, name, data, atomicfile.Options{TempPattern: TempPrefix + name + ".*.tmp", Perm: 0o600, NoSync: true})
}

// validate checks a spec with the CDI library's validators, as
// cdi.ReadSpec does once it has parsed a file: the version, the kind's
// vendor and class, the top-level edits, and each device's name and
// edits. It runs on the spec in memory: re-reading the file through the
// library's YAML decoder cost a third of a prepare's CPU, and the bytes
// are json.Marshal of this very struct (TestWrittenSpecsParse reads them
// back with cdi.ReadSpec). Facet sets no annotations, which the library
// validates with an internal package, so any are refused here.
func validate(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if len(spec.Annotations) > 0 {
		return errors.New("invalid CDI spec: Facet's specs carry no annotations")
	}
	if err := (&cdiapi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return err
	}
	if len(spec.Devices) == 0 {
		return errors.New("invalid CDI spec: no devices")
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("invalid CDI spec: device %q twice", d.Name)
		}
		seen[d.Name] = true
		if len(d.Annotations) > 0 {
			return fmt.Errorf("invalid CDI device %q: Facet's specs carry no annotations", d.Name)
		}
		e := d.ContainerEdits
		if len(e.Env)+len(e.DeviceNodes)+len(e.Hooks)+len(e.Mounts)+len(e.NetDevices) == 0 && e.IntelRdt == nil && len(e.AdditionalGIDs) == 0 {
			return fmt.Errorf("invalid CDI device %q: empty device edits", d.Name)
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &e}).Validate(); err != nil {
			return fmt.Errorf("invalid CDI device %q: %w", d.Name, err)
		}
	}
	return nil
}

// Verify checks that the claim's spec exists with the content hash
// WriteClaim returned. A spec lost with a tmpfs at reboot, truncated, or
// edited by hand fails, so the caller rewrites it rather than hand the
// kubelet CDI IDs that resolve to nothing or to something else.
func (w *Writer) Verify(claimUID types.UID, hash string) error {
	if err := claimuid.Validate(claimUID); err != nil {
		return err
	}
	path := filepath.Join(w.dir, SpecName(claimUID)+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("CDI spec %s: %w", path, err)
	}
	if got := Hash(data); got != hash {
		return fmt.Errorf("CDI spec %s: content hash %s, recorded %s", path, got, hash)
	}
	return nil
}

// RemoveClaim deletes the claim's spec; a missing spec is not an error.
func (w *Writer) RemoveClaim(claimUID types.UID) error {
	if err := claimuid.Validate(claimUID); err != nil {
		return err
	}
	path := filepath.Join(w.dir, SpecName(claimUID)+".json")
	// Nothing to remove needs no write: a read-only or full directory
	// must not fail the rollback of a claim whose spec was never written.
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Not fsynced (see WriteClaim): a spec that a power loss brings back
	// has no record by then, and is removed at start.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove CDI spec %s: %w", path, err)
	}
	return nil
}

// SweepTemp removes temporary files a crash left mid-write: this writer's
// own at once, and the CDI library's "spec.*.tmp" (written by earlier
// Facet versions) once they are old enough not to be another writer's
// write in progress. It returns the names it removed.
func (w *Writer) SweepTemp() ([]string, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("sweep CDI spec directory %s: %w", w.dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, ".tmp") {
			continue
		}
		switch {
		case strings.HasPrefix(name, TempPrefix):
		case strings.HasPrefix(name, "spec."):
			info, err := e.Info()
			if err != nil || time.Since(info.ModTime()) < legacyTmpAge {
				continue
			}
		default:
			continue
		}
		if err := os.Remove(filepath.Join(w.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// ClaimSpecs lists the claim UIDs that have a Facet spec in the directory,
// so specs without a checkpoint record (orphans) can be found. Names whose
// UID part is not a valid claim UID are not Facet's and are skipped.
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
		if uid, ok := strings.CutSuffix(name, ".json"); ok && claimuid.Validate(types.UID(uid)) == nil {
			uids = append(uids, types.UID(uid))
		}
	}
	return uids, nil
}

// Dir is the spec directory.
func (w *Writer) Dir() string { return w.dir }
