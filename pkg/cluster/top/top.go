// Package top is `facetctl top`: who uses what, from the kubelet plugins'
// own /metrics (their per-claim series, package pkg/node/nodemetrics): each
// prepared claim's pods, devices, shape, and memory and compute used
// against allocated, per node and namespace.
package top

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Row is one device a claim holds on one node.
type Row struct {
	Node, Namespace, Claim, Device string
	// Shape is whole, mig, share or slot; Compute how it is partitioned
	// (none, mig, mps, time-sliced); Profile a MIG device's profile.
	Shape, Compute, Profile string
	// MemoryBytes and ComputePercent are what the device holds.
	MemoryBytes    float64
	ComputePercent float64
	// Pods are the pods the claim is reserved for, as its plugin
	// recorded them at prepare.
	Pods []string
	// UsedBytes is the claim's memory in use on all its devices, and
	// ComputeUsedPercent its compute in use in percent of one GPU
	// (facet_claim_memory_used_bytes, facet_claim_compute_used_percent),
	// on the claim's first row only; -1 where the plugin does not report
	// it (a share no process has started on; compute of MIG devices and
	// MPS shares).
	UsedBytes          float64
	ComputeUsedPercent float64
}

// Parse reads one plugin's /metrics (Prometheus text format) as node's
// rows. A scrape without Facet's per-claim series (an older plugin) is an
// error that says so.
func Parse(node string, r io.Reader) ([]Row, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("node %s: /metrics: %w", node, err)
	}
	if _, ok := families["facet_prepared_claims"]; !ok {
		return nil, fmt.Errorf("node %s: /metrics has no facet_prepared_claims: not a Facet kubelet plugin", node)
	}
	labels := func(m *dto.Metric) map[string]string {
		out := map[string]string{}
		for _, l := range m.GetLabel() {
			out[l.GetName()] = l.GetValue()
		}
		return out
	}
	type key struct{ ns, claim, device string }
	value := func(name string) map[key]float64 {
		out := map[key]float64{}
		for _, m := range families[name].GetMetric() {
			l := labels(m)
			out[key{l["namespace"], l["claim"], l["device"]}] = m.GetGauge().GetValue()
		}
		return out
	}
	mem, comp := value("facet_claim_memory_bytes"), value("facet_claim_compute_percent")
	used, compUsed := value("facet_claim_memory_used_bytes"), value("facet_claim_compute_used_percent")
	var rows []Row
	// One info series per pod of a device's claim: one row per device.
	row := map[key]int{}
	for _, m := range families["facet_claim_info"].GetMetric() {
		l := labels(m)
		k := key{l["namespace"], l["claim"], l["device"]}
		i, seen := row[k]
		if !seen {
			i = len(rows)
			row[k] = i
			rows = append(rows, Row{
				Node: node, Namespace: k.ns, Claim: k.claim, Device: k.device,
				Shape: l["shape"], Compute: l["compute"], Profile: l["GPU_I_PROFILE"],
				MemoryBytes: mem[k], ComputePercent: comp[k], UsedBytes: -1, ComputeUsedPercent: -1,
			})
		}
		if pod := l["pod"]; pod != "" {
			rows[i].Pods = append(rows[i].Pods, pod)
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.Device, b.Device))
	})
	for i := range rows {
		if i > 0 && rows[i-1].Namespace == rows[i].Namespace && rows[i-1].Claim == rows[i].Claim {
			continue
		}
		if u, ok := used[key{rows[i].Namespace, rows[i].Claim, ""}]; ok {
			rows[i].UsedBytes = u
		}
		if u, ok := compUsed[key{rows[i].Namespace, rows[i].Claim, ""}]; ok {
			rows[i].ComputeUsedPercent = u
		}
	}
	return rows, nil
}

// Write prints rows as a table, one line per device, with a total per
// namespace when there are several claims.
func Write(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLAIM\tPODS\tNODE\tDEVICE\tSHAPE\tCOMPUTE\tMEMORY USED/ALLOCATED\tCOMPUTE USED/ALLOCATED")
	for _, r := range rows {
		shape := r.Shape
		if r.Profile != "" {
			shape += " " + r.Profile
		}
		used, compUsed, pods := "-", "-", "-"
		if r.UsedBytes >= 0 {
			used = gib(r.UsedBytes)
		}
		if r.ComputeUsedPercent >= 0 {
			compUsed = fmt.Sprintf("%g%%", r.ComputeUsedPercent)
		}
		if len(r.Pods) > 0 {
			pods = strings.Join(r.Pods, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s/%s\t%s/%g%%\n", r.Namespace, r.Claim, pods, r.Node, r.Device, shape, r.Compute, used, gib(r.MemoryBytes), compUsed, r.ComputePercent)
	}
	tw.Flush()
	if len(rows) == 0 {
		fmt.Fprintln(w, "no prepared claims")
	}
}

// gib formats bytes as GiB with two decimals where needed.
func gib(b float64) string {
	v := b / (1 << 30)
	if v == float64(int64(v)) {
		return fmt.Sprintf("%dGi", int64(v))
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".") + "Gi"
}
