// Package helmtest is what the chart's tests share: the local node of
// hack/e2e.sh (found through KUBECONFIG, FACET_RUN_DIR and FACET_BIN_DIR,
// as test/e2e finds it), kubectl against it, and chart values from YAML.
// It belongs to the test/helm module, which ships nothing.
package helmtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// Live is the local node's API server, through client-go and kubectl.
type Live struct {
	Kubeconfig, Kubectl, RunDir string
	Config                      *rest.Config
	Client                      kubernetes.Interface
}

// FacetBinary is the path of Facet's command name as `make build` leaves
// it, in bin/ at the repository's root (repo): make test builds it before
// the rounds, and hack/e2e.sh's chart stage needs it, so that no test
// builds a binary under its own timeout (a build under the rounds' load
// can take minutes). It fails t when the binary is not there.
func FacetBinary(t testing.TB, repo, name string) string {
	t.Helper()
	bin := filepath.Join(repo, "bin", name)
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s: not built (run `make build` first): %v", bin, err)
	}
	return bin
}

// LiveCluster finds the local node, or skips t where the environment does
// not name one.
func LiveCluster(t *testing.T) *Live {
	t.Helper()
	l := &Live{Kubeconfig: os.Getenv("KUBECONFIG"), RunDir: os.Getenv("FACET_RUN_DIR")}
	if l.Kubeconfig == "" || l.RunDir == "" || os.Getenv("FACET_BIN_DIR") == "" {
		t.Skip("needs the local node of hack/e2e.sh (KUBECONFIG, FACET_RUN_DIR, FACET_BIN_DIR)")
	}
	l.Kubectl = filepath.Join(os.Getenv("FACET_BIN_DIR"), "kubectl")
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	l.Config = cfg
	l.Client = kubernetes.NewForConfigOrDie(cfg)
	return l
}

// nodePorts are the ports hack/cluster/up.sh gives a node before its
// FACET_PORT_OFFSET: etcd, the API server, the kubelet, the
// controller-manager and the scheduler, hack/cluster/add-node.sh's nodes
// (the kubelet's and the kubelet plugin's ports plus 100 per node, up to
// 9), and hack/kueue.sh's webhook and health ports.
var nodePorts = func() []int {
	ports := []int{2379, 2380, 6443, 10257, 10259, 9445, 9446}
	for i := 0; i <= 9; i++ {
		ports = append(ports, 10248+100*i, 10250+100*i, 10280+100*i)
	}
	return ports
}()

// portOffset is the node's FACET_PORT_OFFSET.
func portOffset() int {
	off, _ := strconv.Atoi(os.Getenv("FACET_PORT_OFFSET"))
	return off
}

// APIServerPort is the local node's API server port: 6443 plus its
// FACET_PORT_OFFSET.
func (l *Live) APIServerPort() int { return 6443 + portOffset() }

// Port is the local node's port for a host-network server of a chart's
// pod whose default port is def: def plus the node's FACET_PORT_OFFSET
// (hack/cluster/up.sh), so that the servers of two nodes side by side
// (make e2e's rounds, at offsets 1000 apart) do not meet. A def that
// differs from one of nodePorts by a multiple of 1000 would meet another
// round's node on some offset (9443 is the API server of the round at
// offset 3000), so Port fails the test on one: choose another default.
func (l *Live) Port(t testing.TB, def int) int {
	t.Helper()
	if p, ok := clashingNodePort(def); ok {
		t.Fatalf("helmtest: port %d meets node port %d of the round at offset %d: pick a default whose last three digits no node port has", def, p, def-p)
	}
	return def + portOffset()
}

// clashingNodePort returns the node port that def meets on some offset.
func clashingNodePort(def int) (int, bool) {
	for _, p := range nodePorts {
		if (def-p)%1000 == 0 {
			return p, true
		}
	}
	return 0, false
}

// Run runs kubectl with stdin; the output is stdout and stderr together.
func (l *Live) Run(stdin string, args ...string) (string, error) {
	cmd := exec.Command(l.Kubectl, append([]string{"--kubeconfig", l.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

// Must is Run, failing t on an error.
func (l *Live) Must(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := l.Run(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Namespace creates a namespace that is deleted after the test.
func (l *Live) Namespace(t *testing.T, name string) {
	t.Helper()
	l.Must(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+name+"}\n", "apply", "-f", "-")
	t.Cleanup(func() { _, _ = l.Run("", "delete", "namespace", name, "--wait=true", "--timeout=120s") })
}

// LoadChart loads the chart at dir.
func LoadChart(t testing.TB, dir string) *chart.Chart {
	t.Helper()
	c, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("load chart %s: %v", dir, err)
	}
	return c
}

// Values parses chart values from YAML.
func Values(t testing.TB, y string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &v); err != nil {
		t.Fatalf("values %q: %v", y, err)
	}
	return v
}
