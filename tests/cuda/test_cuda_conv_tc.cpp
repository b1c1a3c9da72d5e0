// The tensor-core convolution (kernels/cuda/conv2d_tc.h) and the primitives under it
// (kernels/cuda/mma.cuh), on a GPU (exits 77, skipped, without one) and in the host emulation
// (scripts/cuda-emu/run.sh tc, which compiles this file with REGEN_CUDA_EMU=1: smaller shapes).
//
// - ldmatrix: every lane's registers against the PTX ISA's layout, written out here
//   independently of the emulator, for .x1/.x2/.x4 with and without .trans (exact).
// - One 16x8x16 mma tile through ldmatrix, for bf16, f16 and TF32, against a host GEMM: small
//   integers first (every product and sum exact, so the result must be exact: an element in a
//   wrong register changes it), then random values of the dtype with a roundoff bound.
// - Forward, backward-data and backward-filter against the CPU references
//   (regen::cpu::conv2d_forward<float> and the two backward passes; with dilation, which ConvShape
//   lacks, a direct sum in double here) on inputs rounded to the dtype
//   (TF32: to nearest, ties away from zero, as the kernel rounds). Per element,
//   |y - ref| <= (1 + u_out) 2 n u sum|x w| + u_out |ref|, with n the reduction length + 1, u =
//   2^-24 (f32 accumulation, on either side) and u_out the unit roundoff of the output type (bf16
//   2^-8, f16 2^-11, f32 2^-24); shapes with odd sizes that exercise every bound (rows past N P Q,
//   channels past K, C not a multiple of a chunk, padding, stride, dilation, several pipeline
//   laps). Outputs start as NaN (an element never written shows), canaries around y, and two
//   runs agree bit for bit.
#include <doctest/doctest.h>

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
#include "regen/kernels/cuda/conv2d_tc.h"
#include "regen/kernels/kernels.h"

#include "tests/cuda/guarded_buffer.h"

#ifndef REGEN_CUDA_EMU
#define REGEN_CUDA_EMU 0
#endif

namespace {

using namespace regen;
constexpr bool kEmulated = REGEN_CUDA_EMU != 0;

using test::DeviceArray;

// ---- The dtypes
// -----------------------------------------------------------------------------------

// f32 -> TF32, to nearest with ties away from zero (cvt.rna.tf32.f32), for finite inputs.
float tf32_rna(float f) {
  return half::float_of((half::bits_of(f) + 0x1000u) & 0xffffe000u);
}
template <class T>
float round_to(float v) {
  if constexpr (std::is_same<T, float>::value) {
    return tf32_rna(v);
  } else {
    return static_cast<float>(T(v));
  }
}
template <class T>
double unit_roundoff() {  // of the output type
  if constexpr (std::is_same<T, bfloat16>::value) return std::ldexp(1.0, -8);
  if constexpr (std::is_same<T, float16>::value) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}
template <class T>
const char* dtype_name() {
  if constexpr (std::is_same<T, bfloat16>::value) return "bf16";
  if constexpr (std::is_same<T, float16>::value) return "f16";
  return "tf32";
}
template <class T>
std::vector<T> to_dtype(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
  return out;
}

// ---- ldmatrix
// ------------------------------------------------------------------------------------

TEST_CASE("tc: ldmatrix .x1, .x2, .x4 and .trans give every lane the PTX ISA's fragment") {
  for (int count : {1, 2, 4}) {
    for (bool trans : {false, true}) {
      const std::string what = "ldmatrix .x" + std::to_string(count) + (trans ? ".trans" : "");
      std::vector<uint16_t> src(count * 64);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(0x1000 + i);
      DeviceArray<uint16_t> d_src(src);
      DeviceArray<uint32_t> d_out(32 * count);
      d_out.poison();
      cuda::tc::ldmatrix_probe(count, trans, d_src.ptr(), d_out.ptr());
      const std::vector<uint32_t> out = d_out.download();
      int wrong = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < count; ++j) {
          // Matrix j, row-major (row, col) at src[64 j + 8 row + col]. Without .trans lane gets
          // (g, 2t) and (g, 2t + 1); with .trans (2t, g) and (2t + 1, g); the first in the low
          // half.
          auto at = [&](int row, int col) { return uint32_t{src[64 * j + 8 * row + col]}; };
          const uint32_t want =
              trans ? at(2 * t, g) | at(2 * t + 1, g) << 16 : at(g, 2 * t) | at(g, 2 * t + 1) << 16;
          const uint32_t got = out[lane * count + j];
          if (got != want && ++wrong <= 4) {
            MESSAGE(what << " lane " << lane << " reg " << j << ": got 0x" << std::hex << got
                         << " want 0x" << want << std::dec);
          }
        }
      }
      CHECK_MESSAGE(wrong == 0, what << ": " << wrong << " registers wrong");
      CHECK(d_out.damaged_canaries() == 0);
    }
  }
}

// ---- One mma tile
// ---------------------------------------------------------------------------------

// D = A B, A: (16, 16), B: (16, 8) (k, n), through kernels/cuda/mma.cuh; tol 0 means exact.
template <class T>
void check_tile(const std::vector<float>& a, const std::vector<float>& b, bool b_trans,
                bool exact) {
  std::vector<double> ref(128, 0.0), absum(128, 0.0);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 16; ++k) {
        ref[i * 8 + j] += double(a[i * 16 + k]) * b[k * 8 + j];
        absum[i * 8 + j] += std::fabs(double(a[i * 16 + k]) * b[k * 8 + j]);
      }
  std::vector<T> ta(256), tb(128);
  for (int i = 0; i < 256; ++i) ta[i] = T(a[i]);
  for (int i = 0; i < 128; ++i) tb[i] = T(b[i]);
  DeviceArray<T> d_a(ta), d_b(tb);
  DeviceArray<float> d_d(128);
  d_d.poison();
  cuda::tc::mma_tile_probe<T>(d_a.ptr(), d_b.ptr(), d_d.ptr(), b_trans);
  const std::vector<float> d = d_d.download();
  int wrong = 0;
  double worst = 0;
  const std::string what = std::string(dtype_name<T>()) + (b_trans ? " (B via .trans)" : "") +
                           (exact ? " (integers: exact)" : " (random)");
  for (int e = 0; e < 128; ++e) {
    const double tol = exact ? 0.0 : 2 * 16 * std::ldexp(1.0, -24) * absum[e];
    const double diff = std::fabs(double(d[e]) - ref[e]);
    if (!(diff <= tol)) {
      if (++wrong <= 4) {
        MESSAGE(what << " D(" << e / 8 << ", " << e % 8 << ") = " << d[e] << ", host " << ref[e]);
      }
    }
    if (std::isfinite(diff)) worst = std::max(worst, diff);
  }
  CHECK_MESSAGE(wrong == 0, what << ": " << wrong << " of 128 wrong, worst |diff| " << worst);
  CHECK(d_d.damaged_canaries() == 0);
}

template <class T>
void tile_cases() {
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int> small(-8, 8);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  // Distinct small integers: exact in every dtype, products and sums exact in f32.
  std::vector<float> a(256), b(128);
  for (float& v : a) v = static_cast<float>(small(gen));
  for (float& v : b) v = static_cast<float>(small(gen));
  // Rows and columns that differ everywhere: no permutation of fragments gives the same D.
  for (int i = 0; i < 16; ++i) a[i * 16 + i % 16] = static_cast<float>(9 + i);
  for (int k = 0; k < 16; ++k) b[k * 8 + k % 8] = static_cast<float>(-9 - k);
  std::vector<float> ra(256), rb(128);  // random values of the dtype
  for (float& v : ra) v = round_to<T>(unit(gen));
  for (float& v : rb) v = round_to<T>(unit(gen));
  const bool is_tf32 = std::is_same<T, float>::value;
  for (bool b_trans : {false, true}) {
    if (is_tf32 && b_trans) continue;  // TF32 operands are 32-bit: ldmatrix .trans does not apply
    check_tile<T>(a, b, b_trans, true);
    check_tile<T>(ra, rb, b_trans, false);
  }
}

TEST_CASE("tc: one 16x8x16 mma tile from ldmatrix fragments equals a host GEMM, bf16") {
  tile_cases<bfloat16>();
}
TEST_CASE("tc: one 16x8x16 mma tile from ldmatrix fragments equals a host GEMM, f16") {
  tile_cases<float16>();
}
TEST_CASE(
    "tc: one 16x8x16 mma tile (two m16n8k8) from ldmatrix fragments equals a host GEMM, tf32") {
  tile_cases<float>();
}

// ---- The forward convolution
// ----------------------------------------------------------------------

struct Case {
  int64_t N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw;
  bool bias;
};

std::string describe(const char* dtype, const Case& c) {
  char label[200];
  std::snprintf(label, sizeof label,
                "%s N=%lld C=%lld %lldx%lld K=%lld %lldx%lld stride %lldx%lld pad %lldx%lld "
                "dil %lldx%lld%s",
                dtype, (long long)c.N, (long long)c.C, (long long)c.H, (long long)c.W,
                (long long)c.K, (long long)c.R, (long long)c.S, (long long)c.sh, (long long)c.sw,
                (long long)c.ph, (long long)c.pw, (long long)c.dh, (long long)c.dw,
                c.bias ? " bias" : "");
  return label;
}

// Runs `launch` (which writes out) twice on a NaN-filled output and compares the first result with
// ref per element within (1 + u_out) 2 n u absum + u_out |ref| (the f32 sums' error on either side,
// then one rounding to the output type); the second must match the first bit for bit.
// direct (the sum in double) must agree with ref within the f32 part of that bound.
template <class T, class Launch>
void check_pass(const std::string& label, DeviceArray<T>& out, const std::vector<double>& ref,
                const std::vector<double>& direct, const std::vector<double>& absum, double n_terms,
                Launch&& launch) {
  const int64_t n = static_cast<int64_t>(ref.size());
  std::vector<T> first;
  for (int run = 0; run < 2; ++run) {
    out.poison();
    launch();
    cuda::synchronize();
    const std::vector<T> y = out.download();
    if (run == 1) {
      CHECK_MESSAGE(std::memcmp(y.data(), first.data(), n * sizeof(T)) == 0,
                    label << ": two runs differ");
      break;
    }
    first = y;
    const double u = std::ldexp(1.0, -24), u_out = unit_roundoff<T>();
    int64_t bad = 0, nonfinite = 0, ref_disagree = 0;
    double worst = 0, worst_ratio = 0, err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::fabs(direct[i] - ref[i]) > 2 * n_terms * u * absum[i]) ++ref_disagree;
      const double got = static_cast<float>(y[i]);
      if (!std::isfinite(got)) {
        if (++nonfinite <= 4) MESSAGE(label << ": [" << i << "] = " << got << " (never written?)");
        continue;
      }
      const double tol = (1 + u_out) * 2 * n_terms * u * absum[i] + u_out * std::fabs(ref[i]);
      const double diff = std::fabs(got - ref[i]);
      err2 += diff * diff;
      ref2 += ref[i] * ref[i];
      worst = std::max(worst, diff);
      worst_ratio = std::max(worst_ratio, diff / tol);
      if (diff > tol && ++bad <= 4) {
        MESSAGE(label << ": [" << i << "] = " << got << ", reference " << ref[i] << ", tol "
                      << tol);
      }
    }
    MESSAGE(label << ": " << n << " outputs, worst |diff| " << worst << " = " << worst_ratio
                  << " of its tolerance, nmse " << (ref2 > 0 ? err2 / ref2 : err2));
    CHECK_MESSAGE(ref_disagree == 0,
                  label << ": the CPU reference and the direct sum differ at " << ref_disagree);
    CHECK_MESSAGE(nonfinite == 0, label << ": " << nonfinite << " outputs not finite");
    CHECK_MESSAGE(bad == 0, label << ": " << bad << " outputs out of tolerance");
    CHECK_MESSAGE(out.damaged_canaries() == 0, label << ": writes outside the output");
  }
}

// The operands of a case: random values in [-1, 1] and the same rounded to the dtype.
template <class T>
struct Operands {
  std::vector<float> raw, rounded;
  Operands(int64_t n, std::mt19937& gen) : raw(n), rounded(n) {
    std::uniform_real_distribution<float> unit(-1.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      raw[i] = unit(gen);
      rounded[i] = round_to<T>(raw[i]);
    }
  }
  // What the launcher is given: TF32 takes f32 and rounds itself; 16-bit types are the rounding.
  std::vector<T> device_values() const {
    return std::is_same<T, float>::value ? to_dtype<T>(raw) : to_dtype<T>(rounded);
  }
};

template <class T>
void check_forward(const Case& c) {
  const cuda::tc::ConvTcShape s = cuda::tc::make_conv_tc_shape(c.N, c.C, c.H, c.W, c.K, c.R, c.S,
                                                               c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
  const std::string label = std::string("forward ") + describe(dtype_name<T>(), c);
  const int64_t nx = s.N * s.C * s.H * s.W, nw = s.K * s.C * s.R * s.S, ny = s.N * s.K * s.P * s.Q;
  std::mt19937 gen(static_cast<unsigned>(nx * 31 + nw));
  const Operands<T> x(nx, gen), w(nw, gen);
  std::vector<float> br(s.K, 0.f);  // the bias is added in f32: not rounded for TF32
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  if (c.bias) {
    for (float& v : br) v = std::is_same<T, float>::value ? unit(gen) : round_to<T>(unit(gen));
  }
  // The direct sum in double and sum |x w| + |b|, per output.
  std::vector<double> direct(ny), absum(ny);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q) {
          double acc = br[k], aacc = std::fabs(br[k]);
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r * s.dil_h;
                const int64_t wi = q * s.stride_w - s.pad_w + t * s.dil_w;
                if (h < 0 || h >= s.H || wi < 0 || wi >= s.W) continue;
                const double prod = double(x.rounded[((n * s.C + ci) * s.H + h) * s.W + wi]) *
                                    w.rounded[((k * s.C + ci) * s.R + r) * s.S + t];
                acc += prod;
                aacc += std::fabs(prod);
              }
          const int64_t o = ((n * s.K + k) * s.P + p) * s.Q + q;
          direct[o] = acc;
          absum[o] = aacc;
        }
  // The CPU reference where it applies (dilation 1).
  std::vector<double> ref = direct;
  if (s.dil_h == 1 && s.dil_w == 1) {
    const ConvShape cs = make_conv_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w,
                                         s.pad_h, s.pad_w);
    std::vector<float> yc(ny);
    cpu::conv2d_forward<float>(x.rounded.data(), w.rounded.data(), c.bias ? br.data() : nullptr,
                               yc.data(), cs);
    for (int64_t i = 0; i < ny; ++i) ref[i] = yc[i];
  }
  DeviceArray<T> d_x(x.device_values()), d_w(w.device_values()), d_b(to_dtype<T>(br)), d_y(ny);
  check_pass<T>(label, d_y, ref, direct, absum, static_cast<double>(s.C * s.R * s.S + 1), [&] {
    cuda::tc::conv2d_forward_tc<T>(d_x.ptr(), d_w.ptr(), c.bias ? d_b.ptr() : nullptr, d_y.ptr(),
                                   s);
  });
}

template <class T>
void check_backward_data(const Case& c) {
  const cuda::tc::ConvTcShape s = cuda::tc::make_conv_tc_shape(c.N, c.C, c.H, c.W, c.K, c.R, c.S,
                                                               c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
  const std::string label = std::string("backward-data ") + describe(dtype_name<T>(), c);
  const int64_t ndy = s.N * s.K * s.P * s.Q, nw = s.K * s.C * s.R * s.S, nx = s.N * s.C * s.H * s.W;
  std::mt19937 gen(static_cast<unsigned>(ndy * 17 + nw));
  const Operands<T> dy(ndy, gen), w(nw, gen);
  std::vector<double> direct(nx, 0.0), absum(nx, 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q)
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r * s.dil_h;
                const int64_t wi = q * s.stride_w - s.pad_w + t * s.dil_w;
                if (h < 0 || h >= s.H || wi < 0 || wi >= s.W) continue;
                const double prod = double(dy.rounded[((n * s.K + k) * s.P + p) * s.Q + q]) *
                                    w.rounded[((k * s.C + ci) * s.R + r) * s.S + t];
                const int64_t o = ((n * s.C + ci) * s.H + h) * s.W + wi;
                direct[o] += prod;
                absum[o] += std::fabs(prod);
              }
  std::vector<double> ref = direct;
  if (s.dil_h == 1 && s.dil_w == 1) {
    const ConvShape cs = make_conv_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w,
                                         s.pad_h, s.pad_w);
    std::vector<float> dxc(nx);
    cpu::conv2d_backward_data<float>(dy.rounded.data(), w.rounded.data(), dxc.data(), cs);
    for (int64_t i = 0; i < nx; ++i) ref[i] = dxc[i];
  }
  DeviceArray<T> d_dy(dy.device_values()), d_w(w.device_values()), d_dx(nx);
  check_pass<T>(label, d_dx, ref, direct, absum, static_cast<double>(s.K * s.R * s.S + 1), [&] {
    cuda::tc::conv2d_backward_data_tc<T>(d_dy.ptr(), d_w.ptr(), d_dx.ptr(), s);
  });
}

template <class T>
void check_backward_filter(const Case& c) {
  const cuda::tc::ConvTcShape s = cuda::tc::make_conv_tc_shape(c.N, c.C, c.H, c.W, c.K, c.R, c.S,
                                                               c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
  const std::string label = std::string("backward-filter ") + describe(dtype_name<T>(), c);
  const int64_t nx = s.N * s.C * s.H * s.W, ndy = s.N * s.K * s.P * s.Q, nw = s.K * s.C * s.R * s.S;
  std::mt19937 gen(static_cast<unsigned>(nx * 7 + ndy));
  const Operands<T> x(nx, gen), dy(ndy, gen);
  std::vector<double> direct(nw, 0.0), absum(nw, 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q)
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r * s.dil_h;
                const int64_t wi = q * s.stride_w - s.pad_w + t * s.dil_w;
                if (h < 0 || h >= s.H || wi < 0 || wi >= s.W) continue;
                const double prod = double(dy.rounded[((n * s.K + k) * s.P + p) * s.Q + q]) *
                                    x.rounded[((n * s.C + ci) * s.H + h) * s.W + wi];
                const int64_t o = ((k * s.C + ci) * s.R + r) * s.S + t;
                direct[o] += prod;
                absum[o] += std::fabs(prod);
              }
  std::vector<double> ref = direct;
  if (s.dil_h == 1 && s.dil_w == 1) {
    const ConvShape cs = make_conv_shape(s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w,
                                         s.pad_h, s.pad_w);
    std::vector<float> dwc(nw);
    cpu::conv2d_backward_filter<float>(x.rounded.data(), dy.rounded.data(), dwc.data(), nullptr,
                                       cs);
    for (int64_t i = 0; i < nw; ++i) ref[i] = dwc[i];
  }
  DeviceArray<T> d_x(x.device_values()), d_dy(dy.device_values()), d_dw(nw);
  check_pass<T>(label, d_dw, ref, direct, absum, static_cast<double>(s.N * s.P * s.Q + 1), [&] {
    cuda::tc::conv2d_backward_filter_tc<T>(d_x.ptr(), d_dy.ptr(), d_dw.ptr(), s);
  });
}

std::vector<Case> conv_cases() {
  // N C H W K R S sh sw ph pw dh dw bias
  std::vector<Case> cases = {
      {2, 3, 7, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, true},      // C below one chunk, K below a tile
      {1, 13, 9, 11, 70, 3, 2, 2, 1, 1, 0, 1, 1, false},  // K over one block column, odd C
      {3, 20, 8, 8, 17, 3, 3, 1, 1, 2, 2, 2, 2, true},    // dilation, rows past N P Q, 7-12 laps
      {2, 40, 5, 6, 9, 1, 1, 1, 1, 0, 0, 1, 1, false},    // 1x1
      {1, 5, 12, 10, 8, 5, 3, 3, 2, 2, 1, 1, 2, true},    // uneven stride, pad and dilation
      {1, 6, 5, 5, 4, 1, 1, 2, 2, 1, 1, 1, 1, true},      // 1x1 padded: backward pads by -1
      {2, 7, 8, 9, 12, 3, 3, 2, 2, 0, 0, 1, 1, false},    // the last input row reaches no output
      {2, 6, 20, 20, 10, 3, 3, 1, 1, 1, 1, 1, 1, false},  // backward-filter splits its reduction
  };
  if (!kEmulated) {
    cases.push_back({4, 64, 28, 28, 128, 3, 3, 1, 1, 1, 1, 1, 1, true});
    cases.push_back({2, 3, 64, 64, 64, 7, 7, 2, 2, 3, 3, 1, 1, false});
    cases.push_back({8, 256, 14, 14, 256, 1, 1, 1, 1, 0, 0, 1, 1, false});
    cases.push_back({2, 130, 17, 19, 200, 3, 3, 2, 2, 1, 1, 1, 1, true});
  }
  return cases;
}

TEST_CASE("tc: conv2d forward on tensor cores against the CPU reference, bf16") {
  for (const Case& c : conv_cases()) check_forward<bfloat16>(c);
}
TEST_CASE("tc: conv2d forward on tensor cores against the CPU reference, f16") {
  for (const Case& c : conv_cases()) check_forward<float16>(c);
}
TEST_CASE("tc: conv2d forward on tensor cores against the CPU reference, tf32") {
  for (const Case& c : conv_cases()) check_forward<float>(c);
}

TEST_CASE("tc: conv2d backward-data on tensor cores against the CPU reference, bf16") {
  for (const Case& c : conv_cases()) check_backward_data<bfloat16>(c);
}
TEST_CASE("tc: conv2d backward-data on tensor cores against the CPU reference, f16") {
  for (const Case& c : conv_cases()) check_backward_data<float16>(c);
}
TEST_CASE("tc: conv2d backward-data on tensor cores against the CPU reference, tf32") {
  for (const Case& c : conv_cases()) check_backward_data<float>(c);
}

TEST_CASE("tc: conv2d backward-filter on tensor cores against the CPU reference, bf16") {
  for (const Case& c : conv_cases()) check_backward_filter<bfloat16>(c);
}
TEST_CASE("tc: conv2d backward-filter on tensor cores against the CPU reference, f16") {
  for (const Case& c : conv_cases()) check_backward_filter<float16>(c);
}
TEST_CASE("tc: conv2d backward-filter on tensor cores against the CPU reference, tf32") {
  for (const Case& c : conv_cases()) check_backward_filter<float>(c);
}

TEST_CASE("tc: a kernel that does not fit its padded input is a clear error") {
  CHECK_THROWS_WITH_AS(cuda::tc::make_conv_tc_shape(1, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 3, 3),
                       doctest::Contains("does not fit input 5x5"), Error);
  CHECK_THROWS_WITH_AS(cuda::tc::make_conv_tc_shape(1, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 0, 1),
                       doctest::Contains("dilation 0x1 must be positive"), Error);
}

}  // namespace
