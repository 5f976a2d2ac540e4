// A composite gradient check: a 2-layer MLP (matmul + bias + gelu + matmul + bias) under a
// cross-entropy loss, checked over all weights at once.
#include "gradcheck_util.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

Tensor mlp_loss(const Tensor& x, const Inputs& w, const Tensor& target, const CrossEntropyOptions& options) {
  Tensor h = gelu(add(matmul(x, w[0]), w[1]));  // (N, H)
  Tensor logits = add(matmul(h, w[2]), w[3]);   // (N, C)
  return cross_entropy(logits, target, options);
}

TEST(GradcheckMlp, TwoLayersWithCrossEntropy) {
  const int64_t n = 4, in = 3, hidden = 5, classes = 3;
  Tensor x = testing::random_tensor({n, in});
  Tensor target = from_vector(std::vector<int64_t>{2, 0, 1, 2});
  Inputs weights = {random_leaf({in, hidden}), random_leaf({hidden}), random_leaf({hidden, classes}),
                    random_leaf({classes})};
  EXPECT_GRADCHECK([&](const Inputs& w) { return mlp_loss(x, w, target, {}); }, weights);

  // Smoothed labels, an ignored row and a summed loss; the input's gradient too.
  CrossEntropyOptions options;
  options.label_smoothing = 0.1;
  options.reduction = Reduction::sum;
  Tensor partial = from_vector(std::vector<int64_t>{1, -100, 0, 2});
  Tensor xl = x.detach().requires_grad_();
  Inputs all = weights;
  all.push_back(xl);
  EXPECT_GRADCHECK([&](const Inputs& v) { return mlp_loss(v[4], v, partial, options); }, all);
}

}  // namespace
}  // namespace tandem
