// The process-wide allocators (allocator_for), the exit check of live allocations and the
// thread's dry run (allocator.h).
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

#include "regen/core/error.h"

namespace regen {

// ---- Process-wide allocators ------------------------------------------------------------------

namespace {
// Every process-wide allocator, in creation order. Never destroyed, like the allocators.
struct Registry {
  std::mutex mutex;
  std::vector<CachingAllocator*> allocators;
  std::set<uint32_t> ignored_tags;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// -1: not chosen yet (the first allocator reads REGEN_EXIT_CHECK, else the build's default).
std::atomic<int> g_exit_check{-1};

ExitCheck default_exit_check() {
  if (const char* env = std::getenv("REGEN_EXIT_CHECK")) {
    const std::string v(env);
    if (v == "off") return ExitCheck::off;
    if (v == "warn") return ExitCheck::warn;
    if (v == "fail") return ExitCheck::fail;
    std::fprintf(stderr, "regen: REGEN_EXIT_CHECK='%s' is not off, warn or fail; ignored\n", env);
  }
#ifdef NDEBUG
  return ExitCheck::off;
#else
  return ExitCheck::warn;
#endif
}

void exit_check_handler() {
  const int mode = g_exit_check.load();
  if (mode <= static_cast<int>(ExitCheck::off)) return;
  std::string report;
  try {
    report = live_allocations_report();
  } catch (...) {
    return;  // never throw out of exit
  }
  if (report.empty()) return;
  std::fprintf(stderr, "regen: at exit, memory is still allocated:\n%s", report.c_str());
  std::fflush(stderr);
  if (mode == static_cast<int>(ExitCheck::fail)) std::_Exit(3);
}

// Registers the exit check once, when the first process-wide allocator is created: static
// objects constructed later (a static tensor) are destroyed before it runs.
void install_exit_check() {
  static std::once_flag once;
  std::call_once(once, [] {
    int unset = -1;
    g_exit_check.compare_exchange_strong(unset, static_cast<int>(default_exit_check()));
    std::atexit(exit_check_handler);
  });
}

// REGEN_ALLOC_DIRECT=1: the process-wide allocators map every block on its own
// (make_direct_arena), for sanitizer runs. Read once, when the first of them is created; like
// REGEN_EXIT_CHECK, another value is reported (once) and ignored.
bool direct_from_env() {
  static const bool direct = [] {
    const char* env = std::getenv("REGEN_ALLOC_DIRECT");
    if (!env) return false;
    const std::string v(env);
    if (v == "0") return false;
    if (v == "1") return true;
    std::fprintf(stderr,
                 "regen: REGEN_ALLOC_DIRECT='%s' is not 0 or 1; ignored (blocks share cached "
                 "segments as usual)\n",
                 env);
    return false;
  }();
  return direct;
}

// The arena of a process-wide allocator: the device's own behind a recycling arena, or in direct
// mode the direct arena (a recycling one would hide reuse from the sanitizers).
std::unique_ptr<Arena> process_arena(Device device) {
  if (direct_from_env()) return make_direct_arena(device);
  return make_recycling_arena(make_device_arena(device));
}

CachingAllocator* register_allocator(CachingAllocator* a) {
  install_exit_check();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.allocators.push_back(a);
  return a;
}
}  // namespace

void set_exit_check(ExitCheck mode) {
  g_exit_check.store(static_cast<int>(mode));
  install_exit_check();
}

ExitCheck exit_check() {
  const int mode = g_exit_check.load();
  return mode < 0 ? default_exit_check() : static_cast<ExitCheck>(mode);
}

void exit_check_ignore_tag(std::string_view tag) {
  const uint32_t id = intern_tag(tag);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ignored_tags.insert(id);
}

std::string live_allocations_report() {
  std::vector<CachingAllocator*> allocators;
  std::set<uint32_t> ignored;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    allocators = r.allocators;
    ignored = r.ignored_tags;
  }
  std::ostringstream os;
  for (const CachingAllocator* a : allocators) {
    std::vector<BlockInfo> live;
    std::array<int64_t, kNumCategories> by{};
    int64_t total = 0;
    for (const BlockInfo& b : a->snapshot()) {
      if (!b.allocated || ignored.count(b.tag)) continue;
      live.push_back(b);
      by[static_cast<int>(b.category)] += static_cast<int64_t>(b.size);
      total += static_cast<int64_t>(b.size);
    }
    if (live.empty()) continue;
    os << "  " << a->arena().name() << ": " << live.size() << " live block(s), "
       << format_bytes(total) << "; by category:";
    for (int i = 0; i < kNumCategories; ++i) {
      if (!by[i]) continue;
      os << " " << category_name(static_cast<Category>(i)) << " " << format_bytes(by[i]) << ";";
    }
    std::stable_sort(live.begin(), live.end(),
                     [](const BlockInfo& x, const BlockInfo& y) { return x.size > y.size; });
    for (size_t i = 0; i < live.size() && i < 8; ++i) {
      os << "\n    " << format_bytes(static_cast<int64_t>(live[i].size)) << " "
         << category_name(live[i].category) << " '"
         << (live[i].tag ? tag_name(live[i].tag) : std::string("untagged")) << "' (block "
         << live[i].id << ")";
    }
    os << "\n";
  }
  return os.str();
}

namespace {
thread_local bool g_dry_run = false;
thread_local CachingAllocator* g_dry_run_allocator = nullptr;
thread_local Device g_dry_run_device = Device::cpu();
}  // namespace

bool dry_run_active() {
  return g_dry_run;
}

DryRunScope::DryRunScope(Device device) {
  REGEN_CHECK(!dry_run_active(), "a dry run is already under way on this thread");
  alloc_ = std::make_unique<CachingAllocator>(make_null_arena(device));
  // What the device keeps for the process (blocks with an exit-check-ignored tag), in the order it
  // was requested. Only a process-wide allocator that exists already is read: none, nothing kept.
  std::vector<CachingAllocator*> allocators;
  std::set<uint32_t> ignored;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    allocators = r.allocators;
    ignored = r.ignored_tags;
  }
  std::vector<BlockInfo> kept;
  for (const CachingAllocator* a : allocators) {
    if (a->device() != device) continue;
    for (const BlockInfo& b : a->snapshot()) {
      if (b.allocated && ignored.count(b.tag)) kept.push_back(b);
    }
  }
  std::sort(kept.begin(), kept.end(),
            [](const BlockInfo& x, const BlockInfo& y) { return x.id < y.id; });
  for (const BlockInfo& b : kept) kept_.push_back(alloc_->allocate(b.requested, b.category, b.tag));
  kept_bytes_ = alloc_->stats().allocated.current;
  g_dry_run_allocator = alloc_.get();
  g_dry_run_device = device;
  g_dry_run = true;
}

DryRunScope::~DryRunScope() {
  g_dry_run = false;
  g_dry_run_allocator = nullptr;
  for (Block* b : kept_) alloc_->free(b);
}

CachingAllocator& allocator_for(Device device) {
  if (dry_run_active() && device == g_dry_run_device) return *g_dry_run_allocator;
  if (device.is_cpu()) {
    // Never destroyed: tensors in static storage may be released after main() returns.
    static CachingAllocator* cpu =
        register_allocator(new CachingAllocator(process_arena(Device::cpu())));
    return *cpu;
  }
#ifdef REGEN_WITH_CUDA
  static std::mutex mutex;
  static auto* per_device = new std::vector<CachingAllocator*>();
  std::lock_guard<std::mutex> lock(mutex);
  REGEN_CHECK(device.index >= 0 && device.index < 64, "bad CUDA device index ", device.index);
  if (static_cast<int>(per_device->size()) <= device.index) {
    per_device->resize(device.index + 1, nullptr);
  }
  CachingAllocator*& a = (*per_device)[device.index];
  if (!a) {
    a = register_allocator(new CachingAllocator(process_arena(device)));
  }
  return *a;
#else
  REGEN_FAIL("device ", device.str(),
             " is not available: regen was built without CUDA support (REGEN_CUDA=OFF or no nvcc)");
#endif
}

CachingAllocator& host_allocator_for(Device device) {
  static std::mutex mutex;
  static auto* tiers = new std::map<std::string, CachingAllocator*>();
  std::lock_guard<std::mutex> lock(mutex);
  CachingAllocator*& a = (*tiers)[device.str()];
  if (!a) {
    const bool direct = direct_from_env();
    std::unique_ptr<Arena> arena = make_host_tier_arena(device, direct);
    if (!direct) arena = make_recycling_arena(std::move(arena));
    a = register_allocator(new CachingAllocator(std::move(arena)));
  }
  return *a;
}

}  // namespace regen
