package nodemetrics

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

type claims struct {
	c []Claim
	u []ClaimUsage
}

func (c claims) ClaimState() ([]Claim, []ClaimUsage) { return c.c, c.u }

// TestClaimSeries: each prepared device gives an info series per pod of
// its claim with the GPU's and GPU instance's identity in dcgm-exporter's
// label names, and its memory and compute; each claim its memory and
// compute in use, summed over its devices from NVML (whole GPUs, MIG
// devices) and its HAMi-core region (shares, slots), and absent where a
// device's figure is unknown. Nothing is left of a claim that is gone.
func TestClaimSeries(t *testing.T) {
	src := claims{
		c: []Claim{
			{Namespace: "ml", Name: "train", Device: "gpu-2", GPUIndex: 2, GPUUUID: "GPU-c", GIID: -1, Shape: "whole", Compute: "none", MemoryBytes: 80 << 30, ComputePercent: 100, Pods: []string{"train-0", "train-1"}},
			{Namespace: "ml", Name: "infer", Device: "gpu-0-mig-1g10gb-6", GPUIndex: 0, GPUUUID: "GPU-a", GIID: 13, Profile: "1g.10gb", MIGUUID: "MIG-x", Shape: "mig", Compute: "mig", MemoryBytes: 9984 << 20, ComputePercent: 14, Pods: []string{"infer"}},
			{Namespace: "nb", Name: "lab", Device: "gpu-1", GPUIndex: 1, GPUUUID: "GPU-b", GIID: -1, Shape: "share", Compute: "time-sliced", MemoryBytes: 2000 << 20, ComputePercent: 20},
			{Namespace: "nb", Name: "mps", Device: "gpu-1-share-1", GPUIndex: 1, GPUUUID: "GPU-b", GIID: -1, Shape: "share", Compute: "mps", MemoryBytes: 2000 << 20, ComputePercent: 20},
			{Namespace: "nb", Name: "fresh", Device: "gpu-1-share-2", GPUIndex: 1, GPUUUID: "GPU-b", GIID: -1, Shape: "slot", Compute: "none", MemoryBytes: 2000 << 20},
			// A whole GPU and a share: its share's region has no
			// compute, so neither has the claim.
			{Namespace: "ml", Name: "pair", Device: "gpu-3", GPUIndex: 3, GPUUUID: "GPU-d", GIID: -1, Shape: "whole", Compute: "none", MemoryBytes: 80 << 30, ComputePercent: 100},
			{Namespace: "ml", Name: "pair", Device: "gpu-1-share-3", GPUIndex: 1, GPUUUID: "GPU-b", GIID: -1, Shape: "share", Compute: "mps", MemoryBytes: 1 << 30, ComputePercent: 10},
			// On a GPU NVML cannot read.
			{Namespace: "ml", Name: "lost", Device: "gpu-4", GPUIndex: 4, GPUUUID: "GPU-e", GIID: -1, Shape: "whole", Compute: "none", MemoryBytes: 80 << 30, ComputePercent: 100},
		},
		u: []ClaimUsage{
			{Namespace: "nb", Name: "lab", UsedBytes: 1500 << 20, ComputeUsedPercent: 23},
			{Namespace: "nb", Name: "mps", UsedBytes: 100 << 20, ComputeUsedPercent: -1},
			{Namespace: "ml", Name: "pair", UsedBytes: 1 << 30, ComputeUsedPercent: -1},
		},
	}
	c := &Collector{
		GPUs: gpus{{Index: 0, UUID: "GPU-a", Mode: "mig"}, {Index: 1, UUID: "GPU-b", Mode: "shared"}, {Index: 2, UUID: "GPU-c"}, {Index: 3, UUID: "GPU-d"}, {Index: 4, UUID: "GPU-e"}},
		Usage: usage{
			"GPU-a": {UtilizationPercent: -1, MemoryUsedBytes: 5 << 30, MIG: map[int]int64{13: 1 << 30, 5: 4 << 30}},
			"GPU-b": {UtilizationPercent: 40, MemoryUsedBytes: 3 << 30},
			"GPU-c": {UtilizationPercent: 87, MemoryUsedBytes: 60 << 30},
			"GPU-d": {UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
		},
		Claims: src,
	}
	for metric, want := range map[string]string{
		"facet_claim_info": `
# HELP facet_claim_info 1 for each device a prepared ResourceClaim holds on this node and each pod the claim is reserved for (pod "" when none is recorded), with the GPU's and the GPU instance's identity in dcgm-exporter's label names.
# TYPE facet_claim_info gauge
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-b",claim="fresh",compute="none",device="gpu-1-share-2",gpu="1",mig_uuid="",namespace="nb",pod="",shape="slot"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-b",claim="lab",compute="time-sliced",device="gpu-1",gpu="1",mig_uuid="",namespace="nb",pod="",shape="share"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-b",claim="mps",compute="mps",device="gpu-1-share-1",gpu="1",mig_uuid="",namespace="nb",pod="",shape="share"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-b",claim="pair",compute="mps",device="gpu-1-share-3",gpu="1",mig_uuid="",namespace="ml",pod="",shape="share"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-c",claim="train",compute="none",device="gpu-2",gpu="2",mig_uuid="",namespace="ml",pod="train-0",shape="whole"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-c",claim="train",compute="none",device="gpu-2",gpu="2",mig_uuid="",namespace="ml",pod="train-1",shape="whole"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-d",claim="pair",compute="none",device="gpu-3",gpu="3",mig_uuid="",namespace="ml",pod="",shape="whole"} 1
facet_claim_info{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-e",claim="lost",compute="none",device="gpu-4",gpu="4",mig_uuid="",namespace="ml",pod="",shape="whole"} 1
facet_claim_info{GPU_I_ID="13",GPU_I_PROFILE="1g.10gb",UUID="GPU-a",claim="infer",compute="mig",device="gpu-0-mig-1g10gb-6",gpu="0",mig_uuid="MIG-x",namespace="ml",pod="infer",shape="mig"} 1
`,
		"facet_claim_memory_bytes": `
# HELP facet_claim_memory_bytes GPU memory the claim's device holds: the whole GPU's, the MIG instance's, the vGPU share's or slot's limit.
# TYPE facet_claim_memory_bytes gauge
facet_claim_memory_bytes{claim="fresh",device="gpu-1-share-2",namespace="nb"} 2.097152e+09
facet_claim_memory_bytes{claim="infer",device="gpu-0-mig-1g10gb-6",namespace="ml"} 1.0468982784e+10
facet_claim_memory_bytes{claim="lab",device="gpu-1",namespace="nb"} 2.097152e+09
facet_claim_memory_bytes{claim="lost",device="gpu-4",namespace="ml"} 8.589934592e+10
facet_claim_memory_bytes{claim="mps",device="gpu-1-share-1",namespace="nb"} 2.097152e+09
facet_claim_memory_bytes{claim="pair",device="gpu-1-share-3",namespace="ml"} 1.073741824e+09
facet_claim_memory_bytes{claim="pair",device="gpu-3",namespace="ml"} 8.589934592e+10
facet_claim_memory_bytes{claim="train",device="gpu-2",namespace="ml"} 8.589934592e+10
`,
		"facet_claim_memory_used_bytes": `
# HELP facet_claim_memory_used_bytes GPU memory in use on the claim's devices, summed over them: on a whole GPU NVML's memory used of the GPU (memory info v2, the driver's reserve left out), on a MIG device NVML's of the MIG device, on vGPU shares and slots what HAMi-core charges the claim's processes against their limits (its accounting region). Absent while a device's figure is unknown: a share before its first process, a GPU NVML cannot read.
# TYPE facet_claim_memory_used_bytes gauge
facet_claim_memory_used_bytes{claim="infer",namespace="ml"} 1.073741824e+09
facet_claim_memory_used_bytes{claim="lab",namespace="nb"} 1.572864e+09
facet_claim_memory_used_bytes{claim="mps",namespace="nb"} 1.048576e+08
facet_claim_memory_used_bytes{claim="pair",namespace="ml"} 3.221225472e+09
facet_claim_memory_used_bytes{claim="train",namespace="ml"} 6.442450944e+10
`,
		"facet_claim_compute_used_percent": `
# HELP facet_claim_compute_used_percent Compute in use on the claim's devices, in percent of one GPU, summed over them: on a whole GPU NVML's utilization (percent of the last sample period a kernel ran), on vGPU shares and slots the processes' SM utilization (NVML's per-process samples, as HAMi-core's utilization watcher records them). Absent for MIG devices (NVML reports no utilization in MIG mode: use DCGM's profiling metrics by GPU_I_ID), for MPS shares (no SM limit, so no watcher), and while a figure is unknown.
# TYPE facet_claim_compute_used_percent gauge
facet_claim_compute_used_percent{claim="lab",namespace="nb"} 23
facet_claim_compute_used_percent{claim="train",namespace="ml"} 87
`,
	} {
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), metric); err != nil {
			t.Errorf("%s: %v", metric, err)
		}
	}
	if n := testutil.CollectAndCount(&Collector{Claims: claims{}}, "facet_claim_info", "facet_claim_memory_bytes", "facet_claim_compute_percent", "facet_claim_memory_used_bytes", "facet_claim_compute_used_percent"); n != 0 {
		t.Errorf("%d claim series with no claim prepared", n)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %+v", err, problems)
	}
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

type usage map[string]GPUUsage

func (u usage) GPUUsage(uuid string) (GPUUsage, error) {
	if g, ok := u[uuid]; ok {
		return g, nil
	}
	return GPUUsage{}, errors.New("NVML: not found")
}

// TestUsageSeries: each GPU's utilization and memory in use, and each MIG
// device's memory by GPU_I_ID, where NVML reports them; nothing for a
// figure NVML does not report (-1) nor for a GPU it cannot read.
func TestUsageSeries(t *testing.T) {
	src := gpus{{Index: 0, UUID: "GPU-a", Product: "H100", Mode: "mig"}, {Index: 1, UUID: "GPU-b", Product: "H100", Mode: "exclusive"}, {Index: 2, UUID: "GPU-c", Product: "H100", Mode: "exclusive"}}
	c := &Collector{GPUs: src, Usage: usage{
		"GPU-a": {UtilizationPercent: -1, MemoryUsedBytes: 5 << 30, MIG: map[int]int64{13: 1 << 30, 5: 4 << 30}},
		"GPU-b": {UtilizationPercent: 87, MemoryUsedBytes: 60 << 30},
	}}
	for metric, want := range map[string]string{
		"facet_gpu_utilization_percent": `
# HELP facet_gpu_utilization_percent Percent of NVML's last sample period in which a kernel ran on the GPU (nvmlDeviceGetUtilizationRates); absent where NVML reports none (MIG mode on). For nodes without dcgm-exporter.
# TYPE facet_gpu_utilization_percent gauge
facet_gpu_utilization_percent{gpu="1",product="H100",uuid="GPU-b"} 87
`,
		"facet_mig_memory_used_bytes": `
# HELP facet_mig_memory_used_bytes A MIG device's framebuffer in use (NVML memory info on the MIG device), by GPU instance ID (GPU_I_ID, dcgm-exporter's label). For nodes without dcgm-exporter.
# TYPE facet_mig_memory_used_bytes gauge
facet_mig_memory_used_bytes{GPU_I_ID="13",gpu="0",product="H100",uuid="GPU-a"} 1.073741824e+09
facet_mig_memory_used_bytes{GPU_I_ID="5",gpu="0",product="H100",uuid="GPU-a"} 4.294967296e+09
`,
	} {
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), metric); err != nil {
			t.Errorf("%s: %v", metric, err)
		}
	}
	if n := testutil.CollectAndCount(c, "facet_gpu_memory_used_bytes"); n != 2 {
		t.Errorf("%d facet_gpu_memory_used_bytes series, want 2 (GPU-c is not readable)", n)
	}
}
