// Finite-difference gradient checks of matmul: 2-D, transposed operands, batched, broadcast batch
// dims and 1-D operands, on fresh random f64 inputs.
#include "gradcheck_util.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;
using testing::random_transposed_leaf;

Tensor mm(const Inputs& v) { return matmul(v[0], v[1]); }

TEST(GradcheckMatmul, TwoD) {
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({3, 4}), random_leaf({4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({1, 5}), random_leaf({5, 1})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({4, 1}), random_leaf({1, 3})}));
}

TEST(GradcheckMatmul, TransposedOperands) {
  EXPECT_GRADCHECK(mm, (Inputs{random_transposed_leaf({3, 4}), random_leaf({4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({3, 4}), random_transposed_leaf({4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_transposed_leaf({3, 4}), random_transposed_leaf({4, 2})}));
  // The transpose taken inside the function, through the differentiable op.
  EXPECT_GRADCHECK([](const Inputs& v) { return matmul(v[0], t(v[1])); },
                   (Inputs{random_leaf({3, 4}), random_leaf({2, 4})}));
  // A strided operand that is neither row- nor column-major.
  EXPECT_GRADCHECK([](const Inputs& v) { return matmul(slice(v[0], 1, 0, 8, 2), v[1]); },
                   (Inputs{random_leaf({3, 8}), random_leaf({4, 2})}));
}

// A product with t(W), as a tied output head computes it: W's gradient arrives contiguous, so
// accumulating it (beside the embedding's) is a plain add; it equals g^T x.
TEST(GradcheckMatmul, GradientOfATransposedWeightIsContiguous) {
  Tensor w = random_leaf({5, 3});
  Tensor x = testing::random_tensor({4, 3}), g = testing::random_tensor({4, 5});
  sum(mul(matmul(x, t(w)), g)).backward();
  EXPECT_TRUE(w.grad().is_contiguous());
  EXPECT_TRUE(testing::all_close(w.grad(), matmul(transpose(g, 0, 1), x), 1e-12, 1e-12));
}

TEST(GradcheckMatmul, Batched) {
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({2, 3, 4}), random_leaf({2, 4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_transposed_leaf({2, 3, 4}), random_transposed_leaf({2, 4, 2})}));
  // Batch dim not outermost in memory.
  Tensor a = views::permute(testing::random_tensor({3, 2, 4}), {1, 0, 2});
  a.requires_grad_();
  EXPECT_GRADCHECK(mm, (Inputs{a, random_leaf({2, 4, 2})}));
}

TEST(GradcheckMatmul, BroadcastBatchDims) {
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({2, 1, 3, 4}), random_leaf({5, 4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({2, 3, 4}), random_leaf({4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({3, 4}), random_leaf({2, 4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({1, 3, 4}), random_transposed_leaf({3, 4, 2})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({2, 1, 2, 3}), random_leaf({1, 3, 3, 2})}));
}

// Size-1 batch dims between broadcast ones: the batch dims must not be collapsed across them as if
// their strides chained (they carry any stride).
TEST(GradcheckMatmul, BroadcastBatchDimsAroundSizeOneDims) {
  // b's batch (2, 1, 1) broadcasts to (2, 1, 2); a's (2) to (2, 1, 2).
  for (const Inputs& in : {Inputs{random_leaf({1, 2, 1, 2}), random_leaf({2, 1, 1, 2, 2})},
                           Inputs{random_leaf({2, 1, 2}), random_leaf({2, 1, 2, 2, 1})}}) {
    SCOPED_TRACE(shape_str(in[0].shape()) + " @ " + shape_str(in[1].shape()));
    // The forward against the same product of dense, already broadcast copies.
    Shape batch = {2, 1, 2};
    Shape a_full = batch, b_full = batch;
    a_full.insert(a_full.end(), in[0].shape().end() - 2, in[0].shape().end());
    b_full.insert(b_full.end(), in[1].shape().end() - 2, in[1].shape().end());
    Tensor expected = matmul(contiguous(expand(in[0], a_full)), contiguous(expand(in[1], b_full)));
    EXPECT_TRUE(testing::all_close(matmul(in[0], in[1]), expected, 1e-12, 1e-12));
    EXPECT_GRADCHECK(mm, in);
  }
}

TEST(GradcheckMatmul, OneDOperands) {
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({4}), random_leaf({4, 3})}));     // 1-D @ 2-D
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({3, 4}), random_leaf({4})}));     // 2-D @ 1-D
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({5}), random_leaf({5})}));        // 1-D @ 1-D
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({2, 3, 4}), random_leaf({4})}));  // batched @ 1-D
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({4}), random_leaf({2, 4, 3})}));  // 1-D @ batched
  EXPECT_GRADCHECK(mm, (Inputs{random_transposed_leaf({3, 4}), random_leaf({4})}));
  EXPECT_GRADCHECK(mm, (Inputs{random_leaf({4}), random_transposed_leaf({4, 3})}));
}

TEST(GradcheckMatmul, OneDShapes) {
  EXPECT_EQ(matmul(random_leaf({4}), random_leaf({4, 3})).shape(), (Shape{3}));
  EXPECT_EQ(matmul(random_leaf({3, 4}), random_leaf({4})).shape(), (Shape{3}));
  EXPECT_EQ(matmul(random_leaf({4}), random_leaf({4})).shape(), (Shape{}));
  EXPECT_EQ(matmul(random_leaf({2, 3, 4}), random_leaf({4})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(random_leaf({4}), random_leaf({2, 4, 3})).shape(), (Shape{2, 3}));
}

TEST(GradcheckMatmul, OnlyOneOperandRequiresGrad) {
  Tensor w = testing::random_tensor({4, 2});
  EXPECT_GRADCHECK([w](const Inputs& v) { return matmul(v[0], w); }, (Inputs{random_leaf({3, 4})}));
  Tensor x = testing::random_tensor({2, 3, 4});
  EXPECT_GRADCHECK([x](const Inputs& v) { return matmul(x, v[0]); }, (Inputs{random_leaf({4, 2})}));
}

TEST(GradcheckMatmul, SameTensorOnBothSides) {
  EXPECT_GRADCHECK([](const Inputs& v) { return matmul(v[0], v[0]); }, (Inputs{random_leaf({3, 3})}));
  EXPECT_GRADCHECK([](const Inputs& v) { return matmul(t(v[0]), v[0]); }, (Inputs{random_leaf({4, 3})}));
}

}  // namespace
}  // namespace tandem
