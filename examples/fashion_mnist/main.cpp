// Fashion-MNIST training: an MLP or a CNN, on the CPU or a GPU, in one process or data-parallel
// under mpirun (each rank takes global_batch / world_size samples per step). Rank 0 prints a
// progress line every --log-every steps and a summary per epoch with test accuracy, writes the
// metrics as JSON, and saves checkpoints that --resume continues from exactly.
//
//   fashion_mnist --model cnn --epochs 15
//   mpirun -np 2 fashion_mnist --model mlp --epochs 10 --batch-size 128
//   mpirun -np 4 fashion_mnist --model cnn --zero 2   (ZeRO: optimizer state and gradients sharded)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "flags.h"
#include "models.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/temp_files.h"
#include "tandem/data/idx.h"
#include "tandem/data/loader.h"
#include "tandem/dist/ddp.h"
#include "tandem/dist/zero.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/schedule.h"
#include "tandem/train/graphed_step.h"
#include "tandem/optim/sgd.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/precision.h"

using namespace tandem;

namespace {

struct Config {
  std::string model = "mlp";
  int64_t epochs = 10;
  int64_t batch_size = 128;  // global: split across ranks
  double lr = 1e-3;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";  // cosine: decay to 0 over the whole run; none: constant
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string device = "auto";
  std::string data;
  std::string save;
  std::string resume;
  std::string metrics;
  uint64_t seed = 0;
  int64_t log_every = 100;
  int64_t max_steps_per_epoch = 0;  // 0: the whole epoch (a smaller value is for quick checks)
  std::string precision = "f32";    // f32, tf32 (f32 with TF32 matmuls), bf16 or fp16
  int zero = 0;                     // ZeRO stage: 0 (plain DDP), 1 or 2
  bool cuda_graph = false;          // capture the training step as a CUDA graph and replay it
  bool compact_masters = false;     // bf16: f32 masters as the parameter plus a 16-bit low half
};

std::string format_seconds(double s) {
  char text[32];
  int total = static_cast<int>(s + 0.5);
  std::snprintf(text, sizeof text, "%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60);
  return text;
}

// Sums values over the ranks (in f64 on the cpu group).
std::vector<double> sum_over_ranks(const std::vector<double>& values) {
  Tensor t = from_vector(values, {}, DType::f64);
  dist::world().cpu_group->all_reduce(t, dist::ReduceOp::sum)->synchronize();
  return t.to_double_vector();
}

// A problem found before training that every rank stops on together (no abort, so no MPI noise
// from an abort); one rank says it: rank 0 when it found it, else the ranks that did.
struct AgreedStop : std::runtime_error {
  AgreedStop(const std::string& problem, bool say) : std::runtime_error(problem), say(say) {}
  bool say;
};

void stop_together_if(const std::string& problem) {
  const bool lead = dist::world().rank == 0;
  std::vector<double> found = sum_over_ranks({problem.empty() ? 0.0 : 1.0, lead && !problem.empty() ? 1.0 : 0.0});
  if (found[0] > 0) throw AgreedStop(problem, !problem.empty() && (lead || found[1] == 0));
}

struct EvalResult {
  double loss, accuracy, samples;  // over the real test samples of every rank
};

// Evaluates on this rank's shard of the test set; the sums are combined over ranks.
EvalResult evaluate(nn::Module& model, data::DataLoader& loader, DType dtype) {
  NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0, correct = 0, count = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    Tensor logits = model(to(batch->inputs, dtype));
    int64_t n = batch->targets.numel();
    loss_sum += cross_entropy(logits, batch->targets, {Reduction::sum}).item();
    correct += sum(to(eq(argmax(logits, 1), batch->targets), DType::f32)).item();
    count += static_cast<double>(n);
  }
  model.train();
  std::vector<double> total = sum_over_ranks({loss_sum, correct, count});
  return {total[0] / total[2], total[1] / total[2], total[2]};
}

void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  remove_stale_temp_files(path);
  const std::string tmp = temp_path_for(path);
  TempFileGuard guard(tmp);  // removed if SIGINT or SIGTERM ends the run mid-write
  {
    std::ofstream out(tmp);
    TANDEM_CHECK_AS(ValueError, out.good(), "cannot write the metrics file ", tmp);
    out << j.dump(2) << "\n";
  }
  TANDEM_CHECK_AS(ValueError, std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path);
}

int run(const Config& cfg) {
  const dist::World& world = dist::init();
  const bool lead = world.rank == 0;
  Device device = cfg.device == "auto" ? world.device : Device(cfg.device);
  if (device.is_cuda() && world.device.is_cuda()) device = world.device;  // each rank its own GPU
  if (cfg.device == "auto" && device.is_cuda() && world.size > 1 && !world.gpu_group) {
    // More ranks than GPUs on a node (mpirun -np 2 on one GPU): NCCL needs a GPU per rank, so
    // the ranks train on the CPU over MPI instead.
    if (lead) {
      std::fprintf(stderr, "fashion_mnist: %d ranks but no GPU per rank on this node: training on the CPU (start as "
                   "many ranks as GPUs, e.g. TANDEM_RANKS=1, to train on the GPU)\n", world.size);
    }
    device = Device("cpu");
  }
  // Problems found before training stop every rank together, said once (stop_together_if).
  std::string problem;
  if (cfg.batch_size % world.size != 0) {
    problem = detail::concat("--batch-size ", cfg.batch_size, " must divide evenly across ", world.size, " ranks");
  }
  if (problem.empty() && cfg.cuda_graph && !device.is_cuda()) {
    problem = detail::concat("--cuda-graph: CUDA graphs capture GPU work, and this run trains on ", device,
                             " (drop --cuda-graph, or train on a GPU)");
  }
  if (problem.empty() && cfg.compact_masters && cfg.precision != "bf16") {
    problem = detail::concat("--compact-masters is for --precision bf16, and this run is ", cfg.precision,
                             " (fp16 keeps whole f32 masters; f32 and tf32 have none)");
  }
  stop_together_if(problem);
  const int64_t local_batch = cfg.batch_size / world.size;
  // Rank 0 writes the checkpoint and metrics: find an unwritable path now, not after an epoch.
  if (lead && !cfg.save.empty() && !(problem = unwritable_reason(cfg.save)).empty()) {
    problem = "--save " + cfg.save + ": " + problem + " (expected a file path in a writable directory)";
  }
  if (lead && problem.empty() && !cfg.metrics.empty() && !(problem = unwritable_reason(cfg.metrics)).empty()) {
    problem = "--metrics " + cfg.metrics + ": " + problem + " (expected a file path in a writable directory)";
  }
  stop_together_if(problem);

  data::FashionMnist train, test;
  try {
    const std::string dir = cfg.data.empty() ? data::default_fashion_mnist_dir() : cfg.data;
    train = data::load_fashion_mnist(dir, true);
    test = data::load_fashion_mnist(dir, false);
  } catch (const Error& e) {
    problem = e.message();  // every rank reads the same files: stop together, said once
  }
  stop_together_if(problem);

  manual_seed(cfg.seed);  // the same initial weights on every rank (DDP broadcasts rank 0's anyway)
  auto model = fashion::make_model(cfg.model, TensorOptions(DType::f32, device));
  // What --precision means (model dtype, f32 masters, loss scaling, TF32): train/precision.h.
  const train::PrecisionPolicy precision = train::PrecisionPolicy::parse(cfg.precision);
  precision.apply(*model);
  const DType dtype = precision.model_dtype;
  amp::GradScaler scaler(device, precision.grad_scaler_options());
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.optimizer == "adamw") {
    optim::AdamWOptions options{cfg.lr, 0.9, 0.999, 1e-8, cfg.weight_decay};
    options.compact_masters = cfg.compact_masters;
    opt = std::make_unique<optim::AdamW>(model->parameters(), options);
  } else if (cfg.optimizer == "sgd") {
    optim::SgdOptions options{cfg.lr, cfg.momentum, 0.0, cfg.weight_decay};
    options.compact_masters = cfg.compact_masters;
    opt = std::make_unique<optim::SGD>(model->parameters(), options);
  } else {
    TANDEM_THROW(ValueError, "unknown optimizer '", cfg.optimizer, "': expected adamw or sgd");
  }

  // Plain DDP loads the checkpoint first (construction broadcasts rank 0's parameters). ZeRO
  // wraps the optimizer first: every rank then reads the unsharded checkpoint and keeps its shard
  // of the optimizer state, whatever world size saved it.
  train::TrainingPosition position;
  std::optional<train::LoadedCheckpoint> resumed;
  auto resume = [&] {
    if (cfg.resume.empty()) return;
    try {
      resumed = train::load_checkpoint(cfg.resume, *model, opt.get(), scaler.is_enabled() ? &scaler : nullptr,
                                       {cfg.model, cfg.precision});
    } catch (const Error& e) {
      problem = e.message();
    }
    stop_together_if(problem);
    position = resumed->position;
    if (lead) std::printf("resumed from %s at epoch %lld, step %lld\n", cfg.resume.c_str(),
                          static_cast<long long>(position.epoch), static_cast<long long>(position.step));
  };
  if (cfg.zero == 0) resume();

  std::unique_ptr<dist::DistributedDataParallel> ddp;
  dist::ZeroRedundancyOptimizer* zero = nullptr;
  if (world.size > 1 || cfg.zero > 0) {
    dist::DdpOptions ddp_options;
    ddp_options.zero_stage = cfg.zero;
    ddp = std::make_unique<dist::DistributedDataParallel>(model, ddp_options);
  }
  if (cfg.zero > 0) {
    auto sharded = std::make_unique<dist::ZeroRedundancyOptimizer>(*ddp, std::move(opt));
    zero = sharded.get();
    opt = std::move(sharded);
    resume();
  }
  auto forward = [&](const Tensor& x) { return ddp ? ddp->forward(x) : model->forward(x); };

  dist::DistributedSampler train_shard(train.images.shape()[0], world.rank, world.size, true, cfg.seed);
  data::DataLoader train_loader(train.images, train.labels, {local_batch, false, false, cfg.seed, device});
  dist::DistributedSampler test_shard(test.images.shape()[0], world.rank, world.size, false, 0);
  data::DataLoader test_loader(test.images, test.labels, {256, false, false, 0, device});
  // Only the real samples: the sampler pads with repeats when the test set does not divide by the
  // world size, and a repeat would be counted twice.
  std::vector<int64_t> test_indices = test_shard.indices(0);
  test_indices.resize(static_cast<size_t>(test_shard.num_real_samples()));
  test_loader.set_indices(test_indices);

  int64_t steps_per_epoch = (train_shard.num_samples() + local_batch - 1) / local_batch;
  if (cfg.max_steps_per_epoch > 0) steps_per_epoch = std::min(steps_per_epoch, cfg.max_steps_per_epoch);
  const int64_t total_steps = steps_per_epoch * cfg.epochs;
  if (resumed && cfg.schedule == "cosine" && resumed->text("schedule") == "cosine") {
    // The cosine curve is planned over the whole run: another length is another curve.
    const int64_t saved_steps = resumed->integer("total_steps", 1, std::numeric_limits<int64_t>::max());
    if (saved_steps != total_steps) {
      problem = detail::concat("--resume ", cfg.resume, ": the checkpoint's cosine schedule runs ",
                               resumed->text("epochs"), " epochs (", saved_steps, " steps) but this run asks for ",
                               cfg.epochs, " epochs (", total_steps, " steps); resume with --epochs ",
                               resumed->text("epochs"), " and the same --max-steps-per-epoch and --batch-size, or ",
                               "with --schedule none");
    }
  }
  stop_together_if(problem);
  std::unique_ptr<optim::LRSchedule> schedule;
  if (cfg.schedule == "cosine") {
    schedule = std::make_unique<optim::CosineAnnealingLR>(total_steps);
    schedule->apply(*opt, position.step);  // from the start, or where a resumed run left off
  }
  if (lead) {
    std::printf("fashion_mnist: %s, %lld parameters, %s, %s, %d rank(s), global batch %lld (%lld per rank), %s lr %g\n",
                cfg.model.c_str(), static_cast<long long>(model->num_parameters()), cfg.precision.c_str(),
                device.str().c_str(), world.size,
                static_cast<long long>(cfg.batch_size), static_cast<long long>(local_batch), cfg.optimizer.c_str(), cfg.lr);
  }

  nlohmann::json metrics = {{"model", cfg.model}, {"optimizer", cfg.optimizer}, {"lr", cfg.lr}, {"precision", cfg.precision},
                            {"batch_size", cfg.batch_size}, {"world_size", world.size}, {"device", device.str()},
                            {"epochs", nlohmann::json::array()}};
  // One training step on (inputs, targets); with --cuda-graph it is captured once and replayed
  // (train/graphed_step.h), and step_logits / step_loss then hold the newest replay's values.
  Tensor step_logits, step_loss;
  auto train_step = [&](const std::vector<Tensor>& in) {
    opt->zero_grad();
    step_logits = forward(to(in[0], dtype));
    step_loss = cross_entropy(step_logits, in[1]);
    scaler.scale(step_loss).backward();
    scaler.step(*opt);
    scaler.update();
    // A capture ends once its collectives joined back: ZeRO's all-gathers finish inside the step.
    if (cfg.cuda_graph && zero) zero->wait_for_parameters();
  };
  std::unique_ptr<train::GraphedStep> graphed;
  Tensor graph_logits, graph_loss;  // the captured step's outputs
  auto run_start = std::chrono::steady_clock::now();
  const int64_t first_epoch = position.epoch;
  for (int64_t epoch = position.epoch; epoch < cfg.epochs; ++epoch) {
    // Each epoch's order follows from (seed, epoch): a resumed run sees the same batches.
    train_loader.set_indices(train_shard.indices(epoch));
    train_loader.start_epoch(epoch);
    auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0, correct = 0, seen = 0;
    Tensor window_loss = zeros({}, TensorOptions(DType::f32, device));  // summed on the device, read at log time
    Tensor window_correct = zeros({}, TensorOptions(DType::f32, device));
    double window_seen = 0;
    int64_t step_in_epoch = 0;
    while (auto batch = train_loader.next()) {
      if (step_in_epoch >= steps_per_epoch) break;
      if (cfg.cuda_graph && !graphed) {
        // The first batch gives the static inputs' shapes; every full batch is copied into them.
        graphed = std::make_unique<train::GraphedStep>(
            std::vector<Tensor>{kernels::clone(batch->inputs), kernels::clone(batch->targets)}, train_step);
      }
      // A last, smaller batch of an epoch runs eagerly, outside the graph (same model and optimizer).
      if (graphed && graphed->fits({batch->inputs, batch->targets})) {
        graphed->run({batch->inputs, batch->targets});
        // The capture's outputs are what every replay rewrites; an eager step in between (an
        // epoch's last batch) points step_logits / step_loss at its own tensors.
        if (graphed->captured() && !graph_loss.defined()) std::tie(graph_logits, graph_loss) = std::tie(step_logits, step_loss);
        if (graphed->captured()) std::tie(step_logits, step_loss) = std::tie(graph_logits, graph_loss);
      } else {
        train_step({batch->inputs, batch->targets});
      }
      Tensor logits = step_logits, loss = step_loss;
      if (schedule) schedule->step(*opt);
      ++position.step;
      ++step_in_epoch;
      {
        NoGradGuard no_grad;
        double n = static_cast<double>(batch->targets.numel());
        window_loss = add(window_loss, mul(to(loss.detach(), DType::f32), n));
        window_correct = add(window_correct, sum(to(eq(argmax(logits.detach(), 1), batch->targets), DType::f32)));
        window_seen += n;
      }
      bool log_now = cfg.log_every > 0 && step_in_epoch % cfg.log_every == 0;
      if (log_now || step_in_epoch == steps_per_epoch) {
        std::vector<double> totals = sum_over_ranks({window_loss.item(), window_correct.item(), window_seen});
        loss_sum += totals[0];
        correct += totals[1];
        seen += totals[2];
        window_loss = zeros({}, TensorOptions(DType::f32, device));
        window_correct = zeros({}, TensorOptions(DType::f32, device));
        window_seen = 0;
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
        double done = static_cast<double>((epoch - first_epoch) * steps_per_epoch + step_in_epoch);
        double rate = seen / std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
        double remaining = static_cast<double>(total_steps - epoch * steps_per_epoch - step_in_epoch);
        double eta = elapsed / std::max(1.0, done) * remaining;
        if (lead && log_now) {
          std::printf("epoch %lld step %lld/%lld  loss %.4f  acc %.4f  %.0f samples/s  ETA %s\n",
                      static_cast<long long>(epoch + 1), static_cast<long long>(step_in_epoch),
                      static_cast<long long>(steps_per_epoch), totals[0] / totals[2], totals[1] / totals[2], rate,
                      format_seconds(eta).c_str());
          std::fflush(stdout);
        }
      }
    }
    double epoch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    if (zero) zero->wait_for_parameters();  // the last step's all-gathers, before the model is read directly
    EvalResult eval = evaluate(*model, test_loader, dtype);
    position.epoch = epoch + 1;
    nlohmann::json ddp_json;
    if (ddp) {
      // The last step of the epoch: how much was reduced and how much of it backward hid.
      const dist::DdpStats& st = ddp->stats();
      ddp_json = {{"buckets", st.buckets}, {"bytes", st.bytes}, {"comm_ms", st.comm_ms},
                  {"exposed_ms", st.exposed_ms}, {"hidden_fraction", st.hidden_fraction}};
      if (lead) {
        std::printf("ddp: %lld buckets, %.2f MB all-reduced per step, communication %.3f ms, exposed %.3f ms, "
                    "hidden %.0f%%\n",
                    static_cast<long long>(st.buckets), static_cast<double>(st.bytes) / 1e6, st.comm_ms, st.exposed_ms,
                    100.0 * st.hidden_fraction);
      }
    }
    if (zero) {
      const dist::ZeroStats& st = zero->stats();
      ddp_json["zero"] = {{"stage", cfg.zero}, {"all_gathers", st.gathers}, {"gather_ms", st.gather_ms},
                          {"exposed_ms", st.exposed_ms}, {"hidden_fraction", st.hidden_fraction},
                          {"optimizer_state_bytes", opt->state_bytes()}};
      if (lead) {
        std::printf("zero %d: %lld parameter all-gathers, %.3f ms, exposed %.3f ms, hidden %.0f%%, optimizer state "
                    "%.2f MB on this rank\n",
                    cfg.zero, static_cast<long long>(st.gathers), st.gather_ms, st.exposed_ms,
                    100.0 * st.hidden_fraction, static_cast<double>(opt->state_bytes()) / 1e6);
      }
    }
    if (lead) {
      std::printf("epoch %lld: train loss %.4f acc %.4f | test loss %.4f acc %.4f | %.1f s, %.0f samples/s\n",
                  static_cast<long long>(epoch + 1), loss_sum / seen, correct / seen, eval.loss, eval.accuracy,
                  epoch_seconds, seen / epoch_seconds);
      std::fflush(stdout);
      metrics["epochs"].push_back({{"epoch", epoch + 1}, {"train_loss", loss_sum / seen}, {"train_accuracy", correct / seen},
                                   {"test_loss", eval.loss}, {"test_accuracy", eval.accuracy},
                                   {"test_samples", eval.samples},
                                   {"seconds", epoch_seconds}, {"samples_per_second", seen / epoch_seconds},
                                   {"ddp", ddp_json}});
      if (!cfg.metrics.empty()) write_json_atomically(cfg.metrics, metrics);
      if (!cfg.save.empty()) {
        train::save_checkpoint(cfg.save, *model, opt.get(), position,
                               {{"model", cfg.model}, {"precision", cfg.precision}, {"schedule", cfg.schedule},
                                {"epochs", std::to_string(cfg.epochs)}, {"total_steps", std::to_string(total_steps)}},
                               scaler.is_enabled() ? &scaler : nullptr);
      }
    } else if (zero && !cfg.save.empty()) {
      opt->state_dict();  // ZeRO gathers the unsharded state on every rank: take part in rank 0's save
    }
  }
  if (lead) {
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    std::printf("done: %lld epochs in %s\n", static_cast<long long>(cfg.epochs), format_seconds(total).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP or a CNN on Fashion-MNIST with tandem (under mpirun for data parallelism)"};
  Config cfg;
  app.add_option("--model", cfg.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", cfg.epochs, "epochs to train")->check(fashion::whole_number_at_least(1));
  app.add_option("--batch-size", cfg.batch_size, "global batch size (split across ranks)")
      ->check(fashion::whole_number_at_least(1));
  app.add_option("--lr", cfg.lr, "learning rate")->check(fashion::number_above(0, false));
  app.add_option("--optimizer", cfg.optimizer, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--schedule", cfg.schedule, "learning-rate schedule: cosine (to 0 over the run) or none")
      ->check(CLI::IsMember({"cosine", "none"}));
  app.add_option("--momentum", cfg.momentum, "SGD momentum")->check(fashion::number_above(0, true));
  app.add_option("--weight-decay", cfg.weight_decay, "weight decay")->check(fashion::number_above(0, true));
  app.add_option("--device", cfg.device, "auto (a GPU when present), cpu, cuda or cuda:N");
  app.add_option("--data", cfg.data, "Fashion-MNIST directory (default: $TANDEM_DATA_DIR or the dataset-fashion-mnist package)");
  app.add_option("--save", cfg.save, "checkpoint written after every epoch (safetensors)");
  app.add_option("--resume", cfg.resume, "checkpoint to continue from (under --zero: saved at any world size)");
  app.add_option("--zero", cfg.zero,
                 "ZeRO stage: 0 plain DDP, 1 optimizer state sharded across ranks, 2 gradients sharded too")
      ->check(CLI::Range(0, 2));
  app.add_option("--metrics", cfg.metrics, "JSON file of per-epoch metrics");
  app.add_option("--seed", cfg.seed, "seed for the initial weights and the data order")
      ->check(fashion::whole_number_at_least(0));
  app.add_option("--log-every", cfg.log_every, "steps between progress lines (0: none)")
      ->check(fashion::whole_number_at_least(0));
  app.add_option("--precision", cfg.precision, "f32, tf32 (TF32 matmuls on GPUs), bf16 or fp16 (with loss scaling)")
      ->check(CLI::IsMember(train::PrecisionPolicy::names()));
  app.add_flag("--compact-masters", cfg.compact_masters,
               "bf16: keep each f32 master weight as the parameter plus a 16-bit low half (the same training in 2 "
               "bytes per parameter less; checkpoints load with or without it)");
  app.add_flag("--cuda-graph", cfg.cuda_graph,
               "capture the training step once as a CUDA graph (after 3 eager steps) and replay it; an epoch's last, "
               "smaller batch runs eagerly (GPU only)");
  app.add_option("--max-steps-per-epoch", cfg.max_steps_per_epoch, "cut epochs short (for quick checks; 0: whole epochs)")
      ->check(fashion::whole_number_at_least(0));
  CLI11_PARSE(app, argc, argv);
  try {
    int status = run(cfg);
    dist::finalize();
    return status;
  } catch (const AgreedStop& e) {
    // Every rank stops here together, one of them says why, and MPI is finalized normally.
    if (e.say) std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    dist::finalize();
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    std::fflush(stderr);
    if (dist::is_initialized() && dist::world().size > 1) dist::world().cpu_group->abort(e.what());
    return 1;
  }
}
