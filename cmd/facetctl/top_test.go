package main

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

type topClaims struct {
	c []nodemetrics.Claim
	u []nodemetrics.ClaimUsage
}

func (t topClaims) ClaimState() ([]nodemetrics.Claim, []nodemetrics.ClaimUsage) { return t.c, t.u }

type oneGPU struct{}

func (oneGPU) GPUState() []nodemetrics.GPU {
	return []nodemetrics.GPU{{Index: 2, UUID: "GPU-c", Product: "NVIDIA H100 80GB HBM3", Mode: "exclusive"}}
}
func (oneGPU) PreparedClaims() int { return 3 }

type oneUsage struct{}

func (oneUsage) GPUUsage(uuid string) (nodemetrics.GPUUsage, error) {
	return nodemetrics.GPUUsage{UtilizationPercent: 87, MemoryUsedBytes: 60 << 30}, nil
}

// TestTop: facetctl top reads what the plugin's own collector serves (the
// producer and the reader agree on the series), one line per device, the
// claim's pods, and its memory and compute in use on its first line,
// filtered by namespace.
func TestTop(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&nodemetrics.Collector{GPUs: oneGPU{}, Usage: oneUsage{}, Claims: topClaims{
		c: []nodemetrics.Claim{
			{Namespace: "ml", Name: "train", Device: "gpu-2", GPUIndex: 2, GPUUUID: "GPU-c", GIID: -1, Shape: "whole", Compute: "none", MemoryBytes: 80 << 30, ComputePercent: 100, Pods: []string{"train-0", "train-1"}},
			{Namespace: "ml", Name: "infer", Device: "gpu-0-mig-1g10gb-6", GPUUUID: "GPU-a", GIID: 13, Profile: "1g.10gb", MIGUUID: "MIG-x", Shape: "mig", Compute: "mig", MemoryBytes: 9984 << 20, ComputePercent: 14},
			{Namespace: "nb", Name: "lab", Device: "gpu-1", GPUIndex: 1, GPUUUID: "GPU-b", GIID: -1, Shape: "share", Compute: "mps", MemoryBytes: 2 << 30, ComputePercent: 20},
		},
		u: []nodemetrics.ClaimUsage{{Namespace: "nb", Name: "lab", UsedBytes: 1536 << 20, ComputeUsedPercent: -1}},
	}})
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	var out bytes.Buffer
	if err := runTop([]string{"--metrics-url", srv.URL}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"NAMESPACE", "CLAIM", "PODS", "NODE", "DEVICE", "SHAPE", "MEMORY USED/ALLOCATED", "COMPUTE USED/ALLOCATED"},
		{"ml", "infer", " - ", srv.URL, "gpu-0-mig-1g10gb-6", "mig 1g.10gb", "mig", "-/9.75Gi", "-/14%"},
		{"ml", "train", "train-0,train-1", srv.URL, "gpu-2", "whole", "none", "60Gi/80Gi", "87%/100%"},
		{"nb", "lab", srv.URL, "gpu-1", "share", "mps", "1.5Gi/2Gi", "-/20%"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i, w := range want {
		for _, f := range w {
			if !strings.Contains(lines[i], f) {
				t.Errorf("line %d %q lacks %q", i, lines[i], f)
			}
		}
	}
	out.Reset()
	if err := runTop([]string{"--metrics-url", srv.URL, "--namespace", "nb"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "train") || !strings.Contains(out.String(), "lab") {
		t.Errorf("--namespace nb:\n%s", out.String())
	}
}
