package dradriver

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// specs is the driver's spec writing: the edits that make a claim's
// devices and limits visible in its containers, and the CDI spec that
// carries them. It knows nothing of admission or MPS; buildSpec composes
// its pieces with the MPS partition a claim joins.
type specs struct {
	cdi   SpecWriter
	edits EditSource
	// sharing has HAMi-core, which enforces vGPU shares, as it is now.
	sharing *sharing.Set

	// common edits are the same for every claim; computed once.
	common *cdispec.ContainerEdits
	// gpuEdits caches each whole GPU's edits, which depend only on the
	// GPU: nvcdi walks NVML and the driver root for them, which prepare
	// need not repeat. Filled on first use, so one GPU nvcdi cannot
	// describe fails only the claims on it. editsMu guards only the map:
	// each GPU's entry has its own lock, so a GPU whose nvcdi call hangs
	// holds up the claims on it alone.
	editsMu  sync.Mutex
	gpuEdits map[string]*gpuEditsEntry
}

type gpuEditsEntry struct {
	mu    sync.Mutex
	edits *cdispec.ContainerEdits
}

// claimDevices are a claim's CDI devices, one per recorded device in
// rec.Devices' order (writeSpec relies on it), with the names and the GPU or
// MIG UUIDs the claim-wide environment lists.
type claimDevices struct {
	devices []claimcdi.Device
	names   []string
	uuids   []string
}

// deviceEdits returns the edits of each of rec's devices: a MIG device's
// or a whole GPU's from nvcdi; a second share of a GPU gets a placeholder.
func (s *specs) deviceEdits(rec *checkpoint.Claim) (claimDevices, error) {
	out := claimDevices{devices: make([]claimcdi.Device, 0, len(rec.Devices))}
	seen := map[string]bool{}
	for _, dev := range rec.Devices {
		var edits *cdispec.ContainerEdits
		var err error
		switch {
		case seen[dev.Device]:
			// A second share of a GPU in this claim: the container
			// already gets the GPU's device node from the first, and
			// one node injected twice can fail the container's start.
			// A CDI device needs some edit; this one names the share.
			edits = &cdispec.ContainerEdits{Env: []string{fmt.Sprintf("FACET_SHARE_%d=%s", len(out.devices), dev.Device)}}
		case dev.MIG != nil:
			edits, err = s.edits.MIGEdits(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)
			out.uuids = append(out.uuids, dev.MIG.UUID)
		default:
			edits, err = s.wholeGPUEdits(dev.GPUUUID)
			out.uuids = append(out.uuids, dev.GPUUUID)
		}
		if err != nil {
			return claimDevices{}, fmt.Errorf("device %s: %w", dev.Device, err)
		}
		seen[dev.Device] = true
		out.devices = append(out.devices, claimcdi.Device{Name: dev.Device, Edits: edits})
		out.names = append(out.names, dev.Device)
	}
	return out, nil
}

// wholeGPUEdits returns a whole GPU's edits, asking nvcdi only once per GPU
// (and again after a failure).
func (s *specs) wholeGPUEdits(gpuUUID string) (*cdispec.ContainerEdits, error) {
	s.editsMu.Lock()
	entry, ok := s.gpuEdits[gpuUUID]
	if !ok {
		entry = &gpuEditsEntry{}
		s.gpuEdits[gpuUUID] = entry
	}
	s.editsMu.Unlock()
	entry.mu.Lock()
	defer entry.mu.Unlock()
	if entry.edits != nil {
		return entry.edits, nil
	}
	e, err := s.edits.GPUEdits(gpuUUID)
	if err != nil {
		return nil, err
	}
	entry.edits = e
	return e, nil
}

// claimCommon is a copy of the common edits with the claim-wide
// environment added; later edits append to the copy, never to s.common.
func (s *specs) claimCommon(rec *checkpoint.Claim, devs claimDevices) cdispec.ContainerEdits {
	common := *s.common
	// Which devices the container got, readable by the workload and by
	// an operator with kubectl exec. Not NVIDIA_VISIBLE_DEVICES: nvcdi
	// sets it to "void" to tell NVIDIA's legacy hook that CDI did the
	// work.
	common.Env = append(append([]string(nil), common.Env...),
		"FACET_CLAIM="+rec.Namespace+"/"+rec.Name,
		"FACET_DEVICES="+strings.Join(devs.names, ","),
		"FACET_GPU_UUIDS="+strings.Join(devs.uuids, ","),
	)
	return common
}

// hamiEdits are HAMi-core's edits for a claim's shares (memory in bytes,
// cores in percent, 0: no throttle). keepRegion rebuilds a prepared
// claim's edits without resetting the region its containers use.
func (s *specs) hamiEdits(ctx context.Context, uid types.UID, shares []hami.Share, vgpu *configapi.VgpuConfig, keepRegion bool) (*cdispec.ContainerEdits, error) {
	h, why := s.sharing.OpenHAMi(ctx)
	if h == nil {
		if why != nil {
			return nil, fmt.Errorf("vGPU shares need HAMi-core, which is unavailable on this node: %w", why)
		}
		return nil, fmt.Errorf("vGPU shares need HAMi-core, but the plugin runs without --hami-library")
	}
	editsFor := h.Edits
	if keepRegion {
		editsFor = h.RebuildEdits
	}
	return editsFor(uid, shares, vgpu)
}

// writeSpec writes the claim's CDI spec and records its name, hash and each
// device's CDI ID in rec (not yet in the checkpoint).
func (s *specs) writeSpec(rec *checkpoint.Claim, common *cdispec.ContainerEdits, devices []claimcdi.Device) error {
	specName, ids, hash, err := s.cdi.WriteClaim(rec.UID, common, devices)
	if err != nil {
		return err
	}
	rec.CDISpec, rec.CDISpecHash = specName, hash
	for i := range rec.Devices {
		rec.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

// addEdits appends e's environment and mounts to common, whose Env is
// already claimCommon's copy; the mounts are copied, as s.common's may
// still be shared.
func addEdits(common *cdispec.ContainerEdits, e *cdispec.ContainerEdits) {
	common.Env = append(common.Env, e.Env...)
	common.Mounts = append(append([]*cdispec.Mount(nil), common.Mounts...), e.Mounts...)
}
