package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// Option configures a simulated library (OpenMachine, OpenSimulated).
type Option func(*options)

type options struct {
	stateFile string
	faultFile string
}

// WithStateFile keeps the simulated GPUs' MIG mode and MIG instances in a
// JSON file, so that they outlive the process the way they outlive the
// plugin on a real node: a plugin that restarts finds the instances it
// created (and any it leaked). The file is read when the library is opened
// (a missing file means no state yet) and rewritten atomically (temporary
// file, fsync, rename, fsync of the directory) after every change, before
// the NVML call that made it returns. Without this option the state lives
// in memory only.
//
// One process at a time may use a state file. Its MIG mode overrides the
// machine file's migEnabled. It fails to open when it names a GPU the
// machine lacks, a different model, or instances the GPU cannot hold.
//
// The format (version 1):
//
//	{
//	  "version": 1,
//	  "machine": "dgx-h100",
//	  "gpus": [
//	    {
//	      "index": 0, "uuid": "GPU-...", "model": "H100-SXM5-80GB",
//	      "migEnabled": true,
//	      "gpuInstances": [
//	        {
//	          "id": 7, "profileId": 0, "placement": {"start": 0, "size": 1},
//	          "computeInstances": [
//	            {"id": 0, "profileId": 0, "placement": {"start": 0, "size": 1},
//	             "uuid": "MIG-..."}
//	          ]
//	        }
//	      ]
//	    }
//	  ]
//	}
//
// IDs and placements are NVML's (GpuInstanceInfo, ComputeInstanceInfo;
// placements in memory slices for GPU instances, in compute slices of the
// GPU instance for compute instances). A GPU instance's profileId is NVML's
// profile index (GPU_INSTANCE_PROFILE_*, 0 for a 1g), not the ID nvidia-smi
// shows (19): the files written before the simulated profile infos carried
// that ID hold the index, and still load. A compute instance's is its
// profile's ID, which equals its index on every simulated GPU.
func WithStateFile(path string) Option {
	return func(o *options) { o.stateFile = path }
}

const simStateVersion = 1

type simState struct {
	Version int           `json:"version"`
	Machine string        `json:"machine"`
	GPUs    []simGPUState `json:"gpus"`
}

type simGPUState struct {
	Index        int          `json:"index"`
	UUID         string       `json:"uuid"`
	Model        string       `json:"model"`
	MIGEnabled   bool         `json:"migEnabled"`
	GPUInstances []simGIState `json:"gpuInstances,omitempty"`
}

type simGIState struct {
	ID               int          `json:"id"`
	ProfileID        int          `json:"profileId"`
	Placement        simPlacement `json:"placement"`
	ComputeInstances []simCIState `json:"computeInstances,omitempty"`
}

type simCIState struct {
	ID        int          `json:"id"`
	ProfileID int          `json:"profileId"`
	Placement simPlacement `json:"placement"`
	UUID      string       `json:"uuid"`
}

// simPlacement is a placement in the state file.
type simPlacement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// snapshot returns the GPU's state. g.mu is held.
func (g *simGPU) snapshot() simGPUState {
	st := simGPUState{Index: g.index, UUID: g.dev.UUID, Model: g.model, MIGEnabled: g.migMode == nvml.DEVICE_MIG_ENABLE}
	for _, gi := range sortedByID(g.gis) {
		gs := simGIState{ID: gi.id, ProfileID: g.key(gi.profile), Placement: simPlacement{Start: int(gi.placement.Start), Size: int(gi.placement.Size)}}
		for _, ci := range sortedByID(gi.cis) {
			gs.ComputeInstances = append(gs.ComputeInstances, simCIState{
				ID: ci.id, ProfileID: int(ci.profile.Id), UUID: ci.uuid,
				Placement: simPlacement{Start: int(ci.placement.Start), Size: int(ci.placement.Size)},
			})
		}
		st.GPUInstances = append(st.GPUInstances, gs)
	}
	return st
}

// simStore writes the node's state file. Writes are serialized: with a
// state file, MIG changes on different GPUs wait for each other's write (a
// few milliseconds); the NVML calls are otherwise independent.
type simStore struct {
	path    string
	machine string
	mu      sync.Mutex
	gpus    []simGPUState
}

// save records GPU index's new state and rewrites the file. On failure the
// previous state is kept.
func (s *simStore) save(index int, st simGPUState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.gpus[index]
	s.gpus[index] = st
	if err := s.write(); err != nil {
		s.gpus[index] = old
		return err
	}
	return nil
}

// write replaces the file atomically. s.mu is held.
func (s *simStore) write() error {
	return atomicfile.WriteJSON(s.path, "."+filepath.Base(s.path)+".tmp-", simState{Version: simStateVersion, Machine: s.machine, GPUs: s.gpus}, 0o644)
}

// openStore loads the state file into the node (if it exists), then makes
// the node persist every change to it, writing it once at once so that an
// unwritable path fails here rather than at the first MIG change.
func (n *simNode) openStore(path, machine string) error {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("simulated NVML state file: %w", err)
	default:
		if err := n.restore(data, machine); err != nil {
			return fmt.Errorf("simulated NVML state file %s: %w", path, err)
		}
	}
	s := &simStore{path: path, machine: machine}
	for _, g := range n.gpus {
		g.mu.Lock()
		s.gpus = append(s.gpus, g.snapshot())
		g.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.write(); err != nil {
		return fmt.Errorf("simulated NVML state file: %w", err)
	}
	n.store = s
	return nil
}

// restore recreates the state file's MIG mode and instances, with their
// IDs, placements and UUIDs, through the same rules as NVML calls.
func (n *simNode) restore(data []byte, machine string) error {
	var st simState
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	if st.Version != simStateVersion {
		return fmt.Errorf("version %d, want %d", st.Version, simStateVersion)
	}
	if st.Machine != machine {
		return fmt.Errorf("written for machine %q, not %q", st.Machine, machine)
	}
	byUUID := map[string]*simGPU{}
	for _, g := range n.gpus {
		byUUID[g.dev.UUID] = g
	}
	for _, gs := range st.GPUs {
		g, ok := byUUID[gs.UUID]
		if !ok {
			return fmt.Errorf("GPU %s (index %d) is not in machine %s", gs.UUID, gs.Index, machine)
		}
		if err := g.restore(gs); err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	return nil
}

func (g *simGPU) restore(st simGPUState) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.Model != g.model {
		return fmt.Errorf("state file says model %s", st.Model)
	}
	if !migCapable(g.dev.Config) {
		if st.MIGEnabled || len(st.GPUInstances) > 0 {
			return errors.New("MIG state for a GPU without MIG")
		}
		return nil
	}
	g.migMode = nvml.DEVICE_MIG_DISABLE
	if st.MIGEnabled {
		g.migMode = nvml.DEVICE_MIG_ENABLE
	}
	g.pendingMode = g.migMode
	for _, gs := range st.GPUInstances {
		profile, ok := g.cfg.GpuInstanceProfiles[gs.ProfileID]
		if !ok {
			return fmt.Errorf("GPU instance %d: no GPU instance profile %d", gs.ID, gs.ProfileID)
		}
		p := nvml.GpuInstancePlacement{Start: uint32(gs.Placement.Start), Size: uint32(gs.Placement.Size)}
		if ret := g.fits(profile, p); ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance %d (profile %d at %d:%d) cannot be recreated: %s", gs.ID, gs.ProfileID, gs.Placement.Start, gs.Placement.Size, nvml.ErrorString(ret))
		}
		gi, ret := g.createGI(profile, p, gs.ID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance %d: ID unavailable: %s", gs.ID, nvml.ErrorString(ret))
		}
		for _, cs := range gs.ComputeInstances {
			ciProfile, ok := g.cfg.ComputeInstanceProfiles[gs.ProfileID][cs.ProfileID]
			if !ok {
				return fmt.Errorf("GPU instance %d compute instance %d: no compute instance profile %d", gs.ID, cs.ID, cs.ProfileID)
			}
			cp := nvml.ComputeInstancePlacement{Start: uint32(cs.Placement.Start), Size: uint32(cs.Placement.Size)}
			if ret := gi.fits(ciProfile, cp); ret != nvml.SUCCESS {
				return fmt.Errorf("GPU instance %d compute instance %d cannot be recreated: %s", gs.ID, cs.ID, nvml.ErrorString(ret))
			}
			if len(cs.UUID) <= len("MIG-") || cs.UUID[:4] != "MIG-" {
				return fmt.Errorf("GPU instance %d compute instance %d: MIG UUID %q", gs.ID, cs.ID, cs.UUID)
			}
			if _, dup := g.node.migs.Load(cs.UUID); dup {
				return fmt.Errorf("MIG UUID %s listed twice", cs.UUID)
			}
			if _, ret := gi.createCI(ciProfile, cp, cs.ID, cs.UUID); ret != nvml.SUCCESS {
				return fmt.Errorf("GPU instance %d compute instance %d: ID unavailable: %s", gs.ID, cs.ID, nvml.ErrorString(ret))
			}
		}
	}
	return nil
}
