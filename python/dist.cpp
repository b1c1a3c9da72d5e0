// Data parallelism from Python (docs/python.md, "Under mpirun"): `mpirun -np 2 python3 train.py`
// gives each rank a regen.Model that trains its shard of every global batch, as `regen train`
// does (the library's session). At import, a process that a launcher started initializes MPI and
// replaces sys.excepthook: an exception no one catches is printed with the rank that raised it and
// then ends the whole job (MPI_Abort), so that no other rank waits for it forever. regen.world()
// says where this process is.
#include <cstdio>

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
        std::fprintf(stderr, "regen: error: %s: an uncaught Python exception ends the job:\n",
                     w.describe().c_str());
        previous(type, value, tb);
        if (w.distributed()) w.abort(1);
      });
}

}  // namespace regen::py
