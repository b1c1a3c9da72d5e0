// Reports (report.h).
#include "regen/remat/report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace regen {

namespace {
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string mib(int64_t b) {
  return fmt("%.2f", static_cast<double>(b) / (1 << 20));
}
std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}
}  // namespace

bool is_activation(const Profile& p, const ProfileSaved& s) {
  const ProfileValue& v = p.values[static_cast<size_t>(s.value)];
  return !v.leaf && v.alloc_id != 0 && s.category == Category::activation;
}

// Bytes of the full form a packed node's saved form replaces: a relu's output (the mask replaces
// it), a max_pool2d's i32 argmax, one per output element.
int64_t full_form_bytes(const Profile& p, const ProfileNode& n) {
  const ProfileValue& out0 = p.values[static_cast<size_t>(n.outputs[0])];
  const int slot = op_def(n.kind).packed_output;
  if (slot == 0) return static_cast<int64_t>(out0.bytes);
  return shape_numel(out0.shape) * 4;
}

std::string packed_saves_table(const Profile& p, bool full) {
  std::ostringstream os;
  int64_t offered = 0, packed = 0, packed_bytes = 0, full_bytes = 0;
  std::vector<std::string> lines;
  const auto masks = p.run.find("--masks");
  const bool off = masks != p.run.end() && masks->second == "off";
  for (const ProfileNode& n : p.nodes) {
    const int slot = n.kind == kNoOpKind ? -1 : op_def(n.kind).packed_output;
    if (slot < 0 || n.bwd_rank < 0) continue;
    ++offered;
    std::string line = "  " + pad(n.name, 48);
    if (n.packed) {
      ++packed;
      int64_t bytes = 0;
      for (int64_t v : n.saved)
        bytes += static_cast<int64_t>(p.values[static_cast<size_t>(v)].bytes);
      const int64_t was = full_form_bytes(p, n);
      packed_bytes += bytes;
      full_bytes += was;
      line += "packed: " + format_bytes(bytes) + " instead of " + format_bytes(was);
    } else if (off) {
      line += "full (--masks off)";
    } else {
      // Why not: other nodes' backward reads the output a packed form would replace.
      const int64_t v = n.outputs[static_cast<size_t>(slot)];
      const ProfileSaved* sv = p.saved_of_value(p.values[static_cast<size_t>(v)].root);
      std::string others;
      int count = 0;
      for (int32_t r : sv ? sv->readers : std::vector<int32_t>{}) {
        if (r == n.index) continue;
        if (count++ < 2)
          others += (others.empty() ? "" : ", ") + p.nodes[static_cast<size_t>(r)].name;
      }
      if (count > 2) others += " and " + std::to_string(count - 2) + " more";
      line += count > 0 ? "full: also saved by " + others : "full";
    }
    lines.push_back(line);
  }
  if (offered == 0) return "";
  os << "\nPacked saves (--masks): " << packed << " of " << offered
     << " ops that offer a packed form save it, " << format_bytes(packed_bytes) << " instead of "
     << format_bytes(full_bytes) << "\n";
  const size_t shown = full ? lines.size() : std::min<size_t>(lines.size(), 12);
  for (size_t i = 0; i < shown; ++i) os << lines[i] << "\n";
  if (shown < lines.size())
    os << "  ... " << lines.size() - shown << " more (regen profile --full, profile.txt)\n";
  return os.str();
}

std::string profile_table(const Profile& p, bool full) {
  std::ostringstream os;
  os << "Profile of " << p.model << ", batch " << p.batch << " on " << p.device << " (" << p.threads
     << " threads), " << p.date << "; times are medians of " << p.iterations << " iterations"
     << (p.op_timing == OpTiming::device ? ", on the device's clock (--op-timing device)" : "")
     << "\n";
  os << "Iteration " << fmt("%.1f", p.iteration_ms) << " ms: forward " << fmt("%.1f", p.forward_ms)
     << " ms, backward " << fmt("%.1f", p.backward_ms) << " ms, optimizer "
     << fmt("%.1f", p.optimizer_ms) << " ms; " << p.nodes.size() << " ops, "
     << p.backward_order.size() << " with a backward\n";
  os << "Peak allocated " << format_bytes(p.peak_allocated) << ", peak reserved "
     << format_bytes(p.peak_reserved) << "\n";
  os << "\nMemory by category (MiB)      at iteration start    at the peak\n";
  for (int i = 0; i < kNumCategories; ++i) {
    if (!p.persistent_by[i] && !p.allocated_by_at_peak[i]) continue;
    os << "  " << pad(category_name(static_cast<Category>(i)), 26)
       << pad(mib(p.persistent_by[i]), 12, true) << pad(mib(p.allocated_by_at_peak[i]), 15, true)
       << "\n";
  }
  // What is live at the peak, from an exact replay of the iteration.
  {
    SimOptions so;
    so.top_live = full ? 25 : 10;
    const SimResult r =
        Simulator(p).run(without_compression(build_schedule(
                             p, std::vector<Decision>(p.saved.size(), Decision::retain))),
                         so);
    os << "\nLive at the peak (" << format_bytes(r.peak_allocated) << ", reached after "
       << (r.peak_at.empty() ? std::string("the start") : r.peak_at) << "), largest blocks:\n";
    os << "  " << pad("allocation tag", 56) << pad("category", 17) << pad("MiB", 10, true) << "\n";
    for (const LiveBlockRec& b : r.live_at_peak) {
      os << "  " << pad(b.tag.empty() ? "(untagged)" : b.tag, 56)
         << pad(category_name(b.category), 17) << pad(mib(b.bytes), 10, true) << "\n";
    }
  }
  // Saved tensors: activations and their lifetimes.
  std::vector<const ProfileSaved*> acts;
  int64_t act_bytes = 0;
  for (const ProfileSaved& s : p.saved) {
    if (is_activation(p, s)) {
      acts.push_back(&s);
      act_bytes += static_cast<int64_t>(s.bytes);
    }
  }
  os << "\nSaved activations: " << acts.size() << " (" << format_bytes(act_bytes) << "), "
     << std::count_if(acts.begin(), acts.end(), [](const ProfileSaved* s) { return s->candidate; })
     << " of them recomputable\n";
  if (!full) {
    std::stable_sort(acts.begin(), acts.end(), [](const ProfileSaved* a, const ProfileSaved* b) {
      return a->bytes > b->bytes;
    });
    if (acts.size() > 15) acts.resize(15);
    os << "Largest ones:\n";
  }
  const int32_t F = p.num_forward_nodes();
  os << "  " << pad("activation", 48) << pad("MiB", 10, true) << pad("created", 9, true)
     << pad("last fwd", 9, true) << pad("first bw", 9, true) << pad("last bw", 9, true)
     << pad("recompute ms", 14, true) << "\n";
  for (const ProfileSaved* s : acts) {
    os << "  " << pad(s->name, 48) << pad(mib(static_cast<int64_t>(s->bytes)), 10, true)
       << pad(std::to_string(s->producer), 9, true) << pad(std::to_string(s->last_fwd_use), 9, true)
       << pad(s->first_bw_rank >= 0 ? std::to_string(F + s->first_bw_rank) : "-", 9, true)
       << pad(s->last_bw_rank >= 0 ? std::to_string(F + s->last_bw_rank) : "-", 9, true)
       << pad(s->candidate ? fmt("%.3f", s->recompute_ms) : "-", 14, true) << "\n";
  }
  os << packed_saves_table(p, full);
  // Ops.
  std::vector<const ProfileNode*> ops;
  for (const ProfileNode& n : p.nodes) ops.push_back(&n);
  if (!full) {
    std::stable_sort(ops.begin(), ops.end(), [](const ProfileNode* a, const ProfileNode* b) {
      return a->fwd_ms + a->bwd_ms > b->fwd_ms + b->bwd_ms;
    });
    if (ops.size() > 15) ops.resize(15);
    os << "\nSlowest ops:\n";
  } else {
    os << "\nOps (forward rank; backward rank = " << F << " + position in backward):\n";
  }
  os << "  " << pad("rank", 6) << pad("op", 16) << pad("name", 44) << pad("fwd ms", 10, true)
     << pad("bwd ms", 10, true) << pad("fwd +MiB", 10, true) << pad("fwd -MiB", 10, true)
     << pad("bwd +MiB", 10, true) << pad("bwd -MiB", 10, true) << "\n";
  for (const ProfileNode* n : ops) {
    os << "  " << pad(std::to_string(n->index), 6) << pad(n->op, 16) << pad(n->name, 44)
       << pad(fmt("%.3f", n->fwd_ms), 10, true)
       << pad(n->bwd_rank >= 0 ? fmt("%.3f", n->bwd_ms) : "-", 10, true)
       << pad(mib(n->fwd_alloc_bytes), 10, true) << pad(mib(n->fwd_free_bytes), 10, true)
       << pad(mib(n->bwd_alloc_bytes), 10, true) << pad(mib(n->bwd_free_bytes), 10, true) << "\n";
  }
  return os.str();
}

std::string profile_trace(const Profile& p) {
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":"
     << json_str("regen " + p.model + " batch " + std::to_string(p.batch) + " on " + p.device)
     << "}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"forward\"}"
        "},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":"
        "\"backward\"}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":3,\"args\":{\"name\":"
        "\"optimizer\"}}";
  std::vector<double> fb(p.nodes.size(), 0), bb(p.nodes.size(), 0);
  double ob = 0;
  for (const Marker& m : p.markers) {
    const double us = m.time_ms * 1000.0;
    if (m.kind == MarkerKind::fwd_begin) fb[static_cast<size_t>(m.node)] = us;
    if (m.kind == MarkerKind::bwd_begin) bb[static_cast<size_t>(m.node)] = us;
    if (m.kind == MarkerKind::optimizer_begin) ob = us;
    if (m.kind == MarkerKind::fwd_end || m.kind == MarkerKind::bwd_end) {
      const ProfileNode& n = p.nodes[static_cast<size_t>(m.node)];
      const bool fwd = m.kind == MarkerKind::fwd_end;
      const double start = fwd ? fb[static_cast<size_t>(m.node)] : bb[static_cast<size_t>(m.node)];
      os << ",\n{\"name\":" << json_str(n.op + (fwd ? "" : " backward"))
         << ",\"cat\":" << json_str(fwd ? "forward" : "backward")
         << ",\"ph\":\"X\",\"pid\":1,\"tid\":" << (fwd ? 1 : 2) << ",\"ts\":" << fmt("%.3f", start)
         << ",\"dur\":" << fmt("%.3f", us - start) << ",\"args\":{\"node\":" << n.index
         << ",\"name\":" << json_str(n.name) << "}}";
    }
    if (m.kind == MarkerKind::optimizer_end) {
      os << ",\n{\"name\":\"optimizer step\",\"ph\":\"X\",\"pid\":1,\"tid\":3,\"ts\":"
         << fmt("%.3f", ob) << ",\"dur\":" << fmt("%.3f", us - ob) << "}";
    }
  }
  std::array<int64_t, kNumCategories> by = p.persistent_by;
  int64_t reserved = 0;
  for (const AllocatorState::SegmentRec& s : p.start_state.segments)
    reserved += static_cast<int64_t>(s.size);
  for (const ProfileEvent& e : p.events) {
    const int ci = static_cast<int>(e.category);
    switch (e.kind) {
      case MemoryEventKind::alloc:
        by[ci] += e.bytes;
        break;
      case MemoryEventKind::free:
        by[ci] -= e.bytes;
        break;
      case MemoryEventKind::segment_map:
        reserved += e.bytes;
        break;
      case MemoryEventKind::segment_unmap:
        reserved -= e.bytes;
        break;
    }
    os << ",\n{\"name\":\"allocated by category\",\"ph\":\"C\",\"pid\":1,\"ts\":"
       << fmt("%.3f", e.time_ms * 1000.0) << ",\"args\":{";
    for (int i = 0; i < kNumCategories; ++i) {
      os << (i ? "," : "") << "\"" << category_name(static_cast<Category>(i)) << "\":" << by[i];
    }
    os << "}},\n{\"name\":\"reserved\",\"ph\":\"C\",\"pid\":1,\"ts\":"
       << fmt("%.3f", e.time_ms * 1000.0) << ",\"args\":{\"reserved\":" << reserved << "}}";
  }
  os << "\n]}\n";
  return os.str();
}

std::string decisions_csv(const Profile& p, const Plan& plan) {
  std::ostringstream os;
  os << "activation_name,decision,median_mem_size_bytes,recomp_time_s,creation_rank,"
        "first_bw_use_rank\n";
  const int32_t F = p.num_forward_nodes();
  for (const ProfileSaved& s : p.saved) {
    if (!is_activation(p, s)) continue;
    os << s.name << "," << decision_name(plan.decisions[static_cast<size_t>(s.index)]) << ","
       << s.bytes << "," << fmt("%.6f", s.recompute_ms / 1000.0) << "," << s.producer << ","
       << (s.first_bw_rank >= 0 ? F + s.first_bw_rank : -1) << "\n";
  }
  return os.str();
}

std::string summary_table(const std::string& title, const std::vector<SweepRow>& rows) {
  const std::vector<std::string> head = {"Batch Size",
                                         "Initial Peak Memory (GB)",
                                         "Final Peak Memory (GB)",
                                         "Memory Reduction (GB)",
                                         "Memory Reduction (%)",
                                         "Initial Execution Time (s)",
                                         "Final Execution Time (s)",
                                         "Execution Time Overhead (s)",
                                         "Execution Time Overhead (%)",
                                         "Recomputation Time (s)",
                                         "Retained Activations",
                                         "Retained Activations (%)",
                                         "Recomputed Activations",
                                         "Recomputed Activations (%)",
                                         "Retained Memory (GB)",
                                         "Saved Memory (GB)"};
  std::vector<std::vector<std::string>> cells;
  for (const SweepRow& r : rows) {
    const double red = r.initial_peak_gb - r.final_peak_gb;
    const double over = r.final_time_s - r.initial_time_s;
    const int64_t total = r.retained + r.recomputed;
    cells.push_back({std::to_string(r.batch), fmt("%.3f", r.initial_peak_gb),
                     fmt("%.3f", r.final_peak_gb), fmt("%.3f", red),
                     fmt("%.1f%%", r.initial_peak_gb > 0 ? 100.0 * red / r.initial_peak_gb : 0),
                     fmt("%.3f", r.initial_time_s), fmt("%.3f", r.final_time_s), fmt("%.3f", over),
                     fmt("%.1f%%", r.initial_time_s > 0 ? 100.0 * over / r.initial_time_s : 0),
                     fmt("%.4f", r.recompute_s), std::to_string(r.retained),
                     fmt("%.1f%%", total ? 100.0 * r.retained / total : 100.0),
                     std::to_string(r.recomputed),
                     fmt("%.1f%%", total ? 100.0 * r.recomputed / total : 0.0),
                     fmt("%.3f", r.retained_gb), fmt("%.3f", r.saved_gb)});
  }
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    w[c] = head[c].size() + 4;
    for (auto& row : cells) w[c] = std::max(w[c], row[c].size() + 4);
  }
  auto rule = [&](char ch) {
    std::string s = "+";
    for (size_t c = 0; c < head.size(); ++c) s += std::string(w[c], ch) + "+";
    return s + "\n";
  };
  auto line = [&](const std::vector<std::string>& v) {
    std::string s = "|";
    for (size_t c = 0; c < v.size(); ++c) {
      const size_t left = (w[c] - v[c].size()) / 2;
      s += std::string(left, ' ') + v[c] + std::string(w[c] - v[c].size() - left, ' ') + "|";
    }
    return s + "\n";
  };
  std::string out = title + "\n\n" + rule('-') + line(head) + rule('=');
  for (auto& row : cells) out += line(row) + rule('-');
  return out;
}

std::string summary_csv(const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  os << "batch,policy,budget,budget_gb,feasible,initial_peak_gb,final_peak_gb,predicted_peak_gb,"
        "initial_time_s,final_time_s,predicted_time_s,recompute_s,retained,recomputed,"
        "retained_gb,saved_gb,budget_of,limit_gb,initial_reserved_gb,final_reserved_gb,"
        "predicted_reserved_gb\n";
  for (const SweepRow& r : rows) {
    os << r.batch << "," << r.policy << "," << r.budget << "," << fmt("%.6f", r.budget_gb) << ","
       << (r.feasible ? "yes" : "no") << "," << fmt("%.6f", r.initial_peak_gb) << ","
       << fmt("%.6f", r.final_peak_gb) << "," << fmt("%.6f", r.predicted_peak_gb) << ","
       << fmt("%.6f", r.initial_time_s) << "," << fmt("%.6f", r.final_time_s) << ","
       << fmt("%.6f", r.predicted_time_s) << "," << fmt("%.6f", r.recompute_s) << "," << r.retained
       << "," << r.recomputed << "," << fmt("%.6f", r.retained_gb) << "," << fmt("%.6f", r.saved_gb)
       << "," << r.budget_of << "," << fmt("%.6f", r.limit_gb) << ","
       << fmt("%.6f", r.initial_reserved_gb) << "," << fmt("%.6f", r.final_reserved_gb) << ","
       << fmt("%.6f", r.predicted_reserved_gb) << "\n";
  }
  return os.str();
}

}  // namespace regen
