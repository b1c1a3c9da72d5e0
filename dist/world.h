// The processes of one data-parallel job: how this process was launched (mpirun's environment,
// or nothing: a process alone is one rank, exactly as regen runs without MPI), its rank and the
// number of ranks, and the job-wide control collectives (small values on the calling thread:
// options compared across ranks, a loss averaged, a profile handed from rank 0). Tensors are
// reduced by a Communicator (communicator.h), not here. MPI is initialized on the first call to
// world() in a process that a launcher started, and finalized by finalize() (the regen tool calls
// it; an exit handler does otherwise). docs/distributed.md. Tests: tests/test_dist.cpp (one
// process), tests/mpi/ (two ranks under mpirun).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regen::dist {

// What the environment says about how this process was started. Nothing is initialized.
struct Launch {
  bool launched = false;  // a launcher's variables were found
  int rank = 0, size = 1;
  int local_rank = 0;    // the rank among those on this host (picks a GPU), when it is known
  std::string launcher;  // "Open MPI", "PMI" (MPICH's Hydra, Slurm), "PMIx"; "" alone
};
// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} (Open MPI's mpirun), PMI_RANK/PMI_SIZE (MPICH's
// Hydra, Slurm's PMI) or PMIX_RANK with OMPI/PMIx sizes. A value that is not a number, or a rank
// outside [0, size), is a regen::Error naming the variable.
Launch detect_launch();

// True when regen was built with MPI (CMake REGEN_MPI found one).
bool mpi_built();
// True when regen was built with NCCL (CMake REGEN_NCCL found one beside CUDA).
bool nccl_built();

class World {
 public:
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  // More than one rank: data parallelism is on for the sessions this process makes.
  bool distributed() const { return size_ > 1; }
  // MPI was initialized (a launcher started the process, and regen has MPI).
  bool mpi() const { return mpi_; }
  // "rank 1 of 2".
  std::string describe() const;

  // Job-wide collectives: every rank calls them, in the same order, with the same sizes. On one
  // rank they return at once.
  void barrier();
  // `bytes` bytes of `data` from `root` to every rank.
  void broadcast(void* data, uint64_t bytes, int root);
  std::string broadcast(const std::string& text, int root);
  // Every rank's value, by rank.
  std::vector<std::string> all_gather(const std::string& text);
  std::vector<double> all_gather(double value);
  std::vector<int64_t> all_gather(int64_t value);

  // Ends the whole job now with `code` (MPI_Abort under MPI; the process alone otherwise). Called
  // after the error was printed; never returns.
  [[noreturn]] void abort(int code);

 private:
  friend World& world();
  friend void finalize();
  World() = default;
  void init();
  void all_gather_bytes(const void* value, int bytes, void* out);
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool mpi_ = false;
};

// The process's world, initialized on first use: under a launcher with MPI built, MPI with
// MPI_THREAD_MULTIPLE (each CPU communicator has a thread of its own). Refused, with what to do:
// a launch with more than one rank in a build without MPI; an MPI that gives fewer threads; a size
// that differs from the launcher's.
World& world();
// Ends MPI (after the communicators: their threads and NCCL communicators go first). Idempotent;
// also registered as an exit handler when MPI is initialized.
void finalize();

}  // namespace regen::dist
