package dradriver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/mps"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// ReasonMPSRestarted is the reason of the Warning Event a claim gets when
// its GPU's MPS control daemon died and was started again: the claim's
// running MPS clients lost their server.
const ReasonMPSRestarted = "FacetMPSDaemonRestarted"

// ReasonMPSNotApplied is the reason of the Normal Event a claim gets when
// its shares default to MPS but are time-sliced instead (they span
// several GPUs).
const ReasonMPSNotApplied = "FacetMPSNotApplied"

// mpsClients are the claims as MPS clients: which GPU's daemon a claim's
// shares join, as which Unix UID, and why they are time-sliced instead;
// and which claims hold each daemon, handed to facet-mps (sharing.Set's
// MPS) at start, after it comes back and when its daemons died.
type mpsClients struct {
	// sharing has the node's MPS as it is now: nil, with the reason,
	// while facet-mps is missing.
	sharing *sharing.Set
	// pods reads the pods of a claim, for their UID; nil: none is known.
	pods PodGetter
	// store has the prepared records, which say who holds which daemon.
	store Store
	// held names the claims that hold a daemon, for a conflict's message
	// and the Events of a restart.
	held *ledger
	obs  *observer
	// bootID is this boot's: a record of another boot joins again when
	// its claim is rebuilt, and holds no daemon before.
	bootID string
	// failpoint is Driver.failpoint, which reads its hook at each call.
	failpoint func(string)
}

// partition decides and joins the MPS partition of a claim's enforced
// shares (vgpu nil or unenforced: none), and returns the spec's MPS
// edits; nil where the shares are time-sliced, the claim then told why
// (an Event). It first clears the record's MPS state: decided afresh at
// each (re)build, except for the UID a rebuilt claim joined its daemon as.
func (m *mpsClients) partition(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim, vgpu *configapi.VgpuConfig) (*cdispec.ContainerEdits, error) {
	recordedUser := rec.MPSUser
	rec.MPSUser = nil
	for i := range rec.Devices {
		if s := rec.Devices[i].Share; s != nil {
			s.MPS = false
		}
	}
	if vgpu == nil || !vgpu.EnforcementEnabled() {
		return nil, nil
	}
	gpu, fallback, err := m.pick(rec, vgpu)
	if err != nil {
		return nil, err
	}
	var edits *cdispec.ContainerEdits
	if gpu != "" {
		rec.MPSUser = recordedUser
		explicit := vgpu.Partitioning != nil && *vgpu.Partitioning == configapi.PartitioningMPS
		edits, fallback, err = m.join(ctx, claim, rec, gpu, explicit)
		if err != nil {
			return nil, err
		}
	}
	if fallback != "" {
		klog.FromContext(ctx).Info("Shares not MPS-partitioned", "claim", klog.KRef(rec.Namespace, rec.Name), "why", fallback)
		m.obs.mpsNotApplied(claim, fallback)
	}
	return edits, nil
}

// pick decides whether a claim's shares are MPS-partitioned and on which
// GPU: "" for time-sliced, with the reason in fallback where the claim is
// told (an Event). The policy (docs/mps.md, "Compute policy"):
//   - "mps" that cannot be honoured fails the claim;
//   - "time-sliced" is time-sliced;
//   - "best-effort" is MPS where the node has it, else time-sliced, told;
//   - unset is MPS. Where MPS is configured (--mps=auto) but unavailable
//     now, a claim whose shares ask for a compute limit (cores 1-99) fails,
//     naming why: HAMi-core's throttle does not hold it (a 20 % share ran
//     at 69 % of an H200), and the shipped DeviceClasses only let such a
//     claim onto GPUs that publish computePartitioning "mps", so it got
//     here on a state that has since changed. Shares without a compute
//     limit (0 or 100) have nothing to partition and are time-sliced, and
//     so is every share of a node whose admin turned MPS off (--mps=off:
//     its slices say "time-sliced", and only a class that accepts that
//     selects them).
func (m *mpsClients) pick(rec *checkpoint.Claim, vgpu *configapi.VgpuConfig) (gpu, fallback string, err error) {
	if vgpu == nil || !vgpu.EnforcementEnabled() {
		return "", "", nil
	}
	mp, mpsErr := m.sharing.MPS()
	asked := vgpu.Partitioning
	if asked != nil && *asked == configapi.PartitioningTimeSliced {
		return "", "", nil
	}
	if mp == nil {
		why := "the plugin runs without MPS (--mps=off)"
		if mpsErr != nil {
			why = mpsErr.Error()
		}
		switch {
		case asked != nil && *asked == configapi.PartitioningMPS:
			return "", "", fmt.Errorf("VgpuConfig partitioning %q: MPS is unavailable on this node: %s", configapi.PartitioningMPS, why)
		case asked != nil && *asked == configapi.PartitioningBestEffort:
			return "", "time-sliced by HAMi-core, its compute limit best effort (VgpuConfig partitioning \"best-effort\"): MPS is unavailable on this node: " + why, nil
		}
		if dev, cores, ok := computeLimited(rec); ok && !sharing.Off(mpsErr) {
			return "", "", fmt.Errorf("device %s asks for %d%% of the GPU's SMs, which only MPS holds, and MPS is unavailable on this node: %s; a claim that accepts HAMi-core's time-slicing, whose limit does not hold for GEMMs, sets VgpuConfig partitioning %q (DeviceClass %s)",
				dev, cores, why, configapi.PartitioningBestEffort, names.ClassVGPUBestEffort)
		}
		return "", "", nil
	}
	explicit := asked != nil && *asked == configapi.PartitioningMPS
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

// computeLimited finds a device of rec whose share asks for a compute
// limit MPS would hold: cores strictly between 0 (best effort) and 100.
func computeLimited(rec *checkpoint.Claim) (device string, cores int64, ok bool) {
	for _, dev := range rec.Devices {
		if s := dev.Share; s != nil && s.Enforced && s.Cores > 0 && s.Cores < 100 {
			return dev.Device, s.Cores, true
		}
	}
	return "", 0, false
}

// PodGetter reads a pod (client-go's Pods(namespace).Get in the plugin).
type PodGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// ReasonMPSUser is the reason of the Warning Event a claim and its pods
// get when the claim's pods run as another Unix UID than the one its GPU's
// MPS control daemon serves, and the claim asked for MPS: its prepare
// fails rather than leave the pods' CUDA processes waiting, silently,
// behind the other user's server.
const ReasonMPSUser = "FacetMPSUserConflict"

// claimUser is the Unix UID the claim's pods run as (mps.PodUser). An
// error wrapping mps.ErrUserUnknown says why none can be known; any other
// is the API server's, and the prepare is retried.
func (m *mpsClients) claimUser(ctx context.Context, claim *resourceapi.ResourceClaim) (int64, error) {
	if m.pods == nil {
		return 0, fmt.Errorf("%w: the plugin reads no pods", mps.ErrUserUnknown)
	}
	user, pods := int64(-1), 0
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		pod, err := m.pods(ctx, claim.Namespace, r.Name)
		if err != nil {
			return 0, fmt.Errorf("read pod %s/%s for the UID it runs as: %w", claim.Namespace, r.Name, err)
		}
		if pod.UID != r.UID {
			return 0, fmt.Errorf("pod %s/%s is not the one the claim is reserved for (UID %s, not %s)", claim.Namespace, r.Name, pod.UID, r.UID)
		}
		u, err := mps.PodUser(pod, claim.Name)
		if err != nil {
			return 0, err
		}
		if user >= 0 && u != user {
			return 0, fmt.Errorf("%w: the claim's pods run as UIDs %d and %d (pod %s), and an MPS control daemon serves one UID at a time", mps.ErrUserUnknown, user, u, r.Name)
		}
		user = u
		pods++
	}
	if pods == 0 {
		return 0, fmt.Errorf("%w: the claim is reserved for no pod", mps.ErrUserUnknown)
	}
	return user, nil
}

// join joins a claim to its GPU's daemon, as the UID its pods run as
// (the one recorded, when a prepared claim is rebuilt), and returns the
// spec's MPS edits, marking the claim's shares as MPS-partitioned in the
// record. Where the claim cannot join (its UID unknown, or another than
// the daemon serves), it returns why instead: the shares are then
// time-sliced, or, when explicit (the claim's config asks for "mps"), the
// prepare fails with the reason (an error).
func (m *mpsClients) join(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim, gpu string, explicit bool) (*cdispec.ContainerEdits, string, error) {
	var user int64
	var err error
	if rec.MPSUser != nil {
		user = *rec.MPSUser
	} else {
		user, err = m.claimUser(ctx, claim)
	}
	mp, mpsErr := m.sharing.MPS()
	if err == nil && mp == nil {
		// facet-mps went between pick and here.
		err = fmt.Errorf("MPS is unavailable on this node: %w", mpsErr)
	}
	if err == nil {
		err = mp.Acquire(ctx, gpu, rec.UID, user)
	}
	var conflict *mps.UserConflictError
	isConflict := errors.As(err, &conflict)
	if isConflict {
		// Names a user can look up, not UIDs.
		conflict.HolderNames = nil
		for _, uid := range conflict.Holders {
			name := string(uid)
			if ref, ok := m.held.owner(uid); ok {
				name = ref.namespace + "/" + ref.name
			}
			conflict.HolderNames = append(conflict.HolderNames, name)
		}
	}
	switch {
	case err == nil:
	case !errors.Is(err, mps.ErrUserUnknown) && !isConflict:
		return nil, "", err
	case explicit:
		err = fmt.Errorf("VgpuConfig partitioning %q: %w", configapi.PartitioningMPS, err)
		if isConflict {
			m.obs.claimEvent(claim, corev1.EventTypeWarning, ReasonMPSUser, err.Error())
		}
		return nil, "", err
	default:
		return nil, "time-sliced by HAMi-core instead of MPS-partitioned: " + err.Error(), nil
	}
	rec.MPSUser = &user
	m.failpoint("prepare/acquired-mps")
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
	return mp.Edits(gpu, cores), "", nil
}

// mpsHolders are the GPUs that this boot's prepared records hold under MPS,
// with the UID each claim runs as (mps.AnyUser where a record of an
// earlier version has none).
func mpsHolders(claims []*checkpoint.Claim, bootID string) map[string]map[types.UID]int64 {
	holders := map[string]map[types.UID]int64{}
	for _, c := range claims {
		if c.State != checkpoint.StatePrepared || c.FromOtherBoot(bootID) {
			// A claim of the last boot joins again when it is rebuilt.
			continue
		}
		seen := map[string]bool{}
		for _, dev := range c.Devices {
			if dev.Share != nil && dev.Share.MPS && !seen[dev.GPUUUID] {
				seen[dev.GPUUUID] = true
				if holders[dev.GPUUUID] == nil {
					holders[dev.GPUUUID] = map[types.UID]int64{}
				}
				user := mps.AnyUser
				if c.MPSUser != nil {
					user = *c.MPSUser
				}
				holders[dev.GPUUUID][c.UID] = user
			}
		}
	}
	return holders
}

// restore hands the checkpoint's holders to the daemon manager: it
// adopts their daemons, restarts dead ones (an Event on their claims), and
// stops those no claim holds.
func (m *mpsClients) restore(ctx context.Context) {
	if mp, _ := m.sharing.MPS(); mp == nil {
		return
	}
	claims, _, err := m.store.List()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing claims for their MPS daemons")
		return
	}
	m.sync(ctx, claims)
}

// sync hands the records' MPS holders to the daemon manager.
func (m *mpsClients) sync(ctx context.Context, claims []*checkpoint.Claim) {
	mp, _ := m.sharing.MPS()
	if mp == nil {
		return
	}
	holders := mpsHolders(claims, m.bootID)
	restarted, err := mp.Restore(ctx, holders)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Restoring MPS control daemons; claims on them retry at their next prepare")
	}
	for _, gpu := range restarted {
		m.restarted(ctx, gpu, slices.Sorted(maps.Keys(holders[gpu])))
	}
}

// check restarts MPS control daemons that died and raises an Event on
// each claim whose daemon was restarted; where facet-mps lost its holders
// (it restarted), it hands them over again.
func (m *mpsClients) check(ctx context.Context) {
	mp, _ := m.sharing.MPS()
	if mp == nil {
		return
	}
	restarted, err := mp.Check(ctx)
	if errors.Is(err, mps.ErrHoldersLost) {
		klog.FromContext(ctx).Info("Handing the prepared claims' MPS holders over again", "reason", err.Error())
		m.restore(ctx)
		return
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Restarting MPS control daemons")
	}
	for gpu, claims := range restarted {
		m.restarted(ctx, gpu, claims)
	}
}

func (m *mpsClients) restarted(ctx context.Context, gpu string, claims []types.UID) {
	msg := fmt.Sprintf("the MPS control daemon of GPU %s had died and was started again; CUDA processes of this claim that were its clients lost their MPS server and must be restarted", gpu)
	klog.FromContext(ctx).Error(nil, "MPS control daemon restarted", "gpu", gpu, "claims", claims)
	for _, uid := range claims {
		if ref, ok := m.held.owner(uid); ok {
			m.obs.refEvent(ref, corev1.EventTypeWarning, ReasonMPSRestarted, msg)
		}
	}
}

// mpsNotApplied tells a claim and its pods why its shares are time-sliced.
func (o *observer) mpsNotApplied(claim *resourceapi.ResourceClaim, why string) {
	o.claimEvent(claim, corev1.EventTypeNormal, ReasonMPSNotApplied, why)
}
