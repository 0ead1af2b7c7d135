package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/node/claimstatus"
)

// metricsBody is the plugin's /metrics as served.
func (p *plugin) metricsBody(t testing.TB) []byte {
	t.Helper()
	m := healthAddrRE.FindStringSubmatch(p.logText())
	if m == nil {
		t.Fatal("no health address in the plugin's log")
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// scrape reads the plugin's /metrics.
func (p *plugin) scrape(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(p.metricsBody(t)))
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// logClaimSeries logs the plugin's per-claim series as served: the record
// of what a scrape shows while claims are prepared.
func (p *plugin) logClaimSeries(t *testing.T) {
	t.Helper()
	body := p.metricsBody(t)
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "facet_claim_") {
			lines = append(lines, l)
		}
	}
	t.Logf("per-claim series:\n%s", strings.Join(lines, "\n"))
}

// value is the value of the family's sample whose labels include want;
// ok is false when there is none. A histogram's value is its count.
func value(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// expectMetric waits until a scrape shows the value (the scrape-time
// values follow prepare at once; waiting covers the kubelet's timing).
func (p *plugin) expectMetric(t *testing.T, name string, labels map[string]string, want float64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s%v = %g", name, labels, want), 30*time.Second, func() (bool, error) {
		got, ok := value(p.scrape(t), name, labels)
		return ok && got == want, fmt.Errorf("%s%v = %g (present: %v)", name, labels, got, ok)
	})
}

// facetStatus waits for the claim's status.devices to hold Facet's entries
// for each of its allocated devices, and returns their data.
func facetStatus(t *testing.T, claimName string) (*resourceapi.ResourceClaim, []claimstatus.Data) {
	t.Helper()
	var claim *resourceapi.ResourceClaim
	var data []claimstatus.Data
	waitFor(t, "status.devices of claim "+claimName, 30*time.Second, func() (bool, error) {
		var err error
		claim, err = e.client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), claimName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		data = nil
		for _, r := range claim.Status.Allocation.Devices.Results {
			found := false
			for _, s := range claim.Status.Devices {
				if s.Driver != driverName || s.Pool != r.Pool || s.Device != r.Device || (r.ShareID == nil) != (s.ShareID == nil) ||
					(r.ShareID != nil && string(*r.ShareID) != *s.ShareID) {
					continue
				}
				var d claimstatus.Data
				if s.Data == nil {
					return false, fmt.Errorf("entry %s without data", s.Device)
				}
				if err := json.Unmarshal(s.Data.Raw, &d); err != nil {
					return false, err
				}
				data, found = append(data, d), true
			}
			if !found {
				return false, fmt.Errorf("no entry for %s in %+v", r.Device, claim.Status.Devices)
			}
		}
		return true, nil
	})
	return claim, data
}

// sliceUUID is the uuid attribute of a published device.
func sliceUUID(t *testing.T, device string) (uuid string, index int64) {
	t.Helper()
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return *d.Attributes["uuid"].StringValue, *d.Attributes["index"].IntValue
			}
		}
	}
	t.Fatalf("device %s is not published", device)
	return "", 0
}

// TestObservability: after whole-GPU, MIG and vGPU-share pods run, the
// plugin's /metrics shows what they hold and the claims' status.devices say
// what each device is; a claim with a bad opaque config gets a Warning
// Event on the claim and its pod naming the field. MIG and shares need the
// gated cluster; the whole GPU and the Event run on stock 1.35 too.
func TestObservability(t *testing.T) {
	setupNamespace(t)
	gated := len(e.gates.Missing(features.PartitionableDevices, features.ConsumableCapacity)) == 0
	var p *plugin
	if gated {
		p = startPlugin(t, "dgx-h100", demoModes...)
	} else {
		p = startPlugin(t, "dgx-h100")
	}
	deleteNamespaceAtEnd(t)

	t.Run("published slices and cluster features", func(t *testing.T) {
		// Read together, and again until they agree: the plugin is ready
		// once its pool has as many slices as it wants, which the slices
		// of the test before can also have while its ResourceSlice
		// controller still rewrites them (seen on 1.37.2: 104 of 108
		// devices for the first read).
		waitFor(t, "the published slices and devices as the plugin counts them", time.Minute, func() (bool, error) {
			slices := ourSlices(t)
			devices := 0
			for _, s := range slices {
				devices += len(s.Spec.Devices)
			}
			f := p.scrape(t)
			gotSlices, _ := value(f, "facet_resource_slices_published", nil)
			gotDevices, _ := value(f, "facet_devices_published", nil)
			return gotSlices == float64(len(slices)) && gotDevices == float64(devices),
				fmt.Errorf("the plugin says %g slices, %g devices; the API server holds %d, %d", gotSlices, gotDevices, len(slices), devices)
		})
		for _, g := range features.Gates {
			want := 0.0
			if e.gates.Enabled[g] {
				want = 1
			}
			p.expectMetric(t, "facet_cluster_feature_enabled", map[string]string{"feature": string(g)}, want)
		}
		for i := range 8 {
			p.expectMetric(t, "facet_gpu_healthy", map[string]string{"gpu": strconv.Itoa(i)}, 1)
		}
	})

	t.Run("whole GPU", func(t *testing.T) {
		applyYAML(t, claimPod("obs-whole", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 3 && device.attributes["gpu.facet.dev"].type == "gpu"'}}]}}`))
		pod := waitPodRunning(t, "obs-whole")
		claim := podClaims(t, pod)["req"]
		claim, data := facetStatus(t, claim.Name)
		r := claim.Status.Allocation.Devices.Results[0]
		uuid, index := sliceUUID(t, r.Device)
		if len(data) != 1 || data[0] != (claimstatus.Data{Kind: "gpu", GPUUUID: uuid}) {
			t.Errorf("status.devices data %+v, want a whole GPU %s", data, uuid)
		}
		gpu := map[string]string{"gpu": strconv.FormatInt(index, 10), "uuid": uuid}
		families := p.scrape(t)
		memory, ok := value(families, "facet_gpu_memory_bytes", gpu)
		if !ok || memory < 1<<30 {
			t.Fatalf("facet_gpu_memory_bytes%v = %g, %v", gpu, memory, ok)
		}
		p.expectMetric(t, "facet_gpu_allocated_memory_bytes", gpu, memory)
		p.expectMetric(t, "facet_gpu_allocated_compute_percent", gpu, 100)
		// Used, from NVML: the simulated GPU is idle.
		p.expectMetric(t, "facet_gpu_utilization_percent", gpu, 0)
		p.expectMetric(t, "facet_gpu_memory_used_bytes", gpu, 0)
		if n, ok := value(families, "facet_prepare_duration_seconds", map[string]string{"kind": "gpu"}); !ok || n < 1 {
			t.Errorf("prepare latency of whole GPUs: %g observations", n)
		}
		if n, _ := value(families, "facet_prepared_claims", nil); n < 1 {
			t.Errorf("facet_prepared_claims = %g", n)
		}
		if n, _ := value(families, "facet_checkpoint_records", nil); n < 1 {
			t.Errorf("facet_checkpoint_records = %g", n)
		}
		if b, _ := value(families, "facet_checkpoint_size_bytes", nil); b < 100 {
			t.Errorf("facet_checkpoint_size_bytes = %g", b)
		}
		own := map[string]string{"namespace": namespace, "claim": claim.Name, "device": r.Device}
		p.expectMetric(t, "facet_claim_info", withLabels(own, "pod", "obs-whole", "UUID", uuid, "GPU_I_ID", "", "shape", "whole", "compute", "none"), 1)
		p.expectMetric(t, "facet_claim_memory_bytes", own, memory)
		// In use: the GPU's own NVML figures, the claim holding it whole.
		used := map[string]string{"namespace": namespace, "claim": claim.Name}
		p.expectMetric(t, "facet_claim_memory_used_bytes", used, 0)
		p.expectMetric(t, "facet_claim_compute_used_percent", used, 0)
		p.logClaimSeries(t)
		kubectl(t, "delete", "pod", "-n", namespace, "obs-whole", "--wait=true", "--timeout=120s")
		p.expectMetric(t, "facet_gpu_allocated_memory_bytes", gpu, 0)
		p.expectGone(t, "facet_claim_info", own)
		p.expectGone(t, "facet_claim_memory_used_bytes", used)
		p.expectGone(t, "facet_claim_compute_used_percent", used)
		p.expectMetric(t, "facet_unprepare_duration_seconds", map[string]string{"kind": "gpu"}, 1)
	})

	t.Run("MIG device", func(t *testing.T) {
		needGates(t, features.PartitionableDevices)
		kubectl(t, "apply", "-f", e.repo+"/demo/mig/one-1g10gb.yaml")
		pod := waitPodRunning(t, "one-1g10gb")
		claim := podClaims(t, pod)["gpu"]
		if claim == nil {
			for _, c := range podClaims(t, pod) {
				claim = c
			}
		}
		claim, data := facetStatus(t, claim.Name)
		r := claim.Status.Allocation.Devices.Results[0]
		if len(data) != 1 {
			t.Fatalf("status.devices data %+v", data)
		}
		d := data[0]
		env := envOf(execIn(t, "one-1g10gb", "", "env"))
		if d.Kind != "mig" || d.Profile != "1g.10gb" || d.MIGUUID == "" || d.MIGUUID != env["FACET_GPU_UUIDS"] || d.Placement == nil || d.Placement.Size != 1 ||
			d.GPUInstanceID == nil || d.ComputeInstanceID == nil || !strings.HasPrefix(d.GPUUUID, "GPU-") {
			t.Errorf("status.devices data %+v; container sees %s", d, env["FACET_GPU_UUIDS"])
		}
		if !strings.Contains(r.Device, "-mig-1g10gb-") {
			t.Errorf("allocated %s", r.Device)
		}
		gpu := map[string]string{"uuid": d.GPUUUID}
		p.expectMetric(t, "facet_gpu_mig_instances_in_use", map[string]string{"uuid": d.GPUUUID, "profile": "1g.10gb"}, 1)
		if n, ok := value(p.scrape(t), "facet_gpu_allocated_memory_bytes", gpu); !ok || n < 9<<30 || n > 11<<30 {
			t.Errorf("allocated memory of a 1g.10gb: %g", n)
		}
		p.expectMetric(t, "facet_gpu_mode", map[string]string{"uuid": d.GPUUUID, "mode": "mig"}, 1)
		p.expectMetric(t, "facet_prepare_duration_seconds", map[string]string{"kind": "mig"}, 1)
		own := map[string]string{"namespace": namespace, "claim": claim.Name, "device": r.Device}
		p.expectMetric(t, "facet_claim_info", withLabels(own, "pod", "one-1g10gb", "UUID", d.GPUUUID, "GPU_I_ID", strconv.Itoa(*d.GPUInstanceID), "GPU_I_PROFILE", "1g.10gb", "mig_uuid", d.MIGUUID, "shape", "mig"), 1)
		// In use: the MIG device's NVML memory figure; no compute
		// figure, NVML reporting none in MIG mode.
		used := map[string]string{"namespace": namespace, "claim": claim.Name}
		migUsed, ok := value(p.scrape(t), "facet_mig_memory_used_bytes", map[string]string{"uuid": d.GPUUUID, "GPU_I_ID": strconv.Itoa(*d.GPUInstanceID)})
		if !ok {
			t.Fatalf("no facet_mig_memory_used_bytes for GI %d", *d.GPUInstanceID)
		}
		p.expectMetric(t, "facet_claim_memory_used_bytes", used, migUsed)
		p.logClaimSeries(t)
		if _, ok := value(p.scrape(t), "facet_claim_compute_used_percent", used); ok {
			t.Error("a MIG device's claim has a compute-used figure; NVML reports none in MIG mode")
		}
		kubectl(t, "delete", "pod", "-n", namespace, "one-1g10gb", "--wait=true", "--timeout=120s")
		p.expectGone(t, "facet_claim_info", own)
		p.expectGone(t, "facet_claim_memory_used_bytes", used)
		waitFor(t, "MIG gauge gone", 30*time.Second, func() (bool, error) {
			_, ok := value(p.scrape(t), "facet_gpu_mig_instances_in_use", map[string]string{"uuid": d.GPUUUID})
			return !ok, nil
		})
	})

	t.Run("vGPU share", func(t *testing.T) {
		needGates(t, features.ConsumableCapacity)
		kubectl(t, "apply", "-f", e.repo+"/demo/vgpu/volcano-share.yaml")
		pod := waitPodRunning(t, "volcano-share")
		claim := podClaims(t, pod)["vgpu"]
		claim, data := facetStatus(t, claim.Name)
		r := claim.Status.Allocation.Devices.Results[0]
		uuid, _ := sliceUUID(t, r.Device)
		enforced, mem, cores := true, int64(2000<<20), int64(20)
		if r.ShareID == nil || len(data) != 1 ||
			// volcano-share runs as UID 1000: an MPS client.
			data[0] != (claimstatus.Data{Kind: "share", GPUUUID: uuid, MemoryLimitBytes: data[0].MemoryLimitBytes, ComputeLimitPercent: data[0].ComputeLimitPercent, Enforced: data[0].Enforced, ComputePartitioning: "mps"}) ||
			data[0].MemoryLimitBytes == nil || *data[0].MemoryLimitBytes != mem || *data[0].ComputeLimitPercent != cores || *data[0].Enforced != enforced {
			t.Errorf("status.devices data %+v (shareID %v)", data, r.ShareID)
		}
		gpu := map[string]string{"uuid": uuid}
		p.expectMetric(t, "facet_gpu_allocated_memory_bytes", gpu, float64(mem))
		p.expectMetric(t, "facet_gpu_allocated_compute_percent", gpu, float64(cores))
		p.expectMetric(t, "facet_gpu_mode", map[string]string{"uuid": uuid, "mode": "shared"}, 1)
		p.expectMetric(t, "facet_prepare_duration_seconds", map[string]string{"kind": "share"}, 1)
		own := map[string]string{"namespace": namespace, "claim": claim.Name, "device": r.Device}
		p.expectMetric(t, "facet_claim_info", withLabels(own, "pod", "volcano-share", "UUID", uuid, "shape", "share", "compute", "mps"), 1)
		p.expectMetric(t, "facet_claim_memory_bytes", own, float64(mem))
		p.expectMetric(t, "facet_claim_compute_percent", own, float64(cores))
		used := map[string]string{"namespace": namespace, "claim": claim.Name}
		if smLimit := writeRegion(t, "volcano-share"); smLimit != 0 {
			t.Errorf("an MPS share has an SM limit for HAMi-core (%d %%): MPS partitions its SMs", smLimit)
		}
		p.expectMetric(t, "facet_claim_memory_used_bytes", used, 1<<30)
		p.logClaimSeries(t)
		// No SM limit, so no HAMi-core utilization watcher: no figure.
		if _, ok := value(p.scrape(t), "facet_claim_compute_used_percent", used); ok {
			t.Error("an MPS share has a compute-used figure; HAMi-core's watcher does not run there")
		}
		kubectl(t, "delete", "pod", "-n", namespace, "volcano-share", "--wait=true", "--timeout=120s")
		p.expectGone(t, "facet_claim_memory_used_bytes", used)
		p.expectGone(t, "facet_claim_info", own)
	})

	t.Run("time-sliced vGPU share", func(t *testing.T) {
		needGates(t, features.ConsumableCapacity)
		applyYAML(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: obs-sliced, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - name: vgpu
        exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 2000Mi, cores: "30"}}}
      config:
      - opaque:
          driver: gpu.facet.dev
          parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, partitioning: time-sliced}
---
`+testenv.ClaimPod("obs-sliced", "facet-demo", "vgpu", "obs-sliced"))
		pod := waitPodRunning(t, "obs-sliced")
		claim := podClaims(t, pod)["vgpu"]
		used := map[string]string{"namespace": namespace, "claim": claim.Name}
		p.expectMetric(t, "facet_claim_info", map[string]string{"namespace": namespace, "claim": claim.Name, "pod": "obs-sliced", "shape": "share", "compute": "time-sliced"}, 1)
		if smLimit := writeRegion(t, "obs-sliced"); smLimit != 30 {
			t.Errorf("a time-sliced share of 30 cores gives HAMi-core an SM limit of %d %%", smLimit)
		}
		p.expectMetric(t, "facet_claim_memory_used_bytes", used, 1<<30)
		p.expectMetric(t, "facet_claim_compute_used_percent", used, 17)
		p.logClaimSeries(t)
		kubectl(t, "delete", "pod", "-n", namespace, "obs-sliced", "--wait=true", "--timeout=120s")
		p.expectGone(t, "facet_claim_compute_used_percent", used)
	})

	t.Cleanup(func() {
		// What the plugin measured, for the record.
		f := p.scrape(t)["facet_prepare_duration_seconds"]
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() > 0 {
				t.Logf("prepare latency %v: %d prepares, mean %.1f ms", m.GetLabel(), h.GetSampleCount(), 1000*h.GetSampleSum()/float64(h.GetSampleCount()))
			}
		}
	})

	t.Run("a bad opaque config raises an Event on the claim and its pod", func(t *testing.T) {
		applyYAML(t, `
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: obs-bad, namespace: facet-demo}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 2 && device.attributes["gpu.facet.dev"].type == "gpu"'}}]}}
      config:
      - opaque:
          driver: gpu.facet.dev
          parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: GpuConfig, bogusField: 1}
---
`+testenv.ClaimPod("obs-bad", "facet-demo", "req", "obs-bad"))
		var claimName string
		waitFor(t, "obs-bad's claim", time.Minute, func() (bool, error) {
			pod, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), "obs-bad", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, s := range pod.Status.ResourceClaimStatuses {
				if s.ResourceClaimName != nil {
					claimName = *s.ResourceClaimName
				}
			}
			return claimName != "", nil
		})
		for _, obj := range []struct{ kind, name string }{{"ResourceClaim", claimName}, {"Pod", "obs-bad"}} {
			waitFor(t, "FacetPrepareFailed on "+obj.kind+" "+obj.name, 2*time.Minute, func() (bool, error) {
				evs, err := e.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + obj.name})
				if err != nil {
					return false, err
				}
				var seen []string
				for _, ev := range evs.Items {
					if ev.Reason == "FacetPrepareFailed" && ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.Kind == obj.kind &&
						strings.Contains(ev.Message, `GpuConfig: strict decoding error: unknown field "bogusField"`) {
						t.Logf("%s %s: %s %s (count %d): %s", obj.kind, obj.name, ev.Type, ev.Reason, ev.Count, ev.Message)
						return true, nil
					}
					seen = append(seen, ev.Reason+": "+ev.Message)
				}
				return false, fmt.Errorf("events %q", seen)
			})
		}
		// The kubelet retries the prepare: at least one error.
		if n, _ := value(p.scrape(t), "facet_prepare_errors_total", map[string]string{"kind": "gpu"}); n < 1 {
			t.Errorf("facet_prepare_errors_total{kind=gpu} = %g", n)
		}
		claim, err := e.client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(claim.Status.Devices) != 0 {
			t.Errorf("a claim that failed to prepare has status.devices %+v", claim.Status.Devices)
		}
		kubectl(t, "delete", "pod", "-n", namespace, "obs-bad", "--wait=true", "--timeout=120s")
	})
}

// writeRegion writes, inside pod, what HAMi-core records in its claim's
// accounting region for one process: the region at its full size (2008952
// bytes, as HAMi-core's ftruncate leaves it), initialized (format 1), one
// device, one live process slot holding 1 GiB on it (pkg/node/hami's
// offsets, checked against HAMi-core's C struct there), its host PID (4242)
// and 17 % SM utilization as HAMi-core's utilization watcher writes them,
// and the device's SM limit as HAMi-core copies it from the environment
// (CUDA_DEVICE_SM_LIMIT_0, else CUDA_DEVICE_SM_LIMIT; 0 without one); the
// flag last, as HAMi-core sets it. It returns that SM limit.
func writeRegion(t *testing.T, pod string) int {
	t.Helper()
	env := envOf(execIn(t, pod, "", "env"))
	limit := env["CUDA_DEVICE_SM_LIMIT_0"]
	if limit == "" {
		limit = env["CUDA_DEVICE_SM_LIMIT"]
	}
	smLimit, _ := strconv.Atoi(limit)
	execIn(t, pod, "", fmt.Sprintf(`f="$CUDA_DEVICE_MEMORY_SHARED_CACHE"
at() { printf "$2" | dd of="$f" bs=1 seek="$1" conv=notrunc 2>/dev/null; }
at 2008948 '\000\000\000\000'
at 4 '\001\000\000\000'; at 56 '\001'; at 2008896 '\001\000\000\000'; at 3784 '\001'; at 1896 '\000\000\000\100'
at 1860 '\222\020'; at 3032 '\021'; at 1728 '\%03o'
at 0 '\116\367\057\001'`, smLimit))
	return smLimit
}

// withLabels is base plus the label pairs kv.
func withLabels(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// expectGone waits until no sample of name has the labels want: a claim's
// series go when it is unprepared.
func (p *plugin) expectGone(t *testing.T, name string, want map[string]string) {
	t.Helper()
	waitFor(t, name+" gone", time.Minute, func() (bool, error) {
		_, ok := value(p.scrape(t), name, want)
		return !ok, nil
	})
}
