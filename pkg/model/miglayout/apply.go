package miglayout

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// MIG is what applying a layout needs of NVML (package nvmlgpu's Library).
type MIG interface {
	EnableMIG(parentUUID string) (bool, error)
	CreateMIG(parentUUID string, giProfileID, placementStart int) (nvmlgpu.MIGInstance, error)
	DestroyMIG(parentUUID string, giID, ciID int) error
}

// Record is what Facet carved on one GPU for a layout: the only instances
// it may ever destroy again.
type Record struct {
	Layout    string      `json:"layout"`
	Instances []Ownership `json:"instances"`
}

// Ownership identifies one instance Facet created.
type Ownership struct {
	GIProfileID int `json:"giProfileID"`
	Start       int `json:"start"`
	GIID        int `json:"giID"`
	CIID        int `json:"ciID"`
}

// Store keeps the Records of a node in one file, by GPU UUID, replaced
// atomically (temp file, fsync, rename, fsync of the directory).
type Store struct{ path string }

// NewStore keeps records in path (e.g. <state dir>/mig-layouts.json).
func NewStore(path string) *Store { return &Store{path: path} }

// Load reads every record; a missing file is no record. A corrupt file is
// an error: without it Facet cannot know what it owns, so it must not
// destroy anything.
func (s *Store) Load() (map[string]Record, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Record{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]Record{}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("MIG layout records %s are corrupt (%v); Facet will not change any layout until the file is removed", s.path, err)
	}
	return out, nil
}

func (s *Store) save(all map[string]Record) error {
	return atomicfile.WriteJSON(s.path, filepath.Base(s.path)+".tmp", all, 0o600)
}

// Outcome says what Apply did on one GPU.
type Outcome struct {
	// Changed is set when instances were destroyed or created.
	Changed bool
	// Note explains a layout left unapplied (foreign instances, claims
	// prepared on the GPU); empty when the layout is in place.
	Note string
}

// Apply puts a layout on a GPU, unless it is there already:
//   - busy (a prepared claim holds the GPU): nothing changes, with a note;
//   - the GPU holds instances Facet did not record creating (mig-parted's,
//     an admin's): nothing changes, with a note. Facet never destroys an
//     instance it did not create;
//   - otherwise the instances Facet recorded are destroyed, MIG mode is
//     turned on, and the layout's instances are created, each recorded as
//     soon as it exists, so a crash leaves nothing unowned that Facet made
//     through a finished call.
//
// existing are the GPU's instances now (nvml ListMIG, this GPU's only).
func Apply(mig MIG, store *Store, gpu nvmlgpu.GPU, layout string, existing []nvmlgpu.MIGInstance, busy bool) (Outcome, error) {
	plan, err := Plan(layout, gpu.MIGProfiles)
	if err != nil {
		return Outcome{}, err
	}
	if Matches(plan, existing) {
		return Outcome{}, nil
	}
	if busy {
		return Outcome{Note: fmt.Sprintf("MIG layout %s not applied: claims are prepared on the GPU; it is applied at the next start with none", layout)}, nil
	}
	records, err := store.Load()
	if err != nil {
		return Outcome{}, err
	}
	rec := records[gpu.UUID]
	owned := map[[2]int]bool{}
	for _, o := range rec.Instances {
		owned[[2]int{o.GIID, o.CIID}] = true
	}
	for _, in := range existing {
		if !owned[[2]int{in.GIID, in.CIID}] {
			return Outcome{Note: fmt.Sprintf("MIG layout %s not applied: the GPU has MIG instances Facet did not create (GI %d, %s at memory slice %d); "+
				"they are published as they are. Remove them (nvidia-smi mig -dci; nvidia-smi mig -dgi) for Facet to apply the layout", layout, in.GIID, in.Profile, in.Placement.Start)}, nil
		}
	}
	out := Outcome{}
	for _, in := range existing {
		if err := mig.DestroyMIG(gpu.UUID, in.GIID, in.CIID); err != nil {
			return out, fmt.Errorf("MIG layout %s: destroy the instance Facet made before (GI %d CI %d): %w", layout, in.GIID, in.CIID, err)
		}
		out.Changed = true
	}
	rec = Record{Layout: layout}
	records[gpu.UUID] = rec
	if err := store.save(records); err != nil {
		return out, err
	}
	if _, err := mig.EnableMIG(gpu.UUID); err != nil {
		return out, fmt.Errorf("MIG layout %s: %w", layout, err)
	}
	for _, p := range plan {
		in, err := mig.CreateMIG(gpu.UUID, p.Profile.GIProfileID, p.Placement.Start)
		if err != nil {
			return out, fmt.Errorf("MIG layout %s: create %s at memory slice %d: %w", layout, p.Profile.Name, p.Placement.Start, err)
		}
		out.Changed = true
		rec.Instances = append(rec.Instances, Ownership{GIProfileID: in.GIProfileID, Start: in.Placement.Start, GIID: in.GIID, CIID: in.CIID})
		records[gpu.UUID] = rec
		if err := store.save(records); err != nil {
			return out, err
		}
	}
	return out, nil
}
