// Memory categories, the thread's category and tag scopes, the tag table and event names
// (allocator.h).
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

const char* category_name(Category c) {
  switch (c) {
    case Category::parameter:
      return "parameter";
    case Category::gradient:
      return "gradient";
    case Category::optimizer_state:
      return "optimizer_state";
    case Category::activation:
      return "activation";
    case Category::workspace:
      return "workspace";
    case Category::input:
      return "input";
    case Category::other:
      return "other";
    case Category::communication:
      return "communication";
  }
  return "?";
}

Category parse_category(const std::string& name) {
  for (int i = 0; i < kNumCategories; ++i) {
    if (name == category_name(static_cast<Category>(i))) return static_cast<Category>(i);
  }
  REGEN_FAIL("unknown memory category '", name,
             "': expected parameter, gradient, optimizer_state, activation, workspace, input, "
             "other or communication");
}

namespace {
thread_local Category tl_category = Category::other;
thread_local uint32_t tl_tag = 0;

struct TagTable {
  std::mutex mutex;
  std::vector<std::string> names{""};
  std::unordered_map<std::string, uint32_t> ids{{"", 0}};
};
TagTable& tag_table() {
  static TagTable* table = new TagTable();  // never destroyed: tags outlive static tensors
  return *table;
}

}  // namespace

Category current_category() {
  return tl_category;
}
uint32_t current_tag() {
  return tl_tag;
}

CategoryScope::CategoryScope(Category c) : saved_(tl_category) {
  tl_category = c;
}
CategoryScope::~CategoryScope() {
  tl_category = saved_;
}
TagScope::TagScope(std::string_view tag) : saved_(tl_tag) {
  tl_tag = intern_tag(tag);
}
TagScope::TagScope(uint32_t tag_id) : saved_(tl_tag) {
  tl_tag = tag_id;
}
TagScope::~TagScope() {
  tl_tag = saved_;
}

uint32_t intern_tag(std::string_view tag) {
  TagTable& t = tag_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.ids.find(std::string(tag));
  if (it != t.ids.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(t.names.size());
  t.names.emplace_back(tag);
  t.ids.emplace(std::string(tag), id);
  return id;
}

std::string tag_name(uint32_t id) {
  TagTable& t = tag_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return id < t.names.size() ? t.names[id] : std::string("<bad tag>");
}

const char* memory_event_name(MemoryEventKind k) {
  switch (k) {
    case MemoryEventKind::alloc:
      return "alloc";
    case MemoryEventKind::free:
      return "free";
    case MemoryEventKind::segment_map:
      return "segment_map";
    case MemoryEventKind::segment_unmap:
      return "segment_unmap";
  }
  return "?";
}

}  // namespace regen
