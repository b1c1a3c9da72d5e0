// The regen tool under mpirun (docs/distributed.md): MPI is started before any flag is read, so
// that a rank that fails anywhere (a bad flag, a bad file, running out of memory) can end the whole
// job; only rank 0 writes to stdout and writes files; an error is printed by the rank that raised
// it, naming it ("regen: error: rank 1 of 2: ..."), and then the job is aborted, so no rank waits
// in a collective for a peer that is gone; and every rank's command line is compared with rank 0's
// before a command runs. A process alone is unchanged. Tests: tests/mpi/.
#pragma once

#include <string>
#include <vector>

namespace regen::tool {

// The job for the lifetime of run_cli: initializes the world (dist/world.h) and sends the stdout
// of ranks other than 0 to /dev/null; finalize() ends MPI when the command succeeded.
class JobScope {
 public:
  JobScope();
  ~JobScope();
  JobScope(const JobScope&) = delete;
  JobScope& operator=(const JobScope&) = delete;
  // "" alone, "rank R of N: " under mpirun (put after "regen: error: ").
  std::string error_prefix() const;
  // The exit status `code` of a command: under mpirun a failure (code != 0) ends the whole job
  // now, after the message was printed; otherwise returns `code`.
  int finish(int code);
};

// Rank 0 (or a process alone): the rank that writes outputs.
bool output_rank();
// Under mpirun, refuses (on rank 0, naming the rank and both command lines) a rank started with
// another command line than rank 0's; the other ranks wait for rank 0 to end the job.
void check_same_command_line(const std::vector<std::string>& args);

}  // namespace regen::tool
