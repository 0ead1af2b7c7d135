package nodeplugin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
	"github.com/facet-gpu/facet/pkg/node/probes"
	"github.com/facet-gpu/facet/pkg/node/publisher"
)

// TestMetricsEndpoint: /metrics is served next to the probes when metrics
// are on, with the published counts and features, and not at all when off.
func TestMetricsEndpoint(t *testing.T) {
	m := nodemetrics.New()
	s := features.Stock("test")
	s.Enabled[features.PartitionableDevices] = true
	m.SetFeatures(featureMetrics(s))
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node": {Slices: []resourceslice.Slice{
		{Devices: make([]resourceapi.Device, 3)}, {Devices: make([]resourceapi.Device, 2)},
	}}}}
	m.SetPublished(2, publisher.PublishedDevices(res))

	code, body := probe(t, &probes.Checker{Metrics: m.Handler()}, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for _, want := range []string{
		`facet_devices_published 5`,
		`facet_resource_slices_published 2`,
		`facet_cluster_feature_enabled{feature="DRAPartitionableDevices"} 1`,
		`facet_cluster_feature_enabled{feature="DRAConsumableCapacity"} 0`,
		`facet_cluster_feature_enabled{feature="DRADeviceTaints"} 0`,
		`facet_cluster_feature_enabled{feature="DRAExtendedResource"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code, _ := probe(t, &probes.Checker{}, "/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without metrics: %d, want 404", code)
	}
}

func probe(t *testing.T, h *probes.Checker, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}
