package helm

import (
	"path"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// privileged are the containers that must be privileged, by
// component/container, and why.
var privileged = map[string]string{
	"kubelet-plugin/plugin": "NVML's MIG calls, the GPUs' device nodes, the driver root's mounts",
	"mps/mps":               "each GPU's /dev/shm tmpfs mounts, chroot into the driver root",
	"imex/imex":             "nvidia-imex opens the driver's devices, chroot into the driver root",
}

// asRoot are the containers that run as root, with no capability: they
// write a host directory the kubelet created as root's, 0755, which only
// its owner may write.
var asRoot = map[string]bool{
	"kubelet-plugin/install-nvidia-cdi-hook": true,
	"hami-core/install-hami-core":            true,
}

// facetImage is the image of Facet's own binaries under vals.
func facetImage(t testing.TB, vals map[string]any) string {
	t.Helper()
	img, err := chartValues(t, vals).Table("image")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img["digest"].(string); d != "" {
		return img["repository"].(string) + "@" + d
	}
	tag, _ := img["tag"].(string)
	if tag == "" {
		tag = loadChart(t).Metadata.AppVersion
	}
	return img["repository"].(string) + ":" + tag
}

// TestContainerSecurityContexts: every container of the chart, init
// containers included, but the privileged ones runs as Pod Security's
// "restricted" profile asks: no privilege escalation, every capability
// dropped and none added, the runtime's seccomp profile (its own or its
// pod's), a read-only root filesystem, and as a user other than root, but
// for the installers that write a root-owned host directory, which run as
// root and with nothing more.
func TestContainerSecurityContexts(t *testing.T) {
	seen := map[string]bool{}
	for cfgName, vals := range configurations(t) {
		for _, o := range podObjects(t, render(t, vals)) {
			spec, ok := podSpecOf(t, o)
			if !ok {
				continue
			}
			pod := spec.SecurityContext
			if pod == nil {
				pod = &corev1.PodSecurityContext{}
			}
			component := o.GetLabels()["app.kubernetes.io/component"]
			for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				id := component + "/" + c.Name
				seen[id] = true
				where := cfgName + ": " + o.GetName() + " container " + c.Name
				sc := c.SecurityContext
				if sc == nil {
					sc = &corev1.SecurityContext{}
				}
				if why, ok := privileged[id]; ok {
					if sc.Privileged == nil || !*sc.Privileged {
						t.Errorf("%s is listed as privileged (%s) and is not", where, why)
					}
					continue
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s is privileged", where)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation %v, want false", where, sc.AllowPrivilegeEscalation)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0 {
					t.Errorf("%s: capabilities %+v, want drop ALL and none added", where, sc.Capabilities)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: root filesystem writable", where)
				}
				seccomp := sc.SeccompProfile
				if seccomp == nil {
					seccomp = pod.SeccompProfile
				}
				if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s: seccomp profile %+v, want RuntimeDefault", where, seccomp)
				}
				user, nonRoot := sc.RunAsUser, sc.RunAsNonRoot
				if user == nil {
					user = pod.RunAsUser
				}
				if nonRoot == nil {
					nonRoot = pod.RunAsNonRoot
				}
				switch {
				case asRoot[id] && (user == nil || *user != 0 || (nonRoot != nil && *nonRoot)):
					t.Errorf("%s: runAsUser %v, runAsNonRoot %v; want root, said so", where, user, nonRoot)
				case !asRoot[id] && (user == nil || *user == 0 || nonRoot == nil || !*nonRoot):
					t.Errorf("%s: runAsUser %v, runAsNonRoot %v; want a user other than root, enforced", where, user, nonRoot)
				}
			}
		}
	}
	for id := range asRoot {
		if !seen[id] {
			t.Errorf("no container %s rendered: asRoot is stale", id)
		}
	}
	for id := range privileged {
		if !seen[id] {
			t.Errorf("no container %s rendered: privileged is stale", id)
		}
	}
}

// TestNoThirdPartyShell: a container of an image that is not Facet's (HAMi's)
// runs no program of that image: its command is Facet's facet-install,
// staged from Facet's image into an emptyDir it mounts read-only, so that
// what runs in HAMi's root filesystem is Facet's code, with its arguments
// in the pod spec, not a script in a shell of the image.
func TestNoThirdPartyShell(t *testing.T) {
	checked := 0
	for cfgName, vals := range configurations(t) {
		own := facetImage(t, vals)
		for _, o := range podObjects(t, render(t, vals)) {
			spec, ok := podSpecOf(t, o)
			if !ok {
				continue
			}
			for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				if c.Image == own {
					continue
				}
				checked++
				where := cfgName + ": " + o.GetName() + " container " + c.Name + " (" + c.Image + ")"
				if len(c.Command) == 0 {
					t.Errorf("%s runs its image's entrypoint", where)
					continue
				}
				m, vol := mountFor(&spec, &c, c.Command[0])
				if m == nil || vol == nil || vol.EmptyDir == nil || !m.ReadOnly || path.Base(c.Command[0]) != "facet-install" {
					t.Errorf("%s runs %q, not facet-install from a read-only emptyDir (mount %+v of %+v)", where, c.Command, m, vol)
				}
				for _, a := range append(append([]string{}, c.Command...), c.Args...) {
					if strings.ContainsAny(a, "\n;|&$`") {
						t.Errorf("%s: argument %q looks like a script", where, a)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no container of another image than Facet's rendered: the test checks nothing")
	}
}
