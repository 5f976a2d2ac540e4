// Column sums launched together after backward (core/column_sum_batch.h). The batch itself, on any
// machine: which memory waits, the launches a flush makes, the cap on held partial rows. Then, on a
// GPU, every gradient of small transformers (layer norms with residual biases, GELU's bias sums,
// few, split, short and long rows) has the same bits batched as launched one by one, also summed
// over two passes, through a weight made by an op, with hooks that read gradients, with more sums
// than one launch takes, and after a backward that fails partway; gradient-ready hooks (DDP's)
// leave the sums waiting; and waiting never raises the peak memory. Allocations are poisoned (NaN), so a read that ran before its sum shows.
#include "tandem/core/column_sum_batch.h"
#include "support/test_util.h"
#include "tandem/autograd/node.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

// --- The batch on its own (no GPU needed) ---------------------------------------------------

// What the fake launchers saw: one entry per launch, the sums' outputs in order.
std::vector<std::vector<void*>> launches;
void record_launch(const std::vector<ColumnSumBatch::Sum>& sums, int, void*) {
  std::vector<void*> outs;
  for (const auto& s : sums) outs.push_back(s.out);
  launches.push_back(outs);
}
void record_other_launch(const std::vector<ColumnSumBatch::Sum>& sums, int device, void* stream) {
  record_launch(sums, device, stream);
}

ColumnSumBatch::Sum sum_into(const Tensor& out, const Tensor& partial) {
  ColumnSumBatch::Sum s;
  s.partial = partial.data_ptr();
  s.out = out.data_ptr();
  s.parts = partial.shape()[0];
  s.d = out.numel();
  s.out_bytes = out.nbytes();
  return s;
}

TEST(ColumnSumBatch, KnowsWhichMemoryWaitsAndLaunchesEachGroupOnce) {
  launches.clear();
  Tensor buffer = zeros({64}, DType::f32);  // outputs are views of one buffer: ranges, not tensors
  Tensor a = views::narrow(buffer, 0, 8, 8), b = views::narrow(buffer, 0, 32, 8);
  Tensor partial = zeros({4, 8}, DType::f32);
  ColumnSumBatch batch;
  EXPECT_TRUE(batch.empty());
  batch.add(record_launch, 0, nullptr, sum_into(a, partial), partial);
  batch.add(record_other_launch, 0, nullptr, sum_into(b, partial), partial);
  batch.add(record_launch, 1, nullptr, sum_into(b, partial), partial);  // another device: its own group
  EXPECT_FALSE(batch.empty());
  EXPECT_TRUE(batch.waits_for(a));
  EXPECT_TRUE(batch.waits_for(views::narrow(a, 0, 7, 1)));  // inside an output: its storage is the buffer's
  EXPECT_TRUE(batch.waits_for(buffer));                     // overlaps both
  EXPECT_FALSE(batch.waits_for(zeros({8}, DType::f32)));    // other memory
  EXPECT_FALSE(batch.waits_for(Tensor()));
  batch.flush();
  EXPECT_TRUE(batch.empty());
  EXPECT_FALSE(batch.waits_for(a));
  ASSERT_EQ(launches.size(), 3u);
  EXPECT_EQ(launches[0], std::vector<void*>{a.data_ptr()});
  EXPECT_EQ(launches[1], std::vector<void*>{b.data_ptr()});
  EXPECT_EQ(launches[2], std::vector<void*>{b.data_ptr()});
  const uint64_t flushes = column_sum_batch_flushes();
  batch.flush();  // nothing waits: no launch
  EXPECT_EQ(launches.size(), 3u);
  EXPECT_EQ(column_sum_batch_flushes(), flushes);
}

TEST(ColumnSumBatch, SumsOfOneGroupGoInOneLaunchInOrder) {
  launches.clear();
  std::vector<Tensor> outs;
  Tensor partial = zeros({2, 4}, DType::f32);
  ColumnSumBatch batch;
  for (int i = 0; i < 5; ++i) {
    outs.push_back(zeros({4}, DType::f32));
    batch.add(record_launch, 0, nullptr, sum_into(outs.back(), partial), partial);
  }
  batch.flush_for(zeros({4}, DType::f32));  // does not wait: nothing launches
  EXPECT_TRUE(launches.empty());
  batch.flush_for(outs[3]);
  ASSERT_EQ(launches.size(), 1u);
  ASSERT_EQ(launches[0].size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(launches[0][i], outs[i].data_ptr());
}

TEST(ColumnSumBatch, LaunchesOnceItHoldsMoreThanItsCap) {
  launches.clear();
  const int64_t floats = static_cast<int64_t>(ColumnSumBatch::kMaxHeldBytes / 4 / 2);  // half the cap each
  Tensor out = zeros({1}, DType::f32);
  ColumnSumBatch batch;
  Tensor first = empty({floats, 1}, DType::f32);
  batch.add(record_launch, 0, nullptr, sum_into(out, first), first);
  EXPECT_TRUE(launches.empty());
  Tensor second = empty({floats + 1, 1}, DType::f32);
  batch.add(record_launch, 0, nullptr, sum_into(out, second), second);
  ASSERT_EQ(launches.size(), 1u);  // past the cap: both launched
  EXPECT_EQ(launches[0].size(), 2u);
  EXPECT_TRUE(batch.empty());
}

TEST(ColumnSumBatch, IsCurrentOnlyInsideItsScope) {
  EXPECT_EQ(current_column_sum_batch(), nullptr);
  ColumnSumBatch outer, inner;
  {
    ColumnSumBatchScope a(&outer);
    EXPECT_EQ(current_column_sum_batch(), &outer);
    {
      ColumnSumBatchScope b(&inner);
      EXPECT_EQ(current_column_sum_batch(), &inner);
      ColumnSumBatchScope none(nullptr);
      EXPECT_EQ(current_column_sum_batch(), nullptr);
    }
    EXPECT_EQ(current_column_sum_batch(), &outer);
  }
  EXPECT_EQ(current_column_sum_batch(), nullptr);
}

// --- Backward on a GPU ----------------------------------------------------------------------

const Device kGpu("cuda");

// Poisoned allocations and batching as asked, restored after.
class BatchMode {
 public:
  explicit BatchMode(bool on) : was_(column_sums_batched()) { set_column_sums_batched(on); }
  ~BatchMode() { set_column_sums_batched(was_); }

 private:
  bool was_;
  testing::PoisonedAllocations poisoned_;  // for the mode's scope
};

using testing::bits_match;

Tensor gpu_leaf(const Shape& shape, double scale, DType dtype) {
  return to(testing::random_uniform(shape, -scale, scale, TensorOptions(DType::f32, kGpu)), dtype).requires_grad_();
}

// `layers` pre-norm blocks as GPT-2 has them: the residual adds fused into the next layer norm with
// the projections' biases (layer norm sums them), the MLP's first bias summed by GELU's backward,
// and before it a layer without an activation (as attention's QKV projection), its bias summed
// from its gradient as it is.
struct SmallTransformer {
  int64_t rows, C, H;
  Tensor x0;
  std::vector<Tensor> params;  // per layer: ln_w, ln_b, fc_w, fc_b, proj_w, proj_b, mix_w, mix_b; then ln_f_w, ln_f_b

  SmallTransformer(int64_t rows_, int64_t C_, int layers, DType dtype) : rows(rows_), C(C_), H(4 * C_) {
    x0 = to(testing::random_uniform({rows, C}, -1.0, 1.0, TensorOptions(DType::f32, kGpu)), dtype);
    for (int l = 0; l < layers; ++l) {
      for (Tensor p : {gpu_leaf({C}, 1.0, dtype), gpu_leaf({C}, 0.2, dtype), gpu_leaf({H, C}, 0.1, dtype),
                       gpu_leaf({H}, 0.2, dtype), gpu_leaf({C, H}, 0.05, dtype), gpu_leaf({C}, 0.2, dtype),
                       gpu_leaf({C, C}, 0.1, dtype), gpu_leaf({C}, 0.2, dtype)})
        params.push_back(p);
    }
    params.push_back(gpu_leaf({C}, 1.0, dtype));
    params.push_back(gpu_leaf({C}, 0.2, dtype));
  }
  // ln_w of layer l may be replaced (a weight made by an op).
  Tensor loss(const std::function<Tensor(const Tensor&)>& ln_weight = nullptr) const {
    const size_t layers = (params.size() - 2) / 8;
    Tensor x = x0, branch, branch_bias;  // the residual stream, and the last projection without its bias
    for (size_t l = 0; l < layers; ++l) {
      const Tensor* p = &params[8 * l];
      Tensor w = ln_weight ? ln_weight(p[0]) : p[0];
      Tensor normed;
      if (branch.defined()) {
        std::tie(x, normed) = add_layer_norm(branch, x, {C}, w, p[1], 1e-5, branch_bias);
      } else {
        normed = layer_norm(x, {C}, w, p[1]);
      }
      Tensor mixed = linear(normed, p[6], p[7]);                     // (rows, C)
      Tensor h = linear(mixed, p[2], p[3], Activation::gelu_tanh);   // (rows, H)
      branch = linear(h, p[4], Tensor());                            // (rows, C), its bias in the next norm
      branch_bias = p[5];
    }
    Tensor normed;
    std::tie(x, normed) = add_layer_norm(branch, x, {C}, params[params.size() - 2], params.back(), 1e-5, branch_bias);
    return sum(mul(to(normed, DType::f32), to(x, DType::f32)));
  }
  std::vector<Tensor> grads() const {
    std::vector<Tensor> out;
    for (const Tensor& p : params) out.push_back(kernels::clone(p.grad()));
    return out;
  }
  void zero_grad() const {
    for (const Tensor& p : params) p.set_grad(Tensor());
  }
};

void expect_same_grads(const std::vector<Tensor>& got, const std::vector<Tensor>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bits_match(got[i], expected[i])) << "parameter " << i;
}

// Runs `pass` with the sums one by one, then batched (the gradients cleared before each), and
// expects every gradient to have the same bits. Returns how many flushes the batched pass made.
uint64_t expect_batched_as_one_by_one(const SmallTransformer& model, const std::function<void()>& pass) {
  std::vector<Tensor> alone;
  {
    BatchMode mode(false);
    model.zero_grad();
    pass();
    alone = model.grads();
  }
  model.zero_grad();
  // Headroom under the peak, so that no allocation of the batched pass would set a new one (which
  // launches the waiting sums early; see WaitingSumsNeverRaiseThePeak): the pass runs as the first
  // did, beside the copies of its gradients, with partial rows waiting.
  const int device = kGpu.index;
  size_t headroom = size_t{64} << 20;
  for (const Tensor& g : alone) headroom += g.nbytes();
  empty({static_cast<int64_t>(cuda::max_memory_allocated(device) - cuda::memory_allocated(device) + headroom)},
        TensorOptions(DType::u8, kGpu));
  BatchMode mode(true);
  const uint64_t before = column_sum_batch_flushes();
  pass();
  const uint64_t flushes = column_sum_batch_flushes() - before;
  expect_same_grads(model.grads(), alone);
  return flushes;
}

// Each of layer norm's backward kernels: 96 rows of 256 (few rows), 1024 of 768 and 333 of 1040
// (rows split over warps), 4096 of 256 (short rows), 2200 of 1040 (one warp a row).
TEST(ColumnSumBatchBackward, GradientsHaveTheSameBitsBatchedAsOneByOne) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (auto [rows, C] :
         std::vector<std::pair<int64_t, int64_t>>{{96, 256}, {1024, 768}, {333, 1040}, {4096, 256}, {2200, 1040}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << rows << " rows of " << C);
      SmallTransformer model(rows, C, 2, dtype);
      const uint64_t flushes = expect_batched_as_one_by_one(model, [&] { model.loss().backward(); });
      EXPECT_EQ(flushes, 1u) << "every sum in one flush, at the end";
    }
  }
}

TEST(ColumnSumBatchBackward, GradientsAccumulateOverTwoPassesAsOneByOne) {
  TANDEM_REQUIRE_CUDA();
  SmallTransformer model(1024, 256, 2, DType::bf16);
  expect_batched_as_one_by_one(model, [&] {
    model.loss().backward();
    model.loss().backward();  // .grad defined: the sums launch before it is added into
  });
}

// Layer norm's weight made by an op from each leaf: the op's backward reads the weight's gradient,
// so its sum launches first.
TEST(ColumnSumBatchBackward, AWeightMadeByAnOpWaitsForItsSum) {
  TANDEM_REQUIRE_CUDA();
  SmallTransformer model(1024, 256, 2, DType::bf16);
  expect_batched_as_one_by_one(model, [&] { model.loss([](const Tensor& w) { return mul(w, 1.5); }).backward(); });
}

// A hook on one parameter (as DDP registers on all) that copies every parameter's gradient there
// is: each copy equals the gradient as it ends up.
TEST(ColumnSumBatchBackward, HooksSeeFinishedGradients) {
  TANDEM_REQUIRE_CUDA();
  BatchMode mode(true);
  SmallTransformer model(1024, 256, 2, DType::bf16);
  std::vector<Tensor> seen(model.params.size());
  Tensor hooked = model.params[2];  // the first layer's fc weight: its gradient comes late
  hooked.register_post_accumulate_grad_hook([&](const Tensor&) {
    for (size_t i = 0; i < model.params.size(); ++i) {
      if (model.params[i].grad().defined()) seen[i] = kernels::clone(model.params[i].grad());
    }
  });
  model.loss().backward();
  size_t checked = 0;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i].defined()) continue;
    EXPECT_TRUE(bits_match(seen[i], model.params[i].grad())) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 6u);  // the second layer's and the final norm's gradients came before the hook
}

// Gradient-ready hooks on every parameter, as DDP registers them: they leave the sums waiting (no
// more flushes than with no hook at all, where hooks that read flush at each gradient), and what
// one of them reads after finish_gradient_sums is the gradient as it ends up.
TEST(ColumnSumBatchBackward, GradientReadyHooksLeaveTheSumsWaiting) {
  TANDEM_REQUIRE_CUDA();
  BatchMode mode(true);
  SmallTransformer model(1024, 256, 2, DType::bf16);
  auto flushes_of_a_pass = [&] {
    model.zero_grad();
    const uint64_t before = column_sum_batch_flushes();
    model.loss().backward();
    return column_sum_batch_flushes() - before;
  };
  const uint64_t without_hooks = flushes_of_a_pass();
  std::vector<Tensor> noted;  // the gradients the hooks were handed, in order
  std::vector<Tensor> seen(model.params.size());
  for (size_t i = 0; i < model.params.size(); ++i) {
    autograd::register_gradient_ready_hook(model.params[i], [&, i](const Tensor& leaf) {
      noted.push_back(leaf.grad());
      if (i != 2) return;  // the first layer's fc weight, late in backward: read every gradient so far
      autograd::finish_gradient_sums(noted);
      for (size_t j = 0; j < model.params.size(); ++j) {
        if (model.params[j].grad().defined()) seen[j] = kernels::clone(model.params[j].grad());
      }
    });
  }
  const uint64_t with_ready_hooks = flushes_of_a_pass();
  EXPECT_EQ(noted.size(), model.params.size());
  EXPECT_LE(with_ready_hooks, without_hooks + 1);  // the one the reading hook asked for
  size_t checked = 0;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i].defined()) continue;
    EXPECT_TRUE(bits_match(seen[i], model.params[i].grad())) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 6u);  // the second layer's and the final norm's gradients came before it
  // Hooks that read at once make every waiting sum launch at each gradient: more flushes.
  SmallTransformer hooked(1024, 256, 2, DType::bf16);
  for (Tensor p : hooked.params) p.register_post_accumulate_grad_hook([](const Tensor&) {});
  hooked.zero_grad();
  const uint64_t before = column_sum_batch_flushes();
  hooked.loss().backward();
  EXPECT_GT(column_sum_batch_flushes() - before, with_ready_hooks);
}

// Few rows and wide layers, as in the MLP benchmark: the weights' gradients outweigh the
// activations, so the pass's peak comes late in backward, while partial rows wait. The sums
// launch before the allocation that would pass the peak, which stays that of one by one.
TEST(ColumnSumBatchBackward, WaitingSumsNeverRaiseThePeak) {
  TANDEM_REQUIRE_CUDA();
  const int device = kGpu.index;
  SmallTransformer model(64, 1024, 3, DType::bf16);
  auto peak_above_start = [&](bool batched) {  // bytes
    set_column_sums_batched(batched);
    model.zero_grad();
    cuda::synchronize();
    cuda::reset_peak_memory_stats(device);
    const size_t start = cuda::memory_allocated(device);
    model.loss().backward();
    return cuda::max_memory_allocated(device) - start;
  };
  const bool was = column_sums_batched();
  peak_above_start(false);  // the first pass makes the kernels' plans and caches
  const size_t alone = peak_above_start(false);
  const size_t batched = peak_above_start(true);
  set_column_sums_batched(was);
  EXPECT_LE(batched, alone);
  EXPECT_GT(alone, size_t{3} * 2 * 4096 * 1024 * 2) << "the fc and proj weights' gradients, at least";
}

// 40 layers of width 64 (short rows) make 40 * 3 + 2 (layer norm), 40 (GELU) and 40 (the layers
// without an activation) sums: more than one launch takes.
TEST(ColumnSumBatchBackward, MoreSumsThanOneLaunchTakes) {
  TANDEM_REQUIRE_CUDA();
  SmallTransformer model(1024, 64, 40, DType::bf16);
  expect_batched_as_one_by_one(model, [&] { model.loss().backward(); });
}

// A node that throws after sums were batched: the error reaches the caller, nothing launches late,
// and the next backward gives the usual gradients.
TEST(ColumnSumBatchBackward, ABackwardThatFailsPartwayLeavesTheNextOneCorrect) {
  TANDEM_REQUIRE_CUDA();
  BatchMode mode(true);
  SmallTransformer model(1024, 256, 2, DType::bf16);
  auto failing = [](const Tensor& w) {
    return autograd::record(kernels::clone(w), "fails", {w}, [](const Tensor&) -> std::vector<Tensor> {
      TANDEM_THROW(ValueError, "this node fails on purpose");
    });
  };
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { model.loss(failing).backward(); }, {"fails on purpose"}));
  cuda::synchronize();
  model.zero_grad();
  model.loss().backward();
  std::vector<Tensor> batched = model.grads();
  model.zero_grad();
  set_column_sums_batched(false);
  model.loss().backward();
  expect_same_grads(batched, model.grads());
}

}  // namespace
}  // namespace tandem
