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

void* Block::ptr() const {
  return memory ? memory : reinterpret_cast<void*>(segment->base + offset);
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

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
    if (planned_segment_)
      arena_->unmap(reinterpret_cast<void*>(planned_segment_->base), planned_segment_->size);
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
  if (limit_ > 0 && stats_.reserved.current + static_cast<int64_t>(size) > limit_) {
    const int64_t total = stats_.reserved.current + static_cast<int64_t>(size);
    if (lowest_refused_ == 0 || total < lowest_refused_) lowest_refused_ = total;
    return nullptr;
  }
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
  record_locked(MemoryEventKind::segment_unmap, static_cast<int64_t>(s->size), 0, s->category, 0, 0,
                s->id);
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

Block* CachingAllocator::find_or_map_locked(uint64_t rounded, bool small, Category category,
                                            uint32_t tag) {
  if (Block* b = try_allocate_locked(rounded, small)) return b;
  Segment* seg = map_for_request_locked(rounded, small, category, tag);
  if (!seg) {
    // Like PyTorch: give every cached free segment back and try once more.
    release_cached_locked();
    stats_.num_cache_flushes++;
    seg = map_for_request_locked(rounded, small, category, tag);
  }
  return seg ? seg->head : nullptr;
}

void CachingAllocator::set_eviction_handler(EvictionHandler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  REGEN_CHECK(!handler || !layout_, "allocator (", arena_->name(),
              "): an eviction handler cannot be installed with a planned layout (its requests "
              "are served where the layout puts them, never by evicting)");
  eviction_handler_ =
      handler ? std::make_shared<const EvictionHandler>(std::move(handler)) : nullptr;
}

bool CachingAllocator::has_eviction_handler() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return eviction_handler_ != nullptr;
}

EvictionScope::EvictionScope(CachingAllocator& a, EvictionHandler handler) : a_(a) {
  REGEN_CHECK(!a_.has_eviction_handler(), "allocator (", a_.arena().name(),
              "): an eviction handler is installed already (one runtime at a time)");
  a_.set_eviction_handler(std::move(handler));
}

EvictionScope::~EvictionScope() {
  a_.set_eviction_handler(nullptr);
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
  std::unique_lock<std::mutex> lock(mutex_);
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
    void* memory = map_block_locked(bytes, category, tag);
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
    Block* out = finish_allocation_locked(pb, bytes, category, tag, memory);
    planned_served_.push_back(reinterpret_cast<uintptr_t>(out->ptr()));
    return out;
  }
  Block* b = find_or_map_locked(rounded, small, category, tag);
  // Before giving up, the eviction handler may free blocks; then everything is tried again. It
  // is called without the lock (it frees blocks itself), at this one point on every arena.
  bool handler_gave_up = false;
  while (!b && eviction_handler_) {
    const std::shared_ptr<const EvictionHandler> handler = eviction_handler_;
    const EvictionRequest request{bytes, rounded, small, category, tag};
    lock.unlock();
    const bool freed = (*handler)(request);
    lock.lock();
    if (!freed) {
      handler_gave_up = true;
      break;
    }
    b = find_or_map_locked(rounded, small, category, tag);
  }
  if (!b) {
    const int64_t smallest = static_cast<int64_t>(min_segment_size(rounded));
    const bool over_limit = limit_ > 0 && stats_.reserved.current + smallest > limit_;
    throw_oom_locked(bytes, rounded, category, tag,
                     over_limit ? (handler_gave_up ? "would pass the limit, and the eviction "
                                                     "handler had nothing left to evict"
                                                   : "would pass the limit")
                                : "the arena has no more memory");
  }
  // Direct mode: the block's own memory, mapped once every check has passed (so a request the
  // limit refuses is refused as on any other arena). When there is none, the block goes back to
  // its pool unsplit (a segment mapped for it stays cached) and the request fails.
  void* memory = nullptr;
  try {
    memory = map_block_locked(bytes, category, tag);
  } catch (...) {
    pool(small).insert(b);
    throw;
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
  return finish_allocation_locked(b, bytes, category, tag, memory);
}

void* CachingAllocator::map_block_locked(uint64_t bytes, Category category, uint32_t tag) {
  if (!arena_->maps_blocks()) return nullptr;
  void* p = arena_->map_block(bytes);
  if (!p) {
    detail::throw_oom(
        __FILE__, __LINE__,
        detail::str_cat(
            "out of memory on ", arena_->name(), ": the block of a request of ",
            format_bytes(static_cast<int64_t>(bytes)), " (category ", category_name(category),
            tag ? ", tag '" + tag_name(tag) + "'" : std::string(),
            ") could not be mapped on its own (direct mode, REGEN_ALLOC_DIRECT=1, maps "
            "every block separately); allocated ",
            format_bytes(stats_.allocated.current), " in ", stats_.live_blocks, " live block(s)"));
  }
  return p;
}

void CachingAllocator::unmap_block_locked(Block* b) {
  if (!b->memory) return;
  arena_->unmap_block(b->memory, b->requested);
  b->memory = nullptr;
}

Block* CachingAllocator::finish_allocation_locked(Block* b, uint64_t bytes, Category category,
                                                  uint32_t tag, void* memory) {
  b->memory = memory;
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
  unmap_block_locked(b);  // before coalescing may delete the Block
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
    os << "\n    " << format_bytes(live[i]->size) << " " << category_name(live[i]->category) << " '"
       << (live[i]->tag ? tag_name(live[i]->tag) : std::string("untagged")) << "'";
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
  lowest_refused_ = 0;
}

int64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

int64_t CachingAllocator::lowest_refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lowest_refused_;
}

void CachingAllocator::set_planned_layout(std::shared_ptr<const PlannedLayout> layout) {
  std::lock_guard<std::mutex> lock(mutex_);
  REGEN_CHECK(!layout || !eviction_handler_, "planned layout: the allocator (", arena_->name(),
              ") has an eviction handler installed; a planned step never evicts");
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
  REGEN_CHECK(layout->size >= 0 && layout->offset.size() == n &&
                  (layout->bin.empty() || layout->bin.size() == n),
              "planned layout: malformed (", n, " sizes, ", layout->offset.size(), " offsets, ",
              layout->bin.size(), " bins, arena ", layout->size, " bytes)");
  for (size_t k = 0; k < n; ++k) {
    const int32_t bin = layout->bin.empty() ? -1 : layout->bin[k];
    REGEN_CHECK(bin >= -1 && bin < static_cast<int64_t>(layout->holes.size()),
                "planned layout: request ", k, " lies in hole ", bin, " of ", layout->holes.size());
    const uint64_t room =
        bin < 0 ? static_cast<uint64_t>(layout->size) : layout->holes[static_cast<size_t>(bin)];
    REGEN_CHECK(
        layout->offset[k] % kMinBlockSize == 0 && layout->offset[k] + layout->rounded[k] <= room,
        "planned layout: request ", k, " at offset ", layout->offset[k], " (", layout->rounded[k],
        " bytes) does not lie aligned inside its ", room, "-byte ", bin < 0 ? "arena" : "hole");
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
              format_bytes(static_cast<int64_t>(want)),
              " in the persistent segments, but they hold ", holes.size(), " of ",
              format_bytes(static_cast<int64_t>(have)),
              ": the persistent tensors are not where they were when the step was profiled "
              "(another model, optimizer or order of creation?)");
  // The arena (none when the holes hold the whole step).
  const uint64_t size = static_cast<uint64_t>(layout->size);
  if (limit_ > 0 && stats_.reserved.current + static_cast<int64_t>(size) > limit_) {
    const int64_t total = stats_.reserved.current + static_cast<int64_t>(size);
    if (lowest_refused_ == 0 || total < lowest_refused_) lowest_refused_ = total;
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
    add_stat_locked(stats_.reserved_by[static_cast<int>(Category::activation)],
                    static_cast<int64_t>(size));
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
  planned_served_.clear();
}

std::vector<uintptr_t> CachingAllocator::planned_served() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_served_;
}

uintptr_t CachingAllocator::planned_address(size_t k) const {
  std::lock_guard<std::mutex> lock(mutex_);
  REGEN_CHECK(layout_ && k < layout_->rounded.size(), "planned layout: no request ", k,
              " (the layout has ", layout_ ? layout_->rounded.size() : 0, ")");
  const int32_t bin = layout_->bin.empty() ? -1 : layout_->bin[k];
  if (bin < 0) return planned_segment_->base + layout_->offset[k];
  const Block* hole = planned_holes_[static_cast<size_t>(bin)];
  return reinterpret_cast<uintptr_t>(hole->ptr()) + layout_->offset[k];
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
    std::sort(in.begin(), in.end(),
              [](const Block* a, const Block* b) { return a->offset < b->offset; });
    uint64_t at = begin;
    auto gap = [&](uint64_t to) {
      if (to > at)
        out.push_back({s.id, at, to - at, 0, false, s.small, Category::other, 0, 0, s.base + at});
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
  REGEN_CHECK(!planned_segment_,
              "snapshot_state: a planned layout is installed (profile without "
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

LiveLayout CachingAllocator::live_layout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  LiveLayout out;
  for (auto& s : segments_) {
    LiveLayout::Seg seg;
    seg.size = s->size;
    seg.small = s->small;
    for (Block* b = s->head; b; b = b->next) {
      // A planned layout's hole is marked allocated (it is out of the pools), but holds no tensor.
      const bool hole =
          std::find(planned_holes_.begin(), planned_holes_.end(), b) != planned_holes_.end();
      if (!b->allocated || hole) continue;
      seg.live.push_back({s->id, b->offset, b->size, b->requested, true, s->small, b->category,
                          b->tag, b->alloc_id, s->base + b->offset});
    }
    if (!seg.live.empty()) out.segments.push_back(std::move(seg));
  }
  return out;
}

LiveLayout live_layout(const AllocatorState& state) {
  LiveLayout out;
  for (const AllocatorState::SegmentRec& rec : state.segments) {
    LiveLayout::Seg seg;
    seg.size = rec.size;
    seg.small = rec.small;
    for (const BlockInfo& b : rec.blocks) {
      if (b.allocated) seg.live.push_back(b);
    }
    if (!seg.live.empty()) out.segments.push_back(std::move(seg));
  }
  return out;
}

namespace {

std::string describe_block(const BlockInfo& b, const LiveLayout::Seg& seg, size_t seg_index) {
  std::string s = "a block of " + format_bytes(static_cast<int64_t>(b.size)) + " (" +
                  std::to_string(b.requested) + " bytes requested, " + category_name(b.category);
  const std::string tag = tag_name(b.tag);
  if (!tag.empty()) s += ", '" + tag + "'";
  s += ") at offset " + std::to_string(b.offset) + " of segment " + std::to_string(seg_index + 1) +
       " (" + format_bytes(static_cast<int64_t>(seg.size)) + ", " +
       (seg.small ? "small" : "large") + " pool)";
  return s;
}

bool same_block(const BlockInfo& a, const BlockInfo& b) {
  return a.offset == b.offset && a.size == b.size && a.requested == b.requested &&
         a.category == b.category;
}

}  // namespace

std::string describe_layout_difference(const LiveLayout& expected, const LiveLayout& actual) {
  const size_t n = std::min(expected.segments.size(), actual.segments.size());
  for (size_t i = 0; i < n; ++i) {
    const LiveLayout::Seg& e = expected.segments[i];
    const LiveLayout::Seg& a = actual.segments[i];
    if (e.size != a.size || e.small != a.small) {
      return "segment " + std::to_string(i + 1) + " holding live blocks is " +
             format_bytes(static_cast<int64_t>(a.size)) + " (" + (a.small ? "small" : "large") +
             " pool) instead of " + format_bytes(static_cast<int64_t>(e.size)) + " (" +
             (e.small ? "small" : "large") + " pool)";
    }
    const size_t m = std::min(e.live.size(), a.live.size());
    for (size_t k = 0; k < m; ++k) {
      if (same_block(e.live[k], a.live[k])) continue;
      // The block that comes first by offset is the one present on one side only.
      if (a.live[k].offset <= e.live[k].offset) {
        return describe_block(a.live[k], a, i) + " is live where " +
               describe_block(e.live[k], e, i) + " was expected";
      }
      return describe_block(e.live[k], e, i) + " is expected but not live (the first live block " +
             "there is " + describe_block(a.live[k], a, i) + ")";
    }
    if (a.live.size() > m) return describe_block(a.live[m], a, i) + " is live and not expected";
    if (e.live.size() > m) return describe_block(e.live[m], e, i) + " is expected but not live";
  }
  if (actual.segments.size() > n) {
    const LiveLayout::Seg& a = actual.segments[n];
    return describe_block(a.live.front(), a, n) + " is live, in a segment not expected at all";
  }
  if (expected.segments.size() > n) {
    const LiveLayout::Seg& e = expected.segments[n];
    return describe_block(e.live.front(), e, n) + " is expected but not live (its segment is gone)";
  }
  return std::string();
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
      if (prev)
        prev->next = b;
      else
        seg->head = b;
      prev = b;
      const int ci = static_cast<int>(b->category);
      if (b->allocated) {
        b->memory = map_block_locked(b->requested, b->category, b->tag);
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
    REGEN_CHECK(expect == rec.size, "restore_state: blocks of segment ", rec.id, " do not tile it");
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

Device CachingAllocator::device() const {
  return arena_->device();
}

}  // namespace regen
