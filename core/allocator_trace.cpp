// The allocator's event log as a Chrome trace (allocator.h chrome_trace).
#include "regen/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "regen/core/error.h"

namespace regen {

namespace {
std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace

std::string CachingAllocator::chrome_trace(bool use_sequence_time) const {
  std::vector<MemoryEvent> evs;
  std::vector<EventLogBaseline> baselines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    evs = events_;
    baselines = baselines_;
  }
  const std::string dev = arena_->name();
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"regen allocator " +
         json_escape(dev) + "\"}}";
  // The events carry changes; the counters start from what was live when the log started.
  std::array<int64_t, kNumCategories> by{};
  char buf[512];
  auto allocated_counter = [&](double ts) {
    out += ",\n{\"name\":\"allocated by category\",\"ph\":\"C\",\"pid\":1,\"tid\":1,";
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"args\":{", ts);
    out += buf;
    for (int i = 0; i < kNumCategories; ++i) {
      std::snprintf(buf, sizeof buf, "%s\"%s\":%lld", i ? "," : "",
                    category_name(static_cast<Category>(i)), static_cast<long long>(by[i]));
      out += buf;
    }
    out += "}}";
  };
  auto reserved_counter = [&](double ts, int64_t reserved) {
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"reserved\",\"ph\":\"C\",\"pid\":1,\"tid\":1,\"ts\":%.3f,"
                  "\"args\":{\"reserved\":%lld}}",
                  ts, static_cast<long long>(reserved));
    out += buf;
  };
  size_t next_baseline = 0;
  auto apply_baselines = [&](uint64_t up_to_seq) {
    for (; next_baseline < baselines.size() && baselines[next_baseline].seq <= up_to_seq;
         ++next_baseline) {
      const EventLogBaseline& b = baselines[next_baseline];
      const double ts = use_sequence_time ? static_cast<double>(b.seq) : b.time_ns / 1000.0;
      by = b.allocated_by;
      allocated_counter(ts);
      reserved_counter(ts, b.reserved);
    }
  };
  for (const MemoryEvent& e : evs) {
    apply_baselines(e.seq);
    const double ts = use_sequence_time ? static_cast<double>(e.seq) : e.time_ns / 1000.0;
    const int ci = static_cast<int>(e.category);
    if (e.kind == MemoryEventKind::alloc) by[ci] += e.bytes;
    if (e.kind == MemoryEventKind::free) by[ci] -= e.bytes;
    if (e.kind == MemoryEventKind::alloc || e.kind == MemoryEventKind::free) allocated_counter(ts);
    reserved_counter(ts, e.reserved_after);
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":2,\"ts\":%.3f,"
                  "\"args\":{\"bytes\":%lld,\"requested\":%lld,\"category\":\"%s\",\"block\":%llu,"
                  "\"segment\":%llu,\"seq\":%llu,\"tag\":\"",
                  memory_event_name(e.kind), ts, static_cast<long long>(e.bytes),
                  static_cast<long long>(e.requested), category_name(e.category),
                  static_cast<unsigned long long>(e.block_id),
                  static_cast<unsigned long long>(e.segment_id),
                  static_cast<unsigned long long>(e.seq));
    out += buf;
    out += json_escape(tag_name(e.tag));
    out += "\"}}";
  }
  apply_baselines(~uint64_t{0});  // a log resumed with no event since
  out += "\n]}\n";
  return out;
}

}  // namespace regen
