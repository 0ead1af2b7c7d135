package scale

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Ports are the loopback ports of one scale cluster. They differ from
// hack/cluster/up.sh's defaults so that a scale run and the e2e node can
// share the machine.
type Ports struct {
	Etcd, EtcdPeer, APIServer, Scheduler int
}

// DefaultPorts are the scale harness's ports.
var DefaultPorts = Ports{Etcd: 32379, EtcdPeer: 32380, APIServer: 36443, Scheduler: 30259}

// Config says which binaries run, where, and how.
type Config struct {
	// BinDir holds etcd, kube-apiserver and kube-scheduler
	// (hack/build-tools.sh).
	BinDir string
	// RunDir holds the state and logs of the run; it is wiped on Start.
	RunDir string
	// FeatureGates for the apiserver and scheduler; "" is the version's
	// defaults.
	FeatureGates string
	Ports        Ports
}

// Cluster is etcd and a kube-apiserver on 127.0.0.1, and, once started,
// a kube-scheduler. Authentication is a static token in system:masters and
// the apiserver's self-signed serving certificate: this is a throw-away
// benchmark cluster, never reachable from outside the machine.
type Cluster struct {
	cfg        Config
	token      string
	procs      map[string]*exec.Cmd
	kubeconfig string
	Client     kubernetes.Interface
	Rest       *rest.Config
}

// Start starts etcd and the kube-apiserver and waits for /readyz.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := os.RemoveAll(cfg.RunDir); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "etcd", "pki"} {
		if err := os.MkdirAll(filepath.Join(cfg.RunDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	for _, p := range []int{cfg.Ports.Etcd, cfg.Ports.EtcdPeer, cfg.Ports.APIServer, cfg.Ports.Scheduler} {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			return nil, fmt.Errorf("port %d is in use (another scale run?): %w", p, err)
		} else {
			_ = l.Close()
		}
	}
	c := &Cluster{cfg: cfg, procs: map[string]*exec.Cmd{}}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	c.token = hex.EncodeToString(tok)
	pki := filepath.Join(cfg.RunDir, "pki")
	if err := os.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(c.token+`,facet-scale-admin,facet-scale-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := writeServiceAccountKey(pki); err != nil {
		return nil, err
	}
	api := fmt.Sprintf("https://127.0.0.1:%d", cfg.Ports.APIServer)
	c.kubeconfig = filepath.Join(cfg.RunDir, "admin.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: scale
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: %q}
contexts:
- name: scale
  context: {cluster: scale, user: admin}
current-context: scale
`, api, c.token)
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		return nil, err
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", cfg.Ports.Etcd)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", cfg.Ports.EtcdPeer)
	if err := c.start("etcd", "--name=scale", "--data-dir="+filepath.Join(cfg.RunDir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=scale="+peerURL, "--unsafe-no-fsync", "--log-level=warn",
		"--quota-backend-bytes=8589934592"); err != nil {
		return nil, err
	}
	if err := c.wait(ctx, "etcd", func() error { return get(etcdURL+"/health", "") }); err != nil {
		c.Stop()
		return nil, err
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cfg.Ports.APIServer),
		"--cert-dir=" + filepath.Join(pki, "serving"),
		"--endpoint-reconciler-type=none",
		"--authorization-mode=RBAC",
		"--token-auth-file=" + filepath.Join(pki, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--v=0",
	}
	if cfg.FeatureGates != "" {
		args = append(args, "--feature-gates="+cfg.FeatureGates)
	}
	if err := c.start("kube-apiserver", args...); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.wait(ctx, "kube-apiserver", func() error { return get(api+"/readyz", c.token) }); err != nil {
		c.Stop()
		return nil, err
	}
	c.Rest = &rest.Config{
		Host: api, BearerToken: c.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             5000, Burst: 5000,
		ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"},
	}
	cs, err := kubernetes.NewForConfig(c.Rest)
	if err != nil {
		c.Stop()
		return nil, err
	}
	c.Client = cs
	return c, nil
}

// StartScheduler starts kube-scheduler with the client limits qps and
// burst (0: the scheduler's defaults, 50 and 100) and waits until it is
// ready, that is until its informers have synced.
func (c *Cluster) StartScheduler(ctx context.Context, qps, burst int) error {
	args := []string{
		"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.cfg.Ports.Scheduler),
		"--leader-elect=false",
		"--v=0",
	}
	if qps > 0 {
		args = append(args, fmt.Sprintf("--kube-api-qps=%d", qps), fmt.Sprintf("--kube-api-burst=%d", burst))
	}
	if c.cfg.FeatureGates != "" {
		args = append(args, "--feature-gates="+c.cfg.FeatureGates)
	}
	if err := c.start("kube-scheduler", args...); err != nil {
		return err
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", c.cfg.Ports.Scheduler)
	return c.wait(ctx, "kube-scheduler", func() error { return get(url, "") })
}

// SchedulerMetrics returns the scheduler's /metrics text.
func (c *Cluster) SchedulerMetrics() (string, error) {
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", c.cfg.Ports.Scheduler)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := insecure.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	var b []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			break
		}
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

// Log is the path of a component's log.
func (c *Cluster) Log(name string) string { return filepath.Join(c.cfg.RunDir, "logs", name+".log") }

// Stop stops every component, the scheduler first, and waits for them.
func (c *Cluster) Stop() {
	for _, name := range []string{"kube-scheduler", "kube-apiserver", "etcd"} {
		cmd := c.procs[name]
		if cmd == nil {
			continue
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		delete(c.procs, name)
	}
}

func (c *Cluster) start(name string, args ...string) error {
	log, err := os.Create(c.Log(name))
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.cfg.BinDir, name), args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, and killed with the harness.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	_ = log.Close()
	c.procs[name] = cmd
	return nil
}

func (c *Cluster) wait(ctx context.Context, name string, ready func() error) error {
	deadline := time.Now().Add(120 * time.Second)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if cmd := c.procs[name]; cmd.ProcessState != nil || cmd.Process.Signal(syscall.Signal(0)) != nil {
			return fmt.Errorf("%s exited; see %s", name, c.Log(name))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready in 120s (%v); see %s", name, err, c.Log(name))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var insecure = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // loopback throw-away cluster with a self-signed certificate
}

func get(url, token string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecure.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// writeServiceAccountKey writes sa.key and sa.pub, which the apiserver
// insists on even though no pod here gets a token.
func writeServiceAccountKey(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}
