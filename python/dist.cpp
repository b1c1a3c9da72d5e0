// Data parallelism from Python (docs/python.md, "Under mpirun"): `mpirun -np 2 python3 train.py`
// gives each rank a regen.Model that trains its shard of every global batch, as `regen train`
// does (the library's session). At import, a process that a launcher started initializes MPI and
// replaces sys.excepthook: an exception no one catches is printed with the rank that raised it and
// then ends the whole job (MPI_Abort), so that no other rank waits for it forever. regen.world()
// says where this process is.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "python/bindings.h"
#include "regen/dist/world.h"

namespace regen::py {

void bind_dist(pb::module_& m) {
  m.def(
      "world",
      [] {
        const dist::World& w = dist::world();
        pb::dict d;
        d["rank"] = w.rank();
        d["size"] = w.size();
        d["local_rank"] = w.local_rank();
        d["mpi"] = w.mpi();
        return d;
      },
      "This process's place in the job: {'rank', 'size', 'local_rank', 'mpi'}; rank 0 of 1 alone. "
      "Under mpirun each regen.Model trains its rank's shard of every global batch");
  if (!dist::detect_launch().launched) return;
  dist::world();  // MPI now, before the program's own threads
  pb::module_ sys = pb::module_::import("sys");
  pb::object previous = sys.attr("excepthook");
  sys.attr("excepthook") =
      pb::cpp_function([previous](pb::object type, pb::object value, pb::object tb) {
        dist::World& w = dist::world();
        const std::string head =
            "regen: error: " + w.describe() + ": an uncaught Python exception ends the job:\n";
        if (!w.distributed()) {
          std::fprintf(stderr, "%s", head.c_str());
          previous(type, value, tb);
          return;
        }
        // Under mpirun the whole report goes out in one write, then the job ends: the launcher
        // forwards a rank's output in the pieces it reads, and its own abort notice could land
        // inside a traceback written line by line.
        std::string text = head;
        for (const pb::handle line :
             pb::module_::import("traceback").attr("format_exception")(type, value, tb)) {
          text += line.cast<std::string>();
        }
        pb::module_::import("sys").attr("stderr").attr("flush")();
        std::fflush(stderr);
        for (size_t done = 0; done < text.size();) {
          const ssize_t n = ::write(2, text.data() + done, text.size() - done);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          done += static_cast<size_t>(n);
        }
        w.abort(1);
      });
}

}  // namespace regen::py
