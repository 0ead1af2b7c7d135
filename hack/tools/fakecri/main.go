// Command fakecri serves k8s.io/cri-client's in-memory fake CRI runtime on a
// unix socket, so a real kubelet can run pods without containerd.
//
// It is used by hack/cluster/up.sh (RUNTIME=fake). Containers never run: the
// fake only records them. What matters to Facet's fast end-to-end tests is
// which CDI devices the kubelet asked the runtime for, so every
// CreateContainer request is appended to a JSON-lines log (--cdi-log):
//
//	{"time":"...","namespace":"default","pod":"p","podUID":"...","container":"c",
//	 "sandboxID":"...","cdiDevices":["gpu.facet.dev/gpu=gpu-0"],"annotations":{...}}
//
// Facts it relies on (docs/design/local-cluster.md):
//   - the fake image size must be non-zero, or the kubelet reports ImageInspectError;
//   - the image filesystem must report a mountpoint that exists;
//   - images named with imagePullPolicy: Never must be preloaded.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// Labels the kubelet puts on every container config (pkg/kubelet/types/labels.go).
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// cdiRecord is one line of the --cdi-log file.
type cdiRecord struct {
	Time        string            `json:"time"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUID"`
	Container   string            `json:"container"`
	SandboxID   string            `json:"sandboxID"`
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
}

// runtime wraps the fake so CreateContainer can be logged; every other CRI
// call goes straight to the embedded fake.
type runtime struct {
	*fake.RemoteRuntime

	mu     sync.Mutex
	cdiLog *os.File
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	if err := r.logCreate(req); err != nil {
		// Losing a record would make tests assert on wrong data: fail the call
		// loudly instead, the kubelet will retry and the log shows why.
		log.Printf("writing CDI log: %v", err)
		return nil, fmt.Errorf("fakecri: writing CDI log: %w", err)
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func (r *runtime) logCreate(req *runtimeapi.CreateContainerRequest) error {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	rec := cdiRecord{
		Time:        time.Now().UTC().Format(time.RFC3339Nano),
		Namespace:   labels[labelPodNamespace],
		Pod:         labels[labelPodName],
		PodUID:      labels[labelPodUID],
		Container:   labels[labelContainerName],
		SandboxID:   req.GetPodSandboxId(),
		CDIDevices:  []string{},
		Annotations: cfg.GetAnnotations(),
	}
	if rec.Container == "" {
		rec.Container = cfg.GetMetadata().GetName()
	}
	if rec.Annotations == nil {
		rec.Annotations = map[string]string{}
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	log.Printf("CreateContainer %s/%s/%s cdiDevices=%v", rec.Namespace, rec.Pod, rec.Container, rec.CDIDevices)
	if r.cdiLog == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.cdiLog.Write(append(line, '\n')); err != nil {
		return err
	}
	return r.cdiLog.Sync()
}

func main() {
	var (
		socket    = flag.String("socket", "/run/facet/fakecri.sock", "unix socket to serve the CRI on")
		cdiLog    = flag.String("cdi-log", "", "append one JSON line per CreateContainer (CDI devices, annotations) to this file")
		imageFS   = flag.String("image-fs", "/", "existing directory reported as the image filesystem mountpoint")
		images    = flag.String("images", "facet.local/busybox:1,registry.k8s.io/pause:3.10", "comma-separated images to preload (for imagePullPolicy: Never)")
		imageSize = flag.Uint64("image-size", 1<<20, "size in bytes reported for every image (must be > 0)")
	)
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	if *imageSize == 0 {
		log.Fatal("--image-size must be > 0: the kubelet reports ImageInspectError for size 0")
	}
	if st, err := os.Stat(*imageFS); err != nil || !st.IsDir() {
		log.Fatalf("--image-fs %q must be an existing directory (kubelet stats it): %v", *imageFS, err)
	}

	fr := fake.NewFakeRemoteRuntime()
	fr.ImageService.SetFakeImageSize(*imageSize)
	var preload []string
	for _, img := range strings.Split(*images, ",") {
		if img = strings.TrimSpace(img); img != "" {
			preload = append(preload, img)
		}
	}
	fr.ImageService.SetFakeImages(preload)
	now := time.Now().UnixNano()
	fsUsage := func() []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{
			Timestamp:  now,
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: *imageFS},
			UsedBytes:  &runtimeapi.UInt64Value{Value: *imageSize * uint64(len(preload))},
			InodesUsed: &runtimeapi.UInt64Value{Value: uint64(len(preload))},
		}}
	}
	fr.ImageService.SetFakeFilesystemUsage(fsUsage())
	fr.ImageService.SetFakeContainerFilesystemUsage(fsUsage())
	fr.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	// The kubelet asks the runtime for its cgroup driver; match the kubelet config.
	fr.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}

	rt := &runtime{RemoteRuntime: fr}
	if *cdiLog != "" {
		if err := os.MkdirAll(filepath.Dir(*cdiLog), 0o755); err != nil {
			log.Fatal(err)
		}
		f, err := os.OpenFile(*cdiLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		rt.cdiLog = f
	}

	// fake.RemoteRuntime.Start registers the fake itself on its own gRPC
	// server; we need our CreateContainer, so we serve the wrapper instead.
	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
	lis, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", *socket, err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	runtimeapi.RegisterImageServiceServer(srv, rt)

	// The fakes record every call in an unbounded Called slice; clear it now
	// and then so a long-running demo does not grow without limit.
	go func() {
		for range time.Tick(time.Minute) {
			fr.RuntimeService.Lock()
			fr.RuntimeService.Called = nil
			fr.RuntimeService.Unlock()
			fr.ImageService.Lock()
			fr.ImageService.Called = nil
			fr.ImageService.Unlock()
		}
	}()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.Stop()
	}()

	log.Printf("fake CRI serving on %s (images %v, image fs %s, cdi log %q)", *socket, preload, *imageFS, *cdiLog)
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(*socket)
}
