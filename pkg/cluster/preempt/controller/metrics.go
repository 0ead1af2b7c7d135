package controller

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Outcomes of a preemption, the label of facet_preemptor_outcomes_total.
const (
	OutcomeScheduled = "scheduled"
	OutcomeLost      = "lost"
	OutcomeTimedOut  = "timed_out"
	OutcomeBlocked   = "blocked"
)

// Why a decided preemption waits, the label of facet_preemptor_waits_total.
const (
	WaitBudget   = "eviction_budget"
	WaitNodeBusy = "node_busy"
)

// Metrics are facet-preemptor's, on a registry of its own (as
// pkg/node/nodemetrics), with the Kubernetes naming conventions. A nil *Metrics
// records nothing.
type Metrics struct {
	reg                            *prometheus.Registry
	preemptions, victims, refusals prometheus.Counter
	wouldPreempt, wouldEvict       prometheus.Counter
	outcomes, waits                *prometheus.CounterVec
	active, observeOnly            prometheus.Gauge
	unallocatable                  *unallocatable
}

// RequestKind is what a request asks for, the labels of
// facet_preemptor_unallocatable_requests: its DeviceClass and the MIG
// profile it can only be served with ("" where not one profile).
type RequestKind struct {
	DeviceClass, MIGProfile string
}

// unallocatable is facet_preemptor_unallocatable_requests, a collector
// read at scrape time: a scrape sees one whole set of counts, never one
// half replaced, and a kind whose count is gone has no series, not a 0
// that stays.
type unallocatable struct {
	desc   *prometheus.Desc
	mu     sync.Mutex
	counts map[RequestKind]int
}

func (u *unallocatable) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

func (u *unallocatable) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k, n := range u.counts {
		ch <- prometheus.MustNewConstMetric(u.desc, prometheus.GaugeValue, float64(n), k.DeviceClass, k.MIGProfile)
	}
}

// NewMetrics registers the metrics, the Go runtime's and the process's.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		preemptions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "preemptions_total",
			Help: "Preemptions carried out: a pending pod's victims evicted so that its ResourceClaims fit.",
		}),
		victims: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "victims_total",
			Help: "Pods evicted by preemptions.",
		}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "evictions_refused_total",
			Help: "Evictions a PodDisruptionBudget refused (dry run), after which other victims were sought.",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "outcomes_total",
			Help: "How preemptions ended: scheduled (the preemptor was bound), lost (the freed devices went to another pod first), timed_out, blocked (evictions refused, no other victims).",
		}, []string{"outcome"}),
		wouldPreempt: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "observed_preemptions_total",
			Help: "Preemptions decided in observe-only mode (--observe-only) and not carried out; each decision once.",
		}),
		wouldEvict: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "observed_victims_total",
			Help: "Pods that observed preemptions would have evicted.",
		}),
		observeOnly: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "observe_only",
			Help: "1 where --observe-only is set: decisions and Events, no evictions.",
		}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "waits_total",
			Help: "Times a decided preemption was held back, by why: eviction_budget (--max-evictions-per-minute spent), node_busy (another preemption in flight on its node).",
		}, []string{"reason"}),
		unallocatable: &unallocatable{desc: prometheus.NewDesc("facet_preemptor_unallocatable_requests",
			"Requests (a count, not pods or devices) of pending pods' ResourceClaims that fit on no node now: the pods with a standing FacetUnallocatable Event. "+
				"By the DeviceClass a request names and the MIG profile every device it can match is of (\"\" where not one profile); "+
				"a firstAvailable request counts once per subrequest. Only the leading replica counts. "+
				"A label pair whose count drops to 0 has no series: at most one per DeviceClass and MIG profile.",
			[]string{"device_class", "mig_profile"}, nil)},
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "facet", Subsystem: "preemptor", Name: "active",
			Help: "1 while this replica leads and preempts; 0 while it waits for the lease or stays idle because the kube-scheduler preempts for DRA claims itself.",
		}),
	}
	for _, o := range []string{OutcomeScheduled, OutcomeLost, OutcomeTimedOut, OutcomeBlocked} {
		m.outcomes.WithLabelValues(o)
	}
	for _, w := range []string{WaitBudget, WaitNodeBusy} {
		m.waits.WithLabelValues(w)
	}
	m.reg.MustRegister(m.preemptions, m.victims, m.refusals, m.wouldPreempt, m.wouldEvict, m.outcomes, m.waits, m.active, m.observeOnly, m.unallocatable,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetActive sets facet_preemptor_active.
func (m *Metrics) SetActive(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.active.Set(v)
}

func (m *Metrics) preemption() {
	if m != nil {
		m.preemptions.Inc()
	}
}

func (m *Metrics) victim() {
	if m != nil {
		m.victims.Inc()
	}
}

func (m *Metrics) refused() {
	if m != nil {
		m.refusals.Inc()
	}
}

func (m *Metrics) outcome(o string) {
	if m != nil {
		m.outcomes.WithLabelValues(o).Inc()
	}
}

func (m *Metrics) wait(why string) {
	if m != nil {
		m.waits.WithLabelValues(why).Inc()
	}
}

// SetObserveOnly sets facet_preemptor_observe_only.
func (m *Metrics) SetObserveOnly(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.observeOnly.Set(v)
}

func (m *Metrics) observed(victims int) {
	if m != nil {
		m.wouldPreempt.Inc()
		m.wouldEvict.Add(float64(victims))
	}
}

// setUnallocatable replaces facet_preemptor_unallocatable_requests' counts;
// kinds with none leave no series.
func (m *Metrics) setUnallocatable(counts map[RequestKind]int) {
	if m == nil {
		return
	}
	u := m.unallocatable
	u.mu.Lock()
	defer u.mu.Unlock()
	u.counts = map[RequestKind]int{}
	for k, n := range counts {
		if n > 0 {
			u.counts[k] = n
		}
	}
}
