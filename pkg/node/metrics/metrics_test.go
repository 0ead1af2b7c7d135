package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type gpus []GPU

func (g gpus) GPUState() []GPU     { return g }
func (g gpus) PreparedClaims() int { return 3 }

type ckpt struct {
	bytes   int64
	records int
	err     error
}

func (c ckpt) Usage() (int64, int, error) { return c.bytes, c.records, c.err }

// TestCollector checks the per-GPU and checkpoint values a scrape reads.
func TestCollector(t *testing.T) {
	src := gpus{
		{Index: 0, UUID: "GPU-a", Product: "H100", Mode: "mig", MemoryBytes: 80 << 30, AllocatedMemoryBytes: 20 << 30, AllocatedComputePercent: 28,
			MIGInUse: map[string]int{"1g.10gb": 2}},
		{Index: 1, UUID: "GPU-b", Product: "H100", Mode: "shared", MemoryBytes: 80 << 30, AllocatedMemoryBytes: 2 << 30, AllocatedComputePercent: 20},
	}
	for _, tc := range []struct {
		name   string
		health map[string]string
		ckpt   ckpt
		metric string
		want   string
	}{
		{
			name: "allocation", metric: "facet_gpu_allocated_memory_bytes", ckpt: ckpt{},
			want: `
# HELP facet_gpu_allocated_memory_bytes Memory of the GPU that prepared claims hold: all of it for a whole GPU, each MIG instance's, each vGPU share's limit.
# TYPE facet_gpu_allocated_memory_bytes gauge
facet_gpu_allocated_memory_bytes{gpu="0",product="H100",uuid="GPU-a"} 2.147483648e+10
facet_gpu_allocated_memory_bytes{gpu="1",product="H100",uuid="GPU-b"} 2.147483648e+09
`,
		},
		{
			name: "MIG instances and mode", metric: "facet_gpu_mig_instances_in_use",
			want: `
# HELP facet_gpu_mig_instances_in_use Prepared MIG instances on the GPU, by profile.
# TYPE facet_gpu_mig_instances_in_use gauge
facet_gpu_mig_instances_in_use{gpu="0",product="H100",profile="1g.10gb",uuid="GPU-a"} 2
`,
		},
		{
			name: "health", metric: "facet_gpu_healthy", health: map[string]string{"GPU-b": "XID 79"},
			want: `
# HELP facet_gpu_healthy 1 if the GPU is healthy, 0 if not.
# TYPE facet_gpu_healthy gauge
facet_gpu_healthy{gpu="0",product="H100",uuid="GPU-a"} 1
facet_gpu_healthy{gpu="1",product="H100",uuid="GPU-b"} 0
`,
		},
		{
			name: "checkpoint", metric: "facet_checkpoint_size_bytes", ckpt: ckpt{bytes: 1234, records: 2},
			want: `
# HELP facet_checkpoint_size_bytes Total size of the prepared-claims checkpoint's records.
# TYPE facet_checkpoint_size_bytes gauge
facet_checkpoint_size_bytes 1234
`,
		},
		{
			name: "prepared claims", metric: "facet_prepared_claims",
			want: `
# HELP facet_prepared_claims ResourceClaims holding devices on this node (prepared, or being prepared).
# TYPE facet_prepared_claims gauge
facet_prepared_claims 3
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Collector{GPUs: src, Health: HealthFunc(func() map[string]string { return tc.health }), Checkpoint: tc.ckpt}
			if err := testutil.CollectAndCompare(c, strings.NewReader(tc.want), tc.metric); err != nil {
				t.Error(err)
			}
		})
	}
	t.Run("unreadable checkpoint fails the scrape", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(&Collector{Checkpoint: ckpt{err: errors.New("permission denied")}})
		if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("Gather() = %v, want the checkpoint's error", err)
		}
	})
}

// TestMetricsServed checks the pushed metrics through the HTTP handler, as
// Prometheus sees them.
func TestMetricsServed(t *testing.T) {
	m := New()
	m.Registry().MustRegister(&Collector{GPUs: gpus{{Index: 0, UUID: "GPU-a", Product: "H100", Mode: "exclusive"}}})
	m.ObservePrepare("mig", 1500*time.Millisecond, nil)
	m.ObservePrepare("mig", 10*time.Millisecond, errors.New("boom"))
	m.ObserveUnprepare("gpu", 2*time.Millisecond, nil)
	m.SetPublished(2, 17)
	m.SetFeatures(map[string]bool{"DRAPartitionableDevices": true, "DRADeviceTaints": false})
	var nilMetrics *Metrics // records nothing, and does not panic
	nilMetrics.ObservePrepare("gpu", time.Second, errors.New("x"))
	nilMetrics.SetPublished(1, 1)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`facet_prepare_duration_seconds_count{kind="mig"} 2`,
		`facet_prepare_duration_seconds_sum{kind="mig"} 1.51`,
		`facet_prepare_duration_seconds_bucket{kind="mig",le="2.048"} 2`,
		`facet_prepare_duration_seconds_bucket{kind="mig",le="1.024"} 1`,
		`facet_prepare_errors_total{kind="mig"} 1`,
		`facet_unprepare_duration_seconds_count{kind="gpu"} 1`,
		`facet_resource_slices_published 2`,
		`facet_devices_published 17`,
		`facet_cluster_feature_enabled{feature="DRAPartitionableDevices"} 1`,
		`facet_cluster_feature_enabled{feature="DRADeviceTaints"} 0`,
		`facet_gpu_mode{gpu="0",mode="exclusive",product="H100",uuid="GPU-a"} 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(string(body), want+"\n") && !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), `facet_unprepare_errors_total{kind="gpu"}`) {
		t.Error("a successful unprepare counted as an error")
	}
	if problems, err := testutil.GatherAndLint(m.Registry()); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %+v", err, problems)
	}
}
