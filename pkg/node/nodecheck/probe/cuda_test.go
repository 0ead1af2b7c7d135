//go:build cgo && linux

package probe

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// FakeLibCUDA compiles testdata/fakecuda.c into a shared library in dir
// and returns its path; it skips the test without a C compiler.
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
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return lib
}

// TestCUDABinding runs the probe through the cgo binding against a
// stand-in libcuda.so.1: dlopen, every entry point, error names, the
// kernel's launch arguments and the events.
func TestCUDABinding(t *testing.T) {
	lib := fakeLibCUDA(t)
	t.Setenv("FAKE_CUDA_LIMIT_MIB", "1000")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, err := Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(d, Params{PublishedMiB: 2000, Seconds: 0.1}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if res.Name != "Facet fake GPU" || res.DriverVersion != "13.0" || res.Devices != 1 || res.Multiprocessors != 4 {
		t.Errorf("device: %+v", res)
	}
	if res.TotalMiB != 1000 || res.FreeMiB != 1000 || res.LargestAllocMiB != 1000 {
		t.Errorf("memory: total %d, free %d, largest %d MiB; want 1000 each", res.TotalMiB, res.FreeMiB, res.LargestAllocMiB)
	}
	if res.PastLimit != (PastLimit{RequestMiB: 2001, Error: "CUDA_ERROR_OUT_OF_MEMORY"}) {
		t.Errorf("past the limit: %+v", res.PastLimit)
	}
	c := res.Compute
	if c == nil {
		t.Fatal("no compute result")
	}
	// Each fake launch takes 0.5 ms: calibration scales 256 iterations
	// to LaunchTarget.
	wantIters := int(256 * float64(LaunchTarget/time.Millisecond) / 0.5)
	if c.Grid != 32 || c.Block != 256 || c.Iters != wantIters {
		t.Errorf("launch %d × %d, %d iterations; want 32 × 256, %d", c.Grid, c.Block, c.Iters, wantIters)
	}
	want := float64(c.Grid*c.Block) * float64(c.Iters) * FLOPPerIteration / 0.5e-3 / 1e12
	if c.Launches == 0 || c.Milliseconds != 0.5*float64(c.Launches) || c.TFLOPS < want*0.99 || c.TFLOPS > want*1.01 {
		t.Errorf("compute %+v, want %.3f TFLOP/s", c, want)
	}
}

func TestOpenErrors(t *testing.T) {
	notALib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if err := os.WriteFile(notALib, []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(t.TempDir(), "libcuda.so.1"), "load "},
		{"not a library", notALib, "load "},
		{"not CUDA", "libm.so.6", "has no cuInit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Open(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open(%s) = %v, %v; want an error with %q", tc.path, d, err, tc.want)
			}
		})
	}
}
