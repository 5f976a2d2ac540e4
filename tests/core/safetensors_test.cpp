// safetensors: round trips of every dtype and layout, the exact bytes written, every malformed
// file the loader must reject (with its message), and atomic replacement of an existing file.
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/safetensors.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::ScratchDirectory;
using testing::throws_with;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le_u64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file made of `header` (unpadded) and `data`.
std::string raw_file(const std::string& header, const std::string& data) {
  return le_u64(header.size()) + header + data;
}

std::vector<std::string> names_in_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Same dtype, shape and bytes.
::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  if (a.shape() != b.shape()) {
    return ::testing::AssertionFailure() << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  }
  Tensor ca = kernels::contiguous(kernels::to_device(a, Device()));
  Tensor cb = kernels::contiguous(kernels::to_device(b, Device()));
  if (ca.nbytes() > 0 && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

Tensor random_of(DType dtype, const Shape& shape) {
  switch (dtype) {
    case DType::i32:
    case DType::i64: return randint(-1000000, 1000000, shape, dtype, nullptr);
    case DType::u8: return randint(0, 256, shape, dtype);
    case DType::boolean: return kernels::to_dtype(bernoulli(shape, 0.5), DType::boolean);
    default: return kernels::to_dtype(testing::random_tensor(shape), dtype);
  }
}

const DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                            DType::i32, DType::i64, DType::u8,  DType::boolean};

TEST(Safetensors, RoundTripsEveryDTypeAndShape) {
  ScratchDirectory dir;
  manual_seed(testing::next_seed());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType d : kAllDTypes) {
    std::string n = dtype_name(d);
    tensors.emplace_back(n + ".matrix", random_of(d, {3, 5}));
    tensors.emplace_back(n + ".cube", random_of(d, {2, 3, 4}));
    tensors.emplace_back(n + ".scalar", random_of(d, {}));
    tensors.emplace_back(n + ".empty", random_of(d, {0, 7}));
  }
  std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors);
  SafetensorsFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    EXPECT_TRUE(same_tensor(f.at(name), t)) << name;
    EXPECT_TRUE(f.at(name).device().is_cpu());
    EXPECT_TRUE(f.at(name).is_contiguous());
  }
  EXPECT_TRUE(f.metadata.empty());
  // The in-memory form is the same bytes as the file.
  std::vector<uint8_t> bytes = serialize_safetensors(tensors);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), read_bytes(path));
  SafetensorsFile g = parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(g.names, f.names);
}

TEST(Safetensors, SavesNonContiguousTensorsByValue) {
  ScratchDirectory dir;
  Tensor base = testing::random_tensor({4, 6}, DType::f32);
  Tensor transposed = views::transpose(base, 0, 1);                         // (6, 4), strides (1, 6)
  Tensor narrowed = views::narrow(base, 1, 2, 3);                           // (4, 3), offset 2
  Tensor expanded = views::expand(testing::random_tensor({1, 3}), {5, 3});  // stride 0
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(narrowed.is_contiguous());
  std::string path = dir.file("views.safetensors");
  save_safetensors(path, {{"t", transposed}, {"n", narrowed}, {"e", expanded}});
  SafetensorsFile f = load_safetensors(path);
  EXPECT_TRUE(same_tensor(f.at("t"), transposed));
  EXPECT_TRUE(same_tensor(f.at("n"), narrowed));
  EXPECT_TRUE(same_tensor(f.at("e"), expanded));
  EXPECT_TRUE(testing::all_close(f.at("t"), kernels::contiguous(transposed), 0, 0));
}

TEST(Safetensors, SavesGpuTensors) {
  TANDEM_REQUIRE_CUDA();
  ScratchDirectory dir;
  Tensor cpu = testing::random_tensor({8, 5}, DType::f32);
  Tensor gpu = views::transpose(kernels::to_device(cpu, Device("cuda")), 0, 1);  // (5, 8), non-contiguous
  std::string path = dir.file("gpu.safetensors");
  save_safetensors(path, {{"w", gpu}, {"h", kernels::to_device(kernels::to_dtype(cpu, DType::bf16), Device("cuda"))}});
  SafetensorsFile f = load_safetensors(path);
  EXPECT_TRUE(f.at("w").device().is_cpu());
  EXPECT_TRUE(same_tensor(f.at("w"), views::transpose(cpu, 0, 1)));
  EXPECT_TRUE(same_tensor(f.at("h"), kernels::to_dtype(cpu, DType::bf16)));
}

TEST(Safetensors, KeepsMetadata) {
  ScratchDirectory dir;
  std::string path = dir.file("meta.safetensors");
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "1200"}, {"note", "quotes \" and \\ and ü"}};
  save_safetensors(path, {{"x", ones({2})}}, meta);
  EXPECT_EQ(load_safetensors(path).metadata, meta);
  // A file with only metadata, and one with nothing at all.
  save_safetensors(path, std::vector<std::pair<std::string, Tensor>>{}, meta);
  SafetensorsFile f = load_safetensors(path);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_EQ(f.metadata, meta);
  save_safetensors(path, std::map<std::string, Tensor>{});
  EXPECT_EQ(read_bytes(path), le_u64(8) + "{}      ");
}

TEST(Safetensors, LaysTensorsOutInSortedNameOrder) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"zeta", ones({3}, DType::f64)}, {"alpha", ones({2}, DType::u8)}, {"mid", ones({1, 2}, DType::i32)}};
  std::vector<uint8_t> bytes = serialize_safetensors(tensors);
  SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(f.names, (std::vector<std::string>{"alpha", "mid", "zeta"}));
  std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find(R"("alpha":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("mid":{"dtype":"I32","shape":[1,2],"data_offsets":[2,10]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("zeta":{"dtype":"F64","shape":[3],"data_offsets":[10,34]})"), std::string::npos) << text;
  // The header is padded so the data section starts at a multiple of 8.
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 34);
}

TEST(Safetensors, WritesExactlyTheExpectedBytes) {
  Tensor b = from_vector(std::vector<float>{1.0f, -2.0f});
  Tensor a = kernels::to_dtype(tensor({1, 2, 3}), DType::u8);
  std::vector<uint8_t> bytes = serialize_safetensors({{"b", b}, {"a", a}}, {{"format", "pt"}});
  const char header[] = R"({"__metadata__":{"format":"pt"},)"
                        R"("a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}})"
                        "      ";  // 138 bytes of JSON + 6 of padding
  std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header +
                         std::string(
                             "\x01\x02\x03"       // a: 1, 2, 3
                             "\x00\x00\x80\x3f"   // b[0]: 1.0f
                             "\x00\x00\x00\xc0",  // b[1]: -2.0f
                             11);
  ASSERT_EQ(sizeof(header) - 1, 144u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), expected);

  // The same bytes, hand-written, load back.
  SafetensorsFile f = parse_safetensors(reinterpret_cast<const uint8_t*>(expected.data()), expected.size());
  EXPECT_EQ(f.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.at("a").to_vector<int>(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(f.at("b").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
}

TEST(Safetensors, ReadsFilesLaidOutInAnyOrder) {
  // The reference writer sorts by dtype alignment, not by name; unpadded headers are valid too.
  std::string header = R"({"small":{"dtype":"U8","shape":[1],"data_offsets":[8,9]},)"
                       R"("big":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("none":{"dtype":"BF16","shape":[0],"data_offsets":[9,9]}})";
  std::string data = std::string("\x05\0\0\0\0\0\0\0", 8) + "\x07";
  std::string file = raw_file(header, data);
  SafetensorsFile f = parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  EXPECT_EQ(f.names, (std::vector<std::string>{"big", "small", "none"}));
  EXPECT_EQ(f.at("big").item<int64_t>(), 5);
  EXPECT_EQ(f.at("small").item<int>(), 7);
  EXPECT_EQ(f.at("none").shape(), (Shape{0}));
}

struct Malformed {
  const char* what;
  std::string bytes;
  std::vector<std::string> message;
};

std::vector<Malformed> malformed_files() {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::string eight(8, '\0');
  return {
      {"truncated", std::string("\x10\0\0", 3), {"3 bytes, shorter than the 8-byte header length"}},
      {"header too long", le_u64(200'000'000) + "{}", {"header length 200000000 exceeds the limit of 100000000"}},
      {"header past the end", le_u64(64) + "{}", {"header length 64 reaches past the end of the file (10 bytes"}},
      {"bad json", raw_file(R"({"a":{"dtype":"F32",)", ""), {"header is not valid JSON"}},
      {"not an object", raw_file("[1, 2]", ""), {"header must start with '{'"}},
      {"unknown dtype",
       raw_file(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
       {"tensor 'a': unknown dtype 'I8'"}},
      {"offsets mismatch",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,4]}})", "abcd"),
       {"tensor 'a': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"}},
      {"overlap",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[4,12]}})",
                eight + "1234"),
       {"tensors 'a' [0, 8) and 'b' [4, 12) overlap"}},
      {"hole",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[12,20]}})",
                eight + "1234" + eight),
       {"hole in the data section: bytes [8, 12) belong to no tensor"}},
      {"hole at the start",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[4,12]}})", "1234" + eight),
       {"hole in the data section: bytes [0, 4)"}},
      {"trailing bytes",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", eight + "junk"),
       {"the data section has 12 bytes but the tensors cover only 8 (4 trailing bytes)"}},
      {"past the data",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", "1234"),
       {"tensor 'a': data_offsets [0, 8] reach past the data section (4 bytes)"}},
      {"duplicate name",
       raw_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"a":{)" + f32x2 + R"(,"data_offsets":[8,16]}})",
                eight + eight),
       {"duplicate tensor name 'a'"}},
      {"duplicate field",
       raw_file(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"),
       {"duplicate key 'dtype'"}},
      {"negative size",
       raw_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x"),
       {"tensor 'a': shape entry is negative: -1"}},
      {"overflowing shape",
       raw_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", "x"),
       {"tensor 'a': shape [4294967296,4294967296] overflows 64-bit sizes"}},
      {"fractional size",
       raw_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "x"),
       {"shape entry must be a non-negative integer, got 1.5"}},
      {"offsets reversed",
       raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}})", "x"),
       {"data_offsets [1, 0] end before they begin"}},
      {"missing field",
       raw_file(R"({"a":{"dtype":"U8","shape":[1]}})", "x"),
       {"tensor 'a': missing field 'data_offsets'"}},
      {"unexpected field",
       raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", "x"),
       {"tensor 'a': unexpected field 'x'"}},
      {"bad bool",
       raw_file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)),
       {"BOOL tensor 'a' holds byte 2 at element 1 (must be 0 or 1)"}},
      {"bad metadata", raw_file(R"({"__metadata__":{"step":3}})", ""), {"__metadata__ 'step' must be a string, got 3"}},
      {"too deep", raw_file(R"({"a":{"shape":[[[1]]]}})", ""), {"header nests deeper than a safetensors header can"}},
  };
}

TEST(Safetensors, RejectsMalformedFilesWithAClearMessage) {
  ScratchDirectory dir;
  for (const Malformed& m : malformed_files()) {
    SCOPED_TRACE(m.what);
    std::string path = dir.file("bad.safetensors");
    write_bytes(path, m.bytes);
    std::vector<std::string> parts = m.message;
    parts.push_back("safetensors '" + path + "': ");  // names the file
    EXPECT_TRUE(throws_with<ValueError>([&] { load_safetensors(path); }, parts));
    std::vector<std::string> buffer_parts = m.message;
    buffer_parts.push_back("safetensors '<buffer>': ");
    EXPECT_TRUE(throws_with<ValueError>(
        [&] { parse_safetensors(reinterpret_cast<const uint8_t*>(m.bytes.data()), m.bytes.size()); }, buffer_parts));
  }
}

TEST(Safetensors, RejectsBadArguments) {
  ScratchDirectory dir;
  std::string path = dir.file("x.safetensors");
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        save_safetensors(path, {{"a", ones({1})}, {"a", ones({2})}});
      },
      {"duplicate tensor name 'a'"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        save_safetensors(path, {{"__metadata__", ones({1})}});
      },
      {"'__metadata__' is reserved"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { save_safetensors(path, {{"u", Tensor()}}); }, {"tensor 'u' is undefined"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        save_safetensors(path, {{std::string("\xff"), ones({1})}});
      },
      {"not valid UTF-8"}));
  EXPECT_TRUE(names_in_dir(dir.path()).empty());  // nothing was written
  EXPECT_TRUE(throws_with<ValueError>([&] { load_safetensors(dir.file("missing")); },
                                      {"cannot open '" + dir.file("missing") + "'"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { load_safetensors(dir.path()); }, {"is not a regular file"}));
  save_safetensors(path, {{"a", ones({1})}, {"b", ones({1})}});
  EXPECT_TRUE(throws_with<ValueError>([&] { load_safetensors(path).at("c"); },
                                      {"no tensor named 'c'; the file holds 'a', 'b'"}));
}

TEST(Safetensors, ReplacesAFileAtomically) {
  ScratchDirectory dir;
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", full({4}, 1.0)}});
  std::string old_bytes = read_bytes(path);
  save_safetensors(path, {{"w", full({4}, 2.0)}});
  EXPECT_NE(read_bytes(path), old_bytes);
  EXPECT_EQ(load_safetensors(path).at("w").to_vector<double>(), (std::vector<double>{2, 2, 2, 2}));
  EXPECT_EQ(names_in_dir(dir.path()), (std::vector<std::string>{"model.safetensors"}));  // no temporary left
}

TEST(Safetensors, AFailedWriteLeavesTheOldFileIntact) {
  ScratchDirectory dir;
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", full({4}, 1.0)}});
  std::string old_bytes = read_bytes(path);

  // Fail in the middle of writing: the process may not write files over 4 KiB.
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = throws_with<BackendError>(
      [&] {
        save_safetensors(path, {{"w", full({100000}, 2.0)}});
      },
      {"save_safetensors: writing '" + path + ".tmp."});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(path), old_bytes);
  EXPECT_EQ(names_in_dir(dir.path()), (std::vector<std::string>{"model.safetensors"}));

  // A directory in the way of the rename is left as it was.
  std::string sub = dir.file("sub");
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  write_bytes(sub + "/keep", "kept");
  EXPECT_TRUE(throws_with<BackendError>(
      [&] {
        save_safetensors(sub, {{"w", ones({2})}});
      },
      {"save_safetensors: renaming '" + sub + ".tmp.", "' to '" + sub + "'"}));
  EXPECT_EQ(read_bytes(sub + "/keep"), "kept");
  EXPECT_EQ(names_in_dir(dir.path()), (std::vector<std::string>{"model.safetensors", "sub"}));

  // A directory that does not exist.
  EXPECT_TRUE(throws_with<BackendError>([&] { save_safetensors(dir.file("no/such/dir/m.safetensors"), {}); },
                                        {"save_safetensors: cannot create"}));
}

TEST(Safetensors, AnUnwritableDirectoryLeavesTheOldFileIntact) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which may write anywhere";
  ScratchDirectory dir;
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", full({4}, 1.0)}});
  std::string old_bytes = read_bytes(path);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
  bool threw = throws_with<BackendError>(
      [&] {
        save_safetensors(path, {{"w", full({4}, 2.0)}});
      },
      {"save_safetensors: cannot create '" + path + ".tmp."});
  ::chmod(dir.path().c_str(), 0755);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(path), old_bytes);
}

}  // namespace
}  // namespace tandem
