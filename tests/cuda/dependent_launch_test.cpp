// Programmatic dependent launch (core/cuda/dependent_launch.cuh): each tandem kernel may be
// scheduled while the kernel before it is finishing, and waits for it before touching memory. Long
// chains of kernels, each reading what the one before wrote, give the CPU's results eagerly and
// the eager bits when captured in a CUDA graph and replayed (where the launches become
// programmatic edges), on fresh random inputs.
#include "support/test_util.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/cuda_graph.h"

namespace tandem {
namespace {

Tensor on_gpu(const Tensor& t) { return to(t, Device("cuda")); }
Tensor on_cpu(const Tensor& t) { return to(t, Device("cpu")); }

// 400 elementwise kernels, each reading its predecessor's output: x <- x * 0.5 + y, 200 times.
Tensor elementwise_chain(Tensor x, const Tensor& y) {
  for (int i = 0; i < 200; ++i) x = add(mul(x, 0.5), y);
  return x;
}

// Reductions between elementwise kernels: x <- (x - mean(x)) * 0.75 + y, 60 times (the mean is a
// split reduction and the combination of its partial results: small kernels back to back).
Tensor reducing_chain(Tensor x, const Tensor& y) {
  for (int i = 0; i < 60; ++i) x = add(mul(sub(x, mean(x)), 0.75), y);
  return x;
}

TEST(DependentLaunch, ChainsOfKernelsSeeTheirPredecessorsWrites) {
  TANDEM_REQUIRE_CUDA();
  const Shape shape{1000, 1031};  // not a whole number of blocks or vectors
  const Tensor x = testing::random_uniform(shape, -2.0, 2.0, DType::f32);
  const Tensor y = testing::random_uniform(shape, -1.0, 1.0, DType::f32);
  // Each product and sum is rounded once, in the same order on both devices: the same bits.
  EXPECT_TRUE(testing::all_close(on_cpu(elementwise_chain(on_gpu(x), on_gpu(y))), elementwise_chain(x, y), 0, 0));
  // The GPU sums the mean in another order than the CPU: to rounding.
  EXPECT_TRUE(testing::all_close(on_cpu(reducing_chain(on_gpu(x), on_gpu(y))), reducing_chain(x, y), 1e-4, 1e-5));
}

TEST(DependentLaunch, ReplayedChainsGiveTheEagerBits) {
  TANDEM_REQUIRE_CUDA();
  const Tensor x = on_gpu(testing::random_uniform({512, 777}, -2.0, 2.0, DType::f32));
  const Tensor y = on_gpu(testing::random_uniform({512, 777}, -1.0, 1.0, DType::f32));
  const Tensor eager_elementwise = on_cpu(elementwise_chain(x, y));
  const Tensor eager_reducing = on_cpu(reducing_chain(x, y));
  cuda::Graph graph;
  graph.capture_begin(0);
  Tensor elementwise = elementwise_chain(x, y);
  Tensor reducing = reducing_chain(x, y);
  graph.capture_end();
  EXPECT_GT(graph.num_edges(), 0);  // the count is readable with programmatic edges in the graph
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    graph.replay();
    EXPECT_TRUE(testing::all_close(on_cpu(elementwise), eager_elementwise, 0, 0));
    EXPECT_TRUE(testing::all_close(on_cpu(reducing), eager_reducing, 0, 0));
  }
  graph.reset();
}

}  // namespace
}  // namespace tandem
