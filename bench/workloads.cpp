#include "workloads.h"

#include "tandem/core/random.h"
#include "tandem/layers/layers.h"
#include "tandem/models/resnet.h"

namespace tandem::bench {

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"mlp", "gpt2", "resnet18"};
  return names;
}

int64_t default_batch(const std::string& name) {
  if (name == "mlp") return 1024;
  if (name == "gpt2") return 8;
  if (name == "resnet18") return 256;
  TANDEM_THROW(ValueError, "unknown workload '", name, "': expected mlp, gpt2 or resnet18");
}

int64_t WorkloadOptions::batch_or_default() const { return batch > 0 ? batch : default_batch(name); }

namespace {
std::shared_ptr<nn::Module> make_mlp(const WorkloadOptions& options, Device device) {
  const std::vector<int64_t>& widths = options.mlp_widths;
  TANDEM_CHECK_AS(ValueError, widths.size() >= 2, "mlp: needs at least two widths, got ", widths.size());
  // 58.7M parameters at the default widths, GELU (tanh) between the layers, as one gelu_mlp op
  return std::make_shared<nn::GeluMlp>(widths, true, TensorOptions(DType::f32, device));
}
}  // namespace

std::shared_ptr<nn::Module> make_model(const WorkloadOptions& options, Device device) {
  const TensorOptions f32(DType::f32, device);
  TANDEM_CHECK_AS(ValueError, !options.channels_last || options.name == "resnet18",
                  "channels-last applies to the resnet18 workload only (its convolutions), not to ", options.name);
  if (options.name == "mlp") return make_mlp(options, device);
  if (options.name == "gpt2") return std::make_shared<models::GPT2>(options.gpt2, f32);
  if (options.name == "resnet18") {
    const MemoryFormat format = options.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
    return std::make_shared<models::ResNet18>(options.num_classes, f32, format);
  }
  TANDEM_THROW(ValueError, "unknown workload '", options.name, "': expected mlp, gpt2 or resnet18");
}

Batch make_batch(const WorkloadOptions& options, DType dtype, Device device) {
  const int64_t B = options.batch_or_default();
  const TensorOptions data(dtype, device), ids(DType::i64, device);
  if (options.name == "mlp") {
    Tensor x = randn({B, options.mlp_widths.front()}, data);      // (B, 1024) inputs
    Tensor target = randn({B, options.mlp_widths.back()}, data);  // (B, 1024) targets
    return {x, target};
  }
  if (options.name == "gpt2") {
    const int64_t T = options.seq_len_or_default();
    TANDEM_CHECK_AS(ValueError, T <= options.gpt2.block_size, "gpt2: sequence length ", T,
                    " is longer than the block size ", options.gpt2.block_size);
    Tensor idx = randint(0, options.gpt2.vocab_size, {B, T}, ids);     // (B, T) token ids
    Tensor target = randint(0, options.gpt2.vocab_size, {B, T}, ids);  // (B, T) next-token ids
    return {idx, target};
  }
  if (options.name == "resnet18") {
    const int64_t S = options.image_size;
    Tensor images = randn({B, 3, S, S}, data);                  // (B, 3, S, S)
    Tensor labels = randint(0, options.num_classes, {B}, ids);  // (B,)
    // The same values either way; channels-last only changes where they lie.
    if (options.channels_last) images = images.contiguous(MemoryFormat::channels_last);  // strides (3SS, 1, 3S, 3)
    return {images, labels};
  }
  TANDEM_THROW(ValueError, "unknown workload '", options.name, "': expected mlp, gpt2 or resnet18");
}

Tensor workload_loss(const std::string& name, const Forward& forward, const Batch& batch) {
  if (name == "mlp") {
    // mse_loss takes 16-bit operands in f32 and returns an f32 loss, as torch.autocast runs it.
    return mse_loss(forward(batch.input), batch.target);
  }
  // Cross-entropy of 16-bit logits is computed and returned in f32.
  if (name == "gpt2") return models::GPT2::loss(forward(batch.input), batch.target);
  if (name == "resnet18") return cross_entropy(forward(batch.input), batch.target);
  TANDEM_THROW(ValueError, "unknown workload '", name, "': expected mlp, gpt2 or resnet18");
}

}  // namespace tandem::bench
