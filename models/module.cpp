// The module system (module.h).
#include "models/module.h"

#include <functional>
#include <set>

namespace regen {

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  REGEN_CHECK(value.defined() && is_floating(value.dtype()), "register_parameter('", name,
              "'): parameters must be floating-point tensors");
  value.set_requires_grad(true);
  value.impl()->name = name;
  params_.emplace_back(name, std::move(value));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  REGEN_CHECK(value.defined(), "register_buffer('", name, "'): undefined tensor");
  value.impl()->name = name;
  buffers_.emplace_back(name, std::move(value));
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, NamedTensors* params, NamedTensors* buffers,
                     NamedTensors* extra) const {
  for (const auto& kv : params_) {
    if (params) params->emplace_back(prefix + kv.first, kv.second);
  }
  for (const auto& kv : buffers_) {
    if (buffers) buffers->emplace_back(prefix + kv.first, kv.second);
  }
  if (extra) extra_state(*extra, prefix);
  for (const auto& kv : children_) {
    kv.second->collect(prefix + kv.first + ".", params, buffers, extra);
  }
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", &out, nullptr, nullptr);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& kv : named_parameters()) out.push_back(kv.second);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", nullptr, &out, nullptr);
  return out;
}

NamedTensors Module::state_dict() const {
  // torch order: per module, parameters then buffers, children after; extra (host) state with
  // the buffers of its module.
  NamedTensors out;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                    const std::string& prefix) {
    for (const auto& kv : m.params_) out.emplace_back(prefix + kv.first, kv.second);
    for (const auto& kv : m.buffers_) out.emplace_back(prefix + kv.first, kv.second);
    m.extra_state(out, prefix);
    for (const auto& kv : m.children_) walk(*kv.second, prefix + kv.first + ".");
  };
  walk(*this, "");
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& kv : state) given[kv.first] = &kv.second;
  std::set<std::string> used;
  std::vector<std::string> missing;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m,
                                                              const std::string& prefix) {
    auto copy_into = [&](const std::string& full, Tensor& dst) {
      auto it = given.find(full);
      if (it == given.end()) {
        missing.push_back(full);
        return;
      }
      const Tensor& src = *it->second;
      REGEN_CHECK(src.shape() == dst.shape(), "load_state_dict: '", full, "' has shape ",
                  sh(src.shape()), " but the model expects ", sh(dst.shape()));
      REGEN_CHECK(src.dtype() == dst.dtype(), "load_state_dict: '", full, "' is ",
                  dtype_name(src.dtype()), " but the model expects ", dtype_name(dst.dtype()));
      dst.copy_from(src);
      used.insert(full);
    };
    for (auto& kv : m.params_) copy_into(prefix + kv.first, kv.second);
    for (auto& kv : m.buffers_) copy_into(prefix + kv.first, kv.second);
    NamedTensors extra;
    m.extra_state(extra, prefix);
    for (auto& kv : extra) {
      auto it = given.find(kv.first);
      if (it == given.end()) {
        missing.push_back(kv.first);
        continue;
      }
      REGEN_CHECK(m.load_extra_state(kv.first.substr(prefix.size()), *it->second),
                  "load_state_dict: cannot load '", kv.first, "'");
      used.insert(kv.first);
    }
    for (auto& kv : m.children_) walk(*kv.second, prefix + kv.first + ".");
  };
  walk(*this, "");
  if (!strict) return;
  std::vector<std::string> unexpected;
  for (const auto& kv : state) {
    if (!used.count(kv.first)) unexpected.push_back(kv.first);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  REGEN_CHECK(missing.empty(), "load_state_dict: missing ", missing.size(), " entries: ",
              list(missing));
  REGEN_CHECK(unexpected.empty(), "load_state_dict: ", unexpected.size(),
              " unexpected entries: ", list(unexpected));
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& kv : named_parameters()) n += kv.second.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  on_train(on);
  for (auto& kv : children_) kv.second->train(on);
}

void Module::to(Device device) {
  CategoryScope cat(Category::parameter);
  auto move = [&](const std::string& name, Tensor& t) {
    if (t.device() == device) return;
    TagScope tag(t.name().empty() ? name : t.name());
    Tensor moved = t.to(device);
    // Keep the same TensorImpl (optimizers and callers hold it): swap in the new storage.
    TensorImpl* impl = t.impl().get();
    impl->storage = moved.impl()->storage;
    impl->offset_bytes = 0;
    impl->device = device;
    impl->grad.reset();
  };
  for (auto& kv : params_) move(kv.first, kv.second);
  for (auto& kv : buffers_) move(kv.first, kv.second);
  device_ = device;
  for (auto& kv : children_) kv.second->to(device);
}

void Module::zero_grad() { regen::zero_grad(parameters()); }

void Module::assign_full_names() {
  for (auto& kv : named_parameters()) kv.second.impl()->name = kv.first;
  for (auto& kv : named_buffers()) kv.second.impl()->name = kv.first;
}

}  // namespace regen
