// Warp-level tensor-core primitives for regen's CUDA kernels (sm_80 and later): mma.sync
// m16n8k16 (bf16, f16) and m16n8k8 (tf32) with f32 accumulators, ldmatrix m8n8 .x1/.x2/.x4 and
// their .trans forms, cp.async of 16 bytes (.cg and .ca, with a zero-filling form) and its commit
// and wait groups, and the f32 -> tf32 rounding. Included by kernels/cuda/*.cu only.
//
// On the device these are inline PTX (compiled for __CUDA_ARCH__ >= 800; an older architecture
// traps). In the host emulation (scripts/cuda-emu, which defines REGEN_CUDA_EMU_MMA) each calls
// its emulation in scripts/cuda-emu/emu_mma.h, which builds every fragment after the PTX ISA's
// layouts, so that a wrong fragment index fails in the emulator. Fragment layouts, per lane l,
// g = l / 4, t = l % 4 (rows i, columns j, reduction index k):
//   m16n8k16 (bf16, f16): a[r] holds A(g + 8*(r%2), 2t + 8*(r/2) + {0,1}) (the lower k in the low
//     half); b[r] holds B(2t + 8r + {0,1}, g); c/d[e] is C(g + 8*(e/2), 2t + e%2).
//   m16n8k8 (tf32): a[r] holds A(g + 8*(r%2), t + 4*(r/2)); b[r] holds B(t + 4r, g); c/d as above.
// Tests: tests/cuda/test_cuda_conv_tc.cpp ("tc: ldmatrix ..." and "tc: one mma tile ..."), through
// the probe launchers of kernels/cuda/conv2d_tc.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace regen::cuda::tc {

#if defined(REGEN_CUDA_EMU_MMA)

inline void ldmatrix_x1(uint32_t r[1], const void* row) {
  emu::ldmatrix(1, false, row, r);
}
inline void ldmatrix_x2(uint32_t r[2], const void* row) {
  emu::ldmatrix(2, false, row, r);
}
inline void ldmatrix_x4(uint32_t r[4], const void* row) {
  emu::ldmatrix(4, false, row, r);
}
inline void ldmatrix_x1_trans(uint32_t r[1], const void* row) {
  emu::ldmatrix(1, true, row, r);
}
inline void ldmatrix_x2_trans(uint32_t r[2], const void* row) {
  emu::ldmatrix(2, true, row, r);
}
inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
  emu::ldmatrix(4, true, row, r);
}
inline void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu::mma<emu::MmaType::bf16>(d, a, b, c);
}
inline void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu::mma<emu::MmaType::f16>(d, a, b, c);
}
inline void mma_tf32_1688(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  emu::mma<emu::MmaType::tf32>(d, a, b, c);
}
inline void cp_async_cg16(void* smem, const void* gmem, bool valid) {
  emu::cp_async16(smem, gmem, valid ? 16u : 0u);
}
inline void cp_async_ca16(void* smem, const void* gmem, bool valid) {
  emu::cp_async16(smem, gmem, valid ? 16u : 0u);
}
inline void cp_async_commit() {
  emu::cp_async_commit();
}
template <int pending>
void cp_async_wait() {
  emu::cp_async_wait(pending);
}
inline uint32_t to_tf32(float f) {
  return emu::tf32_round_rna(f);
}

#else  // the device

// The PTX below needs sm_80. The host pass of nvcc and an older architecture get a trap instead
// (the launchers of kernels/cuda/conv2d_tc.cu refuse such a device before they launch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define REGEN_TC_PTX 1
#endif

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(smem_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(smem_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
#endif
}

__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                               const float c[4]) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}
__device__ __forceinline__ void mma_f16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}
__device__ __forceinline__ void mma_tf32_1688(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// 16 bytes from global to shared memory, asynchronously; with valid == false nothing is read and
// the 16 bytes are zeros (src-size 0), so out-of-bounds taps need no branch around the copy.
// .cg caches in L2 only (streamed operands), .ca in L1 too (operands reread by nearby blocks).
__device__ __forceinline__ void cp_async_cg16(void* smem, const void* gmem, bool valid) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_ca16(void* smem, const void* gmem, bool valid) {
#ifndef REGEN_TC_PTX
  __trap();
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef REGEN_TC_PTX
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef REGEN_TC_PTX
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// f32 -> tf32, round to nearest with ties away from zero (cvt.rna.tf32.f32); the result is an f32
// bit pattern whose low 13 bits are zero.
__device__ __forceinline__ uint32_t to_tf32(float f) {
#ifndef REGEN_TC_PTX
  __trap();
  return 0;
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return r;
#endif
}

#endif

}  // namespace regen::cuda::tc
