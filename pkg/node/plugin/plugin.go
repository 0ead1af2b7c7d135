// Package plugin runs the kubelet plugin's process, around package driver
// (which prepares claims): it discovers the node's
// GPUs, builds the inventory in the configured modes, starts the driver
// behind the kubelet plugin helper, publishes the ResourceSlices, and
// keeps them current (GPU health, recovery requests, the cluster's DRA
// features) until its context ends. cmd/facet-kubeletplugin parses the
// flags into a Config and calls Run.
package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvml"
	"github.com/facet-gpu/facet/pkg/model/sharemem"
	"github.com/facet-gpu/facet/pkg/node/cdi"
	"github.com/facet-gpu/facet/pkg/node/cdihook"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimstatus"
	"github.com/facet-gpu/facet/pkg/node/driver"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/healthz"
	"github.com/facet-gpu/facet/pkg/node/metrics"
	"github.com/facet-gpu/facet/pkg/node/nodeevents"
	"github.com/facet-gpu/facet/pkg/node/publisher"
)

// Config is the plugin's configuration: its command line
// (cmd/facet-kubeletplugin documents each flag), plus the hooks only some
// builds link.
type Config struct {
	NodeName    string
	Kubeconfig  string
	Machine     string
	NVMLLibrary string
	DriverRoot  string
	DevRoot     string
	CDIHook     string
	// Where this process sees DriverRoot and CDIHook: mounts in the
	// plugin's container (the host's / cannot be mounted at /). Empty: the
	// host paths themselves.
	ContainerDriverRoot string
	ContainerCDIHook    string
	CDIDir              string
	StateDir            string
	RegistrarDir        string
	PluginsDir          string
	Modes               inventory.ModeFlags
	KubeAPIQPS          float64
	KubeAPIBurst        int

	HAMiLibrary string
	// HAMiLibrarySHA256, when set, is the SHA-256 HAMiLibrary must have
	// (hami.Options.LibrarySHA256).
	HAMiLibrarySHA256 string
	DestroyUnownedMIG bool
	MPS               MPSConfig

	FeatureGates  string
	MIGLayouts    string
	FeaturesEvery time.Duration
	HealthAddr    string
	HealthProbe   time.Duration
	HealthQuiet   time.Duration
	PodUID        string

	// OpenMachine simulates the node of a machine file (Machine), its MIG
	// state kept in stateFile; BindSimulatedProcDriver binds the simulated
	// driver root's /proc/driver/nvidia-caps. Only builds with -tags
	// facetsim can; the shipped build's return an error.
	OpenMachine             func(path, stateFile string) (*nvml.Library, error)
	BindSimulatedProcDriver func(driverRoot string) error
	// Failpoint, when set, is the driver's test hook (driver.Options).
	Failpoint func(string)
}

// NodeLockFile, in the state directory, serialises the plugin processes
// of a rolling update (Config.PodUID).
const NodeLockFile = "plugin.lock"

// Run runs the plugin until ctx ends (nil) or the cluster's DRA features
// change (an error: the plugin restarts to republish). A configuration
// error is returned before the node is touched.
func Run(ctx context.Context, f Config) error {
	start := time.Now()
	logger := klog.FromContext(ctx)
	if f.NodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	cfg, err := f.Modes.Config()
	if err != nil {
		return err
	}
	overrides, err := features.ParseOverrides(f.FeatureGates)
	if err != nil {
		return err
	}
	layouts, err := inventory.ParsePerGPU(f.MIGLayouts, "layout", func(s string) (string, error) { return s, nil })
	if err != nil {
		return fmt.Errorf("--mig-layouts: %w", err)
	}
	if err := os.MkdirAll(f.StateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var lib *nvml.Library
	if f.Machine != "" {
		// MIG instances outlive the plugin on real GPUs; the simulation
		// keeps them in the state directory so restarts see them too.
		lib, err = f.openMachine(f.Machine, filepath.Join(f.StateDir, "simulated-nvml.json"))
	} else {
		lib, err = nvml.OpenDriver(f.containerDriverRoot(), f.NVMLLibrary)
	}
	if err != nil {
		return err
	}
	defer lib.Close()
	node, err := nodemodel.Discover(lib)
	if err != nil {
		return err
	}
	client, err := kubeClient(f.Kubeconfig, f.KubeAPIQPS, f.KubeAPIBurst)
	if err != nil {
		return err
	}
	if err := checkCDIHook(ctx, client, f); err != nil {
		return err
	}
	ev := nodeevents.New(ctx, client, f.NodeName)
	defer ev.Stop()
	m := metrics.New()
	gates := clusterFeatures(ctx, client, f.NodeName, overrides, ev)
	m.SetFeatures(featureMetrics(gates))
	logger.Info("Cluster DRA features: "+gates.Describe(), "featureGates", gates.String())
	ev.Normal(reasonFeatures, gates.Describe())
	cfg.Features = &gates
	store, err := checkpoint.Open(filepath.Join(f.StateDir, "claims"))
	if err != nil {
		return err
	}
	// Compacts the journal into record files on the way out, unless the
	// other instance of a rolling update still has it open.
	defer store.Close()
	if err := applyLayouts(ctx, lib, node, layouts, cfg, store, miglayout.NewStore(filepath.Join(f.StateDir, "mig-layouts.json")), ev); err != nil {
		return err
	}
	vgpu, hamiErr := openHAMi(f.HAMiLibrary, f.HAMiLibrarySHA256, filepath.Join(f.StateDir, "vgpu"))
	if hamiErr != nil {
		logger.Error(hamiErr, "vGPU shares that need enforcement will fail to prepare; everything else is served")
	}
	partitioner, mpsErr, err := f.openMPS(ctx)
	if err != nil {
		return err
	}
	if partitioner != nil {
		// The MPS server's memory is no share's: published, it would be
		// promised twice.
		cfg.MPSReserveBytes = sharemem.MPSServerBytes
	}
	// The layouts are carved by now: the instances listed are the node's.
	inv, err := nodemodel.Build(node, cfg, nodemodel.Options{MIG: lib})
	if err != nil {
		reason := reasonModeFallback
		if defect := (*inventory.DefectError)(nil); errors.As(err, &defect) {
			reason = reasonAllocatorDefect
		}
		// At once: the plugin exits next, and the broadcaster's queue
		// would go with it.
		if evErr := nodeevents.WarnNow(ctx, client.CoreV1(), f.NodeName, reason, err.Error()); evErr != nil {
			logger.Error(evErr, "Cannot raise the Node Event")
		}
		return err
	}
	for _, g := range inv.GPUs {
		logger.Info("GPU", "index", g.Index, "uuid", g.UUID, "product", g.ProductName, "mode", g.Mode, "requested", g.ModeRequested, "why", g.ModeNote, "migCapable", g.MIGCapable, "devices", len(g.Devices))
	}
	for _, note := range inv.Notes {
		logger.Info("Mode fallback", "note", note)
		ev.Warning(reasonModeFallback, note)
	}
	for _, w := range inv.Warnings {
		logger.Info("Known allocator defect", "warning", w)
		ev.Warning(reasonAllocatorDefect, w)
	}
	if hamiErr != nil {
		ev.Warning(reasonHAMiUnavailable, hamiErr.Error()+"; vGPU shares that need enforcement fail to prepare, everything else is served")
	}
	logger.Info("Discovered node", "simulated", f.Machine != "", "gpus", len(inv.GPUs), "driverVersion", inv.DriverVersion, "cudaDriverVersion", inv.CUDADriverVersion)

	if f.Machine != "" {
		// nvcdi reads MIG capability minors from the fixed path
		// /proc/driver/nvidia-caps; a simulated node binds its own table
		// there, in the private mount namespace the plugin must then run
		// in (unshare --mount --propagation private, or a container of its
		// own as the chart's pod). Refused on a host with a real driver or
		// in the host's mount namespace. Facet's own MIG edits read the
		// simulated root's proc files directly (ProcRoot below), so only
		// nvcdi's MIG code paths, which Facet does not call, need the bind.
		if err := f.bindSimulatedProcDriver(f.containerDriverRoot()); err != nil {
			logger.Error(err, "nvcdi cannot see the simulated MIG capability table on this simulated node")
		}
	}
	inv.ComputePartitioning = partitioning(partitioner)
	// The driver's proc files (MIG capabilities) are the node's, in a
	// container too; a simulated node has them in its driver root.
	procRoot := nvml.DefaultProcRoot
	if f.Machine != "" {
		procRoot = filepath.Join(f.containerDriverRoot(), "proc")
	}
	editor, err := lib.DriverEditor(nvml.DriverEditorOptions{
		DriverRoot: f.DriverRoot, ContainerDriverRoot: f.ContainerDriverRoot, DevRoot: f.DevRoot, NvidiaCDIHookPath: f.CDIHook,
		ProcRoot: procRoot,
	})
	if err != nil {
		return err
	}
	writer, err := cdi.NewWriter(f.CDIDir)
	if err != nil {
		return err
	}
	var nodeLock string
	if f.PodUID != "" {
		nodeLock = filepath.Join(f.StateDir, NodeLockFile)
	}
	status := claimstatus.NewWriter(client, store)
	go status.Run(ctx, 2)
	drv, err := driver.New(ctx, driver.Options{
		NodeName: f.NodeName, Inventory: inv, Store: store, CDI: writer, Edits: editor,
		MIG: lib, HAMi: vgpu, HAMiUnavailable: hamiErr, DestroyUnownedMIG: f.DestroyUnownedMIG,
		MPS: partitioner, MPSUnavailable: mpsErr, Pods: podGetter(client),
		Failpoint: f.Failpoint, NodeLock: nodeLock,
		// Events on claims go through the Node's broadcaster too.
		Metrics: m, Events: ev.EventRecorder(), Status: status,
	})
	if err != nil {
		return err
	}
	go drv.RunMPSWatch(ctx, f.MPS.CheckEvery)
	m.Registry().MustRegister(&metrics.Collector{GPUs: drv, Health: metrics.HealthFunc(drv.GPUHealth), Checkpoint: store})
	unusable := drv.UnusableGPUs()
	for uuid, why := range unusable {
		logger.Error(nil, "GPU unusable until the plugin restarts with the problem fixed; it is not published and its claims fail", "gpu", uuid, "why", why)
		ev.Warning(reasonGPUUnusable, fmt.Sprintf("GPU %s is not published until the plugin restarts with the problem fixed: %s", uuid, why))
	}

	pluginDir := filepath.Join(f.PluginsDir, names.Driver)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(names.Driver),
		kubeletplugin.NodeName(f.NodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(f.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		// Claims on different GPUs must not wait for each other; the
		// driver serialises per claim and per device itself.
		kubeletplugin.Serialize(false),
	}
	if f.PodUID != "" {
		// The old and the new pod register sockets of their own, and the
		// kubelet may call either; the driver's node lock serialises them
		// (driver.Options.NodeLock), not the helper's, which would also
		// serialise claims on different GPUs.
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(f.PodUID)))
		logger.Info("Rolling updates enabled", "podUID", f.PodUID, "nodeLock", nodeLock)
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
		Path: filepath.Join(f.StateDir, "gpu-faults.json"), BootID: drv.BootID(),
		GPUs: uuids, QuietPeriod: f.HealthQuiet,
	})
	if err != nil {
		return fmt.Errorf("GPU fault record: %w", err)
	}
	pub := publisher.New(publisher.Options{
		Sink: helper, Inventory: inv, Unusable: unusable, Gates: gates, Node: f.NodeName,
		Faults: drv, Monitor: mon, Events: ev, Metrics: m, MIGUse: drv,
	})
	want, err := pub.Publish(ctx)
	if err != nil {
		return err
	}
	for uuid, ft := range mon.Faults() {
		logger.Error(nil, "GPU unhealthy since before this start", "gpu", uuid, "fault", ft.String())
	}
	for _, c := range opened {
		pub.Changed(ctx, c)
	}
	go pub.WatchMIGUse(ctx, drv.MIGUseChanges())
	if f.HealthProbe > 0 {
		go pub.WatchHealth(ctx, lib, f.HealthProbe)
		go pub.WatchRecoverRequests(ctx, client, lib)
	}
	go reportPublished(ctx, client, f.NodeName, want, start)
	if f.HealthAddr != "" {
		reg, dra := healthz.Sockets(f.RegistrarDir, f.PluginsDir, f.PodUID)
		if err := healthz.Serve(ctx, f.HealthAddr, &healthz.Checker{
			RegistrarSocket: reg, DRASocket: dra,
			Registered:      helper.RegistrationStatus,
			SlicesPublished: healthz.SlicesPublished(client, f.NodeName, want),
			Timeout:         5 * time.Second,
			Metrics:         m.Handler(),
		}); err != nil {
			return err
		}
	}

	if f.FeaturesEvery > 0 {
		if err := watchFeatures(ctx, client, f.NodeName, overrides, gates, f.FeaturesEvery, ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	logger.Info("Shutting down")
	return nil
}

// containerDriverRoot is where this process reads the driver root.
func (f Config) containerDriverRoot() string {
	return cmp.Or(f.ContainerDriverRoot, f.DriverRoot)
}

// openMPS reaches facet-mps (MPSConfig.open).
func (f Config) openMPS(ctx context.Context) (driver.Partitioner, error, error) {
	return f.MPS.open(ctx)
}

// checkCDIHook refuses to start unless the nvidia-cdi-hook the CDI specs
// name runs (package cdihook): every container created from a spec would
// fail otherwise. The refusal, which names the value to set, is also a
// Warning Event on the Node, recorded before the plugin exits.
func checkCDIHook(ctx context.Context, client kubernetes.Interface, f Config) error {
	logger := klog.FromContext(ctx)
	version, err := cdihook.Check(ctx, cdihook.Options{HostPath: f.CDIHook, Path: f.ContainerCDIHook})
	if err != nil {
		if evErr := nodeevents.WarnNow(ctx, client.CoreV1(), f.NodeName, cdihook.Reason, err.Error()); evErr != nil {
			logger.Error(evErr, "Cannot raise the Node Event")
		}
		return err
	}
	logger.Info("nvidia-cdi-hook runs", "path", f.CDIHook, "version", version)
	return nil
}

func (f Config) openMachine(path, stateFile string) (*nvml.Library, error) {
	if f.OpenMachine == nil {
		return nil, errors.New("--machine: this build cannot simulate a node")
	}
	return f.OpenMachine(path, stateFile)
}

func (f Config) bindSimulatedProcDriver(driverRoot string) error {
	if f.BindSimulatedProcDriver == nil {
		return errors.New("this build cannot simulate a node")
	}
	return f.BindSimulatedProcDriver(driverRoot)
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
func openHAMi(library, sha256, stateDir string) (*hami.Editor, error) {
	if library == "" {
		return nil, nil
	}
	return hami.NewEditor(hami.Options{LibraryPath: library, LibrarySHA256: sha256, StateDir: stateDir})
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
