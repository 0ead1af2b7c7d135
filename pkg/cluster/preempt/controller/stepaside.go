package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// SchedulerPreemptionGates are the feature gates that, on, give the
// kube-scheduler preemption for pods with ResourceClaims. No Kubernetes
// release has one through 1.37: KEP-5690's implementation
// (kubernetes/kubernetes#139266) was closed unmerged. The KEP's kep.yaml
// (kubernetes/enhancements#6113, open) names the gate DRAPreemption, for
// the kube-scheduler alone, beta in 1.38. The API server of a release
// reports the gate's value for its own process, which is the scheduler's
// only where both run the release's default: a gate set on the scheduler
// alone needs --scheduler-preempts-claims. --scheduler-preemption-gates
// replaces the list should the merged name differ.
var SchedulerPreemptionGates = []string{"DRAPreemption"}

// SchedulerMode is --scheduler-preempts-claims.
type SchedulerMode string

const (
	// SchedulerAuto: ask the API server's /metrics which gates are on.
	SchedulerAuto SchedulerMode = "auto"
	// SchedulerYes: the scheduler preempts for claims; stay idle.
	SchedulerYes SchedulerMode = "true"
	// SchedulerNo: it does not; preempt.
	SchedulerNo SchedulerMode = "false"
)

// ParseSchedulerMode parses auto, true or false.
func ParseSchedulerMode(s string) (SchedulerMode, error) {
	return names.Parse(s, "--scheduler-preempts-claims value", SchedulerAuto, SchedulerYes, SchedulerNo)
}

// SchedulerRecheck is how often, with --scheduler-preempts-claims=auto,
// the API server's gates are read again. A gate changes only when the
// control plane is upgraded or reconfigured, and the /metrics page is
// large: a minute is soon enough after such a change, and cheap.
var SchedulerRecheck = time.Minute

// Supervise runs act while the kube-scheduler does not preempt for pods
// with ResourceClaims itself (StepAside), until ctx ends. With mode auto it
// reads the gates again every interval: act's context ends when the
// scheduler starts to preempt (an upgrade turned the gate on), and act
// runs again, with the gates just read, when it stops. A read that fails
// after the first changes nothing: two preemptors, or none, because of a
// blip of the API server would be worse than a minute late. read is
// features.ServerGates; act gets the gates (or the error) of the read that
// started it.
func Supervise(ctx context.Context, mode SchedulerMode, preemptionGates []string, read func(context.Context) (map[string]bool, error), interval time.Duration, metrics *Metrics, act func(context.Context, map[string]bool, error)) {
	logger := klog.FromContext(ctx)
	gates, gatesErr := read(ctx)
	idle, why := StepAside(mode, preemptionGates, gates, gatesErr)
	for {
		stop := func() {}
		if idle {
			logger.Info("Staying idle: the kube-scheduler preempts for pods with ResourceClaims itself", "why", why)
			metrics.SetActive(false)
		} else {
			logger.Info("Preempting for pods whose ResourceClaims cannot be allocated: the kube-scheduler does not", "why", why)
			actx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func(gates map[string]bool, gatesErr error) {
				defer close(done)
				act(actx, gates, gatesErr)
			}(gates, gatesErr)
			stop = func() {
				cancel()
				<-done
			}
		}
		if mode != SchedulerAuto {
			// The setting decides, not the gates: nothing to watch.
			<-ctx.Done()
			stop()
			return
		}
		for changed := false; !changed; {
			t := time.NewTimer(interval)
			select {
			case <-ctx.Done():
				t.Stop()
				stop()
				return
			case <-t.C:
			}
			g, err := read(ctx)
			if err != nil {
				logger.V(2).Info("Could not read the API server's feature gates again; the last answer stands", "err", err, "idle", idle)
				continue
			}
			if now, nowWhy := StepAside(mode, preemptionGates, g, nil); now != idle {
				logger.Info("The kube-scheduler's preemption for pods with ResourceClaims changed", "schedulerPreempts", now, "why", nowWhy)
				stop()
				gates, gatesErr, idle, why, changed = g, nil, now, nowWhy, true
			}
		}
	}
}

// StepAside decides whether the kube-scheduler preempts for pods with
// ResourceClaims itself, in which case facet-preemptor stays idle: two
// preemptors for one pod would evict twice. gates are the API server's
// (features.ServerGates; nil with gatesErr where they could not be read),
// which name the gates of the scheduler of the same release. It returns
// the answer and the reason, for the log line.
func StepAside(mode SchedulerMode, preemptionGates []string, gates map[string]bool, gatesErr error) (bool, string) {
	switch mode {
	case SchedulerYes:
		return true, "--scheduler-preempts-claims=true: the kube-scheduler preempts for pods with ResourceClaims itself"
	case SchedulerNo:
		return false, "--scheduler-preempts-claims=false: the kube-scheduler does not preempt for pods with ResourceClaims"
	}
	if gatesErr != nil {
		return false, fmt.Sprintf("the API server's feature gates could not be read (%v); assuming the kube-scheduler does not preempt for pods with ResourceClaims (no release through 1.37 does); --scheduler-preempts-claims=true to stay idle", gatesErr)
	}
	var on, known []string
	for _, g := range preemptionGates {
		v, ok := gates[g]
		if !ok {
			continue
		}
		known = append(known, g)
		if v {
			on = append(on, g)
		}
	}
	switch {
	case len(on) > 0:
		return true, fmt.Sprintf("feature gate %s is on in the API server's /metrics (kubernetes_feature_enabled): the kube-scheduler of this release preempts for pods with ResourceClaims itself", strings.Join(on, ", "))
	case len(known) > 0:
		return false, fmt.Sprintf("feature gate %s is off in the API server's /metrics (kubernetes_feature_enabled): the kube-scheduler does not preempt for pods with ResourceClaims", strings.Join(known, ", "))
	}
	return false, fmt.Sprintf("this Kubernetes release knows none of the gates %s (API server /metrics, kubernetes_feature_enabled): its kube-scheduler does not preempt for pods with ResourceClaims", strings.Join(preemptionGates, ", "))
}
