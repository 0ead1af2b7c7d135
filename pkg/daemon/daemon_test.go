package daemon

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

// TestKubeFlags: the flags the chart passes keep their names and the
// plugin's defaults, and reach the client's configuration.
func TestKubeFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(file, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	var k Kube
	fs := flag.NewFlagSet("d", flag.ContinueOnError)
	k.AddFlags(fs)
	k.AddRateFlags(fs, 1000, 1000)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if k != (Kube{QPS: 1000, Burst: 1000}) {
		t.Errorf("defaults: got %+v", k)
	}
	if err := fs.Parse([]string{"--kubeconfig", file, "--kube-api-qps=7.5", "--kube-api-burst=9"}); err != nil {
		t.Fatal(err)
	}
	k.UserAgent = "facet-test"
	cfg, err := k.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://api.example:6443" || cfg.QPS != 7.5 || cfg.Burst != 9 || cfg.UserAgent != "facet-test" {
		t.Errorf("got host %q, QPS %v, burst %d, user agent %q", cfg.Host, cfg.QPS, cfg.Burst, cfg.UserAgent)
	}
	if _, err := k.Client(); err != nil {
		t.Errorf("client: %v", err)
	}
	if client, dyn, err := k.Clients(); err != nil || client == nil || dyn == nil {
		t.Errorf("clients: got %v, %v, %v", client, dyn, err)
	}
}

// TestKubeErrors: a client that cannot be configured says which source
// it tried.
func TestKubeErrors(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "absent")
	if _, err := (Kube{Kubeconfig: absent}).Client(); err == nil || !strings.HasPrefix(err.Error(), "API client: --kubeconfig "+absent+": ") {
		t.Errorf("absent kubeconfig: got %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := (Kube{}).Client(); err == nil || !strings.HasPrefix(err.Error(), "API client: no --kubeconfig, and ") {
		t.Errorf("no kubeconfig outside a cluster: got %v", err)
	}
	if _, _, err := (Kube{Kubeconfig: absent}).Clients(); err == nil || !strings.HasPrefix(err.Error(), "API client: --kubeconfig "+absent+": ") {
		t.Errorf("clients, absent kubeconfig: got %v", err)
	}
}

// TestLogFlags: every daemon takes klog's -v, which the chart passes.
func TestLogFlags(t *testing.T) {
	fs := flag.NewFlagSet("d", flag.ContinueOnError)
	AddLogFlags(fs)
	for _, name := range []string{"v", "vmodule", "logtostderr"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no -%s", name)
		}
	}
}

// TestRun: run gets a live context and its error comes back for the exit.
func TestRun(t *testing.T) {
	boom := errors.New("boom")
	err := runLogged("facet-test", func(ctx context.Context) error {
		if ctx.Err() != nil {
			t.Errorf("context already done: %v", ctx.Err())
		}
		return boom
	})
	if err != boom {
		t.Errorf("got %v, want %v", err, boom)
	}
	if err := runLogged("facet-test", func(context.Context) error { return nil }); err != nil {
		t.Errorf("got %v", err)
	}
}

// testFlags is a daemon's command line, for TestMainOf.
type testFlags struct{ name string }

func (f *testFlags) AddFlags(fs *flag.FlagSet) { fs.StringVar(&f.name, "name", "none", "a name") }

// TestMainOf: run gets the flags as the command line set them, beside
// klog's.
func TestMainOf(t *testing.T) {
	args := os.Args
	defer func() { os.Args = args }()
	os.Args = []string{"facet-test", "--name=gpu-0", "-v=0"}
	var got *testFlags
	MainOf("facet-test", func(_ context.Context, f testFlags) error {
		got = &f
		return nil
	})
	if got == nil || got.name != "gpu-0" {
		t.Errorf("run got %+v, want name gpu-0", got)
	}
}
