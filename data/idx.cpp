#include "tandem/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem::data {
namespace {

constexpr uint64_t kMaxDataBytes = uint64_t{4} << 30;  // far above any IDX data set; stops absurd sizes early
constexpr size_t kChunk = size_t{1} << 20;
// Where Debian's dataset-fashion-mnist package installs the files.
constexpr const char* kFashionMnistPackageDir = "/usr/share/datasets/fashion-mnist";

std::string where(const std::string& source) { return "idx '" + source + "': "; }

// A stream of a file's (decompressed) bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; fewer only at the end of the data.
  virtual size_t read(uint8_t* dst, size_t n) = 0;
};

class PlainSource : public ByteSource {
 public:
  PlainSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t read(uint8_t* dst, size_t n) override {
    size_t k = std::min(n, size_ - pos_);
    if (k > 0) std::memcpy(dst, data_ + pos_, k);
    pos_ += k;
    return k;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// gzip through zlib's inflate; several concatenated members read as one stream, as gunzip does.
class GzipSource : public ByteSource {
 public:
  GzipSource(const uint8_t* data, size_t size, const std::string& source) : data_(data), size_(size), source_(source) {
    zs_.next_in = const_cast<Bytef*>(data_);
    TANDEM_CHECK_AS(BackendError, inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, where(source_), "inflateInit2 failed");
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(uint8_t* dst, size_t n) override {
    size_t produced = 0;
    while (produced < n && !done_) {
      // The input is fed in one piece (or in uInt-sized ones), so next_in always marks how far it was read.
      size_t consumed = static_cast<size_t>(zs_.next_in - data_);
      if (zs_.avail_in == 0) {
        zs_.avail_in = static_cast<uInt>(std::min<size_t>(size_ - consumed, std::numeric_limits<uInt>::max()));
      }
      size_t want = std::min<size_t>(n - produced, std::numeric_limits<uInt>::max());
      zs_.next_out = dst + produced;
      zs_.avail_out = static_cast<uInt>(want);
      int ret = inflate(&zs_, Z_NO_FLUSH);
      produced += want - zs_.avail_out;
      size_t left = size_ - static_cast<size_t>(zs_.next_in - data_);
      if (ret == Z_STREAM_END) {
        if (left == 0) {
          done_ = true;
          continue;
        }
        TANDEM_CHECK_AS(ValueError, left >= 2 && zs_.next_in[0] == 0x1f && zs_.next_in[1] == 0x8b, where(source_), left,
                        " bytes after the end of the gzip stream are not another gzip member");
        TANDEM_CHECK_AS(BackendError, inflateReset(&zs_) == Z_OK, where(source_), "inflateReset failed");
      } else if (ret == Z_BUF_ERROR) {
        TANDEM_CHECK_AS(ValueError, left > 0, where(source_), "the gzip data ends early (truncated .gz file)");
      } else {
        TANDEM_CHECK_AS(ValueError, ret == Z_OK, where(source_),
                        "corrupt gzip data: ", zs_.msg != nullptr ? zs_.msg : "inflate failed");
      }
    }
    return produced;
  }

 private:
  z_stream zs_{};
  const uint8_t* data_;
  size_t size_;
  bool done_ = false;
  std::string source_;
};

struct ElementType {
  uint8_t code;
  const char* name;
  size_t size;  // bytes in the file
  DType dtype;  // what tandem holds it as
};
constexpr ElementType kTypes[] = {
    {0x08, "u8", 1, DType::u8},   {0x09, "i8", 1, DType::i32},  {0x0B, "i16", 2, DType::i32},
    {0x0C, "i32", 4, DType::i32}, {0x0D, "f32", 4, DType::f32}, {0x0E, "f64", 8, DType::f64},
};

std::string hex_byte(uint8_t b) {
  const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

uint64_t big_endian(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// Converts `count` big-endian elements of `type` into out's storage.
void convert(const ElementType& type, const uint8_t* in, int64_t count, const Tensor& out) {
  switch (type.code) {
    case 0x08: std::memcpy(out.data_ptr(), in, static_cast<size_t>(count)); return;
    case 0x09: {
      auto* o = out.data<int32_t>();
      for (int64_t i = 0; i < count; ++i) o[i] = static_cast<int8_t>(in[i]);
      return;
    }
    case 0x0B: {
      auto* o = out.data<int32_t>();
      for (int64_t i = 0; i < count; ++i) o[i] = static_cast<int16_t>(big_endian(in + 2 * i, 2));
      return;
    }
    case 0x0C: {
      auto* o = out.data<int32_t>();
      for (int64_t i = 0; i < count; ++i) o[i] = static_cast<int32_t>(big_endian(in + 4 * i, 4));
      return;
    }
    case 0x0D: {
      auto* o = out.data<float>();
      for (int64_t i = 0; i < count; ++i) {
        auto bits = static_cast<uint32_t>(big_endian(in + 4 * i, 4));
        std::memcpy(&o[i], &bits, 4);
      }
      return;
    }
    case 0x0E: {
      auto* o = out.data<double>();
      for (int64_t i = 0; i < count; ++i) {
        uint64_t bits = big_endian(in + 8 * i, 8);
        std::memcpy(&o[i], &bits, 8);
      }
      return;
    }
    default: TANDEM_THROW(ValueError, "idx: no conversion for type ", static_cast<int>(type.code));
  }
}

// Reads exactly n bytes unless the data ends first; returns how many were read.
size_t read_full(ByteSource& in, uint8_t* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    size_t k = in.read(dst + got, n - got);
    if (k == 0) break;
    got += k;
  }
  return got;
}

// What an IDX header says: the element type and the sizes.
struct Header {
  const ElementType* type;
  Shape shape;
  uint64_t numel;
};

Header read_header(ByteSource& in, const std::string& source) {
  uint8_t magic[4];
  size_t got = read_full(in, magic, 4);
  TANDEM_CHECK_AS(ValueError, got == 4, where(source), "the file is ", got, " bytes, shorter than the 4-byte magic");
  TANDEM_CHECK_AS(ValueError, magic[0] == 0 && magic[1] == 0, where(source), "bad magic ", hex_byte(magic[0]), " ",
                  hex_byte(magic[1]), " (an IDX file starts with 0x00 0x00 <type> <ndims>)");
  const ElementType* type = nullptr;
  for (const ElementType& t : kTypes) {
    if (t.code == magic[2]) type = &t;
  }
  TANDEM_CHECK_AS(ValueError, type != nullptr, where(source), "unknown element type ", hex_byte(magic[2]),
                  " (expected 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32 or 0x0E f64)");
  int ndims = magic[3];
  TANDEM_CHECK_AS(ValueError, ndims >= 1 && ndims <= 4, where(source), ndims, " dims: tandem reads 1 to 4");

  uint8_t raw[16];
  got = read_full(in, raw, 4 * static_cast<size_t>(ndims));
  TANDEM_CHECK_AS(ValueError, got == 4 * static_cast<size_t>(ndims), where(source), "the header is truncated: ", ndims,
                  " dims need ", 4 * ndims, " bytes of sizes, found ", got);
  Shape shape;
  uint64_t numel = 1;
  for (int d = 0; d < ndims; ++d) {
    uint64_t size = big_endian(raw + 4 * d, 4);
    shape.push_back(static_cast<int64_t>(size));
    TANDEM_CHECK_AS(ValueError, size > 0, where(source), "dim ", d, " has size 0 (sizes ", shape_str(shape), "...)");
    TANDEM_CHECK_AS(ValueError, numel <= kMaxDataBytes / type->size / size, where(source), "sizes ", shape_str(shape),
                    (d + 1 < ndims ? "..." : ""), " of ", type->name, " exceed the limit of ", kMaxDataBytes,
                    " bytes of data");
    numel *= size;
  }
  return {type, shape, numel};
}

Tensor parse_stream(ByteSource& in, uint64_t stored_size, const std::string& source) {
  const Header h = read_header(in, source);
  const ElementType* type = h.type;
  const Shape& shape = h.shape;
  const uint64_t numel = h.numel;
  const int ndims = static_cast<int>(shape.size());
  uint64_t expected = numel * type->size;
  uint64_t header = 4 + 4 * static_cast<uint64_t>(ndims);
  std::string described =
      detail::concat("sizes ", shape_str(shape), " of ", type->name, " need ", expected, " bytes of data");

  // Fill a buffer as the bytes arrive, so a header that lies about its sizes costs no memory.
  std::vector<uint8_t> bytes;
  if (stored_size != 0) {
    uint64_t available = stored_size >= header ? stored_size - header : 0;
    TANDEM_CHECK_AS(ValueError, available >= expected, where(source), "truncated: ", described, ", the file has ",
                    available, " (", stored_size, " bytes in all)");
  }
  while (bytes.size() < expected) {
    size_t before = bytes.size();
    size_t step = static_cast<size_t>(std::min<uint64_t>(expected - before, std::max(kChunk, before)));
    bytes.resize(before + step);
    size_t k = read_full(in, bytes.data() + before, step);
    bytes.resize(before + k);
    TANDEM_CHECK_AS(ValueError, k == step, where(source), "truncated: ", described, ", the file has ", bytes.size());
  }
  uint8_t extra[4096];
  uint64_t trailing = 0;
  for (size_t k; trailing < kChunk && (k = in.read(extra, sizeof(extra))) > 0;) trailing += k;
  TANDEM_CHECK_AS(ValueError, trailing == 0, where(source), trailing, (trailing >= kChunk ? " or more" : ""),
                  " trailing bytes: ", described, ", the file has ", expected + trailing,
                  (trailing >= kChunk ? " or more" : ""));

  Tensor out = empty(shape, type->dtype);
  convert(*type, bytes.data(), static_cast<int64_t>(numel), out);
  return out;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// What is at `path`: "" when nothing, else "a regular file", "a directory", "a FIFO", ...
std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

std::vector<uint8_t> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK_AS(ValueError, fd >= 0, "read_idx: cannot open '", path, "': ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TANDEM_CHECK_AS(BackendError, ::fstat(fd, &st) == 0, "read_idx: '", path, "': ", std::strerror(errno));
  TANDEM_CHECK_AS(ValueError, S_ISREG(st.st_mode), "read_idx: '", path, "' is ", file_kind(path),
                  ", expected a regular IDX file (plain or .gz)");
  TANDEM_CHECK_AS(ValueError, static_cast<uint64_t>(st.st_size) <= kMaxDataBytes + 64, where(path), "the file is ",
                  st.st_size, " bytes, over the limit of ", kMaxDataBytes, " bytes of data");
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t k = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (k < 0 && errno == EINTR) continue;
    TANDEM_CHECK_AS(BackendError, k >= 0, "read_idx: reading '", path, "': ", std::strerror(errno));
    if (k == 0) break;  // shrank while being read: the parser reports the truncation
    got += static_cast<size_t>(k);
  }
  bytes.resize(got);
  return bytes;
}

std::string find_file(const std::string& dir, const std::string& name) {
  std::string plain = dir + "/" + name;
  for (const std::string& path : {plain, plain + ".gz"}) {
    std::string kind = file_kind(path);
    if (kind.empty()) continue;
    TANDEM_CHECK_AS(ValueError, is_file(path), "load_fashion_mnist: '", path, "' is ", kind,
                    ", expected a regular IDX file (plain or .gz)");
    return path;
  }
  TANDEM_THROW(ValueError, "load_fashion_mnist: neither '", plain, "' nor '", plain, ".gz' exists");
}

bool holds_fashion_mnist(const std::string& dir) {
  for (const char* name : {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte"}) {
    std::string path = dir + "/" + name;
    if (!file_kind(path).empty() || !file_kind(path + ".gz").empty()) return true;  // find_file says what is wrong
  }
  return false;
}

// The header of a whole file's bytes, plain or gzip, decompressing only the header.
Header header_of(const std::vector<uint8_t>& bytes, const std::string& source) {
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) {
    GzipSource in(bytes.data(), bytes.size(), source);
    return read_header(in, source);
  }
  PlainSource in(bytes.data(), bytes.size());
  return read_header(in, source);
}

}  // namespace

Tensor parse_idx(const uint8_t* data, size_t size, const std::string& source) {
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    GzipSource in(data, size, source);
    return parse_stream(in, 0, source);
  }
  PlainSource in(data, size);
  return parse_stream(in, size, source);
}

Tensor read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_file(path);
  return parse_idx(bytes.data(), bytes.size(), path);
}

const char* fashion_mnist_class_name(int64_t label) {
  static constexpr const char* kNames[kFashionMnistClasses] = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  TANDEM_CHECK_AS(IndexError, label >= 0 && label < kFashionMnistClasses, "fashion_mnist_class_name: label ", label,
                  " is outside [0, ", kFashionMnistClasses, ")");
  return kNames[label];
}

std::string default_fashion_mnist_dir() {
  std::vector<std::string> looked;
  const char* env = std::getenv("TANDEM_DATA_DIR");
  if (env != nullptr && *env != '\0') {
    looked.push_back(std::string(env) + "/fashion-mnist");
    looked.emplace_back(env);
  }
  looked.emplace_back(kFashionMnistPackageDir);
  for (const std::string& dir : looked) {
    if (holds_fashion_mnist(dir)) return dir;
  }
  std::string list;
  for (const std::string& dir : looked) list += "\n  " + dir;
  TANDEM_THROW(ValueError, "Fashion-MNIST not found: no {train,t10k}-images-idx3-ubyte[.gz] in any of:", list,
               "\nPass a directory, set TANDEM_DATA_DIR (to the data or to a folder holding fashion-mnist/), or ",
               "install Debian's package dataset-fashion-mnist",
               env == nullptr || *env == '\0' ? " (TANDEM_DATA_DIR is not set)" : "");
}

FashionMnist load_fashion_mnist(const std::string& dir, bool train) {
  std::string d = dir.empty() ? default_fashion_mnist_dir() : dir;
  std::string prefix = train ? "train" : "t10k";
  std::string images_path = find_file(d, prefix + "-images-idx3-ubyte");
  std::string labels_path = find_file(d, prefix + "-labels-idx1-ubyte");
  const std::vector<uint8_t> image_bytes = read_file(images_path), label_bytes = read_file(labels_path);
  // The headers first: a file that lies about its count fails here, before it is decompressed.
  const Header ih = header_of(image_bytes, images_path), lh = header_of(label_bytes, labels_path);
  const Shape& is = ih.shape;
  TANDEM_CHECK_AS(ValueError, ih.type->code == 0x08 && is.size() == 3 && is[1] == 28 && is[2] == 28,
                  "load_fashion_mnist: '", images_path, "' declares ", ih.type->name, " ", shape_str(is),
                  ", expected u8 (N, 28, 28) images");
  TANDEM_CHECK_AS(ValueError, lh.type->code == 0x08 && lh.shape.size() == 1, "load_fashion_mnist: '", labels_path,
                  "' declares ", lh.type->name, " ", shape_str(lh.shape), ", expected u8 (N,) labels");
  TANDEM_CHECK_AS(ValueError, is[0] == lh.shape[0], "load_fashion_mnist: '", images_path, "' declares ", is[0],
                  " images but '", labels_path, "' declares ", lh.shape[0], " labels (they must be equal)");
  Tensor images = parse_idx(image_bytes.data(), image_bytes.size(), images_path);
  Tensor labels = parse_idx(label_bytes.data(), label_bytes.size(), labels_path);
  int64_t n = images.size(0);

  FashionMnist out;
  out.images = empty({n, 1, 28, 28}, DType::f32);  // (N, 1, 28, 28)
  out.labels = empty({n}, DType::i64);             // (N,)
  const uint8_t* px = images.data<uint8_t>();
  float* dst = out.images.data<float>();
  for (int64_t i = 0; i < images.numel(); ++i) dst[i] = static_cast<float>(px[i]) / 255.0f;
  const uint8_t* lb = labels.data<uint8_t>();
  int64_t* lo = out.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TANDEM_CHECK_AS(ValueError, lb[i] < kFashionMnistClasses, "load_fashion_mnist: '", labels_path, "': label ",
                    static_cast<int>(lb[i]), " at index ", i, " is not a class in [0, ", kFashionMnistClasses, ")");
    lo[i] = lb[i];
  }
  return out;
}

}  // namespace tandem::data
