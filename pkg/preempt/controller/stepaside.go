package controller

import (
	"fmt"
	"strings"
)

// SchedulerPreemptionGates are the feature gates that, on, give the
// kube-scheduler preemption for pods with ResourceClaims. No Kubernetes
// release has one through 1.37 (KEP-5690 and its implementation,
// kubernetes/kubernetes#139266, are unmerged); DRAPreemption is the name
// the KEP's gate is expected to take. --scheduler-preemption-gates
// replaces the list once the real name is known.
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
	switch m := SchedulerMode(s); m {
	case SchedulerAuto, SchedulerYes, SchedulerNo:
		return m, nil
	}
	return "", fmt.Errorf("--scheduler-preempts-claims=%q: want auto, true or false", s)
}

// StepAside decides whether the kube-scheduler preempts for pods with
// ResourceClaims itself, in which case facet-preemptor stays idle: two
// preemptors for one pod would evict twice. gates are the API server's
// (features.ServerGates; nil with gatesErr where they could not be read),
// which name the gates of the scheduler of the same release. It returns
// the answer and the reason, for the log line at start.
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
