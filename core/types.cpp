// DType, Device and Shape helpers (types.h).
#include "regen/core/types.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "regen/core/error.h"

namespace regen {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  std::vector<std::string> known;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
    known.push_back(dtype_name(t));
  }
  REGEN_FAIL("unknown dtype '", name, "': known dtypes are ", join_names(known));
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    const std::string idx = text.substr(5);
    bool digits = !idx.empty() && idx.size() < 4;
    for (char c : idx) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (digits) return cuda(std::stoi(idx));
  }
  REGEN_FAIL("unknown device '", text, "': expected cpu, cuda or cuda:N");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

int64_t shape_numel(const Shape& s) {
  for (int64_t d : s) {
    REGEN_CHECK(d >= 0, "shape ", sh(s), " has a negative dimension");
    if (d == 0) return 0;  // however large the other dimensions
  }
  int64_t n = 1;
  for (int64_t d : s) {
    // Unchecked, the product wraps silently (to 0 for [1 << 62, 4]) and later writes run past
    // the allocation.
    REGEN_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", sh(s),
                " has more elements than an int64_t can count");
  }
  return n;
}

uint64_t shape_nbytes(const Shape& s, DType dtype) {
  const int64_t n = shape_numel(s);
  int64_t bytes = 0;
  REGEN_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes),
              "a tensor of shape ", sh(s), " and dtype ", dtype_name(dtype), " would take ", n,
              " x ", dtype_size(dtype), " bytes, more than an int64_t can count");
  return static_cast<uint64_t>(bytes);
}

std::string join_names(const std::vector<std::string>& names, const char* sep) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : sep) + names[i];
  return out;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::ostream& operator<<(std::ostream& os, const ShapePrinter& p) {
  return os << shape_str(p.s);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

int64_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  // Decimal digits and a point only (std::stod would also read hex, "inf", "nan", exponents).
  const size_t digits = text.find_first_not_of("0123456789.");
  REGEN_CHECK(digits != 0 && !text.empty(), "cannot read a byte count from '", text,
              "': expected decimal digits and a unit, e.g. 2GiB, 512MiB or 1048576");
  try {
    value = std::stod(text.substr(0, digits), &pos);
  } catch (const std::exception&) {
    REGEN_FAIL("cannot read a byte count from '", text, "': expected e.g. 2GiB, 512MiB or 1048576");
  }
  REGEN_CHECK(digits == std::string::npos ? pos == text.size() : pos == digits,
              "cannot read a byte count from '", text,
              "': expected decimal digits and a unit, e.g. 2GiB, 512MiB or 1048576");
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (u.empty() || u == "b")
    mult = 1;
  else if (u == "kib" || u == "k")
    mult = 1024.0;
  else if (u == "mib" || u == "m")
    mult = 1024.0 * 1024;
  else if (u == "gib" || u == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (u == "tib" || u == "t")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (u == "kb")
    mult = 1e3;
  else if (u == "mb")
    mult = 1e6;
  else if (u == "gb")
    mult = 1e9;
  else if (u == "tb")
    mult = 1e12;
  REGEN_CHECK(mult > 0, "unknown byte unit '", unit, "' in '", text,
              "': use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)");
  REGEN_CHECK(value >= 0 && std::isfinite(value), "byte count '", text, "' must be non-negative");
  // 2^63 bytes and up do not fit in an int64_t (llround's result would be undefined).
  REGEN_CHECK(value * mult < 0x1p63, "byte count '", text, "' is too large (at most 8 EiB)");
  return static_cast<int64_t>(std::llround(value * mult));
}

int64_t parse_count(const std::string& text) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  uint64_t v = 0;
  for (const char c : text) v = v * 10 + static_cast<uint64_t>(c - '0');  // < 10^19: no overflow
  return v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);
}

}  // namespace regen
