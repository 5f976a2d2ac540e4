// Matrix product and its gradient: dA = dC @ B^T, dB = A^T @ dC, with 1-D operands promoted
// and broadcast batch dims summed back.
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {
// A 2-D view whose transpose is contiguous: t(W) for a contiguous W.
bool is_transposed_matrix(const Tensor& x) {
  return x.dim() == 2 && !x.is_contiguous() && views::transpose(x, 0, 1).is_contiguous();
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::matmul(a, b);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // b's gradient runs beside the rest of backward when only a leaf reads it (a weight).
  const bool b_beside = need_b && autograd::gradient_reaches_leaf(b);
  return record(out, "matmul", {a, b},
                [sa = saved(a), sb = saved(b), need_a, need_b, b_beside](const Tensor& g) -> std::vector<Tensor> {
                  // Work on the promoted operands: a (..., M, K), b (..., K, N), g (..., M, N).
                  Tensor a2 = sa.dim() == 1 ? views::unsqueeze(sa, 0) : sa;
                  Tensor b2 = sb.dim() == 1 ? views::unsqueeze(sb, 1) : sb;
                  Tensor g2 = g;
                  if (sa.dim() == 1) g2 = views::unsqueeze(g2, g2.dim() - (sb.dim() == 1 ? 0 : 1));
                  if (sb.dim() == 1) g2 = views::unsqueeze(g2, g2.dim());
                  Tensor ga, gb;
                  if (need_a) {
                    ga = kernels::matmul(g2, views::transpose(b2, -1, -2));
                    ga = views::reshape(kernels::sum_to(ga, a2.shape()), sa.shape());
                  }
                  auto b_gradient = [&]() -> std::vector<Tensor> {
                    if (is_transposed_matrix(sb) && a2.dim() == 2 && g2.dim() == 2) {
                      // b is the transpose of a contiguous weight (a tied output head): its gradient
                      // is computed as (g^T a)^T, so it reaches the weight contiguous.
                      return {views::transpose(kernels::matmul(views::transpose(g2, 0, 1), a2), 0, 1)};
                    }
                    Tensor gb = kernels::matmul(views::transpose(a2, -1, -2), g2);
                    return {views::reshape(kernels::sum_to(gb, b2.shape()), sb.shape())};
                  };
                  if (need_b) gb = b_beside ? autograd::run_beside({g2, a2}, b_gradient)[0] : b_gradient()[0];
                  return {ga, gb};
                });
}

}  // namespace tandem
