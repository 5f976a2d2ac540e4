// CUDA kernels that are not written yet: each raises NotImplementedError. The CUDA backend
// issue replaces this file with real kernels, one file per family.
#include "tandem/core/backend.h"

namespace tandem::cuda {

namespace {
[[noreturn]] void pending(const char* what) { TANDEM_THROW(NotImplementedError, what, ": not yet implemented for cuda"); }
}  // namespace

void unary(UnaryOp op, const Tensor&, const Tensor&, double, double) { pending(unary_op_name(op)); }
void binary(BinaryOp op, const Tensor&, const Tensor&, const Tensor&) { pending(binary_op_name(op)); }
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("where"); }
void fill(const Tensor&, double) { pending("fill"); }
void reduce(ReduceOp op, const Tensor&, const Tensor&) { pending(reduce_op_name(op)); }
void softmax(const Tensor&, const Tensor&, bool) { pending("softmax"); }
void softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool) { pending("softmax_backward"); }
void cross_entropy_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, double) {
  pending("cross_entropy");
}
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                            double) {
  pending("cross_entropy_backward");
}
void matmul(const Tensor&, const Tensor&, const Tensor&) { pending("matmul"); }
void index_select(const Tensor&, const Tensor&, const Tensor&) { pending("index_select"); }
void index_add(const Tensor&, const Tensor&, const Tensor&) { pending("index_add"); }
void gather(const Tensor&, const Tensor&, const Tensor&) { pending("gather"); }
void scatter_add(const Tensor&, const Tensor&, const Tensor&) { pending("scatter_add"); }
void random(const Tensor&, RandomKind, uint64_t, uint64_t, double, double) { pending("random"); }
void add_inplace(const Tensor&, const Tensor&, double) { pending("add_"); }

}  // namespace tandem::cuda
