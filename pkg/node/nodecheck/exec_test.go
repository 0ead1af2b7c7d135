//go:build cgo && linux

package nodecheck

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
)

// probeArg, as the test binary's first argument, makes it the probe's
// process (see TestMain), as `facetctl node-check probe` is.
const probeArg = "nodecheck-probe"

func init() {
	if len(os.Args) > 1 && os.Args[1] == probeArg {
		if err := probe.Command(os.Args[2:], os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		os.Exit(0)
	}
}

// fakeLibCUDA compiles the probe's stand-in libcuda.so.1 (1024 MiB, 4
// multiprocessors, 0.5 ms a launch); it skips the test without a C
// compiler.
func fakeLibCUDA(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) for the stand-in libcuda.so.1", cc)
	}
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "probe/testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return lib
}

// withLib runs the probe with another libcuda than the spec's, in the
// claim's environment otherwise.
type withLib struct {
	Prober
	lib string
}

func (w withLib) Probe(ctx context.Context, env []string, _ string, p probe.Params) (*probe.Result, error) {
	return w.Prober.Probe(ctx, env, w.lib, p)
}

// TestProbeProcess runs the check with the probe in a process of its own,
// in each claim's environment (the simulated node's stand-in libvgpu.so
// preloaded for the share and the slot): against the stand-in
// libcuda.so.1, and against the simulated driver root's own libcuda,
// which is no CUDA library.
func TestProbeProcess(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe := ExecProber{Path: self, Args: []string{probeArg}}
	for _, tc := range []struct {
		name    string
		prober  func(t *testing.T) Prober
		want    []string
		results string
	}{
		{"stand-in libcuda", func(t *testing.T) Prober { return withLib{exe, fakeLibCUDA(t)} }, []string{
			"1024 MiB (1024 free)", "2001 MiB: CUDA_ERROR_OUT_OF_MEMORY", "TFLOP/s = 100 % (holds 20 %)",
			"whole GPU PROBLEM: the process sees 1024 MiB in all",
		}, "PROBLEM,PROBLEM,PROBLEM"},
		{"the simulated driver's libcuda", func(*testing.T) Prober { return exe }, []string{
			"whole GPU CUDA probe failed: ", "libcuda.so.", "has no cuInit: not a CUDA driver library",
		}, "FAILED (probe),FAILED (probe),FAILED (probe)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := simNode(t, 0)
			o.Prober = tc.prober(t)
			o.ProbeSeconds = 0.05
			rep, err := Run(testContext(t), o)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, row := range rep.Rows {
				got = append(got, row.result())
			}
			if strings.Join(got, ",") != tc.results {
				t.Errorf("results %v, want %s", got, tc.results)
			}
			var table bytes.Buffer
			if err := rep.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			for _, want := range append(tc.want, "Left nothing behind") {
				if !strings.Contains(table.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, table.String())
				}
			}
		})
	}
}
