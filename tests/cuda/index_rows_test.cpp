// index_select and index_add on the GPU over rows that take the row kernels (whole 16-byte
// vectors, aligned) and rows that do not (odd widths, a misaligned view): the CPU backend's
// results, NaN rows (0 in integers) for an out-of-range index, and out-of-range rows skipped by
// index_add.
#include <cmath>

#include "support/test_util.h"
#include "tandem/core/index.h"

namespace tandem {
namespace {

const Device kGpu("cuda:0"), kCpu("cpu");

using testing::random_indices;
using testing::same_bits;

// Row widths: 64 and 72 are whole 16-byte vectors in every dtype here (the row kernels), 9 and
// 12 are not in the 16-bit ones (one thread per element).
const std::vector<int64_t> kWidths = {64, 72, 9, 12};

class IndexRows : public ::testing::TestWithParam<DType> {};

TEST_P(IndexRows, SelectCopiesTheCpuBits) {
  TANDEM_REQUIRE_CUDA();
  for (int64_t width : kWidths) {
    for (int64_t outer : {1, 3}) {
      Tensor x = testing::random_tensor({outer, 40, width}).to(GetParam());  // (outer, 40, width)
      Tensor index = random_indices(57, -40, 40);                            // (57,) repeats and negatives
      Tensor expected = kernels::index_select(x, 1, index);
      Tensor got = kernels::index_select(x.to(kGpu), 1, index.to(kGpu)).to(kCpu);
      EXPECT_TRUE(same_bits(got, expected)) << "width " << width << ", outer " << outer;
    }
  }
}

TEST_P(IndexRows, SelectGivesInvalidRowsForOutOfRangeIndices) {
  TANDEM_REQUIRE_CUDA();
  for (int64_t width : kWidths) {
    Tensor x = testing::random_tensor({10, width}).to(GetParam()).to(kGpu);  // (10, width)
    Tensor index = from_vector(std::vector<int64_t>{3, 10, -11, 9}).to(kGpu);  // 10 and -11 are out of range
    std::vector<double> rows = kernels::index_select(x, 0, index).to(kCpu).to_double_vector();
    std::vector<double> source = x.to(kCpu).to_double_vector();
    const bool floating = is_floating(GetParam());
    for (int64_t j = 0; j < 4; ++j) {
      for (int64_t c = 0; c < width; ++c) {
        double v = rows[static_cast<size_t>(j * width + c)];
        if (j == 1 || j == 2) {
          EXPECT_TRUE(floating ? std::isnan(v) : v == 0) << "width " << width << ", row " << j << ": " << v;
        } else {
          EXPECT_EQ(v, source[static_cast<size_t>((j == 0 ? 3 : 9) * width + c)]) << "width " << width;
        }
      }
    }
  }
}

TEST_P(IndexRows, AddMatchesTheCpuAndSkipsOutOfRangeRows) {
  TANDEM_REQUIRE_CUDA();
  const DType dtype = GetParam();
  // Many entries per row: the atomic adds collide, and they round at every add, in any order.
  const double tol = dtype == DType::bf16 ? 5e-2 : dtype == DType::f16 ? 1e-2 : dtype == DType::f32 ? 1e-5 : 1e-12;
  for (int64_t width : kWidths) {
    for (int64_t outer : {1, 2}) {
      Tensor index = random_indices(300, -20, 20);                              // (300,) into 20 rows
      Tensor src = testing::random_tensor({outer, 300, width}).to(dtype);       // (outer, 300, width)
      Tensor expected = kernels::index_add({outer, 20, width}, 1, index, src);  // on the CPU
      Tensor got = kernels::index_add({outer, 20, width}, 1, index.to(kGpu), src.to(kGpu)).to(kCpu);
      EXPECT_TRUE(testing::all_close(got.to(DType::f64), expected.to(DType::f64), tol, tol))
          << "width " << width << ", outer " << outer;
    }
    // Entries past the table's end are skipped on the GPU (the CPU raises).
    Tensor out = testing::random_tensor({5, width}).to(dtype).to(kGpu);  // (5, width)
    Tensor before = out.to(kCpu);
    Tensor src = testing::random_tensor({2, width}).to(dtype).to(kGpu);
    kernels::index_add_(out, 0, from_vector(std::vector<int64_t>{5, -6}).to(kGpu), src);
    EXPECT_TRUE(same_bits(out.to(kCpu), before)) << "width " << width;
  }
}

// A table whose rows start 2 bytes past a 16-byte boundary takes the per-element kernels.
TEST_P(IndexRows, MisalignedRowsGiveTheSameResults) {
  TANDEM_REQUIRE_CUDA();
  const DType dtype = GetParam();
  Tensor flat = testing::random_tensor({1 + 30 * 64}).to(dtype);   // (1 + 30 * 64,)
  Tensor table = flat.as_strided({30, 64}, {64, 1}, 1);            // (30, 64) one element in
  Tensor table_gpu = flat.to(kGpu).as_strided({30, 64}, {64, 1}, 1);
  Tensor index = random_indices(45, -30, 30);
  EXPECT_TRUE(same_bits(kernels::index_select(table_gpu, 0, index.to(kGpu)).to(kCpu),
                        kernels::index_select(table, 0, index)));
  if (!is_floating(dtype)) return;
  Tensor src = testing::random_tensor({45, 64}).to(dtype);
  kernels::index_add_(table, 0, index, src);
  kernels::index_add_(table_gpu, 0, index.to(kGpu), src.to(kGpu));
  // index_add_ adds in order (sorted), as the CPU does: the same bits in f32 and f64.
  const double tol = dtype == DType::bf16 ? 5e-2 : dtype == DType::f16 ? 1e-2 : 0;
  EXPECT_TRUE(testing::all_close(table_gpu.to(kCpu).to(DType::f64), table.to(DType::f64), tol, tol));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, IndexRows,
                         ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace tandem
