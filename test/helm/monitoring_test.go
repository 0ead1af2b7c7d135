package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestMonitoring: the PrometheusRule and the dashboard's ConfigMap are
// rendered only when enabled, with the chart's files as they are (the
// rules' groups, the dashboard's JSON), the labels the Prometheus Operator
// and Grafana's sidecar select by, and nothing else changes.
func TestMonitoring(t *testing.T) {
	var got []object
	for _, o := range render(t, values(t, "")) {
		// The compute-domain controller's ConfigMap is no monitoring.
		if o.GetKind() == "PrometheusRule" || o.GetKind() == "ConfigMap" && o.GetLabels()["app.kubernetes.io/component"] != "controller" {
			got = append(got, o)
		}
	}
	if len(got) != 0 {
		t.Fatalf("rendered %d monitoring objects by default, want none", len(got))
	}
	objs := render(t, values(t, `
monitoring:
  prometheusRules: {enabled: true, labels: {release: kube-prometheus-stack}}
  dashboard: {enabled: true, namespace: monitoring}
`))
	rule := find(t, objs, "PrometheusRule", "facet")
	if rule.GetNamespace() != releaseNamespace || rule.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule in %q with labels %v", rule.GetNamespace(), rule.GetLabels())
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deployments", "helm", "facet", "files", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	spec, _ := rule.Object["spec"].(map[string]any)
	if !reflect.DeepEqual(spec["groups"], file["groups"]) {
		t.Errorf("the PrometheusRule's groups differ from files/prometheus-rules.yaml")
	}
	cm := find(t, objs, "ConfigMap", "facet-dashboard")
	if cm.GetNamespace() != "monitoring" || cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap in %q with labels %v", cm.GetNamespace(), cm.GetLabels())
	}
	data, _ := cm.Object["data"].(map[string]any)
	board, _ := data["facet-gpus.json"].(string)
	var d struct {
		UID    string `json:"uid"`
		Panels []any  `json:"panels"`
	}
	if err := json.Unmarshal([]byte(board), &d); err != nil || d.UID != "facet-gpus" || len(d.Panels) == 0 {
		t.Errorf("dashboard JSON: uid %q, %d panels, %v", d.UID, len(d.Panels), err)
	}
}

// TestPodMonitor: off by default; on, one PodMonitor whose selector takes
// the pods of every workload of the chart that serves a `metrics` port
// (the webhook, facet-controller, facet-preemptor) and no other pod, and
// scrapes that port.
func TestPodMonitor(t *testing.T) {
	if n := len(ofKind(render(t, values(t, "preemptor: {enabled: true}")), "PodMonitor")); n != 0 {
		t.Fatalf("%d PodMonitors by default, want none", n)
	}
	objs := render(t, values(t, `
preemptor: {enabled: true}
monitoring:
  podMonitor: {enabled: true, interval: 1m, labels: {release: kube-prometheus-stack}}
`))
	pm := find(t, objs, "PodMonitor", "facet")
	if pm.GetNamespace() != releaseNamespace || pm.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PodMonitor in %q with labels %v", pm.GetNamespace(), pm.GetLabels())
	}
	var spec struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	}
	raw, _ := json.Marshal(pm.Object["spec"])
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if e := spec.PodMetricsEndpoints; len(e) != 1 || e[0].Port != "metrics" || e[0].Path != "/metrics" || e[0].Interval != "1m" {
		t.Errorf("podMetricsEndpoints %+v, want the metrics port's /metrics every 1m", e)
	}
	sel, err := metav1.LabelSelectorAsSelector(&spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	scraped := map[string]bool{}
	for _, o := range objs {
		ps, ok := podSpecOf(t, o)
		if !ok || o.GetKind() == "Pod" {
			continue
		}
		podLabels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		serves := false
		for _, c := range ps.Containers {
			for _, p := range c.Ports {
				serves = serves || p.Name == "metrics"
			}
		}
		if got := sel.Matches(labels.Set(podLabels)); got != serves {
			t.Errorf("%s %s: selected %v, serves a metrics port %v", o.GetKind(), o.GetName(), got, serves)
		}
		if serves {
			scraped[podLabels["app.kubernetes.io/component"]] = true
		}
	}
	if want := map[string]bool{"webhook": true, "controller": true, "preemptor": true}; !reflect.DeepEqual(scraped, want) {
		t.Errorf("scraped components %v, want %v", scraped, want)
	}
}
