#pragma once
// What a training precision name (--precision f32|tf32|bf16|fp16) means in tandem, in one place:
//
//   name   model dtype   f32 matmuls     optimizer masters   loss scaling
//   f32    f32           full f32        no                  no
//   tf32   f32           TF32 (GPUs)     no                  no
//   bf16   bf16          full f32        f32                 no
//   fp16   f16           full f32        f32                 GradScaler
//
// The model dtype is that of parameters, activations and input batches. The optimizers keep f32
// master weights and moments for every 16-bit parameter by themselves (optim/optimizer.h); the
// policy records it so programs can say so. Only fp16 needs loss scaling: bf16 has f32's range.
//
//   const train::PrecisionPolicy precision = train::PrecisionPolicy::parse(cfg.precision);
//   precision.apply(*model);                          // model dtype, matmul precision
//   amp::GradScaler scaler(device, precision.grad_scaler_options());
#include <string>
#include <vector>

#include "tandem/amp/grad_scaler.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/dtype.h"
#include "tandem/layers/module.h"

namespace tandem::train {

struct PrecisionPolicy {
  std::string name;                // f32, tf32, bf16 or fp16
  DType model_dtype;               // parameters, activations and input batches
  cuda::MatmulPrecision matmul;    // f32 matrix products: highest (full f32) or high (TF32)
  bool master_weights;             // the optimizer keeps f32 masters of 16-bit parameters
  bool grad_scaler;                // dynamic loss scaling (amp::GradScaler) is needed

  // The policy of a precision name; any other name is a ValueError listing the valid ones.
  static PrecisionPolicy parse(const std::string& name);
  // The valid names, for command-line checks: f32, tf32, bf16, fp16.
  static const std::vector<std::string>& names();

  // Sets the process's matmul precision (for every policy: f32 must not inherit an earlier TF32)
  // and casts the model's floating parameters and buffers to model_dtype.
  void apply(nn::Module& model) const;
  // GradScaler options with `enabled` set by grad_scaler (a disabled scaler is a pass-through).
  amp::GradScalerOptions grad_scaler_options() const;
};

}  // namespace tandem::train
