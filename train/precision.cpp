#include "tandem/train/precision.h"

#include "tandem/core/error.h"

namespace tandem::train {

PrecisionPolicy PrecisionPolicy::parse(const std::string& name) {
  using cuda::MatmulPrecision;
  if (name == "f32") return {name, DType::f32, MatmulPrecision::highest, false, false};
  if (name == "tf32") return {name, DType::f32, MatmulPrecision::high, false, false};
  if (name == "bf16") return {name, DType::bf16, MatmulPrecision::highest, true, false};
  if (name == "fp16") return {name, DType::f16, MatmulPrecision::highest, true, true};
  TANDEM_THROW(ValueError, "unknown precision '", name, "': expected f32, tf32, bf16 or fp16");
}

const std::vector<std::string>& PrecisionPolicy::names() {
  static const std::vector<std::string> all = {"f32", "tf32", "bf16", "fp16"};
  return all;
}

void PrecisionPolicy::apply(nn::Module& model) const {
  cuda::set_matmul_precision(matmul);
  model.to(model_dtype);
}

amp::GradScalerOptions PrecisionPolicy::grad_scaler_options() const {
  amp::GradScalerOptions options;
  options.enabled = grad_scaler;
  return options;
}

}  // namespace tandem::train
