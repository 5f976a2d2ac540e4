// The device-neutral side of matmul: NumPy's promotion of 1-D operands and broadcast batch dims,
// flattened to the (B, M, K) @ (B, K, N) the backends multiply.
#include "tandem/core/matmul.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

namespace {
// Flattens the batch dims (all but the last two) of x into one, as a view when the layout
// allows and through a contiguous copy otherwise: (b1..bn, R, C) -> (B, R, C).
Tensor flatten_batch(const Tensor& x) {
  int64_t nb = x.dim() - 2;
  int64_t batch = 1;
  for (int64_t d = 0; d < nb; ++d) batch *= x.shape()[d];
  Shape s = {batch, x.shape()[nb], x.shape()[nb + 1]};
  // Collapsible when every batch stride is 0 (pure broadcast) or each continues the next
  // non-trivial one. Size-1 dims are skipped: their stride can be anything (0 after a broadcast).
  bool all_zero = true;
  bool chained = true;
  int64_t inner_batch = -1;  // innermost batch dim of size > 1
  for (int64_t d = 0; d < nb; ++d) {
    all_zero = all_zero && (x.strides()[d] == 0 || x.shape()[d] == 1);
    if (x.shape()[d] == 1) continue;
    if (inner_batch >= 0 && x.strides()[inner_batch] != x.strides()[d] * x.shape()[d]) chained = false;
    inner_batch = d;
  }
  if (nb == 0 || inner_batch < 0) return x.as_strided(s, {0, x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  if (all_zero) return x.as_strided(s, {0, x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  if (chained) return x.as_strided(s, {x.strides()[inner_batch], x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  Tensor c = contiguous(x);
  return c.as_strided(s, contiguous_strides(s), c.offset());
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_same_device("matmul", a_in, b_in);
  check_same_dtype("matmul", a_in, b_in);
  check_floating("matmul", a_in);
  TANDEM_CHECK_AS(ValueError, a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
                  shape_str(a_in.shape()), " @ ", shape_str(b_in.shape()));
  Tensor a = a_in.dim() == 1 ? views::unsqueeze(a_in, 0) : a_in;  // (K) -> (1, K)
  Tensor b = b_in.dim() == 1 ? views::unsqueeze(b_in, 1) : b_in;  // (K) -> (K, 1)
  int64_t m = a.shape()[a.dim() - 2], k = a.shape()[a.dim() - 1];
  int64_t k2 = b.shape()[b.dim() - 2], n = b.shape()[b.dim() - 1];
  TANDEM_CHECK_AS(ValueError, k == k2, "matmul: ", shape_str(a_in.shape()), " @ ", shape_str(b_in.shape()),
                  ": inner sizes ", k, " and ", k2, " differ");
  Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = empty(out_shape, a.options());
  Shape out3 = {shape_numel(batch), m, n};
  TANDEM_ROUTE(a.device(), matmul, flatten_batch(views::expand(a, a_full)), flatten_batch(views::expand(b, b_full)),
               out.as_strided(out3, contiguous_strides(out3), 0));
  if (a_in.dim() == 1) out = views::squeeze(out, -2);
  if (b_in.dim() == 1) out = views::squeeze(out, -1);
  return out;
}

}  // namespace tandem::kernels
