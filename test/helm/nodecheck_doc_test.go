package helm

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeCheckDocPluginPod: docs/node-check.md's check "from the
// plugin's pod" names the paths the chart's plugin container has, with
// the chart's defaults: its --driver-root is the plugin's
// --container-driver-root, its dev root's dev/ and its nvidia-cdi-hook
// and libvgpu.so are mounted there from the host paths the plugin's
// flags name, and the container it names is the pod's first, whose args
// the page's `kubectl get pod` lists.
func TestNodeCheckDocPluginPod(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "node-check.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmd string
	for _, block := range strings.Split(string(doc), "```console\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.HasPrefix(block, "kubectl ") {
			cmd = strings.Join(strings.Fields(strings.ReplaceAll(block, "\\\n", " ")), " ")
		}
	}
	if cmd == "" {
		t.Fatal("docs/node-check.md has no kubectl exec command")
	}
	words := strings.Fields(cmd)
	args := map[string]string{}
	for i, w := range words {
		if strings.HasPrefix(w, "--") && i+1 < len(words) {
			args[w] = words[i+1]
		}
	}
	if !strings.Contains(cmd, " -c plugin -- facetctl node-check ") || !strings.HasPrefix(cmd, "kubectl -n facet-system exec ") {
		t.Errorf("%q: want kubectl -n facet-system exec <pod> -c plugin -- facetctl node-check", cmd)
	}

	flags := pluginFlags(t)
	ds := daemonSets(t, render(t, values(t, "")))[0]
	spec := &ds.Spec.Template.Spec
	if spec.Containers[0].Name != "plugin" {
		t.Errorf("the pod's first container is %q: the page's jsonpath {.spec.containers[0].args} lists another's", spec.Containers[0].Name)
	}
	c := container(t, spec, "plugin", false)
	p := parsePluginArgs(t, flags, c.Args)
	get := func(name string) string { v, _ := p.value(flags, name); return v }

	if args["--driver-root"] != get("container-driver-root") {
		t.Errorf("--driver-root %s, want the plugin's --container-driver-root %s", args["--driver-root"], get("container-driver-root"))
	}
	if args["--nvidia-cdi-hook"] != get("container-nvidia-cdi-hook") {
		t.Errorf("--nvidia-cdi-hook %s, want the plugin's --container-nvidia-cdi-hook %s", args["--nvidia-cdi-hook"], get("container-nvidia-cdi-hook"))
	}
	// Each path the check reads, and the host path it is mounted from.
	for _, tc := range []struct{ flag, inPod, host string }{
		{"--driver-root", args["--driver-root"], get("driver-root")},
		{"--dev-root", path.Join(args["--dev-root"], "dev"), path.Join(get("dev-root"), "dev")},
		{"--nvidia-cdi-hook", args["--nvidia-cdi-hook"], get("nvidia-cdi-hook")},
		{"--hami-library", args["--hami-library"], get("hami-library")},
	} {
		m, v := mountFor(spec, c, tc.inPod)
		if m == nil || v == nil || v.HostPath == nil {
			t.Errorf("%s: %s is not mounted in the plugin's container", tc.flag, tc.inPod)
			continue
		}
		if from := path.Join(v.HostPath.Path, strings.TrimPrefix(tc.inPod, m.MountPath)); from != path.Clean(tc.host) {
			t.Errorf("%s: %s in the pod is the host's %s, want %s", tc.flag, tc.inPod, from, tc.host)
		}
	}
}
