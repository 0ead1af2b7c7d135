// Command facet-kubeletplugin is Facet's DRA kubelet plugin, run as a
// DaemonSet on every GPU node (or by hand against a simulated machine).
// It parses its flags and runs package plugin; its build tags choose the
// simulator (facetsim) and the test failpoints (facet_failpoints).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/nodeplugin"
	"github.com/facet-gpu/facet/pkg/node/probes"
)

// flags is the command line: the plugin's configuration, and --probe,
// which asks a running plugin instead.
type flags struct {
	nodeplugin.Config
	probe string
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		// The flag set has printed the error and the usage.
		os.Exit(2)
	}

	if f.probe != "" {
		if err := probes.Ask(context.Background(), f.HealthAddr, f.probe, 5*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}

	daemon.Run("facet-kubeletplugin", func(ctx context.Context) error { return run(ctx, f) })
}

// run runs the plugin of f with this build's simulator and failpoints.
func run(ctx context.Context, f flags) error {
	c := f.Config
	c.OpenMachine, c.BindSimulatedProcDriver, c.Failpoint = openMachine, bindSimulatedProcDriver, failpoint(ctx)
	return nodeplugin.Run(ctx, c)
}

// parseFlags parses the command line. Errors (and -h) are printed with the
// usage by the flag set; flag.ErrHelp means -h.
func parseFlags(args []string) (flags, error) {
	var f flags
	var kube daemon.Kube
	fs := flag.NewFlagSet("facet-kubeletplugin", flag.ContinueOnError)
	fs.StringVar(&f.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name: the pool's name (env NODE_NAME)")
	kube.AddFlags(fs)
	fs.StringVar(&f.Machine, "machine", "", "simulate the node described by this machine file instead of loading NVML (builds with -tags facetsim only)")
	fs.StringVar(&f.NVMLLibrary, "nvml-library", "", "path of libnvidia-ml.so.1 as the plugin sees it (default: found in --container-driver-root as nvcdi finds the driver's libraries)")
	fs.StringVar(&f.DriverRoot, "driver-root", "/", "host path of the NVIDIA driver's files: / for a driver in the host's root, /run/nvidia/driver with the GPU Operator, or a prefix such as /usr/local/nvidia")
	fs.StringVar(&f.ContainerDriverRoot, "container-driver-root", "", "where the plugin sees --driver-root, a mount of it in its container (default: --driver-root itself); the CDI specs get host paths")
	fs.StringVar(&f.DevRoot, "dev-root", "", "host path whose dev/ holds the NVIDIA device nodes (default: --driver-root; / with the GPU Operator)")
	fs.StringVar(&f.CDIHook, "nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook", "host path of nvidia-cdi-hook, which the CDI specs' hooks run; the plugin refuses to start unless it runs")
	fs.StringVar(&f.ContainerCDIHook, "container-nvidia-cdi-hook", "", "where the plugin sees --nvidia-cdi-hook, a mount in its container (default: --nvidia-cdi-hook itself)")
	fs.StringVar(&f.CDIDir, "cdi-dir", "/var/run/cdi", "CDI spec directory the container runtime reads")
	fs.StringVar(&f.StateDir, "state-dir", "/var/lib/facet", "directory of the prepared-claims checkpoint")
	fs.StringVar(&f.RegistrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory")
	fs.StringVar(&f.PluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet's plugins directory; the socket goes in <dir>/"+names.Driver)
	// The kubelet helper GETs every claim in NodePrepareResources, so the
	// client's limit caps prepares per second: client-go's default of 5
	// QPS and even 50 did (about 53 claims/s). The GETs come only as
	// fast as the kubelet starts pods; API Priority and Fairness guards
	// the server.
	kube.AddRateFlags(fs, 1000, 1000)
	fs.StringVar(&f.HAMiLibrarySHA256, "hami-library-sha256", "", "SHA-256 (64 hex digits) --hami-library must have; when it differs, enforced vGPU shares fail to prepare, naming both hashes (the library is preloaded into every tenant's container)")
	fs.StringVar(&f.HAMiLibrary, "hami-library", "", "host path of HAMi-core's libvgpu.so, which enforces vGPU shares (installed by the chart's hami-core DaemonSet); looked for every --mps-check-interval and adopted when it appears; without it, claims for enforced shares fail")
	fs.StringVar(&f.MPS.Mode, "mps", "auto", "MPS partitioning of vGPU shares and slots (docs/mps.md): auto (the default partitioning wherever the driver root has nvidia-cuda-mps-control) or off (HAMi-core time-slicing only; claims asking for partitioning mps fail)")
	fs.StringVar(&f.MPS.Dir, "mps-dir", "/run/facet/mps", "host directory (a tmpfs) of the per-GPU MPS pipe, log and shared-memory directories and of facet-mps's socket, the same as facet-mps's --mps-dir; the CDI specs mount them by this path")
	fs.DurationVar(&f.MPS.CheckEvery, "mps-check-interval", 10*time.Second, "how often facet-mps and HAMi-core are looked for (adopted when they arrive, dropped when they go, the slices republished) and MPS control daemons checked (a dead one is restarted, with an Event on its claims)")
	fs.BoolVar(&f.DestroyUnownedMIG, "destroy-unowned-mig", false, "at start, destroy MIG instances on managed GPUs that no prepared claim owns (default: only report them)")
	fs.StringVar(&f.FeatureGates, "feature-gates", "", "DRA feature gates the cluster enforces, in the Kubernetes components' syntax (DRAPartitionableDevices=true,DRAConsumableCapacity=false); overrides what the plugin detects, for clusters whose kube-scheduler runs other gates than the API server")
	fs.StringVar(&f.MIGLayouts, "mig-layouts", "", `MIG layouts Facet carves at start on idle static-mig GPUs, by NVML index: all-<profile>, all-balanced, or profiles joined by "/", e.g. "0-3=all-1g.10gb,4=3g.40gb/2g.20gb/1g.10gb/1g.10gb"`)
	fs.DurationVar(&f.FeaturesEvery, "feature-detection-interval", 5*time.Minute, "how often to re-detect the cluster's DRA features; on a change the plugin exits to republish")
	fs.StringVar(&f.HealthAddr, "health-addr", "", "address of the HTTP probes /healthz (gRPC sockets answer) and /readyz (also registered with the kubelet, slices published), e.g. :8081, or unix:<path> for a unix socket; empty: none")
	fs.StringVar(&f.probe, "probe", "", "instead of running the plugin, ask the running one's health server at --health-addr for this path (/healthz or /readyz) and exit 0 if it is ok, 1 if not: an exec probe")
	fs.StringVar(&f.PodUID, "pod-uid", os.Getenv("POD_UID"), "this plugin pod's UID (env POD_UID, from the downward API): enables rolling updates, where the kubelet may call a new pod and the old one at once, prepares and unprepares taking turns through <state-dir>/"+nodeplugin.NodeLockFile+"; empty: one plugin process per node (Kubernetes 1.33+ kubelets support it)")
	fs.DurationVar(&f.HealthProbe, "gpu-health-probe-interval", 5*time.Second, "how often each GPU is queried through NVML for health (XID and ECC events are watched continuously); 0 turns GPU health monitoring off")
	fs.DurationVar(&f.HealthQuiet, "gpu-health-quiet-period", 5*time.Minute, "how long a GPU with a recoverable fault must answer NVML without a new fault before its devices are offered again (fatal faults need `facetctl health recover`)")
	fs.StringVar(&f.ComputeDomains, "compute-domains", nodeplugin.ComputeDomainsAuto, "ComputeDomains (docs/design/compute-domains.md): auto (publish the node's IMEX channel device where the driver offers IMEX channels and the GPUs report one fabric clique, and prepare channel claims, labelling the node for the domain) or off (publish none; channel claims fail)")
	f.Modes.Register(fs)
	daemon.AddLogFlags(fs)
	err := fs.Parse(args)
	f.Kubeconfig, f.KubeAPIQPS, f.KubeAPIBurst = kube.Kubeconfig, kube.QPS, kube.Burst
	return f, err
}
