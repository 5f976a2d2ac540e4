#pragma once
// A step profile (dist/scaling_model.h) measured in place and kept as JSON: forward, backward and
// optimizer durations, and when each parameter's gradient was accumulated during backward, from
// one step recorded by a dist::Timeline. bench/train_step --profile writes it; bench/scaling_model
// and DDP's bucket planner read it.
//
// JSON: {"format": "tandem step profile 1", "workload", "precision", "device", "commit", "source",
//        "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
//        "gradients": [{"param_index", "name", "numel", "element_bytes", "ready_ms"}, ...]}
// with the gradients in the order backward produced them.
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "tandem/dist/scaling_model.h"
#include "tandem/dist/timeline.h"
#include "tandem/layers/module.h"

namespace tandem::bench {

// Hooks on a module's parameters (those that require grad, indexed as DDP indexes them) that mark
// each gradient's accumulation on a timeline while `active` is set.
class GradientMarks {
 public:
  GradientMarks(nn::Module& module, dist::Timeline& timeline);
  // Runs `step` once while the timeline records (spans "forward + loss", "backward", "optimizer"
  // expected from it) and turns the spans into a profile; step_ms is the recorded step's length.
  dist::scaling::StepProfile profile(const std::function<void()>& step);

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  dist::Timeline& timeline_;
  std::shared_ptr<bool> active_;
};

// A JSON file, or a ValueError naming the file and what was wrong.
nlohmann::json read_json_file(const std::string& path);

nlohmann::ordered_json profile_to_json(const dist::scaling::StepProfile& profile);
dist::scaling::StepProfile profile_from_json(const nlohmann::json& json, const std::string& where);
dist::scaling::StepProfile read_profile(const std::string& path);
void write_profile(const dist::scaling::StepProfile& profile, const std::string& path);

}  // namespace tandem::bench
