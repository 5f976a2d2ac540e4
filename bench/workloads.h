#pragma once
// The benchmark workloads of bench/train_step and bench/parity: a model, a batch of synthetic
// inputs drawn once, and the loss. bench/reference/train_step.py defines the same three in PyTorch
// (same shapes, names, initialisation recipes and losses):
//   mlp       1024 -> 4096 -> 4096 -> 4096 -> 4096 -> 1024, GELU (tanh), MSE against a random
//             target; batch 1024
//   gpt2      GPT-2 124M (models/gpt2.h): cross-entropy of next-token logits against random token
//             ids; batch 8 sequences of 1024 tokens
//   resnet18  ResNet-18 for 3x32x32 images (models/resnet.h), 10 classes, cross-entropy against
//             random labels; batch 256
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/layers/module.h"
#include "tandem/models/gpt2.h"

namespace tandem::bench {

// What defines a workload's model and batch. The defaults are the benchmark's; the parity check
// shrinks them for a quick run on the CPU.
struct WorkloadOptions {
  std::string name = "mlp";  // mlp, gpt2 or resnet18
  int64_t batch = 0;         // samples (gpt2: sequences) per step; 0: the workload's default
  int64_t seq_len = 0;       // gpt2: tokens per sequence; 0: gpt2.block_size
  std::vector<int64_t> mlp_widths = {1024, 4096, 4096, 4096, 4096, 1024};
  models::GPT2Config gpt2;
  int64_t num_classes = 10;  // resnet18
  int64_t image_size = 32;   // resnet18: images are (3, image_size, image_size)
  // resnet18 only: the model's convolution weights and the images channels-last (as PyTorch's
  // model.to(memory_format=torch.channels_last) and images.to(memory_format=...)).
  bool channels_last = false;

  int64_t batch_or_default() const;
  int64_t seq_len_or_default() const { return seq_len > 0 ? seq_len : gpt2.block_size; }
  // Tokens per sample for gpt2 (throughput in tokens/s); 1 for the others.
  int64_t tokens_per_sample() const { return name == "gpt2" ? seq_len_or_default() : 1; }
};

const std::vector<std::string>& workload_names();  // mlp, gpt2, resnet18
int64_t default_batch(const std::string& name);    // 1024, 8, 256

// The model in f32 on `device`, initialised from the default generator. Throws for
// channels_last with a workload other than resnet18.
std::shared_ptr<nn::Module> make_model(const WorkloadOptions& options, Device device);

// One step's data. input: mlp (B, 1024) / resnet18 (B, 3, 32, 32) in the model's dtype, gpt2
// (B, T) i64 token ids; target: mlp (B, 1024) in the model's dtype, gpt2 (B, T) i64 token ids,
// resnet18 (B,) i64 labels. resnet18's images are channels-last under options.channels_last.
struct Batch {
  Tensor input;
  Tensor target;
};

// A batch drawn from the default generator: normal inputs and MSE targets, token ids and labels
// uniform over the vocabulary / classes.
Batch make_batch(const WorkloadOptions& options, DType dtype, Device device);

// The model's forward: the model itself, or DistributedDataParallel around it.
using Forward = std::function<Tensor(const Tensor&)>;
// The workload's loss on `batch`: () f32 for every dtype, with the graph back to the parameters.
Tensor workload_loss(const std::string& name, const Forward& forward, const Batch& batch);

}  // namespace tandem::bench
