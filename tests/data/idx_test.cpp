// IDX files: round trips of every element type, plain and gzip, the errors for malformed files,
// Fashion-MNIST loading from a directory the test writes, and the default data directory.
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/test_util.h"
#include "tandem/data/idx.h"

namespace tandem::data {
namespace {

using testing::ScratchDirectory;
using testing::throws_with;

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string be_u32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) out += be_u32(d);
  return out + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string random_bytes(size_t n) {
  Tensor t = randint(0, 256, {static_cast<int64_t>(n)}, DType::i64);
  std::string s;
  for (int64_t v : t.to_vector<int64_t>()) s.push_back(static_cast<char>(v));
  return s;
}

TEST(Idx, RoundTripsU8PlainAndGzip) {
  ScratchDirectory dir;
  manual_seed(testing::next_seed());
  std::string data = random_bytes(3 * 4 * 5);
  std::string bytes = idx_bytes(0x08, {3, 4, 5}, data);
  write_file(dir.file("plain"), bytes);
  write_gz(dir.file("packed.gz"), bytes);
  write_gz(dir.file("misnamed"), bytes);  // told apart by content, not name
  for (const char* name : {"plain", "packed.gz", "misnamed"}) {
    SCOPED_TRACE(name);
    Tensor t = read_idx(dir.file(name));
    EXPECT_EQ(t.dtype(), DType::u8);
    EXPECT_EQ(t.shape(), (Shape{3, 4, 5}));
    EXPECT_EQ(std::memcmp(t.data_ptr(), data.data(), data.size()), 0);
  }
}

TEST(Idx, ReadsConcatenatedGzipMembersAsOneStream) {
  ScratchDirectory dir;
  std::string bytes = idx_bytes(0x08, {6}, "abcdef");
  write_gz(dir.file("a.gz"), bytes.substr(0, 7));
  write_gz(dir.file("b.gz"), bytes.substr(7));
  write_file(dir.file("ab.gz"), read_file(dir.file("a.gz")) + read_file(dir.file("b.gz")));
  EXPECT_EQ(read_idx(dir.file("ab.gz")).to_vector<int>(), (std::vector<int>{'a', 'b', 'c', 'd', 'e', 'f'}));
}

TEST(Idx, ConvertsOtherElementTypes) {
  auto parse = [](const std::string& b) { return parse_idx(reinterpret_cast<const uint8_t*>(b.data()), b.size()); };
  Tensor i8 = parse(idx_bytes(0x09, {3}, std::string("\x7f\x80\xff", 3)));
  EXPECT_EQ(i8.dtype(), DType::i32);
  EXPECT_EQ(i8.to_vector<int>(), (std::vector<int>{127, -128, -1}));
  Tensor i16 = parse(idx_bytes(0x0B, {2}, std::string("\x01\x02\xff\xfe", 4)));
  EXPECT_EQ(i16.to_vector<int>(), (std::vector<int>{0x0102, -2}));
  Tensor i32 = parse(idx_bytes(0x0C, {1, 2}, std::string("\x01\x02\x03\x04\xff\xff\xff\xfd", 8)));
  EXPECT_EQ(i32.shape(), (Shape{1, 2}));
  EXPECT_EQ(i32.to_vector<int>(), (std::vector<int>{0x01020304, -3}));
  Tensor f32 = parse(idx_bytes(0x0D, {2}, std::string("\x3f\x80\x00\x00\xc0\x00\x00\x00", 8)));
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_EQ(f32.to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  Tensor f64 = parse(idx_bytes(0x0E, {1}, std::string("\x40\x09\x21\xfb\x54\x44\x2d\x18", 8)));
  EXPECT_EQ(f64.dtype(), DType::f64);
  EXPECT_EQ(f64.item<double>(), 3.141592653589793);
  Tensor four = parse(idx_bytes(0x08, {1, 2, 1, 2}, "wxyz"));
  EXPECT_EQ(four.shape(), (Shape{1, 2, 1, 2}));
}

TEST(Idx, RejectsMalformedFilesNamingTheFileAndSizes) {
  ScratchDirectory dir;
  std::string data = random_bytes(60);
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<std::string> message;
  };
  std::vector<Case> cases = {
      {"empty", "", {"the file is 0 bytes, shorter than the 4-byte magic"}},
      {"wrong magic", std::string("\x01\x02\x08\x01", 4) + be_u32(1) + "x", {"bad magic 0x01 0x02"}},
      {"unknown type", idx_bytes(0x0A, {1}, "x"), {"unknown element type 0x0a"}},
      {"no dims", idx_bytes(0x08, {}, ""), {"0 dims: tandem reads 1 to 4"}},
      {"five dims", idx_bytes(0x08, {1, 1, 1, 1, 1}, "x"), {"5 dims: tandem reads 1 to 4"}},
      {"header cut",
       idx_bytes(0x08, {3, 4, 5}, "").substr(0, 10),
       {"the header is truncated: 3 dims need 12 bytes", "found 6"}},
      {"zero size", idx_bytes(0x08, {3, 0, 5}, ""), {"dim 1 has size 0"}},
      {"oversized",
       idx_bytes(0x08, {65536, 65536, 2}, "x"),
       {"sizes [65536, 65536, 2] of u8 exceed the limit of 4294967296 bytes of data"}},
      {"oversized f64",
       idx_bytes(0x0E, {4294967295u, 4294967295u, 4294967295u, 4294967295u}, ""),
       {"of f64 exceed the limit"}},
      {"truncated",
       idx_bytes(0x08, {3, 4, 5}, data.substr(0, 59)),
       {"truncated: sizes [3, 4, 5] of u8 need 60 bytes of data, the file has 59 (75 bytes in all)"}},
      {"truncated i32", idx_bytes(0x0C, {3}, "12345678"), {"sizes [3] of i32 need 12 bytes of data, the file has 8"}},
      {"trailing",
       idx_bytes(0x08, {3, 4, 5}, data + "!!"),
       {"2 trailing bytes: sizes [3, 4, 5] of u8 need 60 bytes of data, the file has 62"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::string path = dir.file("bad");
    write_file(path, c.bytes);
    std::vector<std::string> parts = c.message;
    parts.push_back("idx '" + path + "': ");
    EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(path); }, parts));
    // The same inside gzip, where the sizes are only known by decompressing.
    if (c.bytes.size() >= 4 && std::string(c.what) != "oversized f64") {
      write_gz(path + ".gz", c.bytes);
      std::vector<std::string> gz_parts = {"idx '" + path + ".gz': "};
      EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(path + ".gz"); }, gz_parts));
    }
  }
  EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(dir.file("missing")); },
                                      {"read_idx: cannot open '" + dir.file("missing") + "'"}));
}

TEST(Idx, RejectsBrokenGzip) {
  ScratchDirectory dir;
  std::string bytes = idx_bytes(0x08, {2000}, random_bytes(2000));
  write_gz(dir.file("good.gz"), bytes);
  std::string gz = read_file(dir.file("good.gz"));

  write_file(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(dir.file("cut.gz")); },
                                      {"idx '" + dir.file("cut.gz") + "': the gzip data ends early"}));
  std::string corrupt = gz;
  corrupt[gz.size() - 6] ^= 0x55;  // inside the CRC-32 trailer
  write_file(dir.file("crc.gz"), corrupt);
  EXPECT_TRUE(
      throws_with<ValueError>([&] { read_idx(dir.file("crc.gz")); }, {"corrupt gzip data: incorrect data check"}));
  write_file(dir.file("junk.gz"), gz + "junk");
  EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(dir.file("junk.gz")); },
                                      {"4 bytes after the end of the gzip stream are not another gzip member"}));
  // A gzip member whose IDX content is short.
  write_gz(dir.file("short.gz"), bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(throws_with<ValueError>([&] { read_idx(dir.file("short.gz")); },
                                      {"truncated: sizes [2000] of u8 need 2000 bytes of data, the file has 1999"}));
}

// A small Fashion-MNIST-shaped data set: n images whose pixels are (i + p) % 256, labels i % 10.
void write_fake_fashion_mnist(const std::string& dir, const std::string& prefix, uint32_t n, uint32_t labels_n,
                              bool gz) {
  std::string pixels;
  for (uint32_t i = 0; i < n; ++i) {
    for (int p = 0; p < 28 * 28; ++p) pixels.push_back(static_cast<char>((i + p) % 256));
  }
  std::string labels;
  for (uint32_t i = 0; i < labels_n; ++i) labels.push_back(static_cast<char>(i % 10));
  std::string images_file = idx_bytes(0x08, {n, 28, 28}, pixels);
  std::string labels_file = idx_bytes(0x08, {labels_n}, labels);
  if (gz) {
    write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", images_file);
  } else {
    write_file(dir + "/" + prefix + "-images-idx3-ubyte", images_file);
  }
  write_file(dir + "/" + prefix + "-labels-idx1-ubyte", labels_file);
}

TEST(FashionMnist, LoadsImagesAsUnitFloatsAndLabelsAsI64) {
  ScratchDirectory dir;
  write_fake_fashion_mnist(dir.path(), "train", 7, 7, true);
  write_fake_fashion_mnist(dir.path(), "t10k", 3, 3, false);
  FashionMnist train = load_fashion_mnist(dir.path(), true);
  EXPECT_EQ(train.images.shape(), (Shape{7, 1, 28, 28}));
  EXPECT_EQ(train.images.dtype(), DType::f32);
  EXPECT_EQ(train.labels.shape(), (Shape{7}));
  EXPECT_EQ(train.labels.dtype(), DType::i64);
  const float* px = train.images.data<float>();
  EXPECT_EQ(px[0], 0.0f);
  EXPECT_EQ(px[255], 1.0f);
  EXPECT_EQ(px[28 * 28 + 1], 2.0f / 255.0f);  // image 1, pixel 1
  EXPECT_EQ(train.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  FashionMnist test = load_fashion_mnist(dir.path(), false);
  EXPECT_EQ(test.images.size(0), 3);
  EXPECT_STREQ(fashion_mnist_class_name(9), "Ankle boot");
  EXPECT_TRUE(throws_with<IndexError>([] { fashion_mnist_class_name(10); }, {"label 10 is outside [0, 10)"}));
}

TEST(FashionMnist, ChecksTheFilesAgree) {
  ScratchDirectory dir;
  write_fake_fashion_mnist(dir.path(), "train", 4, 5, false);
  EXPECT_TRUE(
      throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), true); }, {"declares 4 images but", "declares 5 labels"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), false); },
                                      {"neither '" + dir.file("t10k-images-idx3-ubyte") + "' nor", ".gz' exists"}));
  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes(0x08, {1, 2, 2}, "abcd"));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {1}, "\x01"));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), false); },
                                      {"declares u8 [1, 2, 2], expected u8 (N, 28, 28) images"}));
  write_fake_fashion_mnist(dir.path(), "t10k", 2, 2, false);
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {2}, "\x01\x0c"));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), false); },
                                      {"label 12 at index 1 is not a class in [0, 10)"}));
}

// A gzip file whose header declares far more images than the labels file has labels fails on the
// headers, before its data is decompressed (which would fail later, after allocating for it).
TEST(FashionMnist, ComparesHeaderCountsBeforeDecompressing) {
  ScratchDirectory dir;
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(0x08, {5000000, 28, 28}, std::string(784, '\0')));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {10}, std::string(10, '\1')));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), true); },
                                      {dir.file("train-images-idx3-ubyte.gz"), "declares 5000000 images",
                                       dir.file("train-labels-idx1-ubyte.gz"), "declares 10 labels", "must be equal"}));
}

TEST(FashionMnist, SaysWhatIsThereInsteadOfAFile) {
  ScratchDirectory dir;
  write_fake_fashion_mnist(dir.path(), "t10k", 2, 2, false);
  std::filesystem::create_directory(dir.file("train-images-idx3-ubyte"));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), true); },
                                      {dir.file("train-images-idx3-ubyte"), "is a directory", "expected a regular"}));
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte"));
  ASSERT_EQ(::mkfifo(dir.file("t10k-labels-idx1-ubyte").c_str(), 0600), 0);
  EXPECT_TRUE(throws_with<ValueError>([&] { load_fashion_mnist(dir.path(), false); },
                                      {dir.file("t10k-labels-idx1-ubyte"), "is a FIFO", "expected a regular"}));
  EXPECT_TRUE(throws_with<ValueError>([] { read_idx("/dev/null"); },
                                      {"'/dev/null' is a character device", "expected a regular"}));
}

TEST(FashionMnist, DefaultDirectoryFollowsTandemDataDir) {
  ScratchDirectory parent;
  std::string folder = parent.file("fashion-mnist");
  std::filesystem::create_directory(folder);
  write_fake_fashion_mnist(folder, "t10k", 2, 2, true);
  {
    ScopedEnv env("TANDEM_DATA_DIR", parent.path());  // the parent of fashion-mnist/
    EXPECT_EQ(default_fashion_mnist_dir(), folder);
    EXPECT_EQ(load_fashion_mnist("", false).images.size(0), 2);
  }
  {
    ScopedEnv env("TANDEM_DATA_DIR", folder);  // the folder itself
    EXPECT_EQ(default_fashion_mnist_dir(), folder);
  }
  ScratchDirectory empty;
  ScopedEnv env("TANDEM_DATA_DIR", empty.path());
  std::string found;
  try {
    found = default_fashion_mnist_dir();  // where the Debian package put it, if installed
  } catch (const ValueError&) {
    EXPECT_TRUE(throws_with<ValueError>(
        [] { default_fashion_mnist_dir(); },
        {"Fashion-MNIST not found", empty.file("fashion-mnist"), "\n  " + empty.path(), "dataset-fashion-mnist"}));
    return;
  }
  EXPECT_EQ(found.find(empty.path()), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(found + "/train-images-idx3-ubyte.gz") ||
              std::filesystem::exists(found + "/train-images-idx3-ubyte"));
}

// The real data set, where it is installed (scripts/install-deps.sh installs it).
TEST(FashionMnist, LoadsTheInstalledDataSet) {
  std::string dir;
  try {
    dir = default_fashion_mnist_dir();
  } catch (const ValueError& e) {
    GTEST_SKIP() << e.what();
  }
  for (bool train : {true, false}) {
    FashionMnist d = load_fashion_mnist(dir, train);
    int64_t n = train ? 60000 : 10000;
    EXPECT_EQ(d.images.shape(), (Shape{n, 1, 28, 28}));
    EXPECT_EQ(d.labels.shape(), (Shape{n}));
    std::vector<int64_t> count(10, 0);
    for (int64_t l : d.labels.to_vector<int64_t>()) count[static_cast<size_t>(l)]++;
    for (int64_t c : count) EXPECT_EQ(c, n / 10);  // balanced classes
    const float* px = d.images.data<float>();
    float lo = 1, hi = 0;
    double sum = 0;
    for (int64_t i = 0; i < d.images.numel(); ++i) {
      lo = std::min(lo, px[i]);
      hi = std::max(hi, px[i]);
      sum += px[i];
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
    EXPECT_NEAR(sum / static_cast<double>(d.images.numel()), 0.286, 0.005);  // the published mean
  }
}

}  // namespace
}  // namespace tandem::data
