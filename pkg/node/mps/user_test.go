package mps

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestPodUser(t *testing.T) {
	const claim = "nb-gpu-x7k2p"
	uses := corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	container := func(name string, user *int64) corev1.Container {
		c := corev1.Container{Name: name, Resources: uses}
		if user != nil {
			c.SecurityContext = &corev1.SecurityContext{RunAsUser: user}
		}
		return c
	}
	pod := func(podUser *int64, containers ...corev1.Container) *corev1.Pod {
		p := &corev1.Pod{}
		p.Namespace, p.Name = "ns", "nb"
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("nb-gpu")}}
		p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
		if podUser != nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: podUser}
		}
		p.Spec.Containers = containers
		return p
	}
	direct := pod(nil, container("c", ptr.To[int64](1001)))
	direct.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
	direct.Status.ResourceClaimStatuses = nil
	sidecar := pod(ptr.To[int64](1001), container("c", nil), corev1.Container{Name: "log"})
	otherClaim := pod(ptr.To[int64](1001), container("c", nil))
	otherClaim.Status.ResourceClaimStatuses[0].ResourceClaimName = ptr.To("another-claim")
	initToo := pod(ptr.To[int64](1001), container("c", nil))
	initToo.Spec.InitContainers = []corev1.Container{container("warmup", ptr.To[int64](0))}
	userNS := pod(ptr.To[int64](1000), container("c", nil))
	userNS.Spec.HostUsers = ptr.To(false)
	hostUsers := pod(ptr.To[int64](1000), container("c", nil))
	hostUsers.Spec.HostUsers = ptr.To(true)

	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want int64
		// err: a part of the error; "" for none.
		err string
	}{
		{name: "pod runAsUser", pod: pod(ptr.To[int64](1001), container("c", nil)), want: 1001},
		{name: "root, explicitly", pod: pod(ptr.To[int64](0), container("c", nil)), want: 0},
		{name: "container overrides pod", pod: pod(ptr.To[int64](0), container("c", ptr.To[int64](1001))), want: 1001},
		{name: "claim named directly", pod: direct, want: 1001},
		{name: "a container without the claim does not count", pod: sidecar, want: 1001},
		{name: "unset", pod: pod(nil, container("c", nil)), err: "container c sets no runAsUser"},
		{name: "one of two unset", pod: pod(nil, container("a", ptr.To[int64](7)), container("b", nil)), err: "container b sets no runAsUser"},
		{name: "two UIDs", pod: pod(nil, container("a", ptr.To[int64](7)), container("b", ptr.To[int64](8))), err: "run as UIDs 7 and 8"},
		{name: "an init container of another UID", pod: initToo, err: "run as UIDs 0 and 1001"},
		{name: "no container uses the claim", pod: otherClaim, err: "no container uses the claim"},
		{name: "a user namespace of its own", pod: userNS, err: "hostUsers: false"},
		{name: "hostUsers: true, explicitly", pod: hostUsers, want: 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PodUser(tc.pod, claim)
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %d, %v; want %d", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrUserUnknown) || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "ns/nb") {
				t.Fatalf("got %d, %v; want ErrUserUnknown saying %q about ns/nb", got, err, tc.err)
			}
		})
	}
}
