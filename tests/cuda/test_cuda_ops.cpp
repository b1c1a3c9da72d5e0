// Every CUDA launcher (kernels/cuda/cuda_kernels.h) against its CPU reference
// (regen::cpu::<name><float>, kernels/kernels.h), in the spirit of ggml's test-backend-ops: one
// table of cases, each running an op on CUDA and on the CPU with the same random inputs.
//
// For each output: NaN/Inf first (outputs are pre-filled with a NaN pattern, so an element the
// kernel never wrote shows up here), then |cuda - cpu| <= atol + rtol * |cpu| element-wise and the
// normalized mean squared error, printing the first mismatches and the worst error. Every device
// buffer has canary bytes before and after it (inputs and outputs), checked after each run, to
// catch out-of-bounds writes. Every case runs twice on the GPU and the two runs must agree bit for
// bit (determinism: the remat feature needs identical gradients with and without recomputation).
// Tolerances are stated per case and summarized in docs/kernels.md. The host emulation runs the
// same cases at smaller shapes (REGEN_CUDA_EMU, below).
//
// A family whose CPU reference is not in the tree (REGEN_HAVE_CPU_<FAMILY>=0, set by
// tests/CMakeLists.txt) is compiled out and reported as a failure by "cpu references present".
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/lowp_launchers.h"
#include "regen/kernels/unary_ops.h"
#include "tests/cuda/guarded_buffer.h"

#ifndef REGEN_HAVE_CPU_CONV2D
#define REGEN_HAVE_CPU_CONV2D 0
#endif
#ifndef REGEN_HAVE_CPU_BATCHNORM
#define REGEN_HAVE_CPU_BATCHNORM 0
#endif
#ifndef REGEN_HAVE_CPU_POOL
#define REGEN_HAVE_CPU_POOL 0
#endif
#ifndef REGEN_HAVE_CPU_EMBEDDING
#define REGEN_HAVE_CPU_EMBEDDING 0
#endif
#ifndef REGEN_HAVE_CPU_LAYERNORM
#define REGEN_HAVE_CPU_LAYERNORM 0
#endif
#ifndef REGEN_HAVE_CPU_SOFTMAX
#define REGEN_HAVE_CPU_SOFTMAX 0
#endif
#ifndef REGEN_HAVE_CPU_ATTENTION
#define REGEN_HAVE_CPU_ATTENTION 0
#endif
#ifndef REGEN_HAVE_CPU_CROSS_ENTROPY
#define REGEN_HAVE_CPU_CROSS_ENTROPY 0
#endif
#ifndef REGEN_HAVE_CPU_OPTIM
#define REGEN_HAVE_CPU_OPTIM 0
#endif

// The host emulation (scripts/cuda-emu/run.sh ops) compiles this file with REGEN_CUDA_EMU=1
// (scripts/cuda-emu/emu_ops.cpp): each TEST_CASE then runs its kEmulated branch, the same cases at
// shapes an emulator finishes in minutes. One list of cases serves the GPU and the emulation: a new
// family adds its TEST_CASE here, with both sets of shapes, and nothing in scripts/cuda-emu.
#ifndef REGEN_CUDA_EMU
#define REGEN_CUDA_EMU 0
#endif
constexpr bool kEmulated = REGEN_CUDA_EMU != 0;

namespace {

using namespace regen;

using test::DeviceArray;

// ---- Comparison ---------------------------------------------------------------------------------

struct Tol {
  double atol = 0, rtol = 0, nmse = 0;  // all zero: exact
};
const Tol kExact{0, 0, 0};
// FP32 dot products of length K of O(1) inputs: both sides round differently; the difference grows
// roughly linearly in K for sequential sums (K = 25088 for a batch-2 stem backward-filter).
Tol dot_tol(int64_t K) {
  return {1e-7 * static_cast<double>(K) + 1e-5, 1e-5, 1e-9};
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Checks got against ref; prints a summary and the first mismatches.
template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol) {
  REQUIRE(got.size() == ref.size());
  size_t nonfinite = 0, mismatches = 0;
  double worst_abs = 0, worst_rel = 0, err2 = 0, ref2 = 0;
  size_t worst_at = 0;
  std::string first;
  int shown = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    bool bad = false;
    if (!std::isfinite(r) || !std::isfinite(g)) {
      // A non-finite reference (lse of a fully masked row is -inf) must be matched exactly.
      const bool ok = (std::isnan(r) && std::isnan(g)) || (!std::isnan(r) && g == r);
      if (!ok) {
        ++nonfinite;
        bad = true;
      }
    } else {
      const double diff = std::fabs(g - r);
      err2 += diff * diff;
      ref2 += r * r;
      if (diff > worst_abs) {
        worst_abs = diff;
        worst_at = i;
      }
      if (r != 0) worst_rel = std::max(worst_rel, diff / std::fabs(r));
      if (diff > tol.atol + tol.rtol * std::fabs(r)) {
        ++mismatches;
        bad = true;
      }
    }
    if (bad && shown < 5) {
      char line[160];
      std::snprintf(line, sizeof(line), "\n    [%zu] cuda %.9g cpu %.9g", i, g, r);
      first += line;
      ++shown;
    }
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : err2;
  char summary[256];
  std::snprintf(
      summary, sizeof(summary),
      "%s: n=%zu max_abs=%.3g (at %zu) max_rel=%.3g nmse=%.3g | atol=%.1g rtol=%.1g nmse<=%.1g",
      what.c_str(), got.size(), worst_abs, worst_at, worst_rel, nmse, tol.atol, tol.rtol, tol.nmse);
  MESSAGE(summary);
  if (nonfinite || mismatches || nmse > tol.nmse) {
    FAIL_CHECK(what << ": " << nonfinite << " non-finite and " << mismatches
                    << " out-of-tolerance elements, nmse " << nmse << first);
  }
}

// ---- The harness
// ----------------------------------------------------------------------------------

// Something a case checks after its launch: poisoned before each run, compared with the reference
// and between the two runs, canaries checked.
struct Checked {
  virtual ~Checked() = default;
  virtual void poison() = 0;
  virtual std::vector<unsigned char> snapshot() const = 0;
  virtual void compare(const std::string& op) const = 0;
  virtual size_t damaged() const = 0;
  virtual std::string name() const = 0;
};

template <class T>
struct Output : Checked {
  std::string label;
  DeviceArray<T>* array;
  std::vector<T> ref;
  Tol tol;
  bool poisoned;  // false for in-place outputs, which the reset function restores
  Output(std::string l, DeviceArray<T>* a, std::vector<T> r, Tol t, bool p)
      : label(std::move(l)), array(a), ref(std::move(r)), tol(t), poisoned(p) {}
  void poison() override {
    if (poisoned) array->poison();
  }
  std::vector<unsigned char> snapshot() const override {
    const std::vector<T> v = array->download();
    std::vector<unsigned char> bytes(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  }
  void compare(const std::string& op) const override {
    expect_close(op + " " + label, array->download(), ref, tol);
  }
  size_t damaged() const override { return array->damaged_canaries(); }
  std::string name() const override { return label; }
};

struct Input {
  std::function<size_t()> damaged;
};

// One case: inputs on the device, outputs with their references, the launch, and an optional
// reset that restores in-place buffers before each run.
class Case {
 public:
  explicit Case(std::string op) : op_(std::move(op)) {}

  template <class T>
  T* in(const std::vector<T>& values, bool misalign = false) {
    auto a = std::make_shared<DeviceArray<T>>(values, misalign);
    inputs_.push_back({[a] { return a->damaged_canaries(); }});
    keep_.push_back(a);
    return a->ptr();
  }
  // An output compared with ref; poisoned before each run.
  template <class T>
  T* out(const std::string& label, std::vector<T> ref, Tol tol, bool misalign = false) {
    auto a = std::make_shared<DeviceArray<T>>(ref.size(), misalign);
    outputs_.push_back(std::make_unique<Output<T>>(label, a.get(), std::move(ref), tol, true));
    keep_.push_back(a);
    return a->ptr();
  }
  // An in-place buffer: starts as `initial` (restored before each run), compared with ref after.
  template <class T>
  T* inout(const std::string& label, const std::vector<T>& initial, std::vector<T> ref, Tol tol) {
    auto a = std::make_shared<DeviceArray<T>>(initial);
    outputs_.push_back(std::make_unique<Output<T>>(label, a.get(), std::move(ref), tol, false));
    resets_.push_back([a, initial] { a->upload(initial); });
    keep_.push_back(a);
    return a->ptr();
  }

  // Runs the launch twice; checks determinism, references and canaries.
  void run(const std::function<void()>& launch) {
    INFO("op: " << op_);
    std::vector<std::vector<unsigned char>> first;
    for (int rep = 0; rep < 2; ++rep) {
      for (auto& r : resets_) r();
      for (auto& o : outputs_) o->poison();
      launch();
      cuda::synchronize();
      if (rep == 0) {
        for (auto& o : outputs_) first.push_back(o->snapshot());
      } else {
        for (size_t k = 0; k < outputs_.size(); ++k) {
          const bool same = outputs_[k]->snapshot() == first[k];
          if (!same)
            FAIL_CHECK(op_ << " " << outputs_[k]->name()
                           << ": two runs differ (not deterministic)");
        }
      }
    }
    for (auto& o : outputs_) o->compare(op_);
    for (auto& o : outputs_) {
      const size_t bad = o->damaged();
      if (bad) FAIL_CHECK(op_ << " " << o->name() << ": " << bad << " canary bytes overwritten");
    }
    for (auto& i : inputs_) {
      const size_t bad = i.damaged();
      if (bad) FAIL_CHECK(op_ << ": " << bad << " canary bytes of an input overwritten");
    }
  }

 private:
  std::string op_;
  std::vector<Input> inputs_;
  std::vector<std::unique_ptr<Checked>> outputs_;
  std::vector<std::function<void()>> resets_;
  std::vector<std::shared_ptr<void>> keep_;
};

// Deterministic random inputs.
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  std::vector<float> uniform(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
  // Values on a coarse grid (many exact ties): for max pooling's tie rule.
  std::vector<float> coarse(size_t n) {
    std::uniform_int_distribution<int> d(-4, 4);
    std::vector<float> v(n);
    for (auto& x : v) x = 0.5f * static_cast<float>(d(gen));
    return v;
  }
  std::vector<int64_t> ints(size_t n, int64_t lo, int64_t hi) {  // [lo, hi]
    std::uniform_int_distribution<int64_t> d(lo, hi);
    std::vector<int64_t> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
};

std::string str(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string str(const char* fmt, ...) {
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

void use_gpu() {
  cuda::set_device(0);
}

// ---- 16-bit helpers (the "16-bit" cases below)
// ---------------------------------------------------

// The unit roundoff of a 16-bit element type.
template <class H>
constexpr double unit_roundoff() {
  return std::is_same<H, bfloat16>::value ? 0x1p-8 : 0x1p-11;
}
template <class H>
const char* half_name() {
  return std::is_same<H, bfloat16>::value ? "bf16" : "f16";
}
// One 16-bit rounding apart, after f32 values that differ by `length` roundoffs of f32 on terms
// whose magnitudes sum to `scale`.
// The normalized mean squared error is then at most (2u)^2, plus atol^2 for small references.
template <class H>
Tol half_tol(int64_t length = 1, double scale = 1.0) {
  const double atol = static_cast<double>(length) * 0x1p-24 * scale,
               rtol = 2.0 * unit_roundoff<H>();
  return {atol, rtol, rtol * rtol + atol * atol};
}
template <class H>
std::vector<H> to_half(const std::vector<float>& v) {
  std::vector<H> out;
  out.reserve(v.size());
  for (float f : v) out.push_back(H(f));
  return out;
}

// ---- GEMM
// -----------------------------------------------------------------------------------------

void gemm_case(Rng& rng, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
               bool tf32) {
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;  // padded strides
  const auto A = rng.uniform(static_cast<size_t>((ta ? K : M) * lda));
  const auto B = rng.uniform(static_cast<size_t>((tb ? N : K) * ldb));
  const auto C0 = rng.uniform(static_cast<size_t>(M * ldc));
  auto ref = C0;
  cpu::gemm<float>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
  Case c(str("gemm%s ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g", tf32 ? "(tf32)" : "", ta,
             tb, (long long)M, (long long)N, (long long)K, alpha, beta));
  const float* a = c.in(A);
  const float* b = c.in(B);
  Tol tol = dot_tol(K);
  if (tf32)
    tol = {5e-3 * std::sqrt(static_cast<double>(K)) + 1e-3, 1e-2, 1e-5};  // 10-bit mantissas
  // The padding columns of C must come back untouched: they are part of the compared output.
  float* cc = c.inout("C", C0, ref, tol);
  cuda::set_tf32(tf32);
  c.run([&] { cuda::gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, cc, ldc); });
  cuda::set_tf32(false);
}

void gemm_batched_case(Rng& rng, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K) {
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  const int64_t sa = (ta ? K : M) * lda + 5, sb = (tb ? N : K) * ldb + 7, sc = M * ldc + 3;
  const auto A = rng.uniform(static_cast<size_t>(batch * sa));
  const auto B = rng.uniform(static_cast<size_t>(batch * sb));
  const auto C0 = rng.uniform(static_cast<size_t>(batch * sc));
  auto ref = C0;
  cpu::gemm_batched<float>(ta, tb, batch, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, 0.0f,
                           ref.data(), ldc, sc);
  Case c(str("gemm_batched ta=%d tb=%d batch=%lld M=%lld N=%lld K=%lld", ta, tb, (long long)batch,
             (long long)M, (long long)N, (long long)K));
  const float* a = c.in(A);
  const float* b = c.in(B);
  float* cc = c.inout("C", C0, ref, dot_tol(K));
  c.run([&] {
    cuda::gemm_batched(ta, tb, batch, M, N, K, 0.5f, a, lda, sa, b, ldb, sb, 0.0f, cc, ldc, sc);
  });
}

// ---- Element-wise and reductions ---------------------------------------------------------------

// One op of the unary list: the CUDA launchers against the CPU loops on the same inputs (the same
// functor; erff/expf/tanhf against the host libm: a few ulps).
template <class F>
void unary_case(F, const char* name, const std::vector<float>& x, const std::vector<float>& g,
                int64_t n, bool misalign, const std::string& tag) {
  const Tol tol{1e-6, 1e-5, 1e-11};
  const size_t un = static_cast<size_t>(n);
  std::vector<float> ref(un), ref_dx(un);
  cpu::unary_forward<float>(F{}, x.data(), ref.data(), n);
  const std::vector<float>& s = F::reads == unary::Reads::output ? ref : x;
  cpu::unary_backward<float>(F{}, g.data(), s.data(), ref_dx.data(), n);
  Case c(std::string(name) + "_forward" + tag);
  const float* dx = c.in(x, misalign);
  float* y = c.out("y", ref, tol, misalign);
  c.run([&] { cuda::unary_forward(F{}, dx, y, n); });
  Case b(std::string(name) + "_backward" + tag);
  const float* dg = b.in(g, misalign);
  const float* ds = b.in(s, misalign);
  float* ddx = b.out("dx", ref_dx, tol, misalign);
  b.run([&] { cuda::unary_backward(F{}, dg, ds, ddx, n); });
  if constexpr (unary::has_mask<F>::value) {
    // The packed-mask forms: the mask words bit for bit (a warp ballot per word on the GPU), y
    // and dx as the plain forms.
    std::vector<uint32_t> mask(static_cast<size_t>(mask_words(n)));
    std::vector<float> my(un), mdx(un);
    cpu::unary_forward_mask<float>(F{}, x.data(), my.data(), mask.data(), n);
    cpu::unary_backward_mask<float>(F{}, g.data(), mask.data(), mdx.data(), n);
    const std::vector<int32_t> words(mask.begin(), mask.end());
    Case m(std::string(name) + "_forward_mask" + tag);
    const float* mx = m.in(x, misalign);
    float* myd = m.out("y", my, tol, misalign);
    int32_t* mw = m.out("mask", words, kExact);
    m.run([&] { cuda::unary_forward_mask(F{}, mx, myd, reinterpret_cast<uint32_t*>(mw), n); });
    Case mb(std::string(name) + "_backward_mask" + tag);
    const float* mg = mb.in(g, misalign);
    const int32_t* mwi = mb.in(words);
    float* mdd = mb.out("dx", mdx, tol, misalign);
    mb.run([&] {
      cuda::unary_backward_mask(F{}, mg, reinterpret_cast<const uint32_t*>(mwi), mdd, n);
    });
  }
}

void elementwise_cases(Rng& rng, int64_t n, bool misalign) {
  const std::string tag = str(" n=%lld%s", (long long)n, misalign ? " (unaligned)" : "");
  const size_t un = static_cast<size_t>(n);
  const auto x = rng.uniform(un, -3, 3), z = rng.uniform(un, -3, 3), g = rng.uniform(un);
  {
    std::vector<float> ref(un);
    cpu::fill<float>(ref.data(), n, 1.25f);
    Case c("fill" + tag);
    float* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::fill(y, n, 1.25f); });
  }
  {
    Case c("copy" + tag);
    const float* dx = c.in(x, misalign);
    float* y = c.out("y", x, kExact, misalign);
    c.run([&] { cuda::copy(dx, y, n); });
  }
  {
    std::vector<float> ref(un);
    cpu::scale<float>(x.data(), ref.data(), n, -0.75f);
    Case c("scale" + tag);
    const float* dx = c.in(x, misalign);
    float* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::scale(dx, y, n, -0.75f); });
  }
  {
    const std::vector<float> s{2.5f};
    std::vector<float> ref(un);
    cpu::fill_from_scalar<float>(s.data(), ref.data(), n, 0.5f);
    Case c("fill_from_scalar" + tag);
    const float* ds = c.in(s);
    float* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::fill_from_scalar(ds, y, n, 0.5f); });
  }
  {
    auto ref = x;
    cpu::add_inplace<float>(ref.data(), z.data(), n);
    Case c("add_inplace" + tag);
    const float* dz = c.in(z, misalign);
    float* y = c.inout("y", x, ref, kExact);
    c.run([&] { cuda::add_inplace(y, dz, n); });
  }
  // Every op of the unary list (kernels/unary_ops.h) against its CPU loop: a new op needs no edit.
#define REGEN_UNARY_CUDA_CASE(name) unary_case(unary::name{}, #name, x, g, n, misalign, tag);
  REGEN_UNARY_OPS(REGEN_UNARY_CUDA_CASE)
#undef REGEN_UNARY_CUDA_CASE
  // Saved activations narrowed to 16 bits and widened back (kernels/half.h): the same integer
  // arithmetic on both sides, bit for bit; values from the subnormal range of fp16 to past its
  // largest.
  for (Compression cm : {Compression::bf16, Compression::fp16}) {
    std::vector<float> wide_in(un);
    for (size_t i = 0; i < un; ++i)
      wide_in[i] = x[i] * std::ldexp(1.0f, static_cast<int>(i % 44) - 28);
    std::vector<uint16_t> h(un);
    std::vector<float> w(un);
    cpu::narrow_to_half<float>(wide_in.data(), h.data(), n, cm);
    cpu::widen_from_half<float>(h.data(), w.data(), n, cm);
    const char* fmt = cm == Compression::bf16 ? "bf16" : "fp16";
    Case c(str("narrow_to_half %s", fmt) + tag);
    const float* dwi = c.in(wide_in, misalign);
    uint16_t* dh = c.out("y", h, kExact);
    c.run([&] { cuda::narrow_to_half(dwi, dh, n, cm); });
    Case b(str("widen_from_half %s", fmt) + tag);
    const uint16_t* dhi = b.in(h);
    float* dw = b.out("y", w, kExact, misalign);
    b.run([&] { cuda::widen_from_half(dhi, dw, n, cm); });
  }
  for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    // Same Philox words, threshold and float scale as the CPU: bit-identical.
    std::vector<float> ref(un), ref_dx(un);
    cpu::dropout_forward<float>(x.data(), ref.data(), n, p, 1234, 77);
    cpu::dropout_backward<float>(g.data(), ref_dx.data(), n, p, 1234, 77);
    Case c(str("dropout_forward p=%g", p) + tag);
    const float* dx = c.in(x, misalign);
    float* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::dropout_forward(dx, y, n, p, 1234, 77); });
    Case b(str("dropout_backward p=%g", p) + tag);
    const float* dg = b.in(g, misalign);
    float* ddx = b.out("dx", ref_dx, kExact, misalign);
    b.run([&] { cuda::dropout_backward(dg, ddx, n, p, 1234, 77); });
  }
  {
    // sum_all: double accumulation on both sides, different order.
    std::vector<float> ref(1);
    cpu::sum_all<float>(x.data(), ref.data(), n);
    Case c("sum_all" + tag);
    const float* dx = c.in(x, misalign);
    float* y = c.out("y", ref, Tol{1e-6, 1e-6, 1e-12});
    c.run([&] { cuda::sum_all(dx, y, n); });
  }
  {
    // sum_squares (gradient clipping): double accumulation on both sides, different order.
    std::vector<float> ref(1);
    cpu::sum_squares<float>(x.data(), ref.data(), n);
    Case c("sum_squares" + tag);
    const float* dx = c.in(x, misalign);
    float* y = c.out("y", ref, Tol{1e-6, 1e-6, 1e-12});
    c.run([&] { cuda::sum_squares(dx, y, n); });
  }
}

void broadcast_case(Rng& rng, int64_t n, int64_t nb) {
  const auto a = rng.uniform(static_cast<size_t>(n)), b = rng.uniform(static_cast<size_t>(nb));
  std::vector<float> ref_add(static_cast<size_t>(n)), ref_mul(static_cast<size_t>(n));
  cpu::add<float>(a.data(), b.data(), ref_add.data(), n, nb);
  cpu::mul<float>(a.data(), b.data(), ref_mul.data(), n, nb);
  {
    Case c(str("add n=%lld nb=%lld", (long long)n, (long long)nb));
    const float* da = c.in(a);
    const float* db = c.in(b);
    float* y = c.out("y", ref_add, kExact);
    c.run([&] { cuda::add(da, db, y, n, nb); });
  }
  {
    Case c(str("mul n=%lld nb=%lld", (long long)n, (long long)nb));
    const float* da = c.in(a);
    const float* db = c.in(b);
    float* y = c.out("y", ref_mul, kExact);
    c.run([&] { cuda::mul(da, db, y, n, nb); });
  }
  {
    // In place, y == a, as autograd uses it for bias addition.
    Case c(str("add in place n=%lld nb=%lld", (long long)n, (long long)nb));
    const float* db = c.in(b);
    float* y = c.inout("y", a, ref_add, kExact);
    c.run([&] { cuda::add(y, db, y, n, nb); });
  }
}

void sum_rows_case(Rng& rng, int64_t rows, int64_t cols) {
  const auto x = rng.uniform(static_cast<size_t>(rows * cols));
  std::vector<float> ref(static_cast<size_t>(cols));
  cpu::sum_rows<float>(x.data(), ref.data(), rows, cols);
  Case c(str("sum_rows rows=%lld cols=%lld", (long long)rows, (long long)cols));
  const float* dx = c.in(x);
  float* y = c.out("y", ref, Tol{1e-6, 1e-6, 1e-12});
  c.run([&] { cuda::sum_rows(dx, y, rows, cols); });
}

void permute_case(Rng& rng, std::vector<int64_t> shape, std::vector<int64_t> perm) {
  PermuteShape s;
  s.ndim = static_cast<int>(shape.size());
  int64_t n = 1;
  std::string desc = "permute shape";
  for (int d = 0; d < s.ndim; ++d) {
    s.shape[d] = shape[d];
    s.perm[d] = perm[d];
    n *= shape[d];
    desc += str(" %lld", (long long)shape[d]);
  }
  desc += " perm";
  for (int64_t p : perm) desc += str(" %lld", (long long)p);
  const auto x = rng.uniform(static_cast<size_t>(n));
  std::vector<float> ref(static_cast<size_t>(n));
  cpu::permute<float>(x.data(), ref.data(), s);
  Case c(desc);
  const float* dx = c.in(x);
  float* y = c.out("y", ref, kExact);
  c.run([&] { cuda::permute(dx, y, s); });
}

// ---- Slices (concat, split, narrow)
// --------------------------------------------------------------------------------

// Rows [x_start, x_start + len) of x (outer, x_dim, inner) into rows [y_start, ...) of y (outer,
// y_dim, inner). y starts as random values and is compared whole: rows outside the slice must come
// back untouched. With `misalign` x starts one float late (the scalar path).
void slice_case(Rng& rng, int64_t outer, int64_t len, int64_t inner, int64_t x_dim, int64_t x_start,
                int64_t y_dim, int64_t y_start, bool misalign) {
  SliceShape s;
  s.outer = outer;
  s.len = len;
  s.inner = inner;
  s.x_dim = x_dim;
  s.x_start = x_start;
  s.y_dim = y_dim;
  s.y_start = y_start;
  const auto x = rng.uniform(static_cast<size_t>(outer * x_dim * inner));
  const auto y0 = rng.uniform(static_cast<size_t>(outer * y_dim * inner));
  auto ref = y0;
  cpu::slice_copy<float>(x.data(), ref.data(), s);
  Case c(
      str("slice_copy outer=%lld len=%lld inner=%lld x rows %lld+ of %lld -> y rows %lld+ of "
          "%lld%s",
          (long long)outer, (long long)len, (long long)inner, (long long)x_start, (long long)x_dim,
          (long long)y_start, (long long)y_dim, misalign ? " (unaligned)" : ""));
  const float* dx = c.in(x, misalign);
  float* dy = c.inout("y", y0, ref, kExact);  // a copy: bit for bit
  c.run([&] { cuda::slice_copy(dx, dy, s); });
}

// ---- Upsampling
// -----------------------------------------------------------------------------------

void upsample_case(Rng& rng, int64_t NC, int64_t H, int64_t W) {
  const size_t nx = static_cast<size_t>(NC * H * W), ny = 4 * nx;
  const auto x = rng.uniform(nx), dy = rng.uniform(ny);
  const std::string tag = str(" NC=%lld H=%lld W=%lld", (long long)NC, (long long)H, (long long)W);
  std::vector<float> yn(ny), dxn(nx), yb(ny), dxb(nx);
  cpu::upsample2x_nearest_forward<float>(x.data(), yn.data(), NC, H, W);
  cpu::upsample2x_nearest_backward<float>(dy.data(), dxn.data(), NC, H, W);
  cpu::upsample2x_bilinear_forward<float>(x.data(), yb.data(), NC, H, W);
  cpu::upsample2x_bilinear_backward<float>(dy.data(), dxb.data(), NC, H, W);
  // Nearest: copies and the same three additions in the same order. Bilinear: the same products
  // and sums in the same order, unless the host compiler contracts them to FMA.
  const Tol bilinear_tol{1e-6, 1e-6, 1e-13};
  {
    Case c("upsample2x_nearest_forward" + tag);
    const float* dx = c.in(x);
    float* dy_ = c.out("y", yn, kExact);
    c.run([&] { cuda::upsample2x_nearest_forward(dx, dy_, NC, H, W); });
  }
  {
    Case c("upsample2x_nearest_backward" + tag);
    const float* ddy = c.in(dy);
    float* ddx = c.out("dx", dxn, kExact);
    c.run([&] { cuda::upsample2x_nearest_backward(ddy, ddx, NC, H, W); });
  }
  {
    Case c("upsample2x_bilinear_forward" + tag);
    const float* dx = c.in(x);
    float* dy_ = c.out("y", yb, bilinear_tol);
    c.run([&] { cuda::upsample2x_bilinear_forward(dx, dy_, NC, H, W); });
  }
  {
    Case c("upsample2x_bilinear_backward" + tag);
    const float* ddy = c.in(dy);
    float* ddx = c.out("dx", dxb, bilinear_tol);
    c.run([&] { cuda::upsample2x_bilinear_backward(ddy, ddx, NC, H, W); });
  }
}

// ---- Convolution
// ----------------------------------------------------------------------------------

#if REGEN_HAVE_CPU_CONV2D
void conv_case(Rng& rng, const ConvShape& s, bool bias, cuda::ConvAlgo algo) {
  const size_t nx = static_cast<size_t>(s.N * s.C * s.H * s.W),
               nw = static_cast<size_t>(s.K * s.C * s.R * s.S),
               ny = static_cast<size_t>(s.N * s.K * s.P * s.Q);
  const auto x = rng.uniform(nx), w = rng.uniform(nw), b = rng.uniform(static_cast<size_t>(s.K)),
             dy = rng.uniform(ny);
  std::vector<float> y(ny), dx(nx), dw(nw), db(static_cast<size_t>(s.K));
  cpu::conv2d_forward<float>(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), s);
  cpu::conv2d_backward_data<float>(dy.data(), w.data(), dx.data(), s);
  cpu::conv2d_backward_filter<float>(x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr, s);
  const bool cudnn = algo == cuda::ConvAlgo::cudnn;
  const std::string tag =
      str("%s N=%lld C=%lld H=%lld W=%lld K=%lld R=%lld S=%lld stride=%lldx%lld pad=%lldx%lld%s",
          cudnn ? " cudnn" : " native", (long long)s.N, (long long)s.C, (long long)s.H,
          (long long)s.W, (long long)s.K, (long long)s.R, (long long)s.S, (long long)s.stride_h,
          (long long)s.stride_w, (long long)s.pad_h, (long long)s.pad_w, bias ? " bias" : "");
  // cuDNN may pick FFT or Winograd algorithms, whose FP32 error is larger than a direct sum's.
  auto tol = [&](int64_t K) {
    Tol t = dot_tol(K);
    if (cudnn) t = {t.atol * 10, 1e-4, 1e-8};
    return t;
  };
  cuda::set_conv_algo(algo);
  {
    Case c("conv2d_forward" + tag);
    const float* dx_ = c.in(x);
    const float* dw_ = c.in(w);
    const float* db_ = bias ? c.in(b) : nullptr;
    float* dy_ = c.out("y", y, tol(s.C * s.R * s.S));
    c.run([&] { cuda::conv2d_forward(dx_, dw_, db_, dy_, s); });
  }
  {
    Case c("conv2d_backward_data" + tag);
    const float* ddy = c.in(dy);
    const float* dw_ = c.in(w);
    float* ddx = c.out("dx", dx, tol(s.K * s.R * s.S));
    c.run([&] { cuda::conv2d_backward_data(ddy, dw_, ddx, s); });
  }
  {
    Case c("conv2d_backward_filter" + tag);
    const float* dx_ = c.in(x);
    const float* ddy = c.in(dy);
    float* ddw = c.out("dw", dw, tol(s.N * s.P * s.Q));
    float* ddb = bias ? c.out("dbias", db, Tol{1e-5, 1e-6, 1e-12}) : nullptr;
    c.run([&] { cuda::conv2d_backward_filter(dx_, ddy, ddw, ddb, s); });
  }
  cuda::set_conv_algo(cuda::ConvAlgo::native);
}

// The distinct convolutions of a bottleneck ResNet with `base` stem channels on `image` x `image`
// inputs: the stem, then per stage the first block's (stride 2 from the second stage on: the 3x3
// and the downsample) and the later blocks' shapes.
std::vector<ConvShape> bottleneck_resnet_convs(int64_t N, int64_t base, int64_t image) {
  std::vector<ConvShape> v;
  v.push_back(make_conv_shape(N, 3, image, image, base, 7, 7, 2, 2, 3, 3));  // stem
  int64_t in = base, hw = image / 4;  // after the stem's stride 2 and the max pool's
  for (int i = 0; i < 4; ++i) {
    const int64_t width = base << i, out = width * 4;
    const int64_t stride = i == 0 ? 1 : 2, out_hw = hw / stride;
    v.push_back(make_conv_shape(N, in, hw, hw, width, 1, 1, 1, 1, 0, 0));  // first 1x1
    v.push_back(make_conv_shape(N, width, hw, hw, width, 3, 3, stride, stride, 1, 1));
    v.push_back(make_conv_shape(N, width, out_hw, out_hw, out, 1, 1, 1, 1, 0, 0));  // expand
    v.push_back(make_conv_shape(N, in, hw, hw, out, 1, 1, stride, stride, 0, 0));   // downsample
    v.push_back(make_conv_shape(N, out, out_hw, out_hw, width, 1, 1, 1, 1, 0, 0));  // later 1x1
    if (stride != 1)
      v.push_back(make_conv_shape(N, width, out_hw, out_hw, width, 3, 3, 1, 1, 1, 1));
    in = out;
    hw = out_hw;
  }
  return v;
}

std::vector<ConvShape> resnet152_convs(int64_t N) {
  return bottleneck_resnet_convs(N, 64, 224);
}

// The ResNet of the CUDA remat suite (tests/remat_suite.h remat_resnet: base width 8, 64x64) at
// its batch of 8: layer4 runs on 4x4 and 2x2 maps.
std::vector<ConvShape> remat_resnet_convs() {
  return bottleneck_resnet_convs(8, 8, 64);
}

// Transposed convolutions: s is the ConvShape of the conv2d they are the adjoint of
// (make_conv_transpose_shape); x: (N, K, P, Q), w: (K, C, R, S), y: (N, C, H, W).
void conv_transpose_case(Rng& rng, const ConvShape& s, bool bias, cuda::ConvAlgo algo) {
  const size_t nx = static_cast<size_t>(s.N * s.K * s.P * s.Q),
               nw = static_cast<size_t>(s.K * s.C * s.R * s.S),
               ny = static_cast<size_t>(s.N * s.C * s.H * s.W);
  const auto x = rng.uniform(nx), w = rng.uniform(nw), b = rng.uniform(static_cast<size_t>(s.C)),
             dy = rng.uniform(ny);
  std::vector<float> y(ny), dx(nx), dw(nw), db(static_cast<size_t>(s.C));
  cpu::conv_transpose2d_forward<float>(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), s);
  cpu::conv_transpose2d_backward_data<float>(dy.data(), w.data(), dx.data(), s);
  cpu::conv_transpose2d_backward_filter<float>(x.data(), dy.data(), dw.data(),
                                               bias ? db.data() : nullptr, s);
  const bool cudnn = algo == cuda::ConvAlgo::cudnn;
  const std::string tag = str(
      "%s N=%lld Cin=%lld H=%lld W=%lld Cout=%lld R=%lld S=%lld stride=%lldx%lld pad=%lldx%lld"
      " out=%lldx%lld%s",
      cudnn ? " cudnn" : " native", (long long)s.N, (long long)s.K, (long long)s.P, (long long)s.Q,
      (long long)s.C, (long long)s.R, (long long)s.S, (long long)s.stride_h, (long long)s.stride_w,
      (long long)s.pad_h, (long long)s.pad_w, (long long)s.H, (long long)s.W, bias ? " bias" : "");
  // The passes are conv2d's, so are their tolerances (reduction lengths swapped accordingly).
  auto tol = [&](int64_t K) {
    Tol t = dot_tol(K);
    if (cudnn) t = {t.atol * 10, 1e-4, 1e-8};
    return t;
  };
  cuda::set_conv_algo(algo);
  {
    Case c("conv_transpose2d_forward" + tag);
    const float* dx_ = c.in(x);
    const float* dw_ = c.in(w);
    const float* db_ = bias ? c.in(b) : nullptr;
    float* dy_ = c.out("y", y, tol(s.K * s.R * s.S));
    c.run([&] { cuda::conv_transpose2d_forward(dx_, dw_, db_, dy_, s); });
  }
  {
    Case c("conv_transpose2d_backward_data" + tag);
    const float* ddy = c.in(dy);
    const float* dw_ = c.in(w);
    float* ddx = c.out("dx", dx, tol(s.C * s.R * s.S));
    c.run([&] { cuda::conv_transpose2d_backward_data(ddy, dw_, ddx, s); });
  }
  {
    Case c("conv_transpose2d_backward_filter" + tag);
    const float* dx_ = c.in(x);
    const float* ddy = c.in(dy);
    float* ddw = c.out("dw", dw, tol(s.N * s.P * s.Q));
    float* ddb = bias ? c.out("dbias", db, Tol{1e-5, 1e-6, 1e-12}) : nullptr;
    c.run([&] { cuda::conv_transpose2d_backward_filter(dx_, ddy, ddw, ddb, s); });
  }
  if (bias) {  // the bias gradient alone (a frozen weight)
    Case c("conv_transpose2d_backward_filter (dbias only)" + tag);
    const float* dx_ = c.in(x);
    const float* ddy = c.in(dy);
    float* ddb = c.out("dbias", db, Tol{1e-5, 1e-6, 1e-12});
    c.run([&] { cuda::conv_transpose2d_backward_filter(dx_, ddy, nullptr, ddb, s); });
  }
  cuda::set_conv_algo(cuda::ConvAlgo::native);
}

// U-Net decoder shapes at batch 2 (64x64 input, widths 64..512) and odd ones.
std::vector<ConvShape> conv_transpose_shapes() {
  return {
      make_conv_transpose_shape(2, 512, 8, 8, 256, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(2, 256, 16, 16, 128, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(2, 128, 32, 32, 64, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(2, 64, 16, 16, 32, 3, 3, 2, 2, 1, 1, 1, 1),
      make_conv_transpose_shape(1, 3, 7, 5, 5, 3, 3, 1, 1, 1, 1, 0, 0),
      make_conv_transpose_shape(2, 5, 4, 6, 7, 3, 2, 3, 2, 1, 0, 2, 1),
      make_conv_transpose_shape(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0),
      make_conv_transpose_shape(3, 67, 5, 4, 130, 4, 4, 2, 2, 1, 1, 0, 0),
  };
}

std::vector<ConvShape> odd_convs() {
  return {
      make_conv_shape(1, 3, 7, 5, 5, 3, 3, 1, 1, 1, 1),
      make_conv_shape(2, 5, 9, 9, 7, 1, 1, 2, 2, 0, 0),
      make_conv_shape(1, 4, 11, 6, 3, 5, 3, 2, 1, 2, 1),
      make_conv_shape(2, 3, 13, 11, 9, 7, 7, 2, 2, 3, 3),
      make_conv_shape(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0),
      make_conv_shape(3, 130, 5, 4, 67, 3, 3, 1, 1, 0, 0),
      make_conv_shape(1, 2, 8, 8, 129, 2, 2, 2, 2, 0, 0),
      make_conv_shape(2, 17, 10, 12, 33, 3, 1, 3, 1, 1, 0),
  };
}

// 16-bit convolution (x, w, bias, dy in H; products and sums in f32, each output rounded once after
// the bias is added in f32) against the CPU's 16-bit passes on the same 16-bit inputs: f32 sums of
// the reduction length L in different orders (and split-K chunks), then one 16-bit rounding each.
// dbias is summed in double on both sides and rounded once; dw alone, dbias alone and both.
template <class H>
void half_conv_case(Rng& rng, const ConvShape& s, bool bias, cuda::ConvAlgo algo) {
  const size_t nx = static_cast<size_t>(s.N * s.C * s.H * s.W),
               nw = static_cast<size_t>(s.K * s.C * s.R * s.S),
               ny = static_cast<size_t>(s.N * s.K * s.P * s.Q);
  const auto x = to_half<H>(rng.uniform(nx)), w = to_half<H>(rng.uniform(nw)),
             b = to_half<H>(rng.uniform(static_cast<size_t>(s.K))),
             dy = to_half<H>(rng.uniform(ny));
  std::vector<H> y(ny), dx(nx), dw(nw), db(static_cast<size_t>(s.K));
  cpu::conv2d_forward<H>(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), s);
  cpu::conv2d_backward_data<H>(dy.data(), w.data(), dx.data(), s);
  cpu::conv2d_backward_filter<H>(x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr, s);
  const std::string tag =
      str(" %s%s N=%lld C=%lld H=%lld W=%lld K=%lld R=%lld S=%lld stride=%lldx%lld pad=%lldx%lld%s",
          half_name<H>(), algo == cuda::ConvAlgo::cudnn ? " cudnn" : " native", (long long)s.N,
          (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.K, (long long)s.R,
          (long long)s.S, (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h,
          (long long)s.pad_w, bias ? " bias" : "");
  // cuDNN may pick Winograd or FFT algorithms, whose f32 error is larger than a direct sum's.
  const double f32_error = algo == cuda::ConvAlgo::cudnn ? 10.0 : 1.0;
  auto tol = [&](int64_t L) { return half_tol<H>(L, f32_error * (static_cast<double>(L) + 1.0)); };
  cuda::set_conv_algo(algo);
  {
    Case c("conv2d_forward" + tag);
    const H *dx_ = c.in(x), *dw_ = c.in(w);
    const H* db_ = bias ? c.in(b) : nullptr;
    H* dy_ = c.out("y", y, tol(s.C * s.R * s.S));
    c.run([&] { cuda::conv2d_forward(dx_, dw_, db_, dy_, s); });
  }
  {
    Case c("conv2d_backward_data" + tag);
    const H *ddy = c.in(dy), *dw_ = c.in(w);
    H* ddx = c.out("dx", dx, tol(s.K * s.R * s.S));
    c.run([&] { cuda::conv2d_backward_data(ddy, dw_, ddx, s); });
  }
  {
    Case c("conv2d_backward_filter" + tag);
    const H *dx_ = c.in(x), *ddy = c.in(dy);
    H* ddw = c.out("dw", dw, tol(s.N * s.P * s.Q));
    H* ddb = bias ? c.out("dbias", db, half_tol<H>()) : nullptr;
    c.run([&] { cuda::conv2d_backward_filter(dx_, ddy, ddw, ddb, s); });
  }
  if (bias) {  // the bias gradient alone (dw null), as ops_conv.cpp asks of the 16-bit launcher
    Case c("conv2d_backward_filter (dbias only)" + tag);
    const H *dx_ = c.in(x), *ddy = c.in(dy);
    H* ddb = c.out("dbias", db, half_tol<H>());
    c.run([&] { cuda::conv2d_backward_filter(dx_, ddy, static_cast<H*>(nullptr), ddb, s); });
  }
  cuda::set_conv_algo(cuda::ConvAlgo::native);
}

// The same for the transposed convolution (s: the ConvShape of the conv2d it is the adjoint of).
template <class H>
void half_conv_transpose_case(Rng& rng, const ConvShape& s, bool bias, cuda::ConvAlgo algo) {
  const size_t nx = static_cast<size_t>(s.N * s.K * s.P * s.Q),
               nw = static_cast<size_t>(s.K * s.C * s.R * s.S),
               ny = static_cast<size_t>(s.N * s.C * s.H * s.W);
  const auto x = to_half<H>(rng.uniform(nx)), w = to_half<H>(rng.uniform(nw)),
             b = to_half<H>(rng.uniform(static_cast<size_t>(s.C))),
             dy = to_half<H>(rng.uniform(ny));
  std::vector<H> y(ny), dx(nx), dw(nw), db(static_cast<size_t>(s.C));
  cpu::conv_transpose2d_forward<H>(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), s);
  cpu::conv_transpose2d_backward_data<H>(dy.data(), w.data(), dx.data(), s);
  cpu::conv_transpose2d_backward_filter<H>(x.data(), dy.data(), dw.data(),
                                           bias ? db.data() : nullptr, s);
  const std::string tag = str(
      " %s%s N=%lld Cin=%lld H=%lld W=%lld Cout=%lld R=%lld S=%lld stride=%lldx%lld pad=%lldx%lld"
      " out=%lldx%lld%s",
      half_name<H>(), algo == cuda::ConvAlgo::cudnn ? " cudnn" : " native", (long long)s.N,
      (long long)s.K, (long long)s.P, (long long)s.Q, (long long)s.C, (long long)s.R,
      (long long)s.S, (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h,
      (long long)s.pad_w, (long long)s.H, (long long)s.W, bias ? " bias" : "");
  // cuDNN may pick Winograd or FFT algorithms, whose f32 error is larger than a direct sum's.
  const double f32_error = algo == cuda::ConvAlgo::cudnn ? 10.0 : 1.0;
  auto tol = [&](int64_t L) { return half_tol<H>(L, f32_error * (static_cast<double>(L) + 1.0)); };
  cuda::set_conv_algo(algo);
  {
    Case c("conv_transpose2d_forward" + tag);
    const H *dx_ = c.in(x), *dw_ = c.in(w);
    const H* db_ = bias ? c.in(b) : nullptr;
    H* dy_ = c.out("y", y, tol(s.K * s.R * s.S));
    c.run([&] { cuda::conv_transpose2d_forward(dx_, dw_, db_, dy_, s); });
  }
  {
    Case c("conv_transpose2d_backward_data" + tag);
    const H *ddy = c.in(dy), *dw_ = c.in(w);
    H* ddx = c.out("dx", dx, tol(s.C * s.R * s.S));
    c.run([&] { cuda::conv_transpose2d_backward_data(ddy, dw_, ddx, s); });
  }
  {
    Case c("conv_transpose2d_backward_filter" + tag);
    const H *dx_ = c.in(x), *ddy = c.in(dy);
    H* ddw = c.out("dw", dw, tol(s.N * s.H * s.W));
    H* ddb = bias ? c.out("dbias", db, half_tol<H>()) : nullptr;
    c.run([&] { cuda::conv_transpose2d_backward_filter(dx_, ddy, ddw, ddb, s); });
  }
  cuda::set_conv_algo(cuda::ConvAlgo::native);
}

// Shapes for the 16-bit convolutions: stride 1 and 2, a 1x1, a 7x7 stem, split-K in forward and
// in the filter gradient, more than 64 output channels (two column tiles), a phase no tap reaches.
std::vector<ConvShape> half_convs() {
  return {
      make_conv_shape(1, 3, 7, 5, 5, 3, 3, 1, 1, 1, 1),
      make_conv_shape(2, 5, 9, 9, 7, 1, 1, 2, 2, 0, 0),
      make_conv_shape(1, 3, 20, 20, 16, 7, 7, 2, 2, 3, 3),
      make_conv_shape(1, 64, 4, 4, 16, 3, 3, 1, 1, 1, 1),  // split-K forward
      make_conv_shape(2, 4, 16, 16, 8, 3, 3, 1, 1, 1, 1),  // split-K filter gradient
      make_conv_shape(1, 2, 8, 8, 129, 2, 2, 2, 2, 0, 0),  // three column tiles
      make_conv_shape(2, 17, 10, 12, 33, 3, 1, 3, 1, 1, 0),
  };
}
std::vector<ConvShape> half_conv_transposes() {
  return {
      make_conv_transpose_shape(2, 16, 4, 4, 8, 2, 2, 2, 2, 0, 0, 0, 0),
      make_conv_transpose_shape(1, 8, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1),
      make_conv_transpose_shape(2, 5, 4, 6, 7, 3, 2, 3, 2, 1, 0, 2, 1),
      make_conv_transpose_shape(1, 64, 3, 3, 4, 3, 3, 1, 1, 1, 1, 0, 0),  // split-K backward-data
  };
}
#endif

// ---- Batch normalization
// ----------------------------------------------------------------------------

#if REGEN_HAVE_CPU_BATCHNORM
void batchnorm_case(Rng& rng, int64_t N, int64_t C, int64_t HW, bool with_stats) {
  const size_t n = static_cast<size_t>(N * C * HW), c_ = static_cast<size_t>(C);
  auto x = rng.uniform(n, -2, 3);
  for (size_t i = 0; i < n; ++i) x[i] += 5.0f;  // an offset, so the variance must not cancel
  const auto gamma = rng.uniform(c_, 0.5f, 1.5f), beta = rng.uniform(c_), dy = rng.uniform(n);
  const auto rm0 = rng.uniform(c_), rv0 = rng.uniform(c_, 0.5f, 2.0f);
  const double momentum = 0.1, eps = 1e-5;
  const std::string tag = str(" N=%lld C=%lld HW=%lld", (long long)N, (long long)C, (long long)HW);
  const Tol ytol{2e-5, 1e-5, 1e-10}, stat_tol{1e-6, 2e-6, 1e-12};
  std::vector<float> y(n), mean(c_), invstd(c_), rm = rm0, rv = rv0;
  cpu::batchnorm_forward_train<float>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                      invstd.data(), with_stats ? rm.data() : nullptr,
                                      with_stats ? rv.data() : nullptr, N, C, HW, momentum, eps);
  {
    Case c("batchnorm_forward_train" + tag);
    const float* dx = c.in(x);
    const float* dg = c.in(gamma);
    const float* db = c.in(beta);
    float* dy_ = c.out("y", y, ytol);
    float* dm = c.out("mean", mean, stat_tol);
    float* di = c.out("invstd", invstd, stat_tol);
    float* drm = with_stats ? c.inout("running_mean", rm0, rm, stat_tol) : nullptr;
    float* drv = with_stats ? c.inout("running_var", rv0, rv, stat_tol) : nullptr;
    c.run([&] {
      cuda::batchnorm_forward_train(dx, dg, db, dy_, dm, di, drm, drv, N, C, HW, momentum, eps);
    });
  }
  {
    std::vector<float> ye(n);
    cpu::batchnorm_forward_eval<float>(x.data(), gamma.data(), beta.data(), rm0.data(), rv0.data(),
                                       ye.data(), N, C, HW, eps);
    Case c("batchnorm_forward_eval" + tag);
    const float* dx = c.in(x);
    const float* dg = c.in(gamma);
    const float* db = c.in(beta);
    const float* drm = c.in(rm0);
    const float* drv = c.in(rv0);
    float* dy_ = c.out("y", ye, ytol);
    c.run([&] { cuda::batchnorm_forward_eval(dx, dg, db, drm, drv, dy_, N, C, HW, eps); });
  }
  // dx combines three terms of similar size; dgamma/dbeta are sums over N*HW elements.
  const Tol dx_tol{2e-5, 1e-4, 1e-9};
  const Tol sum_tol{1e-6 * std::sqrt(static_cast<double>(N * HW)) + 1e-5, 1e-5, 1e-10};
  {
    std::vector<float> dx(n), dg(c_), db(c_);
    cpu::batchnorm_backward<float>(dy.data(), x.data(), gamma.data(), mean.data(), invstd.data(),
                                   dx.data(), dg.data(), db.data(), N, C, HW);
    Case c("batchnorm_backward" + tag);
    const float* ddy = c.in(dy);
    const float* dx_in = c.in(x);
    const float* dgm = c.in(gamma);
    const float* dm = c.in(mean);
    const float* di = c.in(invstd);
    float* ddx = c.out("dx", dx, dx_tol);
    float* ddg = c.out("dgamma", dg, sum_tol);
    float* ddb = c.out("dbeta", db, sum_tol);
    c.run([&] { cuda::batchnorm_backward(ddy, dx_in, dgm, dm, di, ddx, ddg, ddb, N, C, HW); });
  }
  {
    std::vector<float> dx(n), dg(c_), db(c_);
    cpu::batchnorm_backward_eval<float>(dy.data(), x.data(), gamma.data(), rm0.data(), rv0.data(),
                                        dx.data(), dg.data(), db.data(), N, C, HW, eps);
    Case c("batchnorm_backward_eval" + tag);
    const float* ddy = c.in(dy);
    const float* dx_in = c.in(x);
    const float* dgm = c.in(gamma);
    const float* drm = c.in(rm0);
    const float* drv = c.in(rv0);
    float* ddx = c.out("dx", dx, dx_tol);
    float* ddg = c.out("dgamma", dg, sum_tol);
    float* ddb = c.out("dbeta", db, sum_tol);
    c.run([&] {
      cuda::batchnorm_backward_eval(ddy, dx_in, dgm, drm, drv, ddx, ddg, ddb, N, C, HW, eps);
    });
  }
}
#endif

// ---- Pooling
// --------------------------------------------------------------------------------------

#if REGEN_HAVE_CPU_POOL
void pool_case(Rng& rng, const PoolShape& s) {
  const size_t nx = static_cast<size_t>(s.N * s.C * s.H * s.W),
               ny = static_cast<size_t>(s.N * s.C * s.P * s.Q);
  const auto x = rng.coarse(nx);  // many ties: the first maximum must win on both sides
  const auto dy = rng.uniform(ny);
  const std::string tag =
      str(" N=%lld C=%lld H=%lld W=%lld k=%lldx%lld stride=%lldx%lld pad=%lldx%lld", (long long)s.N,
          (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.kh, (long long)s.kw,
          (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h, (long long)s.pad_w);
  std::vector<float> y(ny);
  std::vector<int32_t> arg(ny);
  cpu::maxpool2d_forward<float>(x.data(), y.data(), arg.data(), s);
  {
    Case c("maxpool2d_forward" + tag);
    const float* dx = c.in(x);
    float* dy_ = c.out("y", y, kExact);
    int32_t* da = c.out("argmax", arg, kExact);
    c.run([&] { cuda::maxpool2d_forward(dx, dy_, da, s); });
  }
  {
    std::vector<float> dx(nx);
    cpu::maxpool2d_backward<float>(dy.data(), arg.data(), dx.data(), s);
    Case c("maxpool2d_backward" + tag);
    const float* ddy = c.in(dy);
    const int32_t* da = c.in(arg);
    float* ddx = c.out("dx", dx, kExact);  // the same additions in the same order
    c.run([&] { cuda::maxpool2d_backward(ddy, da, ddx, s); });
  }
  {
    // The packed argmax (window positions, kernels/shapes.h pool_code_bits): the code words bit
    // for bit, and the gradient the same additions in the same order.
    std::vector<uint32_t> codes(static_cast<size_t>(s.N * s.C * pool_code_words_per_plane(s)));
    std::vector<float> yp(ny), dxp(nx);
    cpu::maxpool2d_forward_packed<float>(x.data(), yp.data(), codes.data(), s);
    cpu::maxpool2d_backward_packed<float>(dy.data(), codes.data(), dxp.data(), s);
    const std::vector<int32_t> words(codes.begin(), codes.end());
    Case c("maxpool2d_forward_packed" + tag);
    const float* dx = c.in(x);
    float* dyp = c.out("y", yp, kExact);
    int32_t* dc = c.out("codes", words, kExact);
    c.run([&] { cuda::maxpool2d_forward_packed(dx, dyp, reinterpret_cast<uint32_t*>(dc), s); });
    Case b("maxpool2d_backward_packed" + tag);
    const float* ddy = b.in(dy);
    const int32_t* dci = b.in(words);
    float* ddx = b.out("dx", dxp, kExact);
    b.run([&] {
      cuda::maxpool2d_backward_packed(ddy, reinterpret_cast<const uint32_t*>(dci), ddx, s);
    });
  }
  {
    const auto xa = rng.uniform(nx);
    std::vector<float> ya(ny), dx(nx);
    cpu::avgpool2d_forward<float>(xa.data(), ya.data(), s);
    cpu::avgpool2d_backward<float>(dy.data(), dx.data(), s);
    Case c("avgpool2d_forward" + tag);
    const float* dxa = c.in(xa);
    float* dya = c.out("y", ya, kExact);  // double sums in the same order, one multiply
    c.run([&] { cuda::avgpool2d_forward(dxa, dya, s); });
    Case b("avgpool2d_backward" + tag);
    const float* ddy = b.in(dy);
    float* ddx = b.out("dx", dx, Tol{1e-7, 1e-6, 1e-13});  // exact unless the host contracts to FMA
    b.run([&] { cuda::avgpool2d_backward(ddy, ddx, s); });
  }
}

void global_pool_case(Rng& rng, int64_t NC, int64_t HW) {
  const auto x = rng.uniform(static_cast<size_t>(NC * HW)),
             dy = rng.uniform(static_cast<size_t>(NC));
  std::vector<float> y(static_cast<size_t>(NC)), dx(static_cast<size_t>(NC * HW));
  cpu::global_avgpool_forward<float>(x.data(), y.data(), NC, HW);
  cpu::global_avgpool_backward<float>(dy.data(), dx.data(), NC, HW);
  const std::string tag = str(" NC=%lld HW=%lld", (long long)NC, (long long)HW);
  Case c("global_avgpool_forward" + tag);
  const float* dx_ = c.in(x);
  float* dy_ = c.out("y", y, Tol{1e-7, 1e-6, 1e-13});
  c.run([&] { cuda::global_avgpool_forward(dx_, dy_, NC, HW); });
  Case b("global_avgpool_backward" + tag);
  const float* ddy = b.in(dy);
  float* ddx = b.out("dx", dx, kExact);
  b.run([&] { cuda::global_avgpool_backward(ddy, ddx, NC, HW); });
}
#endif

// ---- Embedding
// --------------------------------------------------------------------------------------

#if REGEN_HAVE_CPU_EMBEDDING
// dweight in the CUDA kernel's documented order (cuda_kernels.h): each id's rows in token order,
// in chunks of kEmbeddingChunkRows summed from zero, then the chunks' sums in order from zero.
std::vector<float> embedding_backward_chunked(const std::vector<float>& dy,
                                              const std::vector<int64_t>& ids, int64_t V,
                                              int64_t D) {
  const int64_t R = cuda::kEmbeddingChunkRows;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(V));
  for (size_t i = 0; i < ids.size(); ++i)
    rows[static_cast<size_t>(ids[i])].push_back(static_cast<int64_t>(i));
  std::vector<float> dw(static_cast<size_t>(V * D), 0.0f);
  for (int64_t v = 0; v < V; ++v) {
    const auto& r = rows[static_cast<size_t>(v)];
    for (int64_t c = 0; c < D; ++c) {
      float total = 0.0f;
      for (size_t start = 0; start < r.size(); start += static_cast<size_t>(R)) {
        float chunk = 0.0f;
        for (size_t t = start; t < r.size() && t < start + static_cast<size_t>(R); ++t)
          chunk += dy[static_cast<size_t>(r[t] * D + c)];
        total = r.size() <= static_cast<size_t>(R) ? chunk : total + chunk;
      }
      dw[static_cast<size_t>(v * D + c)] = total;
    }
  }
  return dw;
}

// `hot`: every third token is one of a few ids (runs of equal ids); `runs`: the ids are given.
void embedding_case(Rng& rng, int64_t n, int64_t V, int64_t D,
                    std::vector<int64_t> given_ids = {}) {
  const auto w = rng.uniform(static_cast<size_t>(V * D)),
             dy = rng.uniform(static_cast<size_t>(n * D));
  auto ids = given_ids;
  if (ids.empty()) {
    // Ids with many repeats (a small hot set plus the whole range): runs of equal ids.
    ids = rng.ints(static_cast<size_t>(n), 0, V - 1);
    for (size_t i = 0; i < ids.size(); i += 3) ids[i] = static_cast<int64_t>(i % 7) % V;
  }
  REQUIRE(static_cast<int64_t>(ids.size()) == n);
  std::vector<float> y(static_cast<size_t>(n * D)), dw(static_cast<size_t>(V * D));
  cpu::embedding_forward<float>(w.data(), ids.data(), y.data(), n, V, D);
  cpu::embedding_backward<float>(dy.data(), ids.data(), dw.data(), n, V, D);
  // The documented order is the CPU's, bit for bit, for every id used at most R times; within
  // rounding for the others.
  const std::vector<float> chunked = embedding_backward_chunked(dy, ids, V, D);
  std::vector<int64_t> uses(static_cast<size_t>(V), 0);
  for (int64_t id : ids) ++uses[static_cast<size_t>(id)];
  for (int64_t v = 0; v < V; ++v) {
    const auto u = uses[static_cast<size_t>(v)];
    for (int64_t c = 0; c < D; ++c) {
      const size_t i = static_cast<size_t>(v * D + c);
      if (u <= cuda::kEmbeddingChunkRows) {
        REQUIRE_MESSAGE(same_bits(chunked[i], dw[i]), "id ", v, " column ", c);
      } else {
        REQUIRE_MESSAGE(std::fabs(chunked[i] - dw[i]) <= 1e-7 * static_cast<double>(u) + 1e-5,
                        "id ", v, " column ", c);
      }
    }
  }
  const std::string tag = str(" n=%lld V=%lld D=%lld", (long long)n, (long long)V, (long long)D);
  Case c("embedding_forward" + tag);
  const float* dw_ = c.in(w);
  const int64_t* di = c.in(ids);
  float* dy_ = c.out("y", y, kExact);
  c.run([&] { cuda::embedding_forward(dw_, di, dy_, n, V, D); });
  Case b("embedding_backward" + tag);
  const float* ddy = b.in(dy);
  const int64_t* di2 = b.in(ids);
  float* ddw = b.out("dweight", chunked, kExact);  // the documented order, exactly
  b.run([&] { cuda::embedding_backward(ddy, di2, ddw, n, V, D); });
}

// Ids in runs longer than one chunk, shuffled: `counts[v]` tokens of id v.
std::vector<int64_t> embedding_ids(Rng& rng, const std::vector<int64_t>& counts) {
  std::vector<int64_t> ids;
  for (size_t v = 0; v < counts.size(); ++v)
    ids.insert(ids.end(), static_cast<size_t>(counts[v]), static_cast<int64_t>(v));
  std::shuffle(ids.begin(), ids.end(), rng.gen);
  return ids;
}
#endif

// ---- Layer normalization, softmax, cross-entropy
// ----------------------------------------------------

#if REGEN_HAVE_CPU_LAYERNORM
void layernorm_case(Rng& rng, int64_t M, int64_t N, bool affine, bool misalign) {
  const size_t n = static_cast<size_t>(M * N);
  auto x = rng.uniform(n, -2, 2);
  for (auto& v : x) v += 3.0f;
  const auto gamma = rng.uniform(static_cast<size_t>(N), 0.5f, 1.5f),
             beta = rng.uniform(static_cast<size_t>(N));
  const auto dy = rng.uniform(n);
  const double eps = 1e-5;
  const float* g = affine ? gamma.data() : nullptr;
  const float* b = affine ? beta.data() : nullptr;
  std::vector<float> y(n), mean(static_cast<size_t>(M)), rstd(static_cast<size_t>(M));
  cpu::layernorm_forward<float>(x.data(), g, b, y.data(), mean.data(), rstd.data(), M, N, eps);
  std::vector<float> dx(n), dg(static_cast<size_t>(N)), db(static_cast<size_t>(N));
  cpu::layernorm_backward<float>(dy.data(), x.data(), g, mean.data(), rstd.data(), dx.data(),
                                 affine ? dg.data() : nullptr, affine ? db.data() : nullptr, M, N);
  const std::string tag = str(" M=%lld N=%lld%s%s", (long long)M, (long long)N,
                              affine ? "" : " (no affine)", misalign ? " (unaligned)" : "");
  {
    Case c("layernorm_forward" + tag);
    const float* dx_ = c.in(x, misalign);
    const float* dg_ = affine ? c.in(gamma) : nullptr;
    const float* db_ = affine ? c.in(beta) : nullptr;
    float* dy_ = c.out("y", y, Tol{1e-5, 1e-5, 1e-11}, misalign);
    float* dm = c.out("mean", mean, Tol{1e-6, 1e-6, 1e-13});
    float* dr = c.out("rstd", rstd, Tol{1e-6, 1e-6, 1e-13});
    c.run([&] { cuda::layernorm_forward(dx_, dg_, db_, dy_, dm, dr, M, N, eps); });
  }
  {
    Case c("layernorm_backward" + tag);
    const float* ddy = c.in(dy, misalign);
    const float* dx_ = c.in(x, misalign);
    const float* dg_ = affine ? c.in(gamma) : nullptr;
    const float* dm = c.in(mean);
    const float* dr = c.in(rstd);
    float* ddx = c.out("dx", dx, Tol{2e-5, 1e-4, 1e-9}, misalign);
    // The fast path sums dgamma/dbeta partials in float within a block, the CPU in double.
    const Tol sum_tol{1e-6 * static_cast<double>(M) + 1e-5, 1e-5, 1e-10};
    float* ddg = affine ? c.out("dgamma", dg, sum_tol) : nullptr;
    float* ddb = affine ? c.out("dbeta", db, sum_tol) : nullptr;
    c.run([&] { cuda::layernorm_backward(ddy, dx_, dg_, dm, dr, ddx, ddg, ddb, M, N); });
  }
}
#endif

#if REGEN_HAVE_CPU_SOFTMAX
void softmax_case(Rng& rng, int64_t M, int64_t N) {
  const size_t n = static_cast<size_t>(M * N);
  const auto x = rng.uniform(n, -8, 8), dy = rng.uniform(n);
  std::vector<float> y(n), dx(n);
  cpu::softmax_forward<float>(x.data(), y.data(), M, N);
  cpu::softmax_backward<float>(dy.data(), y.data(), dx.data(), M, N);
  const std::string tag = str(" M=%lld N=%lld", (long long)M, (long long)N);
  Case c("softmax_forward" + tag);
  const float* dx_ = c.in(x);
  float* dy_ = c.out("y", y, Tol{1e-7, 1e-5, 1e-11});
  c.run([&] { cuda::softmax_forward(dx_, dy_, M, N); });
  Case b("softmax_backward" + tag);
  const float* ddy = b.in(dy);
  const float* dyv = b.in(y);
  float* ddx = b.out("dx", dx, Tol{1e-7, 1e-4, 1e-10});
  b.run([&] { cuda::softmax_backward(ddy, dyv, ddx, M, N); });
}
#endif

#if REGEN_HAVE_CPU_CROSS_ENTROPY
void cross_entropy_case(Rng& rng, int64_t M, int64_t V, int64_t ignored_every) {
  const int64_t ignore_index = -100;
  const auto logits = rng.uniform(static_cast<size_t>(M * V), -5, 5);
  auto targets = rng.ints(static_cast<size_t>(M), 0, V - 1);
  if (ignored_every > 0) {
    for (size_t i = 0; i < targets.size(); i += static_cast<size_t>(ignored_every))
      targets[i] = ignore_index;
  }
  const std::vector<float> dloss{1.5f};
  std::vector<float> loss(1), lse(static_cast<size_t>(M)), dlogits(static_cast<size_t>(M * V));
  cpu::cross_entropy_forward<float>(logits.data(), targets.data(), loss.data(), lse.data(), M, V,
                                    ignore_index);
  cpu::cross_entropy_backward<float>(dloss.data(), logits.data(), targets.data(), lse.data(),
                                     dlogits.data(), M, V, ignore_index);
  const std::string tag = str(" M=%lld V=%lld ignored every %lld", (long long)M, (long long)V,
                              (long long)ignored_every);
  Case c("cross_entropy_forward" + tag);
  const float* dl = c.in(logits);
  const int64_t* dt = c.in(targets);
  float* dloss_ = c.out("loss", loss, Tol{1e-6, 1e-5, 1e-11});
  float* dlse = c.out("lse", lse, Tol{1e-5, 1e-6, 1e-12});
  c.run([&] { cuda::cross_entropy_forward(dl, dt, dloss_, dlse, M, V, ignore_index); });
  Case b("cross_entropy_backward" + tag);
  const float* dd = b.in(dloss);
  const float* dl2 = b.in(logits);
  const int64_t* dt2 = b.in(targets);
  const float* dlse2 = b.in(lse);
  float* dg = b.out("dlogits", dlogits, Tol{1e-10, 1e-4, 1e-10});
  b.run([&] { cuda::cross_entropy_backward(dd, dl2, dt2, dlse2, dg, M, V, ignore_index); });
}

// The row-wise pieces of the chunked linear + cross-entropy op, on one chunk of `rows` logits
// (as the op hands them over after its GEMM), with and without a bias: the in-place biased logits,
// lse and row losses; the mean over M = rows rows; the validation and dloss / count; the in-place
// dlogits.
void linear_cross_entropy_case(Rng& rng, int64_t rows, int64_t V, int64_t ignored_every,
                               bool with_bias) {
  const int64_t ignore_index = -100;
  const auto logits = rng.uniform(static_cast<size_t>(rows * V), -5, 5);
  const auto bias = rng.uniform(static_cast<size_t>(V), -1, 1);
  auto targets = rng.ints(static_cast<size_t>(rows), 0, V - 1);
  if (ignored_every > 0) {
    for (size_t i = 0; i < targets.size(); i += static_cast<size_t>(ignored_every))
      targets[i] = ignore_index;
  }
  const float* b = with_bias ? bias.data() : nullptr;
  const std::vector<float> dloss{1.5f};
  std::vector<float> biased = logits, lse(static_cast<size_t>(rows)), loss(1), scale(1);
  std::vector<double> row_loss(static_cast<size_t>(rows));
  cpu::linear_cross_entropy_forward_rows<float>(biased.data(), b, targets.data(), lse.data(),
                                                row_loss.data(), rows, V, ignore_index);
  cpu::linear_cross_entropy_forward_loss<float>(row_loss.data(), targets.data(), loss.data(), rows,
                                                ignore_index);
  cpu::linear_cross_entropy_scale<float>(dloss.data(), targets.data(), scale.data(), rows, V,
                                         ignore_index);
  std::vector<float> dlogits = logits;
  cpu::linear_cross_entropy_backward_rows<float>(dlogits.data(), b, targets.data(), lse.data(),
                                                 scale.data(), rows, V, ignore_index);
  const std::string tag = str(" rows=%lld V=%lld ignored every %lld%s", (long long)rows,
                              (long long)V, (long long)ignored_every, with_bias ? " bias" : "");
  Case f("linear_cross_entropy_forward_rows" + tag);
  float* dlog = f.inout("biased logits", logits, biased, kExact);  // one float add: exact
  const float* db = with_bias ? f.in(bias) : nullptr;
  const int64_t* dt = f.in(targets);
  float* dlse = f.out("lse", lse, Tol{1e-5, 1e-6, 1e-12});
  double* drow = f.out("row_loss", row_loss, Tol{1e-5, 1e-6, 1e-12});
  f.run([&] {
    cuda::linear_cross_entropy_forward_rows(dlog, db, dt, dlse, drow, rows, V, ignore_index);
  });
  Case l("linear_cross_entropy_forward_loss" + tag);
  const double* drow2 = l.in(row_loss);
  const int64_t* dt2 = l.in(targets);
  float* dloss_ = l.out("loss", loss, Tol{1e-6, 1e-6, 1e-12});
  l.run([&] { cuda::linear_cross_entropy_forward_loss(drow2, dt2, dloss_, rows, ignore_index); });
  Case sc("linear_cross_entropy_scale" + tag);
  const float* dd = sc.in(dloss);
  const int64_t* dt3 = sc.in(targets);
  float* dscale = sc.out("scale", scale, kExact);  // the same double division
  sc.run([&] { cuda::linear_cross_entropy_scale(dd, dt3, dscale, rows, V, ignore_index); });
  Case bw("linear_cross_entropy_backward_rows" + tag);
  float* dg = bw.inout("dlogits", logits, dlogits, Tol{1e-10, 1e-4, 1e-10});
  const float* db2 = with_bias ? bw.in(bias) : nullptr;
  const int64_t* dt4 = bw.in(targets);
  const float* dlse2 = bw.in(lse);
  const float* dscale2 = bw.in(scale);
  bw.run([&] {
    cuda::linear_cross_entropy_backward_rows(dg, db2, dt4, dlse2, dscale2, rows, V, ignore_index);
  });
}

// The 16-bit fused head's CUDA pieces (autograd/ops_linear_cross_entropy_lowp.cpp): the GEMM of
// 16-bit operands into f32 logits (cuda::gemm_lowp against cpu::gemm_lowp: f32 sums of K products
// in different orders) written and accumulated, and a vocabulary block's dlogits (against the
// columns [v0, v0 + n) of cpu::linear_cross_entropy_backward_rows on the whole row: the same
// arithmetic on a tile).
template <class H>
void half_linear_cross_entropy_case(Rng& rng, int64_t rows, int64_t V, int64_t K, int64_t v0,
                                    int64_t n, bool with_bias) {
  const int64_t ignore_index = -100;
  const DType dt = dtype_of<H>::value;
  const auto x = to_half<H>(rng.uniform(static_cast<size_t>(rows * K)));
  const auto w = to_half<H>(rng.uniform(static_cast<size_t>(V * K)));
  const auto c0 = rng.uniform(static_cast<size_t>(rows * V));
  std::vector<float> logits(static_cast<size_t>(rows * V)), acc = c0;
  cpu::gemm_lowp(false, true, rows, V, K, dt, x.data(), K, dt, w.data(), K, nullptr, false,
                 logits.data(), V);
  cpu::gemm_lowp(false, true, rows, V, K, dt, x.data(), K, dt, w.data(), K, nullptr, true,
                 acc.data(), V);
  const std::string tag = str(" %s rows=%lld V=%lld K=%lld", half_name<H>(), (long long)rows,
                              (long long)V, (long long)K);
  {
    Case c("gemm_lowp" + tag);
    const H *dx = c.in(x), *dw = c.in(w);
    float* out = c.out("logits", logits, dot_tol(K));
    float* sum = c.inout("accumulated", c0, acc, dot_tol(K + 1));
    c.run([&] {
      cuda::gemm_lowp(false, true, rows, V, K, dx, K, dw, K, false, out, V);
      cuda::gemm_lowp(false, true, rows, V, K, dx, K, dw, K, true, sum, V);
    });
  }
  auto targets = rng.ints(static_cast<size_t>(rows), 0, V - 1);
  targets[0] = ignore_index;
  if (rows > 2) targets[2] = v0;  // a target inside the block
  const auto bias = rng.uniform(static_cast<size_t>(V), -1, 1);
  const float* b = with_bias ? bias.data() : nullptr;
  std::vector<float> biased = logits, lse(static_cast<size_t>(rows)), scale(1);
  std::vector<double> row_loss(static_cast<size_t>(rows));
  const std::vector<float> dloss{0.75f};
  cpu::linear_cross_entropy_forward_rows<float>(biased.data(), b, targets.data(), lse.data(),
                                                row_loss.data(), rows, V, ignore_index);
  cpu::linear_cross_entropy_scale<float>(dloss.data(), targets.data(), scale.data(), rows, V,
                                         ignore_index);
  std::vector<float> full = logits;
  cpu::linear_cross_entropy_backward_rows<float>(full.data(), b, targets.data(), lse.data(),
                                                 scale.data(), rows, V, ignore_index);
  std::vector<float> block(static_cast<size_t>(rows * n)), ref(block.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      block[static_cast<size_t>(r * n + j)] = logits[static_cast<size_t>(r * V + v0 + j)];
      ref[static_cast<size_t>(r * n + j)] = full[static_cast<size_t>(r * V + v0 + j)];
    }
  }
  Case c("linear_cross_entropy_block_dlogits" + tag +
         str(" v0=%lld n=%lld%s", (long long)v0, (long long)n, with_bias ? " bias" : ""));
  float* dblock = c.inout("dlogits", block, ref, Tol{1e-10, 1e-4, 1e-10});
  const float* db = with_bias ? c.in(bias) : nullptr;
  const int64_t* dtg = c.in(targets);
  const float* dlse = c.in(lse);
  const float* dscale = c.in(scale);
  c.run([&] {
    cuda::linear_cross_entropy_block_dlogits(dblock, db, dtg, dlse, dscale, rows, n, v0, V,
                                             ignore_index);
  });
}

// Bad targets: the validation names the op, the row and the target.
void linear_cross_entropy_errors() {
  const std::vector<float> dloss{1.0f};
  const std::vector<int64_t> targets{1, 3};
  DeviceArray<float> dd(dloss), scale(1);
  DeviceArray<int64_t> dt(targets);
  bool thrown = false;
  try {
    cuda::linear_cross_entropy_scale(dd.ptr(), dt.ptr(), scale.ptr(), 2, 3, -100);
  } catch (const regen::Error& e) {
    thrown = true;
    const std::string m = e.message();
    CHECK_MESSAGE(m.find("linear_cross_entropy") != std::string::npos, m);
    CHECK_MESSAGE(m.find("target 3 of row 1") != std::string::npos, m);
  }
  CHECK(thrown);
  CHECK_THROWS_AS(cuda::linear_cross_entropy_scale(nullptr, dt.ptr(), nullptr, 2, 3, -100),
                  regen::Error);
}
#endif

// ---- Attention ----------------------------------------------------------------------------------

#if REGEN_HAVE_CPU_ATTENTION
void attention_case(Rng& rng, AttentionShape s, bool pad_mask) {
  const int64_t D = s.H * s.Dh;
  const size_t nqkv = static_cast<size_t>(s.B * s.S * 3 * D),
               nout = static_cast<size_t>(s.B * s.S * D);
  const auto qkv = rng.uniform(nqkv), dout = rng.uniform(nout);
  std::vector<int32_t> key_pad(static_cast<size_t>(s.B * s.S), 0);
  if (pad_mask) {
    // Batch b pads its last b*S/4 keys, and key 0 of batch 0 (with causal: row 0 sees nothing).
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t j = s.S - b * s.S / 4; j < s.S; ++j)
        key_pad[static_cast<size_t>(b * s.S + j)] = 1;
    }
    key_pad[0] = 1;
  }
  const int32_t* kp = pad_mask ? key_pad.data() : nullptr;
  std::vector<float> out(nout), lse(static_cast<size_t>(s.B * s.H * s.S)), dqkv(nqkv);
  cpu::attention_forward<float>(qkv.data(), kp, out.data(), lse.data(), s);
  cpu::attention_backward<float>(dout.data(), qkv.data(), out.data(), lse.data(), kp, dqkv.data(),
                                 s);
  const std::string tag = str(" B=%lld S=%lld H=%lld Dh=%lld%s%s dropout=%g", (long long)s.B,
                              (long long)s.S, (long long)s.H, (long long)s.Dh,
                              s.causal ? " causal" : "", pad_mask ? " key_pad" : "", s.dropout_p);
  {
    Case c("attention_forward" + tag);
    const float* dq = c.in(qkv);
    const int32_t* dk = pad_mask ? c.in(key_pad) : nullptr;
    float* dout_ = c.out("out", out, Tol{2e-5, 1e-4, 1e-9});
    float* dlse = c.out("lse", lse, Tol{1e-5, 1e-5, 1e-11});
    c.run([&] { cuda::attention_forward(dq, dk, dout_, dlse, s); });
  }
  {
    // The CPU's out and lse as inputs, so the backward is checked on its own.
    Case c("attention_backward" + tag);
    const float* ddo = c.in(dout);
    const float* dq = c.in(qkv);
    const float* dout_ = c.in(out);
    const float* dlse = c.in(lse);
    const int32_t* dk = pad_mask ? c.in(key_pad) : nullptr;
    float* dg = c.out("dqkv", dqkv, Tol{1e-4, 1e-3, 1e-8});
    c.run([&] { cuda::attention_backward(ddo, dq, dout_, dlse, dk, dg, s); });
  }
}

// 16-bit qkv and dout against the CPU's 16-bit attention (f32 scores, softmax and products on
// widened inputs, out and dqkv rounded once): the float case's f32 tolerances, plus one 16-bit
// rounding (2u relative).
template <class H>
void half_attention_case(Rng& rng, AttentionShape s, bool pad_mask) {
  const int64_t D = s.H * s.Dh;
  const size_t nqkv = static_cast<size_t>(s.B * s.S * 3 * D),
               nout = static_cast<size_t>(s.B * s.S * D);
  const auto qkv = to_half<H>(rng.uniform(nqkv)), dout = to_half<H>(rng.uniform(nout));
  std::vector<int32_t> key_pad(static_cast<size_t>(s.B * s.S), 0);
  if (pad_mask) {
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t j = s.S - b * s.S / 4; j < s.S; ++j)
        key_pad[static_cast<size_t>(b * s.S + j)] = 1;
    }
    key_pad[0] = 1;
  }
  const int32_t* kp = pad_mask ? key_pad.data() : nullptr;
  std::vector<H> out(nout), dqkv(nqkv);
  std::vector<float> lse(static_cast<size_t>(s.B * s.H * s.S));
  cpu::attention_forward<H>(qkv.data(), kp, out.data(), lse.data(), s);
  cpu::attention_backward<H>(dout.data(), qkv.data(), out.data(), lse.data(), kp, dqkv.data(), s);
  const double u2 = 2.0 * unit_roundoff<H>();
  const std::string tag = str(" %s B=%lld S=%lld H=%lld Dh=%lld%s%s dropout=%g", half_name<H>(),
                              (long long)s.B, (long long)s.S, (long long)s.H, (long long)s.Dh,
                              s.causal ? " causal" : "", pad_mask ? " key_pad" : "", s.dropout_p);
  {
    Case c("attention_forward" + tag);
    const H* dq = c.in(qkv);
    const int32_t* dk = pad_mask ? c.in(key_pad) : nullptr;
    H* dout_ = c.out("out", out, Tol{2e-5, 1e-4 + u2, u2 * u2 + 1e-9});
    float* dlse = c.out("lse", lse, Tol{1e-5, 1e-5, 1e-11});
    c.run([&] { cuda::attention_forward(dq, dk, dout_, dlse, s); });
  }
  {
    Case c("attention_backward" + tag);
    const H *ddo = c.in(dout), *dq = c.in(qkv), *dout_ = c.in(out);
    const float* dlse = c.in(lse);
    const int32_t* dk = pad_mask ? c.in(key_pad) : nullptr;
    H* dg = c.out("dqkv", dqkv, Tol{1e-4, 1e-3 + u2, u2 * u2 + 1e-8});
    c.run([&] { cuda::attention_backward(ddo, dq, dout_, dlse, dk, dg, s); });
  }
}

AttentionShape attn(int64_t B, int64_t S, int64_t H, int64_t Dh, bool causal, float dropout) {
  AttentionShape s;
  s.B = B;
  s.S = S;
  s.H = H;
  s.Dh = Dh;
  s.scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  s.causal = causal;
  s.dropout_p = dropout;
  s.seed = 42;
  s.stream = 9;
  return s;
}
#endif

// ---- Optimizers ---------------------------------------------------------------------------------

#if REGEN_HAVE_CPU_OPTIM
void optim_cases(Rng& rng, int64_t n) {
  const size_t un = static_cast<size_t>(n);
  const auto p0 = rng.uniform(un), g = rng.uniform(un), m0 = rng.uniform(un),
             v0 = rng.uniform(un, 0, 1);
  const Tol tol{1e-7, 3e-7, 1e-13};  // one float ulp: the same double expressions, FMA aside
  struct Sgd {
    double momentum, dampening, wd;
    bool nesterov, first;
  };
  for (const Sgd& o : {Sgd{0, 0, 0, false, false}, Sgd{0.9, 0, 1e-4, false, true},
                       Sgd{0.9, 0.1, 1e-4, false, false}, Sgd{0.9, 0, 5e-4, true, false}}) {
    auto p = p0, m = m0;
    cpu::sgd_step<float>(p.data(), g.data(), o.momentum != 0 ? m.data() : nullptr, n, 0.1,
                         o.momentum, o.dampening, o.wd, o.nesterov, o.first);
    Case c(str("sgd_step n=%lld momentum=%g dampening=%g wd=%g nesterov=%d first=%d", (long long)n,
               o.momentum, o.dampening, o.wd, o.nesterov, o.first));
    const float* dg = c.in(g);
    float* dp = c.inout("param", p0, p, tol);
    float* dm = o.momentum != 0 ? c.inout("momentum_buf", m0, m, tol) : nullptr;
    c.run([&] {
      cuda::sgd_step(dp, dg, dm, n, 0.1, o.momentum, o.dampening, o.wd, o.nesterov, o.first);
    });
  }
  for (int64_t step : {int64_t{1}, int64_t{10}}) {
    auto p = p0, m = m0, v = v0;
    cpu::adamw_step<float>(p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                           step);
    Case c(str("adamw_step n=%lld step=%lld", (long long)n, (long long)step));
    const float* dg = c.in(g);
    float* dp = c.inout("param", p0, p, tol);
    float* dm = c.inout("exp_avg", m0, m, tol);
    float* dv = c.inout("exp_avg_sq", v0, v, tol);
    c.run([&] { cuda::adamw_step(dp, dg, dm, dv, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, step); });
  }
}
#endif

// ---- 16-bit (bf16, f16) launchers against the CPU's 16-bit launchers ----------------------------
// Both sides read the same 16-bit inputs, compute in f32 and round once on store. Where both run
// the same f32 expressions in the same order (element-wise maps, dropout, copies) the results agree
// bit for bit. Elsewhere the f32 values may differ by f32 roundoff (a libm ulp, another summation
// order), and the one rounding to 16 bits can then differ by one 16-bit ulp: at most 2u relative, u
// = 2^-8 (bf16) or 2^-11 (f16); a reduction of length L adds its f32 difference, L * 2^-24 times
// the sum of |terms| (atol).

template <class H, class F>
void half_unary_case(F f, const char* name, const std::vector<H>& x, const std::vector<H>& g,
                     int64_t n, bool misalign, const std::string& tag);

template <class H>
void half_elementwise_cases(Rng& rng, int64_t n, bool misalign) {
  const size_t un = static_cast<size_t>(n);
  const auto x = to_half<H>(rng.uniform(un)), z = to_half<H>(rng.uniform(un));
  const std::string tag =
      str(" %s n=%lld%s", half_name<H>(), static_cast<long long>(n), misalign ? " misaligned" : "");
  {
    std::vector<H> ref(un);
    cpu::add<H>(x.data(), z.data(), ref.data(), n, n);
    Case c("add" + tag);
    const H *dx = c.in(x, misalign), *dz = c.in(z, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::add(dx, dz, y, n, n); });
  }
  {
    std::vector<H> ref(un);
    cpu::mul<H>(x.data(), z.data(), ref.data(), n, n);
    Case c("mul" + tag);
    const H *dx = c.in(x, misalign), *dz = c.in(z, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::mul(dx, dz, y, n, n); });
  }
  {
    std::vector<H> ref(un);
    cpu::scale<H>(x.data(), ref.data(), n, H(0.3f));
    Case c("scale" + tag);
    const H* dx = c.in(x, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::scale(dx, y, n, H(0.3f)); });
  }
  {
    std::vector<H> ref(un);
    cpu::scale_f32<H>(x.data(), ref.data(), n, 1.0f / 3.0f);
    Case c("scale_f32" + tag);
    const H* dx = c.in(x, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::scale_f32(dx, y, n, 1.0f / 3.0f); });
  }
  {
    std::vector<H> ref(un);
    cpu::fill<H>(ref.data(), n, H(-1.25f));
    Case c("fill" + tag);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::fill(y, n, H(-1.25f)); });
  }
  {
    std::vector<H> ref(un);
    cpu::fill_from_scalar_f32<H>(x.data(), ref.data(), n, 1.0f / 7.0f);
    Case c("fill_from_scalar_f32" + tag);
    const H* dx = c.in(std::vector<H>{x[0]});
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::fill_from_scalar_f32(dx, y, n, 1.0f / 7.0f); });
  }
  {
    auto ref = x;
    cpu::add_inplace<H>(ref.data(), z.data(), n);
    Case c("add_inplace" + tag);
    const H* dz = c.in(z, misalign);
    H* y = c.inout("y", x, ref, kExact);
    c.run([&] { cuda::add_inplace(y, dz, n); });
  }
  {
    std::vector<H> ref(un);
    cpu::copy<H>(x.data(), ref.data(), n);
    Case c("copy" + tag);
    const H* dx = c.in(x, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::copy(dx, y, n); });
  }
  for (float p : {0.0f, 0.25f}) {
    std::vector<H> ref(un);
    cpu::dropout_forward_lowp<H>(x.data(), ref.data(), n, p, 1234, 7);
    Case c(str("dropout p=%g", p) + tag);
    const H* dx = c.in(x, misalign);
    H* y = c.out("y", ref, kExact, misalign);
    c.run([&] { cuda::dropout_backward_lowp<H>(dx, y, n, p, 1234, 7); });
  }
  {  // sum_all and sum_squares: double sums on both sides, one rounding
    std::vector<H> ref(1), ref2(1);
    cpu::sum_all<H>(x.data(), ref.data(), n);
    cpu::sum_squares<H>(x.data(), ref2.data(), n);
    Case c("sum_all sum_squares" + tag);
    const H* dx = c.in(x, misalign);
    H* y = c.out("sum", ref, half_tol<H>(), misalign);
    H* y2 = c.out("sum of squares", ref2, half_tol<H>(), misalign);
    c.run([&] {
      cuda::sum_all(dx, y, n);
      cuda::sum_squares(dx, y2, n);
    });
  }
  // Every op of the unary list: the CPU's 16-bit loop (widen, the f32 functor, round once); CUDA's
  // libm may differ from the host's by an f32 ulp, so one 16-bit rounding apart.
  const auto g = to_half<H>(rng.uniform(un));
#define REGEN_UNARY_HALF_CASE(name) \
  half_unary_case<H>(unary::name{}, #name, x, g, n, misalign, tag);
  REGEN_UNARY_OPS(REGEN_UNARY_HALF_CASE)
#undef REGEN_UNARY_HALF_CASE
}

template <class H, class F>
void half_unary_case(F f, const char* name, const std::vector<H>& x, const std::vector<H>& g,
                     int64_t n, bool misalign, const std::string& tag) {
  const size_t un = static_cast<size_t>(n);
  const Tol tol = half_tol<H>(1, 1e-30);
  std::vector<H> y(un), dx(un);
  cpu::unary_forward<H>(f, x.data(), y.data(), n);
  const std::vector<H>& s = F::reads == unary::Reads::output ? y : x;
  cpu::unary_backward<H>(f, g.data(), s.data(), dx.data(), n);
  {
    Case c(str("%s_forward", name) + tag);
    const H* dxin = c.in(x, misalign);
    H* dy = c.out("y", y, tol, misalign);
    c.run([&] { cuda::unary_forward(f, dxin, dy, n); });
  }
  {
    Case c(str("%s_backward", name) + tag);
    const H *dg = c.in(g, misalign), *ds = c.in(s, misalign);
    H* ddx = c.out("dx", dx, tol, misalign);
    c.run([&] { cuda::unary_backward(f, dg, ds, ddx, n); });
  }
  if constexpr (unary::has_mask<F>::value) {
    std::vector<H> ym(un), dxm(un);
    std::vector<uint32_t> mask(static_cast<size_t>(mask_words(n)));
    cpu::unary_forward_mask<H>(f, x.data(), ym.data(), mask.data(), n);
    cpu::unary_backward_mask<H>(f, g.data(), mask.data(), dxm.data(), n);
    Case c(str("%s_forward_mask backward_mask", name) + tag);
    const H *dxin = c.in(x, misalign), *dg = c.in(g, misalign);
    H* dy = c.out("y", ym, tol, misalign);
    uint32_t* dm = c.out("mask", mask, kExact);
    H* ddx = c.out("dx", dxm, tol, misalign);
    c.run([&] {
      cuda::unary_forward_mask(f, dxin, dy, dm, n);
      cuda::unary_backward_mask(f, dg, dm, ddx, n);
    });
  }
}

template <class H>
void half_reduction_cases(Rng& rng, int64_t rows, int64_t cols) {
  const auto x = to_half<H>(rng.uniform(static_cast<size_t>(rows * cols)));
  const auto b = to_half<H>(rng.uniform(static_cast<size_t>(cols)));
  const std::string tag = str(" %s (%lld, %lld)", half_name<H>(), static_cast<long long>(rows),
                              static_cast<long long>(cols));
  {
    std::vector<H> ref(static_cast<size_t>(cols));
    cpu::sum_rows<H>(x.data(), ref.data(), rows, cols);
    Case c("sum_rows" + tag);
    const H* dx = c.in(x);
    H* y = c.out("y", ref, half_tol<H>());
    c.run([&] { cuda::sum_rows(dx, y, rows, cols); });
  }
  {
    std::vector<H> ref(x.size()), ref2(x.size());
    cpu::add<H>(x.data(), b.data(), ref.data(), rows * cols, cols);
    cpu::mul<H>(x.data(), b.data(), ref2.data(), rows * cols, cols);
    Case c("add mul broadcast" + tag);
    const H *dx = c.in(x), *db = c.in(b);
    H* y = c.out("add", ref, kExact);
    H* y2 = c.out("mul", ref2, kExact);
    c.run([&] {
      cuda::add(dx, db, y, rows * cols, cols);
      cuda::mul(dx, db, y2, rows * cols, cols);
    });
  }
  {  // softmax over rows of `cols`: f32 max, exponentials and sum (the CPU sums in double)
    std::vector<H> y(x.size()), dxr(x.size());
    const auto g = to_half<H>(rng.uniform(x.size()));
    cpu::softmax_forward<H>(x.data(), y.data(), rows, cols);
    cpu::softmax_backward<H>(g.data(), y.data(), dxr.data(), rows, cols);
    Case c("softmax" + tag);
    const H *dx = c.in(x), *dg = c.in(g), *dyin = c.in(y);
    H* dy = c.out("y", y, half_tol<H>(cols));
    H* ddx = c.out("dx", dxr, half_tol<H>(cols));
    c.run([&] {
      cuda::softmax_forward(dx, dy, rows, cols);
      cuda::softmax_backward(dg, dyin, ddx, rows, cols);
    });
  }
}

template <class H>
void half_copy_cases(Rng& rng) {
  const std::string tag = str(" %s", half_name<H>());
  {
    const int64_t shape[] = {2, 3, 4, 5}, perm[] = {0, 2, 1, 3};
    PermuteShape ps;
    ps.ndim = 4;
    for (int d = 0; d < 4; ++d) {
      ps.shape[d] = shape[d];
      ps.perm[d] = perm[d];
    }
    const auto x = to_half<H>(rng.uniform(120));
    std::vector<H> ref(x.size());
    cpu::permute<H>(x.data(), ref.data(), ps);
    Case c("permute" + tag);
    const H* dx = c.in(x);
    H* y = c.out("y", ref, kExact);
    c.run([&] { cuda::permute(dx, y, ps); });
  }
  // slice_copy: the float4 path (8 elements), the 2-element path, the 1-element path.
  const struct {
    int64_t outer, len, inner, x_dim, x_start, y_dim, y_start;
    bool misalign;
  } slices[] = {{2, 4, 16, 4, 0, 12, 8, false},
                {3, 2, 5, 7, 4, 2, 0, false},
                {2, 2, 2, 6, 2, 4, 2, false},
                {2, 4, 16, 4, 0, 12, 8, true}};
  for (const auto& q : slices) {
    SliceShape sh{q.outer, q.len, q.inner, q.x_dim, q.x_start, q.y_dim, q.y_start};
    const auto x = to_half<H>(rng.uniform(static_cast<size_t>(q.outer * q.x_dim * q.inner)));
    const auto y0 = to_half<H>(rng.uniform(static_cast<size_t>(q.outer * q.y_dim * q.inner)));
    auto ref = y0;
    cpu::slice_copy<H>(x.data(), ref.data(), sh);
    Case c(str("slice_copy len=%lld inner=%lld%s", static_cast<long long>(q.len),
               static_cast<long long>(q.inner), q.misalign ? " misaligned" : "") +
           tag);
    const H* dx = c.in(x, q.misalign);
    H* y = c.inout("y", y0, ref, kExact);
    c.run([&] { cuda::slice_copy(dx, y, sh); });
  }
}

// 16-bit GEMMs (cublasGemmEx, f32 accumulation) against cpu::gemm<H> (the widening GEMM): the f32
// sums of K products in different orders, then one rounding each.
template <class H>
void half_gemm_case(Rng& rng, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    float beta, int64_t batch) {
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
  const int64_t sa = (ta ? K : M) * lda, sb = (tb ? N : K) * ldb, sc = M * ldc;
  const auto A = to_half<H>(rng.uniform(static_cast<size_t>(batch * sa)));
  const auto B = to_half<H>(rng.uniform(static_cast<size_t>(batch * sb)));
  const auto C0 = to_half<H>(rng.uniform(static_cast<size_t>(batch * sc)));
  auto ref = C0;
  const H ha(alpha), hb(beta);
  if (batch == 1) {
    cpu::gemm<H>(ta, tb, M, N, K, ha, A.data(), lda, B.data(), ldb, hb, ref.data(), ldc);
  } else {
    cpu::gemm_batched<H>(ta, tb, batch, M, N, K, ha, A.data(), lda, sa, B.data(), ldb, sb, hb,
                         ref.data(), ldc, sc);
  }
  Case c(str("gemm%s %s ta=%d tb=%d batch=%lld M=%lld N=%lld K=%lld", batch == 1 ? "" : "_batched",
             half_name<H>(), ta, tb, static_cast<long long>(batch), static_cast<long long>(M),
             static_cast<long long>(N), static_cast<long long>(K)));
  const H *dA = c.in(A), *dB = c.in(B);
  H* dC = c.inout("C", C0, ref, half_tol<H>(K, static_cast<double>(K) + 1.0));
  c.run([&] {
    if (batch == 1) {
      cuda::gemm(ta, tb, M, N, K, ha, dA, lda, dB, ldb, hb, dC, ldc);
    } else {
      cuda::gemm_batched(ta, tb, batch, M, N, K, ha, dA, lda, sa, dB, ldb, sb, hb, dC, ldc, sc);
    }
  });
}

// Layer and RMS norms with 16-bit x, dy, y, dx and f32 parameters and statistics, and a layer norm
// of an f32 x that keeps its normalized input in 16 bits (autocast's residual stream). Row
// statistics in double on both sides for layer norm (mean and rstd agree to f32 roundoff), in f32
// on the GPU for RMS norm's sum of squares (N f32 roundoffs); y and dx one 16-bit rounding apart;
// the f32 parameter gradients sum M terms.
template <class H>
void half_norm_cases(Rng& rng, int64_t M, int64_t N) {
  const size_t n = static_cast<size_t>(M * N);
  const auto x = to_half<H>(rng.uniform(n, -2.0f, 2.0f)), g = to_half<H>(rng.uniform(n));
  const auto gamma = rng.uniform(static_cast<size_t>(N), 0.5f, 1.5f);
  const auto beta = rng.uniform(static_cast<size_t>(N));
  const std::string tag =
      str(" %s (%lld, %lld)", half_name<H>(), static_cast<long long>(M), static_cast<long long>(N));
  const Tol stat_tol{1e-6, static_cast<double>(N) * 0x1p-24 + 1e-6, 1e-10};
  const Tol param_tol{1e-7 * static_cast<double>(M) * 8.0 + 1e-5, 1e-4, 1e-8};
  {
    std::vector<H> y(n), dx(n);
    std::vector<float> mean(static_cast<size_t>(M)), rstd(mean.size()), dgamma(gamma.size()),
        dbeta(gamma.size());
    cpu::layernorm_forward_lowp<H>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                   rstd.data(), M, N, 1e-5);
    cpu::layernorm_backward_lowp<H>(g.data(), x.data(), gamma.data(), mean.data(), rstd.data(),
                                    dx.data(), dgamma.data(), dbeta.data(), M, N);
    Case c("layernorm_lowp" + tag);
    const H *dxin = c.in(x), *dg = c.in(g);
    const float *dgm = c.in(gamma), *dbt = c.in(beta), *dmean = c.in(mean), *drstd = c.in(rstd);
    H* dy = c.out("y", y, half_tol<H>(4, 8.0));
    float* om = c.out("mean", mean, stat_tol);
    float* orr = c.out("rstd", rstd, stat_tol);
    H* odx = c.out("dx", dx, half_tol<H>(N, 8.0));
    float* odg = c.out("dgamma", dgamma, param_tol);
    float* odb = c.out("dbeta", dbeta, param_tol);
    c.run([&] {
      cuda::layernorm_forward_lowp(dxin, dgm, dbt, dy, om, orr, M, N, 1e-5);
      cuda::layernorm_backward_lowp(dg, dxin, dgm, dmean, drstd, odx, odg, odb, M, N);
    });
  }
  {
    // An f32 x under autocast: f32 y, dx and statistics as layernorm_forward/backward, and the
    // normalized input kept in H (one rounding apart); backward from the CPU's xhat.
    const auto xf = rng.uniform(n, 1.0f, 4.0f), dyf = rng.uniform(n);
    std::vector<float> y(n), dx(n), mean(static_cast<size_t>(M)), rstd(mean.size()),
        dgamma(gamma.size()), dbeta(gamma.size());
    std::vector<H> xs(n);
    cpu::layernorm_forward_save_xhat<H>(xf.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                        rstd.data(), xs.data(), M, N, 1e-5);
    cpu::layernorm_backward_xhat<H>(dyf.data(), xs.data(), gamma.data(), rstd.data(), dx.data(),
                                    dgamma.data(), dbeta.data(), M, N);
    Case c("layernorm_save_xhat" + tag);
    const float *dxin = c.in(xf), *ddy = c.in(dyf), *dgm = c.in(gamma), *dbt = c.in(beta),
                *drstd = c.in(rstd);
    const H* dxs = c.in(xs);
    float* oy = c.out("y", y, Tol{1e-5, 1e-5, 1e-11});
    float* om = c.out("mean", mean, stat_tol);
    float* orr = c.out("rstd", rstd, stat_tol);
    H* oxs = c.out("xhat", xs, half_tol<H>(4, 8.0));
    float* odx = c.out("dx", dx, Tol{2e-5, 1e-4, 1e-9});
    float* odg = c.out("dgamma", dgamma, param_tol);
    float* odb = c.out("dbeta", dbeta, param_tol);
    c.run([&] {
      cuda::layernorm_forward_save_xhat(dxin, dgm, dbt, oy, om, orr, oxs, M, N, 1e-5);
      cuda::layernorm_backward_xhat(ddy, dxs, dgm, drstd, odx, odg, odb, M, N);
    });
  }
  {
    std::vector<H> y(n), dx(n);
    std::vector<float> rstd(static_cast<size_t>(M)), dw(gamma.size());
    cpu::rmsnorm_forward_lowp<H>(x.data(), gamma.data(), y.data(), rstd.data(), M, N, 1e-6);
    cpu::rmsnorm_backward_lowp<H>(g.data(), x.data(), gamma.data(), rstd.data(), dx.data(),
                                  dw.data(), M, N);
    Case c("rmsnorm_lowp" + tag);
    const H *dxin = c.in(x), *dg = c.in(g);
    const float *dgm = c.in(gamma), *drstd = c.in(rstd);
    H* dy = c.out("y", y, half_tol<H>(N, 8.0));
    float* orr = c.out("rstd", rstd, stat_tol);
    H* odx = c.out("dx", dx, half_tol<H>(N, 8.0));
    float* odw = c.out("dweight", dw, param_tol);
    c.run([&] {
      cuda::rmsnorm_forward_lowp(dxin, dgm, dy, orr, M, N, 1e-6);
      cuda::rmsnorm_backward_lowp(dg, dxin, dgm, drstd, odx, odw, M, N);
    });
  }
}

// Embedding rows copied (bit for bit) and their gradients summed in token order with a 16-bit
// rounding after each addition on both sides (bit for bit while every id is used at most
// kEmbeddingChunkRows times, as here).
template <class H>
void half_embedding_case(Rng& rng, int64_t n, int64_t V, int64_t D) {
  const auto w = to_half<H>(rng.uniform(static_cast<size_t>(V * D)));
  const auto g = to_half<H>(rng.uniform(static_cast<size_t>(n * D)));
  const auto ids = rng.ints(static_cast<size_t>(n), 0, V - 1);
  std::vector<H> y(static_cast<size_t>(n * D)), dw(w.size());
  cpu::embedding_forward<H>(w.data(), ids.data(), y.data(), n, V, D);
  cpu::embedding_backward<H>(g.data(), ids.data(), dw.data(), n, V, D);
  Case c(str("embedding %s n=%lld V=%lld D=%lld", half_name<H>(), static_cast<long long>(n),
             static_cast<long long>(V), static_cast<long long>(D)));
  const H *dwin = c.in(w), *dg = c.in(g);
  const int64_t* dids = c.in(ids);
  H* oy = c.out("y", y, kExact);
  H* odw = c.out("dweight", dw, kExact);
  c.run([&] {
    cuda::embedding_forward(dwin, dids, oy, n, V, D);
    cuda::embedding_backward(dg, dids, odw, n, V, D);
  });
}

// 2x upsampling: nearest's copies and 2x2 sums in the CPU's order (bit for bit); bilinear's
// weighted sums, which the host compiler may contract into FMAs (one 16-bit rounding apart).
template <class H>
void half_upsample_case(Rng& rng, int64_t NC, int64_t Hh, int64_t W) {
  const auto x = to_half<H>(rng.uniform(static_cast<size_t>(NC * Hh * W)));
  const auto g = to_half<H>(rng.uniform(static_cast<size_t>(NC * 4 * Hh * W)));
  std::vector<H> yn(g.size()), yb(g.size()), dn(x.size()), db(x.size());
  cpu::upsample2x_nearest_forward<H>(x.data(), yn.data(), NC, Hh, W);
  cpu::upsample2x_bilinear_forward<H>(x.data(), yb.data(), NC, Hh, W);
  cpu::upsample2x_nearest_backward<H>(g.data(), dn.data(), NC, Hh, W);
  cpu::upsample2x_bilinear_backward<H>(g.data(), db.data(), NC, Hh, W);
  Case c(str("upsample2x %s NC=%lld H=%lld W=%lld", half_name<H>(), static_cast<long long>(NC),
             static_cast<long long>(Hh), static_cast<long long>(W)));
  const H *dx = c.in(x), *dg = c.in(g);
  H* oyn = c.out("nearest y", yn, kExact);
  H* oyb = c.out("bilinear y", yb, half_tol<H>(4, 2.0));
  H* odn = c.out("nearest dx", dn, kExact);
  H* odb = c.out("bilinear dx", db, half_tol<H>(16, 4.0));
  c.run([&] {
    cuda::upsample2x_nearest_forward(dx, oyn, NC, Hh, W);
    cuda::upsample2x_bilinear_forward(dx, oyb, NC, Hh, W);
    cuda::upsample2x_nearest_backward(dg, odn, NC, Hh, W);
    cuda::upsample2x_bilinear_backward(dg, odb, NC, Hh, W);
  });
}

// Pooling on 16-bit planes: maxima are copies (bit for bit, the same argmax and codes); max
// backward sums in f32 in the same order; average pooling sums in double (forward) or f32
// (backward, which the host may contract into FMAs: one 16-bit rounding apart).
template <class H>
void half_pool_case(Rng& rng, const PoolShape& s) {
  const size_t nx = static_cast<size_t>(s.N * s.C * s.H * s.W),
               ny = static_cast<size_t>(s.N * s.C * s.P * s.Q);
  const auto x = to_half<H>(rng.coarse(nx)), xa = to_half<H>(rng.uniform(nx));
  const auto dy = to_half<H>(rng.uniform(ny));
  std::vector<H> y(ny), dx(nx), yp(ny), dxp(nx), ya(ny), dxa(nx), yg(s.N * s.C), dxg(nx);
  std::vector<int32_t> arg(ny);
  std::vector<uint32_t> codes(static_cast<size_t>(s.N * s.C * pool_code_words_per_plane(s)));
  cpu::maxpool2d_forward<H>(x.data(), y.data(), arg.data(), s);
  cpu::maxpool2d_backward<H>(dy.data(), arg.data(), dx.data(), s);
  cpu::maxpool2d_forward_packed<H>(x.data(), yp.data(), codes.data(), s);
  cpu::maxpool2d_backward_packed<H>(dy.data(), codes.data(), dxp.data(), s);
  cpu::avgpool2d_forward<H>(xa.data(), ya.data(), s);
  cpu::avgpool2d_backward<H>(dy.data(), dxa.data(), s);
  const int64_t NC = s.N * s.C, HW = s.H * s.W;
  const auto gy = to_half<H>(rng.uniform(static_cast<size_t>(NC)));
  cpu::global_avgpool_forward<H>(xa.data(), yg.data(), NC, HW);
  cpu::global_avgpool_backward<H>(gy.data(), dxg.data(), NC, HW);
  Case c(str("pool %s N=%lld C=%lld H=%lld W=%lld k=%lldx%lld stride=%lldx%lld", half_name<H>(),
             (long long)s.N, (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.kh,
             (long long)s.kw, (long long)s.stride_h, (long long)s.stride_w));
  const H *dxin = c.in(x), *dxain = c.in(xa), *ddy = c.in(dy), *dgy = c.in(gy);
  H* oy = c.out("max y", y, kExact);
  int32_t* oarg = c.out("argmax", arg, kExact);
  H* odx = c.out("max dx", dx, kExact);
  H* oyp = c.out("packed y", yp, kExact);
  uint32_t* ocodes = c.out("codes", codes, kExact);
  H* odxp = c.out("packed dx", dxp, kExact);
  H* oya = c.out("avg y", ya, half_tol<H>());
  H* odxa = c.out("avg dx", dxa, half_tol<H>(s.kh * s.kw, 2.0));
  H* oyg = c.out("global avg y", yg, half_tol<H>());
  H* odxg = c.out("global avg dx", dxg, kExact);
  c.run([&] {
    cuda::maxpool2d_forward(dxin, oy, oarg, s);
    cuda::maxpool2d_backward(ddy, oarg, odx, s);
    cuda::maxpool2d_forward_packed(dxin, oyp, ocodes, s);
    cuda::maxpool2d_backward_packed(ddy, ocodes, odxp, s);
    cuda::avgpool2d_forward(dxain, oya, s);
    cuda::avgpool2d_backward(ddy, odxa, s);
    cuda::global_avgpool_forward(dxain, oyg, NC, HW);
    cuda::global_avgpool_backward(dgy, odxg, NC, HW);
  });
}

// Batch norm with 16-bit x, dy, y, dx and f32 parameters, statistics and running stats: the
// statistics and the dx coefficients in double on both sides (f32 roundoff apart), y and dx one
// 16-bit rounding apart.
template <class H>
void half_batchnorm_case(Rng& rng, int64_t N, int64_t C, int64_t HW) {
  const size_t n = static_cast<size_t>(N * C * HW), c = static_cast<size_t>(C);
  const auto x = to_half<H>(rng.uniform(n, -1.0f, 3.0f)), g = to_half<H>(rng.uniform(n));
  const auto gamma = rng.uniform(c, 0.5f, 1.5f), beta = rng.uniform(c);
  const auto rm0 = rng.uniform(c), rv0 = rng.uniform(c, 0.5f, 2.0f);
  std::vector<H> y(n), ye(n), dx(n), dxe(n);
  std::vector<float> mean(c), invstd(c), rm = rm0, rv = rv0, dg(c), db(c), dge(c), dbe(c);
  cpu::batchnorm_forward_train_lowp<H>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                       invstd.data(), rm.data(), rv.data(), N, C, HW, 0.1, 1e-5);
  cpu::batchnorm_forward_eval_lowp<H>(x.data(), gamma.data(), beta.data(), rm0.data(), rv0.data(),
                                      ye.data(), N, C, HW, 1e-5);
  cpu::batchnorm_backward_lowp<H>(g.data(), x.data(), gamma.data(), mean.data(), invstd.data(),
                                  dx.data(), dg.data(), db.data(), N, C, HW);
  cpu::batchnorm_backward_eval_lowp<H>(g.data(), x.data(), gamma.data(), rm0.data(), rv0.data(),
                                       dxe.data(), dge.data(), dbe.data(), N, C, HW, 1e-5);
  const Tol stat{1e-6, 1e-6, 1e-12};
  const Tol sums{1e-6 * static_cast<double>(N * HW) * 0x1p-10, 1e-5, 1e-10};
  Case cs(str("batchnorm_lowp %s N=%lld C=%lld HW=%lld", half_name<H>(), (long long)N, (long long)C,
              (long long)HW));
  const H *dxin = cs.in(x), *dg_in = cs.in(g);
  const float *dgm = cs.in(gamma), *dbt = cs.in(beta), *drm0 = cs.in(rm0), *drv0 = cs.in(rv0);
  const float *dmean_in = cs.in(mean), *dinv_in = cs.in(invstd);
  H* oy = cs.out("train y", y, half_tol<H>(2, 4.0));
  float* om = cs.out("mean", mean, stat);
  float* oi = cs.out("invstd", invstd, stat);
  float* orm = cs.inout("running_mean", rm0, rm, stat);
  float* orv = cs.inout("running_var", rv0, rv, stat);
  H* oye = cs.out("eval y", ye, half_tol<H>(2, 4.0));
  H* odx = cs.out("dx", dx, half_tol<H>(4, 4.0));
  float* odg = cs.out("dgamma", dg, sums);
  float* odb = cs.out("dbeta", db, sums);
  H* odxe = cs.out("eval dx", dxe, half_tol<H>());
  float* odge = cs.out("eval dgamma", dge, sums);
  float* odbe = cs.out("eval dbeta", dbe, sums);
  cs.run([&] {
    cuda::batchnorm_forward_train_lowp(dxin, dgm, dbt, oy, om, oi, orm, orv, N, C, HW, 0.1, 1e-5);
    cuda::batchnorm_forward_eval_lowp(dxin, dgm, dbt, drm0, drv0, oye, N, C, HW, 1e-5);
    cuda::batchnorm_backward_lowp(dg_in, dxin, dgm, dmean_in, dinv_in, odx, odg, odb, N, C, HW);
    cuda::batchnorm_backward_eval_lowp(dg_in, dxin, dgm, drm0, drv0, odxe, odge, odbe, N, C, HW,
                                       1e-5);
  });
}
}  // namespace

// ---- The table
// -------------------------------------------------------------------------------------

TEST_CASE("cpu references present") {
  // Each family below is compiled into this suite only when kernels/cpu/<family>.cpp exists.
  const struct {
    const char* family;
    bool present;
  } refs[] = {
      {"conv2d", REGEN_HAVE_CPU_CONV2D},       {"batchnorm", REGEN_HAVE_CPU_BATCHNORM},
      {"pool", REGEN_HAVE_CPU_POOL},           {"embedding", REGEN_HAVE_CPU_EMBEDDING},
      {"layernorm", REGEN_HAVE_CPU_LAYERNORM}, {"softmax", REGEN_HAVE_CPU_SOFTMAX},
      {"attention", REGEN_HAVE_CPU_ATTENTION}, {"cross_entropy", REGEN_HAVE_CPU_CROSS_ENTROPY},
      {"optim", REGEN_HAVE_CPU_OPTIM}};
  for (const auto& r : refs) {
    if (!r.present)
      FAIL_CHECK("kernels/cpu/" << r.family
                                << ".cpp was not in the tree: its CUDA kernels are untested");
  }
}

TEST_CASE("gemm") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(1);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        gemm_case(rng, ta, tb, 1, 1, 1, 1.0f, 0.0f, false);
        gemm_case(rng, ta, tb, 17, 33, 9, 0.5f, 1.0f, false);
        gemm_case(rng, ta, tb, 30, 67, 20, 1.0f, -0.5f, false);
        gemm_batched_case(rng, ta, tb, 5, 33, 17, 40);
      }
    }
    gemm_case(rng, false, false, 0, 5, 3, 1.0f, 0.0f, false);
    return;
  }
  Rng rng(1);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      gemm_case(rng, ta, tb, 1, 1, 1, 1.0f, 0.0f, false);
      gemm_case(rng, ta, tb, 17, 33, 9, 0.5f, 1.0f, false);
      gemm_case(rng, ta, tb, 130, 67, 200, 1.0f, -0.5f, false);
      gemm_batched_case(rng, ta, tb, 5, 33, 17, 40);
    }
  }
  // Transformer shapes: d_model 512, ff 2048, vocab 30000, batch*seq 256.
  gemm_case(rng, false, true, 256, 2048, 512, 1.0f, 0.0f, false);
  gemm_case(rng, false, false, 256, 512, 2048, 1.0f, 0.0f, false);
  gemm_case(rng, true, false, 512, 2048, 256, 1.0f, 1.0f, false);
  gemm_case(rng, false, true, 256, 30000, 512, 1.0f, 0.0f, false);
  gemm_batched_case(rng, false, true, 16, 128, 128, 64);
  gemm_case(rng, false, true, 256, 2048, 512, 1.0f, 0.0f, true);  // TF32
  gemm_case(rng, false, false, 0, 5, 3, 1.0f, 0.0f, false);       // empty
}

TEST_CASE("elementwise") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(2);
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      elementwise_cases(rng, n, false);
      elementwise_cases(rng, n, true);
    }
    broadcast_case(rng, 1000, 1000);
    broadcast_case(rng, 512 * 3, 3);
    broadcast_case(rng, 4 * 512, 512);
    broadcast_case(rng, 7 * 130, 130);
    sum_rows_case(rng, 1, 5);
    sum_rows_case(rng, 1000, 3);
    sum_rows_case(rng, 1100, 40);
    sum_rows_case(rng, 3, 700);
    permute_case(rng, {2, 3, 4, 5}, {0, 2, 1, 3});
    permute_case(rng, {2, 8, 3, 2, 16}, {2, 0, 3, 1, 4});
    permute_case(rng, {2, 3, 1, 4, 5, 3}, {5, 4, 3, 2, 1, 0});
    permute_case(rng, {7}, {0});
    return;
  }
  Rng rng(2);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    elementwise_cases(rng, n, false);
    elementwise_cases(rng, n, true);
  }
  broadcast_case(rng, 1000, 1000);
  broadcast_case(rng, 4096 * 3, 3);
  broadcast_case(rng, 256 * 512, 512);
  broadcast_case(rng, 7 * 130, 130);
  sum_rows_case(rng, 1, 5);
  sum_rows_case(rng, 1000, 3);
  sum_rows_case(rng, 256, 2048);
  sum_rows_case(rng, 256, 30000);
  sum_rows_case(rng, 70000, 33);
  sum_rows_case(rng, 3, 70000);
  permute_case(rng, {2, 3, 4, 5}, {0, 2, 1, 3});
  permute_case(rng, {2, 128, 8, 64}, {0, 2, 1, 3});
  permute_case(rng, {2, 128, 3, 8, 64}, {2, 0, 3, 1, 4});
  permute_case(rng, {2, 3, 1, 4, 5, 3}, {5, 4, 3, 2, 1, 0});
  permute_case(rng, {7}, {0});
}

TEST_CASE("16-bit elementwise, unary, dropout, reductions") {
  use_gpu();
  const std::vector<int64_t> sizes = kEmulated ? std::vector<int64_t>{1, 7, 1000, 4099}
                                               : std::vector<int64_t>{1, 7, 1000, (1 << 20) + 3};
  Rng rng(40);
  for (int64_t n : sizes) {
    for (bool misalign : {false, true}) {
      half_elementwise_cases<bfloat16>(rng, n, misalign);
      half_elementwise_cases<float16>(rng, n, misalign);
    }
  }
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      kEmulated ? std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {1100, 40}, {3, 700}, {2, 1500}}
                : std::vector<std::pair<int64_t, int64_t>>{
                      {1, 5}, {256, 2048}, {70000, 33}, {3, 70000}, {64, 1000}};
  for (const auto& [rows, cols] : shapes) {
    half_reduction_cases<bfloat16>(rng, rows, cols);
    half_reduction_cases<float16>(rng, rows, cols);
  }
  half_copy_cases<bfloat16>(rng);
  half_copy_cases<float16>(rng);
}

TEST_CASE("16-bit gemm") {
  use_gpu();
  Rng rng(41);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      half_gemm_case<bfloat16>(rng, ta, tb, 17, 33, 9, 0.5f, 1.0f, 1);
      half_gemm_case<float16>(rng, ta, tb, 30, 67, 20, 1.0f, -0.5f, 1);
      half_gemm_case<bfloat16>(rng, ta, tb, 5, 33, 17, 1.0f, 0.0f, 3);
      half_gemm_case<float16>(rng, ta, tb, 5, 33, 17, 1.0f, 0.0f, 3);
    }
  }
  if (!kEmulated) {
    half_gemm_case<bfloat16>(rng, false, true, 256, 2048, 512, 1.0f, 0.0f, 1);
    half_gemm_case<float16>(rng, true, false, 512, 2048, 256, 1.0f, 1.0f, 1);
    half_gemm_case<bfloat16>(rng, false, true, 128, 128, 64, 1.0f, 0.0f, 16);
  }
  half_gemm_case<bfloat16>(rng, false, false, 0, 5, 3, 1.0f, 0.0f, 1);  // empty
}

TEST_CASE("16-bit norms, batchnorm, embedding, pooling, upsampling") {
  use_gpu();
  Rng rng(42);
  const std::vector<std::pair<int64_t, int64_t>> norms =
      // Layer norm's warp path takes rows of N % 8 == 0 up to 1024 (64, 512, 768, 1000, 1024),
      // its block path the others.
      kEmulated ? std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {17, 64}, {2, 1500}, {9, 1024}}
                : std::vector<std::pair<int64_t, int64_t>>{{3, 5},    {256, 512}, {300, 1000},
                                                           {4, 3000}, {600, 768}, {2048, 1024}};
  for (const auto& [M, N] : norms) {
    half_norm_cases<bfloat16>(rng, M, N);
    half_norm_cases<float16>(rng, M, N);
  }
  half_embedding_case<bfloat16>(rng, kEmulated ? 40 : 4096, 17, kEmulated ? 24 : 512);
  half_embedding_case<float16>(rng, kEmulated ? 40 : 4096, 17, kEmulated ? 24 : 512);
  half_batchnorm_case<bfloat16>(rng, 2, 3, 25);
  half_batchnorm_case<float16>(rng, 2, 4, kEmulated ? 2100 : 4100);
  if (!kEmulated) half_batchnorm_case<bfloat16>(rng, 8, 64, 56 * 56);
  half_pool_case<bfloat16>(rng, make_pool_shape(1, 3, 7, 9, 3, 3, 1, 1, 1, 1));
  half_pool_case<float16>(rng, make_pool_shape(2, 2, 9, 8, 2, 2, 2, 2, 0, 0));
  if (!kEmulated) half_pool_case<bfloat16>(rng, make_pool_shape(2, 64, 112, 112, 3, 3, 2, 2, 1, 1));
  half_upsample_case<bfloat16>(rng, 3, 5, 7);
  half_upsample_case<float16>(rng, kEmulated ? 2 : 64, kEmulated ? 8 : 32, kEmulated ? 6 : 32);
}

#if REGEN_HAVE_CPU_CONV2D
TEST_CASE("conv2d native") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    {
      Rng rng(5);
      for (const ConvShape& s : remat_resnet_convs())
        conv_case(rng, s, false, cuda::ConvAlgo::native);
    }
    {
      Rng rng(3);
      for (const ConvShape& s : odd_convs()) {
        conv_case(rng, s, false, cuda::ConvAlgo::native);
        conv_case(rng, s, true, cuda::ConvAlgo::native);
      }
      conv_case(rng, make_conv_shape(1, 16, 10, 10, 32, 3, 3, 1, 1, 1, 1), false,
                cuda::ConvAlgo::native);
      conv_case(rng, make_conv_shape(1, 16, 10, 10, 32, 3, 3, 2, 2, 1, 1), false,
                cuda::ConvAlgo::native);
      conv_case(rng, make_conv_shape(2, 8, 9, 9, 16, 1, 1, 2, 2, 0, 0), true,
                cuda::ConvAlgo::native);
      conv_case(rng, make_conv_shape(1, 3, 20, 20, 16, 7, 7, 2, 2, 3, 3), false,
                cuda::ConvAlgo::native);
      conv_case(rng, make_conv_shape(1, 64, 4, 4, 16, 3, 3, 1, 1, 1, 1), true,
                cuda::ConvAlgo::native);  // split-K fwd
      conv_case(rng, make_conv_shape(2, 4, 16, 16, 8, 3, 3, 1, 1, 1, 1), true,
                cuda::ConvAlgo::native);  // split-K wgrad
      conv_case(rng, make_conv_shape(1, 20, 12, 12, 70, 3, 3, 1, 1, 1, 1), false,
                cuda::ConvAlgo::native);
      conv_case(rng, make_conv_shape(8, 2, 64, 64, 4, 3, 3, 1, 1, 1, 1), true,
                cuda::ConvAlgo::native);  // 128 splits
    }
    return;
  }
  Rng rng(3);
  for (const ConvShape& s : odd_convs()) {
    conv_case(rng, s, false, cuda::ConvAlgo::native);
    conv_case(rng, s, true, cuda::ConvAlgo::native);
  }
  for (const ConvShape& s : resnet152_convs(2)) conv_case(rng, s, false, cuda::ConvAlgo::native);
  for (const ConvShape& s : remat_resnet_convs()) conv_case(rng, s, false, cuda::ConvAlgo::native);
}
#ifdef REGEN_WITH_CUDNN
TEST_CASE("conv2d cudnn") {
  use_gpu();
  Rng rng(4);
  for (const ConvShape& s : odd_convs()) conv_case(rng, s, true, cuda::ConvAlgo::cudnn);
  for (const ConvShape& s : resnet152_convs(2)) conv_case(rng, s, false, cuda::ConvAlgo::cudnn);
}
#endif
#endif

#if REGEN_HAVE_CPU_CONV2D
TEST_CASE("conv2d and conv_transpose2d 16-bit native") {
  use_gpu();
  Rng rng(16);
  for (const ConvShape& s : half_convs()) {
    half_conv_case<bfloat16>(rng, s, true, cuda::ConvAlgo::native);
    half_conv_case<float16>(rng, s, false, cuda::ConvAlgo::native);
  }
  half_conv_case<float16>(rng, half_convs()[1], true, cuda::ConvAlgo::native);
  for (const ConvShape& s : half_conv_transposes()) {
    half_conv_transpose_case<bfloat16>(rng, s, true, cuda::ConvAlgo::native);
    half_conv_transpose_case<float16>(rng, s, s.K > 8, cuda::ConvAlgo::native);
  }
  if (kEmulated) return;
  for (const ConvShape& s : remat_resnet_convs())
    half_conv_case<bfloat16>(rng, s, false, cuda::ConvAlgo::native);
  for (const ConvShape& s : resnet152_convs(2))
    half_conv_case<float16>(rng, s, false, cuda::ConvAlgo::native);
  for (const ConvShape& s : conv_transpose_shapes())
    half_conv_transpose_case<bfloat16>(rng, s, true, cuda::ConvAlgo::native);
}
#ifdef REGEN_WITH_CUDNN
// cuDNN's 16-bit convolutions (f32 compute) as the comparison path: a GPU only (not emulated).
TEST_CASE("conv2d and conv_transpose2d 16-bit cudnn") {
  use_gpu();
  if (kEmulated) return;
  Rng rng(17);
  for (const ConvShape& s : half_convs()) {
    half_conv_case<bfloat16>(rng, s, true, cuda::ConvAlgo::cudnn);
    half_conv_case<float16>(rng, s, true, cuda::ConvAlgo::cudnn);
  }
  for (const ConvShape& s : half_conv_transposes()) {
    half_conv_transpose_case<bfloat16>(rng, s, true, cuda::ConvAlgo::cudnn);
    half_conv_transpose_case<float16>(rng, s, true, cuda::ConvAlgo::cudnn);
  }
}
#endif

TEST_CASE("conv_transpose2d native") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(14);
    const ConvShape shapes[] = {
        make_conv_transpose_shape(2, 16, 4, 4, 8, 2, 2, 2, 2, 0, 0, 0, 0),
        make_conv_transpose_shape(1, 8, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1),
        make_conv_transpose_shape(1, 3, 7, 5, 5, 3, 3, 1, 1, 1, 1, 0, 0),
        make_conv_transpose_shape(2, 5, 4, 6, 7, 3, 2, 3, 2, 1, 0, 2, 1),
        make_conv_transpose_shape(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0),
    };
    for (const ConvShape& s : shapes) {
      conv_transpose_case(rng, s, false, cuda::ConvAlgo::native);
      conv_transpose_case(rng, s, true, cuda::ConvAlgo::native);
    }
    return;
  }
  Rng rng(14);
  for (const ConvShape& s : conv_transpose_shapes()) {
    conv_transpose_case(rng, s, false, cuda::ConvAlgo::native);
    conv_transpose_case(rng, s, true, cuda::ConvAlgo::native);
  }
}
#ifdef REGEN_WITH_CUDNN
TEST_CASE("conv_transpose2d cudnn") {
  use_gpu();
  Rng rng(15);
  for (const ConvShape& s : conv_transpose_shapes()) {
    conv_transpose_case(rng, s, true, cuda::ConvAlgo::cudnn);
  }
}
#endif
#endif

TEST_CASE("slice_copy") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(16);
    slice_case(rng, 2, 4, 16, 4, 0, 12, 4, false);  // float4 path
    slice_case(rng, 2, 4, 16, 4, 0, 12, 8, true);   // x unaligned: scalar path
    slice_case(rng, 3, 2, 5, 7, 4, 2, 0, false);
    slice_case(rng, 1, 3001, 1, 3700, 699, 3001, 0, false);
    slice_case(rng, 100, 1, 3, 4, 3, 2, 1, false);
    slice_case(rng, 4, 0, 7, 3, 1, 5, 2, false);
    return;
  }
  Rng rng(16);
  // concat of NCHW tensors along channels (U-Net skips): aligned rows, the float4 path.
  slice_case(rng, 2, 64, 32 * 32, 64, 0, 128, 64, false);
  slice_case(rng, 2, 64, 32 * 32, 64, 0, 128, 0, true);  // the same, x unaligned
  // split / narrow: rows out of the middle of x.
  slice_case(rng, 3, 2, 5, 7, 4, 2, 0, false);
  slice_case(rng, 1, 300001, 1, 370001, 70000, 300001, 0, false);  // one long row
  slice_case(rng, 1000, 1, 3, 4, 3, 2, 1, false);                  // many short rows
  slice_case(rng, 4, 0, 7, 3, 1, 5, 2, false);                     // nothing to copy
}

TEST_CASE("upsample2x") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(17);
    upsample_case(rng, 4, 9, 7);
    upsample_case(rng, 3, 7, 5);
    upsample_case(rng, 2, 1, 1);
    upsample_case(rng, 1, 1, 9);
    upsample_case(rng, 5, 6, 1);
    return;
  }
  Rng rng(17);
  upsample_case(rng, 2 * 64, 32, 32);  // a U-Net decoder level
  upsample_case(rng, 3, 7, 5);
  upsample_case(rng, 2, 1, 1);
  upsample_case(rng, 1, 1, 9);
  upsample_case(rng, 5, 6, 1);
}

#if REGEN_HAVE_CPU_BATCHNORM
TEST_CASE("batchnorm") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(5);
    batchnorm_case(rng, 2, 3, 5, true);
    batchnorm_case(rng, 1, 7, 1, true);
    batchnorm_case(rng, 2, 5, 300, true);
    batchnorm_case(rng, 3, 4, 2000, false);
    return;
  }
  Rng rng(5);
  batchnorm_case(rng, 2, 3, 5, true);
  batchnorm_case(rng, 1, 7, 1, true);  // one value per channel: the unbiased variance falls back
  batchnorm_case(rng, 2, 64, 112 * 112, true);
  batchnorm_case(rng, 2, 2048, 49, false);
  batchnorm_case(rng, 3, 17, 300, true);
}
#endif

#if REGEN_HAVE_CPU_POOL
TEST_CASE("pool") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(6);
    pool_case(rng, make_pool_shape(1, 4, 20, 20, 3, 3, 2, 2, 1, 1));
    pool_case(rng, make_pool_shape(1, 3, 7, 9, 3, 3, 1, 1, 1, 1));
    pool_case(rng, make_pool_shape(2, 2, 9, 8, 2, 2, 2, 2, 0, 0));
    pool_case(rng, make_pool_shape(1, 4, 10, 7, 4, 3, 3, 2, 2, 1));
    global_pool_case(rng, 40, 49);
    global_pool_case(rng, 5, 1);
    global_pool_case(rng, 3, 1000);
    return;
  }
  Rng rng(6);
  pool_case(rng, make_pool_shape(2, 64, 112, 112, 3, 3, 2, 2, 1, 1));  // ResNet stem max pool
  pool_case(rng, make_pool_shape(1, 3, 7, 9, 3, 3, 1, 1, 1, 1));
  pool_case(rng, make_pool_shape(2, 2, 9, 8, 2, 2, 2, 2, 0, 0));
  pool_case(rng, make_pool_shape(1, 4, 10, 7, 4, 3, 3, 2, 2, 1));
  global_pool_case(rng, 2 * 2048, 49);
  global_pool_case(rng, 5, 1);
  global_pool_case(rng, 3, 1000);
}
#endif

#if REGEN_HAVE_CPU_EMBEDDING
TEST_CASE("embedding") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(7);
    embedding_case(rng, 300, 50, 70);
    embedding_case(rng, 7, 5, 3);
    embedding_case(rng, 100, 3, 130);
    embedding_case(rng, 700, 1, 33, embedding_ids(rng, {700}));
    embedding_case(rng, 905, 3, 70, embedding_ids(rng, {300, 600, 5}));
    embedding_case(rng, 600, 4, 5, embedding_ids(rng, {256, 257, 0, 87}));
    const std::vector<float> w(5 * 4, 1.0f), dy(3 * 4, 1.0f);
    const std::vector<int64_t> ids{0, 5, 2};
    DeviceArray<float> dw(w), ddy(dy), y(12), dweight(20);
    DeviceArray<int64_t> dids(ids);
    CHECK_THROWS_AS(cuda::embedding_forward(dw.ptr(), dids.ptr(), y.ptr(), 3, 5, 4), regen::Error);
    CHECK_THROWS_AS(cuda::embedding_backward(ddy.ptr(), dids.ptr(), dweight.ptr(), 3, 5, 4),
                    regen::Error);
    return;
  }
  Rng rng(7);
  embedding_case(rng, 2 * 128, 30000, 512);
  embedding_case(rng, 7, 5, 3);
  embedding_case(rng, 1000, 3, 130);
  // Long runs: one id over 2.7 chunks; a long run's short last chunk and the next long run's
  // first chunk in one window of the sorted array; a padding id at a third of the tokens of a
  // seed-sized batch (32768 tokens), the case the chunks are for.
  embedding_case(rng, 700, 1, 33, embedding_ids(rng, {700}));
  embedding_case(rng, 905, 3, 70, embedding_ids(rng, {300, 600, 5}));
  embedding_case(rng, 32768, 30000, 512, [&] {
    auto ids = rng.ints(32768, 0, 29999);
    for (size_t i = 0; i < ids.size(); i += 3) ids[i] = 0;
    return ids;
  }());
  // Out-of-range ids are regen::Errors, not crashes.
  const std::vector<float> w(5 * 4, 1.0f), dy(3 * 4, 1.0f);
  const std::vector<int64_t> ids{0, 5, 2};
  DeviceArray<float> dw(w), ddy(dy), y(12), dweight(20);
  DeviceArray<int64_t> dids(ids);
  CHECK_THROWS_AS(cuda::embedding_forward(dw.ptr(), dids.ptr(), y.ptr(), 3, 5, 4), regen::Error);
  CHECK_THROWS_AS(cuda::embedding_backward(ddy.ptr(), dids.ptr(), dweight.ptr(), 3, 5, 4),
                  regen::Error);
}
#endif

#if REGEN_HAVE_CPU_LAYERNORM
TEST_CASE("layernorm") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(8);
    layernorm_case(rng, 5, 7, true, false);
    layernorm_case(rng, 33, 512, true, false);
    layernorm_case(rng, 9, 768, true, false);
    layernorm_case(rng, 3, 2048, true, false);
    layernorm_case(rng, 17, 512, false, false);
    layernorm_case(rng, 9, 512, true, true);
    layernorm_case(rng, 300, 64, true, false);
    // Enough blocks of partial sums (79) for the column sums' four-at-a-time loop and its tail.
    layernorm_case(rng, 2500, 64, true, false);
    return;
  }
  Rng rng(8);
  layernorm_case(rng, 2 * 128, 512, true, false);  // Transformer d_model 512
  layernorm_case(rng, 2 * 128, 768, true, false);  // bert-base
  layernorm_case(rng, 3000, 512, true, false);     // many blocks of partial sums
  layernorm_case(rng, 5, 7, true, false);          // general path
  layernorm_case(rng, 3, 2048, true, false);       // longer rows than the warp path
  layernorm_case(rng, 17, 512, false, false);      // no gamma / beta
  layernorm_case(rng, 9, 512, true, true);         // unaligned: general path
}
#endif

#if REGEN_HAVE_CPU_SOFTMAX
TEST_CASE("softmax") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(9);
    softmax_case(rng, 3, 1);
    softmax_case(rng, 17, 100);
    softmax_case(rng, 5, 1000);
    softmax_case(rng, 2, 3000);
    return;
  }
  Rng rng(9);
  softmax_case(rng, 3, 1);
  softmax_case(rng, 17, 100);
  softmax_case(rng, 256, 128);
  softmax_case(rng, 64, 1000);
  softmax_case(rng, 4, 30000);
}
#endif

#if REGEN_HAVE_CPU_CROSS_ENTROPY
TEST_CASE("cross_entropy") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(10);
    cross_entropy_case(rng, 5, 3, 0);
    cross_entropy_case(rng, 4, 7, 1);
    cross_entropy_case(rng, 33, 100, 5);
    cross_entropy_case(rng, 3, 2000, 2);
    const std::vector<float> logits(2 * 3, 0.5f), dloss{1.0f}, lse(2, 0.0f);
    const std::vector<int64_t> targets{1, 3};
    DeviceArray<float> dl(logits), dd(dloss), dlse(lse), loss(1), lse_out(2), dg(6);
    DeviceArray<int64_t> dt(targets);
    CHECK_THROWS_AS(
        cuda::cross_entropy_forward(dl.ptr(), dt.ptr(), loss.ptr(), lse_out.ptr(), 2, 3, -100),
        regen::Error);
    CHECK_THROWS_AS(cuda::cross_entropy_backward(dd.ptr(), dl.ptr(), dt.ptr(), dlse.ptr(), dg.ptr(),
                                                 2, 3, -100),
                    regen::Error);
    return;
  }
  Rng rng(10);
  cross_entropy_case(rng, 2 * 128, 30000, 5);
  cross_entropy_case(rng, 5, 3, 0);
  cross_entropy_case(rng, 4, 7, 1);  // every row ignored: loss 0
  const std::vector<float> logits(2 * 3, 0.5f), dloss{1.0f}, lse(2, 0.0f);
  const std::vector<int64_t> targets{1, 3};
  DeviceArray<float> dl(logits), dd(dloss), dlse(lse), loss(1), lse_out(2), dg(6);
  DeviceArray<int64_t> dt(targets);
  CHECK_THROWS_AS(
      cuda::cross_entropy_forward(dl.ptr(), dt.ptr(), loss.ptr(), lse_out.ptr(), 2, 3, -100),
      regen::Error);
  CHECK_THROWS_AS(
      cuda::cross_entropy_backward(dd.ptr(), dl.ptr(), dt.ptr(), dlse.ptr(), dg.ptr(), 2, 3, -100),
      regen::Error);
}
#endif

#if REGEN_HAVE_CPU_CROSS_ENTROPY
TEST_CASE("linear_cross_entropy") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(13);
    linear_cross_entropy_case(rng, 5, 3, 0, true);
    linear_cross_entropy_case(rng, 7, 300, 3, true);
    linear_cross_entropy_case(rng, 9, 1000, 0, false);
    linear_cross_entropy_case(rng, 1, 7, 0, true);
    linear_cross_entropy_case(rng, 4, 7, 1, true);  // every row ignored
    linear_cross_entropy_errors();
    half_linear_cross_entropy_case<bfloat16>(rng, 6, 37, 12, 10, 17, true);
    half_linear_cross_entropy_case<float16>(rng, 5, 300, 20, 0, 300, false);
    return;
  }
  Rng rng(13);
  half_linear_cross_entropy_case<bfloat16>(rng, 64, 3000, 256, 1000, 1500, true);
  half_linear_cross_entropy_case<float16>(rng, 33, 501, 64, 0, 501, false);
  // The seed Transformer's automatic chunk (256 rows of 30000 classes) and odd shapes.
  linear_cross_entropy_case(rng, 256, 30000, 5, true);
  linear_cross_entropy_case(rng, 187, 30000, 0, false);
  linear_cross_entropy_case(rng, 1, 7, 0, true);
  linear_cross_entropy_case(rng, 4, 7, 1, true);  // every row ignored: loss 0, scale 0
  linear_cross_entropy_errors();
}
#endif

#if REGEN_HAVE_CPU_ATTENTION
TEST_CASE("16-bit attention") {
  use_gpu();
  Rng rng(43);
  half_attention_case<bfloat16>(rng, attn(1, 77, 3, 5, true, 0.0f), true);
  half_attention_case<float16>(rng, attn(2, 70, 2, 64, false, 0.2f), true);
  half_attention_case<bfloat16>(rng, attn(1, 66, 1, 96, false, 0.0f), false);
  if (!kEmulated) {
    half_attention_case<bfloat16>(rng, attn(2, 128, 8, 64, true, 0.1f), true);
    half_attention_case<float16>(rng, attn(2, 130, 2, 96, false, 0.0f), false);
  }
}

TEST_CASE("attention") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(11);
    attention_case(rng, attn(1, 77, 3, 5, true, 0.0f), true);
    attention_case(rng, attn(2, 70, 2, 64, false, 0.2f), true);
    attention_case(rng, attn(2, 128, 1, 64, true, 0.1f), true);
    attention_case(rng, attn(1, 64, 1, 128, true, 0.0f), false);
    attention_case(rng, attn(1, 66, 1, 96, false, 0.3f), false);
    attention_case(rng, attn(3, 1, 2, 16, false, 0.0f), false);
    attention_case(rng, attn(1, 40, 1, 8, false, 1.0f), false);
    return;
  }
  Rng rng(11);
  // Transformer shapes: d_model 512 = 8 heads x 64, seq 128.
  attention_case(rng, attn(2, 128, 8, 64, false, 0.0f), false);
  attention_case(rng, attn(2, 128, 8, 64, true, 0.0f), false);
  attention_case(rng, attn(2, 128, 8, 64, false, 0.1f), true);
  attention_case(rng, attn(2, 128, 8, 64, true, 0.1f), true);  // row 0 of batch 0 sees no key
  // Odd sizes: partial tiles, head dims that are not multiples of 4, the 128 path.
  attention_case(rng, attn(1, 77, 3, 5, true, 0.0f), true);
  attention_case(rng, attn(2, 130, 2, 96, false, 0.2f), true);
  attention_case(rng, attn(1, 64, 1, 128, true, 0.0f), false);
  attention_case(rng, attn(3, 1, 2, 16, false, 0.0f), false);
  attention_case(rng, attn(1, 200, 2, 64, false, 1.0f), false);  // everything dropped
}
#endif

#if REGEN_HAVE_CPU_OPTIM
TEST_CASE("optim") {
  use_gpu();
  if (kEmulated) {  // scripts/cuda-emu: shapes an emulator finishes in minutes
    Rng rng(12);
    optim_cases(rng, 1);
    optim_cases(rng, 1003);
    return;
  }
  Rng rng(12);
  optim_cases(rng, 1);
  optim_cases(rng, 100003);
}
#endif

// ---- fill_, full and ones on CUDA (core/cuda/fill.cu) -----------------------------------------

namespace {

// The bytes of a tensor, copied to the host.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  const auto* p = static_cast<const unsigned char*>(host.raw_data());
  return std::vector<unsigned char>(p, p + host.nbytes());
}

// The first element's bits, as an unsigned integer of the element's width.
uint64_t first_bits(const Tensor& t) {
  const std::vector<unsigned char> b = bytes_of(t);
  uint64_t bits = 0;
  std::memcpy(&bits, b.data(), dtype_size(t.dtype()));
  return bits;
}

}  // namespace

TEST_CASE("cuda fill: full, ones and fill_ give the host fill's bits for every dtype") {
  use_gpu();
  const Device gpu = Device::cuda(0);
  // 1 element, a partial block, several blocks; on a GPU also more than the grid's cap of blocks
  // (the grid-stride loop).
  std::vector<int64_t> sizes = {1, 37, 1000};
  if (!kEmulated) sizes.push_back(3'000'001);
  const std::vector<double> float_values = {1.0, 0.1, -0.0, 1e30, -2.5, 65519.0, 1e-8, 3.0e38};
  const std::vector<double> int_values = {1.0, 0.1, -0.0, -2.5, 3.7, 2e9, -7.0};
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16}) {
    const std::vector<double>& values = is_floating(dt) ? float_values : int_values;
    for (int64_t n : sizes) {
      for (double v : values) {
        INFO(dtype_name(dt) << " n=" << n << " value=" << v);
        const Tensor host = full({n}, v, dt, Device::cpu());
        const MemoryStats cpu_before = allocator_for(Device::cpu()).stats();
        const Tensor dev = full({n}, v, dt, gpu);
        // No host staging tensor: the CPU allocator served nothing for the device's fill.
        CHECK(allocator_for(Device::cpu()).stats().num_allocs == cpu_before.num_allocs);
        CHECK(bytes_of(dev) == bytes_of(host));
        // fill_ over a tensor that holds another value, then a zero fill (the memset).
        Tensor filled = full({n}, 7.0, dt, gpu);
        fill_(filled, v);
        CHECK(bytes_of(filled) == bytes_of(host));
        fill_(filled, 0.0);
        CHECK(bytes_of(filled) == bytes_of(zeros({n}, dt, Device::cpu())));
      }
    }
  }
  // The bits themselves, for the values that round or overflow.
  CHECK(first_bits(full({3}, 0.1, DType::bf16, gpu)) == 0x3DCDu);
  CHECK(first_bits(full({3}, 0.1, DType::f16, gpu)) == 0x2E66u);
  CHECK(first_bits(full({3}, 1e30, DType::f16, gpu)) == 0x7C00u);   // +inf
  CHECK(first_bits(full({3}, -1e30, DType::f16, gpu)) == 0xFC00u);  // -inf
  CHECK(first_bits(full({3}, -0.0, DType::bf16, gpu)) == 0x8000u);
  CHECK(first_bits(full({3}, -0.0, DType::f16, gpu)) == 0x8000u);
  CHECK(first_bits(full({3}, -0.0, DType::f32, gpu)) == 0x80000000u);
  CHECK(first_bits(full({3}, -0.0, DType::f64, gpu)) == 0x8000000000000000u);
  CHECK(first_bits(full({3}, 0.1, DType::f32, gpu)) == 0x3DCCCCCDu);
  CHECK(first_bits(full({3}, 0.1, DType::f64, gpu)) == 0x3FB999999999999Au);
  CHECK(first_bits(full({3}, -7.0, DType::i32, gpu)) == 0xFFFFFFF9u);
  CHECK(first_bits(full({3}, -7.0, DType::i64, gpu)) == 0xFFFFFFFFFFFFFFF9u);
  CHECK(first_bits(ones({5}, DType::bf16, gpu)) == 0x3F80u);
  CHECK(first_bits(ones({5}, DType::f16, gpu)) == 0x3C00u);
  // An empty tensor: nothing to fill, no launch.
  CHECK(full({0}, 2.0, DType::f32, gpu).numel() == 0);
}
