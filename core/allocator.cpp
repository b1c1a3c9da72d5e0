// The caching allocator (allocator.h). Constants and statistics are explained in docs/memory.md.
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

struct Segment {
  uint64_t id = 0;
  uintptr_t base = 0;
  uint64_t size = 0;
  bool small = false;
  Category category = Category::other;  // category of the request that mapped it
  Block* head = nullptr;
};

void* Block::ptr() const { return reinterpret_cast<void*>(segment->base + offset); }

// ---- Categories, scopes, tags ---------------------------------------------------------------

const char* category_name(Category c) {
  switch (c) {
    case Category::parameter: return "parameter";
    case Category::gradient: return "gradient";
    case Category::optimizer_state: return "optimizer_state";
    case Category::activation: return "activation";
    case Category::workspace: return "workspace";
    case Category::input: return "input";
    case Category::other: return "other";
  }
  return "?";
}

Category parse_category(const std::string& name) {
  for (int i = 0; i < kNumCategories; ++i) {
    if (name == category_name(static_cast<Category>(i))) return static_cast<Category>(i);
  }
  REGEN_FAIL("unknown memory category '", name,
             "': expected parameter, gradient, optimizer_state, activation, workspace, input or "
             "other");
}

namespace {
thread_local Category tl_category = Category::other;
thread_local uint32_t tl_tag = 0;

struct TagTable {
  std::mutex mutex;
  std::vector<std::string> names{""};
  std::unordered_map<std::string, uint32_t> ids{{"", 0}};
};
TagTable& tag_table() {
  static TagTable* table = new TagTable();  // never destroyed: tags outlive static tensors
  return *table;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace

Category current_category() { return tl_category; }
uint32_t current_tag() { return tl_tag; }

CategoryScope::CategoryScope(Category c) : saved_(tl_category) { tl_category = c; }
CategoryScope::~CategoryScope() { tl_category = saved_; }
TagScope::TagScope(std::string_view tag) : saved_(tl_tag) { tl_tag = intern_tag(tag); }
TagScope::TagScope(uint32_t tag_id) : saved_(tl_tag) { tl_tag = tag_id; }
TagScope::~TagScope() { tl_tag = saved_; }

uint32_t intern_tag(std::string_view tag) {
  TagTable& t = tag_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.ids.find(std::string(tag));
  if (it != t.ids.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(t.names.size());
  t.names.emplace_back(tag);
  t.ids.emplace(std::string(tag), id);
  return id;
}

std::string tag_name(uint32_t id) {
  TagTable& t = tag_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return id < t.names.size() ? t.names[id] : std::string("<bad tag>");
}

const char* memory_event_name(MemoryEventKind k) {
  switch (k) {
    case MemoryEventKind::alloc: return "alloc";
    case MemoryEventKind::free: return "free";
    case MemoryEventKind::segment_map: return "segment_map";
    case MemoryEventKind::segment_unmap: return "segment_unmap";
  }
  return "?";
}

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
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
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

std::unique_ptr<Arena> make_cpu_arena() { return std::make_unique<CpuArena>(); }
std::unique_ptr<Arena> make_recycling_arena(std::unique_ptr<Arena> inner) {
  return std::make_unique<RecyclingArena>(std::move(inner));
}
std::unique_ptr<Arena> make_null_arena(Device device) {
  return std::make_unique<NullArena>(device);
}

// ---- CachingAllocator -------------------------------------------------------------------------

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  // Best fit by size; ties broken by segment number and offset, never by address, so that every
  // arena makes the same choice.
  if (a->size != b->size) return a->size < b->size;
  if (a->segment->id != b->segment->id) return a->segment->id < b->segment->id;
  return a->offset < b->offset;
}

uint64_t CachingAllocator::round_size(uint64_t bytes) {
  // Without the bound, bytes near 2^64 wrap to a block of 0 bytes.
  REGEN_CHECK(bytes <= kMaxRequestSize, "allocator: a request of ", bytes,
              " bytes exceeds the largest request served, ", format_bytes(kMaxRequestSize));
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

uint64_t CachingAllocator::segment_size(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return min_segment_size(rounded);
}

uint64_t CachingAllocator::min_segment_size(uint64_t rounded) {
  // The granularity of every segment, on every arena: the decision must not depend on the arena.
  if (rounded <= kSmallSize) return kSmallBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::CachingAllocator(std::unique_ptr<Arena> arena) : arena_(std::move(arena)) {
  REGEN_CHECK(arena_ != nullptr, "CachingAllocator needs an arena");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A planned layout's arena and holes go back with their segments only when no planned block
  // is live (its owner may still write to it).
  if (planned_live_.empty()) {
    if (planned_segment_) arena_->unmap(reinterpret_cast<void*>(planned_segment_->base), planned_segment_->size);
    for (Block* h : planned_holes_) h->allocated = false;
  }
  for (Block* b : planned_live_) delete b;
  if (stats_.live_blocks > 0 && arena_->touches_memory()) {
    std::fprintf(stderr, "regen: allocator for %s destroyed with %lld live blocks (%s)\n",
                 arena_->name().c_str(), static_cast<long long>(stats_.live_blocks),
                 format_bytes(stats_.allocated.current).c_str());
  }
  for (auto& s : segments_) {
    // Delete the block list; only fully free segments go back to the arena (a live block's
    // owner may still write to it).
    bool all_free = true;
    for (Block* b = s->head; b; b = b->next) all_free = all_free && !b->allocated;
    Block* b = s->head;
    while (b) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    if (all_free) arena_->unmap(reinterpret_cast<void*>(s->base), s->size);
  }
}

void CachingAllocator::add_stat_locked(Stat& s, int64_t delta) {
  s.current += delta;
  if (s.current > s.peak) s.peak = s.current;
}

void CachingAllocator::record_locked(MemoryEventKind kind, int64_t bytes, int64_t requested,
                                     Category c, uint32_t tag, uint64_t block_id,
                                     uint64_t segment_id) {
  if (!log_enabled_) return;
  MemoryEvent e;
  e.seq = next_seq_++;
  e.kind = kind;
  e.bytes = bytes;
  e.requested = requested;
  e.category = c;
  e.tag = tag;
  e.block_id = block_id;
  e.segment_id = segment_id;
  e.time_ns = now_ns() - log_t0_ns_;
  e.allocated_after = stats_.allocated.current;
  e.reserved_after = stats_.reserved.current;
  events_.push_back(e);
}

Block* CachingAllocator::allocate(uint64_t bytes) {
  return allocate(bytes, current_category(), current_tag());
}

Block* CachingAllocator::try_allocate_locked(uint64_t rounded, bool small) {
  Pool& p = pool(small);
  Block key;
  Segment key_segment;
  key.segment = &key_segment;
  key.size = rounded;
  auto it = p.lower_bound(&key);
  if (it == p.end()) return nullptr;
  Block* b = *it;
  p.erase(it);
  return b;
}

Segment* CachingAllocator::map_segment_locked(uint64_t size, bool small, Category category,
                                              uint32_t tag) {
  if (limit_ > 0 && stats_.reserved.current + static_cast<int64_t>(size) > limit_) return nullptr;
  void* base = arena_->map(size);
  if (!base) return nullptr;
  auto seg = std::make_unique<Segment>();
  seg->id = next_segment_id_++;
  seg->base = reinterpret_cast<uintptr_t>(base);
  seg->size = size;
  seg->small = small;
  seg->category = category;
  Block* b = new Block();
  b->segment = seg.get();
  b->size = size;
  seg->head = b;
  Segment* raw = seg.get();
  segments_.push_back(std::move(seg));
  add_stat_locked(stats_.reserved, static_cast<int64_t>(size));
  add_stat_locked(stats_.reserved_by[static_cast<int>(category)], static_cast<int64_t>(size));
  stats_.num_segment_maps++;
  record_locked(MemoryEventKind::segment_map, static_cast<int64_t>(size), 0, category, tag, 0,
                raw->id);
  return raw;
}

void CachingAllocator::unmap_segment_locked(Segment* s) {
  REGEN_ASSERT(s->head && !s->head->allocated && !s->head->next);
  pool(s->small).erase(s->head);
  arena_->unmap(reinterpret_cast<void*>(s->base), s->size);
  stats_.reserved.current -= static_cast<int64_t>(s->size);
  stats_.reserved_by[static_cast<int>(s->category)].current -= static_cast<int64_t>(s->size);
  stats_.num_segment_unmaps++;
  record_locked(MemoryEventKind::segment_unmap, static_cast<int64_t>(s->size), 0, s->category, 0,
                0, s->id);
  delete s->head;
  s->head = nullptr;
}

void CachingAllocator::release_cached_locked() {
  // Segment order (by id) keeps this deterministic.
  std::vector<std::unique_ptr<Segment>> kept;
  kept.reserve(segments_.size());
  for (auto& s : segments_) {
    if (s->head && !s->head->allocated && !s->head->next) {
      unmap_segment_locked(s.get());
    } else {
      kept.push_back(std::move(s));
    }
  }
  segments_.swap(kept);
}

Segment* CachingAllocator::map_for_request_locked(uint64_t rounded, bool small, Category category,
                                                  uint32_t tag) {
  // The normal segment first (medium requests share 20 MiB segments); when it would pass the
  // limit (or the arena cannot map it), the smallest segment that holds the request. Both sizes
  // and the limit test depend only on the request and the reserved bytes, so every arena decides
  // alike.
  const uint64_t normal = segment_size(rounded), smallest = min_segment_size(rounded);
  Segment* seg = map_segment_locked(normal, small, category, tag);
  if (!seg && smallest < normal) seg = map_segment_locked(smallest, small, category, tag);
  return seg;
}

Block* CachingAllocator::allocate(uint64_t bytes, Category category, uint32_t tag) {
  REGEN_CHECK(bytes > 0, "allocator (", arena_->name(), "): a request must be at least 1 byte");
  if (bytes > kMaxRequestSize) {
    // A size this large comes from an overflow upstream; rounding it would wrap to 0 bytes.
    detail::throw_oom(
        __FILE__, __LINE__,
        detail::str_cat("out of memory on ", arena_->name(), ": a request of ", bytes,
                        " bytes (category ", category_name(category),
                        tag ? ", tag '" + tag_name(tag) + "'" : std::string(),
                        ") exceeds the largest request the allocator serves, ",
                        format_bytes(kMaxRequestSize), " (a size computed with an overflow?)"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallSize;
  if (planned_active_) {
    const size_t k = planned_next_++;
    if (k + 1 >= layout_->rounded.size()) planned_active_ = false;  // later requests: the pools
    REGEN_CHECK(layout_->rounded[k] == rounded, "planned layout: request ", k, " of the step is ",
                format_bytes(static_cast<int64_t>(rounded)), " (category ", category_name(category),
                tag ? ", tag '" + tag_name(tag) + "'" : std::string(), ") but the layout has ",
                format_bytes(static_cast<int64_t>(layout_->rounded[k])),
                " there: the step is not the one the layout was planned for (another plan, model, "
                "batch or thread count?)");
    const int32_t bin = layout_->bin.empty() ? -1 : layout_->bin[k];
    Block* pb = new Block();
    if (bin < 0) {
      pb->segment = planned_segment_.get();
      pb->offset = layout_->offset[k];
    } else {
      const Block* hole = planned_holes_[static_cast<size_t>(bin)];
      pb->segment = hole->segment;
      pb->offset = hole->offset + layout_->offset[k];
    }
    pb->size = rounded;
    planned_live_.insert(pb);
    return finish_allocation_locked(pb, bytes, category, tag);
  }
  Block* b = try_allocate_locked(rounded, small);
  if (!b) {
    Segment* seg = map_for_request_locked(rounded, small, category, tag);
    if (!seg) {
      // Like PyTorch: give every cached free segment back and try once more.
      release_cached_locked();
      stats_.num_cache_flushes++;
      seg = map_for_request_locked(rounded, small, category, tag);
    }
    if (!seg) {
      const int64_t smallest = static_cast<int64_t>(min_segment_size(rounded));
      const bool over_limit = limit_ > 0 && stats_.reserved.current + smallest > limit_;
      throw_oom_locked(bytes, rounded, category, tag,
                       over_limit ? "would pass the limit" : "the arena has no more memory");
    }
    b = seg->head;
  }
  // Split when the remainder is worth keeping as a free block of its own.
  const uint64_t remaining = b->size - rounded;
  const bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    Block* rest = new Block();
    rest->segment = b->segment;
    rest->offset = b->offset + rounded;
    rest->size = remaining;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = rounded;
    pool(small).insert(rest);
  }
  return finish_allocation_locked(b, bytes, category, tag);
}

Block* CachingAllocator::finish_allocation_locked(Block* b, uint64_t bytes, Category category,
                                                  uint32_t tag) {
  b->allocated = true;
  b->requested = bytes;
  b->category = category;
  b->tag = tag;
  b->alloc_id = next_alloc_id_++;
  live_by_id_[b->alloc_id] = b;
  live_set_.insert(b);
  const int ci = static_cast<int>(category);
  add_stat_locked(stats_.requested, static_cast<int64_t>(bytes));
  add_stat_locked(stats_.requested_by[ci], static_cast<int64_t>(bytes));
  add_stat_locked(stats_.allocated_by[ci], static_cast<int64_t>(b->size));
  const int64_t before_peak = stats_.allocated.peak;
  add_stat_locked(stats_.allocated, static_cast<int64_t>(b->size));
  if (stats_.allocated.peak > before_peak) {
    for (int i = 0; i < kNumCategories; ++i) {
      stats_.allocated_by_at_peak[i] = stats_.allocated_by[i].current;
    }
  }
  stats_.num_allocs++;
  stats_.live_blocks++;
  record_locked(MemoryEventKind::alloc, static_cast<int64_t>(b->size), static_cast<int64_t>(bytes),
                category, tag, b->alloc_id, b->segment->id);
  return b;
}

void CachingAllocator::free(Block* b) {
  if (!b) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Validated before anything reads *b: after a free, coalescing may have deleted the Block.
  REGEN_CHECK(live_set_.count(b) == 1, "allocator (", arena_->name(), "): free of block handle ",
              static_cast<const void*>(b),
              ", which is not a live block of this allocator (freed twice, or allocated by another "
              "allocator)");
  live_set_.erase(b);
  const int ci = static_cast<int>(b->category);
  stats_.requested.current -= static_cast<int64_t>(b->requested);
  stats_.requested_by[ci].current -= static_cast<int64_t>(b->requested);
  stats_.allocated.current -= static_cast<int64_t>(b->size);
  stats_.allocated_by[ci].current -= static_cast<int64_t>(b->size);
  stats_.num_frees++;
  stats_.live_blocks--;
  live_by_id_.erase(b->alloc_id);
  b->allocated = false;
  record_locked(MemoryEventKind::free, static_cast<int64_t>(b->size),
                static_cast<int64_t>(b->requested), b->category, b->tag, b->alloc_id,
                b->segment->id);
  if (planned_live_.erase(b)) {
    delete b;
    return;
  }
  release_block_locked(b);
}

void CachingAllocator::release_block_locked(Block* b) {
  const bool small = b->segment->small;
  Pool& p = pool(small);
  // Coalesce with free neighbours in the same segment.
  if (b->prev && !b->prev->allocated) {
    Block* prev = b->prev;
    p.erase(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (b->next && !b->next->allocated) {
    Block* next = b->next;
    p.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  b->requested = 0;
  b->alloc_id = 0;
  b->tag = 0;
  p.insert(b);
}

void CachingAllocator::throw_oom_locked(uint64_t bytes, uint64_t rounded, Category c, uint32_t tag,
                                        const char* why, uint64_t segment) {
  std::ostringstream os;
  os << "out of memory on " << arena_->name() << ": a request of " << format_bytes(bytes)
     << " (rounded to " << format_bytes(rounded) << ", category " << category_name(c);
  if (tag) os << ", tag '" << tag_name(tag) << "'";
  os << ") needs a new segment of " << format_bytes(segment ? segment : segment_size(rounded));
  if (!segment && min_segment_size(rounded) < segment_size(rounded)) {
    os << " (or at least " << format_bytes(min_segment_size(rounded)) << ")";
  }
  os << ", which " << why;
  if (limit_ > 0) os << "; limit " << format_bytes(limit_);
  os << ". Allocated " << format_bytes(stats_.allocated.current) << ", reserved "
     << format_bytes(stats_.reserved.current) << ".";
  auto by_category = [&](const char* what, const std::array<Stat, kNumCategories>& by) {
    os << "\n  " << what << " by category:";
    bool any = false;
    for (int i = 0; i < kNumCategories; ++i) {
      if (!by[i].current) continue;
      os << " " << category_name(static_cast<Category>(i)) << " " << format_bytes(by[i].current)
         << ";";
      any = true;
    }
    if (!any) os << " none";
  };
  by_category("allocated", stats_.allocated_by);
  by_category("reserved", stats_.reserved_by);
  // Fragmentation: what the reserved segments hold free, and the largest piece of it.
  int64_t free_bytes = 0, largest_free = 0, free_blocks = 0;
  for (auto& s : segments_) {
    for (Block* b = s->head; b; b = b->next) {
      if (b->allocated) continue;
      free_bytes += static_cast<int64_t>(b->size);
      largest_free = std::max(largest_free, static_cast<int64_t>(b->size));
      ++free_blocks;
    }
  }
  os << "\n  free in reserved segments: " << format_bytes(free_bytes) << " in " << free_blocks
     << " block(s), the largest " << format_bytes(largest_free) << " (a request larger than that "
     << "needs a new segment)";
  std::vector<const Block*> live;
  for (auto& s : segments_) {
    for (Block* b = s->head; b; b = b->next) {
      if (b->allocated) live.push_back(b);
    }
  }
  std::stable_sort(live.begin(), live.end(),
                   [](const Block* a, const Block* b) { return a->size > b->size; });
  os << "\n  largest live blocks:";
  if (live.empty()) os << " none";
  for (size_t i = 0; i < live.size() && i < 8; ++i) {
    os << "\n    " << format_bytes(live[i]->size) << " " << category_name(live[i]->category)
       << " '" << (live[i]->tag ? tag_name(live[i]->tag) : std::string("untagged")) << "'";
  }
  detail::throw_oom(__FILE__, __LINE__, os.str());
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_peaks_locked();
}

void CachingAllocator::reset_peaks_locked() {
  auto reset = [](Stat& s) { s.peak = s.current; };
  reset(stats_.requested);
  reset(stats_.allocated);
  reset(stats_.reserved);
  for (int i = 0; i < kNumCategories; ++i) {
    reset(stats_.requested_by[i]);
    reset(stats_.allocated_by[i]);
    reset(stats_.reserved_by[i]);
    stats_.allocated_by_at_peak[i] = stats_.allocated_by[i].current;
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
  arena_->release_retained();
}

void CachingAllocator::set_limit(int64_t bytes) {
  REGEN_CHECK(bytes >= 0, "allocator limit must be non-negative, got ", bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = bytes;
}

int64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

void CachingAllocator::set_planned_layout(std::shared_ptr<const PlannedLayout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (layout_) {
    REGEN_CHECK(planned_live_.empty(), "planned layout: ", planned_live_.size(),
                " block(s) of the installed layout are still live");
  }
  if (planned_segment_) {
    arena_->unmap(reinterpret_cast<void*>(planned_segment_->base), planned_segment_->size);
    stats_.reserved.current -= static_cast<int64_t>(planned_segment_->size);
    stats_.reserved_by[static_cast<int>(planned_segment_->category)].current -=
        static_cast<int64_t>(planned_segment_->size);
    stats_.num_segment_unmaps++;
    record_locked(MemoryEventKind::segment_unmap, static_cast<int64_t>(planned_segment_->size), 0,
                  planned_segment_->category, 0, 0, planned_segment_->id);
    planned_segment_.reset();
  }
  if (layout_) {
    for (Block* h : planned_holes_) {
      h->allocated = false;
      release_block_locked(h);
    }
    planned_holes_.clear();
  }
  layout_.reset();
  planned_active_ = false;
  planned_next_ = 0;
  if (!layout) return;
  const size_t n = layout->rounded.size();
  REGEN_CHECK(layout->size >= 0 && layout->offset.size() == n && (layout->bin.empty() || layout->bin.size() == n),
              "planned layout: malformed (", n, " sizes, ", layout->offset.size(), " offsets, ",
              layout->bin.size(), " bins, arena ", layout->size, " bytes)");
  for (size_t k = 0; k < n; ++k) {
    const int32_t bin = layout->bin.empty() ? -1 : layout->bin[k];
    REGEN_CHECK(bin >= -1 && bin < static_cast<int64_t>(layout->holes.size()),
                "planned layout: request ", k, " lies in hole ", bin, " of ", layout->holes.size());
    const uint64_t room = bin < 0 ? static_cast<uint64_t>(layout->size) : layout->holes[static_cast<size_t>(bin)];
    REGEN_CHECK(layout->offset[k] % kMinBlockSize == 0 && layout->offset[k] + layout->rounded[k] <= room,
                "planned layout: request ", k, " at offset ", layout->offset[k], " (",
                layout->rounded[k], " bytes) does not lie aligned inside its ", room, "-byte ",
                bin < 0 ? "arena" : "hole");
  }
  // Cached segments go first, as at a step's start; the free blocks of the segments that remain
  // (between and after persistent tensors) are the holes the layout was planned with.
  release_cached_locked();
  std::vector<Block*> holes;
  for (auto& seg : segments_) {
    for (Block* b = seg->head; b; b = b->next) {
      if (!b->allocated) holes.push_back(b);
    }
  }
  bool same = holes.size() == layout->holes.size();
  uint64_t have = 0, want = 0;
  for (size_t i = 0; i < holes.size(); ++i) {
    have += holes[i]->size;
    same = same && holes[i]->size == layout->holes[i];
  }
  for (uint64_t h : layout->holes) want += h;
  REGEN_CHECK(same, "planned layout: planned with ", layout->holes.size(), " free block(s) of ",
              format_bytes(static_cast<int64_t>(want)), " in the persistent segments, but they hold ",
              holes.size(), " of ", format_bytes(static_cast<int64_t>(have)),
              ": the persistent tensors are not where they were when the step was profiled "
              "(another model, optimizer or order of creation?)");
  // The arena (none when the holes hold the whole step).
  const uint64_t size = static_cast<uint64_t>(layout->size);
  if (limit_ > 0 && stats_.reserved.current + static_cast<int64_t>(size) > limit_) {
    throw_oom_locked(size, size, Category::activation, 0,
                     "would pass the limit (the planned layout's arena)", size);
  }
  if (size > 0) {
    void* base = arena_->map(size);
    if (!base) {
      throw_oom_locked(size, size, Category::activation, 0,
                       "the arena cannot map (the planned layout's arena)", size);
    }
    planned_segment_ = std::make_unique<Segment>();
    planned_segment_->id = next_segment_id_++;
    planned_segment_->base = reinterpret_cast<uintptr_t>(base);
    planned_segment_->size = size;
    planned_segment_->category = Category::activation;
    add_stat_locked(stats_.reserved, static_cast<int64_t>(size));
    add_stat_locked(stats_.reserved_by[static_cast<int>(Category::activation)], static_cast<int64_t>(size));
    stats_.num_segment_maps++;
    record_locked(MemoryEventKind::segment_map, static_cast<int64_t>(size), 0, Category::activation,
                  0, 0, planned_segment_->id);
  }
  // The holes leave the pools: marked allocated, they are neither handed out nor coalesced.
  for (Block* h : holes) {
    pool(h->segment->small).erase(h);
    h->allocated = true;
  }
  planned_holes_ = std::move(holes);
  layout_ = std::move(layout);
}

bool CachingAllocator::has_planned_layout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_ != nullptr;
}

void CachingAllocator::begin_planned_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_) return;
  REGEN_CHECK(planned_live_.empty(), "planned layout: a step begins while ", planned_live_.size(),
              " block(s) of the previous one are live");
  planned_next_ = 0;
  planned_active_ = !layout_->rounded.empty();
}

EventLogBaseline CachingAllocator::baseline_locked() const {
  EventLogBaseline b;
  b.seq = next_seq_;
  b.time_ns = now_ns() - log_t0_ns_;
  b.allocated = stats_.allocated.current;
  b.reserved = stats_.reserved.current;
  for (int i = 0; i < kNumCategories; ++i) {
    b.allocated_by[i] = stats_.allocated_by[i].current;
    b.reserved_by[i] = stats_.reserved_by[i].current;
  }
  return b;
}

void CachingAllocator::set_event_log(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (enabled && !log_enabled_) {
    if (events_.empty()) {
      // A fresh log: its clock and its baseline start now.
      log_t0_ns_ = now_ns();
      baselines_.assign(1, baseline_locked());
    } else {
      // Resumed after a pause: what happened meanwhile is not in the log; resync here.
      baselines_.push_back(baseline_locked());
    }
  }
  log_enabled_ = enabled;
}

bool CachingAllocator::event_log_enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_enabled_;
}

std::vector<MemoryEvent> CachingAllocator::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

uint64_t CachingAllocator::event_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void CachingAllocator::clear_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
  next_seq_ = 0;
  log_t0_ns_ = now_ns();
  baselines_.assign(1, baseline_locked());
}

EventLogBaseline CachingAllocator::event_log_baseline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return baselines_.front();
}

std::vector<BlockInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BlockInfo> out;
  // A region a planned layout serves (a hole, the arena): its live planned blocks by offset and
  // the gaps between them as free blocks, so that it is tiled like the rest of a segment (two
  // live blocks that overlap show as such).
  auto planned_region = [&](const Segment& s, uint64_t begin, uint64_t size) {
    std::vector<const Block*> in;
    for (const Block* b : planned_live_) {
      if (b->segment == &s && b->offset >= begin && b->offset < begin + size) in.push_back(b);
    }
    std::sort(in.begin(), in.end(), [](const Block* a, const Block* b) { return a->offset < b->offset; });
    uint64_t at = begin;
    auto gap = [&](uint64_t to) {
      if (to > at) out.push_back({s.id, at, to - at, 0, false, s.small, Category::other, 0, 0, s.base + at});
    };
    for (const Block* b : in) {
      gap(b->offset);
      out.push_back({s.id, b->offset, b->size, b->requested, true, s.small, b->category, b->tag,
                     b->alloc_id, s.base + b->offset});
      at = std::max(at, b->offset + b->size);
    }
    gap(begin + size);
  };
  for (auto& s : segments_) {
    for (Block* b = s->head; b; b = b->next) {
      if (std::find(planned_holes_.begin(), planned_holes_.end(), b) != planned_holes_.end()) {
        planned_region(*s, b->offset, b->size);
        continue;
      }
      out.push_back({s->id, b->offset, b->size, b->requested, b->allocated, s->small, b->category,
                     b->tag, b->alloc_id, s->base + b->offset});
    }
  }
  if (planned_segment_) planned_region(*planned_segment_, 0, planned_segment_->size);
  return out;
}

AllocatorState CachingAllocator::snapshot_state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  REGEN_CHECK(!planned_segment_, "snapshot_state: a planned layout is installed (profile without "
              "one: it is planned from the profile)");
  AllocatorState st;
  st.next_segment_id = next_segment_id_;
  st.next_alloc_id = next_alloc_id_;
  for (auto& s : segments_) {
    AllocatorState::SegmentRec rec;
    rec.id = s->id;
    rec.size = s->size;
    rec.small = s->small;
    rec.category = s->category;
    for (Block* b = s->head; b; b = b->next) {
      rec.blocks.push_back({s->id, b->offset, b->size, b->requested, b->allocated, s->small,
                            b->category, b->tag, b->alloc_id, s->base + b->offset});
    }
    st.segments.push_back(std::move(rec));
  }
  return st;
}

void CachingAllocator::restore_state(const AllocatorState& st) {
  std::lock_guard<std::mutex> lock(mutex_);
  REGEN_CHECK(segments_.empty(), "restore_state: the allocator already holds segments");
  for (const AllocatorState::SegmentRec& rec : st.segments) {
    REGEN_CHECK(rec.id > 0 && rec.size > 0 && !rec.blocks.empty(),
                "restore_state: malformed segment ", rec.id);
    void* base = arena_->map(rec.size);
    REGEN_CHECK(base != nullptr, "restore_state: the arena cannot map ", format_bytes(rec.size));
    auto seg = std::make_unique<Segment>();
    seg->id = rec.id;
    seg->base = reinterpret_cast<uintptr_t>(base);
    seg->size = rec.size;
    seg->small = rec.small;
    seg->category = rec.category;
    Block* prev = nullptr;
    uint64_t expect = 0;
    for (const BlockInfo& bi : rec.blocks) {
      REGEN_CHECK(bi.offset == expect, "restore_state: blocks of segment ", rec.id,
                  " do not tile it");
      expect += bi.size;
      Block* b = new Block();
      b->segment = seg.get();
      b->offset = bi.offset;
      b->size = bi.size;
      b->requested = bi.requested;
      b->allocated = bi.allocated;
      b->category = bi.category;
      b->tag = bi.tag;
      b->alloc_id = bi.id;
      b->prev = prev;
      if (prev) prev->next = b;
      else seg->head = b;
      prev = b;
      const int ci = static_cast<int>(b->category);
      if (b->allocated) {
        stats_.requested.current += static_cast<int64_t>(b->requested);
        stats_.requested_by[ci].current += static_cast<int64_t>(b->requested);
        stats_.allocated.current += static_cast<int64_t>(b->size);
        stats_.allocated_by[ci].current += static_cast<int64_t>(b->size);
        stats_.live_blocks++;
        live_by_id_[b->alloc_id] = b;
        live_set_.insert(b);
      } else {
        pool(seg->small).insert(b);
      }
    }
    REGEN_CHECK(expect == rec.size, "restore_state: blocks of segment ", rec.id,
                " do not tile it");
    stats_.reserved.current += static_cast<int64_t>(rec.size);
    stats_.reserved_by[static_cast<int>(rec.category)].current += static_cast<int64_t>(rec.size);
    segments_.push_back(std::move(seg));
  }
  next_segment_id_ = st.next_segment_id;
  next_alloc_id_ = st.next_alloc_id;
  reset_peaks_locked();
}

Block* CachingAllocator::block_by_id(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_by_id_.find(id);
  return it == live_by_id_.end() ? nullptr : it->second;
}

Device CachingAllocator::device() const { return arena_->device(); }

std::string CachingAllocator::chrome_trace(bool use_sequence_time) const {
  std::vector<MemoryEvent> evs;
  std::vector<EventLogBaseline> baselines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    evs = events_;
    baselines = baselines_;
  }
  const std::string dev = arena_->name();
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"regen allocator " +
         json_escape(dev) + "\"}}";
  // The events carry changes; the counters start from what was live when the log started.
  std::array<int64_t, kNumCategories> by{};
  char buf[512];
  auto allocated_counter = [&](double ts) {
    out += ",\n{\"name\":\"allocated by category\",\"ph\":\"C\",\"pid\":1,\"tid\":1,";
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"args\":{", ts);
    out += buf;
    for (int i = 0; i < kNumCategories; ++i) {
      std::snprintf(buf, sizeof buf, "%s\"%s\":%lld", i ? "," : "",
                    category_name(static_cast<Category>(i)), static_cast<long long>(by[i]));
      out += buf;
    }
    out += "}}";
  };
  auto reserved_counter = [&](double ts, int64_t reserved) {
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"reserved\",\"ph\":\"C\",\"pid\":1,\"tid\":1,\"ts\":%.3f,"
                  "\"args\":{\"reserved\":%lld}}",
                  ts, static_cast<long long>(reserved));
    out += buf;
  };
  size_t next_baseline = 0;
  auto apply_baselines = [&](uint64_t up_to_seq) {
    for (; next_baseline < baselines.size() && baselines[next_baseline].seq <= up_to_seq;
         ++next_baseline) {
      const EventLogBaseline& b = baselines[next_baseline];
      const double ts = use_sequence_time ? static_cast<double>(b.seq) : b.time_ns / 1000.0;
      by = b.allocated_by;
      allocated_counter(ts);
      reserved_counter(ts, b.reserved);
    }
  };
  for (const MemoryEvent& e : evs) {
    apply_baselines(e.seq);
    const double ts = use_sequence_time ? static_cast<double>(e.seq) : e.time_ns / 1000.0;
    const int ci = static_cast<int>(e.category);
    if (e.kind == MemoryEventKind::alloc) by[ci] += e.bytes;
    if (e.kind == MemoryEventKind::free) by[ci] -= e.bytes;
    if (e.kind == MemoryEventKind::alloc || e.kind == MemoryEventKind::free) allocated_counter(ts);
    reserved_counter(ts, e.reserved_after);
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":2,\"ts\":%.3f,"
                  "\"args\":{\"bytes\":%lld,\"requested\":%lld,\"category\":\"%s\",\"block\":%llu,"
                  "\"segment\":%llu,\"seq\":%llu,\"tag\":\"",
                  memory_event_name(e.kind), ts, static_cast<long long>(e.bytes),
                  static_cast<long long>(e.requested), category_name(e.category),
                  static_cast<unsigned long long>(e.block_id),
                  static_cast<unsigned long long>(e.segment_id),
                  static_cast<unsigned long long>(e.seq));
    out += buf;
    out += json_escape(tag_name(e.tag));
    out += "\"}}";
  }
  apply_baselines(~uint64_t{0});  // a log resumed with no event since
  out += "\n]}\n";
  return out;
}

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

bool dry_run_active() { return g_dry_run; }

DryRunScope::DryRunScope(Device device) {
  REGEN_CHECK(!dry_run_active(), "a dry run is already under way on this thread");
  alloc_ = std::make_unique<CachingAllocator>(make_null_arena(device));
  g_dry_run_allocator = alloc_.get();
  g_dry_run_device = device;
  g_dry_run = true;
}

DryRunScope::~DryRunScope() {
  g_dry_run = false;
  g_dry_run_allocator = nullptr;
}

CachingAllocator& allocator_for(Device device) {
  if (dry_run_active() && device == g_dry_run_device) return *g_dry_run_allocator;
  if (device.is_cpu()) {
    // Never destroyed: tensors in static storage may be released after main() returns.
    static CachingAllocator* cpu =
        register_allocator(new CachingAllocator(make_recycling_arena(make_cpu_arena())));
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
    a = register_allocator(
        new CachingAllocator(make_recycling_arena(make_cuda_arena(device.index))));
  }
  return *a;
#else
  REGEN_FAIL("device ", device.str(),
             " is not available: regen was built without CUDA support (REGEN_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace regen
