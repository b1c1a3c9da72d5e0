// The arenas a CachingAllocator maps its segments from: the CPU's (mmap), the recycling one,
// the Null arena of the simulator and the dry run, and the direct arena of sanitizer runs, which
// maps every block on its own (allocator.h).
#include "regen/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <sys/mman.h>

#include "regen/core/error.h"

namespace regen {

// ---- Arenas -----------------------------------------------------------------------------------

namespace {
class CpuArena final : public Arena {
 public:
  // Segments come straight from mmap, 2 MiB-aligned, with transparent huge pages requested
  // (madvise; a no-op where THP is off). Every segment size is a multiple of 2 MiB (see the
  // rounding constants above), so a segment is a whole number of huge pages. Why: the allocator
  // returns its segments to the OS at empty_cache() (the trainer's canonical start of each step),
  // and with 4 KiB pages refaulting ResNet-152's 1.3 GiB every step cost more system time than
  // the step's convolutions; with 2 MiB pages the kernel takes 512x fewer faults. Smaller
  // requests than 2 MiB (none from this allocator's segment sizes) fall back to posix_memalign.
  void* map(size_t bytes) override {
    if (bytes % kHugePage != 0) {
      void* p = nullptr;
      if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
      return p;
    }
    // Over-map by one huge page, then trim the unaligned head and the tail.
    const size_t span = bytes + kHugePage;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + span, used_end = aligned + bytes;
    if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
    void* base = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
    madvise(base, bytes, MADV_HUGEPAGE);
#endif
    return base;
  }
  void unmap(void* base, size_t bytes) override {
    if (bytes % kHugePage != 0) {
      std::free(base);
    } else {
      munmap(base, bytes);
    }
  }
  Device device() const override {
    return Device::cpu();
  }
  std::string name() const override {
    return "cpu";
  }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
};

// The CPU's memory for one block in direct mode: exactly the requested bytes from the C heap,
// which AddressSanitizer tracks to the byte (an mmap'd or rounded region would hide an overrun).
class HostBlockArena final : public Arena {
 public:
  void* map(size_t bytes) override {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) return nullptr;
    return p;
  }
  void unmap(void* base, size_t) override { std::free(base); }
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }
};

class NullArena final : public Arena {
 public:
  explicit NullArena(Device d) : device_(d) {}
  void* map(size_t bytes) override {
    const uintptr_t base = next_;
    const uintptr_t align = CachingAllocator::kRoundLarge;
    next_ += (bytes + align - 1) / align * align;
    return reinterpret_cast<void*>(base);
  }
  void unmap(void*, size_t) override {}
  Device device() const override { return device_; }
  std::string name() const override { return "null(" + device_.str() + ")"; }
  bool touches_memory() const override { return false; }

 private:
  Device device_;
  uintptr_t next_ = uintptr_t{1} << 44;
};

// Direct mode: the segments are the Null arena's synthetic addresses (the allocator keeps its
// bookkeeping, its decisions and its statistics), and each block's memory comes from `blocks_`.
class DirectArena final : public Arena {
 public:
  explicit DirectArena(std::unique_ptr<Arena> blocks)
      : blocks_(std::move(blocks)), segments_(blocks_->device()) {}
  void* map(size_t bytes) override { return segments_.map(bytes); }
  void unmap(void* base, size_t bytes) override { segments_.unmap(base, bytes); }
  Device device() const override { return blocks_->device(); }
  std::string name() const override { return blocks_->name() + " (direct)"; }
  bool touches_memory() const override { return true; }
  bool maps_blocks() const override { return true; }
  void* map_block(size_t bytes) override { return blocks_->map(bytes); }
  void unmap_block(void* p, size_t bytes) override { blocks_->unmap(p, bytes); }

 private:
  std::unique_ptr<Arena> blocks_;
  NullArena segments_;
};
}  // namespace

class RecyclingArena final : public Arena {
 public:
  explicit RecyclingArena(std::unique_ptr<Arena> inner) : inner_(std::move(inner)) {}
  ~RecyclingArena() override { release_retained(); }

  void* map(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = parked_.find(bytes);
    if (it != parked_.end()) {
      void* base = it->second;
      parked_.erase(it);
      parked_bytes_ -= bytes;
      mapped_bytes_ += bytes;
      return base;
    }
    // A new segment: first give back parked ones that would push the footprint past the high
    // water mark this map sets (largest first, so as few as possible go).
    const uint64_t high = std::max<uint64_t>(high_water_, mapped_bytes_ + bytes);
    while (!parked_.empty() && mapped_bytes_ + parked_bytes_ + bytes > high) {
      release_one_locked(std::prev(parked_.end()));
    }
    void* base = inner_->map(bytes);
    if (!base && !parked_.empty()) {  // out of memory: everything parked goes back, then retry
      release_all_locked();
      base = inner_->map(bytes);
    }
    if (!base) return nullptr;
    mapped_bytes_ += bytes;
    high_water_ = std::max(high_water_, mapped_bytes_);
    return base;
  }
  void unmap(void* base, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    mapped_bytes_ -= bytes;
    parked_.emplace(bytes, base);
    parked_bytes_ += bytes;
  }
  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name() + " (recycling)"; }
  bool touches_memory() const override { return inner_->touches_memory(); }
  uint64_t retained_bytes() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return parked_bytes_;
  }
  void release_retained() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_all_locked();
  }

 private:
  void release_all_locked() {
    while (!parked_.empty()) release_one_locked(std::prev(parked_.end()));
  }
  void release_one_locked(std::multimap<size_t, void*>::iterator it) {
    inner_->unmap(it->second, it->first);
    parked_bytes_ -= it->first;
    parked_.erase(it);
  }

  std::unique_ptr<Arena> inner_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> parked_;  // size -> base
  uint64_t parked_bytes_ = 0, mapped_bytes_ = 0, high_water_ = 0;
};

std::unique_ptr<Arena> make_cpu_arena() {
  return std::make_unique<CpuArena>();
}
std::unique_ptr<Arena> make_recycling_arena(std::unique_ptr<Arena> inner) {
  return std::make_unique<RecyclingArena>(std::move(inner));
}
std::unique_ptr<Arena> make_null_arena(Device device) {
  return std::make_unique<NullArena>(device);
}
std::unique_ptr<Arena> make_direct_arena(std::unique_ptr<Arena> blocks) {
  REGEN_CHECK(blocks != nullptr && blocks->touches_memory() && !blocks->maps_blocks(),
              "make_direct_arena needs an arena that maps memory for its blocks");
  return std::make_unique<DirectArena>(std::move(blocks));
}
std::unique_ptr<Arena> make_device_arena(Device device) {
  if (device.is_cpu()) return make_cpu_arena();
#ifdef REGEN_WITH_CUDA
  return make_cuda_arena(device.index);
#else
  REGEN_FAIL("device ", device.str(),
             " is not available: regen was built without CUDA support (REGEN_CUDA=OFF or no nvcc)");
#endif
}
namespace {
// An arena under another name (the host tier's: its reports must not read "cpu").
class RenamedArena final : public Arena {
 public:
  RenamedArena(std::unique_ptr<Arena> inner, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)) {}
  void* map(size_t bytes) override { return inner_->map(bytes); }
  void unmap(void* base, size_t bytes) override { inner_->unmap(base, bytes); }
  Device device() const override { return inner_->device(); }
  std::string name() const override { return name_; }
  bool touches_memory() const override { return inner_->touches_memory(); }
  uint64_t retained_bytes() const override { return inner_->retained_bytes(); }
  void release_retained() override { inner_->release_retained(); }
  bool maps_blocks() const override { return inner_->maps_blocks(); }
  void* map_block(size_t bytes) override { return inner_->map_block(bytes); }
  void unmap_block(void* p, size_t bytes) override { inner_->unmap_block(p, bytes); }

 private:
  std::unique_ptr<Arena> inner_;
  std::string name_;
};
}  // namespace

std::unique_ptr<Arena> make_host_tier_arena(Device device, bool direct) {
  const std::string name = "host tier of " + device.str();
  // Direct mode: every block from the C heap (pageable on CUDA: a copy then waits for the host,
  // which a sanitizer run does not time).
  if (direct) {
    if (!device.is_cpu()) make_device_arena(device);  // the device must exist all the same
    return std::make_unique<RenamedArena>(make_direct_arena(Device::cpu()), name + " (direct)");
  }
  if (device.is_cpu()) return std::make_unique<RenamedArena>(make_cpu_arena(), name);
#ifdef REGEN_WITH_CUDA
  return std::make_unique<RenamedArena>(make_pinned_host_arena(device.index), name);
#else
  REGEN_FAIL("device ", device.str(),
             " is not available: regen was built without CUDA support (REGEN_CUDA=OFF or no nvcc)");
#endif
}

std::unique_ptr<Arena> make_direct_arena(Device device) {
  // A CUDA arena maps exactly what it is asked for; the CPU's rounds to huge pages, so blocks
  // there come from the C heap instead.
  if (device.is_cpu()) return make_direct_arena(std::make_unique<HostBlockArena>());
  return make_direct_arena(make_device_arena(device));
}

}  // namespace regen
