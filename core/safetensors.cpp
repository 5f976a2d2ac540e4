#include "tandem/core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tandem/core/kernels.h"
#include "tandem/core/temp_files.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors I/O copies raw bytes and assumes a little-endian host"
#endif

namespace tandem {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
    {DType::i32, "I32"}, {DType::i64, "I64"}, {DType::u8, "U8"},   {DType::boolean, "BOOL"},
};

// One tensor as the header describes it; offsets count from the start of the data section.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in file order
  std::map<std::string, std::string> metadata;
};

std::string where(const std::string& source) { return detail::concat("safetensors '", source, "': "); }

std::string os_error() { return std::strerror(errno); }

// ---- reading ----

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The header length from the first 8 bytes, checked against the total size.
uint64_t header_length(const uint8_t* first8, uint64_t total, const std::string& source) {
  uint64_t n = read_le_u64(first8);
  TANDEM_CHECK_AS(ValueError, n <= kMaxHeaderBytes, where(source), "header length ", n, " exceeds the limit of ",
                  kMaxHeaderBytes, " bytes");
  TANDEM_CHECK_AS(ValueError, n <= total - 8, where(source), "header length ", n, " reaches past the end of the file (",
                  total, " bytes, so at most ", total - 8, " bytes of header)");
  return n;
}

uint64_t as_offset(const nlohmann::json& v, const std::string& what, const std::string& source) {
  TANDEM_CHECK_AS(ValueError, v.is_number_integer(), where(source), what, " must be a non-negative integer, got ",
                  v.dump());
  TANDEM_CHECK_AS(ValueError, v.is_number_unsigned(), where(source), what, " is negative: ", v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const nlohmann::json& info, const std::string& source) {
  std::string tensor = detail::concat("tensor '", name, "'");
  TANDEM_CHECK_AS(ValueError, info.is_object(), where(source), tensor, ": expected an object with dtype, shape and ",
                  "data_offsets, got ", info.dump());
  for (const auto& item : info.items()) {
    const std::string& key = item.key();
    TANDEM_CHECK_AS(ValueError, key == "dtype" || key == "shape" || key == "data_offsets", where(source), tensor,
                    ": unexpected field '", key, "'");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    TANDEM_CHECK_AS(ValueError, info.contains(key), where(source), tensor, ": missing field '", key, "'");
  }
  Entry e;
  e.name = name;

  const nlohmann::json& dtype = info["dtype"];
  TANDEM_CHECK_AS(ValueError, dtype.is_string(), where(source), tensor, ": dtype must be a string, got ", dtype.dump());
  const std::string& dname = dtype.get_ref<const std::string&>();
  const DTypeName* found = nullptr;
  for (const DTypeName& d : kDTypeNames) {
    if (dname == d.name) found = &d;
  }
  TANDEM_CHECK_AS(ValueError, found != nullptr, where(source), tensor, ": unknown dtype '", dname,
                  "' (tandem reads F32, F64, F16, BF16, I32, I64, U8, BOOL)");
  e.dtype = found->dtype;

  const nlohmann::json& shape = info["shape"];
  TANDEM_CHECK_AS(ValueError, shape.is_array(), where(source), tensor, ": shape must be an array, got ", shape.dump());
  // The product of the non-zero sizes must fit int64, so strides do too (also for empty tensors).
  uint64_t numel = 1;
  uint64_t span = 1;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (const nlohmann::json& s : shape) {
    uint64_t size = as_offset(s, tensor + ": shape entry", source);
    uint64_t factor = std::max<uint64_t>(size, 1);
    TANDEM_CHECK_AS(ValueError, size <= kMax && span <= kMax / factor, where(source), tensor, ": shape ", shape.dump(),
                    " overflows 64-bit sizes");
    span *= factor;
    numel *= size;
    e.shape.push_back(static_cast<int64_t>(size));
  }

  const nlohmann::json& offsets = info["data_offsets"];
  TANDEM_CHECK_AS(ValueError, offsets.is_array() && offsets.size() == 2, where(source), tensor,
                  ": data_offsets must be [begin, end], got ", offsets.dump());
  e.begin = as_offset(offsets[0], tensor + ": data_offsets begin", source);
  e.end = as_offset(offsets[1], tensor + ": data_offsets end", source);
  TANDEM_CHECK_AS(ValueError, e.begin <= e.end, where(source), tensor, ": data_offsets [", e.begin, ", ", e.end,
                  "] end before they begin");
  size_t item = dtype_size(e.dtype);
  TANDEM_CHECK_AS(ValueError, numel <= std::numeric_limits<uint64_t>::max() / item, where(source), tensor, ": shape ",
                  shape.dump(), " overflows 64-bit byte counts");
  TANDEM_CHECK_AS(ValueError, e.end - e.begin == numel * item, where(source), tensor, ": data_offsets [", e.begin, ", ",
                  e.end, "] hold ", e.end - e.begin, " bytes, but ", dname, " ", shape_str(e.shape), " needs ",
                  numel * item);
  return e;
}

// Rejects duplicate keys in any object (nlohmann would keep the last silently) and nesting deeper
// than a valid header has, then parses.
nlohmann::json parse_json(const char* text, size_t n, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // one per open object
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      TANDEM_CHECK_AS(ValueError, depth <= 2, where(source), "header nests deeper than a safetensors header can");
    }
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      bool fresh = keys.back().insert(key).second;
      if (!fresh && depth == 1) TANDEM_THROW(ValueError, where(source), "duplicate tensor name '", key, "' in header");
      TANDEM_CHECK_AS(ValueError, fresh, where(source), "duplicate key '", key, "' in header");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, text + n, callback);
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(ValueError, where(source), "header is not valid JSON: ", e.what());
  }
}

Header parse_header(const char* text, size_t n, uint64_t data_len, const std::string& source) {
  // The reference implementation insists on this too (no leading whitespace or BOM).
  TANDEM_CHECK_AS(ValueError, n > 0 && text[0] == '{', where(source), "header must start with '{'",
                  n == 0 ? " (it is empty)" : "");
  nlohmann::json json = parse_json(text, n, source);
  TANDEM_CHECK_AS(ValueError, json.is_object(), where(source), "header must be a JSON object");
  Header h;
  for (const auto& item : json.items()) {
    if (item.key() == kMetadataKey) {
      const nlohmann::json& meta = item.value();
      if (meta.is_null()) continue;
      TANDEM_CHECK_AS(ValueError, meta.is_object(), where(source), "__metadata__ must map strings to strings, got ",
                      meta.dump());
      for (const auto& kv : meta.items()) {
        TANDEM_CHECK_AS(ValueError, kv.value().is_string(), where(source), "__metadata__ '", kv.key(),
                        "' must be a string, got ", kv.value().dump());
        h.metadata[kv.key()] = kv.value().get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(item.key(), item.value(), source));
  }

  // File order; empty tensors sort before a tensor starting at the same offset.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile the data section exactly: no overlap, no hole, nothing after the last.
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : h.entries) {
    TANDEM_CHECK_AS(ValueError, e.end <= data_len, where(source), "tensor '", e.name, "': data_offsets [", e.begin,
                    ", ", e.end, "] reach past the data section (", data_len, " bytes)");
    TANDEM_CHECK_AS(ValueError, e.begin >= covered, where(source), "tensors '", previous->name, "' [", previous->begin,
                    ", ", previous->end, ") and '", e.name, "' [", e.begin, ", ", e.end, ") overlap");
    TANDEM_CHECK_AS(ValueError, e.begin == covered, where(source), "hole in the data section: bytes [", covered, ", ",
                    e.begin, ") belong to no tensor");
    covered = e.end;
    previous = &e;
  }
  TANDEM_CHECK_AS(ValueError, covered == data_len, where(source), "the data section has ", data_len,
                  " bytes but the tensors cover only ", covered, " (", data_len - covered, " trailing bytes)");
  return h;
}

// Builds the tensors; `fill(entry, dst)` copies the entry's bytes into dst.
SafetensorsFile materialize(Header header, const std::function<void(const Entry&, void*)>& fill,
                            const std::string& source) {
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (const Entry& e : header.entries) {
    Tensor t = empty(e.shape, TensorOptions(e.dtype, Device()));
    if (e.end > e.begin) fill(e, t.data_ptr());
    if (e.dtype == DType::boolean) {
      // Any other byte is not a valid C++ bool.
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i) {
        TANDEM_CHECK_AS(ValueError, bytes[i] <= 1, where(source), "BOOL tensor '", e.name, "' holds byte ",
                        static_cast<int>(bytes[i]), " at element ", i, " (must be 0 or 1)");
      }
    }
    file.names.push_back(e.name);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

// ---- writing ----

struct Plan {
  std::string header;                                        // JSON, padded with spaces to a multiple of 8
  std::vector<const std::pair<std::string, Tensor>*> order;  // sorted by name
  uint64_t data_bytes = 0;
};

Plan plan(const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata, const char* op) {
  Plan p;
  for (const auto& named : tensors) {
    TANDEM_CHECK_AS(ValueError, named.first != kMetadataKey, op, ": '", kMetadataKey,
                    "' is reserved and cannot name a tensor");
    TANDEM_CHECK_AS(ValueError, named.second.defined(), op, ": tensor '", named.first, "' is undefined");
    p.order.push_back(&named);
  }
  std::sort(p.order.begin(), p.order.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < p.order.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, p.order[i]->first != p.order[i - 1]->first, op, ": duplicate tensor name '",
                    p.order[i]->first, "'");
  }

  // Field order as the reference writer uses: metadata first, then dtype, shape, data_offsets.
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& kv : metadata) meta[kv.first] = kv.second;
    json[kMetadataKey] = std::move(meta);
  }
  for (const auto* named : p.order) {
    const Tensor& t = named->second;
    uint64_t nbytes = t.nbytes();
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = safetensors_dtype_name(t.dtype());
    info["shape"] = t.shape();
    info["data_offsets"] = nlohmann::ordered_json::array({p.data_bytes, p.data_bytes + nbytes});
    json[named->first] = std::move(info);
    p.data_bytes += nbytes;
  }
  try {
    p.header = json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(ValueError, op, ": a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

std::string length_prefix(uint64_t n) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return bytes;
}

// The tensor's bytes: contiguous, on the cpu.
Tensor host_contiguous(const Tensor& t) { return kernels::contiguous(kernels::to_device(t, Device())); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t written = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (written < 0 && errno == EINTR) continue;
    TANDEM_CHECK_AS(BackendError, written > 0, "save_safetensors: writing '", path, "': ", os_error());
    p += written;
    n -= static_cast<size_t>(written);
  }
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  TANDEM_THROW(TypeError, "safetensors: no format name for dtype ", dtype_name(dtype));
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::string held;
    for (const std::string& n : names) held += (held.empty() ? "'" : ", '") + n + "'";
    TANDEM_THROW(ValueError, "safetensors: no tensor named '", name, "'; the file holds ",
                 held.empty() ? std::string("none") : held);
  }
  return it->second;
}

std::vector<uint8_t> serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  Plan p = plan(tensors, metadata, "serialize_safetensors");
  std::vector<uint8_t> out;
  out.reserve(8 + p.header.size() + p.data_bytes);
  std::string prefix = length_prefix(p.header.size());
  out.insert(out.end(), prefix.begin(), prefix.end());
  out.insert(out.end(), p.header.begin(), p.header.end());
  for (const auto* named : p.order) {
    Tensor t = host_contiguous(named->second);
    const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
    if (t.nbytes() > 0) out.insert(out.end(), bytes, bytes + t.nbytes());
  }
  return out;
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& source) {
  TANDEM_CHECK_AS(ValueError, size >= 8, where(source), "file is ", size,
                  " bytes, shorter than the 8-byte header length");
  uint64_t n = header_length(data, size, source);
  const uint8_t* section = data + 8 + n;
  Header header = parse_header(reinterpret_cast<const char*>(data + 8), n, size - 8 - n, source);
  return materialize(
      std::move(header), [&](const Entry& e, void* dst) { std::memcpy(dst, section + e.begin, e.end - e.begin); },
      source);
}

SafetensorsFile load_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK_AS(ValueError, fd >= 0, "load_safetensors: cannot open '", path, "': ", os_error());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TANDEM_CHECK_AS(BackendError, ::fstat(fd, &st) == 0, "load_safetensors: '", path, "': ", os_error());
  TANDEM_CHECK_AS(ValueError, S_ISREG(st.st_mode), "load_safetensors: '", path, "' is not a regular file");
  auto size = static_cast<uint64_t>(st.st_size);

  auto read_at = [&](void* dst, uint64_t n, uint64_t offset) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd, p, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      TANDEM_CHECK_AS(BackendError, got >= 0, "load_safetensors: reading '", path, "': ", os_error());
      TANDEM_CHECK_AS(ValueError, got > 0, where(path), "file shrank while being read");
      p += got;
      n -= static_cast<uint64_t>(got);
      offset += static_cast<uint64_t>(got);
    }
  };

  TANDEM_CHECK_AS(ValueError, size >= 8, where(path), "file is ", size,
                  " bytes, shorter than the 8-byte header length");
  uint8_t first8[8];
  read_at(first8, 8, 0);
  uint64_t n = header_length(first8, size, path);
  std::string text(n, '\0');
  read_at(text.data(), n, 8);
  Header header = parse_header(text.data(), n, size - 8 - n, path);
  uint64_t data_start = 8 + n;
  return materialize(
      std::move(header), [&](const Entry& e, void* dst) { read_at(dst, e.end - e.begin, data_start + e.begin); }, path);
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Plan p = plan(tensors, metadata, "save_safetensors");
  remove_stale_temp_files(path);  // left by saves of this target that were killed
  const std::string tmp = temp_path_for(path);
  TempFileGuard guard(tmp);  // removed if SIGINT or SIGTERM ends the process mid-write
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK_AS(BackendError, fd >= 0, "save_safetensors: cannot create '", tmp, "': ", os_error());
  try {
    std::string prefix = length_prefix(p.header.size());
    write_all(fd, prefix.data(), prefix.size(), tmp);
    write_all(fd, p.header.data(), p.header.size(), tmp);
    for (const auto* named : p.order) {
      Tensor t = host_contiguous(named->second);  // one at a time: a GPU model is never all on the host
      write_all(fd, t.data_ptr(), t.nbytes(), tmp);
    }
    TANDEM_CHECK_AS(BackendError, ::fsync(fd) == 0, "save_safetensors: flushing '", tmp, "': ", os_error());
    int closed = ::close(fd);
    fd = -1;
    TANDEM_CHECK_AS(BackendError, closed == 0, "save_safetensors: closing '", tmp, "': ", os_error());
    TANDEM_CHECK_AS(BackendError, ::rename(tmp.c_str(), path.c_str()) == 0, "save_safetensors: renaming '", tmp,
                    "' to '", path, "': ", os_error());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory entry is; some filesystems cannot sync a directory.
  int dir = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    int synced = ::fsync(dir);
    int err = errno;
    ::close(dir);
    TANDEM_CHECK_AS(BackendError, synced == 0 || err == EINVAL || err == EROFS, "save_safetensors: syncing the ",
                    "directory of '", path, "': ", std::strerror(err));
  }
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()), metadata);
}

void save_safetensors(const std::string& path, std::initializer_list<std::pair<std::string, Tensor>> tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors), metadata);
}

}  // namespace tandem
