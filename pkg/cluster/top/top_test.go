package top

import (
	"strings"
	"testing"
)

// TestParse: a scrape that is not a Facet plugin's is refused, naming the
// node; a plugin with nothing prepared has no rows; a claim's memory in use
// goes on its first device's row only.
func TestParse(t *testing.T) {
	if _, err := Parse("n1", strings.NewReader("up 1\n")); err == nil || !strings.Contains(err.Error(), "node n1: /metrics has no facet_prepared_claims") {
		t.Errorf("a scrape without Facet's series: %v", err)
	}
	rows, err := Parse("n1", strings.NewReader("# TYPE facet_prepared_claims gauge\nfacet_prepared_claims 0\n"))
	if err != nil || len(rows) != 0 {
		t.Errorf("nothing prepared: %v, %v", rows, err)
	}
	rows, err = Parse("n1", strings.NewReader(`# TYPE facet_prepared_claims gauge
facet_prepared_claims 1
# TYPE facet_claim_info gauge
facet_claim_info{namespace="nb",claim="two",device="gpu-1",pod="p-2",shape="share",compute="mps",GPU_I_PROFILE="",UUID="GPU-b",gpu="1",GPU_I_ID="",mig_uuid=""} 1
facet_claim_info{namespace="nb",claim="two",device="gpu-1",pod="p-1",shape="share",compute="mps",GPU_I_PROFILE="",UUID="GPU-b",gpu="1",GPU_I_ID="",mig_uuid=""} 1
facet_claim_info{namespace="nb",claim="two",device="gpu-0",shape="share",compute="mps",GPU_I_PROFILE="",UUID="GPU-a",gpu="0",GPU_I_ID="",mig_uuid=""} 1
# TYPE facet_claim_memory_bytes gauge
facet_claim_memory_bytes{namespace="nb",claim="two",device="gpu-0"} 1073741824
facet_claim_memory_bytes{namespace="nb",claim="two",device="gpu-1"} 2147483648
# TYPE facet_claim_memory_used_bytes gauge
facet_claim_memory_used_bytes{namespace="nb",claim="two"} 536870912
# TYPE facet_claim_compute_used_percent gauge
facet_claim_compute_used_percent{namespace="nb",claim="two"} 31
`))
	if err != nil || len(rows) != 2 {
		t.Fatalf("rows %+v, %v", rows, err)
	}
	if rows[0].Device != "gpu-0" || rows[0].UsedBytes != 1<<29 || rows[0].ComputeUsedPercent != 31 || rows[0].MemoryBytes != 1<<30 ||
		rows[1].UsedBytes != -1 || rows[1].ComputeUsedPercent != -1 || rows[1].MemoryBytes != 2<<30 {
		t.Errorf("rows %+v", rows)
	}
	// The info series of a device comes once per pod: one row, both pods.
	if len(rows[1].Pods) != 2 || rows[1].Pods[0] != "p-2" || rows[1].Pods[1] != "p-1" || len(rows[0].Pods) != 0 {
		t.Errorf("pods %v and %v, want none and [p-2 p-1]", rows[0].Pods, rows[1].Pods)
	}
}
