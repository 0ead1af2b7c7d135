package helm

import (
	"path"
	"reflect"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// chartValues are vals over the chart's defaults, as the templates see
// them.
func chartValues(t testing.TB, vals map[string]any) chartutil.Values {
	t.Helper()
	merged, err := chartutil.CoalesceValues(loadChart(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	return merged
}

// hamiCoreImage is the image kubeletPlugin.hamiCore.image names under
// vals, as templates/_helpers.tpl's facet.hamiCoreImage writes it.
func hamiCoreImage(t testing.TB, vals map[string]any) string {
	t.Helper()
	img, err := chartValues(t, vals).Table("kubeletPlugin.hamiCore.image")
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img["digest"].(string); d != "" {
		return img["repository"].(string) + "@" + d
	}
	return img["repository"].(string) + ":" + img["tag"].(string)
}

// installerFlags are the --name=value flags of a facet-install command
// line (command[0] the executable, command[1] the subcommand).
func installerFlags(t testing.TB, c *corev1.Container) map[string]string {
	t.Helper()
	if len(c.Command) < 2 {
		t.Fatalf("container %s: command %q", c.Name, c.Command)
	}
	out := map[string]string{}
	for _, a := range c.Command[2:] {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Fatalf("container %s: argument %q is not --name=value", c.Name, a)
		}
		out[k] = v
	}
	if len(c.Args) != 0 {
		t.Fatalf("container %s: args %q beside the command", c.Name, c.Args)
	}
	return out
}

// TestHAMiCoreDaemonSet: HAMi-core is installed by a DaemonSet of its own
// per node group, never in the plugin's pod, so that a node that cannot
// pull HAMi's image still runs the plugin. Every container of the plugin's
// pod runs Facet's image; the group's <release>-hami-core-<group> has the
// plugin DaemonSet's placement (node selector, affinity, tolerations,
// priority, network), and installs, with facet-install staged from Facet's
// image into an emptyDir, into the directory of the plugin's
// --hami-library, with the plugin's --hami-library-sha256; a pause
// container of Facet's image holds the pod. No DaemonSet without HAMi-core
// or with install: false.
func TestHAMiCoreDaemonSet(t *testing.T) {
	flags := pluginFlags(t)
	cases := configurations(t)
	// Per-group selectors and tolerations, a common affinity, the host's
	// network: each must reach the hami-core DaemonSet of its group.
	cases["groups with their own placement, host network, pinned"] = values(t, `
kubeletPlugin:
  hostNetwork: true
  nodeSelector: {facet.dev/test: "yes"}
  tolerations: [{key: example.com/dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [a]}]
  hamiCore:
    hostDir: /opt/hami//
    image: {repository: mirror.example.com/hami, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
    librarySHA256: fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210
    librarySource: /usr/lib/libvgpu.so
  nodeGroups:
    shared: {mode: shared, nodeSelector: {pool: shared}, tolerations: [{key: example.com/shared, operator: Exists}]}
    lab: {mode: exclusive, gpuNodeSelectorTerms: []}
`)
	for cfgName, vals := range cases {
		t.Run(cfgName, func(t *testing.T) {
			objs := render(t, vals)
			hamiImage := hamiCoreImage(t, vals)
			source, _ := chartValues(t, vals).PathValue("kubeletPlugin.hamiCore.librarySource")
			byGroup := map[string]*appsv1.DaemonSet{}
			for _, ds := range daemonSetsOf(t, objs, "hami-core") {
				byGroup[ds.Spec.Template.Labels["gpu.facet.dev/node-group"]] = ds
			}
			matched := 0
			for _, ds := range daemonSets(t, objs) {
				spec := &ds.Spec.Template.Spec
				plugin := container(t, spec, "plugin", false)
				for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
					if c.Image != plugin.Image {
						t.Errorf("%s: container %s runs %s: a node that cannot pull it would get no plugin", ds.Name, c.Name, c.Image)
					}
				}
				args := parsePluginArgs(t, flags, plugin.Args)
				group := ds.Spec.Template.Labels["gpu.facet.dev/node-group"]
				h := byGroup[group]
				lib, ok := args.set["hami-library"]
				switch {
				case !ok && h != nil:
					t.Errorf("%s installs HAMi-core for a plugin without --hami-library", h.Name)
					continue
				case !ok:
					continue
				case h == nil:
					t.Errorf("%s: --hami-library=%s, and no hami-core DaemonSet for group %s", ds.Name, lib, group)
					continue
				}
				matched++
				if want := releaseName + "-hami-core-" + group; h.Name != want {
					t.Errorf("hami-core DaemonSet %s, want %s", h.Name, want)
				}
				hs := &h.Spec.Template.Spec
				for what, pair := range map[string][2]any{
					"nodeSelector":      {hs.NodeSelector, spec.NodeSelector},
					"affinity":          {hs.Affinity, spec.Affinity},
					"tolerations":       {hs.Tolerations, spec.Tolerations},
					"priorityClassName": {hs.PriorityClassName, spec.PriorityClassName},
					"hostNetwork":       {hs.HostNetwork, spec.HostNetwork},
					"imagePullSecrets":  {hs.ImagePullSecrets, spec.ImagePullSecrets},
				} {
					if !reflect.DeepEqual(pair[0], pair[1]) {
						t.Errorf("%s: %s %+v, the plugin's (%s) %+v", h.Name, what, pair[0], ds.Name, pair[1])
					}
				}
				if hs.AutomountServiceAccountToken == nil || *hs.AutomountServiceAccountToken {
					t.Errorf("%s mounts a service account token; it reads nothing from the API", h.Name)
				}

				// stage-installer copies facet-install from Facet's image
				// into an emptyDir, before install-hami-core runs it there.
				if len(hs.InitContainers) != 2 || hs.InitContainers[0].Name != "stage-installer" || hs.InitContainers[1].Name != "install-hami-core" {
					t.Fatalf("%s: init containers %+v, want stage-installer, then install-hami-core", h.Name, hs.InitContainers)
				}
				stage, inst := &hs.InitContainers[0], &hs.InitContainers[1]
				if stage.Image != plugin.Image || len(stage.Command) != 3 || stage.Command[0] != "facet-install" || stage.Command[1] != "stage" {
					t.Fatalf("%s: stage-installer runs %q from %s, want facet-install stage from Facet's image %s", h.Name, stage.Command, stage.Image, plugin.Image)
				}
				stageDir := installerFlags(t, stage)["dir"]
				sm, svol := mountFor(hs, stage, path.Join(stageDir, "facet-install"))
				im, ivol := mountFor(hs, inst, inst.Command[0])
				if sm == nil || svol == nil || svol.EmptyDir == nil || sm.ReadOnly || sm.MountPath != stageDir {
					t.Errorf("%s: stage-installer writes %s through mount %+v of %+v, want an emptyDir", h.Name, stageDir, sm, svol)
				}
				if im == nil || ivol == nil || svol == nil || ivol.Name != svol.Name || inst.Command[0] != path.Join(im.MountPath, "facet-install") || im.MountPath != stageDir {
					t.Errorf("%s: install-hami-core runs %s through mount %+v, not the facet-install that stage-installer staged in %s", h.Name, inst.Command[0], im, stageDir)
				}
				if inst.Image != hamiImage || inst.ImagePullPolicy == "" {
					t.Errorf("%s: install-hami-core image %s (%s), want HAMi's %s", h.Name, inst.Image, inst.ImagePullPolicy, hamiImage)
				}
				f := installerFlags(t, inst)
				if inst.Command[1] != "hami-core" || f["from"] != source {
					t.Errorf("%s: install-hami-core runs %q, want hami-core --from=%s", h.Name, inst.Command, source)
				}
				if path.Join(f["dir"], "libvgpu.so") != lib {
					t.Errorf("%s installs into %s; the plugin (%s) loads %s", h.Name, f["dir"], ds.Name, lib)
				}
				sha, _ := args.value(flags, "hami-library-sha256")
				if f["sha256"] != sha {
					t.Errorf("%s: install-hami-core --sha256=%q, the plugin's --hami-library-sha256=%q", h.Name, f["sha256"], sha)
				}
				if m, vol := mountFor(hs, inst, lib); m == nil || m.ReadOnly || vol == nil || vol.HostPath == nil || vol.HostPath.Path != f["dir"] || m.MountPath != f["dir"] {
					t.Errorf("%s: install-hami-core cannot write %s on the host: mount %+v of %+v", h.Name, lib, m, vol)
				}
				if pm, pvol := mountFor(spec, plugin, lib); pm == nil || pvol == nil || pvol.HostPath == nil || pvol.HostPath.Path != f["dir"] || pvol.HostPath.Type == nil || *pvol.HostPath.Type != corev1.HostPathDirectoryOrCreate {
					t.Errorf("%s: the plugin sees %s through %+v of %+v; want the host directory, created when missing, so that it starts before the library is installed", ds.Name, lib, pm, pvol)
				}

				// hold: the pod's one container, Facet's image, pausing.
				if len(hs.Containers) != 1 {
					t.Fatalf("%s: containers %+v, want hold only", h.Name, hs.Containers)
				}
				if hold := container(t, hs, "hold", false); hold.Image != plugin.Image || strings.Join(hold.Command, " ") != "facet-install hold" || len(hold.VolumeMounts) != 0 {
					t.Errorf("%s: hold runs %q from %s with mounts %+v, want facet-install hold from %s with none", h.Name, hold.Command, hold.Image, hold.VolumeMounts, plugin.Image)
				}
			}
			if matched != len(byGroup) {
				t.Errorf("%d hami-core DaemonSets, %d of them for a plugin DaemonSet", len(byGroup), matched)
			}
		})
	}

	for _, tc := range []struct {
		values string
		lib    bool
	}{
		{"kubeletPlugin: {hamiCore: {install: false}}", true},
		{"kubeletPlugin: {hamiCore: {enabled: false}}", false},
		{"kubeletPlugin: {hamiCore: {enabled: false, install: true}}", false},
	} {
		objs := render(t, values(t, tc.values))
		if got := daemonSetsOf(t, objs, "hami-core"); len(got) != 0 {
			t.Errorf("%s: %d hami-core DaemonSets, want none", tc.values, len(got))
		}
		for _, ds := range daemonSets(t, objs) {
			if _, ok := parsePluginArgs(t, flags, container(t, &ds.Spec.Template.Spec, "plugin", false).Args).set["hami-library"]; ok != tc.lib {
				t.Errorf("%s: %s has --hami-library: %v, want %v", tc.values, ds.Name, ok, tc.lib)
			}
		}
	}
}

// TestPluginToleratesGPUTaints: by default the plugin, facet-mps and
// hami-core tolerate the nvidia.com/gpu taint with either effect: a node
// tainted NoExecute (a GPU being drained or reset) must keep the pods
// that report and recover its GPUs.
func TestPluginToleratesGPUTaints(t *testing.T) {
	objs := render(t, values(t, ""))
	for _, component := range []string{"kubelet-plugin", "mps", "hami-core"} {
		dss := daemonSetsOf(t, objs, component)
		if len(dss) == 0 {
			t.Errorf("no %s DaemonSet rendered", component)
		}
		for _, ds := range dss {
			for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
				taint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: effect}
				tolerated := false
				for _, tol := range ds.Spec.Template.Spec.Tolerations {
					if tol.ToleratesTaint(klog.Background(), &taint, false) {
						tolerated = true
					}
				}
				if !tolerated {
					t.Errorf("%s does not tolerate %s", ds.Name, taint.ToString())
				}
			}
		}
	}
}

// TestNotesOnHAMiCore: NOTES.txt says where HAMi-core is installed from
// and how to see on which nodes it is, or, with install: false, where the
// operator must put it; nothing without HAMi-core.
func TestNotesOnHAMiCore(t *testing.T) {
	for _, tc := range []struct {
		values      string
		want, never []string
	}{
		{"", []string{"by the DaemonSets facet-hami-core-<group>", "cannot pull projecthami/hami:v2.9.0", "-l app.kubernetes.io/component=hami-core"}, []string{"install is false"}},
		{"kubeletPlugin: {hamiCore: {install: false, hostDir: /opt/hami/}}", []string{"install is false: put the libvgpu.so you vetted at /opt/hami/libvgpu.so"}, []string{"facet-hami-core-", "pulled by tag"}},
		{"kubeletPlugin: {hamiCore: {enabled: false}}", nil, []string{"HAMi-core", "libvgpu.so"}},
	} {
		out, err := renderErr(t, values(t, tc.values), releaseName, releaseNamespace)
		if err != nil {
			t.Fatal(err)
		}
		var notes string
		for f, s := range out {
			if strings.HasSuffix(f, "NOTES.txt") {
				notes = strings.Join(strings.Fields(s), " ")
			}
		}
		for _, w := range tc.want {
			if !strings.Contains(notes, w) {
				t.Errorf("values %q: NOTES.txt lacks %q:\n%s", tc.values, w, notes)
			}
		}
		for _, n := range tc.never {
			if strings.Contains(notes, n) {
				t.Errorf("values %q: NOTES.txt says %q:\n%s", tc.values, n, notes)
			}
		}
	}
}
