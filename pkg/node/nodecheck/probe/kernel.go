package probe

// KernelName is the entry point of KernelPTX.
const KernelName = "fma_loop"

// FLOPPerIteration is what one thread does in one round of KernelPTX's
// loop: 8 independent fused multiply-adds, 2 floating-point operations
// each.
const FLOPPerIteration = 8 * 2

// KernelPTX is a compute-bound kernel in PTX, which the CUDA driver
// compiles for the GPU at cuModuleLoadData (no CUDA toolkit needed):
//
//	fma_loop(float *out, unsigned iters)
//
// Each thread runs iters rounds of 8 independent FMA chains
// (a = a*0.999999 + 1e-6: bounded, never denormal or infinite; independent
// so that the FMA pipes, not one chain's latency, are the limit) and
// stores their sum to out[global thread index], so the loop is not dead
// code. out needs 4 bytes per thread of the grid.
//
// PTX ISA 7.0 for sm_70 runs on every GPU from Volta on (the driver
// JIT-compiles it for newer architectures). The instruction forms are the
// ones LLVM's NVPTX back end emits for the same loop (llc -march=nvptx64
// -mcpu=sm_70 -mattr=+ptx70); the hex float constants are IEEE-754
// single precision: 0f3F800000 = 1.0, 0f2F800000 = 2^-32,
// 0f3F7FFFEF = 0.999999, 0f358637BD = 1e-6.
const KernelPTX = `.version 7.0
.target sm_70
.address_size 64

.visible .entry fma_loop(
	.param .u64 fma_loop_param_out,
	.param .u32 fma_loop_param_iters
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<8>;
	.reg .f32 	%f<13>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [fma_loop_param_out];
	ld.param.u32 	%r1, [fma_loop_param_iters];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	cvt.rn.f32.u32 	%f9, %r5;
	mul.f32 	%f9, %f9, 0f2F800000;
	add.f32 	%f1, %f9, 0f3F800000;
	add.f32 	%f2, %f9, 0f3F000000;
	add.f32 	%f3, %f9, 0f3E800000;
	add.f32 	%f4, %f9, 0f3E000000;
	add.f32 	%f5, %f9, 0f3D800000;
	add.f32 	%f6, %f9, 0f3D000000;
	add.f32 	%f7, %f9, 0f3C800000;
	add.f32 	%f8, %f9, 0f3C000000;
	mov.f32 	%f10, 0f3F7FFFEF;
	mov.f32 	%f11, 0f358637BD;
	mov.u32 	%r6, 0;
	setp.eq.u32 	%p1, %r1, 0;
	@%p1 bra 	DONE;
LOOP:
	fma.rn.f32 	%f1, %f1, %f10, %f11;
	fma.rn.f32 	%f2, %f2, %f10, %f11;
	fma.rn.f32 	%f3, %f3, %f10, %f11;
	fma.rn.f32 	%f4, %f4, %f10, %f11;
	fma.rn.f32 	%f5, %f5, %f10, %f11;
	fma.rn.f32 	%f6, %f6, %f10, %f11;
	fma.rn.f32 	%f7, %f7, %f10, %f11;
	fma.rn.f32 	%f8, %f8, %f10, %f11;
	add.s32 	%r6, %r6, 1;
	setp.lt.u32 	%p2, %r6, %r1;
	@%p2 bra 	LOOP;
DONE:
	add.f32 	%f1, %f1, %f2;
	add.f32 	%f3, %f3, %f4;
	add.f32 	%f5, %f5, %f6;
	add.f32 	%f7, %f7, %f8;
	add.f32 	%f1, %f1, %f3;
	add.f32 	%f5, %f5, %f7;
	add.f32 	%f12, %f1, %f5;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r5, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.f32 	[%rd4], %f12;
	ret;
}
`
