// The job's processes and their control collectives (world.h).
#include "regen/dist/world.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "regen/core/error.h"
#include "regen/dist/communicator.h"

#ifdef REGEN_WITH_MPI
#include <mpi.h>
#endif

namespace regen::dist {

namespace {

// An environment variable as an integer, or `fallback` when unset.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  REGEN_CHECK(errno == 0 && end != v && *end == '\0' && n >= 0 && n <= (1 << 24), "environment ",
              name, "='", v, "' is not a rank or a number of ranks");
  return static_cast<int>(n);
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

#ifdef REGEN_WITH_MPI
// The control communicator: a duplicate of MPI_COMM_WORLD, so that these collectives never match
// a communicator's (communicator.cpp has its own duplicates).
MPI_Comm g_control = MPI_COMM_NULL;
#endif
bool g_initialized = false;
bool g_finalized = false;
std::mutex g_mutex;

}  // namespace

Launch detect_launch() {
  Launch l;
  if (env_set("OMPI_COMM_WORLD_SIZE")) {
    l.launcher = "Open MPI";
    l.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  } else if (env_set("PMI_SIZE")) {
    l.launcher = "PMI";
    l.size = env_int("PMI_SIZE", 1);
    l.rank = env_int("PMI_RANK", 0);
    l.local_rank = env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", 0));
  } else if (env_set("PMIX_RANK")) {
    l.launcher = "PMIx";
    l.rank = env_int("PMIX_RANK", 0);
    l.size = env_int("PMIX_SIZE", env_int("SLURM_NTASKS", l.rank + 1));
    l.local_rank = env_int("SLURM_LOCALID", 0);
  } else {
    return l;
  }
  l.launched = true;
  REGEN_CHECK(l.size >= 1 && l.rank < l.size, l.launcher, "'s environment says rank ", l.rank,
              " of ", l.size, " ranks");
  return l;
}

bool mpi_built() {
#ifdef REGEN_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#ifdef REGEN_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::string World::describe() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

void World::init() {
  const Launch l = detect_launch();
  local_rank_ = l.local_rank;
  if (!l.launched) return;
#ifdef REGEN_WITH_MPI
  // A CPU communicator's thread shares the cores with the computing thread: a collective waiting
  // for a peer must yield its core, not spin on it (Open MPI spins by default unless it sees the
  // cores oversubscribed; on a loaded 2-core machine a 100 KiB reduction took 50 ms spinning and
  // 0.1 ms yielding). A value the user set is kept.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  REGEN_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed (", l.launcher, " launch, rank ", l.rank,
              " of ", l.size, ")");
  mpi_ = true;
  g_initialized = true;
  std::atexit(finalize);
  REGEN_CHECK(provided >= MPI_THREAD_MULTIPLE, "this MPI gives thread level ", provided,
              ", but regen needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
              "): a CPU communicator runs its collectives on a thread of its own while the main "
              "thread computes (Open MPI and MPICH both give it)");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  REGEN_CHECK(size_ == l.size && rank_ == l.rank, "MPI says rank ", rank_, " of ", size_, ", but ",
              l.launcher, "'s environment says rank ", l.rank, " of ", l.size);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_control);
#else
  REGEN_CHECK(l.size == 1, l.launcher, " started this process as rank ", l.rank, " of ", l.size,
              ", but regen was built without MPI (CMake found none, or REGEN_MPI=OFF): install "
              "libopenmpi-dev and openmpi-bin (scripts/install-deps.sh) and configure again");
  rank_ = 0;
  size_ = 1;
#endif
}

World& world() {
  static World w;
  std::lock_guard<std::mutex> lock(g_mutex);
  static bool done = false;
  if (!done) {
    done = true;  // a failed init is not retried: the error stands
    w.init();
  }
  return w;
}

void finalize() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_initialized || g_finalized) return;
    g_finalized = true;
  }
  const bool clean = shutdown_communicators();
#ifdef REGEN_WITH_MPI
  // A collective left waiting for a failed peer: MPI_Finalize would wait for it too.
  if (!clean) world().abort(1);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (g_control != MPI_COMM_NULL) MPI_Comm_free(&g_control);
    MPI_Finalize();
  }
#else
  (void)clean;
#endif
}

void World::barrier() {
  if (size_ == 1) return;
#ifdef REGEN_WITH_MPI
  MPI_Barrier(g_control);
#endif
}

void World::broadcast(void* data, uint64_t bytes, int root) {
  REGEN_CHECK(root >= 0 && root < size_, "broadcast from rank ", root, " of ", size_);
  if (size_ == 1 || bytes == 0) return;
#ifdef REGEN_WITH_MPI
  char* p = static_cast<char*>(data);
  constexpr uint64_t kMax = 1u << 30;
  for (uint64_t at = 0; at < bytes; at += kMax) {
    const int n = static_cast<int>(std::min(kMax, bytes - at));
    MPI_Bcast(p + at, n, MPI_BYTE, root, g_control);
  }
#else
  (void)data;
#endif
}

std::string World::broadcast(const std::string& text, int root) {
  if (size_ == 1) return text;
  uint64_t n = rank_ == root ? text.size() : 0;
  broadcast(&n, sizeof n, root);
  std::string out = rank_ == root ? text : std::string(static_cast<size_t>(n), '\0');
  broadcast(out.data(), n, root);
  return out;
}

std::vector<std::string> World::all_gather(const std::string& text) {
  if (size_ == 1) return {text};
  std::vector<std::string> out(static_cast<size_t>(size_));
  const std::vector<int64_t> sizes = all_gather(static_cast<int64_t>(text.size()));
  for (int r = 0; r < size_; ++r) {
    std::string t = r == rank_ ? text : std::string(static_cast<size_t>(sizes[r]), '\0');
    broadcast(t.data(), static_cast<uint64_t>(t.size()), r);
    out[static_cast<size_t>(r)] = std::move(t);
  }
  return out;
}

// Each rank's `bytes` bytes at `value` into `out` (size() * bytes), by rank; `out` already holds
// this rank's value at every place.
void World::all_gather_bytes(const void* value, int bytes, void* out) {
#ifdef REGEN_WITH_MPI
  if (size_ > 1) MPI_Allgather(value, bytes, MPI_BYTE, out, bytes, MPI_BYTE, g_control);
#else
  (void)value;
  (void)bytes;
  (void)out;
#endif
}

std::vector<double> World::all_gather(double value) {
  std::vector<double> out(static_cast<size_t>(size_), value);
  all_gather_bytes(&value, sizeof value, out.data());
  return out;
}

std::vector<int64_t> World::all_gather(int64_t value) {
  std::vector<int64_t> out(static_cast<size_t>(size_), value);
  all_gather_bytes(&value, sizeof value, out.data());
  return out;
}

void World::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef REGEN_WITH_MPI
  if (mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
  std::_Exit(code);
}

}  // namespace regen::dist
