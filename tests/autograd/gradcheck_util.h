#pragma once
// Shared by the gradcheck tests: EXPECT_GRADCHECK(fn, inputs[, options]) runs gradcheck and fails
// the test with the checker's message (input, element, analytic and numeric values).
#include <functional>
#include <vector>

#include "support/test_util.h"

namespace tandem::testing {

using Inputs = std::vector<Tensor>;

inline ::testing::AssertionResult gradcheck_passes(const std::function<Tensor(const Inputs&)>& fn, const Inputs& inputs,
                                                   const GradcheckOptions& options = {}) {
  GradcheckResult r = gradcheck(fn, inputs, options);
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.message;
}

}  // namespace tandem::testing

// Variadic so that lambdas with commas in their captures need no extra parentheses.
#define EXPECT_GRADCHECK(...) EXPECT_TRUE(::tandem::testing::gradcheck_passes(__VA_ARGS__))
