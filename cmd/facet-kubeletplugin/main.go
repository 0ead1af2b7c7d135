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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cdi"
	"github.com/facet-gpu/facet/pkg/checkpoint"
	"github.com/facet-gpu/facet/pkg/driver"
	"github.com/facet-gpu/facet/pkg/hami"
	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/nvml"
	"github.com/facet-gpu/facet/pkg/slices"
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
}

func main() {
	var f flags
	fs := flag.NewFlagSet("facet-kubeletplugin", flag.ExitOnError)
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name: the pool's name (env NODE_NAME)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration")
	fs.StringVar(&f.machine, "machine", "", "simulate the node described by this machine file instead of loading NVML")
	fs.StringVar(&f.nvmlLib, "nvml-library", "", "path of libnvidia-ml.so.1 (default: the loader's search path)")
	fs.StringVar(&f.driverRoot, "driver-root", "/", "host path of the NVIDIA driver's files (/run/nvidia/driver with the GPU Operator)")
	fs.StringVar(&f.devRoot, "dev-root", "", "host path whose dev/ holds the NVIDIA device nodes (default: --driver-root)")
	fs.StringVar(&f.cdiHook, "nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook", "host path of nvidia-cdi-hook, referenced by the CDI specs' hooks")
	fs.StringVar(&f.cdiDir, "cdi-dir", "/var/run/cdi", "CDI spec directory the container runtime reads")
	fs.StringVar(&f.stateDir, "state-dir", "/var/lib/facet", "directory of the prepared-claims checkpoint")
	fs.StringVar(&f.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory")
	fs.StringVar(&f.pluginsDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet's plugins directory; the socket goes in <dir>/"+inventory.DriverName)
	// client-go's default (5 QPS) throttles the helper's GET of every
	// claim in NodePrepareResources to 200 ms once a burst is used up.
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", 50, "queries per second to the API server")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", 100, "burst of queries to the API server")
	fs.StringVar(&f.hamiLibrary, "hami-library", "", "host path of HAMi-core's libvgpu.so, which enforces vGPU shares (installed by the DaemonSet's init container); without it, claims for enforced shares fail")
	fs.BoolVar(&f.destroyUnownedMIG, "destroy-unowned-mig", false, "at start, destroy MIG instances on managed GPUs that no prepared claim owns (default: only report them)")
	f.modes.Register(fs)
	klog.InitFlags(fs)
	fs.Parse(os.Args[1:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := run(ctx, f); err != nil {
		klog.FromContext(ctx).Error(err, "facet-kubeletplugin failed")
		klog.Flush()
		os.Exit(1)
	}
}

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
	if err := os.MkdirAll(f.stateDir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var lib *nvml.Library
	if f.machine != "" {
		// MIG instances outlive the plugin on real GPUs; the simulation
		// keeps them in the state directory so restarts see them too.
		lib, err = nvml.OpenMachine(f.machine, nvml.WithStateFile(filepath.Join(f.stateDir, "simulated-nvml.json")))
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
	inv, err := inventory.Build(node, cfg)
	if err != nil {
		return err
	}
	for _, g := range inv.GPUs {
		logger.Info("GPU", "index", g.Index, "uuid", g.UUID, "product", g.ProductName, "mode", g.Mode, "requested", g.ModeRequested, "why", g.ModeNote, "migCapable", g.MIGCapable, "devices", len(g.Devices))
	}
	for _, g := range inv.GPUs {
		if g.ModeRequested == inventory.ModeAuto {
			logger.Info("Default mode (auto): mig on MIG-capable GPUs, exclusive on the others. " +
				"Not dynamic: on Kubernetes 1.35 a shareable device that consumes counters meets allocator bugs " +
				"kubernetes#139034 (a MIG instance double-booked beside a vGPU share) and kubernetes#140436 (a pod that fits stays Pending); " +
				"set --mode or --gpu-modes to choose")
			break
		}
	}
	for _, note := range inv.Notes {
		logger.Info("Mode fallback", "note", note)
	}
	logger.Info("Discovered node", "simulated", f.machine != "", "gpus", len(inv.GPUs), "driverVersion", inv.DriverVersion, "cudaDriverVersion", inv.CUDADriverVersion)

	if f.machine != "" {
		// nvcdi reads MIG capability minors from the fixed path
		// /proc/driver/nvidia-caps; a simulated node binds its own table
		// there, in the private mount namespace the plugin must then run
		// in (unshare --mount --propagation private). Refused on a host
		// with a real driver or in the host's mount namespace.
		if err := nvml.BindSimulatedProcDriver(f.driverRoot); err != nil {
			logger.Error(err, "MIG devices cannot get CDI edits on this simulated node; MIG claims will fail to prepare")
		}
	}
	vgpu, hamiErr := openHAMi(f.hamiLibrary, filepath.Join(f.stateDir, "vgpu"))
	if hamiErr != nil {
		logger.Error(hamiErr, "vGPU shares that need enforcement will fail to prepare; everything else is served")
	}
	editor, err := lib.DriverEditor(nvml.DriverEditorOptions{DriverRoot: f.driverRoot, DevRoot: f.devRoot, NvidiaCDIHookPath: f.cdiHook})
	if err != nil {
		return err
	}
	store, err := checkpoint.Open(filepath.Join(f.stateDir, "claims"))
	if err != nil {
		return err
	}
	writer, err := cdi.NewWriter(f.cdiDir)
	if err != nil {
		return err
	}
	drv, err := driver.New(ctx, driver.Options{
		NodeName: f.nodeName, Inventory: inv, Store: store, CDI: writer, Edits: editor,
		MIG: lib, HAMi: vgpu, HAMiUnavailable: hamiErr, DestroyUnownedMIG: f.destroyUnownedMIG,
		Failpoint: failpoint(ctx),
	})
	if err != nil {
		return err
	}
	for uuid, why := range drv.UnusableGPUs() {
		logger.Error(nil, "GPU unusable until the plugin restarts with the problem fixed; its claims fail", "gpu", uuid, "why", why)
	}

	client, err := kubeClient(f.kubeconfig, f.kubeAPIQPS, f.kubeAPIBurst)
	if err != nil {
		return err
	}
	pluginDir := filepath.Join(f.pluginsDir, inventory.DriverName)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, drv,
		kubeletplugin.DriverName(inventory.DriverName),
		kubeletplugin.NodeName(f.nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(f.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		// Claims on different GPUs must not wait for each other; the
		// driver serialises per claim and per device itself.
		kubeletplugin.Serialize(false),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()

	res := slices.Resources(inv, f.nodeName)
	if err := helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	want := len(res.Pools[f.nodeName].Slices)
	go reportPublished(ctx, client, f.nodeName, want, start)

	<-ctx.Done()
	logger.Info("Shutting down")
	return nil
}

// reportPublished logs when the API server holds all of this node's slices,
// the plugin's time-to-ready as a scheduler sees it.
func reportPublished(ctx context.Context, client kubernetes.Interface, node string, want int, start time.Time) {
	sel := fields.Set{"spec.driver": inventory.DriverName, "spec.nodeName": node}.AsSelector().String()
	for ctx.Err() == nil {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(list.Items) >= want {
			klog.FromContext(ctx).Info("ResourceSlices published", "slices", len(list.Items), "sinceStart", time.Since(start).Round(time.Millisecond))
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
