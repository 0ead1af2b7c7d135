package computedomain

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// Metrics are facet-controller's, on a registry of its own. A nil
// *Metrics records nothing.
type Metrics struct {
	reg        *prometheus.Registry
	syncErrors prometheus.Counter
	leader     prometheus.Gauge
	state      *stateCollector
}

// stateCollector reports the domains and cliques of the leading replica's
// informers at scrape time: one consistent set, no series left behind by
// a domain that is gone.
type stateCollector struct {
	domains, channels *prometheus.Desc
	mu                sync.Mutex
	c                 *Controller
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.domains
	ch <- s.channels
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	c := s.c
	s.mu.Unlock()
	if c == nil {
		return
	}
	domains, cliques := c.Snapshot()
	counts := map[string]int{"ready": 0, "not_ready": 0, "deleting": 0}
	for _, d := range domains {
		switch {
		case d.DeletionTimestamp != nil:
			counts["deleting"]++
		case d.Status.Status == v1alpha1.ComputeDomainReady:
			counts["ready"]++
		default:
			counts["not_ready"]++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(s.domains, prometheus.GaugeValue, float64(n), state)
	}
	for _, q := range cliques {
		ch <- prometheus.MustNewConstMetric(s.channels, prometheus.GaugeValue, float64(len(q.Free)), q.Name, "free")
		ch <- prometheus.MustNewConstMetric(s.channels, prometheus.GaugeValue, float64(len(q.Nodes)-len(q.Free)), q.Name, "held")
	}
}

// NewMetrics registers the metrics, the Go runtime's and the process's.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "facet", Subsystem: "controller", Name: "sync_errors_total",
			Help: "ComputeDomain syncs that failed and were retried (the log says why)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "facet", Subsystem: "controller", Name: "leader",
			Help: "1 while this replica holds the leader Lease and reconciles ComputeDomains."}),
		state: &stateCollector{
			domains: prometheus.NewDesc("facet_controller_compute_domains",
				"ComputeDomains by state: ready (numNodes IMEX daemons ready), not_ready, deleting (waiting for their pods). Only the leading replica reports.",
				[]string{"state"}, nil),
			channels: prometheus.NewDesc("facet_controller_clique_channels",
				"IMEX channels (one per node) of each NVLink fabric clique, free or held by a claim. Only the leading replica reports.",
				[]string{"clique", "state"}, nil),
		},
	}
	m.reg.MustRegister(m.syncErrors, m.leader, m.state,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetLeader sets facet_controller_leader.
func (m *Metrics) SetLeader(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.leader.Set(v)
}

func (m *Metrics) syncError() {
	if m != nil {
		m.syncErrors.Inc()
	}
}

// watch points the state collector at a running controller; nil: none.
func (m *Metrics) watch(c *Controller) {
	if m == nil {
		return
	}
	m.state.mu.Lock()
	defer m.state.mu.Unlock()
	m.state.c = c
}
