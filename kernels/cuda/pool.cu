// CUDA pooling (declared in kernels/cuda/cuda_kernels.h; CPU reference kernels/cpu/pool.cpp; test
// tests/cuda/test_cuda_ops.cpp).
//
// Forward kernels: one thread per output element. Backward kernels gather: one thread per input
// element visits the outputs whose windows cover it, in increasing (p, q) order, so no atomics
// are needed and the sum order equals the CPU's scatter order (maxpool backward is bit-identical
// to the CPU; avgpool backward too unless the host compiler contracts dy * inv + acc).
// The packed forms keep each argmax as its position in the window (shapes.h pool_code_bits).
// maxpool: padding never competes, the first maximum in row-major window order wins ties, a NaN
// once seen is kept; argmax is the index into the (H, W) plane. avgpool: count_include_pad (the
// divisor is always kh*kw).
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 256;

struct PoolParams {
  int64_t planes;  // N*C
  int H, W, P, Q, kh, kw, sh, sw, ph, pw;
};

PoolParams params(const char* name, const PoolShape& s) {
  REGEN_CHECK(s.N >= 0 && s.C >= 0 && s.H > 0 && s.W > 0 && s.P > 0 && s.Q > 0, name,
              ": bad shape N=", s.N, " C=", s.C, " H=", s.H, " W=", s.W, " P=", s.P, " Q=", s.Q);
  REGEN_CHECK(s.H * s.W <= 0x7fffffff && s.P * s.Q <= 0x7fffffff, name, ": planes of ", s.H, "x",
              s.W, " are too large");
  return {s.N * s.C,
          static_cast<int>(s.H),
          static_cast<int>(s.W),
          static_cast<int>(s.P),
          static_cast<int>(s.Q),
          static_cast<int>(s.kh),
          static_cast<int>(s.kw),
          static_cast<int>(s.stride_h),
          static_cast<int>(s.stride_w),
          static_cast<int>(s.pad_h),
          static_cast<int>(s.pad_w)};
}

// Input rows [lo, hi) covered by output row p (padding excluded).
__device__ __forceinline__ void window(int p, int stride, int pad, int k, int extent, int& lo,
                                       int& hi) {
  const int start = p * stride - pad;
  lo = start > 0 ? start : 0;
  hi = start + k < extent ? start + k : extent;
}
// Output rows [lo, hi) whose window covers input row h.
__device__ __forceinline__ void covering(int h, int stride, int pad, int k, int out_extent, int& lo,
                                         int& hi) {
  lo = h + pad < k ? 0 : (h + pad - k) / stride + 1;
  const int last = (h + pad) / stride + 1;
  hi = last < out_extent ? last : out_extent;
}

// x: (planes, H, W) -> y, argmax: (planes, P, Q)
template <class T>
__global__ void maxpool_forward_kernel(const T* x, T* y, int32_t* argmax, PoolParams s) {
  const int64_t total = s.planes * s.P * s.Q;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / (static_cast<int64_t>(s.P) * s.Q);
    const int pq = static_cast<int>(i - plane * s.P * s.Q);
    const int p = pq / s.Q, q = pq - p * s.Q;
    int h0, h1, w0, w1;
    window(p, s.sh, s.ph, s.kh, s.H, h0, h1);
    window(q, s.sw, s.pw, s.kw, s.W, w0, w1);
    const T* in = x + plane * s.H * s.W;
    int best_at = h0 * s.W + w0;
    float best = static_cast<float>(in[best_at]);
    for (int h = h0; h < h1; ++h) {
      for (int w = w0; w < w1; ++w) {
        const float v = static_cast<float>(in[h * s.W + w]);
        if (v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_at = h * s.W + w;
        }
      }
    }
    y[i] = T(best);  // a value of x: exact
    argmax[i] = best_at;
  }
}

// dy, argmax: (planes, P, Q) -> dx: (planes, H, W), gathered.
template <class T>
__global__ void maxpool_backward_kernel(const T* dy, const int32_t* argmax, T* dx, PoolParams s) {
  const int64_t total = s.planes * s.H * s.W;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / (static_cast<int64_t>(s.H) * s.W);
    const int hw = static_cast<int>(i - plane * s.H * s.W);
    const int h = hw / s.W, w = hw - h * s.W;
    int p0, p1, q0, q1;
    covering(h, s.sh, s.ph, s.kh, s.P, p0, p1);
    covering(w, s.sw, s.pw, s.kw, s.Q, q0, q1);
    const int64_t base = plane * s.P * s.Q;
    float acc = 0.0f;
    for (int p = p0; p < p1; ++p) {
      for (int q = q0; q < q1; ++q) {
        const int64_t o = base + p * s.Q + q;
        if (argmax[o] == hw) acc += static_cast<float>(dy[o]);
      }
    }
    dx[i] = T(acc);
  }
}

// The packed argmax (shapes.h pool_code_bits): one thread per code word, i.e. per `per_word`
// consecutive outputs of a plane, each computed as maxpool_forward_kernel computes it.
// x: (planes, H, W) -> y: (planes, P, Q), codes: (planes, words)
template <class T>
__global__ void maxpool_forward_packed_kernel(const T* x, T* y, uint32_t* codes, PoolParams s,
                                              int bits, int per_word, int words) {
  const int64_t total = s.planes * words;
  const int pq_total = s.P * s.Q;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / words;
    const int wd = static_cast<int>(i - plane * words);
    const T* in = x + plane * s.H * s.W;
    uint32_t word = 0;
    for (int e = 0; e < per_word; ++e) {
      const int pq = wd * per_word + e;
      if (pq >= pq_total) break;
      const int p = pq / s.Q, q = pq - p * s.Q;
      int h0, h1, w0, w1;
      window(p, s.sh, s.ph, s.kh, s.H, h0, h1);
      window(q, s.sw, s.pw, s.kw, s.W, w0, w1);
      int best_h = h0, best_w = w0;
      float best = static_cast<float>(in[h0 * s.W + w0]);
      for (int h = h0; h < h1; ++h) {
        for (int w = w0; w < w1; ++w) {
          const float v = static_cast<float>(in[h * s.W + w]);
          if (v > best || (isnan(v) && !isnan(best))) {
            best = v;
            best_h = h;
            best_w = w;
          }
        }
      }
      y[plane * pq_total + pq] = T(best);
      const uint32_t code =
          static_cast<uint32_t>((best_h - (p * s.sh - s.ph)) * s.kw + (best_w - (q * s.sw - s.pw)));
      word |= code << (e * bits);
    }
    codes[i] = word;
  }
}

// dy: (planes, P, Q), codes: (planes, words) -> dx: (planes, H, W), gathered in increasing
// (p, q) order like maxpool_backward_kernel.
template <class T>
__global__ void maxpool_backward_packed_kernel(const T* dy, const uint32_t* codes, T* dx,
                                               PoolParams s, int bits, int per_word, int words) {
  const int64_t total = s.planes * s.H * s.W;
  const uint32_t field = bits == 32 ? 0xffffffffu : (1u << bits) - 1u;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / (static_cast<int64_t>(s.H) * s.W);
    const int hw = static_cast<int>(i - plane * s.H * s.W);
    const int h = hw / s.W, w = hw - h * s.W;
    int p0, p1, q0, q1;
    covering(h, s.sh, s.ph, s.kh, s.P, p0, p1);
    covering(w, s.sw, s.pw, s.kw, s.Q, q0, q1);
    const int64_t base = plane * s.P * s.Q;
    const uint32_t* plane_codes = codes + plane * words;
    float acc = 0.0f;
    for (int p = p0; p < p1; ++p) {
      for (int q = q0; q < q1; ++q) {
        const int pq = p * s.Q + q;
        const uint32_t code = (plane_codes[pq / per_word] >> ((pq % per_word) * bits)) & field;
        const int at = (h - (p * s.sh - s.ph)) * s.kw + (w - (q * s.sw - s.pw));
        if (code == static_cast<uint32_t>(at)) acc += static_cast<float>(dy[base + pq]);
      }
    }
    dx[i] = T(acc);
  }
}

// x: (planes, H, W) -> y: (planes, P, Q); the window sum in double, times 1/(kh*kw).
template <class T>
__global__ void avgpool_forward_kernel(const T* x, T* y, PoolParams s, double inv) {
  const int64_t total = s.planes * s.P * s.Q;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / (static_cast<int64_t>(s.P) * s.Q);
    const int pq = static_cast<int>(i - plane * s.P * s.Q);
    const int p = pq / s.Q, q = pq - p * s.Q;
    int h0, h1, w0, w1;
    window(p, s.sh, s.ph, s.kh, s.H, h0, h1);
    window(q, s.sw, s.pw, s.kw, s.W, w0, w1);
    const T* in = x + plane * s.H * s.W;
    double acc = 0.0;
    for (int h = h0; h < h1; ++h) {
      for (int w = w0; w < w1; ++w) acc += static_cast<double>(static_cast<float>(in[h * s.W + w]));
    }
    y[i] = T(static_cast<float>(__dmul_rn(acc, inv)));
  }
}

// dy: (planes, P, Q) -> dx: (planes, H, W), gathered: dx = sum over covering windows of dy * inv.
template <class T>
__global__ void avgpool_backward_kernel(const T* dy, T* dx, PoolParams s, float inv) {
  const int64_t total = s.planes * s.H * s.W;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const int64_t plane = i / (static_cast<int64_t>(s.H) * s.W);
    const int hw = static_cast<int>(i - plane * s.H * s.W);
    const int h = hw / s.W, w = hw - h * s.W;
    int p0, p1, q0, q1;
    covering(h, s.sh, s.ph, s.kh, s.P, p0, p1);
    covering(w, s.sw, s.pw, s.kw, s.Q, q0, q1);
    const int64_t base = plane * s.P * s.Q;
    float acc = 0.0f;
    for (int p = p0; p < p1; ++p) {
      for (int q = q0; q < q1; ++q) {
        acc = __fadd_rn(acc, __fmul_rn(static_cast<float>(dy[base + p * s.Q + q]), inv));
      }
    }
    dx[i] = T(acc);
  }
}

// x: (NC, HW) -> y: (NC); one warp per row, double sums.
template <class T>
__global__ void global_avgpool_forward_kernel(const T* x, T* y, int64_t NC, int64_t HW) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (row >= NC) return;
  const T* in = x + row * HW;
  double acc = 0.0;
  for (int64_t j = lane; j < HW; j += 32) acc += static_cast<double>(static_cast<float>(in[j]));
  acc = dev::warp_sum(acc);
  if (lane == 0) y[row] = T(static_cast<float>(HW > 0 ? acc / static_cast<double>(HW) : 0.0));
}

// dy: (NC) -> dx: (NC, HW), dx = dy / HW
template <class T>
__global__ void global_avgpool_backward_kernel(const T* dy, T* dx, int64_t NC, int64_t HW,
                                               double inv) {
  const int64_t total = NC * HW;
  for (int64_t i = dev::global_thread(); i < total; i += dev::grid_stride()) {
    const double g = static_cast<double>(static_cast<float>(dy[i / HW]));
    dx[i] = T(static_cast<float>(__dmul_rn(g, inv)));
  }
}

}  // namespace

template <class T>
void maxpool2d_forward(const T* x, T* y, int32_t* argmax, const PoolShape& s) {
  const PoolParams p = params("maxpool2d_forward", s);
  const int64_t total = p.planes * p.P * p.Q;
  if (total == 0) return;
  maxpool_forward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(x, y, argmax, p);
  REGEN_CUDA_LAUNCH_CHECK("maxpool2d_forward");
}

template <class T>
void maxpool2d_backward(const T* dy, const int32_t* argmax, T* dx, const PoolShape& s) {
  const PoolParams p = params("maxpool2d_backward", s);
  const int64_t total = p.planes * p.H * p.W;
  if (total == 0) return;
  maxpool_backward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(dy, argmax, dx, p);
  REGEN_CUDA_LAUNCH_CHECK("maxpool2d_backward");
}

template <class T>
void maxpool2d_forward_packed(const T* x, T* y, uint32_t* codes, const PoolShape& s) {
  const PoolParams p = params("maxpool2d_forward_packed", s);
  const int bits = pool_code_bits(s);
  const int64_t words = pool_code_words_per_plane(s);
  const int64_t total = p.planes * words;
  if (total == 0) return;
  maxpool_forward_packed_kernel<T><<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(
      x, y, codes, p, bits, 32 / bits, static_cast<int>(words));
  REGEN_CUDA_LAUNCH_CHECK("maxpool2d_forward_packed");
}

template <class T>
void maxpool2d_backward_packed(const T* dy, const uint32_t* codes, T* dx, const PoolShape& s) {
  const PoolParams p = params("maxpool2d_backward_packed", s);
  const int bits = pool_code_bits(s);
  const int64_t words = pool_code_words_per_plane(s);
  const int64_t total = p.planes * p.H * p.W;
  if (total == 0) return;
  maxpool_backward_packed_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(
          dy, codes, dx, p, bits, 32 / bits, static_cast<int>(words));
  REGEN_CUDA_LAUNCH_CHECK("maxpool2d_backward_packed");
}

template <class T>
void avgpool2d_forward(const T* x, T* y, const PoolShape& s) {
  const PoolParams p = params("avgpool2d_forward", s);
  const int64_t total = p.planes * p.P * p.Q;
  if (total == 0) return;
  const double inv = 1.0 / static_cast<double>(s.kh * s.kw);
  avgpool_forward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(x, y, p, inv);
  REGEN_CUDA_LAUNCH_CHECK("avgpool2d_forward");
}

template <class T>
void avgpool2d_backward(const T* dy, T* dx, const PoolShape& s) {
  const PoolParams p = params("avgpool2d_backward", s);
  const int64_t total = p.planes * p.H * p.W;
  if (total == 0) return;
  const float inv = static_cast<float>(1.0 / static_cast<double>(s.kh * s.kw));
  avgpool_backward_kernel<T>
      <<<detail::grid_blocks(total, kThreads), kThreads, 0, stream()>>>(dy, dx, p, inv);
  REGEN_CUDA_LAUNCH_CHECK("avgpool2d_backward");
}

template <class T>
void global_avgpool_forward(const T* x, T* y, int64_t NC, int64_t HW) {
  REGEN_CHECK(NC >= 0 && HW >= 0, "global_avgpool_forward: negative shape (", NC, ", ", HW, ")");
  if (NC == 0) return;
  constexpr int kWarps = kThreads / 32;
  REGEN_CHECK(detail::ceil_div(NC, kWarps) <= 0x7fffffff, "global_avgpool_forward: ", NC,
              " rows are too many");
  global_avgpool_forward_kernel<T>
      <<<static_cast<unsigned>(detail::ceil_div(NC, kWarps)), kThreads, 0, stream()>>>(x, y, NC,
                                                                                       HW);
  REGEN_CUDA_LAUNCH_CHECK("global_avgpool_forward");
}

template <class T>
void global_avgpool_backward(const T* dy, T* dx, int64_t NC, int64_t HW) {
  REGEN_CHECK(NC >= 0 && HW >= 0, "global_avgpool_backward: negative shape (", NC, ", ", HW, ")");
  if (NC == 0 || HW == 0) return;
  const double inv = 1.0 / static_cast<double>(HW);
  global_avgpool_backward_kernel<T>
      <<<detail::grid_blocks(NC * HW, kThreads), kThreads, 0, stream()>>>(dy, dx, NC, HW, inv);
  REGEN_CUDA_LAUNCH_CHECK("global_avgpool_backward");
}

// The float launchers, and the 16-bit forms: maxima are copies (bit for bit); sums in f32 or double
// as the float kernels', rounded once.
#define REGEN_POOL(T)                                                                          \
  template void maxpool2d_forward<T>(const T*, T*, int32_t*, const PoolShape&);                \
  template void maxpool2d_backward<T>(const T*, const int32_t*, T*, const PoolShape&);         \
  template void maxpool2d_forward_packed<T>(const T*, T*, uint32_t*, const PoolShape&);        \
  template void maxpool2d_backward_packed<T>(const T*, const uint32_t*, T*, const PoolShape&); \
  template void avgpool2d_forward<T>(const T*, T*, const PoolShape&);                          \
  template void avgpool2d_backward<T>(const T*, T*, const PoolShape&);                         \
  template void global_avgpool_forward<T>(const T*, T*, int64_t, int64_t);                     \
  template void global_avgpool_backward<T>(const T*, T*, int64_t, int64_t);
REGEN_POOL(bfloat16)
REGEN_POOL(float16)
#undef REGEN_POOL
void maxpool2d_forward(const float* x, float* y, int32_t* argmax, const PoolShape& s) {
  maxpool2d_forward<float>(x, y, argmax, s);
}
void maxpool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s) {
  maxpool2d_backward<float>(dy, argmax, dx, s);
}
void maxpool2d_forward_packed(const float* x, float* y, uint32_t* codes, const PoolShape& s) {
  maxpool2d_forward_packed<float>(x, y, codes, s);
}
void maxpool2d_backward_packed(const float* dy, const uint32_t* codes, float* dx,
                               const PoolShape& s) {
  maxpool2d_backward_packed<float>(dy, codes, dx, s);
}
void avgpool2d_forward(const float* x, float* y, const PoolShape& s) {
  avgpool2d_forward<float>(x, y, s);
}
void avgpool2d_backward(const float* dy, float* dx, const PoolShape& s) {
  avgpool2d_backward<float>(dy, dx, s);
}
void global_avgpool_forward(const float* x, float* y, int64_t NC, int64_t HW) {
  global_avgpool_forward<float>(x, y, NC, HW);
}
void global_avgpool_backward(const float* dy, float* dx, int64_t NC, int64_t HW) {
  global_avgpool_backward<float>(dy, dx, NC, HW);
}

}  // namespace regen::cuda
