// CUDA graphs (core/cuda_graph.h, train/graphed_step.h): a training step captured once and replayed
// gives the same bits as the same steps run eagerly (MLP, GPT-2, ResNet-18 in f32 and bf16; fp16 with
// a GradScaler skip; an lr that changes every step; dropout), and calls a capture cannot hold raise
// a GraphCaptureError naming them. GPU only: every test skips without one.
#include <cstring>
#include <functional>

#include "models/gpt2.h"
#include "models/resnet.h"
#include "support/test_util.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/core/backend.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/determinism.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"
#include "tandem/layers/layers.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/schedule.h"
#include "tandem/train/graphed_step.h"
#include "tandem/train/precision.h"

namespace tandem {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "needs a CUDA GPU"

const Device kGpu("cuda");
constexpr int kWarmup = 3;
constexpr int kReplayed = 50;  // steps after the warm-up: the first is captured, then replayed

// One workload: how to make the model (on the GPU, in the precision), step i's batch, and the loss.
struct Workload {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
  std::function<std::vector<Tensor>(int step, DType dtype)> batch;  // fresh random inputs per step
  std::function<Tensor(nn::Module&, const std::vector<Tensor>&)> loss;
};

Workload mlp_workload(bool with_dropout = false) {
  Workload w;
  w.name = with_dropout ? "mlp with dropout" : "mlp";
  w.make = [with_dropout] {
    std::vector<std::shared_ptr<nn::Module>> layers = {std::make_shared<nn::Linear>(64, 128, true, kGpu),
                                                       std::make_shared<nn::GELU>(GeluApproximate::tanh)};
    if (with_dropout) layers.push_back(std::make_shared<nn::Dropout>(0.25));
    layers.push_back(std::make_shared<nn::Linear>(128, 64, true, kGpu));
    return std::make_shared<nn::Sequential>(layers);
  };
  w.batch = [](int step, DType dtype) {
    Generator g(1000 + step);
    return std::vector<Tensor>{to(randn({32, 64}, kGpu, &g), dtype), randn({32, 64}, kGpu, &g)};  // x, target (f32)
  };
  w.loss = [](nn::Module& m, const std::vector<Tensor>& in) { return mse_loss(to(m.forward(in[0]), DType::f32), in[1]); };
  return w;
}

Workload gpt2_workload() {
  Workload w;
  w.name = "gpt2";
  w.make = [] {
    models::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 64;
    c.vocab_size = 128;
    c.block_size = 32;
    return std::make_shared<models::GPT2>(c, kGpu);
  };
  w.batch = [](int step, DType) {
    Generator g(2000 + step);
    return std::vector<Tensor>{randint(0, 128, {2, 32}, TensorOptions(DType::i64, kGpu), &g),
                               randint(0, 128, {2, 32}, TensorOptions(DType::i64, kGpu), &g)};  // ids, targets
  };
  w.loss = [](nn::Module& m, const std::vector<Tensor>& in) { return models::GPT2::loss(m.forward(in[0]), in[1]); };
  return w;
}

Workload resnet_workload() {
  Workload w;
  w.name = "resnet18";
  w.make = [] { return std::make_shared<models::ResNet18>(10, kGpu); };
  w.batch = [](int step, DType dtype) {
    Generator g(3000 + step);
    return std::vector<Tensor>{to(randn({4, 3, 32, 32}, kGpu, &g), dtype),
                               randint(0, 10, {4}, TensorOptions(DType::i64, kGpu), &g)};  // images, labels
  };
  w.loss = [](nn::Module& m, const std::vector<Tensor>& in) {
    return cross_entropy(to(m.forward(in[0]), DType::f32), in[1]);
  };
  return w;
}

struct RunOptions {
  std::string precision = "f32";
  bool schedule = false;        // an lr that changes every step
  int overflow_at = -1;         // fp16: this step's input holds an inf, so the GradScaler skips it
};

struct RunResult {
  std::vector<Tensor> params;  // on the CPU, after the last step
  std::vector<double> losses;
  double scale = 0;
};

// Trains a fresh model for kWarmup + kReplayed steps, eagerly or through a GraphedStep.
RunResult train(const Workload& w, const RunOptions& o, bool graphed) {
  manual_seed(7);
  std::shared_ptr<nn::Module> model = w.make();
  const train::PrecisionPolicy precision = train::PrecisionPolicy::parse(o.precision);
  precision.apply(*model);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  optim::AdamW opt(model->parameters(), adamw);
  optim::StepLR schedule(1, 0.95);
  std::optional<amp::GradScaler> scaler;
  if (precision.grad_scaler) scaler.emplace(kGpu);

  Tensor loss;
  auto step = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    loss = w.loss(*model, in);
    if (scaler) {
      scaler->scale(loss).backward();
      scaler->step(opt);
      scaler->update();
    } else {
      loss.backward();
      opt.step();
    }
  };
  std::vector<Tensor> statics = w.batch(0, precision.model_dtype);  // shapes and dtypes of every batch
  train::GraphedStepOptions options;
  options.warmup_steps = kWarmup;
  train::GraphedStep graph(statics, step, options);

  RunResult r;
  std::vector<Tensor> losses;
  for (int i = 0; i < kWarmup + kReplayed; ++i) {
    std::vector<Tensor> in = w.batch(i, precision.model_dtype);
    if (i == o.overflow_at) kernels::fill_(views::narrow(in[0], 0, 0, 1), INFINITY);
    if (graphed) graph.run(in);
    else step(in);
    losses.push_back(kernels::clone(loss));
    if (o.schedule) schedule.step(opt);
  }
  if (graphed) EXPECT_TRUE(graph.captured());
  for (const Tensor& p : model->parameters()) r.params.push_back(to(p, Device("cpu")));
  for (const Tensor& l : losses) r.losses.push_back(l.item());
  if (scaler) r.scale = scaler->get_scale();
  return r;
}

using testing::same_bits;

// Deterministic algorithms for the scope: eager runs are bitwise reproducible only with them (cuDNN's
// and the embedding gradient's atomics otherwise), and a replay is compared with an eager run.
struct DeterministicScope {
  bool before = are_deterministic_algorithms_enabled();
  DeterministicScope() { use_deterministic_algorithms(true); }
  ~DeterministicScope() { use_deterministic_algorithms(before); }
};

void expect_graph_matches_eager(const Workload& w, const RunOptions& o) {
  SCOPED_TRACE(w.name + " " + o.precision + (o.schedule ? " with a schedule" : ""));
  DeterministicScope deterministic;
  RunResult eager = train(w, o, false);
  RunResult graphed = train(w, o, true);
  ASSERT_EQ(eager.params.size(), graphed.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_TRUE(same_bits(eager.params[i], graphed.params[i])) << "parameter " << i << " differs";
  }
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&eager.losses[i], &graphed.losses[i], sizeof(double)), 0)
        << "step " << i << ": " << eager.losses[i] << " eagerly, " << graphed.losses[i] << " replayed";
  }
  EXPECT_EQ(eager.scale, graphed.scale);
  EXPECT_NE(eager.losses.front(), eager.losses.back());  // it trained
}

TEST(GraphedStep, MlpReplaysTheEagerBitsInF32AndBf16) {
  SKIP_WITHOUT_GPU();
  for (const char* p : {"f32", "bf16"}) expect_graph_matches_eager(mlp_workload(), RunOptions{p});
}

TEST(GraphedStep, Gpt2ReplaysTheEagerBitsInF32AndBf16) {
  SKIP_WITHOUT_GPU();
  for (const char* p : {"f32", "bf16"}) expect_graph_matches_eager(gpt2_workload(), RunOptions{p});
}

TEST(GraphedStep, ResNet18ReplaysTheEagerBitsInF32AndBf16) {
  SKIP_WITHOUT_GPU();
  for (const char* p : {"f32", "bf16"}) expect_graph_matches_eager(resnet_workload(), RunOptions{p});
}

// With cuda::set_gemm_kernels(cutlass) the 16-bit products run on tandem's sm_90 kernels (on an
// H100/H200 in a build with CUTLASS; elsewhere on cuBLASLt, and the test checks that path again).
// Those launch as dependent launches and take their operands' TMA descriptors as parameters, which
// the capture keeps: every replay must still give the eager bits.
TEST(GraphedStep, ReplaysTheEagerBitsOnTandemsSm90Products) {
  SKIP_WITHOUT_GPU();
  struct CutlassScope {
    cuda::GemmKernels before = cuda::gemm_kernels();
    CutlassScope() { cuda::set_gemm_kernels(cuda::GemmKernels::cutlass); }
    ~CutlassScope() { cuda::set_gemm_kernels(before); }
  } cutlass;
  expect_graph_matches_eager(mlp_workload(), RunOptions{"bf16"});
  expect_graph_matches_eager(gpt2_workload(), RunOptions{"bf16"});
}

TEST(GraphedStep, Fp16GradScalerSkipsTheOverflowingStepInsideTheGraph) {
  SKIP_WITHOUT_GPU();
  RunOptions o;
  o.precision = "fp16";
  o.overflow_at = kWarmup + 10;  // a replayed step
  expect_graph_matches_eager(mlp_workload(), o);
  RunResult r = train(mlp_workload(), o, true);
  EXPECT_EQ(r.scale, 65536.0 / 2);  // backed off once, never grown (growth interval 2000)
  EXPECT_FALSE(std::isfinite(r.losses[o.overflow_at]));
}

TEST(GraphedStep, AnLrThatChangesEveryStepNeedsNoRecapture) {
  SKIP_WITHOUT_GPU();
  RunOptions o;
  o.schedule = true;
  expect_graph_matches_eager(mlp_workload(), o);
  expect_graph_matches_eager(gpt2_workload(), RunOptions{"bf16", true});
}

TEST(GraphedStep, DropoutDrawsNewNumbersEveryReplay) {
  SKIP_WITHOUT_GPU();
  expect_graph_matches_eager(mlp_workload(true), RunOptions{});
  // And the generator ends where the eager run leaves it.
  manual_seed(11);
  Workload w = mlp_workload(true);
  (void)train(w, RunOptions{}, true);
  const uint64_t after_graph = default_generator().offset();
  (void)train(w, RunOptions{}, false);
  EXPECT_EQ(default_generator().offset(), after_graph);
}

TEST(GraphedStep, AnotherShapeIsAClearErrorAndRunsEagerly) {
  SKIP_WITHOUT_GPU();
  Tensor w = randn({8, 8}, kGpu).requires_grad_();
  Tensor out;
  train::GraphedStep step({randn({4, 8}, kGpu)}, [&](const std::vector<Tensor>& in) { out = matmul(in[0], w).sum(); },
                         train::GraphedStepOptions{1});
  step.run({randn({4, 8}, kGpu)});
  step.run({randn({4, 8}, kGpu)});  // captured and replayed
  ASSERT_TRUE(step.captured());
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { step.run({randn({3, 8}, kGpu)}); },
                                               {"input 0 has shape [3, 8] but the captured step takes [4, 8]"}));
  EXPECT_FALSE(step.fits({randn({3, 8}, kGpu)}));
  step.run_eagerly({randn({3, 8}, kGpu)});
  EXPECT_EQ(step.steps(), 3);
}

TEST(GraphedStep, CpuInputsAreAClearError) {
  EXPECT_TRUE(testing::throws_with<DeviceError>(
      [] { train::GraphedStep step({randn({2})}, [](const std::vector<Tensor>&) {}); },
      {"CUDA graphs capture GPU work, but static input 0 is on cpu"}));
}

// Captures `body` into a fresh graph and expects a GraphCaptureError whose message has `needle`;
// then a capture of plain GPU work still works (the failed one left nothing behind).
void expect_uncapturable(const std::function<void()>& body, const std::string& needle) {
  SCOPED_TRACE(needle);
  Tensor x = randn({16}, kGpu);
  (void)kernels::unary(UnaryOp::exp, x);  // warm
  cuda::Graph graph;
  EXPECT_TRUE(testing::throws_with<GraphCaptureError>(
      [&] {
        cuda::GraphCapture capture(graph, 0);
        body();
        capture.end();
      },
      {needle}));
  EXPECT_FALSE(cuda::is_capturing());
  cuda::Graph ok;
  Tensor y;
  {
    cuda::GraphCapture capture(ok, 0);
    y = kernels::unary(UnaryOp::exp, x);
    capture.end();
  }
  ok.replay();
  EXPECT_TRUE(same_bits(to(y, Device("cpu")), to(kernels::unary(UnaryOp::exp, x), Device("cpu"))));
}

TEST(CudaGraph, UncapturableCallsAreNamed) {
  SKIP_WITHOUT_GPU();
  Tensor x = randn({16}, kGpu);
  expect_uncapturable([&] { (void)x.sum().item(); }, "item() on a cuda tensor inside a CUDA graph capture");
  expect_uncapturable([&] { (void)to(x, Device("cpu")); }, "copying a cuda tensor to the host");
  expect_uncapturable([&] { cuda::synchronize(0); }, "cuda::synchronize() inside a CUDA graph capture");
  expect_uncapturable([&] { (void)(randn({4}) + randn({4})); }, "an op on CPU tensors");
  expect_uncapturable(
      [&] {
        cuda::Event e;
        e.record(0);
        e.synchronize();
      },
      "waiting on the host for a CUDA event");
  expect_uncapturable(
      [&] {
        cuda::Graph inner;
        inner.capture_begin(0);
      },
      "captures do not nest");
}

TEST(CudaGraph, ValuesWrittenOnEachReplayAreTheOnesOfThatLaunch) {
  SKIP_WITHOUT_GPU();
  Tensor values = zeros({2}, TensorOptions(DType::f64, kGpu));  // (2,) what each replay writes
  Tensor total = zeros({2}, TensorOptions(DType::f64, kGpu));   // (2,) their sum over the replays
  (void)kernels::unary(UnaryOp::neg, total);                    // warm
  int launches = 0;
  cuda::Graph graph;
  {
    cuda::GraphCapture capture(graph, 0);
    cuda::write_on_each_replay(values.data_ptr(), 2 * sizeof(double), [&launches](void* bytes) {
      const double v[2] = {1.0 + launches, -0.5 * launches};
      std::memcpy(bytes, v, sizeof v);
      ++launches;
    });
    kernels::add_(total, values);
    capture.end();
  }
  EXPECT_EQ(launches, 0);  // nothing is asked at capture
  // The replays queue behind a few milliseconds of products, so each launch's values are set while
  // earlier replays still wait: each must write its own.
  Tensor a = randn({2048, 2048}, kGpu);
  for (int i = 0; i < 8; ++i) a = matmul(a, a) * (1.0 / 2048);
  constexpr int kReplays = 20;
  for (int i = 0; i < kReplays; ++i) graph.replay();
  std::vector<double> got = to(total, Device("cpu")).to_double_vector();
  EXPECT_EQ(launches, kReplays);
  EXPECT_EQ(got[0], kReplays + kReplays * (kReplays - 1) / 2.0);  // 1 + 2 + ... + 20
  EXPECT_EQ(got[1], -0.5 * kReplays * (kReplays - 1) / 2.0);
  EXPECT_TRUE(
      testing::throws_with<GraphCaptureError>([&] { cuda::write_on_each_replay(values.data_ptr(), 8, [](void*) {}); },
                                              {"write_on_each_replay: no CUDA graph capture is under way"}));
  {
    cuda::Graph other;
    cuda::GraphCapture capture(other, 0);
    EXPECT_TRUE(
        testing::throws_with<ValueError>([&] { cuda::write_on_each_replay(values.data_ptr(), 65, [](void*) {}); },
                                         {"write_on_each_replay: 65 bytes; a node writes 1 to 64"}));
  }
}

TEST(CudaGraph, AWriteOnEachReplayWaitsForTheReadersOfTheWriteBeforeIt) {
  SKIP_WITHOUT_GPU();
  // Two writes to the same memory in one graph, each read by a large add after it: the second may
  // not land before the first add has read the first write's values.
  constexpr int64_t n = 1 << 22;
  Tensor values = zeros({1}, TensorOptions(DType::f32, kGpu));  // (1,) what each write puts there
  Tensor total = zeros({n}, TensorOptions(DType::f32, kGpu));   // (n,) the sum of what the adds read
  kernels::add_(total, values);                                 // warm
  int calls = 0;
  auto write = [&calls](float value) {
    return [value, &calls](void* bytes) {
      std::memcpy(bytes, &value, sizeof value);
      ++calls;
    };
  };
  cuda::Graph graph;
  {
    cuda::GraphCapture capture(graph, 0);
    cuda::write_on_each_replay(values.data_ptr(), sizeof(float), write(1.0f));
    kernels::add_(total, values.expand({n}));
    cuda::write_on_each_replay(values.data_ptr(), sizeof(float), write(1000.0f));
    kernels::add_(total, values.expand({n}));
    capture.end();
  }
  constexpr int kReplays = 5;
  for (int i = 0; i < kReplays; ++i) graph.replay();
  EXPECT_EQ(calls, 2 * kReplays);
  std::vector<double> got = to(total, Device("cpu")).to_double_vector();
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], 1001.0 * kReplays) << "element " << i;
}

TEST(CudaGraph, UploadsForTheGraphAreWrittenOnceAndHeldWithIt) {
  SKIP_WITHOUT_GPU();
  Tensor x = randn({16}, kGpu);
  (void)kernels::unary(UnaryOp::neg, x);  // warm
  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  cuda::Graph graph;
  const void* uploaded = nullptr;
  {
    cuda::GraphCapture capture(graph, 0);
    uploaded = cuda::upload_for_graph(host.data(), host.size() * sizeof(float), 0);
    host[0] = 99.0f;  // the bytes were taken at the call
    (void)kernels::unary(UnaryOp::neg, x);
    capture.end();
  }
  EXPECT_EQ(graph.num_nodes(), 1);  // the op's kernel: no copy for the upload
  for (int i = 0; i < 3; ++i) graph.replay();
  std::vector<float> back(3);
  cuda::copy_device_to_host(back.data(), uploaded, back.size() * sizeof(float), 0);
  EXPECT_EQ(back, (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

TEST(CudaGraph, ScratchForTheGraphIsItsOwnAndOnlyInsideACapture) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(testing::throws_with<GraphCaptureError>([] { cuda::scratch_for_graph(64, 0); },
                                                      {"scratch_for_graph", "no CUDA graph capture"}));
  Tensor x = randn({16}, kGpu);
  (void)kernels::unary(UnaryOp::neg, x);  // warm
  cuda::Graph graph;
  {
    cuda::GraphCapture capture(graph, 0);
    void* first = cuda::scratch_for_graph(64, 0);
    void* second = cuda::scratch_for_graph(64, 0);
    EXPECT_NE(first, nullptr);
    EXPECT_NE(second, nullptr);
    EXPECT_NE(first, second);  // each call its own
    EXPECT_EQ(cuda::scratch_for_graph(0, 0), nullptr);
    EXPECT_EQ(cuda::scratch_for_graph(cuda::kMaxGraphScratchBytes + 1, 0), nullptr);  // the caller's pool
    EXPECT_NE(cuda::scratch_for_graph(cuda::kMaxGraphScratchBytes, 0), nullptr);
    (void)kernels::unary(UnaryOp::neg, x);
    capture.end();
  }
  EXPECT_EQ(graph.num_nodes(), 1);
  graph.replay();
}

TEST(CudaGraph, ReplaysReuseTheirPoolAndResetGivesItBack) {
  SKIP_WITHOUT_GPU();
  Tensor x = randn({1 << 20}, kGpu);  // 4 MiB
  (void)kernels::unary(UnaryOp::exp, x);
  cuda::Graph graph;
  Tensor y;
  {
    cuda::GraphCapture capture(graph, 0);
    Tensor tmp = kernels::unary(UnaryOp::exp, x);
    y = kernels::unary(UnaryOp::neg, tmp);  // tmp's block is freed during the capture and stays the graph's
    capture.end();
  }
  EXPECT_GE(graph.pool_bytes(), size_t(8) << 20);
  EXPECT_GE(graph.num_nodes(), 2);
  const size_t reserved = cuda::memory_reserved(0);
  for (int i = 0; i < 10; ++i) graph.replay();
  EXPECT_EQ(cuda::memory_reserved(0), reserved);  // replays allocate nothing
  EXPECT_EQ(graph.replays(), 10);
  Tensor expected = kernels::unary(UnaryOp::neg, kernels::unary(UnaryOp::exp, x));
  EXPECT_TRUE(same_bits(to(y, Device("cpu")), to(expected, Device("cpu"))));
  kernels::copy_(x, randn({1 << 20}, kGpu));  // a static input changes: the next replay sees it
  graph.replay();
  expected = kernels::unary(UnaryOp::neg, kernels::unary(UnaryOp::exp, x));
  EXPECT_TRUE(same_bits(to(y, Device("cpu")), to(expected, Device("cpu"))));
  graph.reset();
  EXPECT_EQ(graph.pool_bytes(), 0u);
  EXPECT_FALSE(graph.captured());
}

}  // namespace
}  // namespace tandem
