// Package probe is the node check's CUDA probe: what a process inside a
// claim's container can get from its GPU, measured through the CUDA driver
// API (libcuda.so.1, loaded with dlopen, so that the binary builds and runs
// without CUDA). It runs in a process of its own whose environment is the
// claim's (HAMi-core's limits and libvgpu.so preloaded where the claim's
// CDI spec has them), and measures:
//
//   - the device count and name, after cuInit, and the device's primary
//     context (cuDevicePrimaryCtxRetain), which is the context the CUDA
//     runtime, and so PyTorch, uses, and which HAMi-core hooks on every
//     CUDA version (its cuCtxCreate_v2 hook is built only for CUDA < 13);
//   - cuMemGetInfo: total and free memory as the process sees them;
//   - the largest single cuMemAlloc, by binary search in MiB;
//   - what a cuMemAlloc of the published memory plus 1 MiB returns;
//   - the throughput of a compute-bound kernel (KernelPTX) that fills
//     the GPU, timed with CUDA events.
//
// The measuring logic is plain Go over the Driver interface; cuda.go is
// the cgo binding to libcuda.so.1.
package probe

import (
	"errors"
	"fmt"
	"time"
)

// MiB is the unit of every memory figure of the probe.
const MiB = 1 << 20

// Driver is the part of the CUDA driver API the probe uses, on the
// context's one device (device 0 of the process). Every call returns an
// *Error on a CUDA error. A Driver is used by one goroutine, locked to its
// OS thread (a CUDA context is current per thread).
type Driver interface {
	// Init is cuInit(0), cuDeviceGetCount and cuDeviceGet(0).
	Init() (devices int, err error)
	// DriverVersion is cuDriverGetVersion, as "major.minor".
	DriverVersion() (string, error)
	// DeviceName is cuDeviceGetName of device 0.
	DeviceName() (string, error)
	// Multiprocessors is device 0's CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
	Multiprocessors() (int, error)
	// CreateContext retains device 0's primary context and makes it
	// current (cuDevicePrimaryCtxRetain, cuCtxSetCurrent).
	CreateContext() error
	// MemInfo is cuMemGetInfo, in bytes.
	MemInfo() (free, total uint64, err error)
	// Alloc is cuMemAlloc of bytes; Free is cuMemFree.
	Alloc(bytes uint64) (uint64, error)
	Free(ptr uint64) error
	// LoadKernel loads ptx (cuModuleLoadData), finds the entry point name
	// and allocates its output: 4 bytes for each of grid × block threads.
	LoadKernel(ptx, name string, grid, block int) error
	// Launch records an event, launches the kernel launches times with
	// iters, records a second event, waits for it and returns the time
	// between the events (cuEventElapsedTime) in milliseconds.
	Launch(iters, launches int) (ms float64, err error)
	// Close destroys what the driver created (context, module, events).
	Close() error
}

// Error is a CUDA driver API error.
type Error struct {
	// Call is the function that failed, e.g. "cuMemAlloc_v2".
	Call string
	// Code is the CUresult, e.g. 2; Name its cuGetErrorName, e.g.
	// "CUDA_ERROR_OUT_OF_MEMORY".
	Code int
	Name string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code) }

// CUDA_ERROR_OUT_OF_MEMORY.
const errOutOfMemory = 2

// IsOutOfMemory reports whether err is CUDA_ERROR_OUT_OF_MEMORY.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == errOutOfMemory
}

// Params say what to measure.
type Params struct {
	// PublishedMiB is the memory the claim's device publishes (or the
	// share consumes): the past-the-limit allocation asks for 1 MiB more,
	// and the binary search looks no higher than it or the total the
	// process sees, whichever is larger.
	PublishedMiB uint64
	// Seconds is how long the kernel runs; the throughput is taken over
	// the second half, after HAMi-core's SM throttle (which reacts after
	// seconds) has settled. Zero skips the compute measurement.
	Seconds float64
	// Iters is the kernel's loop count per launch; zero calibrates it so
	// that one launch takes about LaunchTarget. Pass the whole GPU's to a
	// share's probe so that both run the same launches.
	Iters int
	// BlocksPerSM and ThreadsPerBlock size the grid: BlocksPerSM blocks
	// for each multiprocessor. Zero means 8 and 256, which fill every
	// multiprocessor of Volta to Blackwell (2048 threads each).
	BlocksPerSM, ThreadsPerBlock int
	// Binds are host directories the probe process binds over container
	// paths before CUDA starts, in a mount namespace of its own (the
	// caller's ExecProber makes one), as a container has them: an MPS
	// client shares /dev/shm with its server, which is the GPU's tmpfs.
	Binds []Bind `json:",omitempty"`
}

// Bind is one bind mount: Host over Container.
type Bind struct{ Host, Container string }

// LaunchTarget is how long calibration makes one launch on the GPU the
// calibration runs on.
const LaunchTarget = 2 * time.Millisecond

// launchesPerBatch launches make one timed batch.
const launchesPerBatch = 20

// Result is what the probe measured. Memory is in MiB (rounded down).
type Result struct {
	DriverVersion   string `json:"driverVersion"`
	Devices         int    `json:"devices"`
	Name            string `json:"name"`
	Multiprocessors int    `json:"multiprocessors"`
	// TotalMiB and FreeMiB are cuMemGetInfo's, right after the context
	// is made.
	TotalMiB uint64 `json:"totalMiB"`
	FreeMiB  uint64 `json:"freeMiB"`
	// LargestAllocMiB is the largest single cuMemAlloc that succeeded.
	LargestAllocMiB uint64 `json:"largestAllocMiB"`
	// PastLimit is what a cuMemAlloc of PublishedMiB+1 MiB returned.
	PastLimit PastLimit `json:"pastLimit"`
	// Compute is the kernel's throughput; nil when not measured.
	Compute *Compute `json:"compute,omitempty"`
}

// PastLimit is the outcome of one allocation beyond the published memory.
type PastLimit struct {
	RequestMiB uint64 `json:"requestMiB"`
	// Error is the CUDA error name, e.g. "CUDA_ERROR_OUT_OF_MEMORY";
	// empty when the allocation succeeded (the limit does not hold).
	Error string `json:"error,omitempty"`
}

// Compute is the kernel's measured throughput.
type Compute struct {
	// Iters is the loop count of each launch; Grid and Block the launch's
	// blocks and threads per block.
	Iters int `json:"iters"`
	Grid  int `json:"grid"`
	Block int `json:"block"`
	// Launches and Milliseconds are those of the batches measured (the
	// second half of the run).
	Launches     int     `json:"launches"`
	Milliseconds float64 `json:"milliseconds"`
	// TFLOPS is FP32 tera floating-point operations per second.
	TFLOPS float64 `json:"tflops"`
}

// Run measures, in the order of the package comment, and closes d. It
// returns what it measured before a failure along with the error, which
// names the step.
func Run(d Driver, p Params, now func() time.Time) (res Result, err error) {
	defer func() {
		if cerr := d.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	if res.Devices, err = d.Init(); err != nil {
		return res, err
	}
	if res.Devices < 1 {
		return res, fmt.Errorf("cuDeviceGetCount: the process sees no GPU")
	}
	if res.DriverVersion, err = d.DriverVersion(); err != nil {
		return res, err
	}
	if res.Name, err = d.DeviceName(); err != nil {
		return res, err
	}
	if res.Multiprocessors, err = d.Multiprocessors(); err != nil {
		return res, err
	}
	if err = d.CreateContext(); err != nil {
		return res, err
	}
	free, total, err := d.MemInfo()
	if err != nil {
		return res, err
	}
	res.TotalMiB, res.FreeMiB = total/MiB, free/MiB
	if res.LargestAllocMiB, err = LargestAlloc(d, max(res.TotalMiB, p.PublishedMiB)); err != nil {
		return res, err
	}
	if res.PastLimit, err = pastLimit(d, p.PublishedMiB+1); err != nil {
		return res, err
	}
	if p.Seconds > 0 {
		c, err := compute(d, p, res.Multiprocessors, now)
		if err != nil {
			return res, err
		}
		res.Compute = c
	}
	return res, nil
}

// LargestAlloc finds, by binary search, the largest single allocation in
// whole MiB from 0 to upperMiB that d grants, freeing each one it gets.
// CUDA_ERROR_OUT_OF_MEMORY means too large; any other error ends the
// search with that error.
func LargestAlloc(d Driver, upperMiB uint64) (uint64, error) {
	try := func(mib uint64) (bool, error) {
		ptr, err := d.Alloc(mib * MiB)
		switch {
		case IsOutOfMemory(err):
			return false, nil
		case err != nil:
			return false, err
		}
		return true, d.Free(ptr)
	}
	if ok, err := try(upperMiB); err != nil || ok {
		return upperMiB, err
	}
	// Invariant: lo MiB is granted (0 trivially), hi MiB is not.
	lo, hi := uint64(0), upperMiB
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := try(mid)
		if err != nil {
			return lo, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// pastLimit allocates requestMiB and reports the error; one that succeeds
// is freed.
func pastLimit(d Driver, requestMiB uint64) (PastLimit, error) {
	out := PastLimit{RequestMiB: requestMiB}
	ptr, err := d.Alloc(requestMiB * MiB)
	if err == nil {
		return out, d.Free(ptr)
	}
	var e *Error
	if !errors.As(err, &e) {
		return out, err
	}
	out.Error = e.Name
	return out, nil
}

// compute runs the kernel for p.Seconds in batches and takes the
// throughput of the batches that started in the second half.
func compute(d Driver, p Params, sms int, now func() time.Time) (*Compute, error) {
	perSM, block := p.BlocksPerSM, p.ThreadsPerBlock
	if perSM <= 0 {
		perSM = 8
	}
	if block <= 0 {
		block = 256
	}
	c := &Compute{Grid: max(sms, 1) * perSM, Block: block, Iters: p.Iters}
	if err := d.LoadKernel(KernelPTX, KernelName, c.Grid, c.Block); err != nil {
		return nil, err
	}
	if c.Iters <= 0 {
		var err error
		if c.Iters, err = calibrate(d); err != nil {
			return nil, err
		}
	}
	start := now()
	half := start.Add(time.Duration(p.Seconds * float64(time.Second) / 2))
	end := start.Add(time.Duration(p.Seconds * float64(time.Second)))
	// At least one batch is measured in the second half, however long a
	// batch takes (a heavily throttled share's).
	for t := start; t.Before(end) || c.Launches == 0; t = now() {
		ms, err := d.Launch(c.Iters, launchesPerBatch)
		if err != nil {
			return nil, err
		}
		if !t.Before(half) {
			c.Launches += launchesPerBatch
			c.Milliseconds += ms
		}
	}
	if c.Milliseconds <= 0 {
		return nil, fmt.Errorf("cuEventElapsedTime: %d launches took %.3f ms", c.Launches, c.Milliseconds)
	}
	flop := float64(c.Launches) * float64(c.Grid) * float64(c.Block) * float64(c.Iters) * FLOPPerIteration
	c.TFLOPS = flop / (c.Milliseconds / 1000) / 1e12
	return c, nil
}

// calibrate finds the loop count for which one launch takes about
// LaunchTarget: it doubles from 256 until a launch takes a tenth of it,
// then scales.
func calibrate(d Driver) (int, error) {
	const maxIters = 1 << 24
	target := float64(LaunchTarget) / float64(time.Millisecond)
	iters := 256
	for {
		ms, err := d.Launch(iters, 1)
		if err != nil {
			return 0, err
		}
		if ms >= target/10 || iters >= maxIters {
			return max(1, min(maxIters, int(float64(iters)*target/max(ms, 1e-6)))), nil
		}
		iters *= 2
	}
}
