package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

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
