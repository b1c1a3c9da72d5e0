// Host emulation (scripts/cuda-emu) of the warp-level tensor-core instructions that
// kernels/cuda/mma.cuh wraps: mma.sync m16n8k16 (bf16, f16) and m16n8k8 (tf32) with f32
// accumulators, ldmatrix m8n8 .x1/.x2/.x4 (.trans) of b16, and cp.async with its commit and wait
// groups. Included once, from emu.h; it defines REGEN_CUDA_EMU_MMA, which makes mma.cuh call the
// functions below instead of its inline PTX.
//
// Fragments follow the PTX ISA's layouts ("Matrix fragments for mma.m16n8k16" and "...m16n8k8",
// "Warp-level matrix load instruction: ldmatrix"): every lane publishes a pointer to its own
// registers (or its row address) in the warp's exchange slots, the warp meets at a barrier, and
// each lane builds its own result from the other lanes' registers, as the hardware's crossbar
// does; a second barrier keeps the registers alive until every lane has read them. So a kernel
// that puts an element in the wrong register, or supplies the wrong row address, computes a wrong
// tile here. Every lane of the warp must take part (as on the GPU, where .aligned requires it).
//
// Arithmetic: the products of two bf16, two f16 or two tf32 values are exact in f32 (at most 22
// significant bits), and they are added to the accumulator one after another in k order, each sum
// rounded to nearest f32. The tensor cores add in an order and with an internal width of their own,
// so results agree with a GPU to the f32 roundoff of a length-16 (or 8) sum, not bit for bit.
// tf32 operands: the tensor core reads the top 19 bits of each 32-bit register (sign, 8 exponent
// bits, 10 mantissa bits); the emulation truncates the same way (the low 13 bits are ignored).
// Kernels that want round-to-nearest convert first (to_tf32 in mma.cuh: cvt.rna.tf32.f32, round
// to nearest with ties away from zero, emulated by tf32_round_rna below).
//
// cp.async: a copy is queued when it is issued and performed when a cp.async.wait_group lets it
// complete at the latest (the oldest groups first); the shared memory it targets holds its old
// bytes (NaN poison, in dynamic shared memory) until then. So a kernel that reads a stage before
// waiting for its group reads poison here, as it could read stale data on a GPU.
#pragma once
#define REGEN_CUDA_EMU_MMA 1

#include <cstdio>
#include <cstdlib>
#include <deque>

#include "regen/core/half.h"

namespace emu {

[[noreturn]] inline void mma_fail(const char* what) {
  std::fprintf(stderr, "emu: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y,
               blockIdx.z, linear_tid());
  std::abort();
}

// Publishes `mine` in this lane's slot, lets `use(lane)` read every lane's pointer, and keeps the
// pointed-to registers alive until the whole warp has read them.
template <class Use>
void warp_exchange(const void* mine, Use&& use) {
  const unsigned t = linear_tid(), warp = t >> 5;
  const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  if (nt < 32 * (warp + 1)) mma_fail("a warp-collective matrix instruction in a partial warp");
  g_block->slots[t] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(mine));
  g_block->warp_bar[warp]->arrive_and_wait();
  use([&](unsigned lane) {
    return reinterpret_cast<const void*>(static_cast<uintptr_t>(g_block->slots[warp * 32 + lane]));
  });
  g_block->warp_bar[warp]->arrive_and_wait();
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 ------------------------------------
// Lanes 8j..8j+7 supply the addresses of rows 0..7 of matrix j (16 bytes each, 16-byte aligned).
// Without .trans lane l receives, in register j, elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of
// matrix j (the lower column in the low half); with .trans, elements (2(l%4), l/4) and
// (2(l%4)+1, l/4).
inline void ldmatrix(int count, bool trans, const void* row, uint32_t* regs) {
  if ((reinterpret_cast<uintptr_t>(row) & 15u) != 0 && (linear_tid() & 31) < 8u * count) {
    mma_fail("ldmatrix row address not 16-byte aligned");
  }
  warp_exchange(row, [&](auto row_of) {
    const unsigned lane = linear_tid() & 31, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < count; ++j) {
      uint16_t half[2];
      for (unsigned h = 0; h < 2; ++h) {
        const unsigned r = trans ? 2 * t + h : g, c = trans ? g : 2 * t + h;
        std::memcpy(&half[h], static_cast<const unsigned char*>(row_of(8 * j + r)) + 2 * c, 2);
      }
      regs[j] = static_cast<uint32_t>(half[0]) | (static_cast<uint32_t>(half[1]) << 16);
    }
  });
}

// ---- mma.sync.aligned
// ----------------------------------------------------------------------------
enum class MmaType { bf16, f16, tf32 };

inline float tf32_truncate(uint32_t bits) {
  return regen::half::float_of(bits & 0xffffe000u);
}
// cvt.rna.tf32.f32: round to nearest, ties away from zero, into the top 19 bits. A NaN stays a NaN
// (canonical), an infinity stays; a finite value may round up to infinity.
inline uint32_t tf32_round_rna(float f) {
  const uint32_t u = regen::half::bits_of(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return (u & 0x7fffffu) ? 0x7fffffffu : u;
  return (u + 0x1000u) & 0xffffe000u;
}

struct MmaRegs {
  uint32_t a[4], b[2];
};

// D = A (16 x K, row) * B (K x 8, col) + C, K = 16 for bf16/f16, 8 for tf32. Lane l (g = l/4,
// t = l%4) holds C/D elements (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
// m16n8k16, 16-bit: A element (i, k) is in lane (i%8)*4 + (k%8)/2, register 2*(k>=8) + (i>=8),
//   half k%2; B element (k, j) is in lane j*4 + (k%8)/2, register (k>=8), half k%2.
// m16n8k8, tf32: A element (i, k) is in lane (i%8)*4 + k%4, register 2*(k>=4) + (i>=8);
//   B element (k, j) is in lane j*4 + k%4, register (k>=4).
template <MmaType type>
void mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  MmaRegs mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  float out[4];
  warp_exchange(&mine, [&](auto regs_of) {
    auto lane_regs = [&](unsigned l) { return static_cast<const MmaRegs*>(regs_of(l)); };
    auto half_value = [](uint32_t reg, unsigned h) {
      const uint16_t bits = static_cast<uint16_t>(h ? reg >> 16 : reg & 0xffffu);
      return type == MmaType::bf16 ? regen::half::from_bf16(bits) : regen::half::from_fp16(bits);
    };
    auto a_at = [&](unsigned i, unsigned k) {
      if constexpr (type == MmaType::tf32) {
        return tf32_truncate(lane_regs((i % 8) * 4 + k % 4)->a[2 * (k >= 4) + (i >= 8)]);
      } else {
        return half_value(lane_regs((i % 8) * 4 + (k % 8) / 2)->a[2 * (k >= 8) + (i >= 8)], k % 2);
      }
    };
    auto b_at = [&](unsigned k, unsigned j) {
      if constexpr (type == MmaType::tf32) {
        return tf32_truncate(lane_regs(j * 4 + k % 4)->b[k >= 4]);
      } else {
        return half_value(lane_regs(j * 4 + (k % 8) / 2)->b[k >= 8], k % 2);
      }
    };
    constexpr unsigned kDepth = type == MmaType::tf32 ? 8 : 16;
    const unsigned lane = linear_tid() & 31, g = lane >> 2, t = lane & 3;
    for (unsigned e = 0; e < 4; ++e) {
      const unsigned i = g + 8 * (e >> 1), j = 2 * t + (e & 1);
      float acc = c[e];
      for (unsigned k = 0; k < kDepth; ++k) acc += a_at(i, k) * b_at(k, j);
      out[e] = acc;
    }
  });
  std::memcpy(d, out, sizeof out);  // d may alias c
}

// ---- cp.async.{ca,cg}.shared.global [dst], [src], 16, src_bytes --------------------------------
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned src_bytes;  // the rest of the 16 bytes are zeros
};
struct AsyncCopies {
  std::vector<AsyncCopy> open;                   // issued, not yet committed
  std::deque<std::vector<AsyncCopy>> committed;  // oldest first
};
inline thread_local AsyncCopies t_async;

inline void cp_async16(void* dst, const void* src, unsigned src_bytes) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15u) != 0 || (reinterpret_cast<uintptr_t>(src) & 15u)) {
    mma_fail("cp.async of 16 bytes with an address not 16-byte aligned");
  }
  if (src_bytes > 16) mma_fail("cp.async with src-size over 16");
  t_async.open.push_back({dst, src, src_bytes});
}
inline void cp_async_commit() {
  t_async.committed.push_back(std::move(t_async.open));
  t_async.open.clear();
}
// Completes every committed group but the `pending` most recent ones.
inline void cp_async_wait(int pending) {
  while (static_cast<int>(t_async.committed.size()) > pending) {
    for (const AsyncCopy& c : t_async.committed.front()) {
      unsigned char bytes[16] = {};
      std::memcpy(bytes, c.src, c.src_bytes);
      std::memcpy(c.dst, bytes, 16);
    }
    t_async.committed.pop_front();
  }
}

}  // namespace emu
