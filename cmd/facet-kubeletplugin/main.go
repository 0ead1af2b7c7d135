// Command facet-kubeletplugin is Facet's DRA kubelet plugin, run as a
// DaemonSet on every GPU node (or by hand against a simulated machine).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cdi"
	"github.com/facet-gpu/facet/pkg/checkpoint"
	"github.com/facet-gpu/facet/pkg/claimstatus"
	"github.com/facet-gpu/facet/pkg/driver"
	"github.com/facet-gpu/facet/pkg/features"
	"github.com/facet-gpu/facet/pkg/hami"
	gpuhealth "github.com/facet-gpu/facet/pkg/health"
	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/metrics"
	"github.com/facet-gpu/facet/pkg/miglayout"
	"github.com/facet-gpu/facet/pkg/names"
	"github.com/facet-gpu/facet/pkg/nvml"
)

type flags struct {
	nodeName     string
	kubeconfig   string
	machine      string
	nvmlLib      string
	driverRoot   string
	devRoot      string
	cdiHook      string
	cdiDir       string
	stateDir     string
	registrarDir string
	pluginsDir   string
	modes        inventory.ModeFlags
	kubeAPIQPS   float64
	kubeAPIBurst int

	hamiLibrary       string
	destroyUnownedMIG bool
	mps               mpsFlags

	featureGates  string
	migLayouts    string
	featuresEvery time.Duration
	healthAddr    string
	healthProbe   time.Duration
	healthQuiet   time.Duration
	podUID        string
	probe         string
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
		if err := askHealth(context.Background(), f.healthAddr, f.probe, 5*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ctx = klog.NewContext(ctx, klog.Background())
	err = run(ctx, f)
	cancel()
	if err != nil {
		klog.FromContext(ctx).Error(err, "facet-kubeletplugin failed")
		klog.Flush()
		os.Exit(1)
	}
}

// parseFlags parses the command line. Errors (and -h) are printed with the
// usage by the flag set; flag.ErrHelp means -h.
func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("facet-kubeletplugin", flag.ContinueOnError)
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name: the pool's name (env NODE_NAME)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.StringVar(&f.machine, "machine", "", "simulate the node described by this machine file instead of loading NVML (builds with -tags facetsim only)")
	fs.StringVar(&f.nvmlLib, "nvml-library", "", "path of libnvidia-ml.so.1 (default: the loader's search path)")
	fs.StringVar(&f.driverRoot, "driver-root", "/", "host path of the NVIDIA driver's files (/run/nvidia/driver with the GPU Operator)")
	fs.StringVar(&f.devRoot, "dev-root", "", "host path whose dev/ holds the NVIDIA device nodes (default: --driver-root)")
	fs.StringVar(&f.cdiHook, "nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook", "host path of nvidia-cdi-hook, referenced by the CDI specs' hooks")
	fs.StringVar(&f.cdiDir, "cdi-dir", "/var/run/cdi", "CDI spec directory the container runtime reads")
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/facet", "directory of the prepared-claims checkpoint")
	fs.StringVar(&f.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory")
	fs.StringVar(&f.pluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet's plugins directory; the socket goes in <dir>/"+names.Driver)
	// The kubelet helper GETs every claim in NodePrepareResources, so the
	// client's limit caps prepares per second: client-go's default of 5
	// QPS and even 50 did (about 53 claims/s). The GETs come only as
	// fast as the kubelet starts pods; API Priority and Fairness guards
	// the server.
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", 1000, "queries per second to the API server")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", 1000, "burst of queries to the API server")
	fs.StringVar(&f.hamiLibrary, "hami-library", "", "host path of HAMi-core's libvgpu.so, which enforces vGPU shares (installed by the DaemonSet's init container); without it, claims for enforced shares fail")
	fs.StringVar(&f.mps.mode, "mps", "auto", "MPS partitioning of vGPU shares and slots (docs/mps.md): auto (the default partitioning wherever the driver root has nvidia-cuda-mps-control) or off (HAMi-core time-slicing only; claims asking for partitioning mps fail)")
	fs.StringVar(&f.mps.dir, "mps-dir", "/run/facet/mps", "host directory (a tmpfs) of the per-GPU MPS pipe, log and shared-memory directories; the CDI specs mount them by this path")
	fs.BoolVar(&f.mps.privateShm, "mps-private-shm", true, "start each MPS control daemon in a mount namespace of its own with the GPU's shm directory as /dev/shm, the /dev/shm its shares get (needs CAP_SYS_ADMIN)")
	fs.DurationVar(&f.mps.checkEvery, "mps-check-interval", 10*time.Second, "how often MPS control daemons are checked; a dead one is restarted, with an Event on its claims")
	fs.BoolVar(&f.destroyUnownedMIG, "destroy-unowned-mig", false, "at start, destroy MIG instances on managed GPUs that no prepared claim owns (default: only report them)")
	fs.StringVar(&f.featureGates, "feature-gates", "", "DRA feature gates the cluster enforces, in the Kubernetes components' syntax (DRAPartitionableDevices=true,DRAConsumableCapacity=false); overrides what the plugin detects, for clusters whose kube-scheduler runs other gates than the API server")
	fs.StringVar(&f.migLayouts, "mig-layouts", "", `MIG layouts Facet carves at start on idle static-mig GPUs, by NVML index: all-<profile>, all-balanced, or profiles joined by "/", e.g. "0-3=all-1g.10gb,4=3g.40gb/2g.20gb/1g.10gb/1g.10gb"`)
	fs.DurationVar(&f.featuresEvery, "feature-detection-interval", 5*time.Minute, "how often to re-detect the cluster's DRA features; on a change the plugin exits to republish")
	fs.StringVar(&f.healthAddr, "health-addr", "", "address of the HTTP probes /healthz (gRPC sockets answer) and /readyz (also registered with the kubelet, slices published), e.g. :8081, or unix:<path> for a unix socket; empty: none")
	fs.StringVar(&f.probe, "probe", "", "instead of running the plugin, ask the running one's health server at --health-addr for this path (/healthz or /readyz) and exit 0 if it is ok, 1 if not: an exec probe")
	fs.StringVar(&f.podUID, "pod-uid", os.Getenv("POD_UID"), "this plugin pod's UID (env POD_UID, from the downward API): enables rolling updates, where the kubelet may call a new pod and the old one at once, prepares and unprepares taking turns through <state-dir>/"+nodeLockFile+"; empty: one plugin process per node (Kubernetes 1.33+ kubelets support it)")
	fs.DurationVar(&f.healthProbe, "gpu-health-probe-interval", 5*time.Second, "how often each GPU is queried through NVML for health (XID and ECC events are watched continuously); 0 turns GPU health monitoring off")
	fs.DurationVar(&f.healthQuiet, "gpu-health-quiet-period", 5*time.Minute, "how long a GPU with a recoverable fault must answer NVML without a new fault before its devices are offered again (fatal faults need `facetctl health recover`)")
	f.modes.Register(fs)
	klog.InitFlags(fs)
	err := fs.Parse(args)
	return f, err
}

// nodeLockFile, in the state directory, serialises the plugin processes
// of a rolling update (--pod-uid).
const nodeLockFile = "plugin.lock"

func run(ctx context.Context, f flags) error {
	start := time.Now()
	logger := klog.FromContext(ctx)
	if f.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	cfg, err := f.modes.Config()
	if err != nil {
		return err
	}
	overrides, err := features.ParseOverrides(f.featureGates)
	if err != nil {
		return err
	}
	layouts, err := inventory.ParsePerGPU(f.migLayouts, "layout", func(s string) (string, error) { return s, nil })
	if err != nil {
		return fmt.Errorf("--mig-layouts: %w", err)
	}
	if err := os.MkdirAll(f.stateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var lib *nvml.Library
	if f.machine != "" {
		// MIG instances outlive the plugin on real GPUs; the simulation
		// keeps them in the state directory so restarts see them too.
		lib, err = openMachine(f.machine, filepath.Join(f.stateDir, "simulated-nvml.json"))
	} else {
		lib, err = nvml.OpenReal(f.nvmlLib)
	}
	if err != nil {
		return err
	}
	defer lib.Close()
	node, err := lib.Discover()
	if err != nil {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	client, err := kubeClient(f.kubeconfig, f.kubeAPIQPS, f.kubeAPIBurst)
	if err != nil {
		return err
	}
	ev := newNodeEvents(ctx, client, f.nodeName)
	defer ev.stop()
	m := metrics.New()
	gates := clusterFeatures(ctx, client, f.nodeName, overrides, ev)
	m.SetFeatures(featureMetrics(gates))
	logger.Info("Cluster DRA features: "+gates.Describe(), "featureGates", gates.String())
	ev.normal(reasonFeatures, gates.Describe())
	cfg.Features = &gates
	store, err := checkpoint.Open(filepath.Join(f.stateDir, "claims"))
	if err != nil {
		return err
	}
	// Compacts the journal into record files on the way out, unless the
	// other instance of a rolling update still has it open.
	defer store.Close()
	if err := applyLayouts(ctx, lib, node, layouts, cfg, store, miglayout.NewStore(filepath.Join(f.stateDir, "mig-layouts.json")), ev); err != nil {
		return err
	}
	for _, g := range node.GPUs {
		if g.MIGCapable {
			// What exists decides static-mig's devices and auto's choice.
			if cfg.MIGInstances, err = lib.ListMIG(); err != nil {
				return fmt.Errorf("list MIG instances: %w", err)
			}
			break
		}
	}
	inv, err := inventory.Build(node, cfg)
	if err != nil {
		ev.warning(reasonModeFallback, err.Error())
		return err
	}
	for _, g := range inv.GPUs {
		logger.Info("GPU", "index", g.Index, "uuid", g.UUID, "product", g.ProductName, "mode", g.Mode, "requested", g.ModeRequested, "why", g.ModeNote, "migCapable", g.MIGCapable, "devices", len(g.Devices))
	}
	for _, note := range inv.Notes {
		logger.Info("Mode fallback", "note", note)
		ev.warning(reasonModeFallback, note)
	}
	logger.Info("Discovered node", "simulated", f.machine != "", "gpus", len(inv.GPUs), "driverVersion", inv.DriverVersion, "cudaDriverVersion", inv.CUDADriverVersion)

	if f.machine != "" {
		// nvcdi reads MIG capability minors from the fixed path
		// /proc/driver/nvidia-caps; a simulated node binds its own table
		// there, in the private mount namespace the plugin must then run
		// in (unshare --mount --propagation private, or a container of its
		// own as the chart's pod). Refused on a host with a real driver or
		// in the host's mount namespace.
		if err := bindSimulatedProcDriver(f.driverRoot); err != nil {
			logger.Error(err, "MIG devices cannot get CDI edits on this simulated node; MIG claims will fail to prepare")
		}
	}
	vgpu, hamiErr := openHAMi(f.hamiLibrary, filepath.Join(f.stateDir, "vgpu"))
	if hamiErr != nil {
		logger.Error(hamiErr, "vGPU shares that need enforcement will fail to prepare; everything else is served")
	}
	partitioner, mpsErr, err := f.mps.open(ctx, f.driverRoot)
	if err != nil {
		return err
	}
	inv.ComputePartitioning = partitioning(partitioner)
	editor, err := lib.DriverEditor(nvml.DriverEditorOptions{DriverRoot: f.driverRoot, DevRoot: f.devRoot, NvidiaCDIHookPath: f.cdiHook})
	if err != nil {
		return err
	}
	writer, err := cdi.NewWriter(f.cdiDir)
	if err != nil {
		return err
	}
	var nodeLock string
	if f.podUID != "" {
		nodeLock = filepath.Join(f.stateDir, nodeLockFile)
	}
	status := claimstatus.NewWriter(client, store)
	go status.Run(ctx, 2)
	drv, err := driver.New(ctx, driver.Options{
		NodeName: f.nodeName, Inventory: inv, Store: store, CDI: writer, Edits: editor,
		MIG: lib, HAMi: vgpu, HAMiUnavailable: hamiErr, DestroyUnownedMIG: f.destroyUnownedMIG,
		MPS: partitioner, MPSUnavailable: mpsErr,
		Failpoint: failpoint(ctx), NodeLock: nodeLock,
		// Events on claims go through the Node's broadcaster too.
		Metrics: m, Events: ev.rec, Status: status,
	})
	if err != nil {
		return err
	}
	go drv.RunMPSWatch(ctx, f.mps.checkEvery)
	m.Registry().MustRegister(&metrics.Collector{GPUs: drv, Health: metrics.HealthFunc(drv.GPUHealth), Checkpoint: store})
	unusable := drv.UnusableGPUs()
	for uuid, why := range unusable {
		logger.Error(nil, "GPU unusable until the plugin restarts with the problem fixed; it is not published and its claims fail", "gpu", uuid, "why", why)
		ev.warning(reasonGPUUnusable, fmt.Sprintf("GPU %s is not published until the plugin restarts with the problem fixed: %s", uuid, why))
	}

	pluginDir := filepath.Join(f.pluginsDir, names.Driver)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(names.Driver),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(f.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		// Claims on different GPUs must not wait for each other; the
		// driver serialises per claim and per device itself.
		kubeletplugin.Serialize(false),
	}
	if f.podUID != "" {
		// The old and the new pod register sockets of their own, and the
		// kubelet may call either; the driver's node lock serialises them
		// (driver.Options.NodeLock), not the helper's, which would also
		// serialise claims on different GPUs.
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(f.podUID)))
		logger.Info("Rolling updates enabled", "podUID", f.podUID, "nodeLock", nodeLock)
	}
	helper, err := kubeletplugin.Start(ctx, drv, opts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	var uuids []string
	for _, g := range inv.GPUs {
		uuids = append(uuids, g.UUID)
	}
	mon, opened, err := gpuhealth.Open(gpuhealth.Options{
		Path: filepath.Join(f.stateDir, "gpu-faults.json"), BootID: drv.BootID(),
		GPUs: uuids, QuietPeriod: f.healthQuiet,
	})
	if err != nil {
		return fmt.Errorf("GPU fault record: %w", err)
	}
	pub := &publisher{helper: helper, inv: inv, unusable: unusable, gates: gates, node: f.nodeName, drv: drv, mon: mon, ev: ev, metrics: m}
	want, err := pub.publish(ctx)
	if err != nil {
		return err
	}
	for uuid, ft := range mon.Faults() {
		logger.Error(nil, "GPU unhealthy since before this start", "gpu", uuid, "fault", ft.String())
	}
	for _, c := range opened {
		pub.changed(ctx, c)
	}
	if f.healthProbe > 0 {
		go watchGPUHealth(ctx, lib, pub, f.healthProbe)
		go watchRecoverRequests(ctx, client, lib, pub)
	}
	go reportPublished(ctx, client, f.nodeName, want, start)
	if err := startHealth(ctx, f, helper, client, want, m.Handler()); err != nil {
		return err
	}

	if f.featuresEvery > 0 {
		if err := watchFeatures(ctx, client, f.nodeName, overrides, gates, f.featuresEvery, ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	logger.Info("Shutting down")
	return nil
}

// reportPublished logs when the API server holds all of this node's slices,
// the plugin's time-to-ready as a scheduler sees it.
func reportPublished(ctx context.Context, client kubernetes.Interface, node string, want int, start time.Time) {
	sel := fields.Set{"spec.driver": names.Driver, "spec.nodeName": node}.AsSelector().String()
	for ctx.Err() == nil {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(list.Items) >= want {
			klog.FromContext(ctx).Info("ResourceSlices published", "slices", len(list.Items), "sinceStart", time.Since(start).Round(time.Millisecond))
			// Start-up is over: hand back what only it used (memory.go).
			n, err := releaseStartupPages()
			klog.FromContext(ctx).V(2).Info("Released start-up pages of the executable", "bytes", n, "err", err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openHAMi sets up HAMi-core. A missing or broken library is returned as
// the reason share claims fail, not as an error that stops the plugin:
// whole GPUs and MIG devices do not need it.
func openHAMi(library, stateDir string) (*hami.Editor, error) {
	if library == "" {
		return nil, nil
	}
	return hami.NewEditor(hami.Options{LibraryPath: library, StateDir: stateDir})
}

func kubeClient(kubeconfig string, qps float64, burst int) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kube client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	return kubernetes.NewForConfig(cfg)
}
