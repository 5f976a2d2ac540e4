// Training checkpoints: what a round trip restores, and the errors for metadata, dtypes and runs
// that do not match, each naming the key or tensor, the value and what was expected.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/safetensors.h"
#include "tandem/layers/layers.h"
#include "tandem/optim/adamw.h"
#include "tandem/train/checkpoint.h"

namespace tandem::train {
namespace {

using testing::throws_with;

std::string temp_path(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          (stem + "_" + std::to_string(::getpid()) + "_" + std::to_string(testing::next_seed()) + ".safetensors"))
      .string();
}

// A checkpoint of a trained Linear(4, 3) with AdamW, recorded as model "mlp" in "f32".
class CheckpointFile : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(testing::next_seed());
    path = temp_path("tandem_ckpt");
    nn::Linear a(4, 3);
    optim::AdamW adamw(a.parameters(), optim::AdamWOptions{1e-2});
    sum(a.forward(testing::random_tensor({2, 4}, DType::f32))).backward();
    adamw.step();
    save_checkpoint(path, a, &adamw, {2, 7}, {{"model", "mlp"}, {"precision", "f32"}});
  }
  void TearDown() override { std::remove(path.c_str()); }

  // Rewrites the file with one metadata entry changed ("" value: removed).
  void set_metadata(const std::string& key, const std::string& value) {
    SafetensorsFile file = load_safetensors(path);
    if (value.empty()) file.metadata.erase(key);
    else file.metadata[key] = value;
    save_safetensors(path, file.tensors, file.metadata);
  }
  LoadedCheckpoint load(const LoadOptions& options = {}) {
    nn::Linear b(4, 3);
    optim::AdamW adamw(b.parameters(), optim::AdamWOptions{1e-2});
    return load_checkpoint(path, b, &adamw, nullptr, options);
  }

  std::string path;
};

TEST_F(CheckpointFile, RestoresThePositionAndMetadata) {
  LoadedCheckpoint c = load({"mlp", "f32"});
  EXPECT_EQ(c.position.epoch, 2);
  EXPECT_EQ(c.position.step, 7);
  EXPECT_EQ(c.text("model"), "mlp");
  EXPECT_EQ(c.text("absent", "fallback"), "fallback");
  EXPECT_EQ(c.integer("epoch", 0, 10), 2);
}

TEST_F(CheckpointFile, MetadataThatIsNotANumberNamesKeyValueAndFile) {
  set_metadata("epoch", "abc");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'epoch'", "\"abc\"", path, "whole number"}));
  set_metadata("epoch", "1");
  set_metadata("step", "12x");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'step'", "\"12x\"", path}));
  set_metadata("step", "3");
  set_metadata("optimizer.lr", "fast");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'optimizer.lr'", "\"fast\"", path, "finite number"}));
  set_metadata("optimizer.lr", "0.01");
  set_metadata("rng_offset", "-3");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'rng_offset'", "\"-3\"", path}));
}

TEST_F(CheckpointFile, NegativeEpochOrStepIsRefusedOnLoad) {
  set_metadata("epoch", "-5");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'epoch'", "\"-5\"", "from 0 to", path}));
  set_metadata("epoch", "0");
  set_metadata("step", "-1");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"'step'", "\"-1\"", "from 0 to", path}));
}

TEST_F(CheckpointFile, MissingMetadataNamesTheKey) {
  set_metadata("rng_seed", "");
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"no 'rng_seed' entry", path}));
}

TEST_F(CheckpointFile, CheckedIntegerSaysTheRange) {
  LoadedCheckpoint c = load();
  EXPECT_TRUE(throws_with<ValueError>([&] { c.integer("epoch", 5, 9); }, {"'epoch'", "\"2\"", "from 5 to 9"}));
}

TEST_F(CheckpointFile, RefusesATensorOfAnotherDtypeNamingBoth) {
  SafetensorsFile file = load_safetensors(path);
  file.tensors["weight"] = kernels::to_dtype(file.tensors["weight"], DType::i32);
  save_safetensors(path, file.tensors, file.metadata);
  EXPECT_TRUE(throws_with<TypeError>([&] { load(); }, {"'weight'", "stored as i32", "model's is f32", path}));
  LoadOptions convert;
  convert.convert_dtypes = true;
  EXPECT_NO_THROW(load(convert));  // a deliberate conversion
}

TEST_F(CheckpointFile, ANetworkOrPrecisionMismatchNamesBothRuns) {
  EXPECT_TRUE(throws_with<ValueError>(
      [&] { load({"cnn", "bf16"}); },
      {path, "this checkpoint is of model mlp in f32; you asked for model cnn in bf16"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { load({"mlp", "fp16"}); }, {"model mlp in f32", "model mlp in fp16"}));
}

TEST_F(CheckpointFile, AStateMismatchSaysWhatTheCheckpointWasSavedFrom) {
  SafetensorsFile file = load_safetensors(path);
  file.tensors.erase("bias");
  save_safetensors(path, file.tensors, file.metadata);
  EXPECT_TRUE(throws_with<ValueError>([&] { load(); }, {"a checkpoint of model mlp in f32", "'bias' is missing"}));
}

// A bf16 model's checkpoint carries the optimizer's f32 masters and the scaler's state.
TEST(Checkpoint, CarriesMastersAndTheScaler) {
  const std::string path = temp_path("tandem_amp_ckpt");
  manual_seed(5);
  nn::Linear a(4, 3, true, DType::bf16);
  optim::AdamW adamw(a.parameters(), optim::AdamWOptions{1e-2});
  amp::GradScalerOptions options;
  options.init_scale = 128.0;
  amp::GradScaler scaler(Device(), options);
  Tensor x = kernels::to_dtype(testing::random_tensor({2, 4}), DType::bf16);
  scaler.scale(sum(a.forward(x))).backward();
  scaler.step(adamw);
  scaler.update();
  save_checkpoint(path, a, &adamw, {0, 1}, {}, &scaler);

  nn::Linear b(4, 3, true, DType::bf16);
  optim::AdamW adamw_b(b.parameters(), optim::AdamWOptions{1e-2});
  amp::GradScaler scaler_b{Device()};
  load_checkpoint(path, b, &adamw_b, &scaler_b);
  std::remove(path.c_str());
  EXPECT_EQ(scaler_b.get_scale(), 128.0);
  EXPECT_EQ(scaler_b.get_growth_tracker(), 1);
  optim::StateDict sa = adamw.state_dict(), sb = adamw_b.state_dict();
  EXPECT_TRUE(testing::all_close(sb.tensors.at("state.0.master"), sa.tensors.at("state.0.master"), 0.0, 0.0));
  EXPECT_EQ(sb.metadata.at("state.0.step"), 1.0);
}

}  // namespace
}  // namespace tandem::train
