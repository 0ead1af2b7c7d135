package features

import (
	"strings"
	"testing"
)

func TestParseGateMetrics(t *testing.T) {
	const exposition = `# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DRAConsumableCapacity",stage="ALPHA"} 1
kubernetes_feature_enabled{name="DRAPartitionableDevices",stage="ALPHA"} 0
kubernetes_feature_enabled{name="DRADeviceTaints",stage="ALPHA"} 1
# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="GET"} 12
a_series_the_parser_refuses{le="1" 3
`
	gates, err := ParseGateMetrics(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	if len(gates) != 3 || !gates["DRAConsumableCapacity"] || gates["DRAPartitionableDevices"] || !gates["DRADeviceTaints"] {
		t.Fatalf("gates %v", gates)
	}
	s := FromGates(gates, "test")
	if want := "DRAPartitionableDevices=false,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=false"; s.String() != want {
		t.Errorf("set %s, want %s (a gate the server does not list is off)", s, want)
	}
	if _, err := ParseGateMetrics(strings.NewReader("# TYPE up gauge\nup 1\n")); err == nil || !strings.Contains(err.Error(), "kubernetes_feature_enabled") {
		t.Errorf("an exposition without the metric: err %v", err)
	}
}
