// Package nodeplugin runs the kubelet plugin's process, around package dradriver
// (which prepares claims): it discovers the node's
// GPUs, builds the inventory in the configured modes, starts the driver
// behind the kubelet plugin helper, publishes the ResourceSlices, and
// keeps them current (GPU health, recovery requests, the cluster's DRA
// features) until its context ends. cmd/facet-kubeletplugin parses the
// flags into a Config and calls Run.
package nodeplugin

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
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/sharemem"
	"github.com/facet-gpu/facet/pkg/node/cdihook"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimcdi"
	"github.com/facet-gpu/facet/pkg/node/claimstatus"
	"github.com/facet-gpu/facet/pkg/node/computedomain"
	"github.com/facet-gpu/facet/pkg/node/dradriver"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodeevents"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
	"github.com/facet-gpu/facet/pkg/node/probes"
	"github.com/facet-gpu/facet/pkg/node/publisher"
	"github.com/facet-gpu/facet/pkg/node/sharing"
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
	// ComputeDomains is ComputeDomainsAuto or ComputeDomainsOff
	// (--compute-domains).
	ComputeDomains string

	// OpenMachine simulates the node of a machine file (Machine), its MIG
	// state kept in stateFile; BindSimulatedProcDriver binds the simulated
	// driver root's /proc/driver/nvidia-caps. Only builds with -tags
	// facetsim can; the shipped build's return an error.
	OpenMachine             func(path, stateFile string) (*nvmlgpu.Library, error)
	BindSimulatedProcDriver func(driverRoot string) error
	// Failpoint, when set, is the driver's test hook (dradriver.Options).
	Failpoint func(string)
}

// Values of Config.ComputeDomains: auto publishes the node's IMEX channel
// device where the driver offers channels and the GPUs report one fabric
// clique, and prepares channel claims (docs/design/compute-domains.md);
// off publishes none and refuses channel claims.
const (
	ComputeDomainsAuto = "auto"
	ComputeDomainsOff  = "off"
)

// NodeLockFile, in the state directory, serialises the plugin processes
// of a rolling update (Config.PodUID).
const NodeLockFile = "plugin.lock"

// Run runs the plugin until ctx ends (nil) or the cluster's DRA features
// change (an error: the plugin restarts to republish). A configuration
// error is returned before the node is touched.
//
// Each step below feeds the next through process; the order is the
// order of what a failure must have touched: nothing before the
// configuration is valid, no MIG carving before the cluster's features
// are known, no slice before the driver has restored its claims.
func Run(ctx context.Context, f Config) error {
	p := &process{f: f, start: time.Now()}
	if err := p.configure(); err != nil {
		return err
	}
	if err := p.openNVML(); err != nil {
		return err
	}
	defer p.lib.Close()
	var err error
	if p.node, err = nodemodel.Discover(p.lib); err != nil {
		return err
	}
	if err := p.connect(ctx); err != nil {
		return err
	}
	defer p.ev.Stop()
	p.learnFeatures(ctx)
	if p.store, err = checkpoint.Open(filepath.Join(f.StateDir, "claims")); err != nil {
		return err
	}
	// Compacts the journal into record files on the way out, unless the
	// other instance of a rolling update still has it open.
	defer p.store.Close()
	if err := applyLayouts(ctx, p.lib, p.node, p.layouts, p.cfg, p.store, miglayout.NewStore(filepath.Join(f.StateDir, "mig-layouts.json")), p.ev); err != nil {
		return err
	}
	if err := p.openSharing(ctx); err != nil {
		return err
	}
	if err := p.buildInventory(ctx); err != nil {
		return err
	}
	if err := p.startDriver(ctx); err != nil {
		return err
	}
	if err := p.startHelper(ctx); err != nil {
		return err
	}
	defer p.helper.Stop()
	if err := p.publish(ctx); err != nil {
		return err
	}
	if err := p.serveHealth(ctx); err != nil {
		return err
	}
	if f.FeaturesEvery > 0 {
		if err := watchFeatures(ctx, p.client, f.NodeName, p.overrides, p.gates, f.FeaturesEvery, p.ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	klog.FromContext(ctx).Info("Shutting down")
	return nil
}

// process is the plugin's process as Run assembles it: each step's
// products, kept for the steps after it.
type process struct {
	f     Config
	start time.Time

	// configure
	cfg       inventory.Config
	overrides features.Overrides
	layouts   map[int]string

	lib    *nvmlgpu.Library
	node   *nvmlgpu.Node
	client kubernetes.Interface
	// restConfig is client's configuration, for the ComputeDomains'
	// client.
	restConfig *rest.Config
	ev         *nodeevents.Recorder
	m          *nodemetrics.Metrics
	gates      features.Set
	store      *checkpoint.Store

	// openSharing: HAMi-core and MPS as they are now, adopted and
	// dropped while the plugin runs (watchSharing).
	sharing *sharing.Set

	inv      *inventory.Inventory
	drv      *dradriver.Driver
	unusable map[string]string
	nodeLock string
	helper   *kubeletplugin.Helper
	want     int // the slices published, for the health check
}

// configure checks the configuration before anything is opened, so that
// a mistyped flag never leaves a half-started plugin on the node.
func (p *process) configure() error {
	f := p.f
	if f.NodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	var err error
	if p.cfg, err = f.Modes.Config(); err != nil {
		return err
	}
	if p.overrides, err = features.ParseOverrides(f.FeatureGates); err != nil {
		return err
	}
	if p.layouts, err = inventory.ParsePerGPU(f.MIGLayouts, "layout", func(s string) (string, error) { return s, nil }); err != nil {
		return fmt.Errorf("--mig-layouts: %w", err)
	}
	if _, err := names.Parse(cmp.Or(f.ComputeDomains, ComputeDomainsAuto), "--compute-domains value", ComputeDomainsAuto, ComputeDomainsOff); err != nil {
		return err
	}
	if err := os.MkdirAll(f.StateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

// openNVML opens the node's NVML: the driver's, or a simulated machine's
// where Config.Machine names one.
func (p *process) openNVML() error {
	f := p.f
	var err error
	if f.Machine != "" {
		// MIG instances outlive the plugin on real GPUs; the simulation
		// keeps them in the state directory so restarts see them too.
		p.lib, err = f.openMachine(f.Machine, filepath.Join(f.StateDir, "simulated-nvml.json"))
	} else {
		p.lib, err = nvmlgpu.OpenDriver(f.containerDriverRoot(), f.NVMLLibrary)
	}
	return err
}

// connect reaches the API server and starts the Node's Event recorder.
// The CDI hook is checked here, before any claim could be prepared with
// a spec whose containers would all fail.
func (p *process) connect(ctx context.Context) error {
	var err error
	if p.restConfig, err = (daemon.Kube{Kubeconfig: p.f.Kubeconfig, QPS: p.f.KubeAPIQPS, Burst: p.f.KubeAPIBurst}).Config(); err != nil {
		return err
	}
	if p.client, err = kubernetes.NewForConfig(p.restConfig); err != nil {
		return err
	}
	if err := checkCDIHook(ctx, p.client, p.f); err != nil {
		return err
	}
	p.ev = nodeevents.New(ctx, p.client, p.f.NodeName)
	return nil
}

// learnFeatures reads which DRA features the cluster enforces: the
// inventory publishes only what they let the scheduler honour.
func (p *process) learnFeatures(ctx context.Context) {
	p.m = nodemetrics.New()
	p.gates = clusterFeatures(ctx, p.client, p.f.NodeName, p.overrides, p.ev)
	p.m.SetFeatures(featureMetrics(p.gates))
	klog.FromContext(ctx).Info("Cluster DRA features: "+p.gates.Describe(), "featureGates", p.gates.String())
	p.ev.Normal(reasonFeatures, p.gates.Describe())
	p.cfg.Features = &p.gates
}

// openSharing looks once for HAMi-core and facet-mps, without waiting for
// either (at most probeTimeout for a facet-mps that hangs): whole GPUs and
// MIG devices need neither, and a mechanism that arrives later is adopted
// by watchSharing. The MPS server's memory is kept out of shares and slots
// wherever MPS is configured, whether facet-mps answers yet or not, so a
// device's size never follows start-up timing.
func (p *process) openSharing(ctx context.Context) error {
	o, err := p.f.sharingOptions()
	if err != nil {
		return err
	}
	p.sharing = sharing.New(o)
	p.sharingChanged(ctx, p.sharing.Refresh(ctx))
	if p.f.MPS.Mode == "auto" {
		// Published, it would be promised twice.
		p.cfg.MPSReserveBytes = sharemem.MPSServerBytes
	}
	return nil
}

// buildInventory builds the node's model and says on the Node what it
// could not offer as configured: an operator reads the fallbacks there,
// not in the plugin's log.
func (p *process) buildInventory(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.cfg.IMEXChannels = p.imexChannels(ctx)
	// The layouts are carved by now: the instances listed are the node's.
	inv, err := nodemodel.Build(p.node, p.cfg, nodemodel.Options{MIG: p.lib})
	if err != nil {
		reason := reasonModeFallback
		if defect := (*inventory.DefectError)(nil); errors.As(err, &defect) {
			reason = reasonAllocatorDefect
		}
		// At once: the plugin exits next, and the broadcaster's queue
		// would go with it.
		if evErr := nodeevents.WarnNow(ctx, p.client.CoreV1(), p.f.NodeName, reason, err.Error()); evErr != nil {
			logger.Error(evErr, "Cannot raise the Node Event")
		}
		return err
	}
	for _, g := range inv.GPUs {
		logger.Info("GPU", "index", g.Index, "uuid", g.UUID, "product", g.ProductName, "mode", g.Mode, "requested", g.ModeRequested, "why", g.ModeNote, "migCapable", g.MIGCapable, "devices", len(g.Devices))
	}
	for _, note := range inv.Notes {
		logger.Info("Mode fallback", "note", note)
		p.ev.Warning(reasonModeFallback, note)
	}
	for _, w := range inv.Warnings {
		logger.Info("Known allocator defect", "warning", w)
		p.ev.Warning(reasonAllocatorDefect, w)
	}
	if c := inv.IMEXChannel; c != nil {
		logger.Info("IMEX channel device", "clique", c.Clique(), "major", c.Major, "channels", c.Count, "channelsFrom", c.CountFrom)
	} else if inv.IMEXNote != "" && p.f.ComputeDomains != ComputeDomainsOff {
		logger.Info("No IMEX channel device", "why", inv.IMEXNote)
		p.ev.Warning(reasonIMEXChannel, inv.IMEXNote)
	}
	logger.Info("Discovered node", "simulated", p.f.Machine != "", "gpus", len(inv.GPUs), "driverVersion", inv.DriverVersion, "cudaDriverVersion", inv.CUDADriverVersion)
	inv.ComputePartitioning = p.sharing.ComputePartitioning()
	p.inv = inv
	return nil
}

// startDriver creates the driver, which restores the checkpointed claims
// before it returns: the GPUs it finds unusable are left out of the
// slices published next.
func (p *process) startDriver(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	f := p.f
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
	editor, err := p.lib.DriverEditor(nvmlgpu.DriverEditorOptions{
		DriverRoot: f.DriverRoot, ContainerDriverRoot: f.ContainerDriverRoot, DevRoot: f.DevRoot, NvidiaCDIHookPath: f.CDIHook,
		ProcRoot: f.procRoot(),
	})
	if err != nil {
		return err
	}
	writer, err := claimcdi.NewWriter(f.CDIDir)
	if err != nil {
		return err
	}
	if f.PodUID != "" {
		p.nodeLock = filepath.Join(f.StateDir, NodeLockFile)
	}
	status := claimstatus.NewWriter(p.client, p.store)
	go status.Run(ctx, 2)
	var domains dradriver.ComputeDomains
	if f.ComputeDomains != ComputeDomainsOff {
		// Lists nothing until the node's first channel claim; at start
		// it only reads the Node's label (dradriver's reconcileLabel).
		lw, err := computedomain.NewListWatch(p.restConfig)
		if err != nil {
			return err
		}
		domains = computedomain.New(ctx, p.client, lw, f.NodeName)
	}
	drv, err := dradriver.New(ctx, dradriver.Options{
		NodeName: f.NodeName, Inventory: p.inv, Store: p.store, CDI: writer, Edits: editor,
		MIG: p.lib, Sharing: p.sharing, DestroyUnownedMIG: f.DestroyUnownedMIG,
		Pods:      podGetter(p.client),
		Failpoint: f.Failpoint, NodeLock: p.nodeLock,
		// Events on claims go through the Node's broadcaster too.
		Metrics: p.m, Events: p.ev.EventRecorder(), Status: status,
		Domains: domains,
	})
	if err != nil {
		return err
	}
	p.drv = drv
	p.m.Registry().MustRegister(&nodemetrics.Collector{GPUs: drv, Health: nodemetrics.HealthFunc(drv.GPUHealth), Checkpoint: p.store, Claims: drv, Usage: nvmlUsage{p.lib}})
	p.unusable = drv.UnusableGPUs()
	for uuid, why := range p.unusable {
		logger.Error(nil, "GPU unusable until the plugin restarts with the problem fixed; it is not published and its claims fail", "gpu", uuid, "why", why)
		p.ev.Warning(reasonGPUUnusable, fmt.Sprintf("GPU %s is not published until the plugin restarts with the problem fixed: %s", uuid, why))
	}
	return nil
}

// startHelper registers the driver with the kubelet, which may call it
// from here on.
func (p *process) startHelper(ctx context.Context) error {
	f := p.f
	pluginDir := filepath.Join(f.PluginsDir, names.Driver)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(names.Driver),
		kubeletplugin.NodeName(f.NodeName),
		kubeletplugin.KubeClient(p.client),
		kubeletplugin.RegistrarDirectoryPath(f.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		// Claims on different GPUs must not wait for each other; the
		// driver serialises per claim and per device itself.
		kubeletplugin.Serialize(false),
	}
	if f.PodUID != "" {
		// The old and the new pod register sockets of their own, and the
		// kubelet may call either; the driver's node lock serialises them
		// (dradriver.Options.NodeLock), not the helper's, which would also
		// serialise claims on different GPUs.
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(f.PodUID)))
		klog.FromContext(ctx).Info("Rolling updates enabled", "podUID", f.PodUID, "nodeLock", p.nodeLock)
	}
	helper, err := kubeletplugin.Start(ctx, p.drv, opts...)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	p.helper = helper
	return nil
}

// publish publishes the ResourceSlices, with the GPU faults recorded
// before this start, and keeps them current (GPU health, MIG use,
// recovery requests) until ctx ends.
func (p *process) publish(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	f := p.f
	var uuids []string
	for _, g := range p.inv.GPUs {
		uuids = append(uuids, g.UUID)
	}
	mon, opened, err := gpuhealth.Open(gpuhealth.Options{
		Path: filepath.Join(f.StateDir, "gpu-faults.json"), BootID: p.drv.BootID(),
		GPUs: uuids, QuietPeriod: f.HealthQuiet,
	})
	if err != nil {
		return fmt.Errorf("GPU fault record: %w", err)
	}
	pub := publisher.New(publisher.Options{
		Sink: p.helper, Inventory: p.inv, Unusable: p.unusable, Gates: p.gates, Node: f.NodeName,
		Faults: p.drv, Monitor: mon, Metrics: p.m, MIGUse: p.drv,
		Partitioning: p.sharing.ComputePartitioning,
	})
	if p.want, err = pub.Publish(ctx); err != nil {
		return err
	}
	health := gpuhealth.NewWatch(gpuhealth.WatchOptions{
		Monitor: mon, Inventory: p.inv, Unusable: p.unusable, Node: f.NodeName,
		Tainted: p.gates.Has(features.DeviceTaints), Events: p.ev,
		Changed: func(ctx context.Context) {
			if _, err := pub.Publish(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Republishing after a health change failed; the helper retries on its next sync")
			}
		},
	})
	for uuid, ft := range mon.Faults() {
		logger.Error(nil, "GPU unhealthy since before this start", "gpu", uuid, "fault", ft.String())
	}
	for _, c := range opened {
		health.Changed(ctx, c)
	}
	go pub.WatchMIGUse(ctx, p.drv.MIGUseChanges())
	go p.watchSharing(ctx, func(ctx context.Context) {
		if _, err := pub.Publish(ctx); err != nil {
			logger.Error(err, "Republishing after a sharing mechanism came or went failed; the helper retries on its next sync")
		}
	})
	if f.HealthProbe > 0 {
		go health.WatchNVML(ctx, p.lib, f.HealthProbe)
		go health.WatchRecoverRequests(ctx, p.client, p.lib)
	}
	go reportPublished(ctx, p.client, f.NodeName, p.want, p.start)
	return nil
}

// serveHealth serves the liveness and readiness checks and the metrics,
// where Config.HealthAddr asks: ready means registered with the kubelet
// and all slices published.
func (p *process) serveHealth(ctx context.Context) error {
	f := p.f
	if f.HealthAddr == "" {
		return nil
	}
	reg, dra := probes.Sockets(f.RegistrarDir, f.PluginsDir, f.PodUID)
	return probes.Serve(ctx, f.HealthAddr, &probes.Checker{
		RegistrarSocket: reg, DRASocket: dra,
		Registered:      p.helper.RegistrationStatus,
		SlicesPublished: probes.SlicesPublished(p.client, f.NodeName, p.want),
		Timeout:         5 * time.Second,
		Metrics:         p.m.Handler(),
	})
}

// procRoot is where the driver's proc files (MIG capabilities, IMEX
// channels) are read: the node's /proc, which shows the host driver's
// files in a container too; a simulated node has them in its driver root.
func (f Config) procRoot() string {
	if f.Machine != "" {
		return filepath.Join(f.containerDriverRoot(), "proc")
	}
	return nvmlgpu.DefaultProcRoot
}

// imexChannels reads the driver's IMEX channels, unless compute domains
// are off. One that cannot be read leaves the node without the channel
// device, which a Warning Event on the Node explains: GPUs are served
// all the same.
func (p *process) imexChannels(ctx context.Context) *nvmlgpu.IMEXChannels {
	if p.f.ComputeDomains == ComputeDomainsOff {
		return nil
	}
	c, err := nvmlgpu.ReadIMEXChannels(p.f.procRoot())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot read the driver's IMEX channels; no IMEX channel device is published")
		p.ev.Warning(reasonIMEXChannel, "no IMEX channel device: "+err.Error())
		return nil
	}
	return c
}

// containerDriverRoot is where this process reads the driver root.
func (f Config) containerDriverRoot() string {
	return cmp.Or(f.ContainerDriverRoot, f.DriverRoot)
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

func (f Config) openMachine(path, stateFile string) (*nvmlgpu.Library, error) {
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

// nvmlUsage reads a GPU's usage for the plugin's /metrics (nvmlgpu.Usage):
// one handle lookup and a few reads per GPU per scrape.
type nvmlUsage struct{ lib *nvmlgpu.Library }

func (n nvmlUsage) GPUUsage(uuid string) (nodemetrics.GPUUsage, error) {
	u, err := n.lib.Usage(uuid)
	if err != nil {
		return nodemetrics.GPUUsage{}, err
	}
	out := nodemetrics.GPUUsage{UtilizationPercent: u.UtilizationPercent, MemoryUsedBytes: u.MemoryUsedBytes}
	for _, m := range u.MIG {
		if out.MIG == nil {
			out.MIG = map[int]int64{}
		}
		out.MIG[m.GIID] = m.MemoryUsedBytes
	}
	return out, nil
}
