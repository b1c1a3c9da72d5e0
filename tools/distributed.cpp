// The regen tool under mpirun (distributed.h).
#include "tools/distributed.h"

#include <cstdio>

#include "regen/core/error.h"
#include "regen/dist/world.h"

namespace regen::tool {

JobScope::JobScope() {
  dist::World& w = dist::world();  // throws, e.g. a launch of several ranks without MPI
  if (w.rank() != 0) {
    // Every rank runs the same command; rank 0 speaks for the job (errors go to stderr from the
    // rank that has them).
    std::fflush(stdout);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) std::fprintf(stderr, "\n");
  }
}

JobScope::~JobScope() {
  dist::finalize();
}

std::string JobScope::error_prefix() const {
  const dist::World& w = dist::world();
  return w.distributed() ? w.describe() + ": " : std::string();
}

int JobScope::finish(int code) {
  dist::World& w = dist::world();
  if (code != 0 && w.distributed()) w.abort(code);
  return code;
}

bool output_rank() {
  return dist::world().rank() == 0;
}

void check_same_command_line(const std::vector<std::string>& args) {
  dist::World& w = dist::world();
  if (!w.distributed()) return;
  std::string mine;
  for (const std::string& a : args) mine += (mine.empty() ? "" : " ") + a;
  const std::vector<std::string> all = w.all_gather(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    if (w.rank() != 0) w.barrier();  // rank 0 ends the job
    REGEN_FAIL("rank ", r, " of ", all.size(), " was started as `regen ", all[r],
               "` but rank 0 as `regen ", all[0],
               "`: every rank of a job runs the same command (mpirun -np N regen ...)");
  }
}

}  // namespace regen::tool
