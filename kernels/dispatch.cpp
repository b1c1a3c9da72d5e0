// The dispatch helpers of kernels/kernels.h.
#include <chrono>

#include "regen/core/error.h"
#include "regen/kernels/kernels.h"
#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace regen::kernels {

void unsupported(const char* launcher, Device device, DType dtype) {
#ifdef REGEN_WITH_CUDA
  REGEN_FAIL("kernel ", launcher, " has no ", device.str(), " implementation for ",
             dtype_name(dtype), " (CUDA kernels are float32 only)");
#else
  REGEN_FAIL("kernel ", launcher, " cannot run on ", device.str(), " (", dtype_name(dtype),
             "): regen was built without CUDA support");
#endif
}

void use_device(Device device) {
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) cuda::set_device(device.index);
#else
  (void)device;
#endif
}

void synchronize(Device device) {
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::set_device(device.index);
    cuda::synchronize();
  }
#else
  (void)device;
#endif
}

void after_cuda_launcher(const char* launcher) {
#ifdef REGEN_WITH_CUDA
  if (dry_run_active()) return;  // a dry path queued nothing
  if (cuda::sync_launches()) cuda::check_launch_completed(launcher);
#else
  (void)launcher;
#endif
}

struct DeviceTimeline::Impl {
  Device device;
  std::vector<std::chrono::steady_clock::time_point> host;
#ifdef REGEN_WITH_CUDA
  cuda::StreamTimeline stream;
#endif
};

DeviceTimeline::DeviceTimeline(Device device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
}
DeviceTimeline::~DeviceTimeline() = default;
DeviceTimeline::DeviceTimeline(DeviceTimeline&&) noexcept = default;
DeviceTimeline& DeviceTimeline::operator=(DeviceTimeline&&) noexcept = default;

void DeviceTimeline::mark() {
#ifdef REGEN_WITH_CUDA
  if (impl_->device.is_cuda()) {
    cuda::set_device(impl_->device.index);
    impl_->stream.record();
    return;
  }
#endif
  impl_->host.push_back(std::chrono::steady_clock::now());
}

std::vector<double> DeviceTimeline::elapsed() {
#ifdef REGEN_WITH_CUDA
  if (impl_->device.is_cuda()) {
    cuda::set_device(impl_->device.index);
    return impl_->stream.elapsed();
  }
#endif
  std::vector<double> out(impl_->host.size(), 0.0);
  for (size_t i = 1; i < out.size(); ++i) {
    out[i] = std::chrono::duration<double, std::milli>(impl_->host[i] - impl_->host[0]).count();
  }
  return out;
}

void DeviceTimeline::clear() {
  impl_->host.clear();
#ifdef REGEN_WITH_CUDA
  impl_->stream.clear();
#endif
}

void prepare_device(Device device) {
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::set_device(device.index);
    cuda::stream();
    cuda::prepare_blas();
  }
#else
  (void)device;
#endif
}

}  // namespace regen::kernels
