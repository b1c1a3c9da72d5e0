// What people read: the profile table, the profile's Chrome trace, decisions.csv, and the
// summary table of a sweep in the format of the seed experiments' tables (docs/remat.md).
#pragma once

#include <string>
#include <vector>

#include "regen/remat/plan/planner.h"

namespace regen {

// Human-readable profile: header, timings, memory breakdown, then (full) every op and every
// saved activation; without `full` only the largest activations and slowest ops.
std::string profile_table(const Profile& p, bool full);

// The profile's packed saves (autograd/tape.h PackedSaves): every op that offers a packed form,
// whether it saves it (its bytes and the full form's) or why not (the other ops that save the same
// output); part of profile_table. "" when no op offers one.
std::string packed_saves_table(const Profile& p, bool full);

// Chrome trace-event JSON of the profiled iteration: forward and backward ops and the optimizer
// step on a timeline, with counter tracks of allocated bytes per category and reserved bytes.
std::string profile_trace(const Profile& p);

// decisions.csv with the seed's columns: activation_name, decision, median_mem_size_bytes,
// recomp_time_s, creation_rank, first_bw_use_rank (forward ops are ranked 0..F-1, backward ops
// F.. in the order they run).
std::string decisions_csv(const Profile& p, const Plan& plan);

// One row of the seed summary tables.
struct SweepRow {
  int64_t batch = 0;
  double initial_peak_gb = 0, final_peak_gb = 0;  // measured, allocated
  double initial_time_s = 0, final_time_s = 0;    // measured medians
  double recompute_s = 0;                         // measured regeneration time per iteration
  int64_t retained = 0, recomputed = 0;           // activations
  double retained_gb = 0, saved_gb = 0;           // bytes of retained / recomputed activations
  // Extra columns (CSV): predictions and feasibility.
  double predicted_peak_gb = 0, predicted_time_s = 0, budget_gb = 0;
  // Reserved bytes (what the device sees), measured and predicted, and the allocator's limit the
  // run had (0: none), and what the budget bounds.
  double initial_reserved_gb = 0, final_reserved_gb = 0, predicted_reserved_gb = 0, limit_gb = 0;
  std::string budget_of = "reserved";
  bool feasible = true;
  std::string policy, budget;
};

// The ASCII grid of the seeds' summary tables.
std::string summary_table(const std::string& title, const std::vector<SweepRow>& rows);
std::string summary_csv(const std::vector<SweepRow>& rows);

// Activations counted in the summary (saved tensors in the activation category produced in the
// iteration).
bool is_activation(const Profile& p, const ProfileSaved& s);

}  // namespace regen
