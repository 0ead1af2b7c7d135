// Package fake holds in-memory stand-ins for what the driver reaches through
// its interfaces (package dradriver: EditSource, MIGManager, SpecWriter, Store,
// ShareEditor), so driver tests run as an ordinary user, without a driver
// root, NVML or a mount namespace. Each fake is safe for concurrent use.
package fake

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/hami"
)

// Edits is an EditSource whose edits name device nodes after the GPU (and
// MIG instance) they are for.
type Edits struct{}

// CommonEdits returns the control device node and a marker variable.
func (Edits) CommonEdits() (*cdispec.ContainerEdits, error) {
	return &cdispec.ContainerEdits{Env: []string{"FAKE_COMMON=1"}, DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidiactl"}}}, nil
}

// GPUEdits returns /dev/nvidia-<uuid>.
func (Edits) GPUEdits(uuid string) (*cdispec.ContainerEdits, error) {
	return &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia-" + uuid}}}, nil
}

// MIGEdits returns /dev/nvidia-<parent> and /dev/nvidia-caps/<parent>-<gi>-<ci>.
func (Edits) MIGEdits(parentUUID string, giID, ciID int) (*cdispec.ContainerEdits, error) {
	return &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
		{Path: "/dev/nvidia-" + parentUUID},
		{Path: fmt.Sprintf("/dev/nvidia-caps/%s-%d-%d", parentUUID, giID, ciID)},
	}}, nil
}

// Specs is an in-memory CDI spec directory (a SpecWriter).
type Specs struct {
	mu    sync.Mutex
	specs map[types.UID][]byte
}

// NewSpecs returns an empty spec directory.
func NewSpecs() *Specs { return &Specs{specs: map[types.UID][]byte{}} }

// WriteClaim stores the spec as claimcdi.Writer would write it (JSON), with the
// same names and IDs.
func (s *Specs) WriteClaim(claimUID types.UID, common *cdispec.ContainerEdits, devices []claimcdi.Device) (string, []string, string, error) {
	spec := &cdispec.Spec{Version: cdispec.CurrentVersion, Kind: claimcdi.Kind}
	if common != nil {
		spec.ContainerEdits = *common
	}
	devNames := make([]string, len(devices))
	for i, d := range devices {
		devNames[i] = d.Name
	}
	cdiNames := claimcdi.DeviceNames(claimUID, devNames)
	ids := make([]string, 0, len(devices))
	for i, d := range devices {
		dev := cdispec.Device{Name: cdiNames[i]}
		if d.Edits != nil {
			dev.ContainerEdits = *d.Edits
		}
		spec.Devices = append(spec.Devices, dev)
		ids = append(ids, claimcdi.Kind+"="+cdiNames[i])
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return "", nil, "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.specs[claimUID] = data
	return claimcdi.SpecName(claimUID) + ".json", ids, claimcdi.Hash(data), nil
}

// Verify fails unless the claim's spec exists with the given hash.
func (s *Specs) Verify(claimUID types.UID, hash string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.specs[claimUID]
	switch {
	case !ok:
		return fmt.Errorf("CDI spec of claim %s is missing", claimUID)
	case claimcdi.Hash(data) != hash:
		return fmt.Errorf("CDI spec of claim %s was changed", claimUID)
	}
	return nil
}

// RemoveClaim forgets a claim's spec; a missing one is no error.
func (s *Specs) RemoveClaim(claimUID types.UID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.specs, claimUID)
	return nil
}

// SweepTemp has nothing to sweep.
func (s *Specs) SweepTemp() ([]string, error) { return nil, nil }

// ClaimSpecs lists the claims with a spec, sorted.
func (s *Specs) ClaimSpecs() ([]types.UID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.specs)), nil
}

// Dir is no real directory.
func (s *Specs) Dir() string { return "/nonexistent/fake-cdi" }

// Spec returns a claim's spec as JSON, "" if it has none.
func (s *Specs) Spec(claimUID types.UID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.specs[claimUID])
}

// Delete drops a claim's spec, as a tmpfs lost at reboot would.
func (s *Specs) Delete(claimUID types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.specs, claimUID)
}

// Store is an in-memory checkpoint. Records are kept as JSON, so what the
// driver changes after Put is not seen until it puts it again, as with the
// real store.
type Store struct {
	mu      sync.Mutex
	records map[types.UID][]byte
	corrupt map[types.UID][]byte
}

// NewStore returns an empty checkpoint.
func NewStore() *Store {
	return &Store{records: map[types.UID][]byte{}, corrupt: map[types.UID][]byte{}}
}

func decode(data []byte) *checkpoint.Claim {
	var c checkpoint.Claim
	if err := json.Unmarshal(data, &c); err != nil {
		panic(err) // only this package encodes
	}
	return &c
}

func errCorrupt(uid types.UID) error {
	return fmt.Errorf("%w: fake record %s", checkpoint.ErrCorrupt, uid)
}

// Get returns a copy of a claim's record, nil if there is none.
func (s *Store) Get(uid types.UID) (*checkpoint.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, bad := s.corrupt[uid]; bad {
		return nil, errCorrupt(uid)
	}
	data, ok := s.records[uid]
	if !ok {
		return nil, nil
	}
	return decode(data), nil
}

// Salvage returns what Corrupt was given for uid.
func (s *Store) Salvage(uid types.UID) (*checkpoint.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.corrupt[uid]
	if !ok || data == nil {
		return nil, fmt.Errorf("fake record %s cannot be salvaged", uid)
	}
	return decode(data), nil
}

// Put stores a copy of c, replacing a corrupt record of its claim.
func (s *Store) Put(c *checkpoint.Claim) error {
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.corrupt, c.UID)
	s.records[c.UID] = data
	return nil
}

// Delete removes a claim's record, corrupt or not; a missing one is fine.
func (s *Store) Delete(uid types.UID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, uid)
	delete(s.corrupt, uid)
	return nil
}

// List returns copies of the readable records, sorted by UID, and the
// corrupt ones.
func (s *Store) List() ([]*checkpoint.Claim, map[types.UID]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var claims []*checkpoint.Claim
	for _, data := range s.records {
		claims = append(claims, decode(data))
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].UID < claims[j].UID })
	corrupt := map[types.UID]error{}
	for uid := range s.corrupt {
		corrupt[uid] = errCorrupt(uid)
	}
	return claims, corrupt, nil
}

// Corrupt makes uid's record unreadable; Salvage then returns salvaged
// (nil: nothing can be salvaged).
func (s *Store) Corrupt(uid types.UID, salvaged *checkpoint.Claim) {
	var data []byte
	if salvaged != nil {
		var err error
		if data, err = json.Marshal(salvaged); err != nil {
			panic(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, uid)
	s.corrupt[uid] = data
}

// MIG is an in-memory MIG manager for the GPUs it is given: it places
// instances by their profiles' memory slices and refuses overlaps, and
// (like NVML) refuses to turn MIG mode off while instances exist. Its
// errors are plain ones: nvmlgpu.IsInUse and IsInsufficientResources do not
// recognise them.
type MIG struct {
	mu        sync.Mutex
	gpus      map[string]nvmlgpu.GPU
	enabled   map[string]bool
	instances map[string][]nvmlgpu.MIGInstance
	nextID    int
}

// NewMIG manages MIG on gpus.
func NewMIG(gpus []nvmlgpu.GPU) *MIG {
	m := &MIG{gpus: map[string]nvmlgpu.GPU{}, enabled: map[string]bool{}, instances: map[string][]nvmlgpu.MIGInstance{}, nextID: 1}
	for _, g := range gpus {
		m.gpus[g.UUID] = g
	}
	return m
}

func (m *MIG) gpu(uuid string) (nvmlgpu.GPU, error) {
	g, ok := m.gpus[uuid]
	if !ok {
		return g, fmt.Errorf("no GPU %s", uuid)
	}
	if !g.MIGCapable {
		return g, fmt.Errorf("GPU %s is not MIG-capable", uuid)
	}
	return g, nil
}

// EnableMIG turns MIG mode on, reporting whether it was off.
func (m *MIG) EnableMIG(parentUUID string) (bool, error) { return m.setMIG(parentUUID, true) }

// DisableMIG turns MIG mode off, reporting whether it was on; it fails
// while the GPU has instances.
func (m *MIG) DisableMIG(parentUUID string) (bool, error) { return m.setMIG(parentUUID, false) }

func (m *MIG) setMIG(parentUUID string, on bool) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.gpu(parentUUID); err != nil {
		return false, err
	}
	if !on && len(m.instances[parentUUID]) > 0 {
		return false, fmt.Errorf("GPU %s: MIG instances exist (in use)", parentUUID)
	}
	changed := m.enabled[parentUUID] != on
	m.enabled[parentUUID] = on
	return changed, nil
}

// CreateMIG creates an instance of a profile at a placement.
func (m *MIG) CreateMIG(parentUUID string, giProfileID, placementStart int) (nvmlgpu.MIGInstance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpu(parentUUID)
	if err != nil {
		return nvmlgpu.MIGInstance{}, err
	}
	if !m.enabled[parentUUID] {
		return nvmlgpu.MIGInstance{}, fmt.Errorf("GPU %s: %w", parentUUID, nvmlgpu.ErrMIGDisabled)
	}
	var prof *nvmlgpu.MIGProfile
	for i := range g.MIGProfiles {
		if g.MIGProfiles[i].GIProfileID == giProfileID {
			prof = &g.MIGProfiles[i]
		}
	}
	if prof == nil {
		return nvmlgpu.MIGInstance{}, fmt.Errorf("GPU %s: no GI profile with NVML index %d", parentUUID, giProfileID)
	}
	p := nvmlgpu.Placement{Start: placementStart, Size: prof.MemorySlices}
	for _, in := range m.instances[parentUUID] {
		if p.Start < in.Placement.Start+in.Placement.Size && in.Placement.Start < p.Start+p.Size {
			return nvmlgpu.MIGInstance{}, fmt.Errorf("GPU %s: placement %d overlaps GI %d (insufficient resources)", parentUUID, p.Start, in.GIID)
		}
	}
	in := nvmlgpu.MIGInstance{ParentUUID: parentUUID, ParentIndex: g.Index, Profile: prof.Name, GIProfileID: giProfileID, GIProfileInfoID: prof.GIProfileInfoID, CIProfileID: prof.CIProfileID,
		Placement: p, GIID: m.nextID, CIID: 0, UUID: fmt.Sprintf("MIG-fake-%s-%d", parentUUID, m.nextID)}
	m.nextID++
	m.instances[parentUUID] = append(m.instances[parentUUID], in)
	return in, nil
}

// DestroyMIG destroys an instance.
func (m *MIG) DestroyMIG(parentUUID string, giID, ciID int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := m.instances[parentUUID]
	for i, in := range list {
		if in.GIID == giID && in.CIID == ciID {
			m.instances[parentUUID] = append(list[:i:i], list[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("GPU %s: no GI %d CI %d (not found)", parentUUID, giID, ciID)
}

// ListMIGOn lists a GPU's instances.
func (m *MIG) ListMIGOn(parentUUID string) ([]nvmlgpu.MIGInstance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.gpu(parentUUID); err != nil {
		return nil, err
	}
	return append([]nvmlgpu.MIGInstance(nil), m.instances[parentUUID]...), nil
}

// Count is the number of instances on all GPUs.
func (m *MIG) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, l := range m.instances {
		n += len(l)
	}
	return n
}

// HAMi is a ShareEditor that renders HAMi-core's limits as environment
// variables and keeps each claim's accounting region as a directory under
// a root (a test's temporary directory), so the driver's check that the
// region exists works unchanged.
type HAMi struct {
	root string
}

// NewHAMi keeps accounting regions under root.
func NewHAMi(root string) *HAMi { return &HAMi{root: root} }

// CacheDir is root/<claim UID>.
func (h *HAMi) CacheDir(claimUID types.UID) (string, error) {
	if claimUID == "" || strings.ContainsAny(string(claimUID), `/\`) || claimUID == "." || claimUID == ".." {
		return "", fmt.Errorf("claim UID %q is not a path element", claimUID)
	}
	return filepath.Join(h.root, string(claimUID)), nil
}

// Edits creates a fresh accounting region and returns one limit pair per
// share, indexed in the order given.
func (h *HAMi) Edits(claimUID types.UID, shares []hami.Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	dir, err := h.CacheDir(claimUID)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	return h.RebuildEdits(claimUID, shares, cfg)
}

// RebuildEdits is Edits keeping an existing accounting region.
func (h *HAMi) RebuildEdits(claimUID types.UID, shares []hami.Share, cfg *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	dir, err := h.CacheDir(claimUID)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	e := &cdispec.ContainerEdits{Env: append([]string(nil), cfg.HAMiCoreEnv()...)}
	for i, s := range shares {
		e.Env = append(e.Env, fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d=%dm", i, s.MemoryBytes>>20), fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d=%d", i, s.Cores))
	}
	e.Env = append(e.Env, "CUDA_DEVICE_MEMORY_SHARED_CACHE="+filepath.Join(dir, "vgpu.cache"))
	return e, nil
}

// Cleanup removes a claim's accounting region; a missing one is fine.
func (h *HAMi) Cleanup(claimUID types.UID) error {
	dir, err := h.CacheDir(claimUID)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// ClaimCaches lists the claims with an accounting region.
func (h *HAMi) ClaimCaches() ([]types.UID, error) {
	entries, err := os.ReadDir(h.root)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []types.UID
	for _, e := range entries {
		out = append(out, types.UID(e.Name()))
	}
	return out, nil
}
