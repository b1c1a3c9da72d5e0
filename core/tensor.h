// Tensor: a shape, a dtype, a device and a refcounted Storage that comes from the device's
// caching allocator. Tensors are always contiguous (row-major); reshape/view and narrow0 share
// storage, everything else produces new storage. Tests: tests/test_core.cpp.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/types.h"

namespace regen {

// Bytes from a device's allocator, released when the last reference goes.
class Storage {
 public:
  // Allocates with the current CategoryScope/TagScope. Zero bytes allocate nothing.
  Storage(Device device, uint64_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return block_ ? block_->ptr() : nullptr; }
  uint64_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // The allocator's id for this allocation (0 for an empty storage).
  uint64_t alloc_id() const { return block_ ? block_->id() : 0; }
  Category category() const { return block_ ? block_->category : Category::other; }

 private:
  Device device_;
  uint64_t bytes_;
  CachingAllocator* allocator_;
  Block* block_ = nullptr;
};

class Tensor;

// Everything a tensor is. Autograd fields live here so that core needs no autograd types;
// autograd/ gives them meaning (docs/architecture.md).
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  uint64_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::f32;
  Device device;

  // Autograd: set by autograd/ only.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  int64_t tape_value = -1;           // value id on the tape that produced or registered it
  uint64_t tape_epoch = 0;           // which recording of the tape the id belongs to
  std::string name;                  // parameter name, for messages and checkpoints
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return checked()->shape; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->device; }
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype()); }
  std::string str() const;  // "f32[2, 3] on cpu"

  // Typed pointer to the first element; checks the dtype. On CUDA this is a device pointer.
  template <class T>
  T* data() const {
    REGEN_CHECK(dtype() == dtype_of<T>::value, "tensor ", str(), " accessed as ",
                dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  // True while the tensor has its bytes (false after the remat runtime evicted them).
  bool has_storage() const { return defined() && (impl_->storage != nullptr || numel() == 0); }

  // Views share storage. reshape accepts one -1 dimension.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }
  // Rows [start, start + length) of dimension 0, sharing storage.
  Tensor narrow0(int64_t start, int64_t length) const;

  Tensor clone() const;                  // new storage, same device
  Tensor to(Device device) const;        // copy to another device (or the same one)
  Tensor to(DType dtype) const;          // element-wise conversion, same device
  void copy_from(const Tensor& src);     // same shape and dtype, any devices

  // Read-back helpers (copy to the host when needed).
  template <class T>
  std::vector<T> to_vector() const;
  template <class T>
  T item() const;

  // Autograd flags (meaningful for leaves such as parameters).
  bool requires_grad() const { return checked()->requires_grad; }
  Tensor& set_requires_grad(bool on);
  Tensor grad() const;
  const std::string& name() const { return checked()->name; }

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  TensorImpl* checked() const {
    REGEN_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return impl_.get();
  }
  std::shared_ptr<TensorImpl> impl_;
};

// ---- Creation -------------------------------------------------------------------------------

// A Philox stream position: seed plus the number of elements drawn so far.
struct Generator {
  uint64_t seed = 0;
  uint64_t offset = 0;
  explicit Generator(uint64_t s = 0) : seed(s) {}
};

Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
            Device device = Device::cpu());
// 0, 1, ..., n-1 and start, start+step, ... < end.
Tensor arange(int64_t n, DType dtype = DType::f32, Device device = Device::cpu());
Tensor arange(double start, double end, double step, DType dtype = DType::f32,
              Device device = Device::cpu());
// Uniform in [low, high) and normal(mean, stddev), from gen; gen.offset advances by the number
// of Philox words used, so the same (seed, offset) gives the same tensor on every device.
Tensor uniform(const Shape& shape, double low, double high, Generator& gen,
               DType dtype = DType::f32, Device device = Device::cpu());
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen,
              DType dtype = DType::f32, Device device = Device::cpu());
// Integers uniform in [0, n).
Tensor randint(const Shape& shape, int64_t n, Generator& gen, DType dtype = DType::i64,
               Device device = Device::cpu());

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                   Device device = Device::cpu());

// Fills an existing tensor (any device).
void fill_(const Tensor& t, double value);
void zero_(const Tensor& t);

// Copies nbytes between host/device pointers (used by Tensor::to and copy_from).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, uint64_t nbytes);

// ---- Templates --------------------------------------------------------------------------------

template <class T>
std::vector<T> Tensor::to_vector() const {
  REGEN_CHECK(dtype() == dtype_of<T>::value, "to_vector: tensor ", str(), " read as ",
              dtype_name(dtype_of<T>::value));
  REGEN_CHECK(has_storage(), "to_vector: tensor ", str(), " has no storage (evicted?)");
  std::vector<T> out(static_cast<size_t>(numel()));
  if (!out.empty()) copy_bytes(out.data(), Device::cpu(), raw_data(), device(), nbytes());
  return out;
}

template <class T>
T Tensor::item() const {
  REGEN_CHECK(numel() == 1, "item: tensor ", str(), " has ", numel(), " elements, expected 1");
  return to_vector<T>()[0];
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  REGEN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ",
              values.size(), " values do not fill shape ", sh(shape));
  Tensor t = empty(shape, dtype_of<T>::value, device);
  if (!values.empty()) copy_bytes(t.raw_data(), device, values.data(), Device::cpu(), t.nbytes());
  return t;
}

}  // namespace regen
