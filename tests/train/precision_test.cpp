// The precision policy: what each --precision name means, and the error for an unknown one.
#include "support/test_util.h"
#include "tandem/layers/layers.h"
#include "tandem/train/precision.h"

namespace tandem::train {
namespace {

TEST(PrecisionPolicy, EachNameMeansOneDtypeMatmulModeAndScaling) {
  PrecisionPolicy f32 = PrecisionPolicy::parse("f32"), tf32 = PrecisionPolicy::parse("tf32");
  PrecisionPolicy bf16 = PrecisionPolicy::parse("bf16"), fp16 = PrecisionPolicy::parse("fp16");
  EXPECT_EQ(f32.model_dtype, DType::f32);
  EXPECT_EQ(f32.matmul, cuda::MatmulPrecision::highest);
  EXPECT_FALSE(f32.master_weights || f32.grad_scaler);
  EXPECT_EQ(tf32.model_dtype, DType::f32);
  EXPECT_EQ(tf32.matmul, cuda::MatmulPrecision::high);
  EXPECT_EQ(bf16.model_dtype, DType::bf16);
  EXPECT_TRUE(bf16.master_weights);
  EXPECT_FALSE(bf16.grad_scaler);
  EXPECT_EQ(fp16.model_dtype, DType::f16);
  EXPECT_TRUE(fp16.master_weights && fp16.grad_scaler);
  EXPECT_TRUE(fp16.grad_scaler_options().enabled);
  EXPECT_FALSE(bf16.grad_scaler_options().enabled);
  EXPECT_EQ(PrecisionPolicy::names().size(), 4u);
}

TEST(PrecisionPolicy, UnknownNameListsTheValidOnes) {
  EXPECT_TRUE(testing::throws_with<ValueError>([] { PrecisionPolicy::parse("fp8"); },
                                               {"'fp8'", "f32, tf32, bf16 or fp16"}));
}

TEST(PrecisionPolicy, ApplyCastsTheModel) {
  nn::Linear model(3, 2);
  PrecisionPolicy::parse("bf16").apply(model);
  EXPECT_EQ(model.weight.dtype(), DType::bf16);
  EXPECT_EQ(model.bias.dtype(), DType::bf16);
  PrecisionPolicy::parse("f32").apply(model);
  EXPECT_EQ(model.weight.dtype(), DType::f32);
}

}  // namespace
}  // namespace tandem::train
