#include "step_profile.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "tandem/core/error.h"

namespace tandem::bench {

namespace {
constexpr const char* kFormat = "tandem step profile 1";
const std::string kMark = "gradient ";  // + the parameter index
}  // namespace

GradientMarks::GradientMarks(nn::Module& module, dist::Timeline& timeline)
    : timeline_(timeline), active_(std::make_shared<bool>(false)) {
  for (auto& [name, p] : module.named_parameters()) {
    if (p.requires_grad()) params_.emplace_back(name, p);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    // A zero-length compute span: its start is when the gradient was accumulated on the stream.
    params_[i].second.register_post_accumulate_grad_hook([active = active_, &timeline, i](const Tensor&) {
      if (!*active) return;
      timeline.begin(kMark + std::to_string(i));
      timeline.end();
    });
  }
}

dist::scaling::StepProfile GradientMarks::profile(const std::function<void()>& step) {
  *active_ = true;
  timeline_.start();
  timeline_.begin("step");
  step();
  timeline_.end();
  timeline_.stop();
  *active_ = false;

  dist::scaling::StepProfile out;
  double backward_start = -1;
  std::vector<std::pair<double, int64_t>> marks;  // (start us, parameter index)
  for (const dist::TimelineSpan& s : timeline_.spans()) {
    if (s.track != "compute") continue;
    double ms = s.duration_us / 1e3;
    if (s.name == "step") out.step_ms = ms;
    if (s.name == "forward + loss") out.forward_ms += ms;
    if (s.name == "optimizer") out.optimizer_ms += ms;
    if (s.name == "backward") {
      out.backward_ms += ms;
      if (backward_start < 0) backward_start = s.start_us;
    }
    if (s.name.rfind(kMark, 0) == 0) marks.emplace_back(s.start_us, std::stoll(s.name.substr(kMark.size())));
  }
  TANDEM_CHECK_AS(ValueError, backward_start >= 0, "step profile: the step recorded no \"backward\" span");
  // A parameter accumulated twice in one backward (gradient accumulation inside the step) is ready
  // at its last accumulation.
  std::map<int64_t, double> last;
  for (const auto& [start_us, index] : marks) last[index] = std::max(last[index], start_us);
  marks.clear();
  for (const auto& [index, start_us] : last) marks.emplace_back(start_us, index);
  std::stable_sort(marks.begin(), marks.end());
  for (const auto& [start_us, index] : marks) {
    const Tensor& p = params_[index].second;
    out.gradients.push_back({index, params_[index].first, p.numel(), static_cast<int64_t>(dtype_size(p.dtype())),
                             std::max(0.0, (start_us - backward_start) / 1e3)});
  }
  return out;
}

nlohmann::ordered_json profile_to_json(const dist::scaling::StepProfile& profile) {
  nlohmann::ordered_json gradients = nlohmann::ordered_json::array();
  for (const auto& g : profile.gradients) {
    gradients.push_back({{"param_index", g.param_index},
                         {"name", g.name},
                         {"numel", g.numel},
                         {"element_bytes", g.element_bytes},
                         {"ready_ms", g.ready_ms}});
  }
  return {{"format", kFormat},
          {"workload", profile.workload},
          {"precision", profile.precision},
          {"device", profile.device},
          {"commit", profile.commit},
          {"source", profile.source},
          {"step_ms", profile.step_ms},
          {"forward_ms", profile.forward_ms},
          {"backward_ms", profile.backward_ms},
          {"optimizer_ms", profile.optimizer_ms},
          {"gradients", gradients}};
}

dist::scaling::StepProfile profile_from_json(const nlohmann::json& j, const std::string& where) {
  TANDEM_CHECK_AS(ValueError, j.is_object() && j.value("format", "") == kFormat, where,
                  ": not a step profile (expected \"format\": \"", kFormat, "\")");
  dist::scaling::StepProfile p;
  try {
    p.workload = j.value("workload", "");
    p.precision = j.value("precision", "");
    p.device = j.value("device", "");
    p.commit = j.value("commit", "");
    p.source = j.value("source", "");
    p.step_ms = j.at("step_ms").get<double>();
    p.forward_ms = j.at("forward_ms").get<double>();
    p.backward_ms = j.at("backward_ms").get<double>();
    p.optimizer_ms = j.at("optimizer_ms").get<double>();
    for (const auto& g : j.at("gradients")) {
      p.gradients.push_back({g.at("param_index").get<int64_t>(), g.value("name", ""), g.at("numel").get<int64_t>(),
                             g.at("element_bytes").get<int64_t>(), g.at("ready_ms").get<double>()});
    }
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(ValueError, where, ": malformed step profile: ", e.what());
  }
  TANDEM_CHECK_AS(ValueError, p.step_ms > 0 && p.backward_ms > 0 && !p.gradients.empty(), where,
                  ": a profile needs step_ms > 0, backward_ms > 0 and gradients; got step ", p.step_ms,
                  " ms, backward ", p.backward_ms, " ms, ", p.gradients.size(), " gradients");
  return p;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK_AS(ValueError, in.good(), "cannot read ", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(ValueError, path, ": not JSON: ", e.what());
  }
  return j;
}

dist::scaling::StepProfile read_profile(const std::string& path) {
  return profile_from_json(read_json_file(path), path);
}

void write_profile(const dist::scaling::StepProfile& profile, const std::string& path) {
  std::ofstream out(path);
  TANDEM_CHECK_AS(ValueError, out.good(), "cannot write the step profile ", path);
  out << profile_to_json(profile).dump(1) << "\n";
}

}  // namespace tandem::bench
