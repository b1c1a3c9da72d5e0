// CUDA embedding lookup and its deterministic dense gradient (declared in
// kernels/cuda/cuda_kernels.h; CPU reference kernels/cpu/embedding.cpp; test
// tests/cuda/test_cuda_ops.cpp).
//
// Backward without floating-point atomics, in an order fixed by the ids alone:
// 1. the token positions are sorted by id with CUB's radix sort (stable: equal ids keep
//    increasing positions), so each id's tokens form a run of the sorted array, in token order;
// 2. every run is cut into chunks of R = kEmbeddingChunkRows sorted indices from its start (a
//    mark kernel: the run's first index walks its run R at a time, so it costs L / R steps);
// 3. one block per chunk sums the chunk's dy rows in order, from zero. A run of at most R rows is
//    one chunk: its sum goes straight to its dweight row, and it is the CPU's sum (zeroed row,
//    then every token's row in token order) bit for bit. A longer run's chunks write partial
//    rows instead;
// 4. one block per long run adds its chunks' partial rows in chunk order, from zero.
// So a frequent id (padding, a common token) is spread over L / R blocks instead of serialising
// the step in one, and the result is the same on every run. Partial rows: at most two chunks of
// long runs start in any window [wR, (w+1)R) of the sorted array (a full chunk, and the last,
// shorter chunk of another run), so slot 2w + (full ? 1 : 0) is unique, and 2 ceil(n / R) rows
// hold them all; the workspace depends on n and D only.
// Out-of-range ids: the smallest bad position is recorded in a device word (integer atomicMin,
// timing-independent), the bad id is not dereferenced, and the launcher reads the word back (one
// synchronization per call) and throws regen::Error naming the position and the id.
#include <cub/device/device_radix_sort.cuh>

#include "regen/core/tensor.h"
#include "regen/kernels/cuda/common.cuh"
#include "regen/kernels/cuda/cuda_kernels.h"

namespace regen::cuda {
namespace {

constexpr int kThreads = 128;
constexpr unsigned long long kNone = ~0ull;

// A sum of T values kept in f32: rounded to T after every addition for the 16-bit types, as the
// CPU's 16-bit backward adds each row into the stored 16-bit gradient; as is for float.
template <class T>
__device__ __forceinline__ float add_rounded(float acc, float v) {
  return static_cast<float>(T(__fadd_rn(acc, v)));
}

// weight: (V, D), ids: (n) -> y: (n, D). One block per token.
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(const T* weight, const int64_t* ids, T* y, int64_t V, int64_t D,
                             unsigned long long* bad) {
  const int64_t i = blockIdx.x;
  const int64_t id = ids[i];
  T* out = y + i * D;
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0) atomicMin(bad, static_cast<unsigned long long>(i));
    for (int64_t c = threadIdx.x; c < D; c += kThreads) out[c] = T(0.0f);
    return;
  }
  const T* row = weight + id * D;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) out[c] = row[c];
}

// ids: (n) -> keys (ids as uint32; 0 for a bad id, which is reported), positions 0..n-1.
__global__ void embedding_keys_kernel(const int64_t* ids, int64_t n, int64_t V, uint32_t* keys,
                                      int32_t* positions, unsigned long long* bad) {
  for (int64_t i = dev::global_thread(); i < n; i += dev::grid_stride()) {
    const int64_t id = ids[i];
    const bool ok = id >= 0 && id < V;
    if (!ok) atomicMin(bad, static_cast<unsigned long long>(i));
    keys[i] = ok ? static_cast<uint32_t>(id) : 0u;
    positions[i] = static_cast<int32_t>(i);
  }
}

constexpr int64_t kChunk = kEmbeddingChunkRows;
constexpr uint8_t kRunStart = 1, kChunkStart = 2;  // chunk marks

// sorted_keys: (n) -> marks: kRunStart at each run's first index, kChunkStart R, 2R, ... after it
// (marks zeroed before).
__global__ void embedding_mark_chunks_kernel(const uint32_t* sorted_keys, int64_t n,
                                             uint8_t* marks) {
  for (int64_t k = dev::global_thread(); k < n; k += dev::grid_stride()) {
    const uint32_t key = sorted_keys[k];
    if (k > 0 && sorted_keys[k - 1] == key) continue;
    marks[k] = kRunStart;
    // Sorted: an index R further on holds the same key only if everything between does too.
    for (int64_t c = k + kChunk; c < n && sorted_keys[c] == key; c += kChunk)
      marks[c] = kChunkStart;
  }
}

// The partial row of the chunk of a long run that starts at sorted index k (header comment).
__device__ __forceinline__ int64_t partial_slot(int64_t k, bool full) {
  return 2 * (k / kChunk) + (full ? 1 : 0);
}

// Block k sums the chunk starting at sorted index k (other blocks exit at once): into dweight's
// row when the chunk is its whole run, else into its partial row (f32 holding T's values).
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_chunk_kernel(const T* dy, const uint32_t* sorted_keys, const int32_t* sorted_pos,
                           const uint8_t* marks, int64_t n, int64_t D, T* dweight,
                           float* partials) {
  const int64_t k = blockIdx.x;
  const uint8_t mark = marks[k];
  if (mark == 0) return;
  const uint32_t key = sorted_keys[k];
  // The chunk's end: the first index of (k, min(k + R, n)) with another key (binary search on the
  // sorted keys), else min(k + R, n).
  int64_t lo = k + 1, hi = k + kChunk < n ? k + kChunk : n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted_keys[mid] == key)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t end = lo;
  const bool run_ends = end == n || sorted_keys[end] != key;
  const bool whole = mark == kRunStart && run_ends;
  T* out = dweight + static_cast<int64_t>(key) * D;
  float* part = partials + partial_slot(k, end - k == kChunk) * D;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) {
    float acc = 0.0f;
    int64_t t = k;
    for (; t + 4 <= end; t += 4) {  // four independent loads, then four ordered additions
      const float a0 = static_cast<float>(dy[static_cast<int64_t>(sorted_pos[t]) * D + c]);
      const float a1 = static_cast<float>(dy[static_cast<int64_t>(sorted_pos[t + 1]) * D + c]);
      const float a2 = static_cast<float>(dy[static_cast<int64_t>(sorted_pos[t + 2]) * D + c]);
      const float a3 = static_cast<float>(dy[static_cast<int64_t>(sorted_pos[t + 3]) * D + c]);
      acc = add_rounded<T>(acc, a0);
      acc = add_rounded<T>(acc, a1);
      acc = add_rounded<T>(acc, a2);
      acc = add_rounded<T>(acc, a3);
    }
    for (; t < end; ++t) {
      acc =
          add_rounded<T>(acc, static_cast<float>(dy[static_cast<int64_t>(sorted_pos[t]) * D + c]));
    }
    if (whole) {
      out[c] = T(acc);
    } else {
      part[c] = acc;
    }
  }
}

// Block k, when k starts a run longer than R, adds the run's partial rows in chunk order into its
// dweight row (other blocks exit at once).
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_combine_kernel(const uint32_t* sorted_keys, const uint8_t* marks, int64_t n,
                             int64_t D, const float* partials, T* dweight) {
  const int64_t k = blockIdx.x;
  if (marks[k] != kRunStart) return;
  const uint32_t key = sorted_keys[k];
  if (k + kChunk >= n || sorted_keys[k + kChunk] != key) return;  // one chunk: already written
  T* out = dweight + static_cast<int64_t>(key) * D;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) {
    float acc = 0.0f;
    for (int64_t s = k; s < n && sorted_keys[s] == key; s += kChunk) {
      const bool full = s + kChunk <= n && sorted_keys[s + kChunk - 1] == key;
      acc = add_rounded<T>(acc, partials[partial_slot(s, full) * D + c]);
    }
    out[c] = T(acc);
  }
}

void check_shape(const char* name, int64_t n, int64_t V, int64_t D) {
  REGEN_CHECK(n >= 0 && V > 0 && D >= 0, name, ": bad shape n=", n, " V=", V, " D=", D);
  REGEN_CHECK(n <= 0x7fffffff && V <= 0x7fffffff, name, ": n=", n, " or V=", V,
              " is too large for the CUDA kernels (2^31 - 1)");
}

[[noreturn]] void report_bad_id(const char* name, unsigned long long position, const int64_t* ids,
                                int64_t V) {
  const int64_t id = detail::read_back(ids + position);
  REGEN_FAIL(name, ": id ", id, " at position ", position,
             " is out of range for a table of V = ", V, " rows");
}

}  // namespace

// weight: (V, D), ids: (n) -> y: (n, D); float or 16-bit T (a copy of rows).
template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* y, int64_t n, int64_t V, int64_t D) {
  check_shape("embedding_forward", n, V, D);
  if (n == 0) return;
  Workspace ws(detail::device(), sizeof(unsigned long long));
  if (dry_run_active()) return;  // the dry path (kernels.h): the workspace, requested and unused
  auto* bad = ws.as<unsigned long long>();
  REGEN_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream()));
  embedding_forward_kernel<T>
      <<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(weight, ids, y, V, D, bad);
  REGEN_CUDA_LAUNCH_CHECK("embedding_forward");
  const unsigned long long first_bad = detail::read_back_flag(bad, kNone);
  if (first_bad != kNone) report_bad_id("embedding_forward", first_bad, ids, V);
}

// dy: (n, D), ids: (n) -> dweight: (V, D), written; float or 16-bit T (each addition rounded to T,
// as the CPU's 16-bit loop: the CPU's bits for an id used at most kEmbeddingChunkRows times).
template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t D) {
  const char* name = "embedding_backward";
  check_shape(name, n, V, D);
  if (D == 0) return;
  // The dry path (kernels.h): CUB's size query (no data read), then the workspace, unused.
  const bool dry = dry_run_active();
  if (!dry) {
    REGEN_CUDA_CHECK(cudaMemsetAsync(dweight, 0, static_cast<size_t>(V * D) * sizeof(T), stream()));
  }
  if (n == 0) return;
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) < V) ++end_bit;  // ids < V fit in end_bit bits
  size_t sort_bytes = 0;
  REGEN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit,
      stream()));
  // [bad (8 B) | pad to 256 | keys | positions | sorted keys | sorted positions | marks |
  //  partial rows (2 ceil(n / R) x D) | CUB scratch], each part rounded up to 256 bytes.
  auto round256 = [](int64_t bytes) {
    return static_cast<uint64_t>(detail::ceil_div(bytes, 256) * 256);
  };
  const uint64_t array_bytes = round256(n * 4), mark_bytes = round256(n);
  const uint64_t partial_bytes = round256(2 * detail::ceil_div(n, kChunk) * D * 4);
  Workspace ws(detail::device(), 256 + 4 * array_bytes + mark_bytes + partial_bytes + sort_bytes);
  if (dry) return;
  char* base = static_cast<char*>(ws.data());
  auto* bad = reinterpret_cast<unsigned long long*>(base);
  auto* keys = reinterpret_cast<uint32_t*>(base + 256);
  auto* positions = reinterpret_cast<int32_t*>(base + 256 + array_bytes);
  auto* sorted_keys = reinterpret_cast<uint32_t*>(base + 256 + 2 * array_bytes);
  auto* sorted_pos = reinterpret_cast<int32_t*>(base + 256 + 3 * array_bytes);
  auto* marks = reinterpret_cast<uint8_t*>(base + 256 + 4 * array_bytes);
  auto* partials = reinterpret_cast<float*>(base + 256 + 4 * array_bytes + mark_bytes);
  void* sort_temp = base + 256 + 4 * array_bytes + mark_bytes + partial_bytes;
  REGEN_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream()));
  REGEN_CUDA_CHECK(cudaMemsetAsync(marks, 0, static_cast<size_t>(n), stream()));
  embedding_keys_kernel<<<detail::grid_blocks(n, 256), 256, 0, stream()>>>(ids, n, V, keys,
                                                                           positions, bad);
  REGEN_CUDA_LAUNCH_CHECK(name);
  REGEN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys, sorted_keys,
                                                   positions, sorted_pos, n, 0, end_bit, stream()));
  embedding_mark_chunks_kernel<<<detail::grid_blocks(n, 256), 256, 0, stream()>>>(sorted_keys, n,
                                                                                  marks);
  REGEN_CUDA_LAUNCH_CHECK(name);
  embedding_chunk_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      dy, sorted_keys, sorted_pos, marks, n, D, dweight, partials);
  REGEN_CUDA_LAUNCH_CHECK(name);
  embedding_combine_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(
      sorted_keys, marks, n, D, partials, dweight);
  REGEN_CUDA_LAUNCH_CHECK(name);
  const unsigned long long first_bad = detail::read_back_flag(bad, kNone);
  if (first_bad != kNone) report_bad_id(name, first_bad, ids, V);
}

void embedding_forward(const float* weight, const int64_t* ids, float* y, int64_t n, int64_t V,
                       int64_t D) {
  embedding_forward<float>(weight, ids, y, n, V, D);
}
void embedding_backward(const float* dy, const int64_t* ids, float* dweight, int64_t n, int64_t V,
                        int64_t D) {
  embedding_backward<float>(dy, ids, dweight, n, V, D);
}
#define REGEN_EMBEDDING_HALF(T)                                                                \
  template void embedding_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t); \
  template void embedding_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);
REGEN_EMBEDDING_HALF(bfloat16)
REGEN_EMBEDDING_HALF(float16)
#undef REGEN_EMBEDDING_HALF

}  // namespace regen::cuda
