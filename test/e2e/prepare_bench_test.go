package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// draClient talks to the plugin's socket exactly as the kubelet does.
func draClient(b testing.TB) drapb.DRAPluginClient {
	sock := filepath.Join(e.kubeletRoot, "plugins", driverName, "dra.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// allocatedClaim creates a claim in the API server whose status says the
// scheduler allocated it devices of this node, as the kubelet would find it.
func allocatedClaim(b testing.TB, name string, devices ...string) *drapb.Claim {
	return allocatedShare(b, name, nil, devices...)
}

// allocatedShare is allocatedClaim for vGPU shares consuming share.
func allocatedShare(b testing.TB, name string, share map[resourceapi.QualifiedName]resource.Quantity, devices ...string) *drapb.Claim {
	ctx := context.Background()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.facet.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices))},
		}}}},
	}
	c, err := e.client.ResourceV1().ResourceClaims(namespace).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driverName, Pool: nodeName, Device: d}
		if share != nil {
			id := uuid.NewUUID()
			r.ShareID, r.ConsumedCapacity = &id, share
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, r)
	}
	if c, err = e.client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

func prepare(b testing.TB, client drapb.DRAPluginClient, claims ...*drapb.Claim) time.Duration {
	start := time.Now()
	resp, err := client.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: claims})
	d := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" || len(r.Devices) == 0 {
			b.Fatalf("claim %s: %q %v", uid, r.Error, r.Devices)
		}
	}
	return d
}

func unprepare(b testing.TB, client drapb.DRAPluginClient, claims ...*drapb.Claim) {
	resp, err := client.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	if err != nil {
		b.Fatal(err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			b.Fatalf("unprepare %s: %s", uid, r.Error)
		}
	}
}

// benchRig is the plugin under benchmark: its socket's client and its
// process, whose CPU time the concurrent cases read.
type benchRig struct {
	client drapb.DRAPluginClient
	pid    int
}

func setupBench(b *testing.B) benchRig {
	needGates(b, features.PartitionableDevices, features.ConsumableCapacity)
	kubectl(b, "apply", "-f", filepath.Join(e.repo, "deployments", "deviceclasses.yaml"))
	kubectl(b, "apply", "-f", filepath.Join(e.repo, "demo", "gpu", "namespace.yaml"))
	b.Cleanup(func() { _, _ = kubectlErr("delete", "resourceclaims", "-n", namespace, "--all", "--wait=false") })
	p := startPlugin(b, "dgx-h100", demoModes...)
	waitModes(b, demoMode)
	client := draClient(b)
	waitFor(b, "plugin socket", time.Minute, func() (bool, error) {
		_, err := client.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{})
		return err == nil, err
	})
	return benchRig{client: client, pid: p.cmd.Process.Pid}
}

// cpuMillis is a process's user and system CPU time so far, in
// milliseconds (/proc/<pid>/stat, clock ticks of 10 ms).
func cpuMillis(b testing.TB, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) may hold spaces; fields 14 and 15 count
	// from after its closing parenthesis.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %v %v", pid, err1, err2)
	}
	return (utime + stime) * 10
}

// apiserverPID is the local node's kube-apiserver (hack/cluster/up.sh).
func apiserverPID(b testing.TB) int {
	data, err := os.ReadFile(filepath.Join(e.runDir, "pids", "kube-apiserver.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		b.Fatal(err)
	}
	return pid
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkNodePrepareResources measures the kubelet's view of prepare for
// one whole GPU: gRPC, the helper's GET of the claim, the checkpoint's two
// fsynced writes and the CDI spec. Each iteration prepares then unprepares
// (unprepare is not timed).
func BenchmarkNodePrepareResources(b *testing.B) {
	rig := setupBench(b)
	client := rig.client
	b.Run("whole-gpu", func(b *testing.B) {
		claim := allocatedClaim(b, "bench-one", "gpu-3")
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			lat = append(lat, prepare(b, client, claim))
			unprepare(b, client, claim)
		}
		reportLatency(b, lat)
	})
	volcano := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("2000Mi"), "cores": resource.MustParse("10")}
	// A vGPU share: HAMi-core edits and a fresh accounting region too.
	b.Run("vgpu-share", func(b *testing.B) {
		claim := allocatedShare(b, "bench-share", volcano, "gpu-4")
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			lat = append(lat, prepare(b, client, claim))
			unprepare(b, client, claim)
		}
		reportLatency(b, lat)
	})
	// The kubelet sends one request per pod, and pods start in parallel:
	// 8 concurrent requests of one claim each.
	b.Run("8-concurrent-whole-gpus", func(b *testing.B) {
		var claims []*drapb.Claim
		for i := range 4 {
			claims = append(claims, allocatedClaim(b, fmt.Sprintf("bench-par-%d", i), fmt.Sprintf("gpu-%d", i)))
		}
		for i := 4; i < 8; i++ {
			claims = append(claims, allocatedShare(b, fmt.Sprintf("bench-par-%d", i), nil, fmt.Sprintf("gpu-%d", i)))
		}
		concurrentPrepare(b, rig, claims)
	})
	b.Run("8-concurrent-shares", func(b *testing.B) {
		var claims []*drapb.Claim
		for i := range 8 {
			claims = append(claims, allocatedShare(b, fmt.Sprintf("bench-shares-%d", i), volcano, fmt.Sprintf("gpu-%d", 4+i%4)))
		}
		concurrentPrepare(b, rig, claims)
	})
	// Many pods starting at once: 4 whole GPUs and 60 small shares of the
	// other 4, one gRPC call each. This is where the checkpoint's group
	// commit pays: their writes share fdatasyncs.
	small := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1000Mi"), "cores": resource.MustParse("5")}
	b.Run("64-concurrent-mixed", func(b *testing.B) {
		var claims []*drapb.Claim
		for i := range 4 {
			claims = append(claims, allocatedClaim(b, fmt.Sprintf("bench-mixed-%d", i), fmt.Sprintf("gpu-%d", i)))
		}
		for i := 4; i < 64; i++ {
			claims = append(claims, allocatedShare(b, fmt.Sprintf("bench-mixed-%d", i), small, fmt.Sprintf("gpu-%d", 4+i%4)))
		}
		concurrentPrepare(b, rig, claims)
	})
}

// concurrentPrepare prepares claims in parallel, one gRPC call each, and
// reports claims per second, the per-call latency, and the CPU time per
// claim of the plugin and of the kube-apiserver (the helper GETs each
// claim, and the plugin applies its status.devices): on a machine shared
// with the control plane, those bound claims/s, and they hold still where
// claims/s moves with the load.
func concurrentPrepare(b *testing.B, rig benchRig, claims []*drapb.Claim) {
	client := rig.client
	api := apiserverPID(b)
	var lat []time.Duration
	var mu sync.Mutex
	var wall time.Duration
	var pluginCPU, apiCPU float64
	n := 0
	for b.Loop() {
		p0, a0 := cpuMillis(b, rig.pid), cpuMillis(b, api)
		round := time.Now()
		var wg sync.WaitGroup
		for _, c := range claims {
			wg.Go(func() {
				d := prepare(b, client, c)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			})
		}
		wg.Wait()
		wall += time.Since(round)
		n += len(claims)
		pluginCPU += cpuMillis(b, rig.pid) - p0
		apiCPU += cpuMillis(b, api) - a0
		b.StopTimer()
		unprepare(b, client, claims...)
		b.StartTimer()
	}
	b.ReportMetric(float64(n)/wall.Seconds(), "claims/s")
	b.ReportMetric(pluginCPU/float64(n), "plugin-cpu-ms/claim")
	b.ReportMetric(apiCPU/float64(n), "apiserver-cpu-ms/claim")
	reportLatency(b, lat)
}

// vmRSS reads a process's resident set size in MiB from /proc.
func vmRSS(b testing.TB, pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		b.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return float64(kb) / 1024
}

var sinceStartRE = regexp.MustCompile(`"ResourceSlices published" slices=\d+ sinceStart="([^"]+)"`)

// BenchmarkPluginFootprint measures the plugin on an 8×H100 node (the
// demo's modes): its RSS once ready and after preparing and unpreparing
// 100 claims, and its start-to-slices time (the "ResourceSlices
// published" log line). One iteration is one plugin start.
func BenchmarkPluginFootprint(b *testing.B) {
	needGates(b, features.PartitionableDevices, features.ConsumableCapacity)
	kubectl(b, "apply", "-f", filepath.Join(e.repo, "deployments", "deviceclasses.yaml"))
	kubectl(b, "apply", "-f", filepath.Join(e.repo, "demo", "gpu", "namespace.yaml"))
	b.Cleanup(func() { _, _ = kubectlErr("delete", "resourceclaims", "-n", namespace, "--all", "--wait=false") })
	small := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1000Mi"), "cores": resource.MustParse("1")}
	var claims []*drapb.Claim
	for i := range 100 {
		claims = append(claims, allocatedShare(b, fmt.Sprintf("bench-rss-%d", i), small, fmt.Sprintf("gpu-%d", 4+i%4)))
	}
	var start, after, toSlices float64
	n := 0
	for b.Loop() {
		p := startPlugin(b, "dgx-h100", demoModes...)
		waitModes(b, demoMode)
		client := draClient(b)
		m := sinceStartRE.FindStringSubmatch(p.logText())
		if m == nil {
			b.Fatalf("no \"ResourceSlices published\" in the log:\n%s", p.logText())
		}
		d, err := time.ParseDuration(m[1])
		if err != nil {
			b.Fatal(err)
		}
		toSlices += float64(d.Milliseconds())
		// Settle: the informers' initial lists are done by /readyz.
		time.Sleep(2 * time.Second)
		start += vmRSS(b, p.cmd.Process.Pid)
		for i := 0; i < len(claims); i += 10 {
			prepare(b, client, claims[i:i+10]...)
		}
		unprepare(b, client, claims...)
		time.Sleep(2 * time.Second)
		after += vmRSS(b, p.cmd.Process.Pid)
		n++
		b.StopTimer()
		p.stop()
		b.StartTimer()
	}
	b.ReportMetric(start/float64(n), "rss-ready-MiB")
	b.ReportMetric(after/float64(n), "rss-100claims-MiB")
	b.ReportMetric(toSlices/float64(n), "start-to-slices-ms")
	b.ReportMetric(0, "ns/op")
}
