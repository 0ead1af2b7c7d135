// A stand-in libcuda.so.1 for the probe's tests: the driver API entry
// points the probe resolves, over a GPU with FAKE_CUDA_LIMIT_MIB of memory
// (default 1024) and 4 multiprocessors, whose every kernel launch takes
// 0.5 ms. cuModuleLoadData accepts only PTX with a .entry, and
// cuLaunchKernel checks the argument array the probe passes.
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static unsigned long long limit_mib(void) {
	const char *s = getenv("FAKE_CUDA_LIMIT_MIB");
	return s ? strtoull(s, NULL, 10) : 1024;
}

static int inited, ctx, module, launches_between;
static unsigned long long used;

CUresult cuInit(unsigned int flags) { inited = flags == 0; return inited ? 0 : 1; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int i) { if (i != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetName(char *buf, int len, int d) { strncpy(buf, "Facet fake GPU", len); return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { if (attr != 16) return 1; *v = 4; return 0; }
static int retained;
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { retained++; *c = &retained; return 0; }
CUresult cuCtxSetCurrent(void *c) { if (c != &retained || !retained) return 201; ctx = 1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { if (!retained) return 201; retained--; ctx = 0; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
	if (!ctx) return 201;
	*t = (size_t)limit_mib() << 20;
	*f = *t - used;
	return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
	if (!ctx) return 201;
	if (bytes == 0) return 1;
	if (used + bytes > limit_mib() << 20) return 2;
	used += bytes;
	*p = 0x100000000ULL + used;
	return 0;
}
// Frees are not tracked per pointer: the probe frees each allocation
// before the next, which is all this fake models.
CUresult cuMemFree_v2(CUdeviceptr p) { if (!ctx) return 201; used = 0; return 0; }
CUresult cuModuleLoadData(void **m, const void *image) {
	if (strstr((const char *)image, ".entry ") == NULL) return 218;
	module = 1;
	*m = &module;
	return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	if (m != &module) return 400;
	if (strcmp(name, "fma_loop") != 0) return 500;
	*f = &module;
	return 0;
}
CUresult cuModuleUnload(void *m) { module = 0; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shared, void *stream, void **params, void **extra) {
	if (f != &module || params == NULL || params[0] == NULL || params[1] == NULL) return 1;
	if (*(unsigned *)params[1] == 0 || gx == 0 || bx == 0) return 1;
	launches_between++;
	return 0;
}
static int events[2];
CUresult cuEventCreate(void **e, unsigned int flags) { static int n; *e = &events[n++ % 2]; return 0; }
CUresult cuEventRecord(void *e, void *stream) { if (e == &events[0]) launches_between = 0; return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { *ms = 0.5f * launches_between; return 0; }
CUresult cuEventDestroy_v2(void *e) { return 0; }
CUresult cuGetErrorName(CUresult r, const char **name) {
	switch (r) {
	case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
	case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
	case 218: *name = "CUDA_ERROR_INVALID_PTX"; return 0;
	case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
	}
	*name = "CUDA_ERROR_INVALID_VALUE";
	return 0;
}
