// The transfer model (transfer.h).
#include "regen/remat/profile/transfer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "regen/core/copy_queue.h"
#include "regen/core/error.h"
#include "regen/core/io.h"
#include "regen/kernels/kernels.h"
#include "regen/remat/profile/profile.h"

namespace regen {

using nlohmann::json;

double TransferModel::Link::ms(uint64_t bytes) const {
  REGEN_CHECK(bytes_per_ms > 0,
              "the transfer model has no bandwidth (no copy model was measured "
              "or given: regen bench copy, or --transfer)");
  return latency_ms + static_cast<double>(bytes) / bytes_per_ms;
}

std::string TransferModel::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.2f GB/s + %.3f ms to the host, %.2f GB/s + %.3f ms back",
                to_host.bytes_per_ms / 1e6, to_host.latency_ms, to_device.bytes_per_ms / 1e6,
                to_device.latency_ms);
  return std::string(buf) + (source.empty() ? "" : " (" + source + ")");
}

namespace {

json link_json(const TransferModel::Link& l) {
  return {{"latency_ms", l.latency_ms}, {"gb_per_s", l.bytes_per_ms / 1e6}};
}

TransferModel::Link link_from(const json& j, const std::string& origin, const char* name) {
  REGEN_CHECK(j.contains(name) && j.at(name).is_object(), origin, ": the transfer model has no \"",
              name, "\" link");
  const json& l = j.at(name);
  TransferModel::Link out;
  out.latency_ms = l.at("latency_ms").get<double>();
  const double gbps = l.at("gb_per_s").get<double>();
  REGEN_CHECK(std::isfinite(out.latency_ms) && out.latency_ms >= 0, origin, ": \"", name,
              "\" latency_ms must be a finite number >= 0, got ", out.latency_ms);
  REGEN_CHECK(std::isfinite(gbps) && gbps > 0, origin, ": \"", name,
              "\" gb_per_s must be a finite number > 0, got ", gbps);
  out.bytes_per_ms = gbps * 1e6;
  return out;
}

}  // namespace

std::string transfer_to_json(const TransferModel& t) {
  json j = {{"to_host", link_json(t.to_host)},
            {"to_device", link_json(t.to_device)},
            {"source", t.source}};
  return j.dump(1);
}

TransferModel transfer_from_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": not valid JSON: ", e.what());
  }
  try {
    REGEN_CHECK(j.is_object(), origin, ": a transfer model is a JSON object");
    TransferModel t;
    t.to_host = link_from(j, origin, "to_host");
    t.to_device = link_from(j, origin, "to_device");
    t.source = j.value("source", std::string());
    return t;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": malformed transfer model: ", e.what());
  }
}

TransferModel load_transfer(const std::string& path) {
  return transfer_from_json(read_file(path), "transfer model '" + path + "'");
}

namespace {

// Least squares of ms against bytes; the intercept is the latency (at least 0).
TransferModel::Link fit(const std::vector<CopySample>& s, bool to_host) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CopySample& c : s) {
    const double x = static_cast<double>(c.bytes), y = to_host ? c.to_host_ms : c.to_device_ms;
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  TransferModel::Link l;
  const double den = n * sxx - sx * sx;
  double slope = den > 0 ? (n * sxy - sx * sy) / den : 0;
  double icpt = n > 0 ? (sy - slope * sx) / n : 0;
  if (icpt < 0 || slope <= 0) {  // through the origin instead
    icpt = 0;
    slope = sxx > 0 ? sxy / sxx : 0;
  }
  REGEN_CHECK(slope > 0, "regen bench copy: the copies took no measurable time");
  l.latency_ms = icpt;
  l.bytes_per_ms = 1.0 / slope;
  return l;
}

}  // namespace

TransferModel measure_transfer(Device device, const std::vector<uint64_t>& sizes, int repeats,
                               std::vector<CopySample>* samples) {
  REGEN_CHECK(!sizes.empty() && repeats >= 1, "measure_transfer: no sizes or no repeats");
  auto to_host = CopyQueue::make(device, CopyDirection::to_host);
  auto to_device = CopyQueue::make(device, CopyDirection::to_device);
  CachingAllocator& host = host_allocator_for(device);
  std::vector<CopySample> out;
  TagScope tag("bench copy");
  for (uint64_t bytes : sizes) {
    REGEN_CHECK(bytes > 0, "measure_transfer: a size of 0 bytes");
    auto dev = std::make_shared<Storage>(device, bytes, Category::other);
    auto hst = std::make_shared<Storage>(host, bytes, Category::other);
    // Touch both once (first-touch page faults are not the link's).
    if (device.is_cpu()) std::memset(dev->data(), 1, bytes);
    std::memset(hst->data(), 2, bytes);
    auto time_one = [&](CopyQueue& q, std::shared_ptr<Storage> dst, std::shared_ptr<Storage> src) {
      kernels::synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      q.issue(std::move(dst), std::move(src));
      q.drain();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    time_one(*to_host, hst, dev);  // warm-up
    time_one(*to_device, dev, hst);
    std::vector<double> a, b;
    for (int r = 0; r < repeats; ++r) {
      a.push_back(time_one(*to_host, hst, dev));
      b.push_back(time_one(*to_device, dev, hst));
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    out.push_back({bytes, a[a.size() / 2], b[b.size() / 2]});
  }
  TransferModel t;
  t.to_host = fit(out, true);
  t.to_device = fit(out, false);
  if (samples) *samples = out;
  return t;
}

int64_t saved_activation_bytes(const Profile& p) {
  int64_t b = 0;
  for (const ProfileSaved& s : p.saved) {
    const ProfileValue& v = p.values[static_cast<size_t>(s.value)];
    if (!v.leaf && v.alloc_id != 0 && s.category == Category::activation)
      b += static_cast<int64_t>(s.bytes);
  }
  return b;
}

TransferModel transfer_for(const std::string& spec, const Profile& p) {
  auto number = [&](const std::string& text, const char* what) {
    // Decimal only, as every number flag: strtod would also read "0x10" as 16.
    const bool decimal = !text.empty() &&
                         (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.') &&
                         text.find_first_not_of("0123456789.eE+-") == std::string::npos;
    char* end = nullptr;
    const double v = decimal ? std::strtod(text.c_str(), &end) : 0.0;
    REGEN_CHECK(decimal && end && *end == 0 && std::isfinite(v), "--transfer '", spec, "': ", what,
                " '", text, "' is not a number (write it in decimal: 0.4, 25)");
    return v;
  };
  if (spec == "profile") {
    REGEN_CHECK(p.transfer.valid(), "--transfer profile: the profile of ", p.model,
                " has no transfer model (profiles recorded before `regen profile` measured one): "
                "give --transfer FILE (regen bench copy --json FILE), step:F or gbps:B");
    return p.transfer;
  }
  if (spec.rfind("step:", 0) == 0) {
    const double f = number(spec.substr(5), "the fraction");
    REGEN_CHECK(f > 0 && f <= 100, "--transfer '", spec,
                "': the fraction of the step must be > 0 (0.4: copying every saved activation "
                "once takes 40% of the step)");
    const int64_t bytes = saved_activation_bytes(p);
    REGEN_CHECK(bytes > 0 && p.iteration_ms > 0, "--transfer '", spec, "': the profile of ",
                p.model, " has no saved activations or no step time");
    TransferModel t;
    t.to_host.bytes_per_ms = static_cast<double>(bytes) / (f * p.iteration_ms);
    t.to_device = t.to_host;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "step:%g: every saved activation (%s) copied once one way in %g of the %.1f ms "
                  "profiled step",
                  f, format_bytes(bytes).c_str(), f, p.iteration_ms);
    t.source = buf;
    return t;
  }
  if (spec.rfind("gbps:", 0) == 0) {
    const std::string rest = spec.substr(5);
    const size_t comma = rest.find(',');
    const double gbps = number(rest.substr(0, comma), "the bandwidth");
    const double lat =
        comma == std::string::npos ? 0 : number(rest.substr(comma + 1), "the latency");
    REGEN_CHECK(gbps > 0 && lat >= 0, "--transfer '", spec,
                "': the bandwidth must be > 0 GB/s and the latency >= 0 ms");
    TransferModel t;
    t.to_host.bytes_per_ms = gbps * 1e6;
    t.to_host.latency_ms = lat;
    t.to_device = t.to_host;
    t.source = spec;
    return t;
  }
  REGEN_CHECK(spec.size() > 5 && spec.substr(spec.size() - 5) == ".json", "--transfer '", spec,
              "': not profile, step:F, gbps:B[,LATENCY_MS] or a FILE.json from regen bench copy");
  return load_transfer(spec);
}

}  // namespace regen
