// Package nodemetrics is the kubelet plugin's Prometheus metrics, on a registry
// of its own (never the global one, so nothing a library registers there
// leaks into Facet's /metrics).
//
// It uses prometheus/client_golang directly rather than
// k8s.io/component-base/metrics: the latter adds stability levels and a
// process-wide legacy registry meant for Kubernetes' own components, and
// an out-of-tree driver gains nothing from either.
//
// Names follow the Kubernetes instrumentation conventions (sig-instrumentation
// metric-instrumentation.md): prefix facet_, snake_case, base units
// (_seconds, _bytes), counters end in _total. docs/operations.md lists them.
//
// Latencies, errors and what was published are pushed by the plugin as they
// happen (Metrics' methods). Per-GPU values and the checkpoint are read when
// Prometheus scrapes, through Collector over the narrow interfaces below, so
// they are never stale and cost nothing between scrapes.
package nodemetrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "facet"

// KindUnknown labels a prepare that failed before its devices were known
// (an unallocated claim, a device not in the inventory).
const KindUnknown = "unknown"

// KindMixed labels a claim whose devices are of several kinds.
const KindMixed = "mixed"

// Metrics holds the plugin's metrics. A nil *Metrics records nothing, so
// code paths that run without metrics (tests) need no checks.
type Metrics struct {
	reg *prometheus.Registry

	prepareSeconds, unprepareSeconds *prometheus.HistogramVec
	prepareErrors, unprepareErrors   *prometheus.CounterVec

	slices, devices prometheus.Gauge
	feature         *prometheus.GaugeVec
	mechanism       *prometheus.GaugeVec
}

// New registers the plugin's metrics, the Go runtime's and the process's on
// a fresh registry.
func New() *Metrics {
	// Prepare is milliseconds for a whole GPU and seconds for a MIG
	// instance on real hardware (carving takes 1-3 s), hence buckets
	// from 1 ms to about 33 s.
	buckets := prometheus.ExponentialBuckets(0.001, 2, 16)
	m := &Metrics{
		reg:              prometheus.NewRegistry(),
		prepareSeconds:   histogramVec("prepare_duration_seconds", "Time to prepare one ResourceClaim (NodePrepareResources), by device kind, failures included.", buckets, []string{"kind"}),
		unprepareSeconds: histogramVec("unprepare_duration_seconds", "Time to unprepare one ResourceClaim (NodeUnprepareResources), by device kind, failures included.", buckets, []string{"kind"}),
		prepareErrors:    counterVec("prepare_errors_total", "ResourceClaim prepares that failed, by device kind. The kubelet retries, so one claim may count many times.", []string{"kind"}),
		unprepareErrors:  counterVec("unprepare_errors_total", "ResourceClaim unprepares that failed, by device kind.", []string{"kind"}),
		slices:           gauge("resource_slices_published", "ResourceSlices this node's plugin publishes."),
		devices:          gauge("devices_published", "Devices in this node's published ResourceSlices."),
		feature:          gaugeVec("cluster_feature_enabled", "Whether the cluster enforces a DRA feature gate, as detected (or set by --feature-gates) at start: 1 on, 0 off.", []string{"feature"}),
		mechanism:        gaugeVec("sharing_mechanism_available", "Whether a sharing mechanism of vGPU shares and slots is available now: mechanism hami-core (memory limits) or mps (SM partitions; 0: shares and slots are published as time-sliced). 1 available, 0 not.", []string{"mechanism"}),
	}
	m.reg.MustRegister(m.prepareSeconds, m.unprepareSeconds, m.prepareErrors, m.unprepareErrors,
		m.slices, m.devices, m.feature, m.mechanism,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// The metrics' constructors, each named facet_<name>.

func histogramVec(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

func counterVec(name, help string, labels []string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
}

func gaugeVec(name, help string, labels []string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
}

// gaugeBool is a yes or no as a gauge's 1 or 0.
func gaugeBool(on bool) float64 {
	if on {
		return 1
	}
	return 0
}

// Registry is where the metrics are registered, for Collector and tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in Prometheus' exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetMechanism records whether a sharing mechanism (sharing.Mechanism's
// words: hami-core, mps) is available now.
func (m *Metrics) SetMechanism(mechanism string, available bool) {
	if m == nil {
		return
	}
	m.mechanism.WithLabelValues(mechanism).Set(gaugeBool(available))
}

// ObservePrepare records one claim's prepare: how long it took, and an
// error if err is not nil. kind is the claim's device kind (names.Kind*,
// KindMixed or KindUnknown).
func (m *Metrics) ObservePrepare(kind string, took time.Duration, err error) {
	if m != nil {
		observe(m.prepareSeconds, m.prepareErrors, kind, took, err)
	}
}

// ObserveUnprepare is ObservePrepare for unprepare.
func (m *Metrics) ObserveUnprepare(kind string, took time.Duration, err error) {
	if m != nil {
		observe(m.unprepareSeconds, m.unprepareErrors, kind, took, err)
	}
}

func observe(seconds *prometheus.HistogramVec, errors *prometheus.CounterVec, kind string, took time.Duration, err error) {
	seconds.WithLabelValues(kind).Observe(took.Seconds())
	if err != nil {
		errors.WithLabelValues(kind).Inc()
	}
}

// SetPublished records the ResourceSlices and devices published.
func (m *Metrics) SetPublished(slices, devices int) {
	if m == nil {
		return
	}
	m.slices.Set(float64(slices))
	m.devices.Set(float64(devices))
}

// SetFeatures records, per feature gate name, whether the cluster enforces
// it.
func (m *Metrics) SetFeatures(enabled map[string]bool) {
	if m == nil {
		return
	}
	for name, on := range enabled {
		m.feature.WithLabelValues(name).Set(gaugeBool(on))
	}
}

// GPU is one physical GPU's state, as the driver knows it at scrape time.
type GPU struct {
	Index   int
	UUID    string
	Product string
	// Mode is the inventory mode in force (exclusive, mig, shared, ...).
	Mode string
	// MemoryBytes is the GPU's usable framebuffer in bytes: NVML's total
	// less what the driver reserves (nvml.GPU.MemoryBytes).
	MemoryBytes int64
	// AllocatedMemoryBytes is the memory prepared claims hold: all of it
	// for a whole GPU, the instances' for MIG, the shares' limits.
	AllocatedMemoryBytes int64
	// AllocatedComputePercent is the compute prepared claims hold, in
	// percent of the GPU: 100 for a whole GPU, the shares' SM limits, the
	// MIG instances' compute slices of the GPU's.
	AllocatedComputePercent int64
	// MIGInUse counts the prepared MIG instances by profile name.
	MIGInUse map[string]int
}

// GPUSource yields the GPUs' state (the driver).
type GPUSource interface {
	// GPUState lists every GPU of the inventory.
	GPUState() []GPU
	// PreparedClaims is the number of claims holding devices on the node.
	PreparedClaims() int
}

// HealthSource says which GPUs are unhealthy.
type HealthSource interface {
	// GPUHealth maps the UUID of each unhealthy GPU to why; a GPU absent
	// from it is healthy.
	GPUHealth() map[string]string
}

// HealthFunc adapts a function to HealthSource.
type HealthFunc func() map[string]string

// GPUHealth calls f.
func (f HealthFunc) GPUHealth() map[string]string { return f() }

// CheckpointSource reports the checkpoint's footprint (package checkpoint).
type CheckpointSource interface {
	// Usage is the records' total size in bytes and their number.
	Usage() (bytes int64, records int, err error)
}

// Claim is one device a prepared claim holds, as the driver knows it at
// scrape time.
type Claim struct {
	Namespace, Name string
	// Device is the DRA device name; GPUIndex and GPUUUID its physical
	// GPU's NVML index and UUID.
	Device   string
	GPUIndex int
	GPUUUID  string
	// GIID is the MIG device's GPU instance ID and Profile its profile
	// name; GIID is -1 for a whole GPU, a share or a slot.
	GIID    int
	Profile string
	// MIGUUID is the MIG device's own UUID ("MIG-..."), "" for others.
	MIGUUID string
	// Shape is whole, mig, share or slot; Compute how its compute is
	// partitioned: mps, time-sliced (HAMi-core's SM limit) or none.
	Shape, Compute string
	// MemoryBytes and ComputePercent are what the device holds: the whole
	// GPU's usable memory and 100 %, the MIG instance's memory and compute
	// slices, the share's or slot's limits.
	MemoryBytes    int64
	ComputePercent int64
	// Pods are the names of the pods the claim is reserved for, as its
	// latest prepare saw them (checkpoint.Claim.Pods); none in records
	// of earlier versions.
	Pods []string
}

// GPUUsage is what a GPU's processes use now (nvml.Usage): for nodes
// without DCGM. -1 is a figure NVML does not report.
type GPUUsage struct {
	UtilizationPercent int
	MemoryUsedBytes    int64
	// MIG is each MIG device's memory in use, by GPU instance ID.
	MIG map[int]int64
}

// UsageSource reads a GPU's usage by UUID, once per GPU per scrape (the
// plugin's NVML).
type UsageSource interface {
	GPUUsage(uuid string) (GPUUsage, error)
}

// ClaimUsage is what a claim's processes use on its vGPU shares and
// slots together, from its HAMi-core accounting region
// (hami.ReadRegionUsage).
type ClaimUsage struct {
	Namespace, Name string
	// UsedBytes is the memory its processes hold, in bytes, as HAMi-core
	// charges it against the limits.
	UsedBytes int64
	// ComputeUsedPercent is their SM utilization in percent of one GPU,
	// summed over processes and devices (NVML's per-process samples, as
	// HAMi-core's utilization watcher records them); -1 where nothing
	// records it (no SM limit, as under MPS).
	ComputeUsedPercent int64
}

// ClaimSource yields the prepared claims' devices and, for claims with
// vGPU shares or slots whose region exists, their usage (the driver).
type ClaimSource interface {
	ClaimState() ([]Claim, []ClaimUsage)
}

// Collector reads per-GPU, per-claim and checkpoint values at scrape time.
type Collector struct {
	GPUs       GPUSource
	Health     HealthSource
	Checkpoint CheckpointSource
	// Claims, when set, adds the per-claim series.
	Claims ClaimSource
	// Usage, when set, adds each GPU's and MIG device's use from NVML.
	Usage UsageSource
}

var (
	gpuLabels     = []string{"gpu", "uuid", "product"}
	descMode      = prometheus.NewDesc(namespace+"_gpu_mode", "The GPU's mode: 1 for the mode in force, labelled by it.", append(gpuLabels, "mode"), nil)
	descMemory    = prometheus.NewDesc(namespace+"_gpu_memory_bytes", "The GPU's framebuffer memory a workload can be given: NVML's total less what the driver reserves (memory info v2), as published in the GPU's memory capacity.", gpuLabels, nil)
	descAllocMem  = prometheus.NewDesc(namespace+"_gpu_allocated_memory_bytes", "Memory of the GPU that prepared claims hold: all of it for a whole GPU, each MIG instance's, each vGPU share's limit.", gpuLabels, nil)
	descAllocComp = prometheus.NewDesc(namespace+"_gpu_allocated_compute_percent", "Compute of the GPU that prepared claims hold, in percent: 100 for a whole GPU, each vGPU share's SM limit, each MIG instance's compute slices.", gpuLabels, nil)
	descMIG       = prometheus.NewDesc(namespace+"_gpu_mig_instances_in_use", "Prepared MIG instances on the GPU, by profile.", append(gpuLabels, "profile"), nil)
	descHealthy   = prometheus.NewDesc(namespace+"_gpu_healthy", "1 if the GPU is healthy, 0 if not.", gpuLabels, nil)
	descCkptBytes = prometheus.NewDesc(namespace+"_checkpoint_size_bytes", "Total size of the prepared-claims checkpoint's records.", nil, nil)
	descCkptRecs  = prometheus.NewDesc(namespace+"_checkpoint_records", "Records in the prepared-claims checkpoint.", nil, nil)
	descPrepared  = prometheus.NewDesc(namespace+"_prepared_claims", "ResourceClaims holding devices on this node (prepared, or being prepared).", nil, nil)

	descUtil    = prometheus.NewDesc(namespace+"_gpu_utilization_percent", "Percent of NVML's last sample period in which a kernel ran on the GPU (nvmlDeviceGetUtilizationRates); absent where NVML reports none (MIG mode on). For nodes without dcgm-exporter.", gpuLabels, nil)
	descMemUsed = prometheus.NewDesc(namespace+"_gpu_memory_used_bytes", "The GPU's framebuffer in use by processes (NVML memory info v2's used: the driver's reserved memory left out). For nodes without dcgm-exporter.", gpuLabels, nil)
	descMIGUsed = prometheus.NewDesc(namespace+"_mig_memory_used_bytes", "A MIG device's framebuffer in use (NVML memory info on the MIG device), by GPU instance ID (GPU_I_ID, dcgm-exporter's label). For nodes without dcgm-exporter.", append(append([]string(nil), gpuLabels...), "GPU_I_ID"), nil)

	// The per-claim series. claimLabels name the claim and its device;
	// the info series adds the GPU and MIG identity in dcgm-exporter's
	// own label names (UUID: the physical GPU's; GPU_I_ID and
	// GPU_I_PROFILE: the GPU instance's, "" on a whole GPU), so that
	// DCGM's series join it: DCGM_FI_DEV_GPU_UTIL * on (UUID) group_left
	// (namespace, claim) facet_claim_info{GPU_I_ID=""} for whole GPUs, on
	// (UUID, GPU_I_ID) for MIG devices (docs/operations.md).
	claimLabels   = []string{"namespace", "claim", "device"}
	descClaimInfo = prometheus.NewDesc(namespace+"_claim_info", "1 for each device a prepared ResourceClaim holds on this node and each pod the claim is reserved for (pod \"\" when none is recorded), with the GPU's and the GPU instance's identity in dcgm-exporter's label names.",
		append(append([]string(nil), claimLabels...), "pod", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "mig_uuid", "shape", "compute"), nil)
	descClaimMem      = prometheus.NewDesc(namespace+"_claim_memory_bytes", "GPU memory the claim's device holds: the whole GPU's, the MIG instance's, the vGPU share's or slot's limit.", claimLabels, nil)
	descClaimComp     = prometheus.NewDesc(namespace+"_claim_compute_percent", "Compute the claim's device holds, in percent of its GPU: 100 for a whole GPU, the MIG instance's compute slices, the share's or slot's SM limit.", claimLabels, nil)
	descClaimMemUsed  = prometheus.NewDesc(namespace+"_claim_memory_used_bytes", "GPU memory in use on the claim's devices, summed over them: on a whole GPU NVML's memory used of the GPU (memory info v2, the driver's reserve left out), on a MIG device NVML's of the MIG device, on vGPU shares and slots what HAMi-core charges the claim's processes against their limits (its accounting region). Absent while a device's figure is unknown: a share before its first process, a GPU NVML cannot read.", []string{"namespace", "claim"}, nil)
	descClaimCompUsed = prometheus.NewDesc(namespace+"_claim_compute_used_percent", "Compute in use on the claim's devices, in percent of one GPU, summed over them: on a whole GPU NVML's utilization (percent of the last sample period a kernel ran), on vGPU shares and slots the processes' SM utilization (NVML's per-process samples, as HAMi-core's utilization watcher records them). Absent for MIG devices (NVML reports no utilization in MIG mode: use DCGM's profiling metrics by GPU_I_ID), for MPS shares (no SM limit, so no watcher), and while a figure is unknown.", []string{"namespace", "claim"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMode, descMemory, descAllocMem, descAllocComp, descMIG, descHealthy, descCkptBytes, descCkptRecs, descPrepared, descClaimInfo, descClaimMem, descClaimComp, descClaimMemUsed, descClaimCompUsed, descUtil, descMemUsed, descMIGUsed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A checkpoint that cannot be read
// is reported as an invalid metric, which fails the scrape visibly.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	// usage is each GPU's NVML reading of this scrape, by UUID: read
	// once per GPU, for its own series and its claims'.
	usage := map[string]GPUUsage{}
	if c.GPUs != nil {
		var unhealthy map[string]string
		if c.Health != nil {
			unhealthy = c.Health.GPUHealth()
		}
		for _, g := range c.GPUs.GPUState() {
			l := []string{strconv.Itoa(g.Index), g.UUID, g.Product}
			gauge(descMode, 1, append(l, g.Mode)...)
			gauge(descMemory, float64(g.MemoryBytes), l...)
			gauge(descAllocMem, float64(g.AllocatedMemoryBytes), l...)
			gauge(descAllocComp, float64(g.AllocatedComputePercent), l...)
			for profile, n := range g.MIGInUse {
				gauge(descMIG, float64(n), append(l, profile)...)
			}
			_, bad := unhealthy[g.UUID]
			gauge(descHealthy, gaugeBool(!bad), l...)
			if c.Usage == nil {
				continue
			}
			// A GPU NVML cannot read leaves its usage out of this scrape;
			// its health is the health monitor's to report.
			u, err := c.Usage.GPUUsage(g.UUID)
			if err != nil {
				continue
			}
			usage[g.UUID] = u
			if u.UtilizationPercent >= 0 {
				gauge(descUtil, float64(u.UtilizationPercent), l...)
			}
			if u.MemoryUsedBytes >= 0 {
				gauge(descMemUsed, float64(u.MemoryUsedBytes), l...)
			}
			for gi, used := range u.MIG {
				gauge(descMIGUsed, float64(used), append(l, strconv.Itoa(gi))...)
			}
		}
		gauge(descPrepared, float64(c.GPUs.PreparedClaims()))
	}
	if c.Claims != nil {
		claims, regions := c.Claims.ClaimState()
		for _, cl := range claims {
			l := []string{cl.Namespace, cl.Name, cl.Device}
			gi := ""
			if cl.GIID >= 0 {
				gi = strconv.Itoa(cl.GIID)
			}
			pods := cl.Pods
			if len(pods) == 0 {
				pods = []string{""}
			}
			for _, pod := range pods {
				gauge(descClaimInfo, 1,
					append(l, pod, strconv.Itoa(cl.GPUIndex), cl.GPUUUID, gi, cl.Profile, cl.MIGUUID, cl.Shape, cl.Compute)...)
			}
			gauge(descClaimMem, float64(cl.MemoryBytes), l...)
			gauge(descClaimComp, float64(cl.ComputePercent), l...)
		}
		for _, u := range claimsUsed(claims, regions, usage) {
			if u.memKnown {
				gauge(descClaimMemUsed, float64(u.mem), u.namespace, u.name)
			}
			if u.compKnown {
				gauge(descClaimCompUsed, float64(u.comp), u.namespace, u.name)
			}
		}
	}
	if c.Checkpoint != nil {
		bytes, records, err := c.Checkpoint.Usage()
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descCkptBytes, err)
			return
		}
		gauge(descCkptBytes, float64(bytes))
		gauge(descCkptRecs, float64(records))
	}
}

// claimUsed is one claim's use summed over its devices; a figure is known
// only when every device's is.
type claimUsed struct {
	namespace, name     string
	mem, comp           int64
	memKnown, compKnown bool
}

// claimsUsed sums, per claim, its devices' use: a whole GPU's and a MIG
// device's from the GPUs' NVML readings, the shares' and slots' from the
// claim's accounting region (one for all of them, counted once).
func claimsUsed(claims []Claim, regions []ClaimUsage, gpus map[string]GPUUsage) []claimUsed {
	type key struct{ ns, name string }
	region := map[key]ClaimUsage{}
	for _, r := range regions {
		region[key{r.Namespace, r.Name}] = r
	}
	byClaim := map[key]*claimUsed{}
	var out []*claimUsed
	for _, cl := range claims {
		k := key{cl.Namespace, cl.Name}
		u := byClaim[k]
		if u == nil {
			u = &claimUsed{namespace: cl.Namespace, name: cl.Name, memKnown: true, compKnown: true}
			byClaim[k] = u
			out = append(out, u)
			if r, ok := region[k]; ok {
				u.mem = r.UsedBytes
				u.comp = max(r.ComputeUsedPercent, 0)
			}
		}
		g, read := gpus[cl.GPUUUID]
		switch cl.Shape {
		case "whole":
			u.memKnown = u.memKnown && read && g.MemoryUsedBytes >= 0
			u.compKnown = u.compKnown && read && g.UtilizationPercent >= 0
			u.mem += g.MemoryUsedBytes
			u.comp += int64(g.UtilizationPercent)
		case "mig":
			used, ok := g.MIG[cl.GIID]
			u.memKnown = u.memKnown && read && ok && cl.GIID >= 0
			u.compKnown = false
			u.mem += used
		default:
			r, ok := region[k]
			u.memKnown = u.memKnown && ok
			u.compKnown = u.compKnown && ok && r.ComputeUsedPercent >= 0
		}
	}
	res := make([]claimUsed, len(out))
	for i, u := range out {
		res[i] = *u
	}
	return res
}
