package mps

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ErrUserUnknown marks a pod whose containers' Unix UID cannot be known
// before they start: a container of the claim sets no runAsUser, neither
// itself nor through the pod's securityContext, so its image's USER
// decides, which only the container runtime knows.
var ErrUserUnknown = errors.New("UID unknown")

// PodUser returns the Unix UID that the pod's containers using the claim
// claimName run as: each container's securityContext.runAsUser, else the
// pod's. The claim's containers are those (init and regular containers)
// whose resources.claims name a pod resource claim that is claimName,
// directly or, for a template, as status.resourceClaimStatuses reports it.
//
// It fails, wrapping ErrUserUnknown, when a container of the claim leaves
// runAsUser unset, when two of them run as different UIDs (MPS would
// serialise them against each other), when no container uses the claim,
// or when the pod runs in a user namespace of its own (hostUsers: false).
// There runAsUser is a UID inside the namespace, which the runtime maps to
// a host UID of the pod's own range, and MPS compares host UIDs: two pods
// "at 1000" are two MPS users, and one would wait behind the other.
func PodUser(pod *corev1.Pod, claimName string) (int64, error) {
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		return 0, fmt.Errorf("%w: pod %s/%s runs in a user namespace of its own (hostUsers: false): its runAsUser is mapped to a host UID that only the container runtime knows, and MPS serves one host UID at a time", ErrUserUnknown, pod.Namespace, pod.Name)
	}
	podClaims := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil && *rc.ResourceClaimName == claimName {
			podClaims[rc.Name] = true
		}
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil && *st.ResourceClaimName == claimName {
			podClaims[st.Name] = true
		}
	}
	var podUser *int64
	if pod.Spec.SecurityContext != nil {
		podUser = pod.Spec.SecurityContext.RunAsUser
	}
	user := int64(-1)
	var unset, containers []string
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		uses := false
		for _, r := range c.Resources.Claims {
			uses = uses || podClaims[r.Name]
		}
		if !uses {
			continue
		}
		containers = append(containers, c.Name)
		u := podUser
		if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
			u = c.SecurityContext.RunAsUser
		}
		switch {
		case u == nil:
			unset = append(unset, c.Name)
		case user >= 0 && *u != user:
			return 0, fmt.Errorf("%w: pod %s/%s: its containers of the claim run as UIDs %d and %d (container %s), and an MPS control daemon serves one UID at a time", ErrUserUnknown, pod.Namespace, pod.Name, user, *u, c.Name)
		default:
			user = *u
		}
	}
	switch {
	case len(containers) == 0:
		return 0, fmt.Errorf("%w: pod %s/%s: no container uses the claim", ErrUserUnknown, pod.Namespace, pod.Name)
	case len(unset) > 0:
		return 0, fmt.Errorf("%w: pod %s/%s: container %s sets no runAsUser (nor does the pod), so its image's USER decides, which the plugin cannot see", ErrUserUnknown, pod.Namespace, pod.Name, strings.Join(unset, ", "))
	}
	return user, nil
}
