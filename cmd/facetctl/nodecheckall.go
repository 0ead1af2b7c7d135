package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// exitNoIdleGPU is node-check's exit status where --gpu idle finds every
// GPU busy: node-check-all reports such a node as skipped, not failed.
const exitNoIdleGPU = 4

// The outcomes of one node's check.
const (
	nodeOK      = "ok"
	nodeFailed  = "FAILED"
	nodeSkipped = "skipped"
)

// nodeResult is one node's outcome: its plugin pod, what ran there and
// what it printed (node-check's steps and report, stdout and stderr as
// they came), and why it failed or was skipped.
type nodeResult struct {
	node, pod, result, why string
	command                []string
	output                 []byte
}

// runNodeCheckAll is `facetctl node-check-all`: node-check in each GPU
// node's kubelet plugin pod, run there through the API server's pods/exec
// (as `kubectl exec`), with the arguments the pod's own plugin flags give
// (nodeCheckArgsFor), on an idle GPU of the node. It is what the chart's
// `helm test` runs (templates/tests/node-check.yaml). It fails when a
// node fails its check, or has no Ready plugin pod; a node whose GPUs all
// hold claims (or MIG instances) is skipped, and the summary says so.
func runNodeCheckAll(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("node-check-all", flag.ContinueOnError)
	kube := kubeFlag(fs)
	namespace := fs.String("namespace", "facet-system", "namespace of the kubelet plugin's pods (the chart's release namespace)")
	selector := fs.String("selector", "app.kubernetes.io/name=facet,app.kubernetes.io/component=kubelet-plugin", "label selector of the kubelet plugin's pods; add app.kubernetes.io/instance=<release> where several releases share the namespace")
	container := fs.String("container", "plugin", "the plugin's container in those pods, whose args the check copies and in which it runs")
	seconds := fs.Float64("seconds", 0, "node-check's --seconds: how long the compute kernel runs per claim; 0 (the default) checks memory only")
	shareMemory := fs.String("share-memory", "", "node-check's --share-memory (default: node-check's)")
	shareCores := fs.String("share-cores", "", "node-check's --share-cores (default: node-check's)")
	parallel := fs.Int("parallel", 4, "how many nodes are checked at once")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long one node's check may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *parallel < 1 {
		return fmt.Errorf("--parallel %d: want at least 1", *parallel)
	}
	extra := []string{fmt.Sprintf("--seconds=%g", *seconds)}
	if *shareMemory != "" {
		extra = append(extra, "--share-memory="+*shareMemory)
	}
	if *shareCores != "" {
		extra = append(extra, "--share-cores="+*shareCores)
	}
	cfg, err := kube.Config()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	pods, err := client.CoreV1().Pods(*namespace).List(ctx, metav1.ListOptions{LabelSelector: *selector})
	if err != nil {
		return fmt.Errorf("list the kubelet plugin's pods (%s in %s): %w", *selector, *namespace, err)
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no pod matches %s in namespace %s: no kubelet plugin to check (--namespace, --selector)", *selector, *namespace)
	}
	picked, results := pickPluginPods(pods.Items)
	var mu sync.Mutex
	report := func(r *nodeResult) {
		mu.Lock()
		defer mu.Unlock()
		writeNodeResult(stdout, r)
		results = append(results, r)
	}
	for _, r := range results {
		writeNodeResult(stdout, r)
	}
	g := new(errgroup.Group)
	g.SetLimit(*parallel)
	for _, pod := range picked {
		g.Go(func() error {
			r := &nodeResult{node: pod.Spec.NodeName, pod: pod.Name}
			var err error
			c := containerNamed(pod, *container)
			if c == nil {
				r.result, r.why = nodeFailed, fmt.Sprintf("pod %s has no container %q (--container)", pod.Name, *container)
				report(r)
				return nil
			}
			if r.command, err = nodeCheckArgsFor(c, extra); err != nil {
				r.result, r.why = nodeFailed, fmt.Sprintf("pod %s: %v", pod.Name, err)
				report(r)
				return nil
			}
			r.command = append([]string{"facetctl", "node-check"}, r.command...)
			nctx, cancel := context.WithTimeout(ctx, *timeout)
			defer cancel()
			r.output, err = execIn(nctx, cfg, client, pod, *container, r.command)
			var exit utilexec.CodeExitError
			switch {
			case err == nil:
				r.result = nodeOK
			case errors.As(err, &exit) && exit.Code == exitNoIdleGPU:
				r.result, r.why = nodeSkipped, "no idle GPU: every GPU holds a claim or has MIG mode on"
			case errors.As(err, &exit):
				r.result, r.why = nodeFailed, fmt.Sprintf("node-check exited with status %d", exit.Code)
			default:
				r.result, r.why = nodeFailed, fmt.Sprintf("could not run node-check in pod %s: %v", pod.Name, err)
			}
			report(r)
			return nil
		})
	}
	_ = g.Wait()
	return summarize(stdout, results)
}

// pickPluginPods chooses the pod to check on each node: the newest Ready
// one (during a rolling update a node has two). A node without a Ready
// plugin pod, and a pod that no node runs yet, fail without a check: such
// a node publishes what its plugin cannot serve, or nothing.
func pickPluginPods(pods []corev1.Pod) (picked []*corev1.Pod, failed []*nodeResult) {
	byNode := map[string][]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			failed = append(failed, &nodeResult{node: "(none)", pod: p.Name, result: nodeFailed, why: fmt.Sprintf("pod %s is not scheduled to a node (phase %s)", p.Name, p.Status.Phase)})
			continue
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		var best *corev1.Pod
		var notReady []string
		for _, p := range byNode[n] {
			if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || !podIsReady(p) {
				notReady = append(notReady, fmt.Sprintf("%s (phase %s%s)", p.Name, p.Status.Phase, waitingReasons(p)))
				continue
			}
			if best == nil || p.CreationTimestamp.After(best.CreationTimestamp.Time) {
				best = p
			}
		}
		if best == nil {
			failed = append(failed, &nodeResult{node: n, pod: byNode[n][0].Name, result: nodeFailed,
				why: "no Ready kubelet plugin pod: " + strings.Join(notReady, ", ")})
			continue
		}
		picked = append(picked, best)
	}
	return picked, failed
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitingReasons lists why p's containers wait or ended (", plugin:
// CrashLoopBackOff"), for a pod that is not Ready.
func waitingReasons(p *corev1.Pod) string {
	var b strings.Builder
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		switch {
		case s.State.Waiting != nil:
			fmt.Fprintf(&b, ", %s: %s", s.Name, s.State.Waiting.Reason)
		case s.State.Terminated != nil && s.State.Terminated.ExitCode != 0:
			fmt.Fprintf(&b, ", %s: %s", s.Name, s.State.Terminated.Reason)
		}
	}
	return b.String()
}

func containerNamed(p *corev1.Pod, name string) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == name {
			return &p.Spec.Containers[i]
		}
	}
	return nil
}

// pluginFlagValues reads the plugin's command line as flag name to value:
// "--name=value", "-name=value", and "--name value" where the next word
// is not a flag; a bare "--name" is "true".
func pluginFlagValues(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			value = "true"
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				value = args[i+1]
				i++
			}
		}
		out[name] = value
	}
	return out
}

// nodeCheckArgsFor returns node-check's arguments in the plugin container
// c, from the plugin's own flags, with the paths as that container sees
// them (docs/node-check.md, "From the plugin's pod"), then extra:
//   - --driver-root: the plugin's --container-driver-root (its mount of
//     the driver root), else its --driver-root;
//   - --dev-root: the same where the plugin's --dev-root is its
//     --driver-root (or unset), else the plugin's (mounted at its host
//     path);
//   - --nvidia-cdi-hook: the plugin's --container-nvidia-cdi-hook, else its
//     --nvidia-cdi-hook;
//   - --nvml-library, --hami-library, --slots, --gpu-slots, --machine and
//     --state-dir as the plugin's; --mps=false where its --mps is off;
//   - --gpu idle: the lowest-indexed GPU no claim of the plugin's
//     checkpoint holds.
//
// A plugin without --hami-library gets none: its vGPU shares cannot be
// prepared, and the check says so.
func nodeCheckArgsFor(c *corev1.Container, extra []string) ([]string, error) {
	words := append(append([]string{}, c.Command...), c.Args...)
	if len(words) == 0 {
		return nil, fmt.Errorf("container %s has no command line to read the plugin's flags from", c.Name)
	}
	f := pluginFlagValues(words[1:])
	get := func(name, def string) string {
		if v, ok := f[name]; ok && v != "" {
			return v
		}
		return def
	}
	hostRoot := get("driver-root", "/")
	root := get("container-driver-root", hostRoot)
	devRoot := get("dev-root", hostRoot)
	if devRoot == hostRoot {
		devRoot = root
	}
	out := []string{
		"--gpu=idle", "--state-dir=" + get("state-dir", "/var/lib/facet"),
		"--driver-root=" + root, "--dev-root=" + devRoot,
		"--nvidia-cdi-hook=" + get("container-nvidia-cdi-hook", get("nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook")),
		"--hami-library=" + f["hami-library"],
	}
	for _, name := range []string{"nvml-library", "slots", "gpu-slots", "machine"} {
		if v := f[name]; v != "" {
			out = append(out, "--"+name+"="+v)
		}
	}
	if f["mps"] == "off" {
		out = append(out, "--mps=false")
	}
	return append(out, extra...), nil
}

// execIn runs command in the container of pod through the API server
// (pods/exec, WebSocket with SPDY as the fallback, as kubectl does) and
// returns its stdout and stderr, interleaved as they came. A non-zero
// exit status is a utilexec.CodeExitError.
func execIn(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, pod *corev1.Pod, container string, command []string) ([]byte, error) {
	req := client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, err
	}
	out := &lockedBuffer{}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: out, Stderr: out})
	return out.Bytes(), err
}

// lockedBuffer takes the exec's stdout and stderr, written from two
// goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Bytes()
}

// writeNodeResult prints one node's check: what ran, its output, and the
// outcome.
func writeNodeResult(w io.Writer, r *nodeResult) {
	fmt.Fprintf(w, "=== node %s, pod %s", r.node, r.pod)
	if len(r.command) > 0 {
		fmt.Fprintf(w, ": %s", strings.Join(r.command, " "))
	}
	fmt.Fprintln(w)
	if len(r.output) > 0 {
		_, _ = w.Write(r.output)
		if r.output[len(r.output)-1] != '\n' {
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "=== node %s: %s", r.node, r.result)
	if r.why != "" {
		fmt.Fprintf(w, ": %s", r.why)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
}

// summarize prints a line per node and returns an error naming the nodes
// that failed, if any.
func summarize(w io.Writer, results []*nodeResult) error {
	sort.Slice(results, func(i, j int) bool { return results[i].node < results[j].node })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPOD\tRESULT")
	var failed []string
	checked := 0
	for _, r := range results {
		line := r.result
		if r.why != "" && r.result != nodeOK {
			line += ": " + r.why
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.node, r.pod, line)
		switch r.result {
		case nodeFailed:
			failed = append(failed, r.node)
		case nodeOK:
			checked++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d nodes do not deliver what they publish, or could not be checked: %s (their reports are above)", len(failed), len(results), strings.Join(failed, ", "))
	}
	fmt.Fprintf(w, "\n%d of %d nodes checked: each delivers what it publishes; %d skipped (no idle GPU)\n", checked, len(results), len(results)-checked)
	return nil
}
