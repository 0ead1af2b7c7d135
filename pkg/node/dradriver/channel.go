package dradriver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/computedomain"
)

// IMEX channel claims (docs/design/compute-domains.md, flow steps 3, 5
// and 6, and Failure).
//
// A ComputeDomain's channel claim gets the node's one imex-channel device.
// Its prepare checks that the domain its ComputeDomainChannelConfig names
// exists in the claim's namespace with that UID, records the claim (state
// Preparing, with the domain), labels the node with the domain's UID,
// which pulls the domain's IMEX daemon onto it, and fails, naming the
// daemon, until the domain's status says that daemon is Ready; the kubelet
// retries. Then it writes the CDI spec (the channel's device node and the
// domain's environment) and records the claim Prepared. The label is
// decided from the checkpoint only, under cdMu: the node carries the UID
// of the domain whose channel claims its records hold (prepared or
// waiting), and a claim of another domain is refused while any is held.
// Unpreparing the last claim of a domain removes the label; a start puts
// the label back or removes it from the records (reconcileLabel).

// ComputeDomains is the cluster as IMEX channel claims need it (package
// computedomain).
type ComputeDomains interface {
	// Domain returns the ComputeDomain namespace/name as last seen;
	// apierrors.IsNotFound where there is none.
	Domain(ctx context.Context, namespace, name string) (*configapi.ComputeDomain, error)
	// NodeLabel returns the node's names.LabelComputeDomain, "" if none.
	NodeLabel(ctx context.Context) (string, error)
	// SetNodeLabel changes that label from from to to ("": absent), and
	// fails where it is neither.
	SetNodeLabel(ctx context.Context, from, to string) error
}

var _ ComputeDomains = (*computedomain.Cluster)(nil)

// Events of IMEX channel claims: on the claim and its pods while prepare
// waits for the domain's IMEX daemon, and on the Node when its label
// changes.
const (
	ReasonWaitingForIMEXDaemon = "FacetWaitingForIMEXDaemon"
	ReasonComputeDomainLabel   = "FacetComputeDomainLabel"
)

// DaemonNotReadyError is a channel claim's prepare error while the
// domain's IMEX daemon on the node is not Ready: the claim is recorded and
// the node labelled, and the kubelet's next retry may succeed.
type DaemonNotReadyError struct {
	Namespace, Name, Node string
}

func (e *DaemonNotReadyError) Error() string {
	return fmt.Sprintf("ComputeDomain %s/%s: IMEX daemon on node %s is not ready yet", e.Namespace, e.Name, e.Node)
}

// isChannelClaim says whether claim's allocation holds this node's IMEX
// channel device.
func (d *Driver) isChannelClaim(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == names.Driver && r.Pool == d.nodeName && r.Device == names.IMEXChannelDevice {
			return true
		}
	}
	return false
}

// channelPlan is a channel claim's device and configuration.
type channelPlan struct {
	device checkpoint.Device
	cfg    *configapi.ComputeDomainChannelConfig
}

// planChannel resolves a channel claim's allocation: the channel device
// alone, with a ComputeDomainChannelConfig.
func (d *Driver) planChannel(claim *resourceapi.ResourceClaim) (*channelPlan, error) {
	var p *channelPlan
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.Driver {
			continue
		}
		where := fmt.Sprintf("request %q: device %s/%s", r.Request, r.Pool, r.Device)
		if r.Pool != d.nodeName || r.Device != names.IMEXChannelDevice {
			return nil, fmt.Errorf("%s: a claim with an IMEX channel holds it alone; put the GPUs in a claim of their own", where)
		}
		if p != nil {
			return nil, fmt.Errorf("%s: allocated twice in one claim", where)
		}
		if d.inv.IMEXChannel == nil {
			return nil, fmt.Errorf("%s: this node publishes no IMEX channel device (compute domains off, or no channels or fabric clique any more)", where)
		}
		cfg, err := configapi.EffectiveComputeDomainChannelConfig(claim.Status.Allocation.Devices.Config, r.Request)
		if err != nil {
			return nil, err
		}
		if cfg == nil {
			return nil, fmt.Errorf("%s: no %s applies: an IMEX channel claim names its ComputeDomain in one (the domain's channel ResourceClaimTemplate carries it)", where, configapi.ComputeDomainChannelConfigKind)
		}
		p = &channelPlan{cfg: cfg, device: checkpoint.Device{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, Kind: kindIMEXChannel}}
	}
	return p, nil
}

// prepareChannel is prepareRecord for a channel claim (see the top of this
// file); rec is its record, nil if none. On a refusal it undoes what an
// earlier attempt left (record, label); while the daemon is not ready, and
// on a transient error, it keeps the record and the label.
func (d *Driver) prepareChannel(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim) (*checkpoint.Claim, string, error) {
	p, err := d.planChannel(claim)
	if err != nil {
		return rec, "", errors.Join(err, d.dropChannel(ctx, claim.UID, rec))
	}
	outcome := "prepared"
	if rec != nil && rec.State == checkpoint.StatePrepared {
		stale := d.staleness(rec)
		if stale == "" {
			d.notePods(ctx, claim, rec)
			return rec, "already prepared", nil
		}
		// Prepared again from the start, its daemon checked again: after
		// a reboot the IMEX daemon starts afresh too.
		outcome = "rebuilt: " + stale
	}
	dom, refused, err := d.checkDomain(ctx, claim, p.cfg)
	if err != nil {
		if refused {
			err = errors.Join(err, d.dropChannel(ctx, claim.UID, rec))
		}
		return rec, "", err
	}
	rec = &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.StatePreparing,
		Devices: []checkpoint.Device{p.device}, BootID: d.bootID, Pods: reservedPods(claim),
		ComputeDomain: &checkpoint.ComputeDomain{UID: p.cfg.DomainUID, Namespace: claim.Namespace, Name: p.cfg.DomainName}}
	if err := d.claimNode(ctx, rec); err != nil {
		return rec, "", err
	}
	d.failpoint("prepare/channel-labelled")
	if !d.awaitDaemon(ctx, dom) {
		return rec, "", &DaemonNotReadyError{Namespace: claim.Namespace, Name: p.cfg.DomainName, Node: d.nodeName}
	}
	common, dev, err := d.channelEdits(rec, p.cfg)
	if err != nil {
		return rec, "", err
	}
	if err := d.spec.writeSpec(rec, common, []claimcdi.Device{{Name: p.device.Device, Edits: dev}}); err != nil {
		return rec, "", err
	}
	d.failpoint("prepare/channel-wrote-spec")
	rec.State = checkpoint.StatePrepared
	if err := d.store.Put(rec); err != nil {
		return rec, "", err
	}
	return rec, outcome, nil
}

// checkDomain finds the domain a channel claim's config names, in the
// claim's namespace, and checks it: the UID the config gives, not being
// deleted, and pinned (if yet) to this node's clique. refused says the
// claim cannot be prepared as it is (the error names the field); other
// errors (the ComputeDomains not listed yet) may pass.
func (d *Driver) checkDomain(ctx context.Context, claim *resourceapi.ResourceClaim, cfg *configapi.ComputeDomainChannelConfig) (dom *configapi.ComputeDomain, refused bool, err error) {
	if d.domains == nil {
		return nil, true, errors.New("this plugin does not read ComputeDomains (started with --compute-domains=off), so it cannot prepare IMEX channels")
	}
	dom, err = d.domains.Domain(ctx, claim.Namespace, cfg.DomainName)
	switch {
	case apierrors.IsNotFound(err):
		return nil, true, fmt.Errorf("%s: %s", configapi.ComputeDomainChannelConfigKind, field.Invalid(field.NewPath("domainName"), cfg.DomainName,
			fmt.Sprintf("no ComputeDomain of that name in namespace %s, the claim's (a claim joins a domain of its own namespace)", claim.Namespace)))
	case err != nil:
		return nil, false, err
	case string(dom.UID) != cfg.DomainUID:
		return nil, true, fmt.Errorf("%s: %s", configapi.ComputeDomainChannelConfigKind, field.Invalid(field.NewPath("domainUID"), cfg.DomainUID,
			fmt.Sprintf("ComputeDomain %s/%s has UID %s (the domain was deleted and made again since the claim was written?)", dom.Namespace, dom.Name, dom.UID)))
	case dom.DeletionTimestamp != nil:
		return nil, true, fmt.Errorf("ComputeDomain %s/%s is being deleted: no new channel claim joins it", dom.Namespace, dom.Name)
	case dom.Status.Clique != "" && dom.Status.Clique != d.inv.IMEXChannel.Clique():
		return nil, true, fmt.Errorf("ComputeDomain %s/%s is pinned to fabric clique %s, and node %s is in clique %s: IMEX joins the nodes of one clique only",
			dom.Namespace, dom.Name, dom.Status.Clique, d.nodeName, d.inv.IMEXChannel.Clique())
	}
	return dom, false, nil
}

// DefaultDaemonWait is how long a channel claim's prepare waits for the
// node's IMEX daemon to turn Ready before it fails (Options.DaemonWait):
// within the kubelet's 45 s NodePrepareResources timeout, and enough for a
// daemon the label just pulled onto the node. The kubelet's retry of a
// failed prepare came 51 to 88 s later on Kubernetes 1.35.4 (test/e2e
// TestComputeDomainChannel), which a daemon that is Ready a moment after
// the label would otherwise cost the pod.
const DefaultDaemonWait = 20 * time.Second

// awaitDaemon waits, at most d.daemonWait and while ctx lasts, for the
// domain's status to have the node's IMEX daemon Ready, reading the
// domains' cache; dom is the domain as prepare found it.
func (d *Driver) awaitDaemon(ctx context.Context, dom *configapi.ComputeDomain) bool {
	if nodeReady(dom, d.nodeName) {
		return true
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, d.daemonWait, false, func(ctx context.Context) (bool, error) {
		cur, err := d.domains.Domain(ctx, dom.Namespace, dom.Name)
		if err != nil || cur.UID != dom.UID {
			return false, err // the next prepare says why
		}
		return nodeReady(cur, d.nodeName), nil
	})
	return err == nil
}

// nodeReady says whether the domain's status has node's IMEX daemon Ready.
func nodeReady(dom *configapi.ComputeDomain, node string) bool {
	for _, n := range dom.Status.Nodes {
		if n.Name == node {
			return n.Status == configapi.ComputeDomainReady
		}
	}
	return false
}

// channelEdits are a channel claim's CDI edits: the domain's environment
// at the top level, and the channel's device nodes (channel 0, or every
// channel with All) as the device's own. The environment names no claim
// or device, unlike a GPU claim's (FACET_CLAIM, FACET_DEVICES): a pod's
// GPU claim sets those in the same containers.
func (d *Driver) channelEdits(rec *checkpoint.Claim, cfg *configapi.ComputeDomainChannelConfig) (*cdispec.ContainerEdits, *cdispec.ContainerEdits, error) {
	ch := d.inv.IMEXChannel
	n := 1
	if cfg.AllocationMode == configapi.ChannelAllocationAll {
		n = ch.Count
	}
	dev := &cdispec.ContainerEdits{}
	for i := range n {
		node, err := ch.DeviceNode(i)
		if err != nil {
			return nil, nil, fmt.Errorf("device %s: %w", names.IMEXChannelDevice, err)
		}
		dev.DeviceNodes = append(dev.DeviceNodes, node)
	}
	common := &cdispec.ContainerEdits{Env: []string{
		names.EnvComputeDomainUID + "=" + rec.ComputeDomain.UID,
		names.EnvComputeDomainName + "=" + rec.ComputeDomain.Name,
		names.EnvComputeDomainClique + "=" + ch.Clique(),
	}}
	return common, dev, nil
}

// heldDomains are the channel records of the checkpoint by domain UID,
// prepared or waiting; unreadable records count as far as they can be
// salvaged (fail closed).
func (d *Driver) heldDomains() (map[string][]*checkpoint.Claim, error) {
	claims, corrupt, err := d.store.List()
	if err != nil {
		return nil, err
	}
	for uid := range corrupt {
		if rec, err := d.store.Salvage(uid); err == nil && rec.ComputeDomain != nil {
			rec.UID = uid
			claims = append(claims, rec)
		}
	}
	held := map[string][]*checkpoint.Claim{}
	for _, c := range claims {
		if c.ComputeDomain != nil {
			held[c.ComputeDomain.UID] = append(held[c.ComputeDomain.UID], c)
		}
	}
	return held, nil
}

// claimNames names records for messages: "ns/name (uid)", sorted.
func claimNames(recs []*checkpoint.Claim) string {
	out := make([]string, len(recs))
	for i, c := range recs {
		out[i] = fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, c.UID)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// claimNode records rec (Preparing) and labels the node with its domain,
// refusing, before it records anything, while the checkpoint holds a
// claim of another domain. A label the records do not explain (left by a
// crash, or set by hand) is replaced, with a Warning Event on the Node.
func (d *Driver) claimNode(ctx context.Context, rec *checkpoint.Claim) error {
	d.cdMu.Lock()
	defer d.cdMu.Unlock()
	held, err := d.heldDomains()
	if err != nil {
		return err
	}
	want := rec.ComputeDomain.UID
	for uid, recs := range held {
		if uid == want {
			continue
		}
		other := recs[0].ComputeDomain
		return fmt.Errorf("node %s serves ComputeDomain %s/%s (UID %s), whose channel claim %s is prepared or waiting here: a node serves one domain at a time",
			d.nodeName, other.Namespace, other.Name, uid, claimNames(recs))
	}
	if err := d.store.Put(rec); err != nil {
		return err
	}
	d.failpoint("prepare/channel-recorded")
	return d.setLabelLocked(ctx, want, fmt.Sprintf("channel claim %s/%s of ComputeDomain %s/%s", rec.Namespace, rec.Name, rec.ComputeDomain.Namespace, rec.ComputeDomain.Name))
}

// setLabelLocked makes the node's label want ("": none), saying why in the
// Node's Event. The caller holds cdMu and has decided want from the
// checkpoint.
func (d *Driver) setLabelLocked(ctx context.Context, want, why string) error {
	cur, err := d.domains.NodeLabel(ctx)
	if err != nil {
		return err
	}
	if cur == want {
		return nil
	}
	if err := d.domains.SetNodeLabel(ctx, cur, want); err != nil {
		return err
	}
	msg := fmt.Sprintf("%s=%s for %s", names.LabelComputeDomain, want, why)
	if want == "" {
		msg = fmt.Sprintf("removed %s=%s: %s", names.LabelComputeDomain, cur, why)
	}
	eventType := corev1.EventTypeNormal
	if cur != "" && want != "" {
		eventType = corev1.EventTypeWarning
		msg += fmt.Sprintf(", replacing %s, which no channel claim prepared here held", cur)
	}
	klog.FromContext(ctx).Info("Node label changed", "label", names.LabelComputeDomain, "from", cur, "to", want, "why", why)
	d.obs.nodeEvent(d.nodeName, eventType, ReasonComputeDomainLabel, msg)
	return nil
}

// releaseNode removes the node's label once rec, being rolled back, was
// the last claim of its domain the checkpoint holds. The label is left
// alone where it names another domain.
func (d *Driver) releaseNode(ctx context.Context, rec *checkpoint.Claim) error {
	if d.domains == nil {
		return errors.New("this plugin does not reach ComputeDomains (--compute-domains=off), so it cannot remove the node's compute-domain label; restart it with compute domains on to unprepare IMEX channel claims")
	}
	d.cdMu.Lock()
	defer d.cdMu.Unlock()
	held, err := d.heldDomains()
	if err != nil {
		return err
	}
	cd := rec.ComputeDomain
	for _, c := range held[cd.UID] {
		if c.UID != rec.UID {
			return nil // another claim of the domain is here still
		}
	}
	cur, err := d.domains.NodeLabel(ctx)
	if err != nil {
		return err
	}
	if cur != cd.UID {
		return nil
	}
	return d.setLabelLocked(ctx, "", fmt.Sprintf("no channel claim of ComputeDomain %s/%s is left on the node (the last was %s/%s)", cd.Namespace, cd.Name, rec.Namespace, rec.Name))
}

// dropChannel rolls back what an earlier attempt of a refused channel
// claim left: its record and, if it was its domain's last, the label.
func (d *Driver) dropChannel(ctx context.Context, uid types.UID, rec *checkpoint.Claim) error {
	if rec == nil {
		return nil
	}
	return d.rollback(ctx, uid, rec)
}

// reconcileLabel makes the node's label what the checkpoint says, at
// start: the domain of the channel claims its records hold, or none. Of
// several domains (which the refusal in claimNode prevents), the label's
// own is kept if it is one of them, else the first by UID, and the others
// are logged. It retries in the background, until ctx ends, where the API
// server cannot be reached now.
func (d *Driver) reconcileLabel(ctx context.Context) {
	if d.domains == nil {
		return
	}
	err := d.reconcileLabelOnce(ctx)
	if err == nil {
		return
	}
	klog.FromContext(ctx).Error(err, "Cannot bring the node's compute-domain label in line with the prepared channel claims; retrying")
	go func() {
		_ = wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: time.Minute}, func(ctx context.Context) (bool, error) {
			if err := d.enter(ctx); err != nil {
				return false, nil
			}
			defer d.leave(ctx)
			err := d.reconcileLabelOnce(ctx)
			if err != nil {
				klog.FromContext(ctx).V(2).Info("Retrying the node's compute-domain label", "err", err)
			}
			return err == nil, nil
		})
	}()
}

func (d *Driver) reconcileLabelOnce(ctx context.Context) error {
	d.cdMu.Lock()
	defer d.cdMu.Unlock()
	held, err := d.heldDomains()
	if err != nil {
		return err
	}
	cur, err := d.domains.NodeLabel(ctx)
	if err != nil {
		return err
	}
	uids := make([]string, 0, len(held))
	for uid := range held {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	want := ""
	if _, ok := held[cur]; ok {
		want = cur
	} else if len(uids) > 0 {
		want = uids[0]
	}
	if len(uids) > 1 {
		klog.FromContext(ctx).Error(nil, "Channel claims of several ComputeDomains are recorded on this node; the label names one", "label", want, "domains", uids)
	}
	why := "no channel claim is recorded at start"
	if want != "" {
		cd := held[want][0].ComputeDomain
		why = fmt.Sprintf("ComputeDomain %s/%s, whose channel claims %s the checkpoint holds at start", cd.Namespace, cd.Name, claimNames(held[want]))
	}
	return d.setLabelLocked(ctx, want, why)
}

// holdWhileChannelsWait reports the prepared claims of a call as waiting
// too while a channel claim of the same call waits for its IMEX daemon;
// what was prepared stays prepared, and the kubelet's retry gets it as
// "already prepared". The kubelet prepares a pod's claims of one driver in
// one call, and before kubernetes#140274 (Kubernetes 1.37; not in 1.35.4
// or 1.36.3) it keeps the devices of a claim that succeeded in a call that
// failed, unmarked, and appends them again at the retry: the runtime gets
// the GPU claim's CDI devices twice, and with ResourceHealthStatus on the
// API server refuses the pod's status (a duplicate resourceID), so the
// pod runs but shows Pending. A call whose every claim fails leaves
// nothing behind.
func holdWhileChannelsWait(claims []*resourceapi.ResourceClaim, res map[types.UID]kubeletplugin.PrepareResult) {
	var waiting []string
	for _, c := range claims {
		var e *DaemonNotReadyError
		if errors.As(res[c.UID].Err, &e) {
			waiting = append(waiting, fmt.Sprintf("%s/%s (%s)", c.Namespace, c.Name, e))
		}
	}
	if len(waiting) == 0 {
		return
	}
	for _, c := range claims {
		if r := res[c.UID]; r.Err == nil {
			res[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: prepared, and held back with the pod's channel claim %s: the kubelet prepares a pod's claims together",
				c.Namespace, c.Name, strings.Join(waiting, ", "))}
		}
	}
}
