package webhook

import (
	"context"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"
)

// PrioritizedListSupport says whether the API server keeps a request's
// firstAvailable, and why it is thought so (for logs and warnings).
type PrioritizedListSupport interface {
	Supported() (bool, string)
}

// PrioritizedListProbe finds out whether the API server keeps
// firstAvailable: with the DRAPrioritizedList gate off (beta and on by
// default in 1.34 and 1.35, GA in 1.36, locked on from 1.37) it drops the
// field from a claim, and a request written only as firstAvailable is then
// refused ("exactly one of `exactly` or `firstAvailable` is required"). No
// API says which gates are on, so it asks as the pod mutator asks about
// DRAExtendedResource, by whether a gated field is kept: a server-side dry
// run (nothing is stored) of a ResourceClaim with one firstAvailable
// request, in the webhook's own namespace. Until a probe has answered, and
// when one fails for another reason (RBAC, another webhook), the answer is
// "not supported": requests are then written as they were, never refused
// for want of the gate.
type PrioritizedListProbe struct {
	logger klog.Logger
	claims resourceclient.ResourceClaimInterface

	mu        sync.Mutex
	supported bool
	why       string
}

// NewPrioritizedListProbe returns a probe that dry-runs its claims in
// namespace (it needs create on resourceclaims there). It has not asked
// yet: call Check or Run.
func NewPrioritizedListProbe(logger klog.Logger, client kubernetes.Interface, namespace string) *PrioritizedListProbe {
	return &PrioritizedListProbe{
		logger: logger,
		claims: client.ResourceV1().ResourceClaims(namespace),
		why:    "not probed yet",
	}
}

// Supported returns the last probe's answer.
func (p *PrioritizedListProbe) Supported() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.supported, p.why
}

// Run probes every interval until ctx is done, the first time after one
// interval (Check answers now): the gate changes only with an API
// server's restart, but then without notice.
func (p *PrioritizedListProbe) Run(ctx context.Context, interval time.Duration) {
	// The condition never holds: it polls until ctx is done.
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		p.Check(ctx)
		return false, nil
	})
}

// probeRequest is the name of the probe claim's request and subrequest.
const probeRequest = "probe"

// Check probes once, logging the answer when it changed.
func (p *PrioritizedListProbe) Check(ctx context.Context) {
	supported, why := p.ask(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if supported != p.supported || why != p.why {
		p.logger.Info("Does the API server keep firstAvailable (DRAPrioritizedList)?", "supported", supported, "reason", why)
	}
	p.supported, p.why = supported, why
}

func (p *PrioritizedListProbe) ask(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "facet-webhook-probe-", Labels: map[string]string{ManagedByLabel: ManagedByValue}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: probeRequest,
			FirstAvailable: []resourceapi.DeviceSubRequest{{
				Name: probeRequest, DeviceClassName: "gpu.facet.dev",
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}},
		}}}},
	}
	got, err := p.claims.Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: ManagedByValue})
	switch {
	case err == nil:
		if r := got.Spec.Devices.Requests; len(r) == 1 && len(r[0].FirstAvailable) == 1 {
			return true, "a server-side dry run of a claim kept its firstAvailable"
		}
		return false, "a server-side dry run of a claim dropped its firstAvailable"
	case apierrors.IsInvalid(err) && droppedRequest(err):
		return false, "the API server dropped a claim's firstAvailable and refused the request left empty (DRAPrioritizedList is off): " + err.Error()
	default:
		return false, "cannot tell: the server-side dry run of a claim failed: " + err.Error()
	}
}

// droppedRequest says whether an Invalid error is the one a request
// emptied of firstAvailable gets: Required at spec.devices.requests[0].
func droppedRequest(err error) bool {
	status, ok := err.(apierrors.APIStatus)
	if !ok || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == "spec.devices.requests[0]" && c.Type == metav1.CauseTypeFieldValueRequired && strings.Contains(c.Message, "firstAvailable") {
			return true
		}
	}
	return false
}
