// Host time per op: how long the host takes to issue one op on tensors so small that the GPU is
// never what waits, for a set of ops that a training step is made of (elementwise, a matrix
// product, layer norm, a reduction, a linear layer's forward and backward through autograd, an
// AdamW step). bench/reference/host_overhead.py times the same ops in PyTorch, so the two tables
// can be put side by side from one run on one machine:
//
//   build/bench/host_overhead [--device cuda] [--calls 100] [--rounds 30]
//
// Each round: synchronise, issue `calls` calls of the op back to back (timed on the host), then
// synchronise again (untimed); microseconds per call, median over rounds. The queue of launches
// never fills at 100 calls, so the figure is the host's own cost. One JSON object per op follows
// the table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace {

using namespace tandem;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void synchronize(const Device& device) {
  if (device.is_cuda()) cuda::synchronize(device.index);
}

// Microseconds of host time per call of `op`: the median over `rounds` rounds of `calls` calls.
double host_us_per_call(const std::function<void()>& op, const Device& device, int calls, int rounds) {
  for (int i = 0; i < 10; ++i) op();  // warm-up: plans, caches, the allocator
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    synchronize(device);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) op();
    auto stop = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / calls);
  }
  synchronize(device);
  return median(per_call);
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = tandem::cuda::is_available() ? "cuda" : "cpu";
  int calls = 100, rounds = 30;
  CLI::App app("Host time per op on tiny tensors (the GPU never waits): what the host costs each op");
  app.add_option("--device", device_name, "cuda or cpu; default cuda when a GPU is visible")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--calls", calls, "calls per timed round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "timed rounds")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  using namespace tandem;
  const Device device(device_name);
  const TensorOptions bf16(DType::bf16, device);
  manual_seed(0);
  // Tiny operands: (64, 64) bf16 activations, a (64, 64) linear layer, a 10-tensor AdamW.
  Tensor a = randn({64, 64}, bf16), b = randn({64, 64}, bf16);
  Tensor ln_weight = randn({64}, bf16), ln_bias = randn({64}, bf16);
  Tensor weight = randn({64, 64}, bf16).requires_grad_(), bias = randn({64}, bf16).requires_grad_();
  Tensor x = randn({64, 64}, bf16);
  std::vector<Tensor> params;
  for (int i = 0; i < 10; ++i) {
    Tensor p = randn({64, 64}, bf16).requires_grad_();
    p.set_grad(randn({64, 64}, bf16));
    params.push_back(p);
  }
  optim::AdamW adamw(params, optim::AdamWOptions{});
  Tensor sink;  // keeps each result alive until the next call, as a training step would

  struct Op {
    std::string name;
    std::function<void()> run;
  };
  const std::vector<Op> ops = {
      {"add", [&] { sink = add(a, b); }},
      {"mul_scalar", [&] { sink = mul(a, 0.5); }},
      {"gelu", [&] { sink = gelu(a, GeluApproximate::tanh); }},
      {"matmul", [&] { sink = matmul(a, b); }},
      {"layer_norm", [&] { sink = layer_norm(a, {64}, ln_weight, ln_bias, 1e-5); }},
      {"sum", [&] { sink = sum(a); }},
      {"linear_forward_backward",
       [&] {
         weight.set_grad(Tensor());
         bias.set_grad(Tensor());
         sum(linear(x, weight, bias)).backward();
       }},
      {"adamw_step_10_tensors", [&] { adamw.step(); }},
  };

  std::printf("# tandem host time per op, %s, bf16 (64, 64) operands; median of %d rounds of %d calls\n",
              device.str().c_str(), rounds, calls);
  std::printf("# %-26s %10s\n", "op", "host us");
  std::vector<std::pair<std::string, double>> results;
  for (const Op& op : ops) {
    double us = host_us_per_call(op.run, device, calls, rounds);
    results.emplace_back(op.name, us);
    std::printf("  %-26s %10.2f\n", op.name.c_str(), us);
  }
  for (const auto& [name, us] : results) {
    std::printf("{\"bench\": \"host_overhead\", \"framework\": \"tandem\", \"device\": \"%s\", \"op\": \"%s\", "
                "\"host_us\": %.3f}\n",
                device.str().c_str(), name.c_str(), us);
  }
  return 0;
}
