#pragma once
// Training checkpoints: a model's parameters and buffers, an optimizer's state, and the position
// in training (epoch, step, the default generator's state) in one safetensors file, written to
// a temporary file and renamed, so a crash never leaves a half-written checkpoint. Model tensors
// are stored under their own names ("fc.weight"), so the file also loads as a plain state dict in
// PyTorch and Hugging Face tools; optimizer tensors under "optimizer/<key>". A GradScaler's
// state (scale, growth tracker and options) goes into the metadata as "grad_scaler.<key>".
#include <map>
#include <string>

#include "tandem/amp/grad_scaler.h"
#include "tandem/layers/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

struct TrainingPosition {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken
};

void save_checkpoint(const std::string& path, const nn::Module& model, const Optimizer* optimizer,
                     const TrainingPosition& position, const std::map<std::string, std::string>& extra = {},
                     const amp::GradScaler* scaler = nullptr);

struct LoadedCheckpoint {
  TrainingPosition position;
  std::map<std::string, std::string> metadata;  // everything stored, including `extra`
};
// Restores the model (strictly: every name and shape must match), the optimizer and the scaler if
// given, and the default generator's state; returns the position to continue from.
LoadedCheckpoint load_checkpoint(const std::string& path, nn::Module& model, Optimizer* optimizer,
                                 amp::GradScaler* scaler = nullptr);

}  // namespace tandem::optim
