// Training-step benchmark: the time of one full step (zero_grad, forward, loss, backward, AdamW
// step) of a benchmark workload at a given precision, on one device or, under mpirun -np N, data
// parallel with DistributedDataParallel (one GPU per rank, the batch per GPU fixed), reporting
// DDP's statistics of the last step too. bench/reference/train_step.py
// runs the same workload in PyTorch and prints the same JSON keys, so the two can be put side by
// side. Prints each step's loss, a one-line summary on stderr and the JSON as stdout's last line.
//
//   train_step --workload mlp --precision bf16
//   train_step --workload gpt2 --precision bf16        (8 sequences of 1024 tokens)
//   train_step --workload resnet18 --precision tf32    (256 images of 3x32x32)
//   train_step --workload resnet18 --precision bf16 --channels-last   (NHWC activations)
//   mpirun -np 2 train_step --workload mlp --precision bf16 --bucket-mb 25
//   mpirun -np 4 train_step --workload gpt2 --precision bf16 --zero 2     (ZeRO stage 2)
//   train_step --device cpu --batch 8 --steps 3 --warmup 1
//   train_step --workload gpt2 --precision bf16 --profile gpt2.json   (step profile for bench/scaling_model)
//   mpirun -np 4 train_step --workload gpt2 --precision bf16 --bucket-mb auto --topology h200x4
//   train_step --workload gpt2 --precision bf16 --dist-checks on    (then off: what the checks cost)
//   train_step --workload gpt2 --precision bf16 --deterministic --warmup 0   (twice: same parameter hash)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/cuda_api.h"
#include "tandem/dist/bucket_plan.h"
#include "tandem/dist/ddp.h"
#include "tandem/dist/zero.h"
#include "tandem/train/graphed_step.h"
#include "tandem/dist/timeline.h"
#include "tandem/tandem.h"
#include "parameter_hash.h"
#include "step_profile.h"
#include "step_trace.h"
#include "workloads.h"

using namespace tandem;

namespace {

struct Config {
  std::string workload = "mlp";
  std::string precision = "f32";
  std::string device = cuda::is_available() ? "cuda" : "cpu";
  int64_t batch = 0;     // per GPU; 0: the workload's default (mlp 1024, gpt2 8 sequences, resnet18 256)
  int64_t seq_len = 0;   // gpt2: tokens per sequence; 0: the context (1024)
  bool channels_last = false;  // resnet18: model and images channels-last
  int64_t warmup = 10;
  int64_t steps = 50;
  std::string json;  // also written here when set
  // Data parallel (under mpirun): DistributedDataParallel's options.
  std::string bucket_mb = "25";     // MB, or auto: planned from a profile of this step (dist/bucket_plan.h)
  std::string topology = "h200x4";  // the link model --bucket-mb auto plans for (dist/scaling_model.h)
  double first_bucket_mb = 1.0;     // the last layers' gradients, so communication starts early
  std::string comm_dtype = "same";  // same (the gradients' dtype), f32 or bf16
  bool no_overlap = false;
  bool no_overlap_optimizer = false;
  int zero = 0;       // ZeRO stage: 0 (plain DDP), 1 (sharded optimizer state), 2 (and sharded gradients)
  std::string trace;  // when set: a Chrome trace of one more step after warm-up (bench/step_trace.h)
  std::string profile;  // when set: the step profile of one more step after warm-up (bench/step_profile.h)
  // "on"/"off": train through DDP even in a world of one, with the cross-rank checks of the
  // collectives every step (on) or none (off), to measure what the checks cost. "" (default): DDP
  // only under mpirun, with its default checks.
  std::string dist_checks;
  bool cuda_graph = false;  // capture the step once as a CUDA graph after warm-up and replay it
  std::string graph_dot;    // --cuda-graph: when set, the captured graph in Graphviz DOT form (Graph::debug_dump)
  // Time the candidate algorithms of every matrix product and convolution at their first use and
  // keep the fastest (cuda::set_matmul_tuning(all), cuda::set_cudnn_benchmark); by default only the
  // large products are timed.
  bool autotune = false;
  std::string matmul_tuning = "large";  // which products time their algorithms (cuda::MatmulTuning)
  // Deterministic mode (tandem::use_deterministic_algorithms) for the whole run, and a hash of the
  // final parameters printed and written to the JSON, to compare two runs bit for bit.
  bool deterministic = false;
  // bf16: AdamW keeps each f32 master as the parameter plus a 16-bit low half (optim/optimizer.h).
  bool compact_masters = false;
  // Weight-gradient products on a second stream beside the rest of backward (autograd/side_stream.h).
  bool weight_gradients_beside = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run_benchmark(const Config& cfg) {
  // Off also means the MPI group posts collectives without exchanging their fingerprints first.
  if (cfg.dist_checks == "off") setenv("TANDEM_DIST_DEBUG", "off", 0);
  if (cfg.deterministic) use_deterministic_algorithms(true);
  if (cfg.weight_gradients_beside) autograd::set_weight_gradients_beside(true);
  cuda::set_matmul_tuning(cfg.matmul_tuning == "none"  ? cuda::MatmulTuning::none
                          : cfg.matmul_tuning == "all" ? cuda::MatmulTuning::all
                                                       : cuda::MatmulTuning::large);
  if (cfg.autotune) {
    cuda::set_matmul_tuning(cuda::MatmulTuning::all);
    cuda::set_cudnn_benchmark(true);
  }
  const dist::World& world = dist::init();
  const bool lead = world.rank == 0;
  const Device device = cfg.device == "cuda" && world.device.is_cuda() ? world.device : Device(cfg.device);
  const bool on_gpu = device.is_cuda();
  TANDEM_CHECK_AS(DeviceError, !cfg.cuda_graph || on_gpu, "--cuda-graph: CUDA graphs capture GPU work, and this run is on ",
                  device, " (drop the flag, or run on a GPU with --device cuda)");
  TANDEM_CHECK_AS(ValueError, !cfg.cuda_graph || (cfg.trace.empty() && cfg.profile.empty()),
                  "--cuda-graph records no timings inside the graph: --trace and --profile need an eager step");
  TANDEM_CHECK_AS(ValueError, cfg.graph_dot.empty() || cfg.cuda_graph,
                  "--graph-dot writes the captured step's graph: it needs --cuda-graph");
  const train::PrecisionPolicy precision = train::PrecisionPolicy::parse(cfg.precision);
  TANDEM_CHECK_AS(ValueError, !cfg.compact_masters || cfg.precision == "bf16",
                  "--compact-masters is for --precision bf16, and this run is ", cfg.precision,
                  " (fp16 keeps whole f32 masters; f32 and tf32 have none)");

  bench::WorkloadOptions spec;
  spec.name = cfg.workload;
  spec.batch = cfg.batch;
  spec.seq_len = cfg.seq_len;
  spec.channels_last = cfg.channels_last;
  const int64_t batch = spec.batch_or_default();
  manual_seed(0);
  std::shared_ptr<nn::Module> model = bench::make_model(spec, device);
  precision.apply(*model);  // model dtype and matmul mode; the optimizer keeps f32 masters itself
  manual_seed(1 + static_cast<uint64_t>(world.rank));  // each rank its own batch, drawn once
  const bench::Batch data = bench::make_batch(spec, precision.model_dtype, device);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-4;  // torch.optim.AdamW's defaults otherwise
  adamw.compact_masters = cfg.compact_masters;
  auto adamw_optimizer = std::make_unique<optim::AdamW>(model->parameters(), adamw);
  optim::Optimizer* optimizer = adamw_optimizer.get();  // the AdamW, or the ZeRO optimizer over it
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;

  dist::Timeline timeline(device);  // records only the one step traced for --trace or --profile
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<bench::GradientMarks> marks;
  if (!cfg.profile.empty() || cfg.bucket_mb == "auto") marks = std::make_unique<bench::GradientMarks>(*model, timeline);
  const bench::Forward forward = [&](const Tensor& x) { return ddp ? ddp->forward(x) : (*model)(x); };

  std::optional<amp::GradScaler> scaler;
  if (precision.grad_scaler) scaler.emplace(device);

  // One step; returns the loss, detached and still on the device, so no step waits for the host.
  auto step_with = [&](optim::Optimizer& opt) -> Tensor {
    // timeline.begin()/end(): the spans of --trace's step; they return at once otherwise.
    timeline.begin("zero_grad");
    opt.zero_grad(/*set_to_none=*/true);
    timeline.end();
    timeline.begin("forward + loss");
    Tensor loss = bench::workload_loss(cfg.workload, forward, data);
    timeline.end();
    if (scaler) {
      timeline.begin("backward");
      Tensor scaled = scaler->scale(loss);
      scaled.backward();
      timeline.end();
      timeline.begin("optimizer");
      scaler->step(opt);
      scaler->update();
      timeline.end();
      return loss.detach();
    }
    timeline.begin("backward");
    loss.backward();
    timeline.end();
    timeline.begin("optimizer");
    if (ddp) ddp->step(opt);  // with the last bucket's all-reduce overlapped
    else opt.step();
    timeline.end();
    return loss.detach();
  };
  // --cuda-graph: the same step, captured after 3 eager warm-up steps and replayed (train/graphed_step.h);
  // the batch is drawn once, so the static inputs are the batch itself. Each step's loss is copied
  // out of the graph's loss tensor, which every replay overwrites.
  std::unique_ptr<train::GraphedStep> graphed;
  Tensor graph_loss;
  if (cfg.cuda_graph) {
    train::GraphedStepOptions graph_options;
    graph_options.warmup_steps = 3;
    graphed = std::make_unique<train::GraphedStep>(
        std::vector<Tensor>{data.input, data.target},
        [&](const std::vector<Tensor>&) {
          graph_loss = step_with(*optimizer);
          // A capture ends only once its collectives joined back: ZeRO's all-gathers finish here
          // instead of overlapping the next forward.
          if (zero) zero->wait_for_parameters();
        },
        graph_options);
  }
  auto step = [&]() -> Tensor {
    if (!graphed) return step_with(*optimizer);
    graphed->run({data.input, data.target});
    return kernels::clone(graph_loss);
  };

  const nlohmann::ordered_json bucket_json = cfg.bucket_mb == "auto" ? nlohmann::ordered_json("auto")
                                                                    : nlohmann::ordered_json(std::stod(cfg.bucket_mb));
  const dist::scaling::ModelParameters model_parameters;  // bench/scaling_model --calibrate's defaults
  dist::BucketPlan auto_plan;
  if (world.size > 1 || cfg.zero > 0 || !cfg.dist_checks.empty()) {
    dist::DdpOptions options;
    if (cfg.dist_checks == "off") options.check_collectives_every = 0;
    if (cfg.bucket_mb == "auto") {
      // Each rank profiles its own step before DDP exists (a scratch optimizer, so the real one
      // starts fresh; DDP then broadcasts rank 0's parameters), rank 0 plans and broadcasts.
      optim::AdamW scratch(model->parameters(), adamw);
      for (int i = 0; i < 2; ++i) step_with(scratch);
      dist::scaling::StepProfile profile = marks->profile([&] { step_with(scratch); });
      scratch.zero_grad(/*set_to_none=*/true);
      dist::scaling::SimulationOptions sim;
      sim.gpus = world.size;
      sim.topology = dist::scaling::topology_from_name(cfg.topology);
      sim.parameters = model_parameters;
      sim.overlap = !cfg.no_overlap;
      sim.overlap_optimizer = !cfg.no_overlap_optimizer && !precision.grad_scaler && cfg.zero == 0;
      sim.zero_stage = cfg.zero;
      if (cfg.comm_dtype != "same") sim.comm_element_bytes = cfg.comm_dtype == "bf16" ? 2 : 4;
      auto_plan = dist::decide_bucket_plan(profile, sim, *world.cpu_group);
      options.bucket_plan = auto_plan.buckets;
      if (lead) {
        std::fprintf(stderr, "train_step: --bucket-mb auto: %zu buckets (%s), predicted %.3f ms/step on %s\n",
                     auto_plan.buckets.size(), auto_plan.chosen.c_str(), auto_plan.prediction.step_ms,
                     cfg.topology.c_str());
      }
    } else {
      options.bucket_cap_mb = std::stod(cfg.bucket_mb);
    }
    options.first_bucket_mb = cfg.first_bucket_mb;
    options.overlap = !cfg.no_overlap;
    // A GradScaler reads every gradient before the step, so the step cannot overlap the last bucket.
    options.overlap_optimizer = !cfg.no_overlap_optimizer && !precision.grad_scaler && cfg.zero == 0;
    options.zero_stage = cfg.zero;
    if (cfg.comm_dtype == "f32") options.comm_dtype = DType::f32;
    if (cfg.comm_dtype == "bf16") options.comm_dtype = DType::bf16;
    ddp = std::make_unique<dist::DistributedDataParallel>(model, options);
    ddp->set_timeline(&timeline);
    if (cfg.zero > 0) {
      zero = std::make_unique<dist::ZeroRedundancyOptimizer>(*ddp, std::move(adamw_optimizer));
      zero->set_timeline(&timeline);
      optimizer = zero.get();
    }
  }

  std::vector<Tensor> losses;  // () each, one per step, warm-up included
  // The host's share: the last warm-up steps start on an idle GPU, and the time step() takes to
  // return is what the host needs to issue one step (a step that needs longer than its GPU work is
  // host-bound). The timed steps below run back to back.
  std::vector<double> host_issue_ms;  // (up to 3,) GPU only
  for (int64_t i = 0; i < cfg.warmup; ++i) {
    const bool measure_host = on_gpu && i >= cfg.warmup - 3;
    if (measure_host) cuda::synchronize(device.index);
    auto start = std::chrono::steady_clock::now();
    losses.push_back(step());
    if (measure_host) {
      host_issue_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  if (!cfg.trace.empty()) {  // one more step, untimed and left out of the losses, as a timeline
    bench::trace_step(timeline, [&] { step(); }, cfg.trace,
                      {{"workload", cfg.workload}, {"precision", cfg.precision}, {"batch", batch},
                       {"world_size", world.size}, {"bucket_mb", bucket_json},
                       {"first_bucket_mb", cfg.first_bucket_mb}, {"comm_dtype", cfg.comm_dtype},
                       {"overlap", !cfg.no_overlap},
                       {"overlap_optimizer", !cfg.no_overlap_optimizer && !precision.grad_scaler},
                       {"zero_stage", cfg.zero}});
  }
  dist::scaling::StepProfile profile;
  if (!cfg.profile.empty()) profile = marks->profile([&] { step(); });  // one more untimed step
  if (!cfg.graph_dot.empty()) {  // the graph is captured at the 4th step, which may not have come yet
    if (!graphed->captured()) step();
    graphed->graph().debug_dump(cfg.graph_dot);
  }
  if (on_gpu) {
    cuda::synchronize(device.index);
    cuda::reset_peak_memory_stats(device.index);
  }

  std::vector<double> step_ms;  // (steps,) timed steps
  if (on_gpu) {
    // Events on tandem's compute stream; timed step i runs between marks[i] and marks[i + 1].
    std::vector<cuda::Event> marks(cfg.steps + 1);
    cuda::profiler_start();  // a profiler told to wait for it (bench/kernel_profile.py) sees the timed steps
    marks[0].record(device.index);
    for (int64_t i = 0; i < cfg.steps; ++i) {
      losses.push_back(step());
      marks[i + 1].record(device.index);
    }
    marks.back().synchronize();
    cuda::profiler_stop();
    for (int64_t i = 0; i < cfg.steps; ++i) step_ms.push_back(marks[i].elapsed_ms(marks[i + 1]));
  } else {
    for (int64_t i = 0; i < cfg.steps; ++i) {  // the CPU backend is synchronous: wall time is step time
      auto start = std::chrono::steady_clock::now();
      losses.push_back(step());
      step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }

  std::vector<double> loss_values = stack(losses).to_double_vector();  // (warmup + steps,)
  nlohmann::ordered_json ddp_json = nullptr;
  if (ddp && graphed) {
    // A graph records no timings: DDP's statistics would be those of the last eager step.
    ddp_json = {{"world_size", world.size}, {"bucket_mb", bucket_json}, {"comm_dtype", cfg.comm_dtype},
                {"cuda_graph", true}};
  } else if (ddp) {
    const dist::DdpStats& st = ddp->stats();  // the last step's
    ddp_json = {{"world_size", world.size},         {"bucket_mb", bucket_json},
                {"comm_dtype", cfg.comm_dtype},     {"overlap", !cfg.no_overlap},
                {"overlap_optimizer", !cfg.no_overlap_optimizer && !precision.grad_scaler && cfg.zero == 0},
                {"buckets", st.buckets},            {"bytes", st.bytes},
                {"comm_ms", st.comm_ms},            {"exposed_ms", st.exposed_ms},
                {"hidden_fraction", st.hidden_fraction},
                {"dist_checks", cfg.dist_checks.empty() ? "default" : cfg.dist_checks}};
    if (cfg.bucket_mb == "auto") {
      ddp_json["bucket_plan"] = {{"chosen", auto_plan.chosen},
                                 {"topology", cfg.topology},
                                 {"predicted_step_ms", auto_plan.prediction.step_ms},
                                 {"buckets", auto_plan.buckets}};
    }
  }
  nlohmann::ordered_json zero_json = nullptr;
  if (zero && graphed) {
    zero_json = {{"stage", cfg.zero}, {"cuda_graph", true}};
  } else if (zero) {
    const dist::ZeroStats& st = zero->stats();  // the last step's parameter all-gathers
    zero_json = {{"stage", cfg.zero},         {"all_gathers", st.gathers},       {"bytes", st.bytes},
                 {"gather_ms", st.gather_ms}, {"exposed_ms", st.exposed_ms}, {"hidden_fraction", st.hidden_fraction}};
  }
  // This rank's optimizer state (moments, f32 master weights, step counts) and every rank's
  // allocator peak (GPU; the CPU backend has no allocator statistics).
  const int64_t state_bytes = optimizer->state_bytes();
  nlohmann::ordered_json peaks = nullptr;
  nlohmann::ordered_json state_per_rank = nlohmann::ordered_json::array();
  {
    Tensor mine = from_vector(std::vector<int64_t>{
        state_bytes, on_gpu ? static_cast<int64_t>(cuda::max_memory_allocated(device.index)) : int64_t{-1}});
    Tensor all = empty({2 * world.size}, DType::i64);  // (2 * world,) per rank: state, peak
    world.cpu_group->all_gather(all, mine)->synchronize();
    std::vector<int64_t> v = all.to_vector<int64_t>();
    if (on_gpu) peaks = nlohmann::ordered_json::array();
    for (int r = 0; r < world.size; ++r) {
      state_per_rank.push_back(v[2 * r]);
      if (on_gpu) peaks.push_back(v[2 * r + 1]);
    }
  }
  // After the timed steps: every rank copies its parameters to the host (rank 0's are reported).
  const std::string params_hash = are_deterministic_algorithms_enabled() ? bench::hash_hex(bench::parameter_hash(*model)) : "";
  if (!lead) return 0;
  for (size_t i = 0; i < loss_values.size(); ++i) {
    int64_t timed = static_cast<int64_t>(i) - cfg.warmup;
    if (timed < 0) {
      std::printf("step %3zu  loss %.6f  (warm-up)\n", i, loss_values[i]);
    } else {
      std::printf("step %3zu  loss %.6f  %.3f ms\n", i, loss_values[i], step_ms[timed]);
    }
  }

  const double med = median(step_ms);
  const double min = *std::min_element(step_ms.begin(), step_ms.end());
  if (!cfg.profile.empty()) {
    profile.workload = cfg.workload;
    profile.precision = cfg.precision;
    profile.device = device.str();
    profile.commit = TANDEM_SOURCE_COMMIT;
    profile.source = "train_step --profile";
    profile.step_ms = med;  // the timed steps' median; the spans are the profiled step's
    bench::write_profile(profile, cfg.profile);
  }
  const double samples_per_s = static_cast<double>(batch) / (med / 1e3);  // gpt2: sequences per second
  const int64_t tokens = spec.tokens_per_sample();
  nlohmann::ordered_json result = {
      {"framework", "tandem"},
      {"workload", cfg.workload},
      {"precision", cfg.precision},
      {"device", device.str()},
      {"batch", batch},
      {"seq_len", spec.name == "gpt2" ? nlohmann::ordered_json(spec.seq_len_or_default()) : nullptr},
      {"channels_last", cfg.channels_last},
      {"compact_masters", cfg.compact_masters},
      {"params", model->num_parameters()},
      {"step_ms_median", med},
      {"step_ms_min", min},
      {"cuda_graph", graphed ? nlohmann::ordered_json({{"nodes", graphed->graph().num_nodes()},
                                                       {"edges", graphed->graph().num_edges()},
                                                       {"pool_bytes", graphed->graph().pool_bytes()}})
                             : nlohmann::ordered_json(nullptr)},
      {"host_issue_ms",
       host_issue_ms.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(median(host_issue_ms))},
      {"samples_per_s", samples_per_s},
      {"tokens_per_s", spec.name == "gpt2" ? nlohmann::ordered_json(samples_per_s * tokens) : nullptr},
      {"peak_memory_bytes", on_gpu ? nlohmann::ordered_json(cuda::max_memory_allocated(device.index)) : nullptr},
      // What the caching allocator holds from the device at the end (tensors and its cache).
      {"reserved_memory_bytes", on_gpu ? nlohmann::ordered_json(cuda::memory_reserved(device.index)) : nullptr},
      {"loss_first", loss_values.front()},  // before any update
      {"loss_last", loss_values.back()},
      {"ddp", ddp_json},
      {"zero_stage", cfg.zero},
      {"zero", zero_json},
      {"optimizer_state_bytes", state_bytes},
      {"optimizer_state_bytes_per_rank", state_per_rank},
      {"peak_memory_bytes_per_rank", peaks},
      {"deterministic", are_deterministic_algorithms_enabled()},
      {"autotune", cfg.autotune},
      {"matmul_tuning", cfg.autotune ? std::string("all") : cfg.matmul_tuning},
      {"weight_gradients_beside", autograd::weight_gradients_beside()},
      {"params_hash", are_deterministic_algorithms_enabled() ? nlohmann::ordered_json(params_hash) : nullptr},
  };

  std::fprintf(stderr,
               "train_step: tandem %s %s on %s, batch %lld, %.1fM params: %.3f ms/step median (min %.3f), "
               "%.0f %s/s",
               cfg.workload.c_str(), cfg.precision.c_str(), device.str().c_str(), static_cast<long long>(batch),
               model->num_parameters() / 1e6, med, min, samples_per_s * tokens, tokens > 1 ? "tokens" : "samples");
  if (on_gpu) std::fprintf(stderr, ", peak %.2f GiB", cuda::max_memory_allocated(device.index) / double(1 << 30));
  // Under --cuda-graph the allocator's peak leaves out the graph's pool (its working memory).
  if (graphed)
    std::fprintf(stderr, " outside the graph + %.2f GiB its pool", graphed->graph().pool_bytes() / double(1 << 30));
  std::fprintf(stderr, ", loss %.6f -> %.6f\n", loss_values.front(), loss_values.back());
  if (are_deterministic_algorithms_enabled()) std::fprintf(stderr, "train_step: parameters hash %s (FNV-1a, deterministic mode)\n", params_hash.c_str());
  std::fflush(stderr);

  if (!cfg.json.empty()) {
    std::ofstream out(cfg.json);
    TANDEM_CHECK_AS(ValueError, out.good(), "cannot write the JSON file ", cfg.json);
    out << result.dump(2) << "\n";
  }
  std::printf("%s\n", result.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time one training step (zero_grad, forward, loss, backward, AdamW) of a benchmark workload"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  Config cfg;
  app.add_option("--workload", cfg.workload, "the model and data: mlp, gpt2 (124M) or resnet18 (3x32x32 images)")
      ->check(CLI::IsMember(bench::workload_names()));
  app.add_option("--precision", cfg.precision,
                 "f32 (no TF32), tf32 (f32 parameters, TF32 matmuls), bf16 or fp16 (16-bit model, fp16 with a "
                 "gradient scaler)")
      ->check(CLI::IsMember(train::PrecisionPolicy::names()));
  app.add_option("--device", cfg.device, "cuda (GPU 0) or cpu; default cuda when a GPU is visible")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--batch", cfg.batch,
                 "samples (gpt2: sequences) per step, per GPU; 0: the workload's default (mlp 1024, gpt2 8, "
                 "resnet18 256)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seq-len", cfg.seq_len, "gpt2: tokens per sequence; 0: the context, 1024")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--channels-last", cfg.channels_last,
               "resnet18: convolution weights and images channels-last (NHWC), as PyTorch's channels_last");
  app.add_option("--warmup", cfg.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", cfg.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--json", cfg.json, "also write the result JSON to this file");
  app.add_option("--bucket-mb", cfg.bucket_mb,
                 "DDP: gradient bucket size in MB (under mpirun), or auto: buckets planned from a profile of this "
                 "step and the link model of --topology")
      ->check(CLI::PositiveNumber | CLI::IsMember({"auto"}));
  app.add_option("--topology", cfg.topology,
                 "--bucket-mb auto: the links to plan for (h200x4, nvlink8-ib8x400, nvlink8-eth100, ...)");
  app.add_option("--first-bucket-mb", cfg.first_bucket_mb,
                 "DDP: size of the first bucket in MB (equal to --bucket-mb and above the model's size: one bucket)")
      ->check(CLI::PositiveNumber);
  app.add_option("--comm-dtype", cfg.comm_dtype, "DDP: dtype gradients travel in: same, f32 or bf16")
      ->check(CLI::IsMember({"same", "f32", "bf16"}));
  app.add_flag("--no-overlap", cfg.no_overlap, "DDP: launch every bucket after backward instead of during it");
  app.add_flag("--no-overlap-optimizer", cfg.no_overlap_optimizer,
               "DDP: wait for every bucket before the optimizer step (default: update the other parameters while "
               "the last bucket travels)");
  app.add_option("--zero", cfg.zero,
                 "ZeRO stage: 0 plain DDP, 1 optimizer state sharded across ranks, 2 gradients too (makes a DDP "
                 "even for one process)")
      ->check(CLI::Range(0, 2));
  app.add_option("--trace", cfg.trace,
                 "after warm-up, record one more step and write it here as a Chrome trace (every rank in one "
                 "file; open in ui.perfetto.dev)");
  app.add_option("--profile", cfg.profile,
                 "after warm-up, profile one more step (forward, backward, optimizer, each gradient's ready time) "
                 "and write it here as JSON for bench/scaling_model");
  app.add_option("--dist-checks", cfg.dist_checks,
                 "on or off: train through DistributedDataParallel even on one rank, comparing the ranks' "
                 "collectives every step (on) or never (off), to measure the checks' cost")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_flag("--cuda-graph", cfg.cuda_graph,
               "capture the whole step (forward, backward, DDP's collectives, optimizer, loss scaling) as one CUDA "
               "graph after 3 eager steps and replay it (GPU only)");
  app.add_option("--graph-dot", cfg.graph_dot,
                 "--cuda-graph: write the captured graph to this file in Graphviz DOT form (its kernels with their "
                 "parameters, and their dependencies)");
  app.add_flag("--compact-masters", cfg.compact_masters,
               "bf16: keep each f32 master weight as the parameter plus a 16-bit low half (the same masters in 2 "
               "bytes per parameter less, and 2 bytes less for the update to move)");
  app.add_flag("--autotune", cfg.autotune,
               "GPU: time the candidate algorithms of each matrix product (cuBLASLt) and convolution (cuDNN) at "
               "first use and keep the fastest, like PyTorch's TunableOp and cudnn.benchmark (ignored with "
               "--deterministic)");
  app.add_option("--matmul-tuning", cfg.matmul_tuning,
                 "GPU: which matrix products time cuBLASLt's candidate algorithms at first use: none, large (from "
                 "8 GFLOP) or all (as --autotune does)")
      ->check(CLI::IsMember({"none", "large", "all"}));
  app.add_flag("--weight-gradients-beside", cfg.weight_gradients_beside,
               "GPU: run backward's weight-gradient products on a second stream beside the rest of backward "
               "(the same bits; also TANDEM_WEIGHT_GRADIENTS_BESIDE=1)");
  app.add_flag("--deterministic", cfg.deterministic,
               "deterministic mode (same bits run to run); prints and writes a hash of the final parameters");
  CLI11_PARSE(app, argc, argv);
  try {
    return run_benchmark(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: error: %s\n", e.what());
    return 1;
  }
}
