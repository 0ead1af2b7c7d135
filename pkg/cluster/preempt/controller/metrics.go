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
		reg:          prometheus.NewRegistry(),
		preemptions:  counter("preemptions_total", "Preemptions carried out: a pending pod's victims evicted so that its ResourceClaims fit."),
		victims:      counter("victims_total", "Pods evicted by preemptions."),
		refusals:     counter("evictions_refused_total", "Evictions a PodDisruptionBudget or an admission policy refused (dry run), after which other victims were sought."),
		outcomes:     counterVec("outcomes_total", "How preemptions ended: scheduled (the preemptor was bound), lost (the freed devices went to another pod first), timed_out, blocked (evictions refused, no other victims).", []string{"outcome"}),
		wouldPreempt: counter("observed_preemptions_total", "Preemptions decided in observe-only mode (--observe-only) and not carried out; each decision once."),
		wouldEvict:   counter("observed_victims_total", "Pods that observed preemptions would have evicted."),
		observeOnly:  gauge("observe_only", "1 where --observe-only is set: decisions and Events, no evictions."),
		waits:        counterVec("waits_total", "Times a decided preemption was held back, by why: eviction_budget (--max-evictions-per-minute spent), node_busy (another preemption in flight on its node).", []string{"reason"}),
		unallocatable: &unallocatable{desc: prometheus.NewDesc("facet_preemptor_unallocatable_requests",
			"Requests (a count, not pods or devices) of pending pods' ResourceClaims that fit on no node now: the pods with a standing FacetUnallocatable Event. "+
				"By the DeviceClass a request names and the MIG profile every device it can match is of (\"\" where not one profile); "+
				"a firstAvailable request counts once per subrequest. Only the leading replica counts. "+
				"A label pair whose count drops to 0 has no series: at most one per DeviceClass and MIG profile.",
			[]string{"device_class", "mig_profile"}, nil)},
		active: gauge("active", "1 while this replica leads and preempts; 0 while it waits for the lease or stays idle because the kube-scheduler preempts for DRA claims itself."),
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

// opts names a metric facet_preemptor_<name>.
func opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "facet", Subsystem: "preemptor", Name: name, Help: help}
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts(opts(name, help)))
}

func counterVec(name, help string, labels []string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts(opts(name, help)))
}

// setBool sets a yes-or-no gauge: 1 or 0.
func setBool(g prometheus.Gauge, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	g.Set(v)
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetActive sets facet_preemptor_active.
func (m *Metrics) SetActive(on bool) {
	if m != nil {
		setBool(m.active, on)
	}
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
	if m != nil {
		setBool(m.observeOnly, on)
	}
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
