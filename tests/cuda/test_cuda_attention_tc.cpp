// The tensor-core flash attention (kernels/cuda/attention_tc.h), on a GPU (exits 77, skipped,
// without one) and in the host emulation (scripts/cuda-emu/run.sh flash, which compiles this file
// with REGEN_CUDA_EMU=1: smaller shapes).
//
// Against the CPU reference (regen::cpu::attention_forward / attention_backward<float>) on the
// same inputs: q, k, v and dO drawn in the dtype and widened exactly to f32 for the reference;
// the backward of both gets the reference's own out (rounded to the dtype, as the op saves it) and
// lse. Tolerances per element, from what the kernels round and how long their sums are (u_T the
// dtype's unit roundoff, 2^-8 bf16 and 2^-11 f16; u = 2^-24; n_qk = Dh; n_pv = S):
// - P (and dS) are rounded to T before their products (FlashAttention-2's registers), out and
//   dqkv once as they are stored: u_T times the sum of the absolute products, plus u_T |ref|;
// - f32 sums of n_qk terms in the scores (a relative error of P of 2 Dh u scale max_j sum|q k|)
//   and of n_pv terms in P V, dS K, ... and in the row sums, on both sides (twice);
// - f16 only: a P, dS or output below f16's normal range rounds with an absolute error up to
//   2^-25.
// Each case also checks: outputs start as NaN (an element never written shows), canaries around
// every output, two runs agree bit for bit, and (causal cases) the non-causal reference is out of
// tolerance somewhere, so the tolerance can tell a wrong mask.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"
#include "regen/core/half.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/attention_tc.h"
#include "regen/kernels/kernels.h"

#include "tests/cuda/guarded_buffer.h"

#ifndef REGEN_CUDA_EMU
#define REGEN_CUDA_EMU 0
#endif

namespace {

using namespace regen;
constexpr bool kEmulated = REGEN_CUDA_EMU != 0;

using test::DeviceArray;

template <class T>
double unit_roundoff() {
  return std::is_same<T, bfloat16>::value ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}
template <class T>
double subnormal_step() {  // the absolute rounding error of a value below T's normal range
  return std::is_same<T, bfloat16>::value ? 0.0 : std::ldexp(1.0, -25);
}
template <class T>
const char* dtype_name() {
  return std::is_same<T, bfloat16>::value ? "bf16" : "f16";
}
template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Case {
  int64_t B, H, S, Dh;
  bool causal, pad;
};
std::string label_of(const Case& c, const char* dtype) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s B=%lld H=%lld S=%lld Dh=%lld%s%s", dtype, (long long)c.B,
                (long long)c.H, (long long)c.S, (long long)c.Dh, c.causal ? " causal" : "",
                c.pad ? " key-padding" : "");
  return buf;
}

// Compares got with ref element by element against tol; returns the elements out of tolerance
// and reports the worst ratio.
struct Compare {
  int64_t bad = 0, nonfinite = 0;
  double worst = 0, worst_ratio = 0;
  void add(const std::string& what, int64_t idx, double got, double ref, double tol) {
    if (!std::isfinite(got) && !(std::isinf(ref) && got == ref)) {
      if (++nonfinite <= 3) MESSAGE(what << "[" << idx << "] = " << got << " (never written?)");
      return;
    }
    const double diff = got == ref ? 0.0 : std::fabs(got - ref);
    worst = std::max(worst, diff);
    worst_ratio = std::max(worst_ratio, diff / tol);
    if (!(diff <= tol) && ++bad <= 4) {
      MESSAGE(what << "[" << idx << "] = " << got << ", reference " << ref << ", tol " << tol);
    }
  }
};

// Per (b, h): the exact P (double) from the T-valued inputs, and the magnitudes the tolerances
// need. Views of the packed layout: q(i, d) = qkv[((b S + i) 3 + 0) D + h Dh + d], etc.
struct Head {
  int64_t S, Dh;
  std::vector<double> P;       // (S, S)
  std::vector<double> qk_abs;  // (S) max_j scale sum_d |q_id k_jd|
};

template <class T>
void run_case(const Case& c) {
  const std::string label = label_of(c, dtype_name<T>());
  const int64_t B = c.B, H = c.H, S = c.S, Dh = c.Dh, D = H * Dh;
  AttentionShape s;
  s.B = B, s.S = S, s.H = H, s.Dh = Dh, s.causal = c.causal;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  const double u = std::ldexp(1.0, -24), uT = unit_roundoff<T>(), sub = subnormal_step<T>();

  std::mt19937 gen(static_cast<unsigned>(B * 1000003 + H * 7919 + S * 31 + Dh + c.causal));
  std::uniform_real_distribution<float> wide(-2.f, 2.f), unit(-1.f, 1.f);
  std::vector<T> qkv(B * S * 3 * D), dout(B * S * D);
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t e = 0; e < 3 * D; ++e) qkv[r * 3 * D + e] = T(e < 2 * D ? wide(gen) : unit(gen));
  for (T& v : dout) v = T(unit(gen));
  std::vector<int32_t> pad;
  if (c.pad) {  // batch 0: every third key padded; batch 1 (if any): every key padded
    pad.assign(B * S, 0);
    for (int64_t i = 0; i < S; ++i) pad[i] = i % 3 == 1;
    for (int64_t b = 1; b < B; ++b)
      for (int64_t i = 0; i < S; ++i) pad[b * S + i] = b == 1 ? 1 : (i + b) % 4 == 0;
  }
  const int32_t* pad_host = c.pad ? pad.data() : nullptr;
  auto masked = [&](int64_t b, int64_t i, int64_t j) {
    return (c.pad && pad[b * S + j] != 0) || (c.causal && j > i);
  };
  const std::vector<float> qkv_f = widen(qkv), dout_f = widen(dout);
  auto q_at = [&](int64_t b, int64_t i, int64_t part, int64_t h, int64_t d) {
    return static_cast<double>(qkv_f[((b * S + i) * 3 + part) * D + h * Dh + d]);
  };

  // ---- The reference forward, and the exact P with the forward's magnitudes --------------------
  std::vector<float> out_ref(B * S * D), lse_ref(B * H * S);
  cpu::attention_forward<float>(qkv_f.data(), pad_host, out_ref.data(), lse_ref.data(), s);
  std::vector<T> out_t(B * S * D);  // what the op would save, and backward reads
  for (size_t i = 0; i < out_t.size(); ++i) out_t[i] = T(out_ref[i]);
  const std::vector<float> out_tf = widen(out_t);

  std::vector<Head> heads(B * H);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      Head& hd = heads[b * H + h];
      hd.S = S, hd.Dh = Dh;
      hd.P.assign(S * S, 0.0);
      hd.qk_abs.assign(S, 0.0);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(S, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0, adot = 0;
          for (int64_t d = 0; d < Dh; ++d) {
            dot += q_at(b, i, 0, h, d) * q_at(b, j, 1, h, d);
            adot += std::fabs(q_at(b, i, 0, h, d) * q_at(b, j, 1, h, d));
          }
          hd.qk_abs[i] = std::max(hd.qk_abs[i], adot * s.scale);
          if (!masked(b, i, j)) sc[j] = dot * s.scale;
          mx = std::max(mx, sc[j]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(sc[j] - mx);
        for (int64_t j = 0; j < S; ++j) hd.P[i * S + j] = std::exp(sc[j] - mx) / sum;
      }
    }
  // The relative error of a recomputed P from the f32 scores and exponentials, per row.
  auto p_rel = [&](const Head& hd, int64_t i) { return 2 * (Dh * hd.qk_abs[i] + 16) * u; };

  // ---- The forward on the device ----------------------------------------------------------------
  DeviceArray<T> d_qkv(qkv), d_out(B * S * D), d_dout(dout), d_out_t(out_t), d_dqkv(B * S * 3 * D);
  DeviceArray<float> d_lse(B * H * S), d_lse_ref(lse_ref);
  DeviceArray<int32_t> d_pad(c.pad ? pad : std::vector<int32_t>(1, 0));
  const int32_t* pad_dev = c.pad ? d_pad.ptr() : nullptr;
  std::vector<T> out_first;
  std::vector<float> lse_first;
  for (int run = 0; run < 2; ++run) {
    d_out.poison();
    d_lse.poison();
    cuda::tc::attention_forward_tc<T>(d_qkv.ptr(), pad_dev, d_out.ptr(), d_lse.ptr(), s);
    cuda::synchronize();
    if (run == 0) {
      out_first = d_out.download();
      lse_first = d_lse.download();
    } else {
      CHECK_MESSAGE(same_bits(d_out.download(), out_first), label << ": two forwards differ");
      CHECK_MESSAGE(same_bits(d_lse.download(), lse_first), label << ": two forwards' lse differ");
    }
  }
  {
    Compare co, cl, wrong_mask;
    std::vector<float> out_other;  // the reference with the other causal flag
    if (c.causal && S > 1) {
      AttentionShape so = s;
      so.causal = false;
      out_other.resize(B * S * D);
      std::vector<float> lse_other(B * H * S);
      cpu::attention_forward<float>(qkv_f.data(), pad_host, out_other.data(), lse_other.data(), so);
    }
    int64_t discriminated = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const Head& hd = heads[b * H + h];
        for (int64_t i = 0; i < S; ++i) {
          const double rel = p_rel(hd, i) + 2 * S * u;
          for (int64_t d = 0; d < Dh; ++d) {
            double pv = 0, nsub = 0;  // sum_j P |v|, and the P below f16's normal range
            for (int64_t j = 0; j < S; ++j) {
              pv += hd.P[i * S + j] * std::fabs(q_at(b, j, 2, h, d));
              nsub += hd.P[i * S + j] < 6.2e-5 ? std::fabs(q_at(b, j, 2, h, d)) : 0.0;
            }
            const int64_t at = (b * S + i) * D + h * Dh + d;
            const double ref = out_ref[at];
            const double tol = uT * (pv + std::fabs(ref)) + 2 * rel * pv + sub * (nsub + 1) + 1e-30;
            co.add(label + " out", at, static_cast<float>(out_first[at]), ref, tol);
            if (!out_other.empty() && std::fabs(out_other[at] - ref) > tol) ++discriminated;
          }
          const int64_t at = (b * H + h) * S + i;
          const double lref = lse_ref[at];
          cl.add(label + " lse", at, lse_first[at], lref,
                 2 * (Dh * hd.qk_abs[i] + 2 * S + 16) * u + 8 * u * std::fabs(lref) + 1e-30);
        }
      }
    MESSAGE(label << " forward: out worst |diff| " << co.worst << " = " << co.worst_ratio
                  << " of its tolerance; lse worst |diff| " << cl.worst << " = " << cl.worst_ratio
                  << " of its tolerance");
    CHECK_MESSAGE(co.nonfinite + cl.nonfinite == 0, label << ": outputs not finite");
    CHECK_MESSAGE(co.bad == 0, label << ": " << co.bad << " outputs out of tolerance");
    CHECK_MESSAGE(cl.bad == 0, label << ": " << cl.bad << " lse out of tolerance");
    if (!out_other.empty()) {
      CHECK_MESSAGE(discriminated > 0, label << ": the non-causal reference is within tolerance");
    }
    CHECK_MESSAGE(d_out.damaged_canaries() + d_lse.damaged_canaries() == 0,
                  label << ": writes outside out or lse");
  }

  // ---- The backward: reference and device from the same out (in T) and lse ---------------------
  std::vector<float> dqkv_ref(B * S * 3 * D);
  cpu::attention_backward<float>(dout_f.data(), qkv_f.data(), out_tf.data(), lse_ref.data(),
                                 pad_host, dqkv_ref.data(), s);
  std::vector<T> dqkv_first;
  for (int run = 0; run < 2; ++run) {
    d_dqkv.poison();
    cuda::tc::attention_backward_tc<T>(d_dout.ptr(), d_qkv.ptr(), d_out_t.ptr(), d_lse_ref.ptr(),
                                       pad_dev, d_dqkv.ptr(), s);
    cuda::synchronize();
    if (run == 0) {
      dqkv_first = d_dqkv.download();
    } else {
      CHECK_MESSAGE(same_bits(d_dqkv.download(), dqkv_first), label << ": two backwards differ");
    }
  }
  Compare cq, ck, cv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const Head& hd = heads[b * H + h];
      // dS (exact, from the exact P and the T-valued dO, V, out) and its error bound E.
      std::vector<double> dS(S * S, 0.0), E(S * S, 0.0);
      for (int64_t i = 0; i < S; ++i) {
        double Di = 0, Di_abs = 0;
        for (int64_t d = 0; d < Dh; ++d) {
          const double g = dout_f[(b * S + i) * D + h * Dh + d];
          const double o = out_tf[(b * S + i) * D + h * Dh + d];
          Di += g * o;
          Di_abs += std::fabs(g * o);
        }
        for (int64_t j = 0; j < S; ++j) {
          double dp = 0, dp_abs = 0;
          for (int64_t d = 0; d < Dh; ++d) {
            const double g = dout_f[(b * S + i) * D + h * Dh + d];
            dp += g * q_at(b, j, 2, h, d);
            dp_abs += std::fabs(g * q_at(b, j, 2, h, d));
          }
          const double p = hd.P[i * S + j];
          dS[i * S + j] = p * (dp - Di);
          E[i * S + j] = (uT + 2 * p_rel(hd, i) + 4 * S * u) * std::fabs(dS[i * S + j]) +
                         2 * p * Dh * u * (dp_abs + Di_abs) + (p > 0 ? sub : 0.0);
        }
      }
      for (int64_t j = 0; j < S; ++j) {  // dK, dV of key j
        for (int64_t d = 0; d < Dh; ++d) {
          double kv_tol = 0, pg = 0, pg_f32 = 0, pg_sub = 0;  // sum_i P |dO|: rounded P, f32, f16
          for (int64_t i = 0; i < S; ++i) {
            const double p = hd.P[i * S + j];
            const double g = std::fabs(dout_f[(b * S + i) * D + h * Dh + d]);
            kv_tol += E[i * S + j] * std::fabs(q_at(b, i, 0, h, d));
            pg += p * g;
            pg_f32 += 2 * (p_rel(hd, i) + 2 * S * u) * p * g;
            pg_sub += p < 6.2e-5 ? g : 0.0;
          }
          const int64_t row = ((b * S + j) * 3) * D + h * Dh + d;
          const double kref = dqkv_ref[row + D], vref = dqkv_ref[row + 2 * D];
          ck.add(label + " dk", row + D, static_cast<float>(dqkv_first[row + D]), kref,
                 s.scale * kv_tol + uT * std::fabs(kref) + sub);
          cv.add(label + " dv", row + 2 * D, static_cast<float>(dqkv_first[row + 2 * D]), vref,
                 uT * (pg + std::fabs(vref)) + pg_f32 + sub * (pg_sub + 1) + 1e-30);
        }
      }
      for (int64_t i = 0; i < S; ++i) {  // dQ of query i
        for (int64_t d = 0; d < Dh; ++d) {
          double q_tol = 0;
          for (int64_t j = 0; j < S; ++j) q_tol += E[i * S + j] * std::fabs(q_at(b, j, 1, h, d));
          const int64_t row = ((b * S + i) * 3) * D + h * Dh + d;
          const double qref = dqkv_ref[row];
          cq.add(label + " dq", row, static_cast<float>(dqkv_first[row]), qref,
                 s.scale * q_tol + uT * std::fabs(qref) + sub);
        }
      }
    }
  MESSAGE(label << " backward: worst |diff| / tolerance dq " << cq.worst_ratio << ", dk "
                << ck.worst_ratio << ", dv " << cv.worst_ratio << " (worst |diff| " << cq.worst
                << ", " << ck.worst << ", " << cv.worst << ")");
  CHECK_MESSAGE(cq.nonfinite + ck.nonfinite + cv.nonfinite == 0, label << ": dqkv not finite");
  CHECK_MESSAGE(cq.bad == 0, label << ": " << cq.bad << " dq out of tolerance");
  CHECK_MESSAGE(ck.bad == 0, label << ": " << ck.bad << " dk out of tolerance");
  CHECK_MESSAGE(cv.bad == 0, label << ": " << cv.bad << " dv out of tolerance");
  CHECK_MESSAGE(d_dqkv.damaged_canaries() == 0, label << ": writes outside dqkv");
}

std::vector<Case> cases() {
  // B H S Dh causal pad: sequence lengths of one row, of part of one tile, of several tiles with
  // a partial last one; B*H > 1 throughout.
  std::vector<Case> cs = {
      {1, 2, 1, 64, false, false},  {2, 1, 17, 64, true, false},   {1, 2, 40, 128, false, false},
      {2, 2, 130, 64, true, false}, {1, 2, 130, 128, true, false}, {3, 1, 40, 64, false, true},
      {2, 1, 70, 128, true, true},  {1, 2, 17, 128, false, false},
  };
  if (!kEmulated) {
    cs.push_back({2, 4, 257, 64, false, false});
    cs.push_back({2, 4, 513, 128, true, false});
    cs.push_back({4, 2, 1000, 64, true, true});
    cs.push_back({1, 3, 2048, 128, false, false});
  }
  return cs;
}

TEST_CASE("flash: forward and backward against the CPU reference, bf16") {
  for (const Case& c : cases()) run_case<bfloat16>(c);
}
TEST_CASE("flash: forward and backward against the CPU reference, f16") {
  for (const Case& c : cases()) run_case<float16>(c);
}

TEST_CASE("flash: calls the kernels do not take are refused with the reason") {
  AttentionShape s;
  s.B = 1, s.S = 8, s.H = 1, s.Dh = 64;
  CHECK(cuda::tc::attention_tc_unsupported(s, nullptr, 0) == nullptr);
  s.Dh = 80;
  CHECK(std::string(cuda::tc::attention_tc_unsupported(s, nullptr, 0)) ==
        "head dim is not 64 or 128");
  DeviceArray<bfloat16> qkv(3 * 8 * 80), out(8 * 80);
  DeviceArray<float> lse(8);
  CHECK_THROWS_WITH_AS(
      cuda::tc::attention_forward_tc<bfloat16>(qkv.ptr(), nullptr, out.ptr(), lse.ptr(), s),
      doctest::Contains("head dim is not 64 or 128"), Error);
  s.Dh = 64;
  s.dropout_p = 0.1f;
  CHECK_THROWS_WITH_AS(
      cuda::tc::attention_forward_tc<bfloat16>(qkv.ptr(), nullptr, out.ptr(), lse.ptr(), s),
      doctest::Contains("dropout is not supported"), Error);
  s.dropout_p = 0.0f;
  const void* misaligned[] = {reinterpret_cast<const unsigned char*>(qkv.ptr()) + 2};
  CHECK(std::string(cuda::tc::attention_tc_unsupported(s, misaligned, 1)) ==
        "a tensor is not 16-byte aligned");
}

}  // namespace
