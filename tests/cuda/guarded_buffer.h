// A device array with canary bytes on each side, for the CUDA kernel suites
// (tests/cuda/test_cuda_ops.cpp, test_cuda_conv_tc.cpp, test_cuda_attention_tc.cpp): filled from a
// host vector, poisoned with NaN bytes before a kernel writes it, read back, and its canaries
// counted. Its storage comes from regen's allocator (a Storage on cuda:0), on a GPU and in the
// emulation.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "regen/core/cuda/runtime.h"
#include "regen/core/tensor.h"

namespace regen::test {

constexpr size_t kGuard = 64;  // elements of canary on each side (the data stays 16-byte aligned)
constexpr unsigned char kCanary = 0xA5;  // every canary byte
constexpr unsigned char kPoison = 0xFF;  // outputs start as all-ones bytes: a NaN for floats

// A device array of n elements of T, with kGuard canary elements before and after it. With
// `misalign` the data starts one element later, so 16-byte-aligned fast paths are not taken.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n, bool misalign = false)
      : n_(n), offset_(kGuard + (misalign ? 1 : 0)), total_(n + 2 * kGuard + 1) {
    storage_ = std::make_shared<Storage>(Device::cuda(0), total_ * sizeof(T), Category::other);
    std::vector<unsigned char> bytes(total_ * sizeof(T), kCanary);
    cuda::memcpy(storage_->data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  DeviceArray(const std::vector<T>& values, bool misalign = false)
      : DeviceArray(values.size(), misalign) {
    upload(values);
  }
  T* ptr() const { return static_cast<T*>(storage_->data()) + offset_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& values) {
    REQUIRE(values.size() == n_);
    cuda::memcpy(ptr(), values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  void poison() {
    std::vector<unsigned char> bytes(n_ * sizeof(T), kPoison);
    cuda::memcpy(ptr(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    cuda::memcpy(out.data(), ptr(), n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  // Number of canary bytes that changed.
  size_t damaged_canaries() const {
    std::vector<unsigned char> bytes(total_ * sizeof(T));
    cuda::memcpy(bytes.data(), storage_->data(), bytes.size(), cudaMemcpyDeviceToHost);
    size_t bad = 0;
    const size_t lo = offset_ * sizeof(T), hi = (offset_ + n_) * sizeof(T);
    for (size_t i = 0; i < bytes.size(); ++i) {
      if ((i < lo || i >= hi) && bytes[i] != kCanary) ++bad;
    }
    return bad;
  }

 private:
  size_t n_, offset_, total_;
  std::shared_ptr<Storage> storage_;
};

}  // namespace regen::test
