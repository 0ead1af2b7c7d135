package driver

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/checkpoint"
	"github.com/facet-gpu/facet/pkg/mps"
)

// Partitioner runs the MPS control daemons that partition GPUs' SMs among
// the vGPU shares and slots on them (package mps). The driver tells it
// which claims hold which GPU; it keeps one daemon per held GPU.
type Partitioner interface {
	// Acquire makes the claim a holder of the GPU's daemon, starting or
	// adopting it.
	Acquire(ctx context.Context, gpuUUID string, claim types.UID) error
	// Release drops the claim from every GPU, stopping daemons left
	// without holders.
	Release(ctx context.Context, claim types.UID) error
	// Edits are a share's CDI edits for the GPU's daemon, with its cores
	// in percent (0: best effort, no partition).
	Edits(gpuUUID string, cores int64) *cdispec.ContainerEdits
	// Daemon is the GPU's live daemon, nil if none.
	Daemon(gpuUUID string) *mps.Record
	// Restore, at start, hands over the holders the checkpoint records,
	// and returns the GPUs whose daemon had to be started again.
	Restore(ctx context.Context, holders map[string][]types.UID) ([]string, error)
	// Check restarts dead daemons and returns their holders by GPU.
	Check(ctx context.Context) (map[string][]types.UID, error)
}

var _ Partitioner = (*mps.Manager)(nil)

// partitioner turns a nil *mps.Manager into a nil interface.
func partitioner(p Partitioner) Partitioner {
	if m, ok := p.(*mps.Manager); ok && m == nil {
		return nil
	}
	return p
}

// ReasonMPSRestarted is the reason of the Warning Event a claim gets when
// its GPU's MPS control daemon died and was started again: the claim's
// running MPS clients lost their server.
const ReasonMPSRestarted = "FacetMPSDaemonRestarted"

// ReasonMPSNotApplied is the reason of the Normal Event a claim gets when
// its shares default to MPS but are time-sliced instead (they span
// several GPUs).
const ReasonMPSNotApplied = "FacetMPSNotApplied"

// MPSAvailable says whether this plugin partitions shares with MPS.
func (d *Driver) MPSAvailable() bool { return d.mps != nil }

// mpsGPU decides whether a claim's shares are MPS-partitioned and on which
// GPU: "" for time-sliced. An explicit "mps" that cannot be honoured fails
// the claim; the default falls back to time-slicing, with a reason.
func (d *Driver) mpsGPU(rec *checkpoint.Claim, vgpu *configapi.VgpuConfig) (gpu, fallback string, err error) {
	if vgpu == nil || !vgpu.EnforcementEnabled() {
		return "", "", nil
	}
	explicit := vgpu.Partitioning != nil
	if vgpu.PartitioningFor(d.mps != nil) != configapi.PartitioningMPS {
		return "", "", nil
	}
	if d.mps == nil {
		why := "the plugin runs without MPS (--mps=false)"
		if d.mpsErr != nil {
			why = d.mpsErr.Error()
		}
		return "", "", fmt.Errorf("VgpuConfig partitioning %q: MPS is unavailable on this node: %s", configapi.PartitioningMPS, why)
	}
	for _, dev := range rec.Devices {
		var why string
		switch {
		case dev.Share == nil || !dev.Share.Enforced:
			why = fmt.Sprintf("device %s is not an enforced vGPU share or slot", dev.Device)
		case gpu != "" && dev.GPUUUID != gpu:
			why = fmt.Sprintf("its shares are on GPUs %s and %s, and a container joins one MPS daemon (one CUDA_MPS_PIPE_DIRECTORY)", gpu, dev.GPUUUID)
		}
		if why != "" {
			if explicit {
				return "", "", fmt.Errorf("VgpuConfig partitioning %q: %s", configapi.PartitioningMPS, why)
			}
			return "", "time-sliced by HAMi-core instead of MPS-partitioned: " + why, nil
		}
		gpu = dev.GPUUUID
	}
	return gpu, "", nil
}

// mpsEdits joins a claim to its GPU's daemon and returns the spec's MPS
// edits, marking its shares as MPS-partitioned in the record.
func (d *Driver) mpsEdits(ctx context.Context, rec *checkpoint.Claim, gpu string) (*cdispec.ContainerEdits, error) {
	if err := d.mps.Acquire(ctx, gpu, rec.UID); err != nil {
		return nil, err
	}
	d.failpoint("prepare/acquired-mps")
	// The claim's shares on the GPU are one client's partition: their
	// cores add up, and a best-effort share leaves it unpartitioned.
	var cores int64
	for i := range rec.Devices {
		s := rec.Devices[i].Share
		s.MPS = true
		switch {
		case cores < 0:
		case s.Cores == 0:
			cores = -1
		default:
			cores = min(100, cores+s.Cores)
		}
	}
	if cores < 0 {
		cores = 0
	}
	return d.mps.Edits(gpu, cores), nil
}

// mpsHolders are the GPUs that this boot's prepared records hold under MPS.
func mpsHolders(claims []*checkpoint.Claim, otherBoot func(*checkpoint.Claim) bool) map[string][]types.UID {
	holders := map[string][]types.UID{}
	for _, c := range claims {
		if c.State != checkpoint.StatePrepared || otherBoot(c) {
			// A claim of the last boot joins again when it is rebuilt.
			continue
		}
		seen := map[string]bool{}
		for _, dev := range c.Devices {
			if dev.Share != nil && dev.Share.MPS && !seen[dev.GPUUUID] {
				seen[dev.GPUUUID] = true
				holders[dev.GPUUUID] = append(holders[dev.GPUUUID], c.UID)
			}
		}
	}
	return holders
}

// restoreMPS hands the checkpoint's holders to the daemon manager: it
// adopts their daemons, restarts dead ones (an Event on their claims), and
// stops those no claim holds.
func (d *Driver) restoreMPS(ctx context.Context) {
	if d.mps == nil {
		return
	}
	claims, _, err := d.store.List()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing claims for their MPS daemons")
		return
	}
	d.syncMPS(ctx, claims)
}

// syncMPS hands the records' MPS holders to the daemon manager.
func (d *Driver) syncMPS(ctx context.Context, claims []*checkpoint.Claim) {
	if d.mps == nil {
		return
	}
	holders := mpsHolders(claims, d.fromOtherBoot)
	restarted, err := d.mps.Restore(ctx, holders)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Restoring MPS control daemons; claims on them retry at their next prepare")
	}
	for _, gpu := range restarted {
		d.mpsRestarted(ctx, gpu, holders[gpu])
	}
}

// CheckMPS restarts MPS control daemons that died and raises an Event on
// each claim whose daemon was restarted.
func (d *Driver) CheckMPS(ctx context.Context) {
	if d.mps == nil {
		return
	}
	restarted, err := d.mps.Check(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Restarting MPS control daemons")
	}
	for gpu, claims := range restarted {
		d.mpsRestarted(ctx, gpu, claims)
	}
}

// RunMPSWatch calls CheckMPS every interval until ctx ends.
func (d *Driver) RunMPSWatch(ctx context.Context, interval time.Duration) {
	if d.mps == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.CheckMPS(ctx)
		}
	}
}

func (d *Driver) mpsRestarted(ctx context.Context, gpu string, claims []types.UID) {
	msg := fmt.Sprintf("the MPS control daemon of GPU %s had died and was started again; CUDA processes of this claim that were its clients lost their MPS server and must be restarted", gpu)
	klog.FromContext(ctx).Error(nil, "MPS control daemon restarted", "gpu", gpu, "claims", claims)
	if d.events == nil {
		return
	}
	for _, uid := range claims {
		ref, ok := d.claimRefOf(uid)
		if !ok {
			continue
		}
		d.events.Event(&corev1.ObjectReference{
			APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
			Namespace: ref.namespace, Name: ref.name, UID: ref.uid,
		}, corev1.EventTypeWarning, ReasonMPSRestarted, msg)
	}
}

// mpsNotApplied tells a claim why its shares are time-sliced.
func (d *Driver) mpsNotApplied(rec *checkpoint.Claim, why string) {
	if d.events == nil {
		return
	}
	d.events.Event(&corev1.ObjectReference{
		APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
		Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID,
	}, corev1.EventTypeNormal, ReasonMPSNotApplied, why)
}

// claimRefOf finds a prepared claim's name by UID in the occupancy.
func (d *Driver) claimRefOf(uid types.UID) (claimRef, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, uses := range d.occ {
		for _, u := range uses {
			if u.owner.uid == uid {
				return u.owner, true
			}
		}
	}
	return claimRef{}, false
}
