// Tensor, Storage and creation functions (tensor.h).
#include "regen/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "regen/core/philox.h"
#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#endif

namespace regen {

// ---- Storage ----------------------------------------------------------------------------------

Storage::Storage(Device device, uint64_t bytes)
    : device_(device), bytes_(bytes), allocator_(&allocator_for(device)) {
  if (bytes_ > 0) block_ = allocator_->allocate(bytes_);
}

Storage::Storage(Device device, uint64_t bytes, Category category)
    : device_(device), bytes_(bytes), allocator_(&allocator_for(device)) {
  if (bytes_ > 0) block_ = allocator_->allocate(bytes_, category, current_tag());
}

Storage::Storage(CachingAllocator& allocator, uint64_t bytes, Category category)
    : device_(allocator.device()), bytes_(bytes), allocator_(&allocator) {
  if (bytes_ > 0) block_ = allocator_->allocate(bytes_, category, current_tag());
}

Storage::~Storage() {
  if (block_) allocator_->free(block_);
}

void Storage::evict() {
  if (block_) allocator_->free(block_);
  block_ = nullptr;
}

void Storage::adopt(Storage& fresh) {
  REGEN_CHECK(fresh.bytes_ == bytes_ && fresh.device_ == device_,
              "storage adopt: ", format_bytes(fresh.bytes_), " on ", fresh.device_.str(),
              " cannot replace ", format_bytes(bytes_), " on ", device_.str());
  REGEN_CHECK(block_ == nullptr, "storage adopt: storage still holds its bytes");
  block_ = fresh.block_;
  allocator_ = fresh.allocator_;
  fresh.block_ = nullptr;
}

// ---- Copies -----------------------------------------------------------------------------------

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, uint64_t nbytes) {
  if (nbytes == 0 || dry_run_active()) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
#ifdef REGEN_WITH_CUDA
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    // Across devices the copy waits for the source's stream (runtime.h).
    cuda::copy_between_devices(dst, dst_device.index, src, src_device.index, nbytes);
    return;
  }
  // Host <-> device: on the device's stream, after the kernels queued there.
  const cudaMemcpyKind kind = dst_device.is_cpu() ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  cuda::set_device(dst_device.is_cuda() ? dst_device.index : src_device.index);
  cuda::memcpy(dst, src, nbytes, kind);
#else
  REGEN_FAIL("copy between ", src_device.str(), " and ", dst_device.str(),
             ": regen was built without CUDA support");
#endif
}

// ---- Tensor -------------------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  REGEN_CHECK(d >= -n && d < n, "size(", d, ") out of range for tensor ", str());
  return shape()[d < 0 ? d + n : d];
}

std::string Tensor::str() const {
  if (!defined()) return "<undefined>";
  return std::string(dtype_name(impl_->dtype)) + shape_str(impl_->shape) + " on " +
         impl_->device.str();
}

void* Tensor::raw_data() const {
  const TensorImpl* t = checked();
  if (!t->storage) {
    REGEN_CHECK(numel() == 0, "tensor ", str(), " has no storage");
    return nullptr;
  }
  REGEN_CHECK(t->storage->resident(), "tensor ", str(),
              " was evicted by the remat runtime and has not been regenerated");
  return static_cast<char*>(t->storage->data()) + t->offset_bytes;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  const TensorImpl* t = checked();
  Shape s = new_shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      REGEN_CHECK(infer < 0, "reshape of ", str(), " to ", sh(new_shape),
                  ": only one dimension may be -1");
      infer = static_cast<int>(i);
    } else {
      REGEN_CHECK(s[i] >= 0, "reshape of ", str(), " to ", sh(new_shape), ": negative dimension");
      known *= s[i];
    }
  }
  if (infer >= 0) {
    REGEN_CHECK(known > 0 && numel() % known == 0, "reshape of ", str(), " to ", sh(new_shape),
                ": cannot infer the -1 dimension");
    s[infer] = numel() / known;
  }
  REGEN_CHECK(shape_numel(s) == numel(), "reshape of ", str(), " to ", sh(new_shape), ": ", numel(),
              " elements cannot take shape ", sh(s));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t->storage;
  impl->offset_bytes = t->offset_bytes;
  impl->shape = std::move(s);
  impl->dtype = t->dtype;
  impl->device = t->device;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  const TensorImpl* t = checked();
  REGEN_CHECK(dim() >= 1, "narrow0 of a 0-d tensor ", str());
  REGEN_CHECK(start >= 0 && length >= 0 && start + length <= shape()[0], "narrow0(", start, ", ",
              length, ") out of range for ", str());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t->storage;
  impl->shape = t->shape;
  impl->shape[0] = length;
  const uint64_t row_bytes =
      static_cast<uint64_t>(numel() / std::max<int64_t>(shape()[0], 1)) * dtype_size(t->dtype);
  impl->offset_bytes = t->offset_bytes + static_cast<uint64_t>(start) * row_bytes;
  impl->dtype = t->dtype;
  impl->device = t->device;
  return Tensor(std::move(impl));
}

Tensor Tensor::clone() const {
  return to(device());
}

Tensor Tensor::to(Device target) const {
  Tensor out = empty(shape(), dtype(), target);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  REGEN_CHECK(shape() == src.shape() && dtype() == src.dtype(), "copy_from: destination ", str(),
              " and source ", src.str(), " differ in shape or dtype");
  REGEN_CHECK(src.has_storage(), "copy_from: source ", src.str(), " has no storage");
  copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

namespace {
template <class D, class S>
void convert(D* dst, const S* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
}

template <class D>
void convert_from(D* dst, const void* src, DType st, int64_t n) {
  switch (st) {
    case DType::f32:
      convert(dst, static_cast<const float*>(src), n);
      break;
    case DType::f64:
      convert(dst, static_cast<const double*>(src), n);
      break;
    case DType::i32:
      convert(dst, static_cast<const int32_t*>(src), n);
      break;
    case DType::i64:
      convert(dst, static_cast<const int64_t*>(src), n);
      break;
    case DType::bf16:
      convert(dst, static_cast<const bfloat16*>(src), n);
      break;
    case DType::f16:
      convert(dst, static_cast<const float16*>(src), n);
      break;
  }
}

void convert_any(void* dst, DType dt, const void* src, DType st, int64_t n) {
  switch (dt) {
    case DType::f32:
      convert_from(static_cast<float*>(dst), src, st, n);
      break;
    case DType::f64:
      convert_from(static_cast<double*>(dst), src, st, n);
      break;
    case DType::i32:
      convert_from(static_cast<int32_t*>(dst), src, st, n);
      break;
    case DType::i64:
      convert_from(static_cast<int64_t*>(dst), src, st, n);
      break;
    case DType::bf16:
      convert_from(static_cast<bfloat16*>(dst), src, st, n);
      break;
    case DType::f16:
      convert_from(static_cast<float16*>(dst), src, st, n);
      break;
  }
}

// Creates the tensor and runs `fill_host` on host memory that comes from the allocator: the
// tensor itself on the CPU; on another device, a host staging tensor in the destination's
// category (and the current tag), copied over and released. No tensor-sized buffer is ever
// allocated behind the allocator's back, so its statistics see every byte.
template <class F>
Tensor make_on_host(const Shape& shape, DType dtype, Device device, F fill_host) {
  Tensor t = empty(shape, dtype, device);
  if (dry_run_active()) return t;  // shapes only: no staging, no values
  if (device.is_cpu()) {
    fill_host(t.raw_data());
    return t;
  }
  Tensor staging;
  {
    CategoryScope same_category(t.impl()->storage->category());
    staging = empty(shape, dtype, Device::cpu());
  }
  fill_host(staging.raw_data());
  t.copy_from(staging);
  return t;
}

// Calls f(static_cast<T*>(p)) with T the C++ type of dtype.
template <class F>
void with_typed(void* p, DType dtype, F f) {
  switch (dtype) {
    case DType::f32:
      f(static_cast<float*>(p));
      break;
    case DType::f64:
      f(static_cast<double*>(p));
      break;
    case DType::i32:
      f(static_cast<int32_t*>(p));
      break;
    case DType::i64:
      f(static_cast<int64_t*>(p));
      break;
    case DType::bf16:
      f(static_cast<bfloat16*>(p));
      break;
    case DType::f16:
      f(static_cast<float16*>(p));
      break;
  }
}

template <class T>
void fill_typed(T* p, int64_t n, double v) {
  const T value = static_cast<T>(v);
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void fill_host(void* p, DType dt, int64_t n, double v) {
  switch (dt) {
    case DType::f32:
      fill_typed(static_cast<float*>(p), n, v);
      break;
    case DType::f64:
      fill_typed(static_cast<double*>(p), n, v);
      break;
    case DType::i32:
      fill_typed(static_cast<int32_t*>(p), n, v);
      break;
    case DType::i64:
      fill_typed(static_cast<int64_t*>(p), n, v);
      break;
    case DType::bf16:
      fill_typed(static_cast<bfloat16*>(p), n, v);
      break;
    case DType::f16:
      fill_typed(static_cast<float16*>(p), n, v);
      break;
  }
}

#ifdef REGEN_WITH_CUDA
// The bits of `v` in dt, converted by the same static_cast as fill_typed (so bf16 and f16 round
// alike, 1e30 in f16 is inf, -0.0 keeps its sign), in the low bytes of the result.
uint64_t fill_bits(DType dt, double v) {
  uint64_t bits = 0;
  with_typed(&bits, dt, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const T value = static_cast<T>(v);
    std::memcpy(&bits, &value, sizeof(T));
  });
  return bits;
}

// fill_ on CUDA: a pattern fill on the compute stream (core/cuda/fill.cu), or a memset when every
// byte of the pattern is zero (+0.0 and integer 0; -0.0 has its sign bit and takes the fill).
void fill_cuda(const Tensor& t, double value) {
  cuda::set_device(t.device().index);
  const uint64_t bits = fill_bits(t.dtype(), value);
  if (bits == 0) {
    cuda::memset_zero(t.raw_data(), t.nbytes());
    return;
  }
  cuda::fill_pattern(t.raw_data(), t.numel(), static_cast<int>(dtype_size(t.dtype())), bits);
}
#endif

// The largest f32 value strictly below `high` (compared as real numbers), but not below lo: the
// top of [low, high) in f32. With low == high it is lo (the range holds no other value).
float below_f32(double high, float lo) {
  float h = static_cast<float>(high);
  if (static_cast<double>(h) >= high) {
    h = std::nextafter(h, -std::numeric_limits<float>::infinity());
  }
  return std::max(h, lo);
}

// Every creation function checks its shape first: no negative dimension, and a byte size that
// fits in int64_t (an unchecked product wraps, e.g. to 0 bytes for [1 << 62] of f32, and later
// writes run through whatever the allocator handed out).
void check_shape(const Shape& shape, DType dtype, const char* fn) {
  bool empty_shape = false;
  for (int64_t d : shape) {
    REGEN_CHECK(d >= 0, fn, ": negative dimension in shape ", sh(shape));
    empty_shape = empty_shape || d == 0;
  }
  if (empty_shape) return;  // zero bytes, however large the other dimensions
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    REGEN_CHECK(!__builtin_mul_overflow(bytes, d, &bytes), fn, ": shape ", sh(shape), " of ",
                dtype_name(dtype), " is too large: its size in bytes overflows int64_t");
  }
}
}  // namespace

Tensor Tensor::to(DType target) const {
  REGEN_CHECK(has_storage(), "to(", dtype_name(target), "): tensor ", str(), " has no storage");
  if (target == dtype()) return clone();
  const Tensor src_host = device().is_cpu() ? *this : to(Device::cpu());
  return make_on_host(shape(), target, device(), [&](void* dst) {
    convert_any(dst, target, src_host.raw_data(), dtype(), numel());
  });
}

Tensor& Tensor::set_requires_grad(bool on) {
  REGEN_CHECK(!on || is_floating(dtype()), "requires_grad on integer tensor ", str());
  checked()->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  return Tensor(checked()->grad);
}

// ---- Creation -----------------------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<Storage>(device, shape_nbytes(shape, dtype));
  return Tensor(std::move(impl));
}

void fill_(const Tensor& t, double value) {
  if (t.numel() == 0 || dry_run_active()) return;
  if (t.device().is_cpu()) {
    fill_host(t.raw_data(), t.dtype(), t.numel(), value);
    return;
  }
#ifdef REGEN_WITH_CUDA
  if (t.device().is_cuda()) {
    fill_cuda(t, value);
    return;
  }
#endif
  Tensor host;
  {
    CategoryScope same_category(t.impl()->storage->category());
    host = full(t.shape(), value, t.dtype(), Device::cpu());
  }
  const_cast<Tensor&>(t).copy_from(host);
}

void zero_(const Tensor& t) {
  fill_(t, 0.0);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype, "zeros");
  Tensor t = empty(shape, dtype, device);
  zero_(t);
  return t;
}

Tensor ones(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype, "ones");
  return full(shape, 1.0, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  check_shape(shape, dtype, "full");
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) {
    Tensor t = empty(shape, dtype, device);
    fill_(t, value);  // on the device: no staging tensor, nothing a CUDA graph could not capture
    return t;
  }
#endif
  return make_on_host(shape, dtype, device,
                      [&](void* p) { fill_host(p, dtype, shape_numel(shape), value); });
}

Tensor arange(int64_t n, DType dtype, Device device) {
  REGEN_CHECK(n >= 0, "arange(", n, "): n must be non-negative");
  return arange(0.0, static_cast<double>(n), 1.0, dtype, device);
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  REGEN_CHECK(step != 0.0 && std::isfinite(step), "arange: step must be finite and non-zero, got ",
              step);
  const double span = (end - start) / step;
  // Checked before the conversion: a NaN or out-of-range double to int64_t is undefined.
  REGEN_CHECK(std::isfinite(span) && span < 0x1p62, "arange(", start, ", ", end, ", ", step,
              "): the number of elements is not finite or too large");
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  return make_on_host({n}, dtype, device, [&](void* p) {
    with_typed(p, dtype, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      // Computed in double, then converted: the same values for every dtype and device.
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<T>(start + step * static_cast<double>(i));
      }
    });
  });
}

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype,
               Device device) {
  check_shape(shape, dtype, "uniform");
  REGEN_CHECK(is_floating(dtype), "uniform: dtype must be a float (f32, f64, bf16, f16), got ",
              dtype_name(dtype));
  REGEN_CHECK(std::isfinite(low) && std::isfinite(high), "uniform: bounds must be finite, got [",
              low, ", ", high, ")");
  REGEN_CHECK(low <= high, "uniform: low ", low, " > high ", high);
  // A 16-bit float takes the f32 draw, rounded: the same stream position as f32 advances.
  if (is_low_precision(dtype)) return uniform(shape, low, high, gen, DType::f32, device).to(dtype);
  const int64_t n = shape_numel(shape);
  const uint64_t seed = gen.seed, base = gen.offset;
  const uint64_t words =
      dtype == DType::f32 ? static_cast<uint64_t>(n) : 2 * static_cast<uint64_t>(n);
  gen.offset += words;
  return make_on_host(shape, dtype, device, [&](void* p) {
    if (dtype == DType::f32) {
      float* out = static_cast<float*>(p);
      const float lo = static_cast<float>(low), width = static_cast<float>(high - low);
      const float top = below_f32(high, lo);
      for (int64_t i = 0; i < n; ++i) {
        const float u = philox_uniform01(philox_word(seed, 0, base + i));
        // lo + u * width can round up to high itself; [low, high) excludes it.
        out[i] = std::min(std::fma(u, width, lo), top);
      }
    } else {
      double* out = static_cast<double*>(p);
      const double top = low < high ? std::nextafter(high, low) : low;
      for (int64_t i = 0; i < n; ++i) {
        const double u = philox_uniform01_f64(philox_word(seed, 0, base + 2 * i),
                                              philox_word(seed, 0, base + 2 * i + 1));
        out[i] = std::min(std::fma(u, high - low, low), top);
      }
    }
  });
}

Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype,
              Device device) {
  check_shape(shape, dtype, "normal");
  REGEN_CHECK(is_floating(dtype), "normal: dtype must be a float (f32, f64, bf16, f16), got ",
              dtype_name(dtype));
  REGEN_CHECK(stddev >= 0, "normal: stddev must be non-negative, got ", stddev);
  const int64_t n = shape_numel(shape);
  const uint64_t seed = gen.seed, base = gen.offset;
  // Box-Muller on pairs, in double on the host for every device: two words per element pair of
  // uniforms, so the stream position advances by 2 * ceil(n / 2) * 2 words.
  const int64_t pairs = (n + 1) / 2;
  gen.offset += static_cast<uint64_t>(pairs) * 4;
  return make_on_host(shape, dtype, device, [&](void* p) {
    with_typed(p, dtype, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      for (int64_t k = 0; k < pairs; ++k) {
        const uint64_t w = base + 4 * static_cast<uint64_t>(k);
        double u1 = philox_uniform01_f64(philox_word(seed, 0, w), philox_word(seed, 0, w + 1));
        const double u2 =
            philox_uniform01_f64(philox_word(seed, 0, w + 2), philox_word(seed, 0, w + 3));
        if (u1 < 1e-300) u1 = 1e-300;
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double theta = 2.0 * M_PI * u2;
        // Computed in double, then converted; an odd n drops the last sine.
        out[2 * k] = static_cast<T>(mean + stddev * r * std::cos(theta));
        if (2 * k + 1 < n) out[2 * k + 1] = static_cast<T>(mean + stddev * r * std::sin(theta));
      }
    });
  });
}

Tensor randint(const Shape& shape, int64_t n, Generator& gen, DType dtype, Device device) {
  check_shape(shape, dtype, "randint");
  REGEN_CHECK(n > 0, "randint: upper bound must be positive, got ", n);
  REGEN_CHECK(dtype == DType::i32 || dtype == DType::i64, "randint: dtype must be i32 or i64");
  const int64_t count = shape_numel(shape);
  const uint64_t seed = gen.seed, base = gen.offset;
  gen.offset += 2 * static_cast<uint64_t>(count);
  return make_on_host(shape, dtype, device, [&](void* p) {
    with_typed(p, dtype, [&](auto* out) {
      using T = std::remove_pointer_t<decltype(out)>;
      for (int64_t i = 0; i < count; ++i) {
        const uint64_t r = (static_cast<uint64_t>(philox_word(seed, 0, base + 2 * i)) << 32) |
                           philox_word(seed, 0, base + 2 * i + 1);
        out[i] = static_cast<T>(static_cast<int64_t>(r % static_cast<uint64_t>(n)));
      }
    });
  });
}

}  // namespace regen
