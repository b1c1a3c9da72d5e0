// The `regen` Python module: errors, build facts, and the parts defined in tensors.cpp, ops.cpp,
// remat.cpp, model.cpp and registry.cpp. docs/python.md is its reference; examples/python uses it.
#include "python/bindings.h"
#include "regen/core/error.h"
#include "regen/dist/world.h"
#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#endif

#ifndef REGEN_VERSION
#define REGEN_VERSION "unknown"
#endif

namespace {
// The Python exception types, made once by the module's init.
PyObject* g_error = nullptr;
PyObject* g_oom = nullptr;
}  // namespace

PYBIND11_MODULE(regen, m) {
  namespace pb = pybind11;
  m.doc() =
      "regen: training under a memory budget with exact rematerialization plans. Profile one "
      "iteration, plan with any registered planner or score your own decision vectors with "
      "the exact simulator, and train under the plan.";
  m.attr("__version__") = REGEN_VERSION;

  // regen::Error and regen::OutOfMemory as Python exceptions carrying regen's message (without
  // the C++ source position). The objects live as long as the process: the module is never
  // unloaded, and releasing them after the interpreter's finalization would crash.
  auto* error = new pb::exception<regen::Error>(m, "Error");
  auto* oom = new pb::exception<regen::OutOfMemory>(m, "OutOfMemory", error->ptr());
  error->doc() =
      "Raised for anything regen refuses: bad input, a plan that does not fit, a file that is "
      "wrong";
  oom->doc() = "Raised when the allocator runs out of memory (a subclass of regen.Error)";
  g_error = error->ptr();
  g_oom = oom->ptr();
  pb::register_exception_translator([](std::exception_ptr p) {
    // A signal that arrived meanwhile comes first: regen re-raises SIGINT after stopping a MILP
    // solve, and Ctrl-C should then be KeyboardInterrupt, not the error that followed it.
    if (PyErr_CheckSignals() != 0) return;
    try {
      if (p) std::rethrow_exception(p);
    } catch (const regen::OutOfMemory& e) {
      PyErr_SetString(g_oom, e.message().c_str());
    } catch (const regen::Error& e) {
      PyErr_SetString(g_error, e.message().c_str());
    }
  });

  pb::dict build;
#ifdef REGEN_WITH_CUDA
  build["cuda"] = true;
#else
  build["cuda"] = false;
#endif
#ifdef REGEN_WITH_CUDNN
  build["cudnn"] = true;
#else
  build["cudnn"] = false;
#endif
#ifdef REGEN_PY_WITH_MILP
  build["milp"] = true;
#else
  build["milp"] = false;
#endif
  build["mpi"] = regen::dist::mpi_built();
  build["nccl"] = regen::dist::nccl_built();
  m.attr("build") = build;
  m.def(
      "cuda_available",
      [] {
#ifdef REGEN_WITH_CUDA
        return regen::cuda::device_count() > 0;
#else
        return false;
#endif
      },
      "Whether regen was built with CUDA and a GPU is visible; raises regen.Error when the CUDA "
      "runtime fails for another reason than a missing GPU (an old driver, say)");

  regen::py::bind_tensors(m);
  regen::py::bind_ops(m);
  regen::py::bind_remat(m);
  regen::py::bind_model(m);
  regen::py::bind_registry(m);
  regen::py::bind_dist(m);
}
