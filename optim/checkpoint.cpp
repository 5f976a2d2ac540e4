#include "tandem/optim/checkpoint.h"

#include <cstdio>

#include "tandem/core/random.h"
#include "tandem/core/safetensors.h"

namespace tandem::optim {

namespace {
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kHyperPrefix[] = "optimizer.";
constexpr char kScalerPrefix[] = "grad_scaler.";

std::string exact(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);  // round-trips every double
  return text;
}

int64_t to_int(const std::map<std::string, std::string>& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  TANDEM_CHECK_AS(ValueError, it != m.end(), "load_checkpoint: ", path, " has no '", key,
                  "' entry in its metadata: not a tandem training checkpoint");
  return std::stoll(it->second);
}
}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer* optimizer,
                     const TrainingPosition& position, const std::map<std::string, std::string>& extra,
                     const amp::GradScaler* scaler) {
  std::vector<std::pair<std::string, Tensor>> tensors = model.state_dict();
  std::map<std::string, std::string> metadata = extra;
  metadata["format"] = "tandem-checkpoint-1";
  metadata["epoch"] = std::to_string(position.epoch);
  metadata["step"] = std::to_string(position.step);
  metadata["rng_seed"] = std::to_string(default_generator().seed());
  metadata["rng_offset"] = std::to_string(default_generator().offset());
  if (optimizer != nullptr) {
    StateDict state = optimizer->state_dict();
    metadata["optimizer"] = state.optimizer;
    for (auto& [key, t] : state.tensors) tensors.emplace_back(kOptimizerPrefix + key, t);
    for (auto& [key, v] : state.metadata) metadata[kHyperPrefix + key] = exact(v);
  }
  if (scaler != nullptr) {
    for (auto& [key, v] : scaler->state_dict()) metadata[kScalerPrefix + key] = exact(v);
  }
  save_safetensors(path, tensors, metadata);
}

LoadedCheckpoint load_checkpoint(const std::string& path, nn::Module& model, Optimizer* optimizer,
                                 amp::GradScaler* scaler) {
  SafetensorsFile file = load_safetensors(path);
  LoadedCheckpoint loaded;
  loaded.metadata = file.metadata;
  loaded.position.epoch = to_int(file.metadata, "epoch", path);
  loaded.position.step = to_int(file.metadata, "step", path);

  std::map<std::string, Tensor> model_state;
  StateDict optimizer_state;
  const std::string prefix = kOptimizerPrefix;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) optimizer_state.tensors[name.substr(prefix.size())] = t;
    else model_state[name] = t;
  }
  model.load_state_dict(model_state);
  if (optimizer != nullptr) {
    auto it = file.metadata.find("optimizer");
    TANDEM_CHECK_AS(ValueError, it != file.metadata.end(), "load_checkpoint: ", path, " holds no optimizer state");
    optimizer_state.optimizer = it->second;
    const std::string hyper = kHyperPrefix;
    for (auto& [key, value] : file.metadata) {
      if (key.rfind(hyper, 0) == 0) optimizer_state.metadata[key.substr(hyper.size())] = std::stod(value);
    }
    optimizer->load_state_dict(optimizer_state);
  }
  if (scaler != nullptr) {
    std::map<std::string, double> state;
    const std::string prefix_s = kScalerPrefix;
    for (auto& [key, value] : file.metadata) {
      if (key.rfind(prefix_s, 0) == 0) state[key.substr(prefix_s.size())] = std::stod(value);
    }
    TANDEM_CHECK_AS(ValueError, !state.empty(), "load_checkpoint: ", path, " holds no GradScaler state");
    scaler->load_state_dict(state);
  }
  default_generator().set_state(static_cast<uint64_t>(std::stoull(file.metadata.at("rng_seed"))),
                                static_cast<uint64_t>(std::stoull(file.metadata.at("rng_offset"))));
  return loaded;
}

}  // namespace tandem::optim
