package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/nodecleanup"
)

// errNodeCleanupFailed: a node's cleanup refused or failed; its output
// says why.
var errNodeCleanupFailed = errors.New("node cleanup failed")

// nodeCleanupFlags are node-cleanup's flags that the pod of --node runs
// it with too.
type nodeCleanupFlags struct {
	paths               nodecleanup.Paths
	force               bool
	mig                 string
	machine, driverRoot string
	nvmlLib             string
	hostRoot            string
	node, image, ns     string
	pullPolicy          string
	timeout             time.Duration
	forwarded           []string
}

// runNodeCleanup is `facetctl node-cleanup`: on a node (as root, or in a
// pod with the host's / at --host-root), nodecleanup.Run; with --node,
// from anywhere kubectl works, that same command in a pod of its own on
// each named node, which it waits for, prints the output of and deletes.
func runNodeCleanup(args []string, stdout io.Writer) error {
	f, kube, err := parseNodeCleanupFlags(args)
	if err != nil {
		return err
	}
	if f.node == "" {
		return cleanHere(f, stdout)
	}
	if f.image == "" {
		return errors.New("--node needs --image, Facet's image, for the pods that clean the nodes")
	}
	client, err := kube.Client()
	if err != nil {
		return err
	}
	var failed []string
	for _, node := range strings.Split(f.node, ",") {
		if node = strings.TrimSpace(node); node == "" {
			continue
		}
		fmt.Fprintf(stdout, "=== node %s\n", node)
		if err := cleanOnNode(context.Background(), client, f, node, stdout); err != nil {
			fmt.Fprintf(stdout, "=== node %s: FAILED: %v\n\n", node, err)
			failed = append(failed, node)
			continue
		}
		fmt.Fprintf(stdout, "=== node %s: done\n\n", node)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w on %s (see above)", errNodeCleanupFailed, strings.Join(failed, ", "))
	}
	return nil
}

// parseNodeCleanupFlags parses node-cleanup's command line; the flags
// that configure the cleanup itself are kept in forwarded, for the pods
// of --node.
func parseNodeCleanupFlags(args []string) (*nodeCleanupFlags, *daemon.Kube, error) {
	fs := flag.NewFlagSet("node-cleanup", flag.ContinueOnError)
	f := &nodeCleanupFlags{}
	d := nodecleanup.ChartDefaults
	// The flags that configure the cleanup itself, forwarded to the pod.
	fs.StringVar(&f.paths.StateDir, "state-dir", d.StateDir, "the chart's kubeletPlugin.stateDir (checkpoint, HAMi-core state, MIG layout record)")
	fs.StringVar(&f.paths.CDIDir, "cdi-dir", d.CDIDir, "the chart's kubeletPlugin.cdiDir: Facet's CDI specs (gpu.facet.dev-*) are removed, no others")
	fs.StringVar(&f.paths.KubeletDir, "kubelet-dir", d.KubeletDir, "the chart's kubeletPlugin.kubeletDir: the plugin's sockets in plugins/gpu.facet.dev and plugins_registry")
	fs.StringVar(&f.paths.MPSDir, "mps-dir", d.MPSDir, "the chart's kubeletPlugin.mps.dir")
	fs.StringVar(&f.paths.CDIHookDir, "nvidia-cdi-hook-dir", d.CDIHookDir, "the chart's kubeletPlugin.nvidiaCDIHook.hostDir; empty where nvidiaCDIHook.install was false")
	fs.StringVar(&f.paths.HAMiCoreDir, "hami-core-dir", d.HAMiCoreDir, "the chart's kubeletPlugin.hamiCore.hostDir; empty where hamiCore.install was false (the library is then yours)")
	fs.BoolVar(&f.force, "force", false, "remove Facet's files even where its checkpoint records prepared claims (their running containers keep their devices; a restarted one cannot start)")
	fs.StringVar(&f.mig, "mig-instances", "", "what to do with the MIG instances Facet carved for its MIG layouts: keep (leave them on the GPUs) or destroy (exactly those Facet recorded; MIG mode stays on); required only where there are such instances")
	fs.StringVar(&f.machine, "machine", "", "a simulated node's machine file, for --mig-instances=destroy (its NVML state is <state-dir>/simulated-nvml.json)")
	fs.StringVar(&f.driverRoot, "driver-root", "/", "with --mig-instances=destroy: the host path of the NVIDIA driver (the chart's kubeletPlugin.driver.root), whose NVML destroys the instances")
	fs.StringVar(&f.nvmlLib, "nvml-library", "", "with --mig-instances=destroy: the host path of libnvidia-ml.so.1 (default: found in --driver-root)")
	forwarded := map[string]bool{}
	fs.VisitAll(func(fl *flag.Flag) { forwarded[fl.Name] = true })
	// The flags of where and how it runs.
	fs.StringVar(&f.hostRoot, "host-root", "/", "the host's / as this process sees it (the pod of --node mounts it at /host); the paths are under it")
	fs.StringVar(&f.node, "node", "", "run it on these nodes (comma-separated names) in a pod each, through the API server, instead of here")
	fs.StringVar(&f.image, "image", "", "with --node: Facet's image (the chart's image.repository:tag), whose facetctl the pods run")
	fs.StringVar(&f.pullPolicy, "image-pull-policy", string(corev1.PullIfNotPresent), "with --node: the pods' imagePullPolicy")
	fs.StringVar(&f.ns, "namespace", "facet-system", "with --node: the namespace of the pods (they are privileged, or root with DAC_OVERRIDE and FOWNER: the namespace's Pod Security must admit them, as it admits the chart's plugin)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "with --node: how long each node's pod may take, from its creation")
	kube := kubeFlag(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) {
		if forwarded[fl.Name] {
			f.forwarded = append(f.forwarded, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return f, kube, nil
}

// cleanHere is nodecleanup.Run on this host.
func cleanHere(f *nodeCleanupFlags, stdout io.Writer) error {
	o := nodecleanup.Options{Paths: f.paths, HostRoot: f.hostRoot, Force: f.force, MIG: nodecleanup.MIGAction(f.mig), Log: stdout}
	o.OpenMIG = func() (nodecleanup.MIG, func(), error) {
		var lib *nvmlgpu.Library
		var err error
		if f.machine != "" {
			lib, err = sim.OpenMachine(f.machine, sim.WithStateFile(filepath.Join(f.hostRoot, f.paths.StateDir, "simulated-nvml.json")))
		} else {
			lib, err = nvmlgpu.OpenDriver(filepath.Join(f.hostRoot, f.driverRoot), f.nvmlLib)
		}
		if err != nil {
			return nil, nil, err
		}
		return lib, func() { lib.Close() }, nil
	}
	res, err := nodecleanup.Run(o)
	if err != nil {
		return err
	}
	switch {
	case len(res.Kept) > 0:
		fmt.Fprintf(stdout, "removed %d paths; kept %d directories that hold files Facet does not write (listed above)\n", len(res.Removed), len(res.Kept))
	case len(res.Removed) == 0:
		fmt.Fprintln(stdout, "no Facet file on this node")
	default:
		fmt.Fprintf(stdout, "removed %d paths: no Facet file is left on this node\n", len(res.Removed))
	}
	return nil
}

// cleanupPod is the pod that runs node-cleanup on node: root, the host's /
// at /host, tolerating every taint (a GPU node's included), no API token,
// in the host's network: it needs no network, and a node being taken out
// of service may have lost its pod network already.
// It needs root's DAC_OVERRIDE and FOWNER (files of MPS's and tenants'
// users), and to destroy MIG instances on a real GPU, privileged (the
// GPUs' device nodes).
func cleanupPod(f *nodeCleanupFlags, node string) *corev1.Pod {
	sc := &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](0), RunAsGroup: ptr.To[int64](0),
		AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"DAC_OVERRIDE", "FOWNER"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if f.mig == string(nodecleanup.MIGDestroy) && f.machine == "" {
		sc = &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0), RunAsGroup: ptr.To[int64](0)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "facet-node-cleanup-",
			Namespace:    f.ns,
			Labels:       map[string]string{"app.kubernetes.io/name": "facet", "app.kubernetes.io/component": "node-cleanup"},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:            "node-cleanup",
				Image:           f.image,
				ImagePullPolicy: corev1.PullPolicy(f.pullPolicy),
				Command:         append([]string{"facetctl", "node-cleanup", "--host-root=/host"}, f.forwarded...),
				SecurityContext: sc,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "host", MountPath: "/host"}},
			}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: ptr.To(corev1.HostPathDirectory)}}}},
		},
	}
}

// cleanOnNode runs the cleanup pod on node, prints its output, and deletes
// it; an error says why the cleanup failed (its output above says more).
func cleanOnNode(ctx context.Context, client kubernetes.Interface, f *nodeCleanupFlags, node string, stdout io.Writer) error {
	pods := client.CoreV1().Pods(f.ns)
	pod, err := pods.Create(ctx, cleanupPod(f, node), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create the cleanup pod: %w", err)
	}
	defer func() {
		// Its output is printed; nothing of it need stay.
		_ = pods.Delete(context.WithoutCancel(ctx), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()
	var last *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, time.Second, f.timeout, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if logs, lerr := pods.GetLogs(pod.Name, &corev1.PodLogOptions{Container: "node-cleanup"}).DoRaw(ctx); lerr == nil {
		_, _ = stdout.Write(logs)
	}
	if err != nil {
		why := ""
		if last != nil {
			why = fmt.Sprintf(" (phase %s%s)", last.Status.Phase, waitingReasons(last))
		}
		return fmt.Errorf("pod %s/%s did not finish within %s%s: %w", f.ns, pod.Name, f.timeout, why, err)
	}
	if last.Status.Phase != corev1.PodSucceeded {
		return fmt.Errorf("pod %s/%s failed%s", f.ns, pod.Name, waitingReasons(last))
	}
	return nil
}
