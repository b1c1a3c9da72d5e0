// Host emulation of the CUDA execution model, enough to run regen's kernels for verification:
// one OS thread per CUDA thread, blocks run one after another, __syncthreads is a block barrier,
// warp shuffles go through a per-warp exchange buffer, __shared__ variables are statics.
#pragma once
#define __shared__ static
#define __launch_bounds__(...)
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "emu_graph.h"

using std::isnan;
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline int64_t min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern dim3 gridDim, blockDim;

namespace emu {
struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<uint64_t> slots;
};
extern Block* g_block;
extern std::vector<unsigned char> g_dyn_smem;
inline float* dynamic_smem() {
  return reinterpret_cast<float*>(g_dyn_smem.data());
}
inline unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
struct Cfg {
  dim3 grid, block;
  size_t smem;
  Cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(b), smem(s) {}
};
void run_grid(const Cfg& cfg, const std::function<void()>& body);
template <class... P, class... A>
void launch(void (*kernel)(P...), Cfg cfg, A&&... args) {
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  // While the stream captures, the launch is recorded with its arguments (emu_graph.h).
  run_or_record([kernel, cfg, params] {
    run_grid(cfg, [&] {
      auto copy = params;
      std::apply(kernel, copy);
    });
  });
}
extern std::mutex atomic_mutex;
}  // namespace emu

inline void __syncthreads() {
  emu::g_block->bar->arrive_and_wait();
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  const unsigned t = emu::linear_tid(), lane = t & 31, warp = t >> 5;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::g_block->slots[t] = bits;
  emu::g_block->warp_bar[warp]->arrive_and_wait();
  const uint64_t other = emu::g_block->slots[warp * 32 + (lane ^ lane_mask)];
  emu::g_block->warp_bar[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &other, sizeof(T));
  return out;
}
// Every lane of the warp must call it (as the kernels that use it guarantee).
inline unsigned __ballot_sync(unsigned, bool pred) {
  const unsigned t = emu::linear_tid(), warp = t >> 5;
  emu::g_block->slots[t] = pred ? 1 : 0;
  emu::g_block->warp_bar[warp]->arrive_and_wait();
  unsigned word = 0;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (emu::g_block->slots[warp * 32 + lane]) word |= 1u << lane;
  }
  emu::g_block->warp_bar[warp]->arrive_and_wait();
  return word;
}
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dsub_rn(double a, double b) {
  return a - b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> l(emu::atomic_mutex);
  const unsigned long long old = *p;
  if (v < old) *p = v;
  return old;
}
template <class T>
cudaError_t cudaFuncSetAttribute(T*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
#include "emu_mma.h"  // mma, ldmatrix and cp.async for kernels/cuda/mma.cuh
