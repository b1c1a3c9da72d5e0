// CPU reference of fused multi-head self-attention on the packed qkv layout of kernels/shapes.h
// (declared in kernels/kernels.h); the CUDA flash-style kernels are checked against it.
//
// Per (batch, head): scores = scale * q k^T by cpu::gemm on strided views of qkv (row stride
// 3*D), key-padding and causal masks, a stable softmax whose row logsumexp is stored in lse,
// dropout on the probabilities from Philox, then out = P v written with heads merged. Backward
// recomputes P from q, k and lse (nothing S x S lives between forward and backward).
//
// Threads: where a head's products are small (heads_in_parallel: at most 16 MFLOP, and not causal
// past 256), the heads run in parallel, each on one thread, with every thread's scratch (its S x S
// matrices and its products' packing, gemm_lowp with scratch) in one workspace requested before
// the threads start: the allocator sees one request whatever the timing, and the remat simulator
// relies on that order being reproducible (the size follows the thread count). Elsewhere the
// (batch, head) loop runs on the calling thread, the row-wise work (softmax, masks, dropout, dS) is
// split over rows with OpenMP, and each GEMM threads itself when large enough, taking its packing
// buffers from the allocator on every call; the scratch is then one S x S buffer (two in
// backward). In a dry run (kernels.h, kDryRunLaunchers) the same requests are made in the same
// order, and nothing is computed.
//
// 16-bit qkv (bf16, f16): attention_forward_lowp / attention_backward_lowp below, f32 inside.
//
// Tests: tests/test_amp_gemm_ops.cpp (16-bit), tests/test_ops_nlp.cpp (values vs plain loops,
// masks, dropout bits),
// tests/test_gradcheck_nlp.cpp (gradients).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "regen/core/philox.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/philox_words.h"
#include "regen/kernels/cpu/softmax_rows.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 12;  // S*S elements below which rows stay on one thread

// Causal attention past one block of kCausalRows rows runs by row blocks: block [r0, r1) needs the
// keys [0, r1) only, so the products and the row work skip the masked upper triangle (at S = 1024,
// 62.5% of the full products). The block is the packed GEMM's depth block, so every sum runs over
// the same depth blocks in the same order as the whole product would, and the skipped terms are
// the masked ones (exact zeros): by construction the sums should be the whole products' for finite
// inputs (not compared bit for bit; tests/test_ops_nlp.cpp checks them against f64 whole
// products). The products go to the packed GEMM (gemm_lowp, f32 sums) directly; f64 keeps the
// whole products.
constexpr int64_t kCausalRows = packed::kKC;
bool causal_blocks(const AttentionShape& s) {
  return s.causal && s.S > kCausalRows;
}

// Rows [0, rows) x [0, cols) of an f32 matrix, rows ld apart, set to zero.
void zero_rows(float* p, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) std::fill(p + i * ld, p + i * ld + cols, 0.0f);
}

// A row's dropout words come this many at a time from philox_words (kernels/cpu/philox_words.h):
// the bits of philox_word for each score, drawn before the loop that applies them.
constexpr int64_t kWordRun = 256;

struct HeadView {
  int64_t D, ld_qkv;       // model width and qkv row stride (3*D)
  int64_t qkv_offset;      // first element of this head's q row 0 in qkv
  int64_t out_offset;      // first element of this head's row 0 in out / dout
  const int32_t* key_pad;  // this batch's (S) row, or null
  uint64_t dropout_base;   // Philox element index of score (0, 0)
};

HeadView head_view(const AttentionShape& s, int64_t b, int64_t h, const int32_t* key_pad) {
  const int64_t D = s.H * s.Dh;
  HeadView v;
  v.D = D;
  v.ld_qkv = 3 * D;
  v.qkv_offset = b * s.S * 3 * D + h * s.Dh;
  v.out_offset = b * s.S * D + h * s.Dh;
  v.key_pad = key_pad ? key_pad + b * s.S : nullptr;
  v.dropout_base = static_cast<uint64_t>((b * s.H + h) * s.S) * static_cast<uint64_t>(s.S);
  return v;
}

// Forward, rows of one (batch, head): P (S, S) holds the scores (times score_scale, applied here
// when it is not 1) and becomes the probabilities, dropped out; lse_bh: (S) the rows' logsumexp.
// A is the type the scores are computed in (f32 for 16-bit tensors).
// Rows [i0, i1) only, and of each only the keys [0, cols) (the causal row blocks: the keys past
// the block's last row are masked for all of its rows, and never computed).
template <class A>
void forward_rows(A* P, A* lse_bh, const HeadView& v, const AttentionShape& s, A score_scale,
                  uint64_t threshold, A keep_scale, int64_t i0, int64_t i1, int64_t cols) {
  const int64_t S = s.S;
  const bool dropout = threshold > 0;
#pragma omp parallel for schedule(static) if ((i1 - i0) * cols > kParallelMin)
  for (int64_t i = i0; i < i1; ++i) {
    A* row = P + i * S;
    if (score_scale != A(1)) {
      for (int64_t j = 0; j < cols; ++j) row[j] *= score_scale;
    }
    // Masked keys: padded ones, and (causal) those past the row. Tested in separate loops, for
    // the reason given at ds_span.
    if (v.key_pad) {
      for (int64_t j = 0; j < cols; ++j) {
        if (v.key_pad[j] != 0) row[j] = -INFINITY;
      }
    }
    if (s.causal) std::fill(row + std::min(cols, i + 1), row + cols, -INFINITY);
    const A mx = row_max(row, cols);
    if (mx == -INFINITY) {  // no visible key: output 0, and backward sees P = 0
      lse_bh[i] = -INFINITY;
      std::fill(row, row + cols, A(0));
      continue;
    }
    // A masked score gives exp(-inf) = 0.
    const double sum = row_exp_in_place(row, cols, mx);
    lse_bh[i] = static_cast<A>(static_cast<double>(mx) + std::log(sum));
    const A inv = static_cast<A>(1.0 / sum);
    if (!dropout) {
      for (int64_t j = 0; j < cols; ++j) row[j] *= inv;
    } else {
      const uint64_t base = v.dropout_base + static_cast<uint64_t>(i * S);
      const A kept = inv * keep_scale;
      uint32_t words[kWordRun];
      for (int64_t j0 = 0; j0 < cols; j0 += kWordRun) {
        const int64_t len = std::min(kWordRun, cols - j0);
        philox_words(s.seed, s.stream, base + static_cast<uint64_t>(j0), len, words);
        apply_dropout_words(words, len, threshold, kept, row + j0, row + j0);
      }
    }
  }
}

// Keys [j0, j1) of one backward row: p = exp(a - l) (0 where key_pad marks the key, or for every
// key when `masked`), then a = p m (Pd, for dV) and bm = p (bm m - row_term) scale (dS, scale
// folded in for dQ and dK), m = keep_scale or 0 by the key's dropout word (words[j - j0]; m = 1
// without dropout: words null). Split by the caller so that the common spans (no padding) have no
// per-key mask test and vectorize.
template <class A>
void ds_span(A* a, A* bm, int64_t j0, int64_t j1, const int32_t* key_pad, A l, A row_term, A scale,
             const uint32_t* words, uint64_t threshold, A keep_scale, bool masked = false) {
  if (masked) {
    for (int64_t j = j0; j < j1; ++j) {
      const A m = !words ? A(1) : words[j - j0] >= threshold ? keep_scale : A(0);
      a[j] = A(0) * m;
      bm[j] = A(0) * (bm[j] * m - row_term) * scale;
    }
    return;
  }
  if (!words) {
    if (key_pad) {
      for (int64_t j = j0; j < j1; ++j) {
        const A p = key_pad[j] != 0 ? A(0) : row_exp(a[j] - l);
        a[j] = p;
        bm[j] = p * (bm[j] - row_term) * scale;
      }
    } else {
      for (int64_t j = j0; j < j1; ++j) {
        const A p = row_exp(a[j] - l);
        a[j] = p;
        bm[j] = p * (bm[j] - row_term) * scale;
      }
    }
    return;
  }
  // Two loops, not one testing `key_pad &&` per key: GCC vectorized that test into a masked load
  // from key_pad + j even when key_pad is null, and a masked-off load from an unmapped page costs
  // a microcode assist per vector on AMD Zen 4 (half of this function's time, 2026-12-01).
  if (key_pad) {
    for (int64_t j = j0; j < j1; ++j) {
      const A p = key_pad[j] != 0 ? A(0) : row_exp(a[j] - l);
      const A m = words[j - j0] >= threshold ? keep_scale : A(0);
      a[j] = p * m;
      bm[j] = p * (bm[j] * m - row_term) * scale;
    }
    return;
  }
  for (int64_t j = j0; j < j1; ++j) {
    const A p = row_exp(a[j] - l);
    const A m = words[j - j0] >= threshold ? keep_scale : A(0);
    a[j] = p * m;
    bm[j] = p * (bm[j] * m - row_term) * scale;
  }
}

// Backward, rows of one (batch, head): Am (S, S) holds the scores (times score_scale, applied
// here when it is not 1) and becomes Pd, the dropped-out probabilities; Bm (S, S) holds
// dPd = dO v^T and becomes dS, with `scale` folded in. dO, O: this head's (S, Dh) rows, v.D apart,
// of element type T (16-bit or A).
// Rows [i0, i1) and keys [0, cols), as forward_rows.
template <class A, class T>
void backward_rows(A* Am, A* Bm, const A* lse_bh, const T* dO, const T* O, const HeadView& v,
                   const AttentionShape& s, A score_scale, A scale, uint64_t threshold,
                   A keep_scale, int64_t i0, int64_t i1, int64_t cols) {
  const int64_t S = s.S, Dh = s.Dh;
  const bool dropout = threshold > 0;
#pragma omp parallel for schedule(static) if ((i1 - i0) * cols > kParallelMin)
  for (int64_t i = i0; i < i1; ++i) {
    A* a = Am + i * S;
    A* bm = Bm + i * S;
    const A l = lse_bh[i];
    if (l == -INFINITY) {  // a row with no visible key contributes nothing
      std::fill(a, a + cols, A(0));
      std::fill(bm, bm + cols, A(0));
      continue;
    }
    if (score_scale != A(1)) {
      for (int64_t j = 0; j < cols; ++j) a[j] *= score_scale;
    }
    // <dO_i, O_i> = sum_j P_ij dP_ij, the softmax-backward row term (dropout included).
    double dot = 0;
    for (int64_t d = 0; d < Dh; ++d) {
      dot += static_cast<double>(static_cast<A>(dO[i * v.D + d])) *
             static_cast<double>(static_cast<A>(O[i * v.D + d]));
    }
    const A row_term = static_cast<A>(dot);
    // Keys past `visible` are masked (causal); below it, masked only where padded.
    const int64_t visible = s.causal ? std::min(cols, i + 1) : cols;
    if (!dropout) {
      ds_span<A>(a, bm, 0, visible, v.key_pad, l, row_term, scale, nullptr, 0, A(1));
      ds_span<A>(a, bm, visible, cols, nullptr, l, row_term, scale, nullptr, 0, A(1), true);
    } else {
      const uint64_t base = v.dropout_base + static_cast<uint64_t>(i * S);
      uint32_t words[kWordRun];
      for (int64_t j0 = 0; j0 < cols; j0 += kWordRun) {
        const int64_t j1 = std::min(j0 + kWordRun, cols), split = std::clamp(visible, j0, j1);
        philox_words(s.seed, s.stream, base + static_cast<uint64_t>(j0), j1 - j0, words);
        ds_span<A>(a, bm, j0, split, v.key_pad, l, row_term, scale, words, threshold, keep_scale);
        ds_span<A>(a, bm, split, j1, nullptr, l, row_term, scale, words + (split - j0), threshold,
                   keep_scale, true);
      }
    }
  }
}

// dst (rows, cols), rows ld apart = src (rows, cols) contiguous, rounded once to 16 bits.
template <class E>
void store_rows(const float* src, E* dst, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) convert::narrow_span(src + i * cols, dst + i * ld, cols);
}

// ---- Heads in parallel (f32, bf16, f16) ---------------------------------------------------------
// Where a head's products are small (the seed Transformer's (128, 128, 64): 2 MFLOP), threading
// each product costs more than it saves: a fork and a join per product and per row pass, halves
// of a few hundred microseconds. There the heads run in parallel instead, each on one thread from
// start to end (its products on that thread, kernels/cpu/gemm_lowp.h with scratch), and a head's
// bits do not depend on which thread or how many. The scratch of every thread (its S x S
// matrices, its f32 (S, Dh) buffer for 16-bit outputs, its products' packing) is one workspace
// requested before the threads start, so the allocator sees one request whatever the timing; its
// size follows the thread count, as the packed GEMM's own workspace does.
constexpr double kHeadsParallelMaxFlops = 16e6;  // 2 S S Dh: S up to 353 at Dh = 64

bool heads_in_parallel(const AttentionShape& s) {
  return !causal_blocks(s) && 2.0 * static_cast<double>(s.S) * s.S * s.Dh <= kHeadsParallelMaxFlops;
}

int64_t round_up16(int64_t n) {
  return (n + 15) / 16 * 16;  // keeps every part of a thread's scratch 64-byte aligned
}

// One thread's scratch: `matrices` S x S f32 matrices, an (S, Dh) f32 buffer when the outputs are
// 16-bit, and the packing of the largest product (S x S over Dh, or S x Dh over S).
struct HeadScratch {
  int64_t matrix, buffer, packing;
  int64_t floats(int matrices) const { return matrices * matrix + buffer + packing; }
};
HeadScratch head_scratch(const AttentionShape& s, bool wide_out) {
  const int64_t S = s.S, Dh = s.Dh;
  return {round_up16(S * S), wide_out ? 0 : round_up16(S * Dh),
          round_up16(std::max(gemm_lowp_scratch(S, S, Dh), gemm_lowp_scratch(S, Dh, S)))};
}

// One thread where the whole call is small (transformer-tiny's heads: a fork and a join would cost
// more than the products, and a join waits for a core that another process holds), as the packed
// GEMM decides for one product (packed::kParallelFlops).
int head_threads(const AttentionShape& s) {
  const double flops = 4.0 * static_cast<double>(s.B) * s.H * s.S * s.S * s.Dh;  // QK^T and P v
  if (omp_in_parallel() || flops < packed::kParallelFlops) return 1;
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), s.B * s.H)));
}

// What both passes share: the dropout's threshold and scale, each thread's scratch (`matrices`
// S x S matrices first) and the one workspace that holds every thread's, requested here, on the
// calling thread.
struct HeadsCall {
  uint64_t threshold;
  float keep_scale;
  HeadScratch hs;
  int threads;
  int64_t per_thread;
  Workspace ws;
  HeadsCall(const AttentionShape& s, bool wide_out, int matrices)
      : threshold(dropout_threshold(s.dropout_p)),
        keep_scale(s.dropout_p < 1.0f ? 1.0f / (1.0f - s.dropout_p) : 0.0f),
        hs(head_scratch(s, wide_out)),
        threads(head_threads(s)),
        per_thread(hs.floats(matrices)),
        ws(Device::cpu(), static_cast<uint64_t>(threads * per_thread) * sizeof(float)) {}
  // The calling thread's scratch (inside the parallel loop).
  float* scratch() const { return ws.as<float>() + omp_get_thread_num() * per_thread; }
};

// E: float, bfloat16 or float16; lse f32.
template <class E>
void attention_forward_heads(const E* qkv, const int32_t* key_pad, E* out, float* lse,
                             const AttentionShape& s) {
  constexpr bool wide = std::is_same_v<E, float>;
  const int64_t S = s.S, Dh = s.Dh;
  const DType dt = dtype_of<E>::value;
  const HeadsCall call(s, wide, 1);
  if (dry_run_active()) return;
  const double serial = std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) num_threads(call.threads)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    float* const P = call.scratch();
    float* const o = P + call.hs.matrix;
    float* const pack = o + call.hs.buffer;
    const int64_t b = bh / s.H, h = bh % s.H;
    const HeadView v = head_view(s, b, h, key_pad);
    const E* q = qkv + v.qkv_offset;
    const E* k = q + v.D;
    const E* val = q + 2 * v.D;
    gemm_lowp(false, true, S, S, Dh, dt, q, v.ld_qkv, dt, k, v.ld_qkv, nullptr, false, P, S, serial,
              pack);
    forward_rows<float>(P, lse + bh * S, v, s, s.scale, call.threshold, call.keep_scale, 0, S, S);
    if constexpr (wide) {
      gemm_lowp(false, false, S, Dh, S, DType::f32, P, S, dt, val, v.ld_qkv, nullptr, false,
                out + v.out_offset, v.D, serial, pack);
    } else {
      gemm_lowp(false, false, S, Dh, S, DType::f32, P, S, dt, val, v.ld_qkv, nullptr, false, o, Dh,
                serial, pack);
      store_rows(o, out + v.out_offset, S, Dh, v.D);
    }
  }
}

template <class E>
void attention_backward_heads(const E* dout, const E* qkv, const E* out, const float* lse,
                              const int32_t* key_pad, E* dqkv, const AttentionShape& s) {
  constexpr bool wide = std::is_same_v<E, float>;
  const int64_t S = s.S, Dh = s.Dh;
  const DType dt = dtype_of<E>::value, f = DType::f32;
  const HeadsCall call(s, wide, 2);
  if (dry_run_active()) return;
  const double serial = std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) num_threads(call.threads)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    // A: scores, then P, then the dropped-out Pd that dV needs. Bm: dPd = dO v^T, then dS.
    float* const A = call.scratch();
    float* const Bm = A + call.hs.matrix;
    float* const g = Bm + call.hs.matrix;
    float* const pack = g + call.hs.buffer;
    const int64_t b = bh / s.H, h = bh % s.H;
    const HeadView v = head_view(s, b, h, key_pad);
    const E* q = qkv + v.qkv_offset;
    const E* k = q + v.D;
    const E* val = q + 2 * v.D;
    const E* dO = dout + v.out_offset;
    const E* O = out + v.out_offset;
    E* dq = dqkv + v.qkv_offset;
    E* dk = dq + v.D;
    E* dv = dq + 2 * v.D;
    gemm_lowp(false, true, S, S, Dh, dt, q, v.ld_qkv, dt, k, v.ld_qkv, nullptr, false, A, S, serial,
              pack);
    gemm_lowp(false, true, S, S, Dh, dt, dO, v.D, dt, val, v.ld_qkv, nullptr, false, Bm, S, serial,
              pack);
    backward_rows<float>(A, Bm, lse + bh * S, dO, O, v, s, s.scale, s.scale, call.threshold,
                         call.keep_scale, 0, S, S);
    // dv = Pd^T dO, dq = dS k, dk = dS^T q: straight into dqkv (f32), or each through g.
    if constexpr (wide) {
      gemm_lowp(true, false, S, Dh, S, f, A, S, dt, dO, v.D, nullptr, false, dv, v.ld_qkv, serial,
                pack);
      gemm_lowp(false, false, S, Dh, S, f, Bm, S, dt, k, v.ld_qkv, nullptr, false, dq, v.ld_qkv,
                serial, pack);
      gemm_lowp(true, false, S, Dh, S, f, Bm, S, dt, q, v.ld_qkv, nullptr, false, dk, v.ld_qkv,
                serial, pack);
    } else {
      gemm_lowp(true, false, S, Dh, S, f, A, S, dt, dO, v.D, nullptr, false, g, Dh, serial, pack);
      store_rows(g, dv, S, Dh, v.ld_qkv);
      gemm_lowp(false, false, S, Dh, S, f, Bm, S, dt, k, v.ld_qkv, nullptr, false, g, Dh, serial,
                pack);
      store_rows(g, dq, S, Dh, v.ld_qkv);
      gemm_lowp(true, false, S, Dh, S, f, Bm, S, dt, q, v.ld_qkv, nullptr, false, g, Dh, serial,
                pack);
      store_rows(g, dk, S, Dh, v.ld_qkv);
    }
  }
}

// ---- 16-bit qkv (bf16, f16) ---------------------------------------------------------------------
// A head's products thread from 2 MFLOP, as the f32 path's (cpu::gemm) do, rather than the packed
// GEMM's 4: the seed Transformer's (128, 128, 64) products ran on one thread of two, and its
// 16-bit attention (forward and backward) took 1.45-1.6x the f32 attention's time on AVX2,
// 1.07-1.10x after (docs/results.md, fifteenth session).
constexpr double kHeadParallelFlops = 2e6;

// The products by cpu::gemm_lowp (16-bit operands widened as they are packed, f32 accumulation,
// f32 C): scores and P in f32 (the scale applied to the f32 scores), the softmax and lse in f32,
// P v from the f32 P and the 16-bit v into an f32 (S, Dh) buffer that is rounded once into out.
// Backward alike: every S x S matrix f32, dV, dQ, dK each into the f32 buffer, then rounded once.
// The dropout mask is the f32 path's: the same Philox words at the same indices.
template <class E>
void attention_forward_lowp(const E* qkv, const int32_t* key_pad, E* out, float* lse,
                            const AttentionShape& s) {
  const int64_t S = s.S, Dh = s.Dh;
  const DType dt = dtype_of<E>::value;
  const uint64_t threshold = dropout_threshold(s.dropout_p);
  const float keep_scale = s.dropout_p < 1.0f ? 1.0f / (1.0f - s.dropout_p) : 0.0f;
  Workspace ws(Device::cpu(), static_cast<uint64_t>(S * S) * sizeof(float));
  Workspace out_ws(Device::cpu(), static_cast<uint64_t>(S * Dh) * sizeof(float));
  float* P = ws.as<float>();
  float* o = out_ws.as<float>();
  const bool dry = dry_run_active();
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const HeadView v = head_view(s, b, h, key_pad);
      const E* q = qkv + v.qkv_offset;
      const E* k = q + v.D;
      const E* val = q + 2 * v.D;
      float* lse_bh = lse + (b * s.H + h) * S;
      const int64_t block = causal_blocks(s) ? kCausalRows : S;
      for (int64_t r0 = 0; r0 < S; r0 += block) {
        const int64_t r1 = std::min(S, r0 + block), rows = r1 - r0, keys = block < S ? r1 : S;
        gemm_lowp(false, true, rows, keys, Dh, dt, q + r0 * v.ld_qkv, v.ld_qkv, dt, k, v.ld_qkv,
                  nullptr, false, P + r0 * S, S, kHeadParallelFlops);
        if (!dry)
          forward_rows<float>(P, lse_bh, v, s, s.scale, threshold, keep_scale, r0, r1, keys);
        gemm_lowp(false, false, rows, Dh, keys, DType::f32, P + r0 * S, S, dt, val, v.ld_qkv,
                  nullptr, false, o + r0 * Dh, Dh, kHeadParallelFlops);
      }
      if (!dry) store_rows(o, out + v.out_offset, S, Dh, v.D);
    }
  }
}

template <class E>
void attention_backward_lowp(const E* dout, const E* qkv, const E* out, const float* lse,
                             const int32_t* key_pad, E* dqkv, const AttentionShape& s) {
  const int64_t S = s.S, Dh = s.Dh;
  const DType dt = dtype_of<E>::value;
  const uint64_t threshold = dropout_threshold(s.dropout_p);
  const float keep_scale = s.dropout_p < 1.0f ? 1.0f / (1.0f - s.dropout_p) : 0.0f;
  // By causal row blocks, dV and dK are sums over the blocks: each has its own f32 buffer then.
  const bool blocks = causal_blocks(s);
  Workspace ws(Device::cpu(), 2 * static_cast<uint64_t>(S * S) * sizeof(float));
  Workspace grad_ws(Device::cpu(),
                    (blocks ? 3 : 1) * static_cast<uint64_t>(S * Dh) * sizeof(float));
  float* A = ws.as<float>();
  float* Bm = A + S * S;
  float* g = grad_ws.as<float>();
  const bool dry = dry_run_active();
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const HeadView v = head_view(s, b, h, key_pad);
      const E* q = qkv + v.qkv_offset;
      const E* k = q + v.D;
      const E* val = q + 2 * v.D;
      const E* dO = dout + v.out_offset;
      const E* O = out + v.out_offset;
      E* dq = dqkv + v.qkv_offset;
      E* dk = dq + v.D;
      E* dv = dq + 2 * v.D;
      const float* lse_bh = lse + (b * s.H + h) * S;
      if (blocks) {
        float* gv = g;
        float* gq = g + S * Dh;
        float* gk = g + 2 * S * Dh;
        if (!dry) {
          zero_rows(gv, S, Dh, Dh);
          zero_rows(gk, S, Dh, Dh);
        }
        for (int64_t r0 = 0; r0 < S; r0 += kCausalRows) {
          const int64_t r1 = std::min(S, r0 + kCausalRows), rows = r1 - r0;
          float* a = A + r0 * S;
          float* bm = Bm + r0 * S;
          gemm_lowp(false, true, rows, r1, Dh, dt, q + r0 * v.ld_qkv, v.ld_qkv, dt, k, v.ld_qkv,
                    nullptr, false, a, S, kHeadParallelFlops);
          gemm_lowp(false, true, rows, r1, Dh, dt, dO + r0 * v.D, v.D, dt, val, v.ld_qkv, nullptr,
                    false, bm, S, kHeadParallelFlops);
          if (!dry) {
            backward_rows<float>(A, Bm, lse_bh, dO, O, v, s, s.scale, s.scale, threshold,
                                 keep_scale, r0, r1, r1);
          }
          // dv[0, r1) += Pd^T dO, dq[r0, r1) = dS k, dk[0, r1) += dS^T q
          gemm_lowp(true, false, r1, Dh, rows, DType::f32, a, S, dt, dO + r0 * v.D, v.D, nullptr,
                    true, gv, Dh, kHeadParallelFlops);
          gemm_lowp(false, false, rows, Dh, r1, DType::f32, bm, S, dt, k, v.ld_qkv, nullptr, false,
                    gq + r0 * Dh, Dh, kHeadParallelFlops);
          gemm_lowp(true, false, r1, Dh, rows, DType::f32, bm, S, dt, q + r0 * v.ld_qkv, v.ld_qkv,
                    nullptr, true, gk, Dh, kHeadParallelFlops);
        }
        if (!dry) {
          store_rows(gv, dv, S, Dh, v.ld_qkv);
          store_rows(gq, dq, S, Dh, v.ld_qkv);
          store_rows(gk, dk, S, Dh, v.ld_qkv);
        }
        continue;
      }
      gemm_lowp(false, true, S, S, Dh, dt, q, v.ld_qkv, dt, k, v.ld_qkv, nullptr, false, A, S,
                kHeadParallelFlops);
      gemm_lowp(false, true, S, S, Dh, dt, dO, v.D, dt, val, v.ld_qkv, nullptr, false, Bm, S,
                kHeadParallelFlops);
      if (!dry) {
        backward_rows<float>(A, Bm, lse_bh, dO, O, v, s, s.scale, s.scale, threshold, keep_scale, 0,
                             S, S);
      }
      // dv = Pd^T dO, dq = dS k, dk = dS^T q, each through g
      gemm_lowp(true, false, S, Dh, S, DType::f32, A, S, dt, dO, v.D, nullptr, false, g, Dh,
                kHeadParallelFlops);
      if (!dry) store_rows(g, dv, S, Dh, v.ld_qkv);
      gemm_lowp(false, false, S, Dh, S, DType::f32, Bm, S, dt, k, v.ld_qkv, nullptr, false, g, Dh,
                kHeadParallelFlops);
      if (!dry) store_rows(g, dq, S, Dh, v.ld_qkv);
      gemm_lowp(true, false, S, Dh, S, DType::f32, Bm, S, dt, q, v.ld_qkv, nullptr, false, g, Dh,
                kHeadParallelFlops);
      if (!dry) store_rows(g, dk, S, Dh, v.ld_qkv);
    }
  }
}

}  // namespace

namespace {
// f32 and f64.
template <class T>
void attention_forward_wide(const T* qkv, const int32_t* key_pad, T* out, T* lse,
                            const AttentionShape& s) {
  const int64_t S = s.S, Dh = s.Dh;
  const uint64_t threshold = dropout_threshold(s.dropout_p);
  const T keep_scale = s.dropout_p < 1.0f ? T(1) / (T(1) - static_cast<T>(s.dropout_p)) : T(0);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(S * S) * sizeof(T));
  T* P = ws.as<T>();
  const bool dry = dry_run_active();  // the GEMMs request their scratch; the rows are skipped
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const HeadView v = head_view(s, b, h, key_pad);
      const T* q = qkv + v.qkv_offset;
      const T* k = q + v.D;
      const T* val = q + 2 * v.D;
      T* lse_bh = lse + (b * s.H + h) * S;
      if constexpr (std::is_same_v<T, float>) {
        if (causal_blocks(s)) {
          for (int64_t r0 = 0; r0 < S; r0 += kCausalRows) {
            const int64_t r1 = std::min(S, r0 + kCausalRows), rows = r1 - r0;
            gemm_lowp(false, true, rows, r1, Dh, DType::f32, q + r0 * v.ld_qkv, v.ld_qkv,
                      DType::f32, k, v.ld_qkv, nullptr, false, P + r0 * S, S);
            if (!dry) forward_rows<T>(P, lse_bh, v, s, s.scale, threshold, keep_scale, r0, r1, r1);
            gemm_lowp(false, false, rows, Dh, r1, DType::f32, P + r0 * S, S, DType::f32, val,
                      v.ld_qkv, nullptr, false, out + v.out_offset + r0 * v.D, v.D);
          }
          continue;
        }
      }
      gemm<T>(false, true, S, S, Dh, static_cast<T>(s.scale), q, v.ld_qkv, k, v.ld_qkv, T(0), P, S);
      if (!dry) forward_rows<T>(P, lse_bh, v, s, T(1), threshold, keep_scale, 0, S, S);
      gemm<T>(false, false, S, Dh, S, T(1), P, S, val, v.ld_qkv, T(0), out + v.out_offset, v.D);
    }
  }
}

template <class T>
void attention_backward_wide(const T* dout, const T* qkv, const T* out, const T* lse,
                             const int32_t* key_pad, T* dqkv, const AttentionShape& s) {
  const int64_t S = s.S, Dh = s.Dh;
  const uint64_t threshold = dropout_threshold(s.dropout_p);
  const T keep_scale = s.dropout_p < 1.0f ? T(1) / (T(1) - static_cast<T>(s.dropout_p)) : T(0);
  const T scale = static_cast<T>(s.scale);
  // A: scores, then P, then the dropped-out Pd that dV needs. B: dPd = dout v^T, then dS.
  Workspace ws(Device::cpu(), 2 * static_cast<uint64_t>(S * S) * sizeof(T));
  T* A = ws.as<T>();
  T* Bm = A + S * S;
  const bool dry = dry_run_active();  // the GEMMs request their scratch; the rows are skipped
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const HeadView v = head_view(s, b, h, key_pad);
      const T* q = qkv + v.qkv_offset;
      const T* k = q + v.D;
      const T* val = q + 2 * v.D;
      const T* dO = dout + v.out_offset;
      const T* O = out + v.out_offset;
      T* dq = dqkv + v.qkv_offset;
      T* dk = dq + v.D;
      T* dv = dq + 2 * v.D;
      const T* lse_bh = lse + (b * s.H + h) * S;
      if constexpr (std::is_same_v<T, float>) {
        if (causal_blocks(s)) {
          if (!dry) {
            zero_rows(dv, S, Dh, v.ld_qkv);
            zero_rows(dk, S, Dh, v.ld_qkv);
          }
          for (int64_t r0 = 0; r0 < S; r0 += kCausalRows) {
            const int64_t r1 = std::min(S, r0 + kCausalRows), rows = r1 - r0;
            T* a = A + r0 * S;
            T* bm = Bm + r0 * S;
            const DType f = DType::f32;
            gemm_lowp(false, true, rows, r1, Dh, f, q + r0 * v.ld_qkv, v.ld_qkv, f, k, v.ld_qkv,
                      nullptr, false, a, S);
            gemm_lowp(false, true, rows, r1, Dh, f, dO + r0 * v.D, v.D, f, val, v.ld_qkv, nullptr,
                      false, bm, S);
            if (!dry) {
              backward_rows<T>(A, Bm, lse_bh, dO, O, v, s, scale, scale, threshold, keep_scale, r0,
                               r1, r1);
            }
            // dv[0, r1) += Pd^T dO, dq[r0, r1) = dS k, dk[0, r1) += dS^T q
            gemm_lowp(true, false, r1, Dh, rows, f, a, S, f, dO + r0 * v.D, v.D, nullptr, true, dv,
                      v.ld_qkv);
            gemm_lowp(false, false, rows, Dh, r1, f, bm, S, f, k, v.ld_qkv, nullptr, false,
                      dq + r0 * v.ld_qkv, v.ld_qkv);
            gemm_lowp(true, false, r1, Dh, rows, f, bm, S, f, q + r0 * v.ld_qkv, v.ld_qkv, nullptr,
                      true, dk, v.ld_qkv);
          }
          continue;
        }
      }
      gemm<T>(false, true, S, S, Dh, scale, q, v.ld_qkv, k, v.ld_qkv, T(0), A, S);
      gemm<T>(false, true, S, S, Dh, T(1), dO, v.D, val, v.ld_qkv, T(0), Bm, S);
      if (!dry)
        backward_rows<T>(A, Bm, lse_bh, dO, O, v, s, T(1), scale, threshold, keep_scale, 0, S, S);
      gemm<T>(true, false, S, Dh, S, T(1), A, S, dO, v.D, T(0), dv, v.ld_qkv);        // Pd^T dO
      gemm<T>(false, false, S, Dh, S, T(1), Bm, S, k, v.ld_qkv, T(0), dq, v.ld_qkv);  // dS k
      gemm<T>(true, false, S, Dh, S, T(1), Bm, S, q, v.ld_qkv, T(0), dk, v.ld_qkv);   // dS^T q
    }
  }
}
}  // namespace

template <class T>
void attention_forward(const T* qkv, const int32_t* key_pad, T* out,
                       typename accumulate_type<T>::type* lse, const AttentionShape& s) {
  if constexpr (!std::is_same_v<T, double>) {
    if (heads_in_parallel(s)) return attention_forward_heads(qkv, key_pad, out, lse, s);
  }
  if constexpr (is_half_v<T>) {
    attention_forward_lowp(qkv, key_pad, out, lse, s);
  } else {
    attention_forward_wide(qkv, key_pad, out, lse, s);
  }
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out,
                        const typename accumulate_type<T>::type* lse, const int32_t* key_pad,
                        T* dqkv, const AttentionShape& s) {
  if constexpr (!std::is_same_v<T, double>) {
    if (heads_in_parallel(s)) {
      return attention_backward_heads(dout, qkv, out, lse, key_pad, dqkv, s);
    }
  }
  if constexpr (is_half_v<T>) {
    attention_backward_lowp(dout, qkv, out, lse, key_pad, dqkv, s);
  } else {
    attention_backward_wide(dout, qkv, out, lse, key_pad, dqkv, s);
  }
}

template void attention_forward<float>(const float*, const int32_t*, float*, float*,
                                       const AttentionShape&);
template void attention_forward<double>(const double*, const int32_t*, double*, double*,
                                        const AttentionShape&);
template void attention_backward<float>(const float*, const float*, const float*, const float*,
                                        const int32_t*, float*, const AttentionShape&);
template void attention_backward<double>(const double*, const double*, const double*, const double*,
                                         const int32_t*, double*, const AttentionShape&);
template void attention_forward<bfloat16>(const bfloat16*, const int32_t*, bfloat16*, float*,
                                          const AttentionShape&);
template void attention_forward<float16>(const float16*, const int32_t*, float16*, float*,
                                         const AttentionShape&);
template void attention_backward<bfloat16>(const bfloat16*, const bfloat16*, const bfloat16*,
                                           const float*, const int32_t*, bfloat16*,
                                           const AttentionShape&);
template void attention_backward<float16>(const float16*, const float16*, const float16*,
                                          const float*, const int32_t*, float16*,
                                          const AttentionShape&);

}  // namespace regen::cpu
