// The scaling model's command line (dist/scaling_model.h, dist/bucket_plan.h):
//
//   scaling_model --validate                 replay every measured multi-GPU run kept in docs/scaling/
//   scaling_model --calibrate                refit the free parameters on the two runs named in
//                                            docs/scaling/model_parameters.json, and write them there
//   scaling_model --bound RUN,RUN            the smallest worst error any parameter values give these runs
//                                            together, and their errors with the link alone
//   scaling_model --predict --workload gpt2 --gpus 8,64,1024 --topology nvlink8-ib8x400 [--bucket-mb auto]
//   scaling_model --curves curves.json       every workload x topology x N (1..1024), auto and 25 MB
//   ... --allreduce allreduce.txt            the link inside a host fitted to bench/allreduce's output
//
// Profiles come from docs/scaling/profiles/<workload>_<precision>.json unless --profile names one.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "step_profile.h"
#include "tandem/core/error.h"
#include "tandem/dist/bucket_plan.h"
#include "tandem/dist/scaling_model.h"

using namespace tandem;
using namespace tandem::dist;
using namespace tandem::dist::scaling;

namespace {

nlohmann::json read_json(const std::string& path) { return bench::read_json_file(path); }

ModelParameters read_parameters(const std::string& path) {
  nlohmann::json j = read_json(path);
  ModelParameters p;
  p.compute_slowdown = j.at("compute_slowdown").get<double>();
  p.bucket_overhead_us = j.at("bucket_overhead_us").get<double>();
  p.sync_share = j.at("sync_share").get<double>();
  p.comm_slowdown = j.value("comm_slowdown", 0.0);
  return p;
}

// A bucket setting as the scaling study names it: a cap in MB, "one" (a single bucket) or "auto".
struct Setting {
  std::string bucket = "25";
  double first_mb = 1.0;
  std::string comm_dtype = "same";  // same, f32, bf16
  bool overlap = true;
  bool overlap_optimizer = true;
  int zero_stage = 0;
  std::vector<std::vector<int64_t>> recorded_plan;  // a run's own buckets (parameter indices), if it kept them
};

struct Plan {
  ProfilePlan plan;
  std::string label;
};

Plan plan_for(const StepProfile& profile, const Setting& s, const SimulationOptions& sim) {
  if (!s.recorded_plan.empty()) {         // the buckets the run itself used (e.g. the planner's at run time)
    std::map<int64_t, int64_t> position;  // parameter index -> profile index
    for (size_t i = 0; i < profile.gradients.size(); ++i) position[profile.gradients[i].param_index] = int64_t(i);
    ProfilePlan plan;
    for (const auto& b : s.recorded_plan) {
      std::vector<int64_t> local;
      for (int64_t p : b) {
        TANDEM_CHECK_AS(ValueError, position.count(p), "a recorded plan names parameter ", p,
                        ", which the profile of '", profile.workload, "' does not have");
        local.push_back(position.at(p));
      }
      plan.push_back(local);
    }
    return {plan, "recorded plan"};
  }
  if (s.bucket == "auto") {
    BucketPlan auto_plan = plan_buckets(profile, sim);
    std::map<int64_t, int64_t> position;  // parameter index -> profile index
    for (size_t i = 0; i < profile.gradients.size(); ++i) position[profile.gradients[i].param_index] = int64_t(i);
    ProfilePlan plan;
    for (const auto& b : auto_plan.buckets) {
      std::vector<int64_t> local;
      for (int64_t p : b) local.push_back(position.at(p));
      plan.push_back(local);
    }
    return {plan, "auto: " + auto_plan.chosen};
  }
  if (s.bucket == "one") return {plan_for_cap(profile, 1e6, 1e6), "one bucket"};
  char* end = nullptr;
  double cap = std::strtod(s.bucket.c_str(), &end);
  TANDEM_CHECK_AS(ValueError, end && *end == '\0' && cap > 0,
                  "--bucket-mb: expected a positive number of MB, one or auto, got '", s.bucket, "'");
  return {plan_for_cap(profile, cap, s.first_mb), s.bucket + " MB"};
}

SimulationOptions options_for(const Setting& s, int gpus, const Topology& topo, const ModelParameters& par) {
  SimulationOptions o;
  o.gpus = gpus;
  o.topology = topo;
  o.parameters = par;
  o.overlap = s.overlap;
  o.overlap_optimizer = s.overlap_optimizer;
  o.zero_stage = s.zero_stage;
  if (s.comm_dtype == "bf16") o.comm_element_bytes = 2;
  if (s.comm_dtype == "f32") o.comm_element_bytes = 4;
  return o;
}

// One measured run of docs/scaling/measured_runs.json.
struct Run {
  std::string id, date, commit, workload, precision, profile_path, topology;
  int gpus = 1;
  Setting setting;
  double step_ms_1gpu = 0, step_ms = 0, comm_ms = -1;
  double step_ms_min = 0;  // the fastest timed step, where kept
  std::string excluded;    // why the statistics leave this run out (its error is still printed)
  double efficiency() const { return step_ms_1gpu / step_ms; }
};

std::vector<Run> read_runs(const std::string& docs) {
  nlohmann::json j = read_json(docs + "/measured_runs.json");
  std::vector<Run> runs;
  for (const auto& group : j.at("groups")) {
    for (const auto& r : group.at("runs")) {
      Run run;
      run.id = r.at("id").get<std::string>();
      run.date = group.at("date").get<std::string>();
      run.commit = group.at("commit").get<std::string>();
      run.topology = group.at("topology").get<std::string>();
      run.workload = r.at("workload").get<std::string>();
      run.precision = r.at("precision").get<std::string>();
      run.profile_path = docs + "/" + r.at("profile").get<std::string>();
      run.gpus = r.at("gpus").get<int>();
      run.step_ms_1gpu = r.at("step_ms_1gpu").get<double>();
      run.step_ms = r.at("step_ms").get<double>();
      run.comm_ms = r.value("comm_ms", -1.0);
      run.step_ms_min = r.value("step_ms_min", 0.0);
      run.excluded = r.value("excluded", std::string());
      run.setting.bucket = r.value("bucket", std::string("25"));
      run.setting.comm_dtype = r.value("comm_dtype", std::string("same"));
      run.setting.overlap = r.value("overlap", true);
      run.setting.overlap_optimizer = r.value("overlap_optimizer", true);
      run.setting.zero_stage = r.value("zero", 0);
      if (r.contains("plan")) run.setting.recorded_plan = r.at("plan").get<std::vector<std::vector<int64_t>>>();
      runs.push_back(run);
    }
  }
  return runs;
}

StepPrediction predict_run(const Run& run, const ModelParameters& par, std::map<std::string, StepProfile>& cache) {
  if (!cache.count(run.profile_path)) cache[run.profile_path] = bench::read_profile(run.profile_path);
  StepProfile profile = cache[run.profile_path];
  profile.step_ms = run.step_ms_1gpu;  // the run's own 1-GPU reference (the profile's spans give the shape)
  SimulationOptions sim = options_for(run.setting, run.gpus, topology_from_name(run.topology), par);
  return simulate_step(profile, plan_for(profile, run.setting, sim).plan, sim);
}

std::string setting_label(const Setting& s) {
  std::string label = s.bucket == "one" ? "one bucket" : s.bucket == "auto" ? "auto" : s.bucket + " MB";
  if (s.comm_dtype != "same") label += " " + s.comm_dtype;
  if (!s.overlap) label += " no-overlap";
  if (s.zero_stage > 0) label += " zero" + std::to_string(s.zero_stage);
  return label;
}

int validate(const std::string& docs, const std::string& params_path) {
  nlohmann::json pj = read_json(params_path);
  ModelParameters par = read_parameters(params_path);
  std::vector<std::string> calibration = pj.at("calibrated_on").get<std::vector<std::string>>();
  std::vector<Run> runs = read_runs(docs);
  std::map<std::string, StepProfile> cache;
  std::printf(
      "model parameters (%s): compute slowdown %.3f, communication slowdown %.2f, bucket overhead %.1f us, sync "
      "share %.4f\n",
      params_path.c_str(), par.compute_slowdown, par.comm_slowdown, par.bucket_overhead_us, par.sync_share);
  std::printf("%-32s %-9s %-5s %4s %-20s %8s %8s %7s %8s  %7s %7s %7s %7s %7s\n", "run", "workload", "prec", "gpus",
              "setting", "measured", "predict", "error", "fastest", "exposed", "slowdn", "ovhd", "comm", "(meas)");
  double sum = 0, worst = 0;
  int n = 0;
  for (const Run& run : runs) {
    StepPrediction p = predict_run(run, par, cache);
    double measured = 100 * run.efficiency(), predicted = 100 * run.step_ms_1gpu / p.step_ms;
    double error = predicted - measured;
    bool calib = std::find(calibration.begin(), calibration.end(), run.id) != calibration.end();
    // "fastest": the measured efficiency at the run's fastest timed step, where kept (the median's spread).
    std::string fastest = run.step_ms_min > 0 ? std::to_string(100 * run.step_ms_1gpu / run.step_ms_min) : "-";
    if (run.step_ms_min > 0) fastest = fastest.substr(0, fastest.find('.') + 2) + "%";
    char comm[16] = "-";
    if (run.comm_ms >= 0) std::snprintf(comm, sizeof comm, "%.3f", run.comm_ms);
    std::printf("%-32s %-9s %-5s %4d %-20s %7.1f%% %7.1f%% %+6.1f %8s  %7.3f %7.3f %7.3f %7.3f %7s%s\n", run.id.c_str(),
                run.workload.c_str(), run.precision.c_str(), run.gpus, setting_label(run.setting).c_str(), measured,
                predicted, error, fastest.c_str(), p.exposed_ms, p.slowdown_ms, p.overhead_ms, p.comm_ms, comm,
                calib ? "  (calibration run)" : "");
    if (!run.excluded.empty()) {
      if (run.step_ms_min > 0) {
        std::printf("  %s at its fastest step (%.2f ms): measured %.1f%%, error %+.1f\n", run.id.c_str(),
                    run.step_ms_min, 100 * run.step_ms_1gpu / run.step_ms_min,
                    predicted - 100 * run.step_ms_1gpu / run.step_ms_min);
      }
      std::printf("  %s left out of the statistics: %s\n", run.id.c_str(), run.excluded.c_str());
      continue;
    }
    if (calib) continue;
    sum += std::fabs(error);
    worst = std::max(worst, std::fabs(error));
    ++n;
  }
  std::printf("validation: %d runs, mean |error| %.2f points, worst %.2f points\n", n, n ? sum / n : 0.0, worst);
  return 0;
}

// The runs of measured_runs.json with these ids, in the file's order; every id must be there.
std::vector<Run> runs_named(const std::string& docs, const std::vector<std::string>& names, const std::string& who) {
  std::vector<Run> chosen;
  for (const Run& run : read_runs(docs)) {
    if (std::find(names.begin(), names.end(), run.id) != names.end()) chosen.push_back(run);
  }
  TANDEM_CHECK_AS(ValueError, chosen.size() == names.size(), who, ": some of the runs named are not in ", docs,
                  "/measured_runs.json");
  return chosen;
}

// Every point of the grid --calibrate searches (and --bound with it): compute slowdown 0-1.5,
// bucket overhead 0-200 us, sync share 0-10%, communication slowdown 0-1.
template <class Visit>
void for_each_grid_point(Visit visit) {
  for (double slowdown = 0; slowdown <= 1.5001; slowdown += 0.025) {
    for (double overhead = 0; overhead <= 200; overhead += 5) {
      for (double share = 0; share <= 0.1; share += 0.0025) {
        for (double comm = 0; comm <= 1.0001; comm += 0.1) visit(ModelParameters{slowdown, overhead, share, comm});
      }
    }
  }
}

// Refits the parameters on the runs named in the parameters file: a grid search for the smallest
// sum of squared step-time errors (and, where measured, the collectives' summed time, which is what
// tells the communication slowdown from the compute slowdown).
int calibrate(const std::string& docs, const std::string& params_path) {
  nlohmann::ordered_json pj = nlohmann::ordered_json::parse(read_json(params_path).dump());
  std::vector<std::string> names = pj.at("calibrated_on").get<std::vector<std::string>>();
  TANDEM_CHECK_AS(ValueError, !names.empty() && names.size() <= 2, params_path,
                  ": calibrated_on must name one or two runs, got ", names.size());
  std::vector<Run> chosen = runs_named(docs, names, params_path + ": calibrated_on");
  std::map<std::string, StepProfile> cache;
  ModelParameters best;
  double best_error = 1e300;
  for_each_grid_point([&](const ModelParameters& par) {
    double error = 0;
    for (const Run& run : chosen) {
      StepPrediction p = predict_run(run, par, cache);
      error += std::pow(p.step_ms - run.step_ms, 2);
      if (run.comm_ms >= 0) error += std::pow(p.comm_ms - run.comm_ms, 2);
    }
    if (error < best_error) best_error = error, best = par;
  });
  pj["compute_slowdown"] = best.compute_slowdown;
  pj["bucket_overhead_us"] = best.bucket_overhead_us;
  pj["sync_share"] = best.sync_share;
  pj["comm_slowdown"] = best.comm_slowdown;
  std::ofstream(params_path) << pj.dump(2) << "\n";
  std::printf(
      "calibrated on %zu runs: compute slowdown %.3f, communication slowdown %.2f, bucket overhead %.1f us, sync "
      "share %.4f (rms %.3f ms); written to %s\n",
      chosen.size(), best.compute_slowdown, best.comm_slowdown, best.bucket_overhead_us, best.sync_share,
      std::sqrt(best_error / chosen.size()), params_path.c_str());
  return 0;
}

// Whether any values of the four parameters could predict these runs together: the smallest worst
// |error| (points of efficiency) over the calibration grid, and where each run stands with the
// link alone (every parameter zero: no contention, overhead or synchronisation, only the
// collectives' own time). A diagnostic, not a fit: nothing is written.
int bound(const std::string& docs, const std::string& params_path, const std::vector<std::string>& names) {
  TANDEM_CHECK_AS(ValueError, !names.empty(), "--bound: name at least one run");
  std::vector<Run> chosen = runs_named(docs, names, "--bound");
  std::map<std::string, StepProfile> cache;
  auto error_of = [&](const Run& run, const ModelParameters& par) {
    return 100 * run.step_ms_1gpu / predict_run(run, par, cache).step_ms - 100 * run.efficiency();
  };
  ModelParameters best;
  double best_worst = 1e300;
  for_each_grid_point([&](const ModelParameters& par) {
    double worst = 0;
    for (const Run& run : chosen) {
      worst = std::max(worst, std::fabs(error_of(run, par)));
      if (worst >= best_worst) return;  // this point cannot win
    }
    best_worst = worst, best = par;
  });
  const ModelParameters current = read_parameters(params_path);
  const ModelParameters link_alone{0, 0, 0, 0};
  std::printf("%-32s %4s %8s  %7s %18s %18s\n", "run", "gpus", "measured", "error", "error, link alone",
              "error at the bound");
  for (const Run& run : chosen) {
    std::printf("%-32s %4d %7.1f%%  %+7.1f %+18.1f %+18.1f\n", run.id.c_str(), run.gpus, 100 * run.efficiency(),
                error_of(run, current), error_of(run, link_alone), error_of(run, best));
  }
  std::printf(
      "bound: %zu runs, smallest worst |error| %.2f points (compute slowdown %.3f, communication slowdown %.2f, bucket "
      "overhead %.1f us, sync share %.4f)\n",
      chosen.size(), best_worst, best.compute_slowdown, best.comm_slowdown, best.bucket_overhead_us, best.sync_share);
  return 0;
}

std::vector<int> parse_gpus(const std::string& text) {
  std::vector<int> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    int n = std::stoi(item);
    TANDEM_CHECK_AS(ValueError, n >= 1 && n <= 1 << 20, "--gpus: expected counts of at least 1, got ", item);
    out.push_back(n);
  }
  return out;
}

// The link inside a host fitted to bench/allreduce's output (its JSON lines, from one host):
// time = base + bytes * 2 (n - 1) / n / busbw by least squares over the sizes measured, from
// tandem's own times (what DDP pays). The hop latency stays as named; the base takes the rest.
Topology with_measured_link(Topology topo, const std::string& allreduce_output) {
  if (allreduce_output.empty()) return topo;
  std::ifstream in(allreduce_output);
  TANDEM_CHECK_AS(ValueError, in.good(), "cannot read ", allreduce_output);
  std::vector<double> xs, ys;  // (sizes,) bus bytes and ms
  int ranks = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("bench", "") != "allreduce") continue;
    ranks = j.at("ranks").get<int>();
    xs.push_back(j.at("bytes").get<double>() * 2.0 * (ranks - 1) / ranks);
    ys.push_back(j.at("tandem_ms").get<double>());
  }
  TANDEM_CHECK_AS(ValueError, xs.size() >= 2 && ranks >= 2, allreduce_output,
                  ": expected bench/allreduce's JSON lines for at least two sizes on 2 or more ranks, found ",
                  xs.size(), " sizes on ", ranks, " ranks");
  double n = double(xs.size()), mx = 0, my = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) mx += xs[i] / n, my += ys[i] / n;
  for (size_t i = 0; i < xs.size(); ++i) sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  double slope = sxy / sxx, intercept_us = (my - slope * mx) * 1e3;  // ms per byte, us
  TANDEM_CHECK_AS(ValueError, slope > 0, allreduce_output,
                  ": the times do not grow with the size; cannot fit a bandwidth");
  topo.intra.busbw_GBps = 1.0 / slope / 1e6;  // bytes per ms -> GB/s
  topo.base_us = std::max(0.0, intercept_us - 2.0 * (ranks - 1) * topo.intra.hop_us);
  std::printf("link inside a host from %s (%d ranks, %zu sizes): bus bandwidth %.1f GB/s, base %.1f us\n",
              allreduce_output.c_str(), ranks, xs.size(), topo.intra.busbw_GBps, topo.base_us);
  return topo;
}

int predict(const std::string& profile_path, const Topology& topo, const std::string& gpus, const Setting& setting,
            const ModelParameters& par) {
  StepProfile profile = bench::read_profile(profile_path);
  const std::string& topology = topo.name;
  std::printf("%s %s, 1-GPU step %.3f ms (profile %s, commit %s), topology %s (%d GPUs per host), buckets %s\n",
              profile.workload.c_str(), profile.precision.c_str(), profile.step_ms, profile_path.c_str(),
              profile.commit.c_str(), topology.c_str(), topo.gpus_per_host, setting_label(setting).c_str());
  std::printf("%6s %6s %8s %9s %9s %9s %9s %9s %9s  %s\n", "gpus", "hosts", "buckets", "comm ms", "exposed", "slowdown",
              "overhead", "step ms", "eff", "plan");
  for (int n : parse_gpus(gpus)) {
    SimulationOptions sim = options_for(setting, n, topo, par);
    Plan plan = plan_for(profile, setting, sim);
    StepPrediction p = simulate_step(profile, plan.plan, sim);
    std::printf("%6d %6d %8lld %9.3f %9.3f %9.3f %9.3f %9.3f %8.1f%%  %s\n", n,
                (n + topo.gpus_per_host - 1) / topo.gpus_per_host, static_cast<long long>(p.buckets), p.comm_ms,
                p.exposed_ms, p.slowdown_ms, p.overhead_ms, p.step_ms, 100 * p.efficiency(), plan.label.c_str());
  }
  return 0;
}

int curves(const std::string& docs, const std::string& out_path, const std::vector<std::string>& topologies,
           const ModelParameters& par, const std::string& allreduce_output) {
  nlohmann::ordered_json out = {{"model", "tandem scaling model"}, {"curves", nlohmann::ordered_json::array()}};
  for (const char* workload : {"gpt2", "resnet18", "mlp"}) {
    std::string path = docs + "/profiles/" + workload + "_bf16.json";
    StepProfile profile = bench::read_profile(path);
    for (const std::string& topology : topologies) {
      Topology topo = with_measured_link(topology_from_name(topology), allreduce_output);
      for (const char* bucket : {"auto", "25"}) {
        Setting s;
        s.bucket = bucket;
        nlohmann::ordered_json points = nlohmann::ordered_json::array();
        for (int n = 1; n <= 1024; n *= 2) {
          if (n > topo.gpus_per_host && topo.inter.busbw_GBps <= 0) break;
          SimulationOptions sim = options_for(s, n, topo, par);
          StepPrediction p = simulate_step(profile, plan_for(profile, s, sim).plan, sim);
          points.push_back({{"gpus", n},
                            {"step_ms", p.step_ms},
                            {"efficiency", p.efficiency()},
                            {"exposed_ms", p.exposed_ms},
                            {"slowdown_ms", p.slowdown_ms},
                            {"buckets", p.buckets}});
        }
        out["curves"].push_back({{"workload", workload},
                                 {"precision", "bf16"},
                                 {"topology", topology},
                                 {"buckets", std::string(bucket) == "auto" ? "auto" : "25 MB"},
                                 {"profile_commit", profile.commit},
                                 {"points", points}});
      }
    }
  }
  std::ofstream(out_path) << out.dump(1) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Predict DDP scaling from one GPU's step profile and a link model; validate against measured runs"};
  app.option_defaults()->always_capture_default();
  std::string docs = std::string(TANDEM_SOURCE_DIR) + "/docs/scaling";
  std::string params_path, profile_path, workload = "gpt2", precision = "bf16", topology = "nvlink8-ib8x400";
  std::string gpus = "1,2,4,8,16,32,64,128,256,512,1024", curves_path, allreduce_output;
  std::vector<std::string> topologies = {"nvlink8-ib8x400", "nvlink8-eth400", "nvlink8-eth100"};
  bool do_validate = false, do_calibrate = false, do_predict = false;
  Setting setting;
  app.add_flag("--validate", do_validate, "replay the measured runs of DOCS/measured_runs.json; last line: the errors");
  app.add_flag("--calibrate", do_calibrate, "refit the parameters on the runs named in the parameters file");
  std::vector<std::string> bound_runs;
  app.add_option("--bound", bound_runs,
                 "runs (ids, comma-separated): the smallest worst error any parameters of the grid give them together")
      ->delimiter(',');
  app.add_flag("--predict", do_predict, "print the predicted table for --workload on --gpus and --topology");
  app.add_option("--curves", curves_path, "write predicted curves of the three bf16 workloads to this JSON");
  app.add_option("--docs", docs, "where measured_runs.json, model_parameters.json and profiles/ are");
  app.add_option("--params", params_path, "the model parameters (default DOCS/model_parameters.json)");
  app.add_option("--profile", profile_path, "a step profile (train_step --profile); default DOCS/profiles/W_P.json");
  app.add_option("--workload", workload, "mlp, gpt2 or resnet18");
  app.add_option("--precision", precision, "bf16 or tf32");
  app.add_option("--gpus", gpus, "GPU counts, comma-separated");
  app.add_option("--topology", topology,
                 "h200x4, nvlink<G>, nvlink<G>-ib<K>x<Gbps> (e.g. nvlink8-ib8x400) or nvlink<G>-eth[<K>x]<Gbps>");
  app.add_option("--topologies", topologies, "--curves: the topologies drawn");
  app.add_option(
      "--allreduce", allreduce_output,
      "bench/allreduce's output on one host: the link inside a host is fitted to it instead of the named one");
  app.add_option("--bucket-mb", setting.bucket, "a cap in MB, one (a single bucket) or auto (the planner)");
  app.add_option("--first-bucket-mb", setting.first_mb, "the first bucket's cap");
  app.add_option("--comm-dtype", setting.comm_dtype, "same, f32 or bf16")
      ->check(CLI::IsMember({"same", "f32", "bf16"}));
  app.add_option("--zero", setting.zero_stage, "ZeRO stage (1 or 2: reduce-scatter, then all-gather parameters)")
      ->check(CLI::Range(0, 2));
  bool no_overlap = false, no_overlap_optimizer = false;
  app.add_flag("--no-overlap", no_overlap, "every bucket after backward");
  app.add_flag("--no-overlap-optimizer", no_overlap_optimizer, "wait for every bucket before the optimizer step");
  CLI11_PARSE(app, argc, argv);
  setting.overlap = !no_overlap;
  setting.overlap_optimizer = !no_overlap_optimizer;
  if (params_path.empty()) params_path = docs + "/model_parameters.json";
  try {
    if (do_calibrate) calibrate(docs, params_path);
    ModelParameters par = read_parameters(params_path);
    if (do_validate) validate(docs, params_path);
    if (!bound_runs.empty()) bound(docs, params_path, bound_runs);
    if (do_predict) {
      if (profile_path.empty()) profile_path = docs + "/profiles/" + workload + "_" + precision + ".json";
      predict(profile_path, with_measured_link(topology_from_name(topology), allreduce_output), gpus, setting, par);
    }
    if (!curves_path.empty()) curves(docs, curves_path, topologies, par, allreduce_output);
    if (!do_validate && !do_calibrate && !do_predict && curves_path.empty() && bound_runs.empty()) {
      std::fprintf(stderr,
                   "scaling_model: nothing to do; give --validate, --calibrate, --bound, --predict or --curves\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scaling_model: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
