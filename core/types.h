// Element types, devices and shapes: the small value types every layer passes around.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "regen/core/half.h"

namespace regen {

// bf16 and f16 hold 16-bit floats (core/half.h: bfloat16, IEEE binary16) for mixed precision:
// storage in 16 bits, arithmetic in f32. New dtypes go at the end: the order is not written
// anywhere, but nothing is gained by moving the old ones.
enum class DType : uint8_t { f32, f64, i32, i64, bf16, f16 };
constexpr int kNumDTypes = 6;

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::bf16:
    case DType::f16:
      return 2;
  }
  return 0;
}
const char* dtype_name(DType t);  // "f32", "f64", "i32", "i64", "bf16", "f16"
// The dtype of a name dtype_name gives; throws regen::Error naming the known ones otherwise.
DType parse_dtype(const std::string& name);
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
// The 16-bit floats, which store low precision and compute in f32.
inline bool is_low_precision(DType t) {
  return t == DType::bf16 || t == DType::f16;
}
std::ostream& operator<<(std::ostream& os, DType t);

// Compile-time mapping from C++ scalar type to DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<float16> {
  static constexpr DType value = DType::f16;
};

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // Parses "cpu", "cuda", "cuda:N". Throws regen::Error naming the bad string.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
std::ostream& operator<<(std::ostream& os, const Device& d);

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a 0-d shape). Throws regen::Error naming the shape when a
// dimension is negative or the product does not fit in int64_t.
int64_t shape_numel(const Shape& s);
// Bytes of a contiguous tensor of this shape and dtype. Throws regen::Error naming the shape and
// the dtype when the size does not fit in int64_t (every byte count in regen is an int64_t).
uint64_t shape_nbytes(const Shape& s, DType dtype);
std::string shape_str(const Shape& s);
// "a, b, c" (with sep between items): lists of names in messages and help texts.
std::string join_names(const std::vector<std::string>& names, const char* sep = ", ");

// Printing a Shape inside REGEN_CHECK messages: "[2, 3, 4]".
struct ShapePrinter {
  const Shape& s;
};
inline ShapePrinter sh(const Shape& s) {
  return {s};
}
std::ostream& operator<<(std::ostream& os, const ShapePrinter& p);

// Human-readable byte counts: "1.50 GiB", "512 B".
std::string format_bytes(int64_t bytes);
// Parses "2GiB", "512MiB", "1.5GB", "1048576" (bytes). Throws regen::Error on bad text, and on a
// count past what an int64_t holds (8 EiB).
int64_t parse_bytes(const std::string& text);
// A count written as decimal digits only ("0", "42"; no sign, space or exponent), at most
// INT64_MAX; -1 for anything else (empty, other characters, or too large). What counters read
// back from files (a state's step count, a data position) are parsed with.
int64_t parse_count(const std::string& text);

}  // namespace regen
