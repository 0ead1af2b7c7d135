//go:build cgo && linux

package probe

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The CUDA driver API's types, as cuda.h declares them (ABI-stable: the
// _v2 entry points below are what cuda.h has mapped the plain names to
// since CUDA 3.2, and every driver still exports them).
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUevent;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

#define FACET_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

typedef struct {
	void *lib;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUdeviceptr out;
	unsigned grid, block;
	CUevent start, stop;
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int *);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuMemGetInfo)(size_t *, size_t *);
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuGetErrorName)(CUresult, const char **);
} facet_cuda;

// facet_cuda_open dlopens path and resolves every entry point; on failure
// it returns NULL with *missing naming the symbol (or NULL and dlerror's
// text for the library itself).
static facet_cuda *facet_cuda_open(const char *path, const char **missing, char *why, size_t whylen) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	*missing = NULL;
	if (lib == NULL) {
		const char *e = dlerror();
		strncpy(why, e ? e : "dlopen failed", whylen - 1);
		why[whylen - 1] = 0;
		return NULL;
	}
	facet_cuda *c = calloc(1, sizeof(facet_cuda));
	if (c == NULL) {
		dlclose(lib);
		strncpy(why, "out of memory", whylen - 1);
		return NULL;
	}
	c->lib = lib;
#define SYM(field, name) \
	if ((*(void **)(&c->field) = dlsym(lib, name)) == NULL) { *missing = name; dlclose(lib); free(c); return NULL; }
	SYM(cuInit, "cuInit")
	SYM(cuDriverGetVersion, "cuDriverGetVersion")
	SYM(cuDeviceGetCount, "cuDeviceGetCount")
	SYM(cuDeviceGet, "cuDeviceGet")
	SYM(cuDeviceGetName, "cuDeviceGetName")
	SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute")
	SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
	SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
	SYM(cuCtxSetCurrent, "cuCtxSetCurrent")
	SYM(cuMemGetInfo, "cuMemGetInfo_v2")
	SYM(cuMemAlloc, "cuMemAlloc_v2")
	SYM(cuMemFree, "cuMemFree_v2")
	SYM(cuModuleLoadData, "cuModuleLoadData")
	SYM(cuModuleGetFunction, "cuModuleGetFunction")
	SYM(cuModuleUnload, "cuModuleUnload")
	SYM(cuLaunchKernel, "cuLaunchKernel")
	SYM(cuEventCreate, "cuEventCreate")
	SYM(cuEventRecord, "cuEventRecord")
	SYM(cuEventSynchronize, "cuEventSynchronize")
	SYM(cuEventElapsedTime, "cuEventElapsedTime")
	SYM(cuEventDestroy, "cuEventDestroy_v2")
	SYM(cuGetErrorName, "cuGetErrorName")
#undef SYM
	return c;
}

static const char *facet_cuda_error_name(facet_cuda *c, CUresult r) {
	const char *name = NULL;
	if (c->cuGetErrorName(r, &name) != 0 || name == NULL) {
		return "CUDA_ERROR_UNKNOWN_CODE";
	}
	return name;
}

static CUresult facet_cuda_init(facet_cuda *c, int *count) {
	CUresult r = c->cuInit(0);
	if (r != 0) return r;
	r = c->cuDeviceGetCount(count);
	if (r != 0 || *count < 1) return r;
	return c->cuDeviceGet(&c->dev, 0);
}

static CUresult facet_cuda_driver_version(facet_cuda *c, int *v) { return c->cuDriverGetVersion(v); }

static CUresult facet_cuda_name(facet_cuda *c, char *buf, int len) { return c->cuDeviceGetName(buf, len, c->dev); }

static CUresult facet_cuda_sms(facet_cuda *c, int *sms) {
	return c->cuDeviceGetAttribute(sms, FACET_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev);
}

static CUresult facet_cuda_ctx(facet_cuda *c, const char **call) {
	CUresult r;
	*call = "cuDevicePrimaryCtxRetain";
	if ((r = c->cuDevicePrimaryCtxRetain(&c->ctx, c->dev)) != 0) return r;
	*call = "cuCtxSetCurrent";
	return c->cuCtxSetCurrent(c->ctx);
}

static CUresult facet_cuda_meminfo(facet_cuda *c, unsigned long long *free_, unsigned long long *total) {
	size_t f = 0, t = 0;
	CUresult r = c->cuMemGetInfo(&f, &t);
	*free_ = f;
	*total = t;
	return r;
}

static CUresult facet_cuda_alloc(facet_cuda *c, unsigned long long bytes, CUdeviceptr *ptr) {
	return c->cuMemAlloc(ptr, (size_t)bytes);
}

static CUresult facet_cuda_free(facet_cuda *c, CUdeviceptr ptr) { return c->cuMemFree(ptr); }

static CUresult facet_cuda_load(facet_cuda *c, const char *ptx, const char *name, unsigned grid, unsigned block, const char **call) {
	CUresult r;
	*call = "cuModuleLoadData";
	if ((r = c->cuModuleLoadData(&c->mod, ptx)) != 0) return r;
	*call = "cuModuleGetFunction";
	if ((r = c->cuModuleGetFunction(&c->fn, c->mod, name)) != 0) return r;
	*call = "cuMemAlloc_v2";
	if ((r = c->cuMemAlloc(&c->out, (size_t)grid * block * 4)) != 0) return r;
	*call = "cuEventCreate";
	if ((r = c->cuEventCreate(&c->start, 0)) != 0) return r;
	if ((r = c->cuEventCreate(&c->stop, 0)) != 0) return r;
	c->grid = grid;
	c->block = block;
	return 0;
}

static CUresult facet_cuda_launch(facet_cuda *c, unsigned iters, int launches, float *ms, const char **call) {
	CUresult r;
	CUdeviceptr out = c->out;
	void *args[] = {&out, &iters};
	*call = "cuEventRecord";
	if ((r = c->cuEventRecord(c->start, NULL)) != 0) return r;
	*call = "cuLaunchKernel";
	for (int i = 0; i < launches; i++) {
		if ((r = c->cuLaunchKernel(c->fn, c->grid, 1, 1, c->block, 1, 1, 0, NULL, args, NULL)) != 0) return r;
	}
	*call = "cuEventRecord";
	if ((r = c->cuEventRecord(c->stop, NULL)) != 0) return r;
	*call = "cuEventSynchronize";
	if ((r = c->cuEventSynchronize(c->stop)) != 0) return r;
	*call = "cuEventElapsedTime";
	return c->cuEventElapsedTime(ms, c->start, c->stop);
}

static CUresult facet_cuda_close(facet_cuda *c) {
	CUresult first = 0, r;
	if (c->start) { r = c->cuEventDestroy(c->start); if (!first) first = r; }
	if (c->stop) { r = c->cuEventDestroy(c->stop); if (!first) first = r; }
	if (c->out) { r = c->cuMemFree(c->out); if (!first) first = r; }
	if (c->mod) { r = c->cuModuleUnload(c->mod); if (!first) first = r; }
	if (c->ctx) { r = c->cuDevicePrimaryCtxRelease(c->dev); if (!first) first = r; }
	return first;
}

// facet_cuda_release frees the table. libcuda stays loaded: unloading a
// driver library whose threads may still run is not safe, and the probe's
// process exits next.
static void facet_cuda_release(facet_cuda *c) { free(c); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cuda is the Driver over a dlopened libcuda.so.1.
type cuda struct {
	c *C.facet_cuda
}

// Open loads the CUDA driver library at path ("libcuda.so.1" searches the
// loader's path) with dlopen, and resolves the entry points the probe
// uses. The caller must hold its goroutine on one OS thread
// (runtime.LockOSThread) while it uses the Driver.
func Open(path string) (Driver, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var missing *C.char
	why := make([]byte, 512)
	c := C.facet_cuda_open(cpath, &missing, (*C.char)(unsafe.Pointer(&why[0])), C.size_t(len(why)))
	if c == nil {
		if missing != nil {
			return nil, fmt.Errorf("%s has no %s: not a CUDA driver library", path, C.GoString(missing))
		}
		return nil, fmt.Errorf("load %s: %s", path, C.GoString((*C.char)(unsafe.Pointer(&why[0]))))
	}
	return &cuda{c: c}, nil
}

func (d *cuda) err(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: C.GoString(C.facet_cuda_error_name(d.c, r))}
}

func (d *cuda) Init() (int, error) {
	var n C.int
	if err := d.err("cuInit/cuDeviceGetCount/cuDeviceGet", C.facet_cuda_init(d.c, &n)); err != nil {
		return int(n), err
	}
	return int(n), nil
}

func (d *cuda) DriverVersion() (string, error) {
	var v C.int
	if err := d.err("cuDriverGetVersion", C.facet_cuda_driver_version(d.c, &v)); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10), nil
}

func (d *cuda) DeviceName() (string, error) {
	buf := make([]byte, 256)
	if err := d.err("cuDeviceGetName", C.facet_cuda_name(d.c, (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString((*C.char)(unsafe.Pointer(&buf[0]))), nil
}

func (d *cuda) Multiprocessors() (int, error) {
	var n C.int
	err := d.err("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)", C.facet_cuda_sms(d.c, &n))
	return int(n), err
}

func (d *cuda) CreateContext() error {
	var call *C.char
	r := C.facet_cuda_ctx(d.c, &call)
	return d.err(C.GoString(call), r)
}

func (d *cuda) MemInfo() (free, total uint64, err error) {
	var f, t C.ulonglong
	err = d.err("cuMemGetInfo_v2", C.facet_cuda_meminfo(d.c, &f, &t))
	return uint64(f), uint64(t), err
}

func (d *cuda) Alloc(bytes uint64) (uint64, error) {
	var p C.CUdeviceptr
	err := d.err("cuMemAlloc_v2", C.facet_cuda_alloc(d.c, C.ulonglong(bytes), &p))
	return uint64(p), err
}

func (d *cuda) Free(ptr uint64) error {
	return d.err("cuMemFree_v2", C.facet_cuda_free(d.c, C.CUdeviceptr(ptr)))
}

func (d *cuda) LoadKernel(ptx, name string, grid, block int) error {
	cptx, cname := C.CString(ptx), C.CString(name)
	defer C.free(unsafe.Pointer(cptx))
	defer C.free(unsafe.Pointer(cname))
	var call *C.char
	r := C.facet_cuda_load(d.c, cptx, cname, C.uint(grid), C.uint(block), &call)
	return d.err(C.GoString(call), r)
}

func (d *cuda) Launch(iters, launches int) (float64, error) {
	var ms C.float
	var call *C.char
	r := C.facet_cuda_launch(d.c, C.uint(iters), C.int(launches), &ms, &call)
	if err := d.err(C.GoString(call), r); err != nil {
		return 0, err
	}
	return float64(ms), nil
}

func (d *cuda) Close() error {
	if d.c == nil {
		return nil
	}
	err := d.err("cuEventDestroy/cuMemFree/cuModuleUnload/cuDevicePrimaryCtxRelease", C.facet_cuda_close(d.c))
	C.facet_cuda_release(d.c)
	d.c = nil
	return err
}
