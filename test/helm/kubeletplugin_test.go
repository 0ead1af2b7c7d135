package helm

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// pluginFlag is one flag of cmd/facet-kubeletplugin, read from its source.
type pluginFlag struct {
	name, kind string // kind: StringVar, BoolVar, IntVar, Float64Var, ...
	def        string // the default when it is a string literal
}

// pluginFlags reads the flags facet-kubeletplugin defines in main.go, so
// that a flag added there without a decision here fails this test.
func pluginFlags(t testing.TB) map[string]pluginFlag {
	t.Helper()
	src := filepath.Join(repoRoot, "cmd", "facet-kubeletplugin", "main.go")
	f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]pluginFlag{}
	// The flags pkg/daemon's Kube registers for every daemon
	// (kube.AddFlags(fs), kube.AddRateFlags(fs, qps, burst)).
	daemonFlags := map[string][]pluginFlag{
		"AddFlags":     {{name: "kubeconfig", kind: "StringVar"}},
		"AddRateFlags": {{name: "kube-api-qps", kind: "Float64Var"}, {name: "kube-api-burst", kind: "IntVar"}},
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && len(call.Args) >= 1 {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "kube" {
				if arg, ok := call.Args[0].(*ast.Ident); ok && arg.Name == "fs" {
					for _, pf := range daemonFlags[sel.Sel.Name] {
						out[pf.name] = pf
					}
				}
			}
		}
		if len(call.Args) < 3 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasSuffix(sel.Sel.Name, "Var") {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
			return true
		}
		lit, ok := call.Args[1].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, _ := strconv.Unquote(lit.Value)
		pf := pluginFlag{name: name, kind: sel.Sel.Name}
		if d, ok := call.Args[2].(*ast.BasicLit); ok && d.Kind == token.STRING {
			pf.def, _ = strconv.Unquote(d.Value)
		}
		out[name] = pf
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %d flags in %s; has the flag set been renamed?", len(out), src)
	}
	return out
}

// What each flag of the plugin means for the DaemonSet. Every flag that
// main.go defines must be in exactly one of these.
var (
	// mountedPathFlags: host paths the plugin itself opens. The function
	// returns the path it opens for a flag value.
	mountedPathFlags = map[string]func(string) string{
		"cdi-dir":               identity,
		"state-dir":             identity,
		"kubelet-registrar-dir": identity,
		// The plugin works in <dir>/gpu.facet.dev only.
		"kubelet-plugins-dir": func(v string) string { return path.Join(v, names.Driver) },
		"hami-library":        identity,
		"mps-dir":             identity,
	}
	// hostOnlyPathFlags: host paths the plugin writes into CDI specs, for
	// the container runtime, and reads where a containerPathFlags flag says
	// (checked by TestPluginSeesTheDriverAndTheHook).
	hostOnlyPathFlags = map[string]bool{"nvidia-cdi-hook": true, "driver-root": true, "dev-root": true}
	// containerPathFlags: where the plugin's container sees a host path,
	// mounted at a path of its own (the host's / cannot be mounted at /);
	// also checked by TestPluginSeesTheDriverAndTheHook.
	containerPathFlags = map[string]bool{"container-driver-root": true, "container-nvidia-cdi-hook": true, "nvml-library": true}
	// otherFlags are not paths. forbidden ones must not be set by the chart.
	otherFlags = map[string]bool{
		"node-name": true, "kube-api-qps": true, "kube-api-burst": true, "destroy-unowned-mig": true,
		"feature-gates": true, "mig-layouts": true, "feature-detection-interval": true,
		"health-addr": true, "gpu-health-probe-interval": true, "gpu-health-quiet-period": true, "pod-uid": true, "probe": true,
		"mps": true, "mps-check-interval": true, "hami-library-sha256": true,
		// Default auto; the chart leaves it so (ComputeDomains need no
		// value of the plugin's: off only where the fabric is not Facet's).
		"compute-domains": true,
	}
	forbiddenFlags = map[string]string{
		"kubeconfig": "the plugin runs in-cluster",
		"machine":    "a simulated node is for demos and tests",
	}
)

func identity(v string) string { return v }

func TestEveryPluginFlagIsClassified(t *testing.T) {
	for name := range pluginFlags(t) {
		n := 0
		if _, ok := mountedPathFlags[name]; ok {
			n++
		}
		if hostOnlyPathFlags[name] {
			n++
		}
		if containerPathFlags[name] {
			n++
		}
		if otherFlags[name] {
			n++
		}
		if _, ok := forbiddenFlags[name]; ok {
			n++
		}
		if n != 1 {
			t.Errorf("facet-kubeletplugin flag --%s is in %d of the classes in test/helm/kubeletplugin_test.go, want 1: "+
				"decide whether the DaemonSet must mount it, and teach the chart", name, n)
		}
	}
}

// parsedArgs is a plugin container's command line, parsed with the
// plugin's own flags (and the mode flags' own parser).
type parsedArgs struct {
	set   map[string]string // flags given, by name
	modes inventory.ModeFlags
}

func parsePluginArgs(t testing.TB, flags map[string]pluginFlag, args []string) parsedArgs {
	t.Helper()
	fs := flag.NewFlagSet("facet-kubeletplugin", flag.ContinueOnError)
	for _, f := range flags {
		switch f.kind {
		case "BoolVar":
			fs.Bool(f.name, false, "")
		default:
			fs.String(f.name, f.def, "")
		}
	}
	var out parsedArgs
	out.modes.Register(fs)
	klog.InitFlags(fs)
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || !strings.Contains(a, "=") {
			t.Errorf("argument %q: the chart writes every flag as --name=value", a)
		}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the plugin would refuse its arguments %q: %v", args, err)
	}
	if fs.NArg() > 0 {
		t.Errorf("stray arguments %q", fs.Args())
	}
	out.set = map[string]string{}
	fs.Visit(func(f *flag.Flag) { out.set[f.Name] = f.Value.String() })
	if _, err := out.modes.Config(); err != nil {
		t.Errorf("the plugin would refuse its mode flags: %v", err)
	}
	return out
}

// value returns a flag's value: given, or main.go's default.
func (p parsedArgs) value(flags map[string]pluginFlag, name string) (string, bool) {
	if v, ok := p.set[name]; ok {
		return v, true
	}
	return flags[name].def, flags[name].def != ""
}

// daemonSets are the kubelet plugin's DaemonSets, one per node group.
func daemonSets(t testing.TB, objs []object) []*appsv1.DaemonSet {
	return daemonSetsOf(t, objs, "kubelet-plugin")
}

// daemonSetsOf are the DaemonSets of one app.kubernetes.io/component.
func daemonSetsOf(t testing.TB, objs []object, component string) []*appsv1.DaemonSet {
	var out []*appsv1.DaemonSet
	for _, o := range ofKind(objs, "DaemonSet") {
		ds := &appsv1.DaemonSet{}
		into(t, o, ds)
		if ds.Labels["app.kubernetes.io/component"] == component {
			out = append(out, ds)
		}
	}
	return out
}

func container(t testing.TB, spec *corev1.PodSpec, name string, init bool) *corev1.Container {
	t.Helper()
	list := spec.Containers
	if init {
		list = spec.InitContainers
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// mountFor returns the volume mount whose mountPath holds p, and its volume.
func mountFor(spec *corev1.PodSpec, c *corev1.Container, p string) (*corev1.VolumeMount, *corev1.Volume) {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/") {
			if best == nil || len(m.MountPath) > len(best.MountPath) {
				best = &c.VolumeMounts[i]
			}
		}
	}
	if best == nil {
		return nil, nil
	}
	for i, v := range spec.Volumes {
		if v.Name == best.Name {
			return best, &spec.Volumes[i]
		}
	}
	return best, nil
}

// TestPluginMountsEveryHostPathItUses is the check that the plugin, as the
// chart runs it, finds every host path its flags name: each path the plugin
// opens is under a hostPath volume mounted at the same path (the plugin
// writes host paths into CDI specs and registers its socket's path with
// the kubelet, so a path must mean the same inside and outside).
func TestPluginMountsEveryHostPathItUses(t *testing.T) {
	flags := pluginFlags(t)
	for cfgName, vals := range configurations(t) {
		objs := render(t, vals)
		dss := daemonSets(t, objs)
		if len(dss) == 0 {
			t.Fatalf("%s: no DaemonSet rendered", cfgName)
		}
		for _, ds := range dss {
			t.Run(cfgName+"/"+ds.Name, func(t *testing.T) {
				spec := &ds.Spec.Template.Spec
				c := container(t, spec, "plugin", false)
				if len(c.Command) != 1 || c.Command[0] != "facet-kubeletplugin" {
					t.Errorf("command %q", c.Command)
				}
				args := parsePluginArgs(t, flags, c.Args)
				for name, why := range forbiddenFlags {
					if _, ok := args.set[name]; ok {
						t.Errorf("--%s is set: %s", name, why)
					}
				}
				var names []string
				for name := range mountedPathFlags {
					names = append(names, name)
				}
				sort.Strings(names)
				for _, name := range names {
					v, ok := args.value(flags, name)
					if !ok {
						continue // unset, no default: the plugin does without
					}
					if !path.IsAbs(v) {
						t.Errorf("--%s=%s is not absolute", name, v)
						continue
					}
					p := mountedPathFlags[name](v)
					m, vol := mountFor(spec, c, p)
					switch {
					case m == nil:
						t.Errorf("--%s=%s: %s is under no volume mount", name, v, p)
					case vol == nil || vol.HostPath == nil:
						t.Errorf("--%s=%s: %s is under mount %s, which is not a hostPath volume", name, v, p, m.MountPath)
					case path.Clean(vol.HostPath.Path) != path.Clean(m.MountPath):
						t.Errorf("--%s=%s: volume %s mounts host %s at %s; a host path must keep its path", name, v, vol.Name, vol.HostPath.Path, m.MountPath)
					}
				}
				for name := range hostOnlyPathFlags {
					if v, ok := args.value(flags, name); ok && !path.IsAbs(v) {
						t.Errorf("--%s=%s is not absolute", name, v)
					}
				}
				if v, ok := args.set["nvidia-cdi-hook"]; ok && path.Base(v) != "nvidia-cdi-hook" {
					t.Errorf("--nvidia-cdi-hook=%s: nvcdi needs the file to be named nvidia-cdi-hook", v)
				}

				// The node's name, from the downward API.
				var nodeEnv bool
				for _, e := range c.Env {
					if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
						nodeEnv = true
					}
				}
				if _, set := args.set["node-name"]; !nodeEnv && !set {
					t.Error("neither NODE_NAME from spec.nodeName nor --node-name")
				}
				if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
					t.Error("the plugin container is not privileged")
				}
				if sa := spec.ServiceAccountName; sa == "" || sa == "default" {
					t.Errorf("service account %q", sa)
				}

				// HAMi-core is installed by the hami-core DaemonSet
				// (TestHAMiCoreDaemonSet), never in the plugin's pod: a
				// node that cannot pull HAMi's image must still run it.
				for _, ic := range spec.InitContainers {
					if ic.Name == "install-hami-core" || ic.Image == hamiCoreImage(t, vals) {
						t.Errorf("the plugin's pod installs HAMi-core (init container %s, image %s)", ic.Name, ic.Image)
					}
				}
			})
		}
	}
}

// TestNodeGroupsAreDisjoint evaluates each DaemonSet's node selection with
// the scheduler's own matcher on a few nodes: no node may get two plugins,
// and each node gets the group its label names.
func TestNodeGroupsAreDisjoint(t *testing.T) {
	objs := render(t, values(t, `
kubeletPlugin:
  nodeSelector: {facet.dev/test: "yes"}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: nvidia.com/gpu.present, operator: In, values: ["true"]}]
        - matchExpressions: [{key: feature.node.kubernetes.io/pci-10de.present, operator: In, values: ["true"]}]
  nodeGroups:
    shared: {mode: shared, nodeSelector: {extra: "1"}}
    mig: {mode: mig}
`))
	dss := daemonSets(t, objs)
	if len(dss) != 3 {
		t.Fatalf("%d DaemonSets, want default, mig and shared", len(dss))
	}
	gpu := map[string]string{"nvidia.com/gpu.present": "true", "facet.dev/test": "yes", "extra": "1"}
	nfd := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "facet.dev/test": "yes"}
	with := func(base map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	const label = "gpu.facet.dev/node-group"
	nodes := []struct {
		name   string
		labels map[string]string
		want   string // the group's DaemonSet suffix, "" for none
	}{
		{"unlabelled GPU node", gpu, "default"},
		{"unlabelled GPU node found by NFD", nfd, "default"},
		{"explicitly default", with(gpu, label, "default"), "default"},
		{"shared", with(gpu, label, "shared"), "shared"},
		{"shared without the group's extra selector", with(nfd, label, "shared"), ""},
		{"mig", with(nfd, label, "mig"), "mig"},
		{"a group that does not exist", with(gpu, label, "nope"), ""},
		{"not a GPU node", map[string]string{"facet.dev/test": "yes"}, ""},
		{"GPU node outside the common nodeSelector", map[string]string{"nvidia.com/gpu.present": "true"}, ""},
	}
	for _, n := range nodes {
		if got := pluginGroupsOn(t, dss, "n", n.labels); got != n.want {
			t.Errorf("%s: plugins %q, want %q", n.name, got, n.want)
		}
	}
	// The groups' mode flags reach their DaemonSets.
	flags := pluginFlags(t)
	for _, ds := range dss {
		args := parsePluginArgs(t, flags, container(t, &ds.Spec.Template.Spec, "plugin", false).Args)
		group := ds.Spec.Template.Labels["gpu.facet.dev/node-group"]
		want := map[string]string{"default": "auto", "shared": "shared", "mig": "mig"}[group]
		if args.modes.Default != want {
			t.Errorf("%s: --mode=%s, want %s", ds.Name, args.modes.Default, want)
		}
	}
}

// pluginGroupsOn returns the node groups whose DaemonSets would run a pod on
// a node of that name and labels, by the scheduler's own matcher, joined by
// commas ("" for none).
func pluginGroupsOn(t testing.TB, dss []*appsv1.DaemonSet, name string, nodeLabels map[string]string) string {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels}}
	var got []string
	for _, ds := range dss {
		pod := &corev1.Pod{Spec: ds.Spec.Template.Spec}
		ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
		if err != nil {
			t.Fatalf("%s: %v", ds.Name, err)
		}
		if ok {
			got = append(got, strings.TrimPrefix(ds.Name, releaseName+"-kubelet-plugin-"))
		}
	}
	return strings.Join(got, ",")
}

// TestPluginOnlyOnGPUNodes: by default a node runs a plugin only when it has
// a label that NFD or the GPU Operator puts on nodes with an NVIDIA GPU, so
// a CPU node never runs one, whatever its node group label.
// gpuNodeSelectorTerms replaces those labels (for every group, or for one),
// and [] lifts the rule.
func TestPluginOnlyOnGPUNodes(t *testing.T) {
	const group = "gpu.facet.dev/node-group"
	with := func(kv ...string) map[string]string {
		out := map[string]string{"kubernetes.io/os": "linux"}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	type node struct {
		name   string
		labels map[string]string
		want   string // the node groups that run a plugin there, "" for none
	}
	for _, tc := range []struct {
		name, values string
		nodes        []node
	}{
		{
			name: "defaults",
			nodes: []node{
				{"NFD, PCI vendor", with("feature.node.kubernetes.io/pci-10de.present", "true"), "default"},
				{"NFD, 3D controller", with("feature.node.kubernetes.io/pci-0302_10de.present", "true"), "default"},
				{"NFD, VGA controller", with("feature.node.kubernetes.io/pci-0300_10de.present", "true"), "default"},
				{"GPU Operator", with("nvidia.com/gpu.present", "true"), "default"},
				{"GPU Operator, default group", with("nvidia.com/gpu.present", "true", group, "default"), "default"},
				{"CPU node", with(), ""},
				{"CPU node labelled for the default group", with(group, "default"), ""},
				{"CPU node with an NVIDIA CPU (Grace)", with("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"), ""},
				{"GPU Operator says no GPU", with("nvidia.com/gpu.present", "false"), ""},
			},
		},
		{
			name: "own label",
			values: `
kubeletPlugin:
  gpuNodeSelectorTerms:
  - matchExpressions: [{key: example.com/gpu, operator: Exists}]
`,
			nodes: []node{
				{"own label", with("example.com/gpu", "a100"), "default"},
				{"only NFD's label: replaced, not added to", with("feature.node.kubernetes.io/pci-10de.present", "true"), ""},
				{"CPU node", with(), ""},
			},
		},
		{
			name: "no GPU rule",
			values: `
kubeletPlugin:
  gpuNodeSelectorTerms: []
  nodeSelector: {pool: gpu}
`,
			nodes: []node{
				{"unlabelled node of the pool", with("pool", "gpu"), "default"},
				{"GPU node outside the pool", with("pool", "cpu", "nvidia.com/gpu.present", "true"), ""},
			},
		},
		{
			name: "per group, with the common affinity",
			values: `
kubeletPlugin:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [a, b]}]
  nodeGroups:
    edge:
      mode: exclusive
      gpuNodeSelectorTerms:
      - matchExpressions: [{key: example.com/gpu, operator: Exists}]
      - matchFields: [{key: metadata.name, operator: In, values: [gpu-by-name]}]
    lab: {mode: shared, gpuNodeSelectorTerms: []}
`,
			nodes: []node{
				{"default group, NFD", with("topology.kubernetes.io/zone", "a", "feature.node.kubernetes.io/pci-10de.present", "true"), "default"},
				{"default group, NFD, other zone", with("topology.kubernetes.io/zone", "c", "feature.node.kubernetes.io/pci-10de.present", "true"), ""},
				{"default group, own label only", with("topology.kubernetes.io/zone", "a", "example.com/gpu", "l4"), ""},
				{"edge, own label", with("topology.kubernetes.io/zone", "b", group, "edge", "example.com/gpu", "l4"), "edge"},
				{"edge, NFD only", with("topology.kubernetes.io/zone", "b", group, "edge", "feature.node.kubernetes.io/pci-10de.present", "true"), ""},
				{"gpu-by-name", with("topology.kubernetes.io/zone", "a", group, "edge"), "edge"},
				{"lab, no GPU label", with("topology.kubernetes.io/zone", "a", group, "lab"), "lab"},
				{"lab, other zone", with("topology.kubernetes.io/zone", "c", group, "lab"), ""},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dss := daemonSets(t, render(t, values(t, tc.values)))
			for _, n := range tc.nodes {
				// The case's name is the node's, for matchFields.
				if got := pluginGroupsOn(t, dss, n.name, n.labels); got != n.want {
					t.Errorf("%s: plugins %q, want %q", n.name, got, n.want)
				}
			}
		})
	}

	// Whatever else is configured, a node without a GPU label gets none.
	for cfgName, vals := range configurations(t) {
		dss := daemonSets(t, render(t, vals))
		for _, g := range []string{"", "default", "shared", "mixed"} {
			labels := with("node-role.kubernetes.io/worker", "")
			if g != "" {
				labels[group] = g
			}
			if got := pluginGroupsOn(t, dss, "cpu-1", labels); got != "" {
				t.Errorf("%s: a CPU node labelled %q runs plugins %q", cfgName, g, got)
			}
		}
	}
}

// TestNotesOnGPUNodes: NOTES.txt lists the GPU labels and tells an operator
// whose nodes carry none of them what to do; it says nothing of them when
// there is no such rule.
func TestNotesOnGPUNodes(t *testing.T) {
	notes := func(t *testing.T, v string) string {
		out, err := renderErr(t, values(t, v), releaseName, releaseNamespace)
		if err != nil {
			t.Fatal(err)
		}
		for f, s := range out {
			if strings.HasSuffix(f, "NOTES.txt") {
				return s
			}
		}
		t.Fatal("no NOTES.txt rendered")
		return ""
	}
	got := notes(t, "")
	for _, want := range []string{
		"\n  feature.node.kubernetes.io/pci-10de.present=true\n",
		"\n  feature.node.kubernetes.io/pci-0302_10de.present=true\n",
		"\n  nvidia.com/gpu.present=true\n",
		"kubectl label node <gpu-node> nvidia.com/gpu.present=true",
		"kubeletPlugin.gpuNodeSelectorTerms",
		// A bare cluster: the webhook's own certificate, and what is left.
		"The admission webhook's certificate (tls.mode auto: selfSigned):",
		"Only helm upgrade\n  renews them, once fewer than 30 days are left",
		"install cert-manager and set\n  admission.webhook.tls.mode=certManager",
		"facet-mps keeps the MPS daemons",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, got)
		}
	}
	got = notes(t, `
kubeletPlugin:
  gpuNodeSelectorTerms:
  - matchExpressions: [{key: example.com/gpu, operator: Exists}, {key: example.com/model, operator: In, values: [a, b]}]
`)
	if want := "\n  example.com/gpu Exists and example.com/model In a,b\n"; !strings.Contains(got, want) {
		t.Errorf("NOTES.txt lacks %q:\n%s", want, got)
	}
	// The expiry alert is named only where the chart installs it.
	const alert = "FacetWebhookCertificateExpiresSoon fires 14 days before it expires"
	if got := notes(t, ""); strings.Contains(got, alert) {
		t.Errorf("NOTES.txt names the expiry alert without monitoring.prometheusRules:\n%s", got)
	}
	if got := notes(t, "monitoring: {prometheusRules: {enabled: true}}"); !strings.Contains(got, alert) {
		t.Errorf("NOTES.txt lacks %q:\n%s", alert, got)
	}
	if got := notes(t, "kubeletPlugin: {gpuNodeSelectorTerms: []}"); strings.Contains(got, "gpuNodeSelectorTerms") {
		t.Errorf("NOTES.txt speaks of GPU labels without a GPU rule:\n%s", got)
	}
}

// TestHAMiCorePinned: by default HAMi-core's image is pulled by tag and its
// library not hashed, and NOTES.txt says so; with a digest and a SHA-256,
// the hami-core DaemonSet pulls repository@digest and installs only a
// library of that hash, the plugin gets --hami-library-sha256, and
// NOTES.txt says nothing.
func TestHAMiCorePinned(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const sum = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	for _, tc := range []struct {
		name, values, image, sha, notes string
	}{
		{"default", "", "projecthami/hami:v2.9.0", "", "pulled by tag (projecthami/hami:v2.9.0) and not checked by hash"},
		{"digest only", "kubeletPlugin: {hamiCore: {image: {digest: " + digest + "}}}", "projecthami/hami@" + digest, "", "is not checked by hash"},
		{"pinned", "kubeletPlugin: {hamiCore: {image: {digest: " + digest + "}, librarySHA256: " + sum + "}}", "projecthami/hami@" + digest, sum, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := renderErr(t, values(t, tc.values), releaseName, releaseNamespace)
			if err != nil {
				t.Fatal(err)
			}
			var notes string
			for f, s := range out {
				if strings.HasSuffix(f, "NOTES.txt") {
					notes = s
				}
			}
			if tc.notes == "" && strings.Contains(notes, "Pin what you have vetted") {
				t.Errorf("NOTES.txt asks to pin a pinned HAMi-core:\n%s", notes)
			}
			if tc.notes != "" && !strings.Contains(strings.Join(strings.Fields(notes), " "), tc.notes) {
				t.Errorf("NOTES.txt lacks %q:\n%s", tc.notes, notes)
			}
			flags := pluginFlags(t)
			objs := render(t, values(t, tc.values))
			for _, ds := range daemonSetsOf(t, objs, "hami-core") {
				c := container(t, &ds.Spec.Template.Spec, "install-hami-core", true)
				if c.Image != tc.image {
					t.Errorf("%s: install-hami-core image %s, want %s", ds.Name, c.Image, tc.image)
				}
				if got := installerFlags(t, c)["sha256"]; got != tc.sha {
					t.Errorf("%s: install-hami-core --sha256=%q, want %q", ds.Name, got, tc.sha)
				}
			}
			for _, ds := range daemonSets(t, objs) {
				c := container(t, &ds.Spec.Template.Spec, "plugin", false)
				got, _ := parsePluginArgs(t, flags, c.Args).value(flags, "hami-library-sha256")
				if got != tc.sha {
					t.Errorf("%s: --hami-library-sha256=%q, want %q", ds.Name, got, tc.sha)
				}
			}
		})
	}
}

func TestRemovingTheDefaultGroup(t *testing.T) {
	objs := render(t, values(t, "kubeletPlugin:\n  nodeGroups:\n    default: null\n    a100: {mode: mig}\n"))
	dss := daemonSets(t, objs)
	if len(dss) != 1 || dss[0].Name != releaseName+"-kubelet-plugin-a100" {
		var names []string
		for _, ds := range dss {
			names = append(names, ds.Name)
		}
		t.Fatalf("DaemonSets %v, want only the a100 group's", names)
	}
}

// TestPluginRBAC pins the plugin's permissions to what the kubelet plugin
// helper calls, and nothing else.
func TestPluginRBAC(t *testing.T) {
	objs := render(t, values(t, ""))
	role := find(t, objs, "ClusterRole", releaseName+"-kubelet-plugin")
	got := fmt.Sprint(role.Object["rules"])
	want := fmt.Sprint([]any{
		map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resources": []any{"resourceslices"}, "verbs": []any{"get", "list", "watch", "create", "update", "delete"}},
		map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resources": []any{"resourceclaims"}, "verbs": []any{"get"}},
		map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resources": []any{"resourceclaims/status"}, "verbs": []any{"patch"}},
		map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resourceNames": []any{"gpu.facet.dev"}, "resources": []any{"resourceclaims/driver"}, "verbs": []any{"associated-node:patch"}},
		map[string]any{"apiGroups": []any{""}, "resources": []any{"nodes"}, "verbs": []any{"get", "patch"}},
		map[string]any{"apiGroups": []any{"gpu.facet.dev"}, "resources": []any{"computedomains"}, "verbs": []any{"list", "watch"}},
		map[string]any{"apiGroups": []any{"resource.k8s.io"}, "resources": []any{"deviceclasses"}, "verbs": []any{"get"}},
		map[string]any{"apiGroups": []any{"", "events.k8s.io"}, "resources": []any{"events"}, "verbs": []any{"create", "patch"}},
		map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get"}},
	})
	if got != want {
		t.Errorf("ClusterRole rules\n%s\nwant\n%s", got, want)
	}
	// The compute-domain controller and the IMEX daemons, on by default,
	// have their own (TestComputeDomainController).
	var rest []object
	for _, o := range objs {
		if c := o.GetLabels()["app.kubernetes.io/component"]; c != "controller" && c != "imex" {
			rest = append(rest, o)
		}
	}
	for _, o := range append(ofKind(rest, "Role"), ofKind(rest, "RoleBinding")...) {
		// helm test's node check execs into the plugin's pods, in the
		// release namespace only (TestNodeCheckHook); the claim mutator
		// dry-runs claims there (TestWebhookAPIAccess).
		if o.GetLabels()["app.kubernetes.io/component"] != "node-check" && o.GetName() != "facet-webhook-probe" {
			t.Errorf("%s %s: only the plugin has permissions, cluster-wide, and helm test's node check and the webhook's probe in the release namespace", o.GetKind(), o.GetName())
		}
	}
	crbs := ofKind(rest, "ClusterRoleBinding")
	if len(crbs) != 1 {
		t.Fatalf("%d ClusterRoleBindings, want the plugin's only (the webhook needs no cluster-wide API access)", len(crbs))
	}
	subjects := fmt.Sprint(crbs[0].Object["subjects"])
	if !strings.Contains(subjects, "name:"+releaseName+"-kubelet-plugin") || !strings.Contains(subjects, "namespace:"+releaseNamespace) {
		t.Errorf("ClusterRoleBinding subjects %s", subjects)
	}
}

// TestNodeRestrictionPolicy checks the policy's match on the plugin's
// service account; live_test.go checks what it does on a real API server.
func TestNodeRestrictionPolicy(t *testing.T) {
	objs := render(t, values(t, ""))
	vap := find(t, objs, "ValidatingAdmissionPolicy", releaseName+"-resourceslices-own-node")
	conds := fmt.Sprint(vap.Object["spec"].(map[string]any)["matchConditions"])
	if want := `system:serviceaccount:` + releaseNamespace + `:` + releaseName + `-kubelet-plugin`; !strings.Contains(conds, want) {
		t.Errorf("matchConditions %s do not name %s", conds, want)
	}
	b := find(t, objs, "ValidatingAdmissionPolicyBinding", releaseName+"-resourceslices-own-node")
	if got := fmt.Sprint(b.Object["spec"]); !strings.Contains(got, "policyName:"+releaseName+"-resourceslices-own-node") || !strings.Contains(got, "validationActions:[Deny]") {
		t.Errorf("binding spec %s", got)
	}
}

// TestPluginMetricsScrape: the plugin's pods carry Prometheus' scrape
// annotations for the health port, which serves /metrics, merged with
// podAnnotations; none without a health port or when turned off.
func TestPluginMetricsScrape(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         map[string]string
	}{
		{"defaults", "", map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "8081", "prometheus.io/path": "/metrics"}},
		{"other port and own annotations", `
kubeletPlugin:
  health: {port: 9400}
  podAnnotations: {example.com/team: gpu}
`, map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics", "example.com/team": "gpu"}},
		{"annotations off", `
kubeletPlugin:
  metrics: {scrapeAnnotations: false}
  podAnnotations: {example.com/team: gpu}
`, map[string]string{"example.com/team": "gpu"}},
		{"no health port", `
kubeletPlugin:
  health: {port: 0}
`, nil},
		{"host network: metrics on the pod's unix socket only", `
kubeletPlugin:
  hostNetwork: true
`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, values(t, tc.values))
			for _, ds := range daemonSets(t, objs) {
				got := ds.Spec.Template.Annotations
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("%s: pod annotations %v, want %v", ds.Name, got, tc.want)
				}
			}
			if n := len(ofKind(objs, "ServiceMonitor")); n != 0 {
				t.Errorf("%d ServiceMonitors by default", n)
			}
		})
	}
}

// TestPluginServiceMonitor: with serviceMonitor.enabled, a headless Service
// selects every node group's plugin pods on the health port, and a
// ServiceMonitor scrapes its /metrics.
func TestPluginServiceMonitor(t *testing.T) {
	objs := render(t, values(t, `
kubeletPlugin:
  nodeGroups:
    shared: {mode: shared}
  metrics:
    serviceMonitor: {enabled: true, interval: 15s, labels: {release: prom}}
`))
	svcObj := find(t, objs, "Service", releaseName+"-kubelet-plugin-metrics")
	var svc corev1.Service
	into(t, svcObj, &svc)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" ||
		svc.Spec.Ports[0].Port != 8081 || svc.Spec.Ports[0].TargetPort.String() != "health" {
		t.Errorf("Service spec %+v", svc.Spec)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	dss := daemonSets(t, objs)
	if len(dss) != 2 {
		t.Fatalf("%d DaemonSets, want 2 node groups", len(dss))
	}
	for _, ds := range dss {
		if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("the metrics Service does not select %s's pods", ds.Name)
		}
		if c := container(t, &ds.Spec.Template.Spec, "plugin", false); !hasPort(c, "health", 8081) {
			t.Errorf("%s: no container port health 8081", ds.Name)
		}
	}
	sm := find(t, objs, "ServiceMonitor", releaseName+"-kubelet-plugin")
	if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prom" {
		t.Errorf("ServiceMonitor %s, labels %v", sm.GetAPIVersion(), sm.GetLabels())
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !labels.SelectorFromSet(smSel).Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not match the Service's labels %v", smSel, svc.Labels)
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if got := fmt.Sprint(endpoints); len(endpoints) != 1 || !strings.Contains(got, "port:metrics") || !strings.Contains(got, "path:/metrics") || !strings.Contains(got, "interval:15s") {
		t.Errorf("ServiceMonitor endpoints %s", got)
	}
}

func hasPort(c *corev1.Container, name string, port int32) bool {
	for _, p := range c.Ports {
		if p.Name == name && p.ContainerPort == port {
			return true
		}
	}
	return false
}

// TestPluginRollingUpdate: by default the DaemonSet surges (the new pod
// serves before the old one stops) and the plugin gets its pod's UID
// (--pod-uid) for kubeletplugin.RollingUpdate. In the host's network the
// probes move from a port, which a surge pod could not also hold, to a
// unix socket asked by exec probes; with rollingUpdates off there is no
// POD_UID.
func TestPluginRollingUpdate(t *testing.T) {
	for _, tc := range []struct {
		name, values        string
		wantUID, wantSocket bool
	}{
		{"defaults", "", true, false},
		{"host network", "kubeletPlugin: {hostNetwork: true}", true, true},
		{"no rolling updates", "kubeletPlugin: {rollingUpdates: false, updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 0, maxUnavailable: 1}}}", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSets(t, render(t, values(t, tc.values)))[0]
			ru := ds.Spec.UpdateStrategy.RollingUpdate
			if tc.wantUID && (ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0) {
				t.Errorf("updateStrategy %+v, want maxSurge 1, maxUnavailable 0", ds.Spec.UpdateStrategy)
			}
			c := container(t, &ds.Spec.Template.Spec, "plugin", false)
			var uid *corev1.EnvVar
			for i := range c.Env {
				if c.Env[i].Name == "POD_UID" {
					uid = &c.Env[i]
				}
			}
			if got := uid != nil && uid.ValueFrom != nil && uid.ValueFrom.FieldRef != nil && uid.ValueFrom.FieldRef.FieldPath == "metadata.uid"; got != tc.wantUID {
				t.Errorf("POD_UID from metadata.uid: %v, want %v (env %+v)", got, tc.wantUID, c.Env)
			}
			args := strings.Join(c.Args, " ")
			r := c.ReadinessProbe
			if tc.wantSocket {
				want := []string{"facet-kubeletplugin", "--health-addr=unix:/tmp/facet-health.sock", "--probe=/readyz"}
				if r == nil || r.Exec == nil || strings.Join(r.Exec.Command, " ") != strings.Join(want, " ") ||
					!strings.Contains(args, "--health-addr=unix:/tmp/facet-health.sock") || len(c.Ports) != 0 {
					t.Errorf("host network: readiness %+v, args %q, ports %+v; want an exec probe on the unix socket and no port", r, args, c.Ports)
				}
			} else if r == nil || r.HTTPGet == nil || r.HTTPGet.Path != "/readyz" || !strings.Contains(args, "--health-addr=:8081") {
				t.Errorf("readiness %+v, args %q; want /readyz over HTTP on :8081", r, args)
			}
		})
	}
	t.Run("a percentage maxSurge", func(t *testing.T) {
		ds := daemonSets(t, render(t, values(t, "kubeletPlugin: {updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 25%, maxUnavailable: 0}}}")))[0]
		if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || ru.MaxSurge.String() != "25%" {
			t.Errorf("updateStrategy %+v, want maxSurge 25%%", ds.Spec.UpdateStrategy)
		}
	})
	for _, v := range []string{
		"kubeletPlugin: {rollingUpdates: false}",
		"kubeletPlugin: {rollingUpdates: false, updateStrategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 10%, maxUnavailable: 0}}}",
	} {
		t.Run("refused: "+v, func(t *testing.T) {
			_, err := renderErr(t, values(t, v), releaseName, releaseNamespace)
			if err == nil || !strings.Contains(err.Error(), "kubeletPlugin.rollingUpdates=false with updateStrategy.rollingUpdate.maxSurge=") {
				t.Fatalf("render: %v, want a refusal of a surge without --pod-uid", err)
			}
		})
	}
}

// TestPluginSeesTheDriverAndTheHook renders the driver layouts users have
// and checks that the plugin's container sees each host path its flags
// name where its container-path flags say: the driver root through its
// read-only mount, the dev root through that mount or a same-path one,
// NVML under the driver root's mount, and nvidia-cdi-hook through a mount
// of its host directory, installed there by the init container when the
// chart installs Facet's copy.
func TestPluginSeesTheDriverAndTheHook(t *testing.T) {
	const installed = "/var/lib/facet-cdi-hook/nvidia-cdi-hook"
	for _, tc := range []struct {
		name, values       string
		root, dev, hook    string // host paths the plugin must be given
		nvml               string // --nvml-library, "" for none (found in the root)
		install            bool   // the init container installs the hook
		wantDevMount       bool   // <dev>/dev mounted at the same path
		wantInitContainers int
	}{
		{
			name: "defaults: driver in the host's /", root: "/", dev: "/", hook: installed, install: true,
			wantInitContainers: 1,
		},
		{
			name: "driver root / spelt //", values: "kubeletPlugin: {driver: {root: //, devRoot: /}}",
			root: "/", dev: "/", hook: installed, install: true, wantInitContainers: 1,
		},
		{
			name:   "GPU Operator",
			values: "kubeletPlugin: {driver: {root: /run/nvidia/driver}}",
			root:   "/run/nvidia/driver", dev: "/", hook: installed, install: true, wantDevMount: true, wantInitContainers: 1,
		},
		{
			name: "GPU Operator with its toolkit's hook and NVML on RHEL",
			values: `kubeletPlugin:
  driver: {root: /run/nvidia/driver/, nvmlLibrary: /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1, nvidiaCDIHookPath: /usr/local/nvidia/toolkit/nvidia-cdi-hook}
  nvidiaCDIHook: {install: false}
  hamiCore: {enabled: false}`,
			root: "/run/nvidia/driver", dev: "/", hook: "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
			nvml: "/driver-root/usr/lib64/libnvidia-ml.so.1", wantDevMount: true,
		},
		{
			name:   "/usr/local/nvidia with lib64",
			values: "kubeletPlugin: {driver: {root: /usr/local/nvidia, nvmlLibrary: /usr/local/nvidia/lib64/libnvidia-ml.so.1}, nvidiaCDIHook: {hostDir: /opt/facet/bin}}",
			root:   "/usr/local/nvidia", dev: "/", hook: "/opt/facet/bin/nvidia-cdi-hook", install: true,
			nvml: "/driver-root/lib64/libnvidia-ml.so.1", wantDevMount: true, wantInitContainers: 1,
		},
		{
			name:   "host's / with NVML named, the toolkit package's hook",
			values: "kubeletPlugin: {driver: {nvmlLibrary: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1}, nvidiaCDIHook: {install: false}}",
			root:   "/", dev: "/", hook: "/usr/bin/nvidia-cdi-hook",
			nvml: "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		},
		{
			name:   "dev root is the driver root",
			values: "kubeletPlugin: {driver: {root: /run/nvidia/driver, devRoot: /run/nvidia/driver}}",
			root:   "/run/nvidia/driver", dev: "/run/nvidia/driver", hook: installed, install: true, wantInitContainers: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := pluginFlags(t)
			for _, ds := range daemonSets(t, render(t, values(t, tc.values))) {
				spec := &ds.Spec.Template.Spec
				c := container(t, spec, "plugin", false)
				args := parsePluginArgs(t, flags, c.Args)
				get := func(name string) string { v, _ := args.value(flags, name); return v }
				if get("driver-root") != tc.root || get("dev-root") != tc.dev || get("nvidia-cdi-hook") != tc.hook {
					t.Errorf("--driver-root=%s --dev-root=%s --nvidia-cdi-hook=%s, want %s %s %s",
						get("driver-root"), get("dev-root"), get("nvidia-cdi-hook"), tc.root, tc.dev, tc.hook)
				}
				if v, set := args.set["nvml-library"]; v != tc.nvml || set != (tc.nvml != "") {
					t.Errorf("--nvml-library=%q (set %v), want %q", v, set, tc.nvml)
				}

				// The driver root, read-only at --container-driver-root.
				ctrRoot := get("container-driver-root")
				m, vol := mountFor(spec, c, ctrRoot)
				if m == nil || m.MountPath != ctrRoot || vol == nil || vol.HostPath == nil || path.Clean(vol.HostPath.Path) != tc.root || !m.ReadOnly {
					t.Fatalf("--container-driver-root=%s: mount %+v of volume %+v, want the host's %s read-only", ctrRoot, m, vol, tc.root)
				}
				if ctrRoot == "/" {
					t.Error("the driver root is mounted at the container's /")
				}
				if tc.nvml != "" {
					if m, _ := mountFor(spec, c, tc.nvml); m == nil || m.MountPath != ctrRoot {
						t.Errorf("--nvml-library=%s is not under the driver root's mount %s", tc.nvml, ctrRoot)
					}
				}

				// The dev root: under the driver root's mount, or at its own path.
				devDir := path.Join(tc.dev, "dev")
				dm, dvol := mountFor(spec, c, devDir)
				switch {
				case tc.wantDevMount && (dm == nil || dm.MountPath != devDir || dvol == nil || dvol.HostPath == nil || dvol.HostPath.Path != devDir):
					t.Errorf("%s: mount %+v of %+v, want the host's %s at the same path", devDir, dm, dvol, devDir)
				case !tc.wantDevMount && (tc.dev != tc.root || (dm != nil && dm.MountPath == devDir)):
					t.Errorf("dev root %s (driver root %s): want it read under the driver root's mount, not a mount %+v", tc.dev, tc.root, dm)
				}

				// nvidia-cdi-hook, through a mount of its host directory.
				ctrHook := get("container-nvidia-cdi-hook")
				hm, hvol := mountFor(spec, c, ctrHook)
				if path.Base(ctrHook) != "nvidia-cdi-hook" || hm == nil || hvol == nil || hvol.HostPath == nil ||
					path.Join(hvol.HostPath.Path, strings.TrimPrefix(ctrHook, hm.MountPath)) != tc.hook {
					t.Errorf("--container-nvidia-cdi-hook=%s: mount %+v of %+v does not show the host's %s", ctrHook, hm, hvol, tc.hook)
				}
				if len(spec.InitContainers) != tc.wantInitContainers {
					t.Errorf("%d init containers, want %d", len(spec.InitContainers), tc.wantInitContainers)
				}
				if !tc.install {
					for _, ic := range spec.InitContainers {
						if ic.Name == "install-nvidia-cdi-hook" {
							t.Error("the hook is installed though nvidiaCDIHook.install is false")
						}
					}
					continue
				}
				ic := container(t, spec, "install-nvidia-cdi-hook", true)
				if spec.InitContainers[0].Name != ic.Name {
					t.Errorf("init containers %s first, want the hook's", spec.InitContainers[0].Name)
				}
				want := []string{"facetctl", "install-cdi-hook", "--dir=" + path.Dir(tc.hook)}
				if fmt.Sprint(ic.Command) != fmt.Sprint(want) || ic.Image != c.Image {
					t.Errorf("init container %q from %s, want %q from the plugin's image %s", ic.Command, ic.Image, want, c.Image)
				}
				if m, vol := mountFor(spec, ic, tc.hook); m == nil || m.ReadOnly || vol == nil || vol.HostPath == nil || vol.HostPath.Path != m.MountPath || m.MountPath != path.Dir(tc.hook) {
					t.Errorf("init container cannot write %s on the host: mount %+v of %+v", tc.hook, m, vol)
				}
			}
		})
	}
}

// TestDriverRootMountPropagation: every container that mounts the driver
// root's host path does so with HostToContainer, the host's / included: the
// GPU Operator's driver container mounts its root after the plugin starts,
// and a private copy of / would pin every mount the host had then.
func TestDriverRootMountPropagation(t *testing.T) {
	cases := map[string]map[string]any{}
	for name, vals := range configurations(t) {
		cases[name] = vals
	}
	for name, v := range map[string]string{
		"host's / spelt //":            "kubeletPlugin: {driver: {root: //}}",
		"GPU Operator":                 "kubeletPlugin: {driver: {root: /run/nvidia/driver}}",
		"dev root is the driver root":  "kubeletPlugin: {driver: {root: /run/nvidia/driver, devRoot: /run/nvidia/driver}}",
		"no init containers, own hook": "kubeletPlugin: {nvidiaCDIHook: {install: false}, hamiCore: {enabled: false}}",
	} {
		cases[name] = values(t, v)
	}
	flags := pluginFlags(t)
	for name, vals := range cases {
		t.Run(name, func(t *testing.T) {
			for _, ds := range daemonSets(t, render(t, vals)) {
				spec := &ds.Spec.Template.Spec
				root, _ := parsePluginArgs(t, flags, container(t, spec, "plugin", false).Args).value(flags, "driver-root")
				rootVolumes := map[string]bool{}
				for _, v := range spec.Volumes {
					if v.HostPath != nil && path.Clean(v.HostPath.Path) == root {
						rootVolumes[v.Name] = true
					}
				}
				if len(rootVolumes) == 0 {
					t.Fatalf("%s: no hostPath volume of the driver root %s", ds.Name, root)
				}
				mounted := 0
				for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
					for _, m := range c.VolumeMounts {
						if !rootVolumes[m.Name] {
							continue
						}
						mounted++
						if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
							t.Errorf("%s: container %s mounts the driver root %s at %s with propagation %v, want HostToContainer",
								ds.Name, c.Name, root, m.MountPath, m.MountPropagation)
						}
					}
				}
				if mounted == 0 {
					t.Errorf("%s: no container mounts the driver root %s", ds.Name, root)
				}
			}
		})
	}
}
