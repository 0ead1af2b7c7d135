package probe

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// fakeGPU is a Driver with a memory limit and a fixed speed, on a fake
// clock that each launch advances by the time it took.
type fakeGPU struct {
	// limitMiB is the largest allocation granted; totalMiB and freeMiB
	// what MemInfo reports.
	limitMiB, totalMiB, freeMiB uint64
	// allocErr, when set, is returned by every Alloc of more than 1 MiB.
	allocErr error
	// tflops is the kernel's speed; throttledAfter, when set, is the
	// clock time after which it runs at throttle × tflops.
	tflops         float64
	throttle       float64
	throttledAfter time.Duration
	sms            int
	// noKernel makes LoadKernel fail as for a module without the entry.
	noKernel bool

	clock            time.Duration
	live             map[uint64]uint64
	next             uint64
	grid, block      int
	allocs, launches int
	closed           bool
}

func (f *fakeGPU) now() time.Time { return time.Unix(0, 0).Add(f.clock) }

func (f *fakeGPU) Init() (int, error)             { return 1, nil }
func (f *fakeGPU) DriverVersion() (string, error) { return "13.0", nil }
func (f *fakeGPU) DeviceName() (string, error)    { return "NVIDIA H100 80GB HBM3", nil }
func (f *fakeGPU) Multiprocessors() (int, error)  { return f.sms, nil }
func (f *fakeGPU) CreateContext() error           { return nil }
func (f *fakeGPU) MemInfo() (uint64, uint64, error) {
	return f.freeMiB * MiB, f.totalMiB * MiB, nil
}

func (f *fakeGPU) Alloc(bytes uint64) (uint64, error) {
	f.allocs++
	if f.allocErr != nil && bytes > MiB {
		return 0, f.allocErr
	}
	if bytes > f.limitMiB*MiB {
		return 0, &Error{Call: "cuMemAlloc_v2", Code: errOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	if f.live == nil {
		f.live = map[uint64]uint64{}
	}
	f.next++
	f.live[f.next] = bytes
	return f.next, nil
}

func (f *fakeGPU) Free(ptr uint64) error {
	if _, ok := f.live[ptr]; !ok {
		return &Error{Call: "cuMemFree_v2", Code: 1, Name: "CUDA_ERROR_INVALID_VALUE"}
	}
	delete(f.live, ptr)
	return nil
}

func (f *fakeGPU) LoadKernel(ptx, name string, grid, block int) error {
	if f.noKernel || !strings.Contains(ptx, ".entry "+name+"(") {
		return &Error{Call: "cuModuleGetFunction", Code: 500, Name: "CUDA_ERROR_NOT_FOUND"}
	}
	f.grid, f.block = grid, block
	return nil
}

func (f *fakeGPU) Launch(iters, launches int) (float64, error) {
	f.launches += launches
	speed := f.tflops
	if f.throttledAfter > 0 && f.clock >= f.throttledAfter {
		speed *= f.throttle
	}
	flop := float64(launches) * float64(f.grid*f.block) * float64(iters) * FLOPPerIteration
	d := time.Duration(flop / (speed * 1e12) * float64(time.Second))
	f.clock += d
	return float64(d) / float64(time.Millisecond), nil
}

func (f *fakeGPU) Close() error { f.closed = true; return nil }

func TestLargestAlloc(t *testing.T) {
	for _, tc := range []struct {
		name            string
		limit, upper    uint64
		want, maxAllocs uint64
	}{
		{"share of 2000 MiB with the context charged", 1472, 2000, 1472, 12},
		{"whole H100", 80974, 81079, 80974, 18},
		{"limit at the upper bound", 2000, 2000, 2000, 1},
		{"limit above the upper bound", 5000, 2000, 2000, 1},
		{"nothing fits", 0, 2000, 0, 12},
		{"1 MiB", 1, 2000, 1, 12},
		{"upper bound 0", 10, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGPU{limitMiB: tc.limit}
			got, err := LargestAlloc(f, tc.upper)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("largest = %d MiB, want %d", got, tc.want)
			}
			if len(f.live) != 0 {
				t.Errorf("%d allocations left unfreed", len(f.live))
			}
			if uint64(f.allocs) > tc.maxAllocs {
				t.Errorf("%d allocations, want at most %d (a binary search)", f.allocs, tc.maxAllocs)
			}
		})
	}
}

func TestLargestAllocStopsOnOtherErrors(t *testing.T) {
	f := &fakeGPU{limitMiB: 1000, allocErr: &Error{Call: "cuMemAlloc_v2", Code: 201, Name: "CUDA_ERROR_INVALID_CONTEXT"}}
	_, err := LargestAlloc(f, 2000)
	var e *Error
	if !errors.As(err, &e) || e.Name != "CUDA_ERROR_INVALID_CONTEXT" {
		t.Fatalf("err = %v, want CUDA_ERROR_INVALID_CONTEXT", err)
	}
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name         string
		gpu          fakeGPU
		params       Params
		wantLargest  uint64
		wantPast     string
		wantTFLOPS   float64
		wantIters    int
		wantGrid     int
		wantErr      string
		wantLaunches bool
	}{
		{
			name:   "whole GPU, calibrated",
			gpu:    fakeGPU{limitMiB: 80974, totalMiB: 81079, freeMiB: 80974, tflops: 50, sms: 132},
			params: Params{PublishedMiB: 81559, Seconds: 2},
			// The search looks up to the published 81559 MiB.
			wantLargest: 80974, wantPast: "CUDA_ERROR_OUT_OF_MEMORY", wantTFLOPS: 50, wantGrid: 132 * 8, wantLaunches: true,
		},
		{
			name: "share throttled to a fifth after 1 s of 4",
			gpu: fakeGPU{limitMiB: 1472, totalMiB: 2000, freeMiB: 1480, tflops: 50, sms: 132,
				throttle: 0.2, throttledAfter: time.Second},
			params:      Params{PublishedMiB: 2000, Seconds: 4, Iters: 4096},
			wantLargest: 1472, wantPast: "CUDA_ERROR_OUT_OF_MEMORY", wantTFLOPS: 10, wantIters: 4096, wantGrid: 132 * 8, wantLaunches: true,
		},
		{
			name:   "a batch longer than the whole run",
			gpu:    fakeGPU{limitMiB: 10, totalMiB: 10, freeMiB: 10, tflops: 0.001, sms: 1},
			params: Params{PublishedMiB: 10, Seconds: 0.001, Iters: 100000},
			// The first batch starts in the first half; one more is run
			// to be measured.
			wantLargest: 10, wantPast: "CUDA_ERROR_OUT_OF_MEMORY", wantTFLOPS: 0.001, wantIters: 100000, wantGrid: 8, wantLaunches: true,
		},
		{
			name:        "limit not enforced",
			gpu:         fakeGPU{limitMiB: 80000, totalMiB: 81079, freeMiB: 80974, sms: 132},
			params:      Params{PublishedMiB: 2000},
			wantLargest: 80000, wantPast: "",
		},
		{
			name:    "no kernel entry",
			gpu:     fakeGPU{limitMiB: 10, totalMiB: 10, tflops: 1, sms: 1, noKernel: true},
			params:  Params{PublishedMiB: 10, Seconds: 1},
			wantErr: "CUDA_ERROR_NOT_FOUND", wantLargest: 10, wantPast: "CUDA_ERROR_OUT_OF_MEMORY",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.gpu
			res, err := Run(&f, tc.params, f.now)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			}
			if !f.closed {
				t.Error("the driver was not closed")
			}
			if len(f.live) != 0 {
				t.Errorf("%d allocations left", len(f.live))
			}
			if res.LargestAllocMiB != tc.wantLargest || res.PastLimit.Error != tc.wantPast {
				t.Errorf("largest %d MiB, past the limit %q; want %d, %q", res.LargestAllocMiB, res.PastLimit.Error, tc.wantLargest, tc.wantPast)
			}
			if res.PastLimit.RequestMiB != tc.params.PublishedMiB+1 {
				t.Errorf("past-the-limit request %d MiB, want %d", res.PastLimit.RequestMiB, tc.params.PublishedMiB+1)
			}
			if res.TotalMiB != f.totalMiB || res.FreeMiB != f.freeMiB || res.Multiprocessors != f.sms || res.Devices != 1 {
				t.Errorf("result %+v does not report the device", res)
			}
			if !tc.wantLaunches {
				if res.Compute != nil && tc.wantErr == "" {
					t.Errorf("compute measured without Seconds: %+v", res.Compute)
				}
				return
			}
			c := res.Compute
			if c == nil {
				t.Fatal("no compute result")
			}
			if math.Abs(c.TFLOPS-tc.wantTFLOPS)/tc.wantTFLOPS > 0.02 {
				t.Errorf("%.2f TFLOP/s, want %.2f", c.TFLOPS, tc.wantTFLOPS)
			}
			if c.Grid != tc.wantGrid || c.Block != 256 {
				t.Errorf("grid %d × %d, want %d × 256", c.Grid, c.Block, tc.wantGrid)
			}
			if tc.wantIters != 0 && c.Iters != tc.wantIters {
				t.Errorf("iters %d, want %d (given)", c.Iters, tc.wantIters)
			}
			if tc.wantIters == 0 {
				// Calibrated: one launch takes about LaunchTarget.
				one := float64(c.Grid*c.Block) * float64(c.Iters) * FLOPPerIteration / (tc.wantTFLOPS * 1e12)
				if d := time.Duration(one * float64(time.Second)); d < LaunchTarget/2 || d > LaunchTarget*2 {
					t.Errorf("calibrated launch takes %v, want about %v", d, LaunchTarget)
				}
			}
			if c.Launches == 0 || c.Launches >= f.launches {
				t.Errorf("%d launches measured of %d run: want the second half only", c.Launches, f.launches)
			}
		})
	}
}

// TestKernelPTX checks the kernel's text for what cuModuleLoadData needs
// and what the FLOP count assumes.
func TestKernelPTX(t *testing.T) {
	for _, want := range []string{".version 7.0\n", ".target sm_70\n", ".address_size 64\n", ".visible .entry " + KernelName + "("} {
		if !strings.Contains(KernelPTX, want) {
			t.Errorf("KernelPTX lacks %q", want)
		}
	}
	loop := KernelPTX[strings.Index(KernelPTX, "LOOP:"):strings.Index(KernelPTX, "DONE:")]
	if n := strings.Count(loop, "fma.rn.f32"); n*2 != FLOPPerIteration {
		t.Errorf("the loop has %d FMAs, FLOPPerIteration says %d FLOP", n, FLOPPerIteration)
	}
	if strings.Count(KernelPTX, "{") != strings.Count(KernelPTX, "}") {
		t.Error("unbalanced braces")
	}
}
