// The `regen` Python module (pybind11): the objects the bindings share and the functions that
// define each part of the module. docs/python.md is the reference of what Python sees.
//   tensors.cpp  Tensor (buffer protocol), numpy conversions, safetensors
//   model.cpp    Model: a registered model with its optimizer, data and trainer; training with a
//                plan; state dicts and checkpoints
//   remat.cpp    Profile, Plan, Simulation; plan(), simulate(), make_plan(), Python planners
//   ops.cpp      regen.ops (the differentiable ops), regen.tensor, scopes (scope, block, no_grad)
//   registry.cpp models written in Python (register_model, Net, Layer), C++ extensions
//                (load_extension), what a model takes (model_options, model_input)
// Nothing here releases the GIL: a model, its tape and the allocators are used from one thread.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "regen/core/io.h"
#include "regen/models/model.h"
#include "regen/remat/plan/planner.h"
#include "regen/remat/simulate/simulator.h"
#include "regen/session/plan_request.h"

namespace regen::py {

namespace pb = pybind11;

// A profile as Python holds it: the Profile and its simulator (built once, used by every plan()
// and simulate() on it). Shared by the Profile object, the Plans made for it and the Model that
// uses it; immutable once made.
struct ProfileHandle {
  explicit ProfileHandle(Profile p);
  ~ProfileHandle();
  ProfileHandle(const ProfileHandle&) = delete;
  ProfileHandle& operator=(const ProfileHandle&) = delete;
  const Profile profile;
  const Simulator sim;
  // The file it was read from: "load_profile('p.json')" and its resolved path (core/io.h
  // resolved_path); an empty path when it was made here.
  NamedFile source;
  // What planners find on it whatever the budget (regen.plan passes it: dp's programme is built
  // once per profile).
  mutable PlanCache cache;
  // The simulated no-remat peak of that kind (what a percentage budget is of), simulated once.
  int64_t no_remat_peak(BudgetOf of) const;
  // The handle whose simulator is `sim`, if Python holds one (a planner written in Python is
  // handed the Profile object it was called for, not a copy).
  static std::shared_ptr<ProfileHandle> owner_of(const Simulator& sim);

 private:
  mutable int64_t no_remat_[2] = {-1, -1};
};
using ProfilePtr = std::shared_ptr<ProfileHandle>;
// The way to make one (owner_of finds it).
ProfilePtr make_profile_handle(Profile p);

// A plan with the profile it was made for (a plan's decisions index that profile's saved tensors).
struct PlanHandle {
  Plan plan;
  ProfilePtr profile;
  NamedFile source = {};  // the file it was read from ("load_plan('q.json')"), as ProfileHandle's
};

// An integer argument checked as the command line checks its flag: in `range`, else regen.Error
// "train: steps=0: must be a positive integer" (`call`: "train"); a bool, a float or another type
// is refused naming its type, an integer beyond int64 with the range's words.
int64_t int_arg(const std::string& call, const std::string& key, const pb::handle& v,
                const OptionRange& range);
// `path` as Python writes it, quoted: 'runs/m.csv'.
std::string path_text(const std::string& path);
// A Python object's type name ("str", "int", "Plan"), for messages about an argument of the wrong
// type.
inline std::string type_name_of(const pb::handle& obj) {
  return pb::str(obj.get_type().attr("__name__")).cast<std::string>();
}

// Files: no write from Python replaces a file that something reads or that holds another output
// (core/io.h check_distinct_files, the command line's check of its outputs). Every live Model
// registers what it reads (its data, a state it resumed, a checkpoint it loaded, the files its
// profile and plan were read from; model.cpp). Refuses writing `path` when it is one of those, or
// one of `inputs` (the writer's own: a plan's profile file); `call` names the write in the
// message: "Plan.save('p.json'): 'p.json' is the same file as load_profile('p.json'): ...".
// `own`: the file the object written was read from (a profile saved over its own file): not
// refused. `writer`: a Model writing (model.cpp), whose own files it checks itself.
class PyModel;
void check_write(const std::string& call, const std::string& path,
                 const std::vector<NamedFile>& inputs = {}, const NamedFile& own = {},
                 const PyModel* writer = nullptr);
// `source` of a handle read from `path` by `call` ("load_profile").
NamedFile source_file(const std::string& call, const std::string& path);

// "60%", "2GiB", a number of bytes, or None.
Budget budget_from(const pb::object& budget);
// A decision per saved tensor from a sequence or array of bools or 0/1 (True / 1: recompute), of
// fate codes 0, 1, 2 (retain, recompute, offload: regen.fates()) or of fate names ('offload',
// 'OFFLOAD', ...); throws regen::Error naming the length or the entry that is wrong.
std::vector<Decision> decisions_from(const pb::object& decisions, const Profile& p);
pb::array_t<bool> decisions_to_array(const std::vector<Decision>& d);
// The plan request of the Python arguments (chain 'auto'|'keep'|'drop', budget_of, layout; offload
// 'none'|'activations'|'optimizer'|'all' and transfer, a --transfer text), its messages naming
// keywords (session/plan_request.h); and its PlanOptions for plans on `profile`, which throws
// regen::Error naming a bad one.
PlanRequest plan_request(const std::string& chain, const std::string& budget_of,
                         const std::string& layout, const std::string& offload = "none",
                         const std::string& transfer = "profile");
PlanOptions plan_options(const std::string& chain, const std::string& budget_of,
                         const std::string& layout, const std::string& offload = "none",
                         const std::string& transfer = "profile", const Profile* profile = nullptr);
// Bytes by category name, for dicts.
pb::dict by_category(const std::array<int64_t, kNumCategories>& a);
// "keep" / "drop" (a planner's "auto" resolves to one of them).
bool keep_chain_from(const std::string& chain, const char* what);

// A CPU copy of `t` as a new numpy array (CUDA tensors are copied to the host).
pb::array tensor_to_numpy(const Tensor& t);
// A numpy array (f32, f64, i32 or i64; any layout) as a new CPU tensor; `what` names it in errors.
Tensor tensor_from_numpy(const pb::handle& array, const std::string& what);

// A configuration as Python sees it: name, seed and the model's options by key.
pb::dict config_dict(const ModelConfig& c);

void bind_tensors(pb::module_& m);
void bind_ops(pb::module_& m);
void bind_registry(pb::module_& m);
void bind_remat(pb::module_& m);
void bind_model(pb::module_& m);
void bind_dist(pb::module_& m);  // dist.cpp: regen.world(), mpirun

}  // namespace regen::py
