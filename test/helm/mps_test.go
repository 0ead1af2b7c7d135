package helm

import (
	"flag"
	"path"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

// TestMPSDaemonSet: facet-mps (templates/mps.yaml) runs beside each node
// group's plugin, on exactly its nodes, with what keeping MPS daemons
// through plugin restarts and upgrades needs: hostPID, OnDelete updates, the
// plugin's MPS directory mounted Bidirectional (each GPU's /dev/shm tmpfs is
// mounted there for the runtime to bind), the plugin's driver root to
// chroot into, read under the host's / where it is not / (a driver under
// a prefix runs from there), and flags facet-mps accepts.
func TestMPSDaemonSet(t *testing.T) {
	flags := pluginFlags(t)
	for name, vals := range configurations(t) {
		t.Run(name, func(t *testing.T) {
			objs := render(t, vals)
			plugins := daemonSets(t, objs)
			mpsSets := map[string]*appsv1.DaemonSet{}
			for _, ds := range daemonSetsOf(t, objs, "mps") {
				mpsSets[ds.Labels["gpu.facet.dev/node-group"]] = ds
			}
			if len(mpsSets) != len(plugins) {
				t.Fatalf("%d facet-mps DaemonSets for %d plugin DaemonSets", len(mpsSets), len(plugins))
			}
			for _, plugin := range plugins {
				group := plugin.Labels["gpu.facet.dev/node-group"]
				ds := mpsSets[group]
				if ds == nil {
					t.Fatalf("node group %s: no facet-mps DaemonSet", group)
				}
				ps, ms := &plugin.Spec.Template.Spec, &ds.Spec.Template.Spec
				if !reflect.DeepEqual(ps.Affinity, ms.Affinity) || !reflect.DeepEqual(ps.NodeSelector, ms.NodeSelector) || !reflect.DeepEqual(ps.Tolerations, ms.Tolerations) {
					t.Errorf("%s: placement differs from the plugin's %s", ds.Name, plugin.Name)
				}
				if !ms.HostPID {
					t.Errorf("%s: hostPID is off: MPS servers and their clients in the shares' containers need one PID namespace", ds.Name)
				}
				if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
					t.Errorf("%s: update strategy %q: helm upgrade would end the node's MPS daemons", ds.Name, ds.Spec.UpdateStrategy.Type)
				}
				c := container(t, ms, "mps", false)
				if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
					t.Errorf("%s: not privileged: it mounts tmpfs and chroots", ds.Name)
				}
				var f service.Flags
				fs := flag.NewFlagSet("facet-mps", flag.ContinueOnError)
				f.AddFlags(fs)
				fs.Int("v", 0, "klog")
				if err := fs.Parse(c.Args); err != nil {
					t.Fatalf("%s: facet-mps refuses its arguments %v: %v", ds.Name, c.Args, err)
				}
				pargs := parsePluginArgs(t, flags, container(t, ps, "plugin", false).Args)
				pluginDir, _ := pargs.value(flags, "mps-dir")
				pluginRoot, _ := pargs.value(flags, "driver-root")
				ctrRoot, _ := pargs.value(flags, "container-driver-root")
				// Where the driver root is the host's /, it is the
				// plugin's mount of it; anywhere else facet-mps reads it
				// under its mount of the host's / (--host-root), whose
				// root runs the daemons of a driver under a prefix.
				wantRoot, wantHost := ctrRoot, ""
				if pluginRoot != "/" {
					wantHost = "/host"
					wantRoot = wantHost + pluginRoot
				}
				if f.Dir != pluginDir || f.Root != wantRoot || f.HostRoot != wantHost {
					t.Errorf("%s: --mps-dir %s, --driver-root %s, --host-root %q; want the plugin's %s, %s and %q", ds.Name, f.Dir, f.Root, f.HostRoot, pluginDir, wantRoot, wantHost)
				}
				m, v := mountFor(ms, c, f.Dir)
				if m == nil || v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != f.Dir || m.MountPath != f.Dir {
					t.Fatalf("%s: the MPS directory %s is not its host path mounted at the same path", ds.Name, f.Dir)
				}
				if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
					t.Errorf("%s: the MPS directory's propagation %v: the GPUs' shm tmpfs would not reach the host", ds.Name, m.MountPropagation)
				}
				m, v = mountFor(ms, c, f.Root)
				if m == nil || v == nil || v.HostPath == nil || path.Join(path.Clean(v.HostPath.Path), strings.TrimPrefix(f.Root, m.MountPath)) != pluginRoot {
					t.Errorf("%s: --driver-root %s is not the host's driver root %s", ds.Name, f.Root, pluginRoot)
				} else if f.HostRoot != "" && (m.MountPath != f.HostRoot || path.Clean(v.HostPath.Path) != "/") {
					t.Errorf("%s: --host-root %s is not the host's / (mounted from %s at %s)", ds.Name, f.HostRoot, v.HostPath.Path, m.MountPath)
				}
				if m != nil && (!m.ReadOnly || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
					t.Errorf("%s: the driver root's mount %s: read-only %v, propagation %v; want read-only, HostToContainer", ds.Name, m.MountPath, m.ReadOnly, m.MountPropagation)
				}
				if _, err := (&f).ShmBytes(); err != nil {
					t.Errorf("%s: %v", ds.Name, err)
				}
				for _, probe := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe} {
					if probe == nil || probe.Exec == nil || !strings.Contains(strings.Join(probe.Exec.Command, " "), "--probe") {
						t.Errorf("%s: want exec probes through facet-mps --probe", ds.Name)
					}
				}
			}
		})
	}
	t.Run("mode off", func(t *testing.T) {
		if got := daemonSetsOf(t, render(t, values(t, "kubeletPlugin: {mps: {mode: \"off\"}}")), "mps"); len(got) != 0 {
			t.Errorf("%d facet-mps DaemonSets with MPS off", len(got))
		}
	})
}
