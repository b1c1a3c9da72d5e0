// CUDA element-wise kernels and reductions (declared in kernels/cuda/cuda_kernels.h; CPU reference
// kernels/cpu/elementwise.cpp; test tests/cuda/test_cuda_ops.cpp).
//
// Element-wise kernels are grid-stride loops, with float4 variants when every pointer is 16-byte
// aligned (the tail is finished by the scalar loop). In-place use (y == a, y == x) is allowed:
// each element is read before it is written by the same thread, and no pointer is __restrict__.
// Reductions have a fixed combination order that depends only on the shape:
//   sum_all  cub::DeviceReduce::TransformReduce into a double (CUB guarantees run-to-run
//            determinism on one GPU), then rounded to float, as the CPU sums in double;
//   sum_rows column sums in double: chunks of rows reduced in a fixed tree, then the chunks in
//            order (CUB has no strided segmented reduction, so this is a two-kernel scheme).
// Dropout uses the Philox stream of core/philox.h with the CPU's threshold and scale, so the
// output is bit-identical to the CPU's.
#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include "regen/core/cuda/graph.h"
#include "regen/core/half.h"
#include "regen/core/philox.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

using detail::grid_blocks;
constexpr int kThreads = 256;

// ---- Generic element-wise maps ------------------------------------------------------------------

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x) const { return alpha * x; }
};

// x, y: (n)
template <class Op>
__global__ void unary_kernel(const float* x, float* y, int64_t n, Op op) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = op(x[i]);
}
// x, y: (n4) float4 groups
template <class Op>
__global__ void unary_kernel4(const float4* x, float4* y, int64_t n4, Op op) {
  for (int64_t i = dev::global_thread(); i < n4; i += dev::grid_stride()) {
    const float4 v = x[i];
    y[i] = make_float4(op(v.x), op(v.y), op(v.z), op(v.w));
  }
}
// a, b, y: (n)
template <class Op>
__global__ void binary_kernel(const float* a, const float* b, float* y, int64_t n, Op op) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = op(a[i], b[i]);
}
template <class Op>
__global__ void binary_kernel4(const float4* a, const float4* b, float4* y, int64_t n4, Op op) {
  for (int64_t i = dev::global_thread(); i < n4; i += dev::grid_stride()) {
    const float4 u = a[i], v = b[i];
    y[i] = make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w));
  }
}
// a, y: (rows, nb) as (n), b: (nb) broadcast over rows. 2-D grid: y over row chunks, x over nb.
template <class Op>
__global__ void broadcast_kernel(const float* a, const float* b, float* y, int64_t rows, int64_t nb,
                                 Op op) {
  for (int64_t j = dev::global_thread(); j < nb; j += dev::grid_stride()) {
    const float bj = b[j];
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) y[r * nb + j] = op(a[r * nb + j], bj);
  }
}

// a, y: (n), b: (nb) with y[i] = op(a[i], b[i % nb]); for short rows (a 2-D grid would idle).
template <class Op>
__global__ void broadcast_flat_kernel(const float* a, const float* b, float* y, int64_t n,
                                      int64_t nb, Op op) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = op(a[i], b[i % nb]);
}

template <class Op>
void launch_unary(const char* name, const float* x, float* y, int64_t n, Op op) {
  REGEN_CHECK(n >= 0, name, ": negative size ", n);
  if (n == 0) return;
  int64_t done = 0;
  if (detail::aligned16(x) && detail::aligned16(y) && n >= 4) {
    const int64_t n4 = n / 4;
    unary_kernel4<Op><<<grid_blocks(n4, kThreads), kThreads, 0, stream()>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4, op);
    REGEN_CUDA_LAUNCH_CHECK(name);
    done = n4 * 4;
  }
  if (done < n) {
    unary_kernel<Op><<<grid_blocks(n - done, kThreads), kThreads, 0, stream()>>>(x + done, y + done,
                                                                                 n - done, op);
    REGEN_CUDA_LAUNCH_CHECK(name);
  }
}

template <class Op>
void launch_binary(const char* name, const float* a, const float* b, float* y, int64_t n, Op op) {
  REGEN_CHECK(n >= 0, name, ": negative size ", n);
  if (n == 0) return;
  int64_t done = 0;
  if (detail::aligned16(a) && detail::aligned16(b) && detail::aligned16(y) && n >= 4) {
    const int64_t n4 = n / 4;
    binary_kernel4<Op><<<grid_blocks(n4, kThreads), kThreads, 0, stream()>>>(
        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
        reinterpret_cast<float4*>(y), n4, op);
    REGEN_CUDA_LAUNCH_CHECK(name);
    done = n4 * 4;
  }
  if (done < n) {
    binary_kernel<Op><<<grid_blocks(n - done, kThreads), kThreads, 0, stream()>>>(
        a + done, b + done, y + done, n - done, op);
    REGEN_CUDA_LAUNCH_CHECK(name);
  }
}

template <class Op>
void launch_broadcast(const char* name, const float* a, const float* b, float* y, int64_t n,
                      int64_t nb, Op op) {
  REGEN_CHECK(n >= 0 && nb > 0 && n % nb == 0, name, ": ", nb, " broadcast elements do not divide ",
              n);
  if (n == 0) return;
  if (nb == n) return launch_binary(name, a, b, y, n, op);
  const int64_t rows = n / nb;
  if (nb < 128) {
    broadcast_flat_kernel<Op>
        <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(a, b, y, n, nb, op);
    REGEN_CUDA_LAUNCH_CHECK(name);
    return;
  }
  const unsigned gx = grid_blocks(nb, kThreads);
  // Enough row chunks to fill the GPU; grid.y is limited to 65535.
  const int64_t want_y = detail::ceil_div(1024, gx);
  const unsigned gy =
      static_cast<unsigned>(rows < want_y ? rows : (want_y > 65535 ? 65535 : want_y));
  broadcast_kernel<Op><<<dim3(gx, gy), kThreads, 0, stream()>>>(a, b, y, rows, nb, op);
  REGEN_CUDA_LAUNCH_CHECK(name);
}

// ---- Fill, copy, scalar fill ------------------------------------------------------------------

// y: (n)
__global__ void fill_kernel(float* y, int64_t n, float value) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = value;
}
// s: (1) on the device, y: (n)
__global__ void fill_from_scalar_kernel(const float* s, float* y, int64_t n, float alpha) {
  const float value = alpha * s[0];
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = value;
}

// ---- Reductions
// -----------------------------------------------------------------------------------

template <class T = float>
struct ToDouble {
  __device__ double operator()(T v) const { return static_cast<double>(static_cast<float>(v)); }
};
template <class T = float>
struct SquareToDouble {
  __device__ double operator()(T v) const {
    const double d = static_cast<double>(static_cast<float>(v));
    return d * d;
  }
};

// out: (1) float, or a 16-bit T through f32 (the CPU's round_from_double).
template <class T>
__global__ void round_to_float_kernel(const double* in, T* out) {
  out[0] = T(static_cast<float>(in[0]));
}

constexpr int kColTile = 32;  // columns per block (one per lane)
constexpr int kRowLanes = 8;  // threads down the rows of a column
constexpr int kRowsPerChunk = 512;
constexpr int kMaxChunks = 256;

// x: (rows, cols); partial: (chunks, cols) doubles, or y: (cols) floats when chunks == 1.
// Block (32, 8): lane tx owns column c; the 8 row lanes stride over the chunk's rows, and their
// sums are combined in a fixed order through shared memory.
template <class T>
__global__ void column_partial_kernel(const T* x, int64_t rows, int64_t cols,
                                      int64_t rows_per_chunk, double* partial, T* y) {
  __shared__ double acc[kRowLanes][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk;
  if (r1 > rows) r1 = rows;
  double s = 0.0;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes)
      s += static_cast<double>(static_cast<float>(x[r * cols + c]));
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double t = acc[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kRowLanes; ++k) t += acc[k][threadIdx.x];
    if (y) {
      y[c] = T(static_cast<float>(t));
    } else {
      partial[static_cast<int64_t>(blockIdx.y) * cols + c] = t;
    }
  }
}
// partial: (chunks, cols) -> y: (cols), chunks summed in order.
template <class T>
__global__ void column_final_kernel(const double* partial, int64_t chunks, int64_t cols, T* y) {
  for (int64_t c = dev::global_thread(); c < cols; c += dev::grid_stride()) {
    double t = 0.0;
    for (int64_t k = 0; k < chunks; ++k) t += partial[k * cols + c];
    y[c] = T(static_cast<float>(t));
  }
}

// ---- Dropout
// ----------------------------------------------------------------------------------------

// x, y: (n). Thread g handles elements 4g..4g+3, which are the four words of Philox block g. T:
// float, or a 16-bit type whose kept value x * keep_scale is computed in f32 and rounded once.
template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, uint64_t threshold, float keep_scale,
                               uint64_t seed, uint64_t stream_id, const uint64_t* stream_offset) {
  const int64_t groups = (n + 3) / 4;
  // A captured step's replays move its streams on through `stream_offset` (core/cuda/graph.h).
  const uint64_t subsequence = stream_id + (stream_offset ? *stream_offset : 0);
  const PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (int64_t g = dev::global_thread(); g < groups; g += dev::grid_stride()) {
    const uint64_t block = static_cast<uint64_t>(g);
    uint32_t words[4];
    philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)},
                  key, words);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t i = 4 * g + e;
      if (i < n) y[i] = T(words[e] >= threshold ? static_cast<float>(x[i]) * keep_scale : 0.0f);
    }
  }
}

uint64_t dropout_threshold(float p) {  // the CPU's rule: keep iff word >= p * 2^32
  if (p <= 0.0f) return 0;
  if (p >= 1.0f) return uint64_t{1} << 32;
  return static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
}

// dropout_forward for T = float and the 16-bit types: the same mask, the same scale.
template <class T>
void launch_dropout(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream_id) {
  REGEN_CHECK(n >= 0, "dropout_forward: negative size ", n);
  REGEN_CHECK(p >= 0.0f && p <= 1.0f, "dropout_forward: probability ", p, " is not in [0, 1]");
  if (n == 0) return;
  // The CPU computes the scale in float as 1 / (1 - p); so does this line, bit for bit.
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const int64_t groups = (n + 3) / 4;
  dropout_kernel<T><<<grid_blocks(groups, kThreads), kThreads, 0, stream()>>>(
      x, y, n, dropout_threshold(p), keep_scale, seed, stream_id, cuda::rng_stream_offset());
  REGEN_CUDA_LAUNCH_CHECK("dropout_forward");
}

// ---- Permute
// ------------------------------------------------------------------------------------------

// Always six dimensions: the launcher pads the front with extent-1 dimensions, so the loop
// below unrolls completely and the parameters stay in registers.
struct PermuteParams {
  int64_t out_shape[6];
  int64_t src_stride[6];  // input stride of the dimension that output dimension d reads
};

// x: s.shape -> y: permuted, one thread per output element. Index arithmetic in Index (32-bit
// when every offset fits, which avoids 64-bit division in the common case).
template <class Index, class T>
__global__ void permute_kernel(const T* x, T* y, int64_t n, PermuteParams p) {
  for (int64_t o = dev::global_thread(); o < n; o += dev::grid_stride()) {
    Index rem = static_cast<Index>(o), src = 0;
#pragma unroll
    for (int d = 5; d >= 0; --d) {
      const Index extent = static_cast<Index>(p.out_shape[d]);
      const Index q = rem / extent;
      src += (rem - q * extent) * static_cast<Index>(p.src_stride[d]);
      rem = q;
    }
    y[o] = x[src];
  }
}

}  // namespace

void fill(float* y, int64_t n, float value) {
  REGEN_CHECK(n >= 0, "fill: negative size ", n);
  if (n == 0) return;
  fill_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(y, n, value);
  REGEN_CUDA_LAUNCH_CHECK("fill");
}

void copy(const float* x, float* y, int64_t n) {
  REGEN_CHECK(n >= 0, "copy: negative size ", n);
  if (n == 0 || x == y) return;
  REGEN_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream()));
}

void add(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
  launch_broadcast("add", a, b, y, n, nb, AddOp{});
}

void add_inplace(float* y, const float* x, int64_t n) {
  launch_binary("add_inplace", y, x, y, n, AddOp{});
}

void mul(const float* a, const float* b, float* y, int64_t n, int64_t nb) {
  launch_broadcast("mul", a, b, y, n, nb, MulOp{});
}

void scale(const float* x, float* y, int64_t n, float alpha) {
  launch_unary("scale", x, y, n, ScaleOp{alpha});
}

void fill_from_scalar(const float* s, float* y, int64_t n, float alpha) {
  REGEN_CHECK(n >= 0, "fill_from_scalar: negative size ", n);
  if (n == 0) return;
  fill_from_scalar_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(s, y, n, alpha);
  REGEN_CUDA_LAUNCH_CHECK("fill_from_scalar");
}

// x: (rows, cols) -> y: (cols); one body for float and the 16-bit types (double sums, one
// rounding).
template <class T>
void sum_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  REGEN_CHECK(rows >= 0 && cols >= 0, "sum_rows: negative shape (", rows, ", ", cols, ")");
  // The dry path (kernels.h): the partials' workspace when there is one, requested and unused.
  const bool dry = dry_run_active();
  if (cols == 0) return;
  if (rows == 0) {
    if (!dry) fill(y, cols, T(0.0f));
    return;
  }
  // The chunking depends only on the shape, so the summation order is fixed.
  int64_t chunks = detail::ceil_div(rows, kRowsPerChunk);
  if (chunks > kMaxChunks) chunks = kMaxChunks;
  const int64_t rows_per_chunk = detail::ceil_div(rows, chunks);
  chunks = detail::ceil_div(rows, rows_per_chunk);
  const int64_t col_tiles = detail::ceil_div(cols, kColTile);
  REGEN_CHECK(col_tiles <= 0x7fffffff, "sum_rows: ", cols, " columns are too many");
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks));
  if (chunks == 1) {
    if (dry) return;
    column_partial_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, stream()>>>(
        x, rows, cols, rows_per_chunk, nullptr, y);
    REGEN_CUDA_LAUNCH_CHECK("sum_rows");
    return;
  }
  Workspace ws(detail::device(), static_cast<uint64_t>(chunks * cols) * sizeof(double));
  if (dry) return;
  column_partial_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, stream()>>>(
      x, rows, cols, rows_per_chunk, ws.as<double>(), nullptr);
  REGEN_CUDA_LAUNCH_CHECK("sum_rows");
  column_final_kernel<T>
      <<<grid_blocks(cols, kThreads), kThreads, 0, stream()>>>(ws.as<double>(), chunks, cols, y);
  REGEN_CUDA_LAUNCH_CHECK("sum_rows");
}

// x: (n) -> y: (1)
template <class T>
void sum_all(const T* x, T* y, int64_t n) {
  REGEN_CHECK(n >= 0, "sum_all: negative size ", n);
  // The dry path (kernels.h): CUB's size query (no data read), then the workspace, unused.
  const bool dry = dry_run_active();
  if (n == 0) {
    if (!dry) fill(y, 1, T(0.0f));
    return;
  }
  size_t temp_bytes = 0;
  REGEN_CUDA_CHECK(cub::DeviceReduce::TransformReduce(
      nullptr, temp_bytes, x, static_cast<double*>(nullptr), n, ::cuda::std::plus<double>{},
      ToDouble<T>{}, 0.0, stream()));
  // One buffer: the double result first (8-byte aligned), CUB's scratch after it at 256 bytes.
  Workspace ws(detail::device(), 256 + temp_bytes);
  if (dry) return;
  double* total = ws.as<double>();
  void* temp = static_cast<char*>(ws.data()) + 256;
  REGEN_CUDA_CHECK(cub::DeviceReduce::TransformReduce(
      temp, temp_bytes, x, total, n, ::cuda::std::plus<double>{}, ToDouble<T>{}, 0.0, stream()));
  round_to_float_kernel<T><<<1, 1, 0, stream()>>>(total, y);
  REGEN_CUDA_LAUNCH_CHECK("sum_all");
}

// x: (n) -> y: (1), the sum of squares in double
template <class T>
void sum_squares(const T* x, T* y, int64_t n) {
  REGEN_CHECK(n >= 0, "sum_squares: negative size ", n);
  if (n == 0) return fill(y, 1, T(0.0f));
  size_t temp_bytes = 0;
  REGEN_CUDA_CHECK(cub::DeviceReduce::TransformReduce(
      nullptr, temp_bytes, x, static_cast<double*>(nullptr), n, ::cuda::std::plus<double>{},
      SquareToDouble<T>{}, 0.0, stream()));
  // One buffer: the double result first (8-byte aligned), CUB's scratch after it at 256 bytes.
  Workspace ws(detail::device(), 256 + temp_bytes);
  double* total = ws.as<double>();
  void* temp = static_cast<char*>(ws.data()) + 256;
  REGEN_CUDA_CHECK(cub::DeviceReduce::TransformReduce(temp, temp_bytes, x, total, n,
                                                      ::cuda::std::plus<double>{},
                                                      SquareToDouble<T>{}, 0.0, stream()));
  round_to_float_kernel<T><<<1, 1, 0, stream()>>>(total, y);
  REGEN_CUDA_LAUNCH_CHECK("sum_squares");
}

void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed,
                     uint64_t stream_id) {
  launch_dropout(x, y, n, p, seed, stream_id);
}

void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed,
                      uint64_t stream_id) {
  dropout_forward(dy, dx, n, p, seed, stream_id);  // the same mask and scale
}

namespace {
// x: (n) -> y: (n), the conversions of kernels/half.h (the CPU loops' functions).
__global__ void narrow_kernel(const float* x, uint16_t* y, int64_t n, Compression c) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride())
    y[i] = half::narrow(x[i], c);
}
__global__ void widen_kernel(const uint16_t* x, float* y, int64_t n, Compression c) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride())
    y[i] = half::widen(x[i], c);
}
}  // namespace

void narrow_to_half(const float* x, uint16_t* y, int64_t n, Compression c) {
  REGEN_CHECK(n >= 0 && c != Compression::none, "narrow_to_half: size ", n,
              " and a 16-bit format are needed");
  if (n == 0) return;
  narrow_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n, c);
  REGEN_CUDA_LAUNCH_CHECK("narrow_to_half");
}

void widen_from_half(const uint16_t* x, float* y, int64_t n, Compression c) {
  REGEN_CHECK(n >= 0 && c != Compression::none, "widen_from_half: size ", n,
              " and a 16-bit format are needed");
  if (n == 0) return;
  widen_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n, c);
  REGEN_CUDA_LAUNCH_CHECK("widen_from_half");
}

template <class T>
void permute(const T* x, T* y, const PermuteShape& s) {
  REGEN_CHECK(s.ndim >= 1 && s.ndim <= 6, "permute: ", s.ndim, " dimensions (1 to 6 supported)");
  PermuteParams p{};
  const int pad = 6 - s.ndim;
  for (int d = 0; d < pad; ++d) {
    p.out_shape[d] = 1;
    p.src_stride[d] = 0;
  }
  int64_t in_stride[6];
  int64_t n = 1;
  bool seen[6] = {false, false, false, false, false, false};
  for (int d = s.ndim - 1; d >= 0; --d) {
    REGEN_CHECK(s.shape[d] >= 0, "permute: negative extent ", s.shape[d], " in dimension ", d);
    in_stride[d] = n;
    n *= s.shape[d];
  }
  for (int d = 0; d < s.ndim; ++d) {
    const int64_t src = s.perm[d];
    REGEN_CHECK(src >= 0 && src < s.ndim && !seen[src], "permute: perm is not a permutation of 0..",
                s.ndim - 1);
    seen[src] = true;
    p.out_shape[pad + d] = s.shape[src];
    p.src_stride[pad + d] = in_stride[src];
  }
  if (n == 0) return;
  if (n <= 0x7fffffff) {
    permute_kernel<uint32_t, T><<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n, p);
  } else {
    permute_kernel<int64_t, T><<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n, p);
  }
  REGEN_CUDA_LAUNCH_CHECK("permute");
}

void sum_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  sum_rows<float>(x, y, rows, cols);
}
void sum_all(const float* x, float* y, int64_t n) {
  sum_all<float>(x, y, n);
}
void sum_squares(const float* x, float* y, int64_t n) {
  sum_squares<float>(x, y, n);
}
void permute(const float* x, float* y, const PermuteShape& s) {
  permute<float>(x, y, s);
}

// ---- 16-bit forms (bfloat16, float16) ---------------------------------------------------------
// Each element widened to f32, computed there, rounded once on store: the CPU's 16-bit loops
// (kernels/cpu/elementwise.cpp, dropout_lowp.cpp), element for element. Plain grid-stride loops.

namespace {
// a, y: (n); b: (nb) broadcast over the leading dimensions (nb == n: element-wise).
template <class T, class Op>
__global__ void half_binary_kernel(const T* a, const T* b, T* y, int64_t n, int64_t nb, Op op) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    const float u = static_cast<float>(a[i]);
    const float v = static_cast<float>(b[nb == n ? i : i % nb]);
    y[i] = T(op(u, v));
  }
}
// x, y: (n)
template <class T, class Op>
__global__ void half_unary_kernel(const T* x, T* y, int64_t n, Op op) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride())
    y[i] = T(op(static_cast<float>(x[i])));
}
// y: (n) = value (its bits)
template <class T>
__global__ void half_fill_kernel(T* y, int64_t n, T value) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = value;
}
// y: (n) = round(alpha * s[0]), s: (1)
template <class T>
__global__ void half_fill_from_scalar_kernel(const T* s, T* y, int64_t n, float alpha) {
  const T value(alpha * static_cast<float>(s[0]));
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) y[i] = value;
}
template <class T, class Op>
void launch_half_binary(const char* name, const T* a, const T* b, T* y, int64_t n, int64_t nb,
                        Op op) {
  REGEN_CHECK(n >= 0 && nb > 0 && n % nb == 0, name, ": ", nb, " broadcast elements do not divide ",
              n);
  if (n == 0) return;
  half_binary_kernel<T, Op>
      <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(a, b, y, n, nb, op);
  REGEN_CUDA_LAUNCH_CHECK(name);
}
template <class T, class Op>
void launch_half_unary(const char* name, const T* x, T* y, int64_t n, Op op) {
  REGEN_CHECK(n >= 0, name, ": negative size ", n);
  if (n == 0) return;
  half_unary_kernel<T, Op><<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(x, y, n, op);
  REGEN_CUDA_LAUNCH_CHECK(name);
}
}  // namespace

template <class T>
void fill(T* y, int64_t n, T value) {
  REGEN_CHECK(n >= 0, "fill: negative size ", n);
  if (n == 0) return;
  half_fill_kernel<T><<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(y, n, value);
  REGEN_CUDA_LAUNCH_CHECK("fill");
}
template <class T>
void copy(const T* x, T* y, int64_t n) {
  REGEN_CHECK(n >= 0, "copy: negative size ", n);
  if (n == 0 || x == y) return;
  REGEN_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(T),
                                   cudaMemcpyDeviceToDevice, stream()));
}
template <class T>
void add(const T* a, const T* b, T* y, int64_t n, int64_t nb) {
  launch_half_binary("add", a, b, y, n, nb, AddOp{});
}
template <class T>
void add_inplace(T* y, const T* x, int64_t n) {
  launch_half_binary("add_inplace", y, x, y, n, n > 0 ? n : 1, AddOp{});
}
template <class T>
void mul(const T* a, const T* b, T* y, int64_t n, int64_t nb) {
  launch_half_binary("mul", a, b, y, n, nb, MulOp{});
}
template <class T>
void scale(const T* x, T* y, int64_t n, T alpha) {
  // The CPU's scale<T>: the 16-bit alpha widened (its rounding is the caller's).
  launch_half_unary("scale", x, y, n, ScaleOp{static_cast<float>(alpha)});
}
template <class T>
void scale_f32(const T* x, T* y, int64_t n, float alpha) {
  launch_half_unary("scale", x, y, n, ScaleOp{alpha});
}
template <class T>
void fill_from_scalar(const T* s, T* y, int64_t n, T alpha) {
  fill_from_scalar_f32(s, y, n, static_cast<float>(alpha));
}
template <class T>
void fill_from_scalar_f32(const T* s, T* y, int64_t n, float alpha) {
  REGEN_CHECK(n >= 0, "fill_from_scalar: negative size ", n);
  if (n == 0) return;
  half_fill_from_scalar_kernel<T>
      <<<grid_blocks(n, kThreads), kThreads, 0, stream()>>>(s, y, n, alpha);
  REGEN_CUDA_LAUNCH_CHECK("fill_from_scalar");
}
template <class T>
void dropout_forward_lowp(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t stream_id) {
  launch_dropout(x, y, n, p, seed, stream_id);
}
template <class T>
void dropout_backward_lowp(const T* dy, T* dx, int64_t n, float p, uint64_t seed,
                           uint64_t stream_id) {
  dropout_forward_lowp<T>(dy, dx, n, p, seed, stream_id);  // the same mask and scale
}

#define REGEN_ELEMENTWISE_HALF(T)                                                          \
  template void fill<T>(T*, int64_t, T);                                                   \
  template void copy<T>(const T*, T*, int64_t);                                            \
  template void add<T>(const T*, const T*, T*, int64_t, int64_t);                          \
  template void add_inplace<T>(T*, const T*, int64_t);                                     \
  template void mul<T>(const T*, const T*, T*, int64_t, int64_t);                          \
  template void scale<T>(const T*, T*, int64_t, T);                                        \
  template void scale_f32<T>(const T*, T*, int64_t, float);                                \
  template void fill_from_scalar<T>(const T*, T*, int64_t, T);                             \
  template void fill_from_scalar_f32<T>(const T*, T*, int64_t, float);                     \
  template void sum_rows<T>(const T*, T*, int64_t, int64_t);                               \
  template void sum_all<T>(const T*, T*, int64_t);                                         \
  template void sum_squares<T>(const T*, T*, int64_t);                                     \
  template void permute<T>(const T*, T*, const PermuteShape&);                             \
  template void dropout_forward_lowp<T>(const T*, T*, int64_t, float, uint64_t, uint64_t); \
  template void dropout_backward_lowp<T>(const T*, T*, int64_t, float, uint64_t, uint64_t);
REGEN_ELEMENTWISE_HALF(bfloat16)
REGEN_ELEMENTWISE_HALF(float16)
#undef REGEN_ELEMENTWISE_HALF

}  // namespace regen::cuda
