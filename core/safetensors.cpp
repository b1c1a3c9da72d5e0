// safetensors reading and writing (safetensors.h).
#include "regen/core/safetensors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "regen/core/io.h"

namespace regen {
namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

// A file opened for reading, closed on scope exit.
struct ReadFd {
  int fd = -1;
  ~ReadFd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset` into `dst`; false on a short read or an error.
bool read_at(int fd, void* dst, uint64_t n, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool parse_st_dtype(const std::string& s, DType& out) {
  if (s == "F32")
    out = DType::f32;
  else if (s == "F64")
    out = DType::f64;
  else if (s == "I32")
    out = DType::i32;
  else if (s == "I64")
    out = DType::i64;
  else if (s == "BF16")
    out = DType::bf16;
  else if (s == "F16")
    out = DType::f16;
  else
    return false;
  return true;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& kv : tensors) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

namespace {
// The whole file into `out`, uncommitted.
void write_to(AtomicFileWriter& out, const std::string& path,
              const std::vector<std::pair<std::string, Tensor>>& tensors,
              const std::map<std::string, std::string>& metadata) {
  // An object even with no tensors and no metadata (a default json dumps as null, which no
  // reader takes).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& kv : tensors) {
    REGEN_CHECK(!kv.first.empty() && kv.first != "__metadata__", "safetensors '", path,
                "': bad tensor name '", kv.first, "'");
    REGEN_CHECK(names.insert(kv.first).second, "safetensors '", path, "': tensor name '", kv.first,
                "' appears twice");
    REGEN_CHECK(kv.second.defined() && kv.second.has_storage(), "safetensors '", path,
                "': tensor '", kv.first, "' has no data");
    const uint64_t n = kv.second.nbytes();
    header[kv.first] = {{"dtype", st_dtype(kv.second.dtype())},
                        {"shape", kv.second.shape()},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = header.dump();
  while ((json.size() + 8) % 8 != 0) json += ' ';  // keep the data section 8-byte aligned
  const uint64_t hlen = json.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>((hlen >> (8 * i)) & 0xff);
  out.write(len_bytes, 8);
  out.write(json.data(), json.size());
  for (const auto& kv : tensors) {
    // A device tensor is staged through a host tensor from the allocator, one at a time.
    const Tensor host = kv.second.device().is_cpu() ? kv.second : kv.second.to(Device::cpu());
    if (host.nbytes()) out.write(host.raw_data(), host.nbytes());
  }
}
}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  AtomicFileWriter out(path);
  write_to(out, path, tensors, metadata);
  out.commit();
}

void write_safetensors(AtomicFileWriter& out, const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_to(out, path, tensors, metadata);
  out.sync();
}

namespace {
// An open safetensors file and its parsed header.
struct Header {
  ReadFd fd;
  uint64_t file_size = 0, data_start = 0;
  nlohmann::json json;
};

void read_header(const std::string& path, Header& h) {
  h.fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REGEN_CHECK(h.fd.fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  REGEN_CHECK(::fstat(h.fd.fd, &st) == 0 && S_ISREG(st.st_mode), "cannot open '", path,
              "': not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  REGEN_CHECK(file_size >= 8, "safetensors '", path, "': file is ", file_size,
              " bytes, too short for a header (truncated?)");
  unsigned char len_bytes[8];
  REGEN_CHECK(read_at(h.fd.fd, len_bytes, 8, 0), "reading '", path, "' failed");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  REGEN_CHECK(hlen <= file_size - 8, "safetensors '", path, "': header length ", hlen,
              " exceeds the file size ", file_size, " (truncated or not a safetensors file)");
  std::string header_text(static_cast<size_t>(hlen), '\0');
  REGEN_CHECK(read_at(h.fd.fd, header_text.data(), hlen, 8), "reading the header of '", path,
              "' failed");
  try {
    h.json = nlohmann::json::parse(header_text);
  } catch (const std::exception& e) {
    REGEN_FAIL("safetensors '", path, "': header is not valid JSON: ", e.what());
  }
  REGEN_CHECK(h.json.is_object(), "safetensors '", path, "': header is not a JSON object");
  h.file_size = file_size;
  h.data_start = 8 + hlen;
}

std::map<std::string, std::string> metadata_of(const std::string& path, const nlohmann::json& v) {
  REGEN_CHECK(v.is_object(), "safetensors '", path, "': __metadata__ is not an object");
  std::map<std::string, std::string> out;
  for (auto m = v.begin(); m != v.end(); ++m) {
    REGEN_CHECK(m.value().is_string(), "safetensors '", path, "': metadata '", m.key(),
                "' is not a string");
    out[m.key()] = m.value().get<std::string>();
  }
  return out;
}
}  // namespace

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  Header h;
  read_header(path, h);
  const auto it = h.json.find("__metadata__");
  return it == h.json.end() ? std::map<std::string, std::string>{} : metadata_of(path, *it);
}

SafetensorsFile load_safetensors(const std::string& path) {
  // Only the header is read into a string; tensor data goes from the file straight into each
  // tensor's storage (allocator memory), never through a file-sized buffer.
  sweep_stale_temporaries_of(path);  // what a writer killed while saving left (io.h)
  Header h;
  read_header(path, h);
  ReadFd& file_fd = h.fd;
  const nlohmann::json& header = h.json;
  const uint64_t data_start = h.data_start;
  const uint64_t data_size = h.file_size - data_start;

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  SafetensorsFile file;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      file.metadata = metadata_of(path, it.value());
      continue;
    }
    const auto& v = it.value();
    const std::string where = "safetensors '" + path + "': tensor '" + it.key() + "'";
    REGEN_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        where, " lacks dtype, shape or data_offsets");
    Entry e;
    e.name = it.key();
    REGEN_CHECK(v["dtype"].is_string() && parse_st_dtype(v["dtype"].get<std::string>(), e.dtype),
                where, " has unsupported dtype ", v["dtype"].dump(),
                " (F32, F64, I32, I64, BF16, F16 only)");
    REGEN_CHECK(v["shape"].is_array(), where, " has a non-array shape");
    for (const auto& d : v["shape"]) {
      REGEN_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, where, " has a bad dimension ",
                  d.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    REGEN_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                    off[1].is_number_unsigned(),
                where, " has bad data_offsets ", off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    REGEN_CHECK(e.begin <= e.end && e.end <= data_size, where, " bytes [", e.begin, ", ", e.end,
                ") lie outside the ", data_size, "-byte data section (truncated file?)");
    uint64_t want = 0;
    try {
      want = shape_nbytes(e.shape, e.dtype);
    } catch (const Error& err) {
      REGEN_FAIL(where, ": ", err.message());
    }
    REGEN_CHECK(e.end - e.begin == want, where, " has ", e.end - e.begin, " bytes but shape ",
                sh(e.shape), " of ", dtype_name(e.dtype), " needs ", want);
    entries.push_back(std::move(e));
  }
  // Byte ranges must not overlap.
  std::vector<const Entry*> sorted;
  for (const Entry& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    REGEN_CHECK(
        sorted[i - 1]->end <= sorted[i]->begin || sorted[i - 1]->begin == sorted[i - 1]->end,
        "safetensors '", path, "': tensors '", sorted[i - 1]->name, "' and '", sorted[i]->name,
        "' overlap");
  }
  // Keep file order (by offset), as written.
  for (const Entry* e : sorted) {
    Tensor t = empty(e->shape, e->dtype, Device::cpu());
    const bool read =
        t.nbytes() == 0 || read_at(file_fd.fd, t.raw_data(), t.nbytes(), data_start + e->begin);
    REGEN_CHECK(read, "safetensors '", path, "': reading tensor '", e->name,
                "' failed (truncated file?)");
    file.tensors.emplace_back(e->name, std::move(t));
  }
  return file;
}

}  // namespace regen
