#include "tandem/train/checkpoint.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "tandem/core/random.h"
#include "tandem/core/safetensors.h"

namespace tandem::train {

namespace {
constexpr char kOptimizerPrefix[] = "optimizer/";
constexpr char kHyperPrefix[] = "optimizer.";
constexpr char kScalerPrefix[] = "grad_scaler.";
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string exact(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);  // round-trips every double
  return text;
}

const std::string& value_of(const std::map<std::string, std::string>& m, const std::string& key,
                            const std::string& path) {
  auto it = m.find(key);
  TANDEM_CHECK_AS(ValueError, it != m.end(), "load_checkpoint: '", path, "' has no '", key,
                  "' entry in its metadata: not a tandem training checkpoint");
  return it->second;
}

int64_t parse_integer(const std::string& key, const std::string& text, int64_t min, int64_t max,
                      const std::string& path) {
  int64_t v = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool whole = err == std::errc() && end == text.data() + text.size() && !text.empty();
  TANDEM_CHECK_AS(ValueError, whole && v >= min && v <= max, "load_checkpoint: '", path, "': metadata '", key,
                  "' is \"", text, "\", expected a whole number from ", min, " to ", max);
  return v;
}

uint64_t parse_unsigned(const std::string& key, const std::string& text, const std::string& path) {
  uint64_t v = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool whole = err == std::errc() && end == text.data() + text.size() && !text.empty();
  TANDEM_CHECK_AS(ValueError, whole, "load_checkpoint: '", path, "': metadata '", key, "' is \"", text,
                  "\", expected a whole number from 0 to ", std::numeric_limits<uint64_t>::max());
  return v;
}

double parse_number(const std::string& key, const std::string& text, const std::string& path) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  bool ok = !text.empty() && end == text.c_str() + text.size() && errno != ERANGE && std::isfinite(v);
  TANDEM_CHECK_AS(ValueError, ok, "load_checkpoint: '", path, "': metadata '", key, "' is \"", text,
                  "\", expected a finite number");
  return v;
}

// Every metadata entry under `prefix`, as numbers, keyed without the prefix.
std::map<std::string, double> numbers_under(const std::map<std::string, std::string>& metadata,
                                            const std::string& prefix, const std::string& path) {
  std::map<std::string, double> out;
  for (const auto& [key, value] : metadata) {
    if (key.rfind(prefix, 0) == 0) out[key.substr(prefix.size())] = parse_number(key, value, path);
  }
  return out;
}

// "model mlp in f32" from what the checkpoint and the program say; "" when neither names anything.
std::string describe(const std::string& model, const std::string& precision) {
  std::string text;
  if (!model.empty()) text = "model " + model;
  if (!precision.empty()) text += (text.empty() ? "" : " ") + std::string("in ") + precision;
  return text;
}

// Refuses a checkpoint of another model or precision than the program's, naming both.
void check_run_matches(const LoadedCheckpoint& c, const LoadOptions& options) {
  const std::string saved_model = c.text("model"), saved_precision = c.text("precision");
  bool model_differs = !options.model.empty() && !saved_model.empty() && saved_model != options.model;
  bool precision_differs = !options.convert_dtypes && !options.precision.empty() && !saved_precision.empty() &&
                           saved_precision != options.precision;
  TANDEM_CHECK_AS(ValueError, !model_differs && !precision_differs, "load_checkpoint: '", c.path,
                  "': this checkpoint is of ", describe(saved_model, saved_precision), "; you asked for ",
                  describe(options.model, options.precision));
}

// Refuses a stored tensor whose dtype differs from the model's, unless asked to convert.
void check_dtypes(const std::map<std::string, Tensor>& stored, const nn::Module& model, const LoadOptions& options,
                  const std::string& path) {
  if (options.convert_dtypes) return;
  for (const auto& [name, t] : model.state_dict()) {
    auto it = stored.find(name);
    if (it == stored.end()) continue;  // load_state_dict names what is missing
    TANDEM_CHECK_AS(TypeError, it->second.dtype() == t.dtype(), "load_checkpoint: '", path, "': tensor '", name,
                    "' is stored as ", it->second.dtype(), " but the model's is ", t.dtype(),
                    " (load with convert_dtypes to convert it deliberately)");
  }
}
}  // namespace

int64_t LoadedCheckpoint::integer(const std::string& key, int64_t min, int64_t max) const {
  return parse_integer(key, value_of(metadata, key, path), min, max, path);
}

std::string LoadedCheckpoint::text(const std::string& key, const std::string& fallback) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? fallback : it->second;
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
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
    optim::StateDict state = optimizer->state_dict();
    metadata["optimizer"] = state.optimizer;
    for (auto& [key, t] : state.tensors) tensors.emplace_back(kOptimizerPrefix + key, t);
    for (auto& [key, v] : state.metadata) metadata[kHyperPrefix + key] = exact(v);
  }
  if (scaler != nullptr) {
    for (auto& [key, v] : scaler->state_dict()) metadata[kScalerPrefix + key] = exact(v);
  }
  save_safetensors(path, tensors, metadata);
}

LoadedCheckpoint load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer,
                                 amp::GradScaler* scaler, const LoadOptions& options) {
  SafetensorsFile file = load_safetensors(path);
  LoadedCheckpoint loaded;
  loaded.path = path;
  loaded.metadata = file.metadata;
  check_run_matches(loaded, options);

  // Every number is read and checked before the model, optimizer or generator changes.
  loaded.position.epoch = loaded.integer("epoch", 0, kInt64Max);
  loaded.position.step = loaded.integer("step", 0, kInt64Max);
  const uint64_t rng_seed = parse_unsigned("rng_seed", value_of(file.metadata, "rng_seed", path), path);
  const uint64_t rng_offset = parse_unsigned("rng_offset", value_of(file.metadata, "rng_offset", path), path);
  optim::StateDict optimizer_state;
  if (optimizer != nullptr) {
    optimizer_state.optimizer = value_of(file.metadata, "optimizer", path);
    optimizer_state.metadata = numbers_under(file.metadata, kHyperPrefix, path);
  }
  std::map<std::string, double> scaler_state;
  if (scaler != nullptr) {
    scaler_state = numbers_under(file.metadata, kScalerPrefix, path);
    TANDEM_CHECK_AS(ValueError, !scaler_state.empty(), "load_checkpoint: '", path, "' holds no GradScaler state");
  }

  std::map<std::string, Tensor> model_state;
  const std::string prefix = kOptimizerPrefix;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) optimizer_state.tensors[name.substr(prefix.size())] = t;
    else model_state[name] = t;
  }
  check_dtypes(model_state, model, options, path);
  try {
    model.load_state_dict(model_state);
    if (optimizer != nullptr) optimizer->load_state_dict(optimizer_state);
  } catch (const ValueError& e) {
    // Say what the checkpoint was saved from: a missing name is often another model or precision.
    std::string saved = describe(loaded.text("model"), loaded.text("precision"));
    if (saved.empty()) throw;
    TANDEM_THROW(ValueError, "load_checkpoint: '", path, "' (a checkpoint of ", saved, "): ", e.message());
  }
  if (scaler != nullptr) scaler->load_state_dict(scaler_state);
  default_generator().set_state(rng_seed, rng_offset);
  return loaded;
}

}  // namespace tandem::train
