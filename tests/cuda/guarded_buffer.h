// A device array with canary bytes on each side, for the tensor-core suites
// (tests/cuda/test_cuda_conv_tc.cpp, tests/cuda/test_cuda_attention_tc.cpp): filled from a host
// vector, poisoned with NaN bytes before a kernel writes it, read back, and its canaries counted.
// Its storage comes from regen's allocator (a Storage on cuda:0), on a GPU and in the emulation.
#pragma once

#include <memory>
#include <vector>

#include "regen/core/cuda/runtime.h"
#include "regen/core/tensor.h"

namespace regen::test {

// A device array of n elements with 64 canary bytes on each side.
template <class T>
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n) {
    storage_ =
        std::make_shared<Storage>(Device::cuda(0), n * sizeof(T) + 2 * kGuard, Category::other);
    std::vector<unsigned char> bytes(n * sizeof(T) + 2 * kGuard, kCanary);
    cuda::memcpy(storage_->data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  explicit Buffer(const std::vector<T>& v) : Buffer(v.size()) {
    cuda::memcpy(ptr(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  T* ptr() const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(storage_->data()) + kGuard);
  }
  void poison() {
    std::vector<unsigned char> bytes(n_ * sizeof(T), 0xFF);  // NaN in every float type here
    cuda::memcpy(ptr(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    cuda::memcpy(out.data(), ptr(), n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  size_t damaged_canaries() const {
    std::vector<unsigned char> bytes(n_ * sizeof(T) + 2 * kGuard);
    cuda::memcpy(bytes.data(), storage_->data(), bytes.size(), cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < kGuard; ++i) {
      bad += bytes[i] != kCanary;
      bad += bytes[kGuard + n_ * sizeof(T) + i] != kCanary;
    }
    return bad;
  }

 private:
  static constexpr size_t kGuard = 64;  // a multiple of 16: the data stays 16-byte aligned
  static constexpr unsigned char kCanary = 0xA5;
  size_t n_;
  std::shared_ptr<Storage> storage_;
};

}  // namespace regen::test
