// Package sharemem is how much of a vGPU share's memory a workload can use:
// the CUDA context that HAMi-core charges to the share's limit, with and
// without MPS, and the MPS server's memory that no share's limit counts.
// Measured on real H100 and H200 cards; the node agent (the plugin's
// published sizes) and the cluster side (facetctl occupancy) both read it,
// so it lives in the shared model rather than in pkg/node/hami.
package sharemem

// ContextChargeBytes is the CUDA context HAMi-core charges to a share's
// memory limit: HAMi-core counts the primary context against
// CUDA_DEVICE_MEMORY_LIMIT, so a workload can allocate the share's size
// less this. 543162368 bytes (518 MiB) is HAMi-core's "Primary Context
// Size" for one PyTorch 2.11 process on an H100 80GB HBM3, driver
// 580.159.04 (../shared/hardware/h100-80gb-hbm3.md): a 2000 MiB share's
// largest allocation was 1472 MiB. The H200 gave the same 518 MiB
// (nvidia-smi, one idle PyTorch process, docs/mps.md). It is one
// measurement on one card and framework; other GPUs, drivers, CUDA
// versions and libraries loaded (cuBLAS, cuDNN, NCCL) change it. An MPS
// client's context is smaller: MPSContextChargeBytes.
const ContextChargeBytes int64 = 543162368

// ContextChargeSource names the measurement behind ContextChargeBytes, for
// tools that print a usable figure.
const ContextChargeSource = "one PyTorch process's CUDA context under HAMi-core, measured on an H100 80GB HBM3 (518 MiB)"

// MPSContextBaseBytes is the part of an MPS client's CUDA context that does
// not grow with the SMs the client may use (30 MiB). See
// MPSContextChargeBytes.
const MPSContextBaseBytes int64 = 30 << 20

// MPSContextChargeBytes is the CUDA context of one process of a share that
// MPS serves at pct percent of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE;
// 0, best effort, is 100), in bytes: MPSContextBaseBytes plus pct percent
// of the rest of a whole-GPU context (ContextChargeBytes). HAMi-core charges
// it to the share's limit like any context.
//
// Source: an NVIDIA H200 (132 SMs), driver 580.159.04, CUDA 13.0, PyTorch
// 2.11, 2026-11-27 (docs/mps.md, "On a real GPU"). One idle PyTorch
// client's memory in nvidia-smi was 74, 124, 196, 276, 392 and 518 MiB at
// 10, 20, 35, 50, 75 and 100 %: 30 MiB plus 3.7 MiB per SM it sees. Through
// Facet's own prepare (facetctl node-check), HAMi-core charged 122 MiB of a
// 2000 MiB share at 20 % (this gives 127 MiB), 144 MiB of a slot at 25 %
// (152) and 274 MiB of shares at 50 % (274). The MPS server's own memory is
// not a client's: see MPSServerBytes. An H100 80GB HBM3 (132 SMs, the same
// driver) gave the same client and server figures to the MiB.
func MPSContextChargeBytes(pct int64) int64 {
	if pct <= 0 || pct > 100 {
		pct = 100
	}
	return MPSContextBaseBytes + (ContextChargeBytes-MPSContextBaseBytes)*pct/100
}

// MPSServerBytes is the GPU memory of one MPS server, which no share's
// limit counts: 66 MiB on the H200 and the H100 of MPSContextChargeBytes's source,
// whatever the number (1 to 8) and percentage of its clients. MPS runs one
// server per GPU at a time (clients of another Unix user wait for it to
// end), so the plugin keeps this much of an MPS-partitioned GPU out of the
// memory it publishes for shares and slots (inventory.Config.MPSReserveBytes).
const MPSServerBytes int64 = 66 << 20

// Usable is how much of a share of shareBytes a workload can allocate once
// HAMi-core has charged its CUDA context (ContextChargeBytes), never
// negative. It is an estimate: see ContextChargeBytes.
func Usable(shareBytes int64) int64 { return max(shareBytes-ContextChargeBytes, 0) }

// UsableMPS is Usable for a share that MPS serves at pct percent: the share
// less MPSContextChargeBytes(pct), never negative.
func UsableMPS(shareBytes, pct int64) int64 {
	return max(shareBytes-MPSContextChargeBytes(pct), 0)
}
