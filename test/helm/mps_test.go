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
// chroot into, and flags facet-mps accepts.
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
				if f.Dir != pluginDir || f.Root != ctrRoot {
					t.Errorf("%s: --mps-dir %s, --driver-root %s; want the plugin's %s and its container driver root %s", ds.Name, f.Dir, f.Root, pluginDir, ctrRoot)
				}
				m, v := mountFor(ms, c, f.Dir)
				if m == nil || v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != f.Dir || m.MountPath != f.Dir {
					t.Fatalf("%s: the MPS directory %s is not its host path mounted at the same path", ds.Name, f.Dir)
				}
				if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
					t.Errorf("%s: the MPS directory's propagation %v: the GPUs' shm tmpfs would not reach the host", ds.Name, m.MountPropagation)
				}
				m, v = mountFor(ms, c, f.Root)
				if m == nil || v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != pluginRoot || m.MountPath != f.Root {
					t.Errorf("%s: --driver-root %s is not the host's driver root %s", ds.Name, f.Root, pluginRoot)
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
