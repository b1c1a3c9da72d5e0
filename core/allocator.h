// The caching allocator: one algorithm over three backing arenas (CPU host memory, CUDA
// cudaMalloc segments, and Null, which touches no memory), plus a direct mode for sanitizer runs
// that gives every block a mapping of its own. Design and constants: docs/memory.md.
// Tests: tests/test_allocator.cpp (CPU, Null, direct), tests/cuda/test_cuda_allocator.cpp (CUDA).
//
// The algorithm follows the spirit of PyTorch's CUDA caching allocator: requests are rounded,
// served best-fit from a small or a large pool of cached free blocks, split when the remainder is
// worth keeping, and coalesced with free neighbours on release. Segments obtained from the arena
// are cached until empty_cache() or until a request cannot otherwise be served.
//
// Determinism: every decision depends only on the sequence of requests (sizes and which block is
// freed), never on the numeric value of an address, so the same sequence yields the same
// decisions and the same statistics on every arena. The remat simulator relies on this.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "regen/core/dry_run.h"
#include "regen/core/types.h"

namespace regen {

enum class Category : uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  workspace,
  input,
  other,
  // Data parallelism's buffers (dist/data_parallel.h): gradient buckets in flight, collectives'
  // scratch and staging. Last, so the others keep their numbers.
  communication,
};
constexpr int kNumCategories = 8;
const char* category_name(Category c);
// Parses a category name as printed by category_name(); throws regen::Error otherwise.
Category parse_category(const std::string& name);

// ---- Allocation scopes ----------------------------------------------------------------------
// The category and tag of an allocation come from the innermost RAII scope on the calling thread
// (default: Category::other, no tag).
Category current_category();
uint32_t current_tag();

class CategoryScope {
 public:
  explicit CategoryScope(Category c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  Category saved_;
};

class TagScope {
 public:
  explicit TagScope(std::string_view tag);
  explicit TagScope(uint32_t tag_id);
  ~TagScope();
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  uint32_t saved_;
};

// Tags are interned once: allocation records carry a 32-bit id. Id 0 is the empty tag.
uint32_t intern_tag(std::string_view tag);
std::string tag_name(uint32_t id);

// ---- Arenas ---------------------------------------------------------------------------------
class Arena {
 public:
  virtual ~Arena() = default;
  // A new segment of exactly `bytes`, or nullptr when the backing memory is exhausted.
  virtual void* map(size_t bytes) = 0;
  virtual void unmap(void* base, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // False for the Null arena: its pointers must never be dereferenced.
  virtual bool touches_memory() const { return true; }
  // Memory the arena holds that no segment uses (a recycling arena's parked segments; 0 for the
  // others), and a way to give it back to the system.
  virtual uint64_t retained_bytes() const { return 0; }
  virtual void release_retained() {}
  // Direct mode (make_direct_arena): true when every block the allocator hands out gets memory
  // of its own from map_block(), returned by unmap_block() when the block is freed; map() then
  // returns synthetic segment addresses that nothing dereferences.
  virtual bool maps_blocks() const { return false; }
  // Exactly `bytes` for one block, or nullptr when the memory is exhausted; only when
  // maps_blocks().
  virtual void* map_block(size_t /*bytes*/) { return nullptr; }
  virtual void unmap_block(void* /*p*/, size_t /*bytes*/) {}
};

std::unique_ptr<Arena> make_cpu_arena();
// The device's own arena: make_cpu_arena() on the CPU, make_cuda_arena(N) on cuda:N (a
// regen::Error naming the device in a build without CUDA).
std::unique_ptr<Arena> make_device_arena(Device device);
// Wraps an arena so that unmapped segments are parked, not returned, and a later map of the same
// size takes one back: the trainer empties the allocator's cache at every step start (the
// canonical start that makes predicted peaks exact), and without this every step would fault in
// (CPU) or cudaMalloc (CUDA) its memory again. Bounded: parked plus mapped bytes never exceed the
// most bytes ever mapped at once, so the process never holds more than the peak reserved bytes
// the allocator has reported. A map the inner arena cannot satisfy releases the parked segments
// and tries again. The allocator's statistics and decisions are unchanged (it sees the same
// map/unmap calls); the global CPU and CUDA allocators use it. docs/memory.md, "Arenas".
std::unique_ptr<Arena> make_recycling_arena(std::unique_ptr<Arena> inner);
// Synthetic, never-reused, 2 MiB-aligned addresses; no memory is touched. `device` is what the
// arena reports (a simulation of cuda:0 still says cuda:0).
std::unique_ptr<Arena> make_null_arena(Device device = Device::cpu());
// Direct mode, for sanitizer runs (docs/memory.md, "Direct mode"): segments get synthetic
// addresses, as on the Null arena, and every block its own mapping of exactly its requested bytes
// from `blocks` (its map/unmap), so that AddressSanitizer or compute-sanitizer sees an access
// past a block's end or after its free instead of landing inside a cached segment. The
// allocator's decisions and statistics are those of any other arena. The process-wide allocators
// use it when REGEN_ALLOC_DIRECT=1. The arena's name is `blocks`' with " (direct)".
std::unique_ptr<Arena> make_direct_arena(std::unique_ptr<Arena> blocks);
// The direct arena of a device: on the CPU, posix_memalign of exactly the requested bytes
// (64-byte aligned; memory AddressSanitizer tracks to the byte); on cuda:N, one cudaMalloc per
// block (make_cuda_arena; a regen::Error in a build without CUDA).
std::unique_ptr<Arena> make_direct_arena(Device device);

// ---- Statistics -----------------------------------------------------------------------------
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
};

// requested: bytes callers asked for. allocated: bytes of the blocks handed out (rounded, plus
// any unsplit remainder). reserved: bytes of segments obtained from the arena. Definitions and
// examples: docs/memory.md.
struct MemoryStats {
  Stat requested, allocated, reserved;
  std::array<Stat, kNumCategories> requested_by{}, allocated_by{}, reserved_by{};
  // Per-category allocated bytes at the moment allocated.peak was last raised.
  std::array<int64_t, kNumCategories> allocated_by_at_peak{};
  int64_t num_allocs = 0, num_frees = 0;
  int64_t num_segment_maps = 0, num_segment_unmaps = 0;
  int64_t num_cache_flushes = 0;  // times a request emptied the cache to retry
  int64_t live_blocks = 0;
};

// ---- Event log ------------------------------------------------------------------------------
enum class MemoryEventKind : uint8_t { alloc, free, segment_map, segment_unmap };
const char* memory_event_name(MemoryEventKind k);

struct MemoryEvent {
  uint64_t seq;  // position in this allocator's event sequence
  MemoryEventKind kind;
  int64_t bytes;      // block size (alloc/free) or segment size
  int64_t requested;  // alloc/free: requested bytes
  Category category;
  uint32_t tag;
  uint64_t block_id;  // alloc/free: allocation id; 0 for segment events
  uint64_t segment_id;
  int64_t time_ns;  // steady clock since the log was enabled
  int64_t allocated_after;
  int64_t reserved_after;
};

// What the allocator held when the event log started (set_event_log(true) on an empty log, or
// clear_events()): the events only carry changes, so the per-category levels they start from are
// recorded here. chrome_trace() starts its counters from it; a consumer that replays events()
// itself must do the same (or it sees blocks that were live before the log go negative when
// they are freed).
struct EventLogBaseline {
  uint64_t seq = 0;     // sequence number of the first event it applies to
  int64_t time_ns = 0;  // on the events' clock
  int64_t allocated = 0, reserved = 0;
  std::array<int64_t, kNumCategories> allocated_by{}, reserved_by{};
};

// One block of a segment, as reported by snapshot().
struct BlockInfo {
  uint64_t segment_id;
  uint64_t offset;
  uint64_t size;
  uint64_t requested;
  bool allocated;
  bool small_pool;
  Category category;
  uint32_t tag;
  uint64_t id;
  uintptr_t address;
};

struct Segment;

// The allocator's layout at one moment: every segment and the blocks that tile it, plus the id
// counters. snapshot_state() takes it; restore_state() rebuilds it in an empty allocator (the
// simulator starts from the state a measured iteration started from).
struct AllocatorState {
  struct SegmentRec {
    uint64_t id = 0;
    uint64_t size = 0;
    bool small = false;
    Category category = Category::other;
    std::vector<BlockInfo> blocks;  // in offset order
  };
  std::vector<SegmentRec> segments;  // in id order
  uint64_t next_segment_id = 1;
  uint64_t next_alloc_id = 1;
};

// The live part of an allocator's layout: the segments that hold live blocks, in id order, each
// with its live blocks in offset order. Right after empty_cache() it fixes the whole layout up to
// the segments' ids (a segment without live blocks is gone; the free blocks are the coalesced gaps
// between live ones), so two step starts with equal live layouts make the same decisions for the
// same requests. Trainer::step's canonical start must repeat it (docs/memory.md, "A step's
// starting state"); the profiler and the remat pipeline check that it does.
struct LiveLayout {
  struct Seg {
    uint64_t size = 0;
    bool small = false;
    std::vector<BlockInfo> live;  // allocated blocks, in offset order
  };
  std::vector<Seg> segments;
};
LiveLayout live_layout(const AllocatorState& state);
// Empty when the two agree on every segment's size and pool and on every live block's offset,
// size, requested bytes and category; otherwise the first difference in words, naming the
// block's bytes, category and tag (tags are not compared: the same tensor may be named
// differently in two runs, and they take no part in decisions).
std::string describe_layout_difference(const LiveLayout& expected, const LiveLayout& actual);

// A block of a segment. Callers treat it as an opaque handle: ptr() is the memory, id() the
// allocation's unique, monotonically increasing number.
struct Block {
  Segment* segment = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t requested = 0;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  bool allocated = false;
  Category category = Category::other;
  uint32_t tag = 0;
  uint64_t alloc_id = 0;
  void* memory = nullptr;  // direct mode: the block's own mapping of `requested` bytes
  void* ptr() const;
  uint64_t id() const { return alloc_id; }
};

// A planned layout (docs/memory.md, "The planned layout"): every request a training step makes,
// in order, with where its block lies, decided ahead of time from the step's exact sequence of
// requests (remat/plan/layout.h plans it from a profile and a plan). A block lies either in one of
// the free blocks the persistent segments hold when the layout is installed (their holes), or in
// one arena of `size` bytes mapped for the layout.
struct PlannedLayout {
  int64_t size = 0;               // the arena's bytes
  std::vector<uint64_t> holes;    // the holes' sizes, in segment and address order
  std::vector<uint64_t> rounded;  // per request of the step: its rounded size,
  std::vector<int32_t> bin;       // the hole it lies in (-1: the arena; empty: all in the arena),
  std::vector<uint64_t> offset;   // and its offset there
};

// A request the allocator cannot serve as things stand: no cached free block fits and no segment
// can be mapped, even after emptying the cache (docs/memory.md, "Eviction before
// OutOfMemory").
struct EvictionRequest {
  uint64_t bytes = 0;    // as requested
  uint64_t rounded = 0;  // the block it needs
  bool small = false;    // served from the small pool (small segments) or the large one
  Category category = Category::other;
  uint32_t tag = 0;
};
// Consulted with such a request before the allocator gives up. It may free blocks (a runtime
// that can drop tensors and make them again later: DTR, remat/execute/dtr.h) and returns true when
// it freed at least one, after which the allocator tries the request again from the start (cached
// blocks, then segments, then the cache flush); false means it has nothing left to free, and the
// request fails with OutOfMemory. It runs without the allocator's lock held, so it may call
// free() and snapshot(), but it must not allocate.
using EvictionHandler = std::function<bool(const EvictionRequest&)>;

class CachingAllocator {
 public:
  // Constants; docs/memory.md says why each has its value.
  static constexpr uint64_t kMinBlockSize = 512;           // every request rounds up to this
  static constexpr uint64_t kSmallSize = 1ull << 20;       // <= this goes to the small pool
  static constexpr uint64_t kSmallBuffer = 2ull << 20;     // small pool segment size
  static constexpr uint64_t kMinLargeAlloc = 10ull << 20;  // large requests below this share...
  static constexpr uint64_t kLargeBuffer = 20ull << 20;    // ...segments of this size
  static constexpr uint64_t kRoundLarge = 2ull << 20;      // bigger segments round to this
  // The largest request served (256 TiB): more than any device or x86-64 address space holds,
  // and small enough that rounding, segment sizes and int64_t statistics cannot overflow.
  static constexpr uint64_t kMaxRequestSize = 1ull << 48;

  explicit CachingAllocator(std::unique_ptr<Arena> arena);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Category and tag from the current scopes. A request of 0 bytes is a regen::Error; one above
  // kMaxRequestSize, or one that cannot be served, throws regen::OutOfMemory.
  Block* allocate(uint64_t bytes);
  Block* allocate(uint64_t bytes, Category category, uint32_t tag);
  // `block` must be live in this allocator: anything else (a second free, a block of another
  // allocator) throws regen::Error naming the pointer, and nothing is touched. The check is by
  // identity, so a stale handle whose memory was reused for a new live block is not caught.
  void free(Block* block);

  MemoryStats stats() const;
  void reset_peak();
  // Returns every cached, wholly free segment to the arena (a recycling arena parks it for the
  // next map of the same size; see make_recycling_arena).
  void empty_cache();
  // empty_cache(), then the arena gives everything it parked back to the system.
  void release_memory();

  // Hard limit on reserved bytes (0 = none). A request that needs a new segment maps the normal
  // segment size when it fits under the limit, else the smallest segment that holds it, else
  // empties the cache and tries both again, else throws regen::OutOfMemory (docs/memory.md).
  void set_limit(int64_t bytes);
  int64_t limit() const;
  // The lowest reserved total (reserved bytes plus the segment asked for) the limit refused since
  // it was set; 0 when it refused none. A limit decides nothing else, so the same requests run the
  // same way under every limit from this one up to just below that total: the planners' search for
  // the lowest limit a step runs under steps from one such total to the next (planner.h).
  int64_t lowest_refused() const;

  // The eviction handler (above) consulted before OutOfMemory; an empty function removes it. It
  // is asked only when every other way to serve the request has failed, at the same point on
  // every arena, so a simulation on the Null arena with the same handler decides exactly as a
  // real run (EvictionScope installs one for a scope). Not with a planned layout, which serves
  // its requests without searching (set_planned_layout refuses the pair).
  void set_eviction_handler(EvictionHandler handler);
  bool has_eviction_handler() const;

  // Installs a planned layout. It releases the cached segments, takes the free blocks of the
  // segments that remain (the holes: they must have the sizes layout->holes lists, or the
  // persistent tensors are not where the layout was planned, a regen::Error), and maps one
  // segment of layout->size bytes (reserved from now on; regen::OutOfMemory if the limit or the
  // arena refuses it). From the next begin_planned_step() on it serves the step's k-th request
  // where the layout puts it, searching no pool and mapping nothing. Its rounded size must be
  // layout->rounded[k]: anything else means the step is not the one the layout was planned for
  // (a regen::Error naming both). Requests past the layout's last one are served from the pools
  // as usual. A freed planned block is simply gone (offsets are fixed). nullptr uninstalls the
  // layout, unmaps its arena and gives the holes back to the pools; no planned block may be live.
  void set_planned_layout(std::shared_ptr<const PlannedLayout> layout);
  bool has_planned_layout() const;
  // The next request is the planned step's first (Trainer::step calls it at the step's start).
  void begin_planned_step();
  // With a planned layout: the addresses the step's requests got from it since
  // begin_planned_step(), in request order (a CUDA graph captured over the step holds them,
  // remat/execute/cuda_graph.h), and the address the layout gives request k: its hole's or the
  // arena's base plus its planned offset.
  std::vector<uintptr_t> planned_served() const;
  uintptr_t planned_address(size_t k) const;

  void set_event_log(bool enabled);
  bool event_log_enabled() const;
  std::vector<MemoryEvent> events() const;
  // Number of events logged so far (cheap; markers use it as a position).
  uint64_t event_count() const;
  // Drops the logged events; the baseline becomes the current state.
  void clear_events();
  // The state when the current log started (see EventLogBaseline).
  EventLogBaseline event_log_baseline() const;
  // Chrome trace-event JSON (opens in Perfetto / chrome://tracing): counter tracks of allocated
  // bytes per category and of reserved bytes, starting from event_log_baseline() (and resynced
  // to the allocator's state where the log was paused and resumed). With use_sequence_time the
  // x axis is the event number (1 us per event), which is what a Null-arena simulation has.
  std::string chrome_trace(bool use_sequence_time = false) const;

  std::vector<BlockInfo> snapshot() const;
  AllocatorState snapshot_state() const;
  // The segments holding live blocks and their live blocks (see LiveLayout); unlike
  // snapshot_state() it may be taken with a planned layout installed, whose arena and holes it
  // leaves out (they hold no live block between steps).
  LiveLayout live_layout() const;
  // Rebuilds `state` in this allocator, which must hold no segments. Current statistics become
  // the sums over the restored blocks; peaks start at the current values; the event log is not
  // touched. Allocated blocks are reachable through block_by_id() for later frees.
  void restore_state(const AllocatorState& state);
  // A live block by allocation id (nullptr if none); restored blocks keep their original ids.
  Block* block_by_id(uint64_t id) const;
  Device device() const;
  const Arena& arena() const { return *arena_; }
  // Whether every block has a mapping of its own (the arena maps blocks: make_direct_arena).
  bool direct() const { return arena_->maps_blocks(); }

  // round_size throws regen::Error above kMaxRequestSize.
  static uint64_t round_size(uint64_t bytes);
  // The normal segment for a rounded request (docs/memory.md), and the smallest one that holds
  // it, which a request falls back to when the normal one would pass the limit.
  static uint64_t segment_size(uint64_t rounded);
  static uint64_t min_segment_size(uint64_t rounded);

 private:
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  Block* try_allocate_locked(uint64_t rounded, bool small);
  // memory: the block's own mapping in direct mode (else nullptr), which it takes over.
  Block* finish_allocation_locked(Block* b, uint64_t bytes, Category category, uint32_t tag,
                                  void* memory);
  void* map_block_locked(uint64_t bytes, Category category, uint32_t tag);  // direct mode
  void unmap_block_locked(Block* b);
  void release_block_locked(Block* b);  // a free block: coalesced with free neighbours, pooled
  Segment* map_for_request_locked(uint64_t rounded, bool small, Category category, uint32_t tag);
  Segment* map_segment_locked(uint64_t size, bool small, Category category, uint32_t tag);
  EventLogBaseline baseline_locked() const;
  void release_cached_locked();
  void unmap_segment_locked(Segment* s);
  void record_locked(MemoryEventKind kind, int64_t bytes, int64_t requested, Category c,
                     uint32_t tag, uint64_t block_id, uint64_t segment_id);
  void add_stat_locked(Stat& s, int64_t delta);
  void reset_peaks_locked();
  [[noreturn]] void throw_oom_locked(
      uint64_t bytes, uint64_t rounded, Category c, uint32_t tag, const char* why,
      uint64_t segment = 0);  // segment: its size, when not the request's
  // A block from the pools, a new segment, or a new segment after emptying the cache; nullptr
  // when none of them serves the request.
  Block* find_or_map_locked(uint64_t rounded, bool small, Category category, uint32_t tag);
  Pool& pool(bool small) { return small ? small_pool_ : large_pool_; }

  std::unique_ptr<Arena> arena_;
  mutable std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::vector<std::unique_ptr<Segment>> segments_;  // ordered by id
  uint64_t next_segment_id_ = 1;
  uint64_t next_alloc_id_ = 1;
  MemoryStats stats_;
  int64_t limit_ = 0;
  int64_t lowest_refused_ = 0;
  // Shared so that a call in progress (made without the lock) keeps it alive if it is replaced.
  std::shared_ptr<const EvictionHandler> eviction_handler_;
  bool log_enabled_ = false;
  int64_t log_t0_ns_ = 0;
  uint64_t next_seq_ = 0;
  std::vector<MemoryEvent> events_;
  // baselines_[0]: where the log started; later entries: where it resumed after a pause.
  std::vector<EventLogBaseline> baselines_{EventLogBaseline{}};
  std::unordered_map<uint64_t, Block*> live_by_id_;
  std::unordered_set<const Block*> live_set_;  // free() validates its argument against it
  // The planned layout and its segment (outside segments_: never emptied, split or coalesced).
  std::shared_ptr<const PlannedLayout> layout_;
  std::unique_ptr<Segment> planned_segment_;
  size_t planned_next_ = 0;      // the step's next request
  bool planned_active_ = false;  // between begin_planned_step() and the layout's last request
  std::unordered_set<Block*> planned_live_;
  std::vector<Block*> planned_holes_;      // taken from the pools while the layout is installed
  std::vector<uintptr_t> planned_served_;  // planned_served()
};

// The process-wide allocator of a device. cpu: host memory; cuda:N: the CUDA arena (only in a
// CUDA build; otherwise a regen::Error says regen was built without CUDA), each behind a
// recycling arena. With REGEN_ALLOC_DIRECT=1 in the environment (read once, when the first of
// them is created; a value other than 0 or 1 is reported once and ignored) they use
// make_direct_arena(device) instead, for sanitizer runs. They are never destroyed (tensors in
// static storage may be released after main() returns); the exit check below reports what is
// still live instead.
CachingAllocator& allocator_for(Device device);

// ---- Dry runs ---------------------------------------------------------------------------------
// While a DryRunScope lives, on the thread that opened it (other threads are not affected),
// allocator_for(its device) is the scope's own caching allocator on the Null arena, and nothing
// reads or writes a tensor's bytes: fills, host copies and random initialisation are skipped, and
// item() reads 0. REGEN_LAUNCH skips every kernel except the launchers with a dry path
// (kernels/kernels.h, cpu:: and cuda::kDryRunLaunchers), which request the scratch space a real
// call takes and return. Tensors have shapes, dtypes and blocks, and no bytes, as on PyTorch's meta
// device. The scope's allocator starts with what the device keeps for the life of the process, as
// the device's own allocator holds it when the scope opens (its live blocks with a tag passed to
// exit_check_ignore_tag: cuBLAS's workspace, which kernels::prepare_device makes), requested again
// with the same sizes, categories and tags in the same order and held until the scope ends (kept).
// A training step run this way makes every tensor request a real one makes (their sizes never
// depend on values), in the same order, so the model's state is exact and so is the step's peak,
// scratch included, on the CPU and on CUDA (where the launchers' sizes that depend on the device,
// CUB's and cuDNN's, are queried from it: a CUDA dry run needs the GPU it describes). All of it is
// known before any of that memory is used (the pre-flight check before training). One scope at a
// time on a thread; every tensor made inside must be gone before it ends.
class DryRunScope {
 public:
  explicit DryRunScope(Device device);
  ~DryRunScope();
  DryRunScope(const DryRunScope&) = delete;
  DryRunScope& operator=(const DryRunScope&) = delete;
  CachingAllocator& allocator() { return *alloc_; }
  // The blocks requested at the start for what the device keeps, and their allocated bytes.
  int64_t kept_blocks() const { return static_cast<int64_t>(kept_.size()); }
  int64_t kept_bytes() const { return kept_bytes_; }

 private:
  std::unique_ptr<CachingAllocator> alloc_;
  std::vector<Block*> kept_;
  int64_t kept_bytes_ = 0;
};

// Live allocations of every process-wide allocator created so far: per allocator with live
// blocks, the bytes by category and the largest blocks with their tags. Empty when none is live
// (blocks with an ignored tag, below, do not count).
std::string live_allocations_report();

// What happens at process exit when a process-wide allocator still holds live blocks:
// off; warn (print live_allocations_report() to stderr; the default of builds without NDEBUG);
// fail (print it and end the process with status 3). The environment variable
// REGEN_EXIT_CHECK=off|warn|fail sets the mode before the first allocator is created.
// Blocks with a tag passed to exit_check_ignore_tag are persistent by design (e.g. a workspace
// held for the life of the process) and left out of the report.
enum class ExitCheck : uint8_t { off, warn, fail };
void set_exit_check(ExitCheck mode);
ExitCheck exit_check();
void exit_check_ignore_tag(std::string_view tag);

#ifdef REGEN_WITH_CUDA
// cudaMalloc segments on one device (core/cuda/runtime.cpp); map() returns nullptr when
// cudaMalloc reports out-of-memory.
std::unique_ptr<Arena> make_cuda_arena(int device_index);
// Pinned (page-locked) host memory for cuda:N's host tier (cudaHostAlloc), which copies on a
// stream of their own need to overlap compute; its device is cpu.
std::unique_ptr<Arena> make_pinned_host_arena(int device_index);
#endif

// ---- The host tier ------------------------------------------------------------------------------
// Where a device's offloaded tensors and optimizer state live (docs/memory.md, "The host tier"):
// a process-wide caching allocator of host memory beside the device's, with the same algorithm,
// categories and statistics, so its peaks are predicted to the byte like the device's. On the CPU
// it is a second allocator over host memory whose bytes never count towards the device
// allocator's limit; on cuda:N it holds pinned memory (make_pinned_host_arena). Its tensors report
// device cpu. Like allocator_for it sits behind a recycling arena, or in direct mode
// (REGEN_ALLOC_DIRECT=1) maps every block on its own, and it is never destroyed.
CachingAllocator& host_allocator_for(Device device);
// The arena behind it, named "host tier of <device>"; with `direct`, direct mode's (every block
// from the C heap, pageable also for a CUDA device).
std::unique_ptr<Arena> make_host_tier_arena(Device device, bool direct = false);

// Installs a planned layout for a scope (nullptr: none) and uninstalls it at its end; declare it
// after a LimitScope, so that the limit applies to the layout's arena.
class LayoutScope {
 public:
  LayoutScope(CachingAllocator& a, std::shared_ptr<const PlannedLayout> layout)
      : a_(a), active_(layout != nullptr) {
    if (active_) a_.set_planned_layout(std::move(layout));
  }
  ~LayoutScope() {
    if (active_) a_.set_planned_layout(nullptr);
  }
  LayoutScope(const LayoutScope&) = delete;
  LayoutScope& operator=(const LayoutScope&) = delete;

 private:
  CachingAllocator& a_;
  bool active_;
};

// Installs an eviction handler for a scope and removes it at its end (the DTR runtime while its
// steps run). One at a time: an allocator that has one already refuses a second (regen::Error).
class EvictionScope {
 public:
  EvictionScope(CachingAllocator& a, EvictionHandler handler);
  ~EvictionScope();
  EvictionScope(const EvictionScope&) = delete;
  EvictionScope& operator=(const EvictionScope&) = delete;

 private:
  CachingAllocator& a_;
};

// Sets an allocator's hard limit for a scope and puts the previous one back at its end (a
// training run with a budget: `LimitScope limit(allocator_for(device), plan.limit());`).
class LimitScope {
 public:
  LimitScope(CachingAllocator& a, int64_t limit) : a_(a), previous_(a.limit()) {
    a_.set_limit(limit);
  }
  ~LimitScope() { a_.set_limit(previous_); }
  LimitScope(const LimitScope&) = delete;
  LimitScope& operator=(const LimitScope&) = delete;

 private:
  CachingAllocator& a_;
  int64_t previous_;
};

}  // namespace regen
