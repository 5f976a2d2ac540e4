#pragma once
// Training checkpoints: a model's parameters and buffers, an optimizer's state, and the position
// in training (epoch, step, the default generator's state) in one safetensors file, written to
// a temporary file and renamed, so a crash never leaves a half-written checkpoint (and a killed
// save leaves no temporary file behind: core/temp_files.h). Model tensors are stored under their
// own names ("fc.weight"), so the file also loads as a plain state dict in PyTorch and Hugging Face
// tools; optimizer tensors under "optimizer/<key>". A GradScaler's state (scale, growth tracker
// and options) goes into the metadata as "grad_scaler.<key>".
//
// Metadata keys written: format, epoch, step, rng_seed, rng_offset, optimizer, optimizer.<key>,
// grad_scaler.<key>, and every key of `extra`. Two keys of `extra` have a meaning on load:
// "model" (a name for the architecture) and "precision" (a train::PrecisionPolicy name); when the
// loading program names others, the load stops and says both ("this checkpoint is of model mlp
// in f32; you asked for cnn in bf16").
//
//   train::save_checkpoint(path, model, &optimizer, position, {{"model", "mlp"}, {"precision", "bf16"}});
//   train::LoadedCheckpoint c = train::load_checkpoint(path, model, &optimizer, nullptr, {"mlp", "bf16"});
#include <map>
#include <string>

#include "tandem/amp/grad_scaler.h"
#include "tandem/layers/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem::train {

struct TrainingPosition {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken
};

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const TrainingPosition& position, const std::map<std::string, std::string>& extra = {},
                     const amp::GradScaler* scaler = nullptr);

struct LoadOptions {
  // What the loading program built. When the checkpoint records another "model" or "precision",
  // the load is refused naming both. Empty: not compared.
  std::string model;
  std::string precision;
  // A model tensor stored in another dtype than the model's is refused (naming the tensor and both
  // dtypes) unless this is set, for a deliberate conversion (e.g. f32 weights into a bf16 model).
  bool convert_dtypes = false;
};

struct LoadedCheckpoint {
  std::string path;
  TrainingPosition position;
  std::map<std::string, std::string> metadata;  // everything stored, including `extra`

  // Metadata as checked numbers: a missing key, a value that is not a whole number or one outside
  // [min, max] is a ValueError naming the key, the value, the range and the file.
  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  // The metadata value of `key`, or `fallback` when it is not there.
  std::string text(const std::string& key, const std::string& fallback = "") const;
};

// Restores the model (strictly: every name, shape and dtype must match), the optimizer and the
// scaler if given, and the default generator's state; returns the position to continue from.
// Every metadata number is checked before anything is changed (epoch and step must be >= 0).
LoadedCheckpoint load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer,
                                 amp::GradScaler* scaler = nullptr, const LoadOptions& options = {});

}  // namespace tandem::train
