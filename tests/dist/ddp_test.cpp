// DistributedDataParallel and DistributedSampler under mpirun -np 2 (CPU/MPI everywhere; the
// same tests run on GPUs with NCCL where there are two).
#include <algorithm>
#include <limits>
#include <set>

#include "dist/dist_test_util.h"
#include "support/test_util.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/determinism.h"
#include "tandem/dist/ddp.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/optimizer.h"
#include "tandem/train/graphed_step.h"

namespace tandem {
namespace {

using dist::DistributedDataParallel;

// This rank's GPU when it has an NCCL group, else the CPU (no GPU, or more ranks than GPUs on the
// node, as with mpirun -np 2 on one GPU: then DDP runs over MPI).
Device test_device() { return dist::world().gpu_group ? dist::world().device : Device("cpu"); }

// These tests describe two ranks; the np 1 runs of the suite skip them.
#define REQUIRE_TWO_RANKS()                                                              \
  do {                                                                                   \
    if (dist::world().size != 2) GTEST_SKIP() << "needs mpirun -np 2";                   \
  } while (0)

std::shared_ptr<nn::Sequential> make_mlp(TensorOptions o) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 32, true, o), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(32, 32, true, o), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(32, 5, true, o)});
}

std::shared_ptr<nn::Sequential> make_cnn(TensorOptions o) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(1, 4, 3, nn::Conv2dOptions{1, 1}, o), std::make_shared<nn::BatchNorm2d>(4, 1e-5, 0.1, o),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(4 * 4 * 4, 5, true, o)});
}

// A CNN over three-channel images with its convolution weights channels-last: DDP's bucket views
// of their gradients keep that layout.
std::shared_ptr<nn::Sequential> make_channels_last_cnn(TensorOptions o) {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 4, 3, nn::Conv2dOptions{1, 1}, o),
      std::make_shared<nn::BatchNorm2d>(4, 1e-5, 0.1, o), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(4, 4, 3, nn::Conv2dOptions{2, 1}, o),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4 * 4 * 4, 5, true, o)});
  net->to(MemoryFormat::channels_last);
  return net;
}

// Copies every parameter and buffer of `from` into `to` (same architecture).
void copy_model(nn::Module& from, nn::Module& to) {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : from.state_dict()) state[name] = t;
  to.load_state_dict(state);
}

// Two ranks with local batch B against one process with global batch 2B: after 5 SGD steps the
// parameters agree. With batch norm, DDP normalises each rank's half with that half's statistics
// (no SyncBatchNorm), so the single-process reference runs the two halves as two forward passes
// and averages their gradients: the same global batch, the same arithmetic.
void check_equivalence(const std::function<std::shared_ptr<nn::Sequential>(TensorOptions)>& make, const Shape& input,
                       bool halves_in_reference) {
  const dist::World& w = dist::world();
  TensorOptions o(DType::f32, test_device());
  manual_seed(1234);
  auto model = make(o);
  auto reference = make(o);
  copy_model(*model, *reference);
  DistributedDataParallel ddp(model, {0.001, 0.0005});  // tiny buckets: several of them
  const int64_t b = input[0];
  Shape global = input;
  global[0] = 2 * b;
  optim::SGD opt(model->parameters(), {0.05, 0.9});
  optim::SGD ref_opt(reference->parameters(), {0.05, 0.9});
  for (int step = 0; step < 5; ++step) {
    Generator gen(100 + step);  // the same global batch on every rank
    Tensor x = to(randn(global, DType::f32, &gen), test_device());
    Tensor y = to(randint(0, 5, {2 * b}, DType::i64, &gen), test_device());
    Tensor local_x = narrow(x, 0, w.rank * b, b), local_y = narrow(y, 0, w.rank * b, b);
    opt.zero_grad();
    cross_entropy(ddp(contiguous(local_x)), contiguous(local_y)).backward();
    opt.step();

    ref_opt.zero_grad();
    if (halves_in_reference) {
      for (int half = 0; half < 2; ++half) {
        Tensor loss = cross_entropy((*reference)(contiguous(narrow(x, 0, half * b, b))), contiguous(narrow(y, 0, half * b, b)));
        mul(loss, 0.5).backward();
      }
    } else {
      cross_entropy((*reference)(x), y).backward();
    }
    ref_opt.step();
  }
  auto got = model->named_parameters(), expected = reference->named_parameters();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(testing::all_close(got[i].second, expected[i].second, 1e-5, 1e-6)) << got[i].first;
  }
}

TEST(Ddp, TwoRanksEqualOneProcessWithTheGlobalBatchMlp) {
  REQUIRE_TWO_RANKS();
  check_equivalence(make_mlp, {8, 12}, false);
}
TEST(Ddp, TwoRanksEqualOneProcessWithTheGlobalBatchCnn) {
  REQUIRE_TWO_RANKS();
  check_equivalence(make_cnn, {6, 1, 8, 8}, true);
}

TEST(Ddp, TwoRanksEqualOneProcessWithTheGlobalBatchChannelsLastCnn) {
  REQUIRE_TWO_RANKS();
  check_equivalence(make_channels_last_cnn, {6, 3, 8, 8}, true);
  // The layout survives DDP: weights and their bucket-view gradients are still channels-last.
  TensorOptions o(DType::f32, test_device());
  manual_seed(7);
  auto model = make_channels_last_cnn(o);
  DistributedDataParallel ddp(model, {0.001, 0.0005});
  cross_entropy(ddp(randn({6, 3, 8, 8}, o)), zeros({6}, TensorOptions(DType::i64, o.device))).backward();
  for (const auto& [name, p] : model->named_parameters()) {
    if (p.dim() != 4) continue;
    EXPECT_TRUE(p.is_contiguous(MemoryFormat::channels_last)) << name;
    EXPECT_TRUE(p.grad().is_contiguous(MemoryFormat::channels_last)) << name;
  }
}

TEST(Ddp, ConstructionBroadcastsRankZerosParameters) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(1000 + w.rank);  // deliberately different initialisations
  auto model = make_mlp(TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model);
  for (const Tensor& p : model->parameters()) {
    Tensor gathered = empty({w.size * p.numel()}, p.options());
    w.group_for(p.device()).all_gather(gathered, contiguous(reshape(p, {-1})))->synchronize();
    EXPECT_TRUE(testing::all_close(narrow(gathered, 0, 0, p.numel()), narrow(gathered, 0, p.numel(), p.numel()), 0, 0));
  }
}

// Batch-norm statistics drift apart in training (each rank sees its own batch); every forward
// starts from rank 0's, broadcast as one flat tensor per dtype that the module's buffers now view.
TEST(Ddp, EveryForwardStartsFromRankZerosBuffers) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(77);
  auto model = make_cnn(TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model);
  auto gather_buffers = [&] {
    std::vector<Tensor> gathered;
    for (const Tensor& b : model->buffers()) {
      Tensor all = empty({w.size * b.numel()}, b.options());
      w.group_for(b.device()).all_gather(all, contiguous(reshape(b, {-1})))->synchronize();
      gathered.push_back(to(all, Device("cpu")));
    }
    return gathered;
  };
  Generator gen(500 + w.rank);  // a different batch on each rank
  ddp(to(randn({4, 1, 8, 8}, DType::f32, &gen), test_device()));
  std::vector<Tensor> after_training = gather_buffers();
  const Tensor& mean = after_training[0];  // running_mean (4,) of both ranks
  EXPECT_FALSE(testing::all_close(narrow(mean, 0, 0, 4), narrow(mean, 0, 4, 4), 0, 0)) << "ranks should differ now";

  model->eval();  // the evaluation forward leaves the statistics as the broadcast made them
  ddp(to(randn({4, 1, 8, 8}, DType::f32, &gen), test_device()));
  std::vector<Tensor> after_broadcast = gather_buffers();
  for (size_t i = 0; i < after_broadcast.size(); ++i) {
    int64_t n = after_broadcast[i].numel() / w.size;
    Tensor rank0_before = narrow(after_training[i], 0, 0, n);
    EXPECT_TRUE(testing::all_close(narrow(after_broadcast[i], 0, 0, n), rank0_before, 0, 0)) << "buffer " << i;
    EXPECT_TRUE(testing::all_close(narrow(after_broadcast[i], 0, n, n), rank0_before, 0, 0)) << "buffer " << i;
  }
  // A buffer given new storage since (as moving a module does) is coalesced again before the next
  // broadcast: each rank's own value here is replaced by rank 0's.
  Tensor running_mean = model->buffers()[0];
  running_mean.set_data(full(running_mean.shape(), 10.0 + w.rank, running_mean.options()));
  ddp(to(randn({4, 1, 8, 8}, DType::f32, &gen), test_device()));
  Tensor mean_everywhere = gather_buffers()[0];  // (2 * 4,)
  EXPECT_TRUE(testing::all_close(mean_everywhere, std::vector<double>(8, 10.0), 0, 0));
}

// A bf16 CNN keeps its batch-norm parameters in f32: the dtypes interleave in registration order.
// Each dtype fills its own buckets, so large caps give one bucket per dtype, not one per switch.
TEST(Ddp, InterleavedDtypesShareOneBucketPerDtype) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(5);
  auto model = make_cnn(TensorOptions(DType::f32, test_device()));
  model->to(DType::bf16);
  DistributedDataParallel ddp(model, {25.0, 25.0});
  ASSERT_EQ(ddp.bucket_plan().size(), 2u);
  for (const auto& bucket : ddp.bucket_plan()) {
    for (int64_t i : bucket) EXPECT_EQ(model->parameters()[i].dtype(), model->parameters()[bucket[0]].dtype());
  }
  Generator gen(900 + w.rank);
  Tensor x = to(randn({4, 1, 8, 8}, DType::bf16, &gen), test_device());
  Tensor y = to(randint(0, 5, {4}, DType::i64, &gen), test_device());
  cross_entropy(ddp(x), y).backward();
  for (const Tensor& p : model->parameters()) {  // every rank holds the same averaged gradient
    Tensor g = contiguous(reshape(p.grad(), {-1}));
    Tensor all = empty({w.size * g.numel()}, g.options());
    w.group_for(g.device()).all_gather(all, g)->synchronize();
    EXPECT_TRUE(testing::all_close(narrow(all, 0, 0, g.numel()), narrow(all, 0, g.numel(), g.numel()), 0, 0));
  }
}

// overlap_optimizer leaves the last bucket in flight after backward (on GPUs) and ddp.step()
// updates the other parameters meanwhile: the parameters come out exactly as with a plain step.
TEST(Ddp, OverlappingTheOptimizerWithTheLastBucketChangesNothing) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  TensorOptions o(DType::f32, test_device());
  manual_seed(31);
  auto plain_model = make_mlp(o);
  auto overlapped_model = make_mlp(o);
  copy_model(*plain_model, *overlapped_model);
  dist::DdpOptions overlapped_options{0.002, 0.001};
  overlapped_options.overlap_optimizer = true;
  DistributedDataParallel plain(plain_model, {0.002, 0.001}), overlapped(overlapped_model, overlapped_options);
  optim::AdamW plain_opt(plain_model->parameters(), {1e-2}), overlapped_opt(overlapped_model->parameters(), {1e-2});
  for (int step = 0; step < 3; ++step) {
    Generator gen(300 + 10 * step + w.rank);
    Tensor x = to(randn({6, 12}, DType::f32, &gen), test_device());
    for (auto [ddp, opt] : {std::pair{&plain, &plain_opt}, std::pair{&overlapped, &overlapped_opt}}) {
      opt->zero_grad();
      sum((*ddp)(x)).backward();
      ddp->step(*opt);
    }
  }
  auto a = plain_model->parameters(), b = overlapped_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(testing::all_close(b[i], a[i], 0, 0)) << "parameter " << i;
  EXPECT_GT(overlapped.stats().bytes, 0);
}

// A DDP step captured as one CUDA graph (its bucket all-reduces on the communication stream, the
// waits for them edges of the graph) and replayed gives the bits of the same steps run eagerly,
// with overlap_optimizer and without. GPUs with NCCL only (any world size); skips on the CPU.
TEST(Ddp, CapturedStepReplaysTheEagerBits) {
  const dist::World& w = dist::world();
  if (!w.gpu_group) GTEST_SKIP() << "needs a GPU per rank with NCCL";
  const bool deterministic_before = are_deterministic_algorithms_enabled();
  use_deterministic_algorithms(true);  // eager runs are bitwise reproducible only so
  constexpr int kWarmup = 3, kSteps = 20;
  for (bool overlap_optimizer : {false, true}) {
    SCOPED_TRACE(overlap_optimizer ? "overlap_optimizer" : "plain step");
    std::vector<std::vector<Tensor>> params;  // per run: the parameters after the last step, on the CPU
    std::vector<std::vector<double>> losses;  // per run: every step's loss
    for (bool graphed : {false, true}) {
      TensorOptions o(DType::f32, test_device());
      manual_seed(41);
      auto model = make_mlp(o);
      dist::DdpOptions options{0.002, 0.001};  // tiny buckets: several of them
      options.overlap_optimizer = overlap_optimizer;
      DistributedDataParallel ddp(model, options);
      optim::AdamW opt(model->parameters(), {1e-2});
      Tensor loss;
      auto step = [&](const std::vector<Tensor>& in) {
        opt.zero_grad();
        loss = cross_entropy(ddp(in[0]), in[1]);
        loss.backward();
        ddp.step(opt);
      };
      auto batch = [&](int i) {
        Generator gen(500 + 10 * i + w.rank);  // each rank's own batch
        return std::vector<Tensor>{to(randn({8, 12}, DType::f32, &gen), test_device()),
                                   to(randint(0, 5, {8}, DType::i64, &gen), test_device())};
      };
      train::GraphedStepOptions graph_options;
      graph_options.warmup_steps = kWarmup;
      train::GraphedStep graph(batch(0), step, graph_options);
      std::vector<Tensor> step_losses;
      for (int i = 0; i < kWarmup + kSteps; ++i) {
        if (graphed) graph.run(batch(i));
        else step(batch(i));
        step_losses.push_back(kernels::clone(loss));
      }
      EXPECT_EQ(graph.captured(), graphed);
      params.emplace_back();
      for (const Tensor& p : model->parameters()) params.back().push_back(to(p, Device("cpu")));
      losses.emplace_back();
      for (const Tensor& l : step_losses) losses.back().push_back(l.item());
    }
    for (size_t i = 0; i < params[0].size(); ++i) {
      EXPECT_TRUE(testing::all_close(params[1][i], params[0][i], 0, 0)) << "parameter " << i;
    }
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_EQ(losses[1][i], losses[0][i]) << "step " << i << ": eagerly " << losses[0][i] << ", replayed "
                                            << losses[1][i];
    }
    EXPECT_NE(losses[0].front(), losses[0].back());  // it trained
  }
  use_deterministic_algorithms(deterministic_before);
}

// With weight gradients beside backward (autograd/side_stream.h) DDP's hooks run once each item is
// joined and its buckets' all-reduces wait for the side stream: eager steps and replayed ones give
// the bits of steps without it. GPUs with NCCL only (any world size); skips on the CPU.
TEST(Ddp, WeightGradientsBesideGiveTheSameBitsEagerAndReplayed) {
  const dist::World& w = dist::world();
  if (!w.gpu_group) GTEST_SKIP() << "needs a GPU per rank with NCCL";
  const bool deterministic_before = are_deterministic_algorithms_enabled();
  const bool beside_before = autograd::weight_gradients_beside();
  use_deterministic_algorithms(true);
  constexpr int kWarmup = 3, kSteps = 10;
  struct Run {
    bool beside, graphed;
  };
  std::vector<std::vector<Tensor>> params;  // per run: the parameters after the last step, on the CPU
  for (Run run : {Run{false, false}, Run{true, false}, Run{true, true}}) {
    SCOPED_TRACE(::testing::Message() << (run.beside ? "beside" : "one stream") << (run.graphed ? ", replayed" : ""));
    autograd::set_weight_gradients_beside(run.beside);
    TensorOptions o(DType::bf16, test_device());
    manual_seed(43);
    auto model = std::make_shared<nn::Sequential>(
        std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Linear>(64, 256, Activation::gelu_tanh, true, o),
                                                 std::make_shared<nn::Linear>(256, 256, Activation::gelu_tanh, true, o),
                                                 std::make_shared<nn::Linear>(256, 8, true, o)});
    DistributedDataParallel ddp(model, dist::DdpOptions{0.05, 0.02});  // buckets of a few layers
    optim::AdamW opt(model->parameters(), {1e-2});
    auto step = [&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      cross_entropy(to(ddp(in[0]), DType::f32), in[1]).backward();
      ddp.step(opt);
    };
    auto batch = [&](int i) {
      Generator gen(700 + 10 * i + w.rank);  // each rank's own batch
      return std::vector<Tensor>{to(to(randn({128, 64}, DType::f32, &gen), DType::bf16), test_device()),
                                 to(randint(0, 8, {128}, DType::i64, &gen), test_device())};
    };
    train::GraphedStepOptions graph_options;
    graph_options.warmup_steps = kWarmup;
    train::GraphedStep graph(batch(0), step, graph_options);
    for (int i = 0; i < kWarmup + kSteps; ++i) {
      if (run.graphed)
        graph.run(batch(i));
      else
        step(batch(i));
    }
    params.emplace_back();
    for (const Tensor& p : model->parameters()) params.back().push_back(to(p, Device("cpu")));
  }
  for (size_t r = 1; r < params.size(); ++r) {
    for (size_t i = 0; i < params[0].size(); ++i) {
      EXPECT_TRUE(testing::all_close(params[r][i], params[0][i], 0, 0)) << "run " << r << ", parameter " << i;
    }
  }
  autograd::set_weight_gradients_beside(beside_before);
  use_deterministic_algorithms(deterministic_before);
}

TEST(Ddp, FirstBucketIsLaunchedBeforeTheLastGradientExists) {
  REQUIRE_TWO_RANKS();
  manual_seed(7);
  auto model = make_mlp(TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model, {0.002, 0.001});
  ASSERT_GE(ddp.bucket_plan().size(), 3u);
  // The first bucket holds the last layer's parameters.
  EXPECT_EQ(ddp.bucket_plan()[0][0], static_cast<int64_t>(model->parameters().size()) - 1);
  Tensor x = to(testing::random_tensor({4, 12}, DType::f32), test_device());
  sum(ddp(x)).backward();
  const dist::DdpStats& s = ddp.stats();
  EXPECT_EQ(s.buckets, static_cast<int64_t>(ddp.bucket_plan().size()));
  EXPECT_LT(s.launched_after_gradients[0], s.total_gradients);
  EXPECT_GT(s.bytes, 0);
  EXPECT_GE(s.hidden_fraction, 0.0);
}

TEST(Ddp, GradientsAreAveragedAcrossRanks) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(9);
  auto model = std::make_shared<nn::Linear>(3, 2, true, TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model);
  Tensor x = to(full({1, 3}, 1.0 + w.rank), test_device());  // rank r feeds (1 + r)
  sum(ddp(x)).backward();
  // d sum(xW^T + b) / dW = x for each row; averaged over ranks: (1 + 2) / 2.
  EXPECT_TRUE(testing::all_close(model->weight.grad(), std::vector<double>(6, 1.5), 0, 1e-6));
  EXPECT_TRUE(testing::all_close(model->bias.grad(), std::vector<double>(2, 1.0), 0, 1e-6));
}

// One rank nudges one element of one parameter after a step; the next check (at the next forward)
// names that parameter, the step, the rank and the size of the nudge, on every rank.
TEST(Ddp, ParameterThatDivergesOnOneRankIsNamedAtTheNextCheck) {
  const dist::World& w = dist::world();
  if (w.size < 2) GTEST_SKIP() << "needs two ranks or more";
  manual_seed(21);
  auto model = make_mlp(TensorOptions(DType::f32, test_device()));
  dist::DdpOptions options;
  options.check_parameters_every = 1;
  DistributedDataParallel ddp(model, options);
  optim::SGD opt(model->parameters(), {0.05, 0.9});
  Generator gen(5 + w.rank);
  Tensor x = to(randn({4, 12}, DType::f32, &gen), test_device());
  sum(ddp(x)).backward();  // step 1
  opt.step();
  sum(ddp(x)).backward();  // the check before step 2 passes: every rank applied the same update
  opt.step();
  const int perturbed_rank = w.size - 1;
  auto named = model->named_parameters();
  const std::string name = named[2].first;  // the second Linear's weight
  if (w.rank == perturbed_rank) {
    NoGradGuard no_grad;
    Tensor p = named[2].second;
    std::vector<double> values = p.to_double_vector();
    values[7] += 0.25;
    kernels::copy_(p, from_vector(values, p.shape(), TensorOptions(p.dtype(), p.device())));
  }
  opt.zero_grad();
  EXPECT_TRUE(testing::throws_with<BackendError>(
      [&] { ddp(x); }, {"parameters differ between ranks at step 2", "'" + name + "'",
                        "rank " + std::to_string(perturbed_rank) + " differs from rank 0 by up to 0.25",
                        "at element 7"}));
}

TEST(Ddp, GradientsDroppedBetweenForwardAndBackwardAreStillReduced) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(10);
  auto model = std::make_shared<nn::Linear>(3, 2, true, TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model);
  Tensor x = to(full({1, 3}, 1.0 + w.rank), test_device());
  Tensor y = ddp(x);
  model->zero_grad();  // drops the bucket views after forward
  sum(y).backward();
  EXPECT_TRUE(testing::all_close(model->weight.grad(), std::vector<double>(6, 1.5), 0, 1e-6));
  sum(ddp(x)).backward();  // and the next step accumulates into the bucket again
  EXPECT_TRUE(testing::all_close(model->weight.grad(), std::vector<double>(6, 3.0), 0, 1e-6));
}

// True when rank 0's copy of t equals this rank's, exactly.
bool same_on_every_rank(const Tensor& t) {
  Tensor mine = kernels::clone(kernels::to_device(t, Device()));
  Tensor rank0 = kernels::clone(mine);
  dist::world().cpu_group->broadcast(rank0, 0)->wait();
  return static_cast<bool>(testing::all_close(mine, rank0, 0.0, 0.0));
}

// An inf in one rank's gradients makes every rank skip that step and back off: the all-reduce
// spreads the inf to every rank's gradients before GradScaler checks them.
TEST(Ddp, GradScalerOverflowOnOneRankSkipsTheStepOnEveryRank) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  for (bool bf16_comm : {false, true}) {
    SCOPED_TRACE(bf16_comm ? "bf16 communication" : "f32 communication");
    manual_seed(21);
    auto model = std::make_shared<nn::Linear>(3, 2, true, TensorOptions(DType::f32, test_device()));
    dist::DdpOptions options;
    if (bf16_comm) options.comm_dtype = DType::bf16;
    DistributedDataParallel ddp(model, options);
    optim::AdamW adamw(model->parameters(), optim::AdamWOptions{0.01});
    amp::GradScalerOptions scaler_options;
    scaler_options.init_scale = 1024.0;
    amp::GradScaler scaler(test_device(), scaler_options);
    const std::vector<bool> overflow_on_rank0 = {false, true, false};
    for (size_t s = 0; s < overflow_on_rank0.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      Tensor x = full({2, 3}, 1.0 + w.rank, DType::f64);
      if (overflow_on_rank0[s] && w.rank == 0) x.data<double>()[4] = std::numeric_limits<double>::infinity();
      Tensor before = kernels::clone(model->weight);
      adamw.zero_grad();
      scaler.scale(sum(ddp(to(to(x, DType::f32), test_device())))).backward();
      scaler.step(adamw);
      EXPECT_EQ(scaler.found_inf(), overflow_on_rank0[s]);  // on both ranks
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), s >= 1 ? 512.0 : 1024.0);
      const bool unchanged = static_cast<bool>(testing::all_close(kernels::to_device(model->weight, Device()),
                                                                  kernels::to_device(before, Device()), 0.0, 0.0));
      EXPECT_EQ(unchanged, overflow_on_rank0[s]);
      EXPECT_TRUE(same_on_every_rank(model->weight));
      EXPECT_TRUE(same_on_every_rank(model->bias));
    }
  }
}

// Gradients travelling in bf16 arrive as the bf16 average, back in the gradients' own dtype, with
// half the bytes of f32 communication.
TEST(Ddp, Bf16CommunicationAveragesInBf16AndKeepsF32Gradients) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(22);
  auto model = std::make_shared<nn::Linear>(64, 8, true, TensorOptions(DType::f32, test_device()));
  dist::DdpOptions options;
  options.comm_dtype = DType::bf16;
  DistributedDataParallel ddp(model, options);
  const uint64_t seed = dist::testing::shared_seed();
  Tensor x = to(dist::testing::rank_input(seed, w.rank, {4, 64}, DType::f32), test_device());
  sum(ddp(x)).backward();
  EXPECT_EQ(model->weight.grad().dtype(), DType::f32);
  // One bucket: the weight's 512 elements, then the bias's 8 in a slot of its own, rounded up to
  // DDP's 256-byte slot boundary (64 f32 elements): 576 elements, in bf16 on the wire.
  EXPECT_EQ(ddp.stats().bytes, (64 * 8 + 64) * 2);
  // Expected: each rank's gradient (the column sums of its x) rounded to bf16, averaged.
  std::vector<double> expected(8 * 64, 0.0);
  for (int r = 0; r < 2; ++r) {
    Tensor xr = dist::testing::rank_input(seed, r, {4, 64}, DType::f32);
    Tensor column_sums = kernels::to_dtype(kernels::to_dtype(sum(xr, {0}), DType::bf16), DType::f64);
    std::vector<double> cs = column_sums.to_double_vector();
    for (int o = 0; o < 8; ++o) {
      for (int i = 0; i < 64; ++i) expected[o * 64 + i] += cs[i] / 2;
    }
  }
  EXPECT_TRUE(testing::all_close(kernels::to_device(model->weight.grad(), Device()), expected, 8e-3, 8e-3));
}

TEST(Ddp, NoSyncAccumulatesLocallyThenReducesTheSum) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  manual_seed(11);
  auto model = std::make_shared<nn::Linear>(3, 2, true, TensorOptions(DType::f32, test_device()));
  DistributedDataParallel ddp(model);
  Tensor x = to(full({1, 3}, 1.0 + w.rank), test_device());
  {
    auto guard = ddp.no_sync();
    sum(ddp(x)).backward();
    // Local only: rank r still sees its own (1 + r).
    EXPECT_TRUE(testing::all_close(model->weight.grad(), std::vector<double>(6, 1.0 + w.rank), 0, 1e-6));
  }
  sum(ddp(x)).backward();
  // Local sums 2 (1 + r), averaged: (2 + 4) / 2 = 3.
  EXPECT_TRUE(testing::all_close(model->weight.grad(), std::vector<double>(6, 3.0), 0, 1e-6));
}

TEST(Ddp, UnusedParameterIsAnErrorNamingItUnlessAllowed) {
  REQUIRE_TWO_RANKS();
  struct TwoHeads : nn::Module {
    explicit TwoHeads(TensorOptions o) {
      a = register_module("a", std::make_shared<nn::Linear>(3, 2, true, o));
      b = register_module("b", std::make_shared<nn::Linear>(3, 2, true, o));
    }
    Tensor forward(const Tensor& x) override { return (*a)(x); }
    std::shared_ptr<nn::Linear> a, b;
  };
  TensorOptions o(DType::f32, test_device());
  Tensor x = to(testing::random_tensor({2, 3}, DType::f32), test_device());
  {
    DistributedDataParallel ddp(std::make_shared<TwoHeads>(o));
    EXPECT_TRUE(testing::throws_with<ValueError>([&] { sum(ddp(x)).backward(); }, {"b.weight", "b.bias", "find_unused_parameters"}));
  }
  dist::DdpOptions allow;
  allow.find_unused_parameters = true;
  auto model = std::make_shared<TwoHeads>(o);
  DistributedDataParallel ddp(model, allow);
  sum(ddp(x)).backward();
  EXPECT_TRUE(testing::all_close(model->b->weight.grad(), std::vector<double>(6, 0.0)));
}

TEST(Ddp, ModelsThatDifferAcrossRanksAreAConstructionError) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  auto model = std::make_shared<nn::Linear>(3, w.rank == 0 ? 2 : 4, true, TensorOptions(DType::f32, test_device()));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { DistributedDataParallel ddp(model); },
                                               {"differs between rank", "'weight'", "same model"}));
}

TEST(Ddp, SamplerShardsDisjointlyAndUnevenDataDoesNotHang) {
  REQUIRE_TWO_RANKS();
  const dist::World& w = dist::world();
  dist::DistributedSampler sampler(7, w.rank, w.size, true, 42);
  EXPECT_EQ(sampler.num_samples(), 4);
  std::vector<int64_t> mine = sampler.indices(3);
  ASSERT_EQ(mine.size(), 4u);
  Tensor all = empty({8}, DType::i64);
  w.cpu_group->all_gather(all, from_vector(mine))->synchronize();
  std::vector<int64_t> every = all.to_vector<int64_t>();
  std::set<int64_t> distinct(every.begin(), every.end());
  EXPECT_EQ(distinct.size(), 7u);  // all 7 samples, one repeated as padding
  EXPECT_NE(sampler.indices(3), sampler.indices(4));
  // The same number of steps on every rank: one all-reduce per index completes everywhere.
  for (size_t i = 0; i < mine.size(); ++i) w.cpu_group->all_reduce(ones({1}))->synchronize();
  dist::DistributedSampler dropping(7, w.rank, w.size, true, 42, /*drop_last=*/true);
  EXPECT_EQ(dropping.indices(0).size(), 3u);
}

// Padding comes last on each rank, and num_real_samples counts the rest: 7 samples over any
// world sum to 7 real ones, the first num_real_samples of every rank's indices all distinct.
TEST(Ddp, SamplerCountsRealSamplesWithoutPadding) {
  for (int world = 1; world <= 4; ++world) {
    int64_t total = 0;
    std::set<int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      dist::DistributedSampler sampler(7, rank, world, true, 3);
      std::vector<int64_t> mine = sampler.indices(0);
      ASSERT_LE(sampler.num_real_samples(), sampler.num_samples());
      total += sampler.num_real_samples();
      seen.insert(mine.begin(), mine.begin() + sampler.num_real_samples());
    }
    EXPECT_EQ(total, 7) << "world of " << world;
    EXPECT_EQ(seen.size(), 7u) << "world of " << world;
  }
  EXPECT_EQ(dist::DistributedSampler(2, 3, 4, false).num_real_samples(), 0);  // more ranks than samples
}

}  // namespace
}  // namespace tandem
