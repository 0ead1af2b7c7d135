package features

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// featureMetric is the gauge every Kubernetes component (component-base
// featuregate) exports on /metrics: 1 for a gate that is on, 0 for one that
// is off, one series per gate the binary knows, labelled name and stage.
const featureMetric = "kubernetes_feature_enabled"

// ServerGates reads the API server's feature gates from its /metrics
// (kubernetes_feature_enabled): every gate its binary knows, by name, with
// true where it is on. A gate missing from the map is one that binary does
// not know at all. It needs get on the non-resource URL /metrics, which a
// read-only component may hold where it may not dry-run create objects
// (Detect's way).
//
// The API server, the kube-scheduler and the kube-controller-manager of one
// Kubernetes release share one gate registry (k8s.io/kubernetes
// pkg/features), so a gate the API server knows is one the scheduler of
// that release knows; whether the scheduler runs it on is its own flag,
// which only an override can tell.
func ServerGates(ctx context.Context, client kubernetes.Interface) (map[string]bool, error) {
	body, err := client.Discovery().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics of the API server: %w", err)
	}
	defer body.Close()
	return ParseGateMetrics(body)
}

// ParseGateMetrics reads kubernetes_feature_enabled from a Prometheus text
// exposition. An exposition without that metric is an error: it is not a
// Kubernetes component's.
func ParseGateMetrics(r io.Reader) (map[string]bool, error) {
	// Only the gate metric's lines are parsed: an API server exposes
	// thousands of series, and one the parser dislikes must not hide the
	// gates.
	var only bytes.Buffer
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, featureMetric+"{") || strings.HasPrefix(line, featureMetric+" ") ||
			line == "# TYPE "+featureMetric+" gauge" {
			only.WriteString(line)
			only.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(&only)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	fam, ok := families[featureMetric]
	if !ok {
		return nil, fmt.Errorf("/metrics has no %s", featureMetric)
	}
	out := map[string]bool{}
	for _, m := range fam.GetMetric() {
		var name string
		for _, l := range m.GetLabel() {
			if l.GetName() == "name" {
				name = l.GetValue()
			}
		}
		if name == "" || m.GetGauge() == nil {
			continue
		}
		out[name] = m.GetGauge().GetValue() == 1
	}
	return out, nil
}

// FromGates is the Set of Facet's gates in a gate map (ServerGates): a gate
// missing from it is off (a release that does not know it).
func FromGates(gates map[string]bool, source string) Set {
	s := Stock(source)
	for _, g := range Gates {
		s.Enabled[g] = gates[string(g)]
	}
	return s
}
