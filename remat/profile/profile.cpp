// Profile: JSON, derived fields and validation (profile.h).
#include "regen/remat/profile/profile.h"

// nlohmann/json's messages then name the field that was wrong ("(/nodes/3/fwd_ms) type must be
// number"), so a damaged file is reported by its field (remat/json_error.h). The macro puts this
// file's json types in an ABI namespace of their own, so the other files' json is not affected.
#define JSON_DIAGNOSTICS 1
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "regen/core/io.h"
#include "regen/remat/json_error.h"
#include "regen/remat/plan/compress.h"

namespace regen {

using nlohmann::json;

const char* marker_name(MarkerKind k) {
  switch (k) {
    case MarkerKind::iteration_begin:
      return "iteration_begin";
    case MarkerKind::fwd_begin:
      return "fwd_begin";
    case MarkerKind::fwd_end:
      return "fwd_end";
    case MarkerKind::backward_start:
      return "backward_start";
    case MarkerKind::bwd_begin:
      return "bwd_begin";
    case MarkerKind::bwd_end:
      return "bwd_end";
    case MarkerKind::backward_finish:
      return "backward_finish";
    case MarkerKind::optimizer_begin:
      return "optimizer_begin";
    case MarkerKind::optimizer_end:
      return "optimizer_end";
    case MarkerKind::iteration_end:
      return "iteration_end";
    case MarkerKind::micro_batch_end:
      return "micro_batch_end";
  }
  return "?";
}

int64_t Profile::micro_batch_marker() const {
  for (size_t m = 0; m < markers.size(); ++m) {
    if (markers[m].kind == MarkerKind::micro_batch_end) return static_cast<int64_t>(m);
  }
  return -1;
}

const ProfileSaved* Profile::saved_of_value(int64_t value) const {
  if (value < 0 || value >= static_cast<int64_t>(values.size())) return nullptr;
  const int32_t s = values[static_cast<size_t>(values[static_cast<size_t>(value)].root)].saved;
  return s >= 0 ? &saved[static_cast<size_t>(s)] : nullptr;
}

namespace {

json category_map(const std::array<int64_t, kNumCategories>& a) {
  json j = json::object();
  for (int i = 0; i < kNumCategories; ++i) j[category_name(static_cast<Category>(i))] = a[i];
  return j;
}

std::array<int64_t, kNumCategories> category_array(const json& j, const std::string& origin) {
  std::array<int64_t, kNumCategories> a{};
  REGEN_CHECK(j.is_object(), origin, ": expected an object of bytes by category");
  for (auto it = j.begin(); it != j.end(); ++it) {
    a[static_cast<int>(parse_category(it.key()))] = it.value().get<int64_t>();
  }
  return a;
}

MarkerKind parse_marker(const std::string& s, const std::string& origin) {
  for (int i = 0; i <= static_cast<int>(MarkerKind::micro_batch_end); ++i) {
    if (s == marker_name(static_cast<MarkerKind>(i))) return static_cast<MarkerKind>(i);
  }
  REGEN_FAIL(origin, ": unknown marker kind '", s, "'");
}

MemoryEventKind parse_event_kind(const std::string& s, const std::string& origin) {
  for (int i = 0; i <= static_cast<int>(MemoryEventKind::segment_unmap); ++i) {
    if (s == memory_event_name(static_cast<MemoryEventKind>(i))) {
      return static_cast<MemoryEventKind>(i);
    }
  }
  REGEN_FAIL(origin, ": unknown event kind '", s, "'");
}

OpKind parse_op(const std::string& s, const std::string& origin) {
  const OpKind kind = op_kind_by_name(s);
  REGEN_CHECK(kind != kNoOpKind, origin, ": unknown op '", s, "'");
  return kind;
}

DType parse_dtype(const std::string& s, const std::string& origin) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (s == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  REGEN_FAIL(origin, ": unknown dtype '", s, "'");
}

}  // namespace

const char* op_timing_name(OpTiming t) {
  return t == OpTiming::device ? "device" : "sync";
}

OpTiming parse_op_timing(const std::string& text, const std::string& origin) {
  if (text == "sync") return OpTiming::sync;
  if (text == "device") return OpTiming::device;
  REGEN_FAIL(origin, ": unknown op timing '", text, "': expected sync or device");
}

std::string profile_to_json(const Profile& p) {
  json j;
  j["format"] = "regen-profile-1";
  j["model"] = p.model;
  j["batch"] = p.batch;
  j["device"] = p.device;
  j["threads"] = p.threads;
  j["date"] = p.date;
  j["iterations"] = p.iterations;
  if (p.accumulate != 1) j["accumulate"] = p.accumulate;
  j["run"] = p.run;
  if (p.op_timing != OpTiming::sync) j["op_timing"] = op_timing_name(p.op_timing);
  if (p.compress != Compression::none) {
    j["compress"] = compression_name(p.compress);
    const CompressCost& c = p.compress_cost;
    j["compress_cost"] = {{"narrow_fixed_ms", c.narrow_fixed_ms},
                          {"narrow_ms_per_mib", c.narrow_ms_per_mib},
                          {"widen_fixed_ms", c.widen_fixed_ms},
                          {"widen_ms_per_mib", c.widen_ms_per_mib}};
  }
  j["measured"] = {{"peak_allocated", p.peak_allocated},
                   {"peak_reserved", p.peak_reserved},
                   {"allocated_by_at_peak", category_map(p.allocated_by_at_peak)},
                   {"persistent_by", category_map(p.persistent_by)},
                   {"iteration_ms", p.iteration_ms},
                   {"forward_ms", p.forward_ms},
                   {"backward_ms", p.backward_ms},
                   {"optimizer_ms", p.optimizer_ms}};
  json nodes = json::array();
  for (const ProfileNode& n : p.nodes) {
    nodes.push_back({{"index", n.index},
                     {"op", n.op},
                     {"name", n.name},
                     {"scope", n.scope},
                     {"block", n.block},
                     {"is_view", n.is_view},
                     {"visible_outputs", n.num_visible_outputs},
                     {"inputs", n.inputs},
                     {"outputs", n.outputs},
                     {"saved", n.saved},
                     {"fwd_ms", n.fwd_ms},
                     {"bwd_ms", n.bwd_ms},
                     // Derived (recomputed from the event log on load; here for readers).
                     {"bwd_rank", n.bwd_rank},
                     {"fwd_alloc_bytes", n.fwd_alloc_bytes},
                     {"fwd_free_bytes", n.fwd_free_bytes},
                     {"bwd_alloc_bytes", n.bwd_alloc_bytes},
                     {"bwd_free_bytes", n.bwd_free_bytes}});
    if (n.packed) nodes.back()["packed"] = true;
  }
  j["nodes"] = std::move(nodes);
  json values = json::array();
  for (const ProfileValue& v : p.values) {
    values.push_back({{"id", v.id},
                      {"producer", v.producer},
                      {"slot", v.slot},
                      {"root", v.root},
                      {"shape", v.shape},
                      {"dtype", dtype_name(v.dtype)},
                      {"bytes", v.bytes},
                      {"leaf", v.leaf},
                      {"available", v.available},
                      {"alloc_id", v.alloc_id}});
  }
  j["values"] = std::move(values);
  json saved = json::array();
  for (const ProfileSaved& s : p.saved) {
    saved.push_back({{"value", s.value},
                     {"bytes", s.bytes},
                     {"category", category_name(s.category)},
                     // Derived (recomputed on load; here for readers): the lifetime in forward
                     // node indices (creation rank = producer) and backward-order positions.
                     {"name", s.name},
                     {"creation_rank", s.producer},
                     {"last_fwd_use", s.last_fwd_use},
                     {"first_bw_rank", s.first_bw_rank},
                     {"last_bw_rank", s.last_bw_rank},
                     {"readers", s.readers},
                     {"candidate", s.candidate},
                     {"offloadable", s.offloadable},
                     {"recompute_ms", s.recompute_ms}});
  }
  j["saved"] = std::move(saved);
  j["backward_order"] = p.backward_order;
  j["blocks"] = p.blocks;
  json segs = json::array();
  for (const AllocatorState::SegmentRec& s : p.start_state.segments) {
    json blocks = json::array();
    for (const BlockInfo& b : s.blocks) {
      blocks.push_back({b.offset, b.size, b.requested, b.allocated, category_name(b.category),
                        tag_name(b.tag), b.id});
    }
    segs.push_back({{"id", s.id},
                    {"size", s.size},
                    {"small", s.small},
                    {"category", category_name(s.category)},
                    {"blocks", std::move(blocks)}});
  }
  j["start_state"] = {{"next_segment_id", p.start_state.next_segment_id},
                      {"next_alloc_id", p.start_state.next_alloc_id},
                      {"segments", std::move(segs)}};
  // Events as compact rows with a tag table.
  std::map<std::string, size_t> tag_index;
  json tags = json::array();
  json events = json::array();
  for (const ProfileEvent& e : p.events) {
    auto it = tag_index.find(e.tag);
    if (it == tag_index.end()) {
      it = tag_index.emplace(e.tag, tags.size()).first;
      tags.push_back(e.tag);
    }
    events.push_back({memory_event_name(e.kind), e.block_id, e.bytes, e.requested,
                      category_name(e.category), it->second, e.time_ms});
  }
  j["tags"] = std::move(tags);
  j["events"] = std::move(events);
  json markers = json::array();
  for (const Marker& m : p.markers) {
    markers.push_back({marker_name(m.kind), m.node, m.position, m.time_ms});
  }
  j["markers"] = std::move(markers);
  if (p.transfer.valid()) j["transfer"] = json::parse(transfer_to_json(p.transfer));
  return j.dump(1);
}

Profile parse_profile_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": not valid JSON: ", json_error_text(e));
  }
  Profile p;
  try {
    REGEN_CHECK(j.is_object() && j.value("format", "") == "regen-profile-1", origin,
                ": not a regen profile (expected \"format\": \"regen-profile-1\")");
    p.model = j.at("model").get<std::string>();
    // Counts are JSON integers: nlohmann would truncate 2.5 to 2 and wrap 1e30.
    for (const char* key : {"batch", "threads", "iterations"}) {
      REGEN_CHECK(j.at(key).is_number_integer(), origin, ": \"", key, "\" must be an integer, got ",
                  j.at(key).dump());
    }
    p.batch = j.at("batch").get<int64_t>();
    p.device = j.at("device").get<std::string>();
    p.threads = j.at("threads").get<int>();
    p.date = j.at("date").get<std::string>();
    p.iterations = j.at("iterations").get<int>();
    p.accumulate = j.value("accumulate", int64_t{1});
    if (j.contains("run")) p.run = j.at("run").get<std::map<std::string, std::string>>();
    if (j.contains("op_timing"))
      p.op_timing = parse_op_timing(j.at("op_timing").get<std::string>(), origin + ": op_timing");
    if (j.contains("compress")) {
      p.compress = parse_compression(j.at("compress").get<std::string>(), origin + ": compress");
      const json& c = j.at("compress_cost");
      p.compress_cost.narrow_fixed_ms = c.at("narrow_fixed_ms").get<double>();
      p.compress_cost.narrow_ms_per_mib = c.at("narrow_ms_per_mib").get<double>();
      p.compress_cost.widen_fixed_ms = c.at("widen_fixed_ms").get<double>();
      p.compress_cost.widen_ms_per_mib = c.at("widen_ms_per_mib").get<double>();
    }
    const json& m = j.at("measured");
    p.peak_allocated = m.at("peak_allocated").get<int64_t>();
    p.peak_reserved = m.at("peak_reserved").get<int64_t>();
    p.allocated_by_at_peak = category_array(m.at("allocated_by_at_peak"), origin);
    p.persistent_by = category_array(m.at("persistent_by"), origin);
    p.iteration_ms = m.at("iteration_ms").get<double>();
    p.forward_ms = m.at("forward_ms").get<double>();
    p.backward_ms = m.at("backward_ms").get<double>();
    p.optimizer_ms = m.at("optimizer_ms").get<double>();
    if (j.contains("transfer")) p.transfer = transfer_from_json(j.at("transfer").dump(), origin);
    for (const json& n : j.at("nodes")) {
      ProfileNode node;
      node.index = n.at("index").get<int32_t>();
      node.op = n.at("op").get<std::string>();
      node.kind = parse_op(node.op, origin);
      node.name = n.at("name").get<std::string>();
      node.scope = n.at("scope").get<std::string>();
      node.block = n.at("block").get<int32_t>();
      node.is_view = n.at("is_view").get<bool>();
      node.num_visible_outputs = n.at("visible_outputs").get<int>();
      node.inputs = n.at("inputs").get<std::vector<int64_t>>();
      node.outputs = n.at("outputs").get<std::vector<int64_t>>();
      node.saved = n.at("saved").get<std::vector<int64_t>>();
      node.fwd_ms = n.at("fwd_ms").get<double>();
      node.bwd_ms = n.at("bwd_ms").get<double>();
      node.packed = n.value("packed", false);
      p.nodes.push_back(std::move(node));
    }
    for (const json& v : j.at("values")) {
      ProfileValue val;
      val.id = v.at("id").get<int64_t>();
      val.producer = v.at("producer").get<int32_t>();
      val.slot = v.at("slot").get<int32_t>();
      val.root = v.at("root").get<int64_t>();
      val.shape = v.at("shape").get<Shape>();
      val.dtype = parse_dtype(v.at("dtype").get<std::string>(), origin);
      val.bytes = v.at("bytes").get<uint64_t>();
      val.leaf = v.at("leaf").get<bool>();
      val.available = v.value("available", true);
      val.alloc_id = v.at("alloc_id").get<uint64_t>();
      p.values.push_back(std::move(val));
    }
    for (const json& s : j.at("saved")) {
      ProfileSaved sv;
      sv.index = static_cast<int32_t>(p.saved.size());
      sv.value = s.at("value").get<int64_t>();
      sv.bytes = s.at("bytes").get<uint64_t>();
      sv.category = parse_category(s.at("category").get<std::string>());
      p.saved.push_back(std::move(sv));
    }
    p.backward_order = j.at("backward_order").get<std::vector<int32_t>>();
    p.blocks = j.at("blocks").get<std::vector<std::string>>();
    const json& st = j.at("start_state");
    p.start_state.next_segment_id = st.at("next_segment_id").get<uint64_t>();
    p.start_state.next_alloc_id = st.at("next_alloc_id").get<uint64_t>();
    for (const json& s : st.at("segments")) {
      AllocatorState::SegmentRec rec;
      rec.id = s.at("id").get<uint64_t>();
      rec.size = s.at("size").get<uint64_t>();
      rec.small = s.at("small").get<bool>();
      rec.category = parse_category(s.at("category").get<std::string>());
      for (const json& b : s.at("blocks")) {
        REGEN_CHECK(b.is_array() && b.size() == 7, origin, ": malformed block in segment ", rec.id);
        BlockInfo bi{};
        bi.segment_id = rec.id;
        bi.offset = b[0].get<uint64_t>();
        bi.size = b[1].get<uint64_t>();
        bi.requested = b[2].get<uint64_t>();
        bi.allocated = b[3].get<bool>();
        bi.small_pool = rec.small;
        bi.category = parse_category(b[4].get<std::string>());
        bi.tag = intern_tag(b[5].get<std::string>());
        bi.id = b[6].get<uint64_t>();
        rec.blocks.push_back(bi);
      }
      p.start_state.segments.push_back(std::move(rec));
    }
    const std::vector<std::string> tags = j.at("tags").get<std::vector<std::string>>();
    for (const json& e : j.at("events")) {
      REGEN_CHECK(e.is_array() && e.size() == 7, origin, ": malformed event ", p.events.size());
      ProfileEvent ev;
      ev.kind = parse_event_kind(e[0].get<std::string>(), origin);
      ev.block_id = e[1].get<uint64_t>();
      ev.bytes = e[2].get<int64_t>();
      ev.requested = e[3].get<int64_t>();
      ev.category = parse_category(e[4].get<std::string>());
      const size_t t = e[5].get<size_t>();
      REGEN_CHECK(t < tags.size(), origin, ": event ", p.events.size(), " has tag index ", t,
                  " beyond the ", tags.size(), " tags");
      ev.tag = tags[t];
      ev.time_ms = e[6].get<double>();
      p.events.push_back(std::move(ev));
    }
    for (const json& mk : j.at("markers")) {
      REGEN_CHECK(mk.is_array() && mk.size() == 4, origin, ": malformed marker ", p.markers.size());
      Marker marker;
      marker.kind = parse_marker(mk[0].get<std::string>(), origin);
      marker.node = mk[1].get<int32_t>();
      marker.position = mk[2].get<uint64_t>();
      marker.time_ms = mk[3].get<double>();
      p.markers.push_back(marker);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": malformed profile: ", json_error_text(e));
  }
  validate_profile(p, origin);
  finalize_profile(p);
  return p;
}

void validate_profile(const Profile& p, const std::string& origin) {
  int64_t micro_ends = 0;
  for (const Marker& m : p.markers) micro_ends += m.kind == MarkerKind::micro_batch_end ? 1 : 0;
  REGEN_CHECK(p.accumulate >= 1 && p.accumulate <= (int64_t{1} << 20), origin, ": accumulate ",
              p.accumulate, " is not a count of micro-batches");
  REGEN_CHECK(micro_ends == (p.accumulate > 1 ? 1 : 0), origin, ": ", micro_ends,
              " micro_batch_end marker(s) for accumulate ", p.accumulate,
              " (one with accumulation, none without)");
  const int64_t nv = static_cast<int64_t>(p.values.size());
  const int32_t nn = static_cast<int32_t>(p.nodes.size());
  auto value_ok = [&](int64_t v) { return v >= 0 && v < nv; };
  for (int64_t i = 0; i < nv; ++i) {
    const ProfileValue& v = p.values[static_cast<size_t>(i)];
    REGEN_CHECK(v.id == i, origin, ": value ", i, " has id ", v.id);
    REGEN_CHECK(value_ok(v.root), origin, ": value ", i, " has root ", v.root, " out of range");
    REGEN_CHECK(v.leaf == (v.producer < 0), origin, ": value ", i, " leaf flag disagrees with ",
                "its producer ", v.producer);
    if (!v.leaf) {
      REGEN_CHECK(v.producer < nn, origin, ": value ", i, " has producer ", v.producer,
                  " out of range");
      const ProfileNode& n = p.nodes[static_cast<size_t>(v.producer)];
      for (int64_t in : n.inputs) {
        REGEN_CHECK(in < i, origin, ": value ", i, " is computed from value ", in,
                    ", which comes after it");
      }
      REGEN_CHECK(v.slot >= 0 && v.slot < static_cast<int32_t>(n.outputs.size()) &&
                      n.outputs[static_cast<size_t>(v.slot)] == i,
                  origin, ": value ", i, " is not output ", v.slot, " of node ", v.producer);
    }
    uint64_t numel = 1;
    for (int64_t d : v.shape) {
      REGEN_CHECK(d >= 0 && d <= (int64_t{1} << 40), origin, ": value ", i, " has shape ",
                  sh(v.shape), " (dimensions must be in [0, 2^40])");
      numel = numel * static_cast<uint64_t>(d);
      REGEN_CHECK(numel <= (uint64_t{1} << 44), origin, ": value ", i, " has shape ", sh(v.shape),
                  " (more than 2^44 elements)");
    }
    REGEN_CHECK(numel * dtype_size(v.dtype) == v.bytes, origin, ": value ", i, " has ", v.bytes,
                " bytes for shape ", sh(v.shape));
  }
  for (int32_t i = 0; i < nn; ++i) {
    const ProfileNode& n = p.nodes[static_cast<size_t>(i)];
    REGEN_CHECK(n.index == i, origin, ": node ", i, " has index ", n.index);
    for (int64_t v : n.inputs) {
      REGEN_CHECK(v == -1 || value_ok(v), origin, ": node ", i, " input ", v, " out of range");
    }
    for (int64_t v : n.outputs) {
      REGEN_CHECK(value_ok(v) && p.values[static_cast<size_t>(v)].producer == i, origin, ": node ",
                  i, " output ", v, " is not produced by it");
    }
    for (int64_t v : n.saved) REGEN_CHECK(value_ok(v), origin, ": node ", i, " saves ", v, "?");
    REGEN_CHECK(
        n.num_visible_outputs >= 0 && n.num_visible_outputs <= static_cast<int>(n.outputs.size()),
        origin, ": node ", i, " has ", n.num_visible_outputs, " visible outputs");
    REGEN_CHECK(n.block >= -1 && n.block < static_cast<int32_t>(p.blocks.size()), origin, ": node ",
                i, " is in block ", n.block, " of ", p.blocks.size());
  }
  std::vector<int64_t> saved_as(p.values.size(), -1);
  for (size_t s = 0; s < p.saved.size(); ++s) {
    const ProfileSaved& sv = p.saved[s];
    REGEN_CHECK(value_ok(sv.value) && p.values[static_cast<size_t>(sv.value)].root == sv.value,
                origin, ": saved tensor ", s, " refers to value ", sv.value,
                " which is not a storage root");
    int64_t& first = saved_as[static_cast<size_t>(sv.value)];
    REGEN_CHECK(first < 0, origin, ": saved tensors ", first, " and ", s, " both name value ",
                sv.value, " (each storage is saved once)");
    first = static_cast<int64_t>(s);
    REGEN_CHECK(sv.bytes == p.values[static_cast<size_t>(sv.value)].bytes, origin,
                ": saved tensor ", s, " has ", sv.bytes, " bytes but its value ", sv.value, " has ",
                p.values[static_cast<size_t>(sv.value)].bytes);
  }
  // What a node saves for backward is a saved tensor's storage (the schedule looks each one up).
  for (int32_t i = 0; i < nn; ++i) {
    for (int64_t v : p.nodes[static_cast<size_t>(i)].saved) {
      const int64_t root = p.values[static_cast<size_t>(v)].root;
      REGEN_CHECK(saved_as[static_cast<size_t>(root)] >= 0, origin, ": node ", i, " saves value ",
                  v, ", whose storage (value ", root, ") no saved tensor names");
    }
  }
  std::vector<char> in_backward(static_cast<size_t>(nn), 0);
  for (int32_t n : p.backward_order) {
    REGEN_CHECK(n >= 0 && n < nn, origin, ": backward order names node ", n, " out of range");
    REGEN_CHECK(!in_backward[static_cast<size_t>(n)], origin, ": backward order names node ", n,
                " twice");
    in_backward[static_cast<size_t>(n)] = 1;
  }
  // The backward pass runs consumers before producers: a node's gradient needs its outputs'.
  std::vector<int64_t> bwd_rank(static_cast<size_t>(nn), -1);
  for (size_t r = 0; r < p.backward_order.size(); ++r) {
    bwd_rank[static_cast<size_t>(p.backward_order[r])] = static_cast<int64_t>(r);
  }
  for (int32_t i = 0; i < nn; ++i) {
    const ProfileNode& n = p.nodes[static_cast<size_t>(i)];
    const int64_t ri = bwd_rank[static_cast<size_t>(i)];
    if (ri < 0) continue;
    for (int64_t v : n.inputs) {
      if (v < 0) continue;
      const int32_t prod = p.values[static_cast<size_t>(v)].producer;
      if (prod < 0) continue;
      const int64_t rp = bwd_rank[static_cast<size_t>(prod)];
      REGEN_CHECK(rp < 0 || rp > ri, origin, ": backward order runs node ", prod, " (rank ", rp,
                  ") before node ", i, " (rank ", ri, "), which consumes its output");
    }
  }
  auto time_ok = [](double t) { return std::isfinite(t) && t >= 0; };
  for (const ProfileNode& n : p.nodes) {
    REGEN_CHECK(time_ok(n.fwd_ms) && time_ok(n.bwd_ms), origin, ": node ", n.index, " has times ",
                n.fwd_ms, " / ", n.bwd_ms, " ms (must be finite and >= 0)");
  }
  for (double t : {p.iteration_ms, p.forward_ms, p.backward_ms, p.optimizer_ms}) {
    REGEN_CHECK(time_ok(t), origin, ": measured times must be finite and >= 0, got ", t, " ms");
  }
  REGEN_CHECK(p.peak_allocated >= 0 && p.peak_reserved >= p.peak_allocated, origin,
              ": measured peaks are ", p.peak_allocated, " allocated and ", p.peak_reserved,
              " reserved bytes");
  for (size_t i = 0; i < p.events.size(); ++i) {
    const ProfileEvent& e = p.events[i];
    REGEN_CHECK(e.bytes > 0 && e.requested >= 0 && e.requested <= e.bytes, origin, ": event ", i,
                " (", memory_event_name(e.kind), ") has ", e.bytes, " bytes for ", e.requested,
                " requested");
  }
  for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
    uint64_t expect = 0;
    for (const BlockInfo& b : seg.blocks) {
      REGEN_CHECK(b.offset == expect && b.size > 0 && b.requested <= b.size, origin,
                  ": start_state segment ", seg.id, " has a block at offset ", b.offset, " of ",
                  b.size, " bytes where one at ", expect, " was expected");
      expect += b.size;
    }
    REGEN_CHECK(seg.id > 0 && expect == seg.size, origin, ": start_state segment ", seg.id, " of ",
                seg.size, " bytes is tiled by ", expect, " bytes of blocks");
  }
  uint64_t last = 0;
  for (size_t m = 0; m < p.markers.size(); ++m) {
    const Marker& mk = p.markers[m];
    REGEN_CHECK(mk.position >= last && mk.position <= p.events.size(), origin, ": marker ", m,
                " at event ", mk.position, " is out of order or past the ", p.events.size(),
                " events");
    last = mk.position;
    REGEN_CHECK(mk.node >= -1 && mk.node < nn, origin, ": marker ", m, " names node ", mk.node);
  }
  REGEN_CHECK(p.batch > 0, origin, ": batch must be positive, got ", p.batch);
  REGEN_CHECK(p.iterations >= 1, origin, ": iterations must be at least 1, got ", p.iterations);
  try {
    Device::parse(p.device);
  } catch (const Error& e) {
    REGEN_FAIL(origin, ": device '", p.device, "': ", e.message());
  }
  // A node saves tensors for its backward only: one that saves and is not in the backward order
  // means an order cut short (the planner would see fewer readers than the step has).
  for (int32_t i = 0; i < nn; ++i) {
    REGEN_CHECK(
        p.nodes[static_cast<size_t>(i)].saved.empty() || in_backward[static_cast<size_t>(i)],
        origin, ": node ", i,
        " saves tensors for its backward but is not in the backward "
        "order");
  }
}

NodeWindows node_windows(const Profile& p) {
  const size_t n = p.nodes.size();
  NodeWindows w{std::vector<int64_t>(n, -1), std::vector<int64_t>(n, -1),
                std::vector<int64_t>(n, -1), std::vector<int64_t>(n, -1)};
  for (const Marker& m : p.markers) {
    if (m.node < 0 || static_cast<size_t>(m.node) >= n) continue;
    const size_t i = static_cast<size_t>(m.node);
    const int64_t pos = static_cast<int64_t>(m.position);
    if (m.kind == MarkerKind::fwd_begin) w.fwd_begin[i] = pos;
    if (m.kind == MarkerKind::fwd_end) w.fwd_end[i] = pos;
    if (m.kind == MarkerKind::bwd_begin) w.bwd_begin[i] = pos;
    if (m.kind == MarkerKind::bwd_end) w.bwd_end[i] = pos;
  }
  return w;
}

double standalone_recompute_ms(const Profile& p, int32_t s) {
  // A value is at hand when it is a leaf (or a view of one), was produced by a node replayed
  // here, or its storage is a saved tensor other than `s` (resident by assumption).
  std::vector<char> replayed(p.nodes.size(), 0), produced(p.values.size(), 0);
  double ms = 0;
  auto at_hand = [&](int64_t v) {
    const ProfileValue& val = p.values[static_cast<size_t>(v)];
    if (val.leaf || produced[static_cast<size_t>(v)]) return true;
    const ProfileValue& root = p.values[static_cast<size_t>(val.root)];
    return root.leaf || (root.saved >= 0 && root.saved != s);
  };
  // Depth first, inputs before their consumer (as a regeneration program orders its steps).
  std::function<void(int64_t)> need = [&](int64_t v) {
    if (v < 0 || at_hand(v)) return;
    const int32_t node = p.values[static_cast<size_t>(v)].producer;
    if (replayed[static_cast<size_t>(node)]) return;
    const ProfileNode& n = p.nodes[static_cast<size_t>(node)];
    for (int64_t in : n.inputs) need(in);
    replayed[static_cast<size_t>(node)] = 1;
    ms += n.fwd_ms;
    for (int64_t out : n.outputs) produced[static_cast<size_t>(out)] = 1;
  };
  need(p.saved[static_cast<size_t>(s)].value);
  return ms;
}

std::string recompute_blockers(const Profile& p) {
  // For every value, the first unavailable leaf its recomputation would have to read (-1: none).
  std::vector<int64_t> blocker(p.values.size(), -1);
  for (const ProfileValue& v : p.values) {
    const size_t i = static_cast<size_t>(v.id);
    if (v.leaf) {
      if (!v.available) blocker[i] = v.id;
      continue;
    }
    for (int64_t in : p.nodes[static_cast<size_t>(v.producer)].inputs) {
      if (in >= 0 && blocker[static_cast<size_t>(in)] >= 0) {
        blocker[i] = blocker[static_cast<size_t>(in)];
        break;
      }
    }
  }
  const int32_t last_forward = static_cast<int32_t>(p.nodes.size()) - 1;
  std::vector<std::pair<int64_t, std::pair<int64_t, uint64_t>>> by_leaf;  // leaf, (count, bytes)
  for (const ProfileSaved& s : p.saved) {
    const ProfileValue& root = p.values[static_cast<size_t>(s.value)];
    const int64_t b = blocker[static_cast<size_t>(root.id)];
    if (root.leaf || b < 0 || s.bytes == 0 || s.first_bw_rank < 0 ||
        s.last_fwd_use >= last_forward) {
      continue;
    }
    auto it =
        std::find_if(by_leaf.begin(), by_leaf.end(), [&](const auto& e) { return e.first == b; });
    if (it == by_leaf.end()) it = by_leaf.insert(by_leaf.end(), {b, {0, 0}});
    it->second.first += 1;
    it->second.second += s.bytes;
  }
  std::string out;
  for (const auto& [leaf, tally] : by_leaf) {
    const ProfileValue& v = p.values[static_cast<size_t>(leaf)];
    const std::string reader = v.consumers.empty()
                                   ? std::string("no op")
                                   : p.nodes[static_cast<size_t>(v.consumers.front())].name;
    out += (out.empty() ? "" : "; ") + std::to_string(tally.first) + " saved tensor(s) (" +
           format_bytes(static_cast<int64_t>(tally.second)) +
           ") cannot be recomputed: they depend on a " + shape_str(v.shape) + " leaf read by " +
           reader +
           " that is freed before backward (a tensor made "
           "in forward without a gradient, over " +
           format_bytes(static_cast<int64_t>(Value::kHeldLeafBytes)) +
           ", which the tape does not "
           "hold); make it once outside forward, or keep a reference to it until backward";
  }
  return out;
}

void finalize_profile(Profile& p) {
  // Saved-tensor indices on root values, consumers.
  for (ProfileValue& v : p.values) {
    v.consumers.clear();
    v.saved = -1;
  }
  for (size_t s = 0; s < p.saved.size(); ++s) {
    p.saved[s].index = static_cast<int32_t>(s);
    p.values[static_cast<size_t>(p.saved[s].value)].saved = static_cast<int32_t>(s);
  }
  for (const ProfileNode& n : p.nodes) {
    for (int64_t in : n.inputs) {
      if (in >= 0) p.values[static_cast<size_t>(in)].consumers.push_back(n.index);
    }
  }
  for (ProfileNode& n : p.nodes) n.bwd_rank = -1;
  for (size_t r = 0; r < p.backward_order.size(); ++r) {
    p.nodes[static_cast<size_t>(p.backward_order[r])].bwd_rank = static_cast<int32_t>(r);
  }
  const int32_t last_forward = static_cast<int32_t>(p.nodes.size()) - 1;
  for (ProfileSaved& s : p.saved) {
    const ProfileValue& root = p.values[static_cast<size_t>(s.value)];
    s.producer = root.producer;
    s.readers.clear();
    s.first_bw_rank = s.last_bw_rank = -1;
    // Last forward use: the latest node reading the storage through any value sharing it.
    s.last_fwd_use = root.producer;
    for (const ProfileValue& v : p.values) {
      if (v.root != s.value) continue;
      for (int32_t c : v.consumers) s.last_fwd_use = std::max(s.last_fwd_use, c);
    }
    s.name = root.leaf ? "leaf#" + std::to_string(root.id)
                       : p.nodes[static_cast<size_t>(root.producer)].name + ":" +
                             std::to_string(root.slot);
  }
  for (const ProfileNode& n : p.nodes) {
    for (int64_t v : n.saved) {
      const int32_t s = p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)].saved;
      if (s < 0) continue;
      ProfileSaved& sv = p.saved[static_cast<size_t>(s)];
      if (sv.readers.empty() || sv.readers.back() != n.index) sv.readers.push_back(n.index);
      if (n.bwd_rank >= 0) {
        sv.first_bw_rank =
            sv.first_bw_rank < 0 ? n.bwd_rank : std::min(sv.first_bw_rank, n.bwd_rank);
        sv.last_bw_rank = std::max(sv.last_bw_rank, n.bwd_rank);
      }
    }
  }
  // Whether a value can be recomputed from leaves that are still readable during backward,
  // however far back a regeneration has to go (values are in creation order, so inputs come
  // before the values computed from them).
  std::vector<char> replayable(p.values.size(), 1);
  for (const ProfileValue& v : p.values) {
    if (v.leaf) {
      replayable[static_cast<size_t>(v.id)] = v.available;
      continue;
    }
    for (int64_t in : p.nodes[static_cast<size_t>(v.producer)].inputs) {
      if (in >= 0 && !replayable[static_cast<size_t>(in)])
        replayable[static_cast<size_t>(v.id)] = 0;
    }
  }
  for (ProfileSaved& s : p.saved) {
    const ProfileValue& root = p.values[static_cast<size_t>(s.value)];
    s.candidate = !root.leaf && replayable[static_cast<size_t>(root.id)] && root.alloc_id != 0 &&
                  s.bytes > 0 && s.first_bw_rank >= 0 && s.last_fwd_use < last_forward;
    s.offloadable = !root.leaf && root.alloc_id != 0 && s.bytes > 0 && s.first_bw_rank >= 0 &&
                    s.last_fwd_use < last_forward && s.category == Category::activation;
  }
  for (ProfileSaved& s : p.saved) {
    s.recompute_ms = s.candidate ? standalone_recompute_ms(p, s.index) : 0.0;
  }
  // Per-node bytes allocated and freed in its forward and backward windows.
  const NodeWindows w = node_windows(p);
  auto tally = [&](int64_t b, int64_t e, int64_t& alloc, int64_t& freed) {
    alloc = freed = 0;
    if (b < 0 || e < b) return;
    for (int64_t i = b; i < e; ++i) {
      const ProfileEvent& ev = p.events[static_cast<size_t>(i)];
      if (ev.kind == MemoryEventKind::alloc) alloc += ev.bytes;
      if (ev.kind == MemoryEventKind::free) freed += ev.bytes;
    }
  };
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    tally(w.fwd_begin[n], w.fwd_end[n], p.nodes[n].fwd_alloc_bytes, p.nodes[n].fwd_free_bytes);
    tally(w.bwd_begin[n], w.bwd_end[n], p.nodes[n].bwd_alloc_bytes, p.nodes[n].bwd_free_bytes);
  }
}

void save_profile(const Profile& p, const std::string& path) {
  write_file_atomic(path, profile_to_json(p));
}

}  // namespace regen
