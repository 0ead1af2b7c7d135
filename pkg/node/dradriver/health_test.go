package dradriver

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
)

// TestUnitFaults: a fatal fault refuses new and re-prepared claims on its
// GPU alone; a recoverable one refuses nothing already allocated.
func TestUnitFaults(t *testing.T) {
	t.Parallel()
	u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeExclusive})
	g1, g2 := u.inv.GPUs[1].UUID, u.inv.GPUs[2].UUID
	before := claim("before", "gpu-1")
	if err := u.prepare(before)[before.UID].Err; err != nil {
		t.Fatal(err)
	}
	u.d.SetFaults(map[string]gpuhealth.Fault{
		g1: {GPU: g1, Reason: "xid-79", Detail: "XID 79", Fatal: true},
		g2: {GPU: g2, Reason: "nvml-query-failed", Detail: "NVML query failed"},
	})
	for _, tc := range []struct {
		name, device string
		wantErr      string
	}{
		{"fatal fault", "gpu-1", "GPU " + g1 + " is unhealthy: XID 79"},
		{"recoverable fault", "gpu-2", ""},
		{"healthy GPU", "gpu-3", ""},
	} {
		c := claim(strings.ReplaceAll(tc.name, " ", "-"), tc.device)
		err := u.prepare(c)[c.UID].Err
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: prepare error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
	// Re-prepare (a pod restart) of a claim on the failed GPU is refused
	// too; its unprepare still works, so the kubelet can free it.
	if err := u.prepare(before)[before.UID].Err; err == nil {
		t.Error("re-prepare on a GPU with a fatal fault succeeded")
	}
	if err := u.unprepare(before.UID)[before.UID]; err != nil {
		t.Errorf("unprepare on a failed GPU: %v", err)
	}
	if h := u.d.GPUHealth(); len(h) != 2 || !strings.Contains(h[g1], "xid-79") {
		t.Errorf("GPUHealth: %v", h)
	}
	u.d.SetFaults(nil)
	c := claim("after", "gpu-1")
	if err := u.prepare(c)[c.UID].Err; err != nil {
		t.Errorf("prepare after recovery: %v", err)
	}
}

// healthStream is the kubelet's end of NodeWatchResources.
type healthStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *drahealthv1alpha1.NodeWatchResourcesResponse
}

func (s *healthStream) Context() context.Context     { return s.ctx }
func (s *healthStream) SetHeader(metadata.MD) error  { return nil }
func (s *healthStream) SendHeader(metadata.MD) error { return nil }
func (s *healthStream) SetTrailer(metadata.MD)       {}
func (s *healthStream) Send(r *drahealthv1alpha1.NodeWatchResourcesResponse) error {
	// A stream the test no longer reads ends with its context, as a
	// gRPC stream does.
	select {
	case s.sent <- r:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// TestUnitNodeWatchResources: the kubelet gets every device at once and
// again on each health change, a faulted GPU's devices UNHEALTHY.
func TestUnitNodeWatchResources(t *testing.T) {
	t.Parallel()
	u := newUnit(t, inventory.Config{DefaultMode: inventory.ModeMIG})
	ctx, cancel := context.WithCancel(context.Background())
	s := &healthStream{ctx: ctx, sent: make(chan *drahealthv1alpha1.NodeWatchResourcesResponse, 4)}
	done := make(chan error, 1)
	go func() { done <- u.d.NodeWatchResources(&drahealthv1alpha1.NodeWatchResourcesRequest{}, s) }()
	// The stream ends with the test, however the test ends.
	ended := false
	defer func() {
		if !ended {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("NodeWatchResources: %v", err)
			}
		}
	}()
	next := func() map[string]drahealthv1alpha1.HealthStatus {
		t.Helper()
		select {
		case r := <-s.sent:
			out := map[string]drahealthv1alpha1.HealthStatus{}
			for _, d := range r.Devices {
				if d.Device.PoolName != node || d.HealthCheckTimeoutSeconds <= 0 {
					t.Errorf("device %v", d)
				}
				out[d.Device.DeviceName] = d.Health
			}
			return out
		case <-time.After(2 * time.Minute):
			// Only turns a hang into a failure.
			t.Fatal("no health update")
			return nil
		}
	}
	total := 0
	for _, g := range u.inv.GPUs {
		total += len(g.Devices)
	}
	first := next()
	if len(first) != total {
		t.Fatalf("%d devices reported, the inventory has %d", len(first), total)
	}
	for name, h := range first {
		if h != drahealthv1alpha1.HealthStatus_HEALTHY {
			t.Errorf("%s: %v before any fault", name, h)
		}
	}
	sick := u.inv.GPUs[5]
	u.d.SetFaults(map[string]gpuhealth.Fault{sick.UUID: {GPU: sick.UUID, Reason: "ecc-dbe", Fatal: true}})
	second := next()
	for _, g := range u.inv.GPUs {
		want := drahealthv1alpha1.HealthStatus_HEALTHY
		if g == sick {
			want = drahealthv1alpha1.HealthStatus_UNHEALTHY
		}
		for _, d := range g.Devices {
			if second[d.Name] != want {
				t.Errorf("%s (GPU %d): %v, want %v", d.Name, g.Index, second[d.Name], want)
			}
		}
	}
	cancel()
	ended = true
	if err := <-done; err != nil {
		t.Errorf("NodeWatchResources: %v", err)
	}
}
