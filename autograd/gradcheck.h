#pragma once
// Checks an op's backward against central finite differences, in f64.
#include <functional>
#include <string>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
  uint64_t seed = 1234;  // for the random projection of non-scalar outputs
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, both values
  explicit operator bool() const { return ok; }
};

// fn maps the inputs to one output. Non-scalar outputs are projected onto a fresh random
// direction w (L = sum(fn(x) * w)), which checks w^T J for every input element. Inputs must be f64
// tensors that require grad; they may be non-contiguous views (elements are perturbed in place).
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace tandem
