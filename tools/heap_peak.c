/* heap_peak.c: a heap-bytes counter to LD_PRELOAD into a process (here: PyTorch on the CPU).

   PyTorch's CPU allocator keeps no statistics (nothing like torch.cuda.max_memory_allocated),
   so tools/torch_baseline.py measures CPU memory with this library instead. It interposes the C
   heap's entry points (malloc, calloc, realloc, reallocarray, free, memalign, aligned_alloc,
   posix_memalign, valloc, pvalloc), forwards each call to the next definition (glibc's malloc,
   found with dlsym(RTLD_NEXT, ...)), and keeps two process-wide counters with atomics:
     current  the bytes of live heap blocks, each counted as malloc_usable_size() of the block
              (what the allocator really handed out, padding included), and
     peak     the largest value `current` has had since the library was loaded or since the
              last heap_reset_peak().
   Functions for Python's ctypes (found through ctypes.CDLL(None) once preloaded):
     long long heap_current_bytes(void);  the live heap bytes now
     long long heap_peak_bytes(void);     the peak live heap bytes since the last reset
     void heap_reset_peak(void);          sets the peak to the current live bytes

   Build:   cc -O2 -shared -fPIC -o heap_peak.so tools/heap_peak.c -ldl
   Use:     LD_PRELOAD=$PWD/heap_peak.so python3 ...
   tools/torch_baseline.py --device cpu does both by itself: it compiles this file with `cc`
   into a cache folder (or the path given with --heap-lib), re-executes its own command line
   with the library in LD_PRELOAD, then per mode and batch calls heap_reset_peak() after the
   warm-up steps, runs the timed steps and reads heap_peak_bytes() (the CSV's peak_bytes with
   peak_kind "heap_peak") beside heap_current_bytes() just before them (live_before_bytes).

   What is counted: everything that goes through the C heap, i.e. through these functions. That
   includes PyTorch's CPU tensors (c10's CPU allocator calls posix_memalign), C++ operator new
   (autograd's graph, oneDNN's scratch buffers) and CPython's larger blocks. Large blocks that
   glibc's malloc serves with mmap (above its mmap threshold) still go through malloc, so they
   are counted. Memory that a library maps itself with mmap is not: OpenBLAS's per-thread
   buffers, thread stacks, mapped files, and CPython's small objects (pymalloc takes its arenas
   from mmap; PYTHONMALLOC=malloc would route them through malloc). Neither are blocks allocated
   before this library was loaded. The counters are process-wide: all threads add up.

   Our own code, written for regen; no dependency beyond libc and libdl. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- the counters ---------------------------------------------------------------------- */

static _Atomic long long g_current;
static _Atomic long long g_peak;

static void count_alloc(long long n) {
  const long long now = atomic_fetch_add_explicit(&g_current, n, memory_order_relaxed) + n;
  long long seen = atomic_load_explicit(&g_peak, memory_order_relaxed);
  while (now > seen && !atomic_compare_exchange_weak_explicit(
                           &g_peak, &seen, now, memory_order_relaxed, memory_order_relaxed)) {
  }
}

static void count_free(long long n) {
  atomic_fetch_sub_explicit(&g_current, n, memory_order_relaxed);
}

__attribute__((visibility("default"))) long long heap_current_bytes(void) {
  return atomic_load_explicit(&g_current, memory_order_relaxed);
}

__attribute__((visibility("default"))) long long heap_peak_bytes(void) {
  return atomic_load_explicit(&g_peak, memory_order_relaxed);
}

__attribute__((visibility("default"))) void heap_reset_peak(void) {
  atomic_store_explicit(&g_peak, atomic_load_explicit(&g_current, memory_order_relaxed),
                        memory_order_relaxed);
}

/* ---- the next allocator ---------------------------------------------------------------- */

typedef void* (*malloc_fn)(size_t);
typedef void* (*calloc_fn)(size_t, size_t);
typedef void* (*realloc_fn)(void*, size_t);
typedef void (*free_fn)(void*);
typedef void* (*memalign_fn)(size_t, size_t);
typedef int (*posix_memalign_fn)(void**, size_t, size_t);
typedef void* (*valloc_fn)(size_t);
typedef size_t (*usable_fn)(void*);

static struct {
  malloc_fn malloc;
  calloc_fn calloc;
  realloc_fn realloc;
  free_fn free;
  memalign_fn memalign;
  memalign_fn aligned_alloc;
  posix_memalign_fn posix_memalign;
  valloc_fn valloc;
  valloc_fn pvalloc;
  usable_fn usable;
} next;

static _Atomic int g_resolved;  /* 1 once every pointer in `next` is set */
static _Atomic int g_resolving; /* 1 while dlsym runs (dlsym itself may call calloc/malloc) */

/* While dlsym runs, allocations come from this static arena; its blocks are never freed (there
   are at most a few, for dlerror's buffer) and never counted. Each block is preceded by its
   size, so realloc can move one out. */
#define BOOT_BYTES (64 * 1024)
static _Alignas(64) unsigned char g_boot[BOOT_BYTES];
static _Atomic size_t g_boot_used;

static int in_boot(const void* p) {
  return (const unsigned char*)p >= g_boot && (const unsigned char*)p < g_boot + BOOT_BYTES;
}

static void* boot_alloc(size_t size, size_t align) {
  if (align < 16) align = 16;
  if (align > 4096 || size > BOOT_BYTES) return NULL;
  size_t used = atomic_load(&g_boot_used);
  for (;;) {
    size_t start = (used + sizeof(size_t) + align - 1) & ~(align - 1);
    size_t end = start + ((size + 15) & ~(size_t)15);
    if (end > BOOT_BYTES) return NULL;
    if (atomic_compare_exchange_weak(&g_boot_used, &used, end)) {
      memcpy(g_boot + start - sizeof(size_t), &size, sizeof size);
      return g_boot + start;
    }
  }
}

static size_t boot_size(const void* p) {
  size_t size;
  memcpy(&size, (const unsigned char*)p - sizeof(size_t), sizeof size);
  return size;
}

static void resolve(void) {
  if (atomic_load_explicit(&g_resolved, memory_order_acquire)) return;
  atomic_store(&g_resolving, 1);
  next.malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
  next.calloc = (calloc_fn)dlsym(RTLD_NEXT, "calloc");
  next.realloc = (realloc_fn)dlsym(RTLD_NEXT, "realloc");
  next.free = (free_fn)dlsym(RTLD_NEXT, "free");
  next.memalign = (memalign_fn)dlsym(RTLD_NEXT, "memalign");
  next.aligned_alloc = (memalign_fn)dlsym(RTLD_NEXT, "aligned_alloc");
  next.posix_memalign = (posix_memalign_fn)dlsym(RTLD_NEXT, "posix_memalign");
  next.valloc = (valloc_fn)dlsym(RTLD_NEXT, "valloc");
  next.pvalloc = (valloc_fn)dlsym(RTLD_NEXT, "pvalloc");
  next.usable = (usable_fn)dlsym(RTLD_NEXT, "malloc_usable_size");
  atomic_store(&g_resolving, 0);
  if (next.malloc && next.calloc && next.realloc && next.free && next.memalign &&
      next.posix_memalign && next.usable) {
    atomic_store_explicit(&g_resolved, 1, memory_order_release);
  }
}

/* Resolve on load, before the process starts threads; the entry points also resolve lazily in
   case another library's constructor allocates first. */
__attribute__((constructor)) static void heap_peak_init(void) {
  resolve();
}

/* 1 when the caller must use the boot arena (dlsym is running, or resolution failed). */
static int booting(void) {
  if (atomic_load_explicit(&g_resolved, memory_order_acquire)) return 0;
  if (atomic_load(&g_resolving)) return 1;
  resolve();
  return !atomic_load_explicit(&g_resolved, memory_order_acquire);
}

static long long usable(void* p) {
  return p ? (long long)next.usable(p) : 0;
}

/* ---- the interposed entry points ------------------------------------------------------- */

#define EXPORT __attribute__((visibility("default")))

EXPORT void* malloc(size_t size) {
  if (booting()) return boot_alloc(size, 16);
  void* p = next.malloc(size);
  if (p) count_alloc(usable(p));
  return p;
}

EXPORT void* calloc(size_t n, size_t size) {
  if (booting()) {
    if (size && n > SIZE_MAX / size) return NULL;
    return boot_alloc(n * size, 16); /* static storage: already zero, never reused */
  }
  void* p = next.calloc(n, size);
  if (p) count_alloc(usable(p));
  return p;
}

EXPORT void free(void* p) {
  if (!p || in_boot(p)) return;
  if (booting()) return; /* cannot happen for a block the next allocator gave out */
  count_free(usable(p));
  next.free(p);
}

EXPORT void* realloc(void* p, size_t size) {
  if (p && in_boot(p)) { /* move a boot block to the real heap */
    void* q = malloc(size);
    if (q) {
      size_t old = boot_size(p);
      memcpy(q, p, old < size ? old : size);
    }
    return q;
  }
  if (booting()) return p ? NULL : boot_alloc(size, 16);
  const long long before = usable(p);
  void* q = next.realloc(p, size);
  if (q) {
    const long long after = usable(q);
    if (after >= before) {
      count_alloc(after - before);
    } else {
      count_free(before - after);
    }
  } else if (p && size == 0) {
    count_free(before); /* glibc's realloc(p, 0) frees p and returns NULL */
  }
  return q;
}

EXPORT void* reallocarray(void* p, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, n * size);
}

EXPORT void* memalign(size_t align, size_t size) {
  if (booting()) return boot_alloc(size, align);
  void* p = next.memalign(align, size);
  if (p) count_alloc(usable(p));
  return p;
}

EXPORT void* aligned_alloc(size_t align, size_t size) {
  if (booting()) return boot_alloc(size, align);
  void* p = next.aligned_alloc ? next.aligned_alloc(align, size) : next.memalign(align, size);
  if (p) count_alloc(usable(p));
  return p;
}

EXPORT int posix_memalign(void** out, size_t align, size_t size) {
  if (booting()) {
    void* p = boot_alloc(size, align);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
  }
  const int rc = next.posix_memalign(out, align, size);
  if (rc == 0 && *out) count_alloc(usable(*out));
  return rc;
}

EXPORT void* valloc(size_t size) {
  if (booting()) return boot_alloc(size, 4096);
  void* p = next.valloc ? next.valloc(size) : next.memalign((size_t)sysconf(_SC_PAGESIZE), size);
  if (p) count_alloc(usable(p));
  return p;
}

EXPORT void* pvalloc(size_t size) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (booting()) return boot_alloc((size + page - 1) & ~(page - 1), 4096);
  void* p =
      next.pvalloc ? next.pvalloc(size) : next.memalign(page, (size + page - 1) & ~(page - 1));
  if (p) count_alloc(usable(p));
  return p;
}

/* Callers may ask the size of a boot block too (glibc's own would misread it). */
EXPORT size_t malloc_usable_size(void* p) {
  if (!p) return 0;
  if (in_boot(p)) return boot_size(p);
  if (booting()) return 0;
  return next.usable(p);
}
