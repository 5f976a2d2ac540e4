// CUDA vs CPU parity, as a table of cases (ggml test-backend-ops style): every op x {f32, f16,
// bf16} x {contiguous, non-contiguous, broadcast} on fresh random inputs. The reference is the
// CPU result on the same inputs widened to f64; the GPU result must match within the dtype's
// tolerance. Every new CUDA allocation is poisoned with NaN bytes, so an element a kernel fails to
// write shows up. Differentiable cases also compare the input gradients of sum(out * w).
#include <cmath>
#include <functional>
#include <optional>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/random.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

enum class Layout { contiguous, transposed, broadcast };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::broadcast: return "broadcast";
  }
  return "?";
}

// How to draw one input: its shape (for the broadcast layout, the broadcast shape), its range.
struct InputSpec {
  Shape shape;
  Shape broadcast_shape;  // used by Layout::broadcast; empty means same as shape
  double low = -2.0, high = 2.0;
  bool integer = false;   // an index tensor: values in [low, high), never transposed or cast
};

struct Case {
  std::string name;
  std::vector<InputSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  bool differentiable = true;
  double tolerance_scale = 1.0;  // for ops that accumulate (matmul, reductions)
};

// Batch norm in training on x of `shape`, drawn from [low, high), with the running statistics
// (which it updates) compared as part of the result.
Case batch_norm_train_case(const std::string& name, const Shape& shape, double low = -2.0, double high = 2.0) {
  const int64_t c = shape[1];
  return Case{name, {InputSpec{shape, shape, low, high}, InputSpec{{c}, {c}}, InputSpec{{c}, {c}}},
              [c](const std::vector<Tensor>& x) {
                DType stat = x[0].dtype() == DType::f64 ? DType::f64 : DType::f32;
                TensorOptions o(stat, x[0].device());
                Tensor running_mean = zeros({c}, o), running_var = ones({c}, o);
                Tensor y = batch_norm(x[0], to(x[1], stat), to(x[2], stat), running_mean, running_var, true, 0.1, 1e-5);
                return cat({flatten(to(y, stat)), running_mean, running_var}, 0);
              },
              true, 4};
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 1e-12;
  }
}

// An input in `dtype` with the requested layout, drawn on the CPU.
Tensor make_input(const InputSpec& spec, DType dtype, Layout layout) {
  if (spec.integer) {
    Generator gen(testing::next_seed());
    return randint(static_cast<int64_t>(spec.low), static_cast<int64_t>(spec.high), spec.shape, DType::i64, &gen);
  }
  Shape shape = layout == Layout::broadcast && !spec.broadcast_shape.empty() ? spec.broadcast_shape : spec.shape;
  if (layout == Layout::transposed && shape.size() >= 2) {
    Shape swapped = shape;
    std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
    Tensor base = testing::random_uniform(swapped, spec.low, spec.high, dtype);
    return views::transpose(base, -1, -2);
  }
  return testing::random_uniform(shape, spec.low, spec.high, dtype);
}

// Moves an input to the GPU keeping its layout (a transposed CPU view becomes a transposed GPU view).
Tensor to_cuda_keep_layout(const Tensor& t) {
  if (t.is_contiguous()) return kernels::to_device(t, Device("cuda:0"));
  Tensor back = views::transpose(t, -1, -2);  // contiguous again
  return views::transpose(kernels::to_device(kernels::contiguous(back), Device("cuda:0")), -1, -2);
}

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  auto unary = [](std::string name, std::function<Tensor(const Tensor&)> f, double lo = -2.0, double hi = 2.0) {
    return Case{name, {InputSpec{{6, 33}, {1, 33}, lo, hi}}, [f](V x) { return f(x[0]); }};
  };
  auto binary = [](std::string name, std::function<Tensor(const Tensor&, const Tensor&)> f, double lo = -2.0,
                   double hi = 2.0, double blo = -2.0, double bhi = 2.0) {
    return Case{name, {InputSpec{{5, 40}, {5, 40}, lo, hi}, InputSpec{{5, 40}, {40}, blo, bhi}},
                [f](V x) { return f(x[0], x[1]); }};
  };
  std::vector<Case> c = {
      unary("neg", [](const Tensor& x) { return neg(x); }),
      unary("abs", [](const Tensor& x) { return abs(x); }),
      unary("exp", [](const Tensor& x) { return exp(x); }),
      unary("log", [](const Tensor& x) { return log(x); }, 0.2, 3.0),
      unary("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.2, 3.0),
      unary("rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.2, 3.0),
      unary("tanh", [](const Tensor& x) { return tanh(x); }),
      unary("sigmoid", [](const Tensor& x) { return sigmoid(x); }),
      unary("relu", [](const Tensor& x) { return relu(x); }),
      unary("gelu", [](const Tensor& x) { return gelu(x); }),
      unary("gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximate::tanh); }),
      unary("clamp", [](const Tensor& x) { return clamp(x, -0.75, 1.125); }),  // bounds exact in bf16
      unary("pow_scalar", [](const Tensor& x) { return pow(x, 2.5); }, 0.2, 2.0),
      unary("square", [](const Tensor& x) { return pow(x, 2.0); }),
      unary("scale", [](const Tensor& x) { return x * 0.375; }),
      unary("sin", [](const Tensor& x) { return sin(x); }, -4.0, 4.0),
      unary("cos", [](const Tensor& x) { return cos(x); }, -4.0, 4.0),
      unary("silu", [](const Tensor& x) { return silu(x); }, -6.0, 6.0),
      unary("softplus", [](const Tensor& x) { return softplus(x); }, -6.0, 6.0),
      unary("softplus_beta_threshold", [](const Tensor& x) { return softplus(x, 2.0, 2.5); }),
      unary("clamp_min", [](const Tensor& x) { return clamp(x, -0.75, std::nullopt); }),
      unary("clamp_max", [](const Tensor& x) { return clamp(x, std::nullopt, 1.125); }),
      unary("tril", [](const Tensor& x) { return tril(x, 3); }),
      unary("triu", [](const Tensor& x) { return triu(x, -2); }),
      binary("add", [](const Tensor& a, const Tensor& b) { return a + b; }),
      binary("sub", [](const Tensor& a, const Tensor& b) { return a - b; }),
      binary("mul", [](const Tensor& a, const Tensor& b) { return a * b; }),
      binary("div", [](const Tensor& a, const Tensor& b) { return a / b; }, -2.0, 2.0, 0.5, 2.0),
      binary("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }),
      binary("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }),
      binary("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.5, 2.0, -1.0, 2.0),
      Case{"where", {InputSpec{{4, 16}, {4, 16}}, InputSpec{{4, 16}, {16}}},
           [](V x) { return where(gt(x[0], x[1]), x[0], x[1] * 2.0); }},
      Case{"masked_fill", {InputSpec{{4, 16}, {4, 16}}}, [](V x) { return masked_fill(x[0], lt(x[0], 0.3), -1.5); }},
      Case{"sum_all", {InputSpec{{7, 300}, {1, 300}}}, [](V x) { return sum(x[0]); }, true, 4},
      Case{"sum_rows", {InputSpec{{33, 517}, {1, 517}}}, [](V x) { return sum(x[0], {1}); }, true, 4},
      Case{"sum_cols", {InputSpec{{517, 33}, {1, 33}}}, [](V x) { return sum(x[0], {0}, true); }, true, 4},
      Case{"sum_long_row", {InputSpec{{2, 70000}, {1, 70000}}}, [](V x) { return sum(x[0], {1}); }, true, 8},
      // Columns a multiple of 8 wide over many rows: 16-byte loads of neighbouring columns, rows
      // split into chunks (a bias gradient's shape).
      Case{"sum_cols_vectorised", {InputSpec{{1000, 264}, {1, 264}}}, [](V x) { return sum(x[0], {0}); }, true, 8},
      Case{"mean_middle_vectorised", {InputSpec{{3, 300, 16}, {3, 1, 16}}}, [](V x) { return mean(x[0], {1}); }, true, 4},
      Case{"amax_cols_vectorised", {InputSpec{{130, 64}, {1, 64}}}, [](V x) { return amax(x[0], {0}); }, false},
      Case{"mean_middle", {InputSpec{{3, 50, 7}, {3, 50, 1}}}, [](V x) { return mean(x[0], {1}); }, true, 4},
      Case{"mean_outer_inner", {InputSpec{{3, 5, 7}, {3, 1, 7}}}, [](V x) { return mean(x[0], {0, 2}); }, true, 4},
      Case{"amax", {InputSpec{{9, 65}, {1, 65}}}, [](V x) { return amax(x[0], {1}); }, false},
      Case{"amin_cols", {InputSpec{{65, 9}, {1, 9}}}, [](V x) { return amin(x[0], {0}); }, false},
      Case{"max_values", {InputSpec{{9, 65}, {1, 65}}}, [](V x) { return max(x[0], 1).values; }, false},
      Case{"argmax", {InputSpec{{9, 65}, {9, 65}}}, [](V x) { return to(argmax(x[0], 1), x[0].dtype()); }, false},
      Case{"argmin_all", {InputSpec{{9, 65}, {9, 65}}}, [](V x) { return to(argmin(x[0], 0), x[0].dtype()); }, false},
      // A whole 1M-element tensor reduced in 256 chunks, whose partials one block combines (the
      // arg reductions across chunks have a test of their own below).
      Case{"mean_all_many_chunks", {InputSpec{{1024, 1024}, {1, 1024}}}, [](V x) { return mean(x[0]); }, true, 8},
      Case{"amax_all_many_chunks", {InputSpec{{1024, 1024}, {1, 1024}}}, [](V x) { return amax(x[0], {0, 1}); }, false},
      Case{"var", {InputSpec{{6, 70}, {1, 70}}}, [](V x) { return var(x[0], {1}); }, true, 4},
      Case{"softmax_last", {InputSpec{{12, 333}, {1, 333}}}, [](V x) { return softmax(x[0], -1); }, true, 2},
      Case{"softmax_rows_in_registers", {InputSpec{{12, 512}, {1, 512}}}, [](V x) { return softmax(x[0], -1); }, true, 2},
      Case{"log_softmax_rows_in_registers", {InputSpec{{3, 8192}, {1, 8192}}}, [](V x) { return log_softmax(x[0], 1); },
           true, 2},
      Case{"softmax_first", {InputSpec{{33, 12}, {33, 1}}}, [](V x) { return softmax(x[0], 0); }, true, 2},
      Case{"log_softmax_last", {InputSpec{{12, 333}, {1, 333}}}, [](V x) { return log_softmax(x[0], -1); }, true, 2},
      Case{"log_softmax_middle", {InputSpec{{3, 40, 5}, {3, 40, 1}}}, [](V x) { return log_softmax(x[0], 1); }, true, 2},
      Case{"cross_entropy", {InputSpec{{16, 37}, {16, 37}}, InputSpec{{16}, {}, 0, 37, true}},
           [](V x) { return cross_entropy(x[0], x[1]); }, true, 2},
      Case{"cross_entropy_smooth_ignore", {InputSpec{{16, 37}, {16, 37}}, InputSpec{{16}, {}, 0, 37, true}},
           [](V x) {
             Tensor t = where(lt(to(x[1], DType::f64), 5.0), full_like(x[1], -100), x[1]);
             return cross_entropy(x[0], t, {Reduction::mean, -100, 0.1});
           }, true, 2},
      // Rows of a multiple of 8 classes: the kernels' 16-byte loads (the cases above take 1 at a time).
      Case{"cross_entropy_vectorised", {InputSpec{{8, 4000}, {8, 4000}}, InputSpec{{8}, {}, 0, 4000, true}},
           [](V x) { return cross_entropy(x[0], x[1]); }, true, 2},
      Case{"cross_entropy_vectorised_smooth_ignore", {InputSpec{{8, 4000}, {8, 4000}}, InputSpec{{8}, {}, 0, 4000, true}},
           [](V x) {
             Tensor t = where(lt(to(x[1], DType::f64), 800.0), full_like(x[1], -100), x[1]);
             return cross_entropy(x[0], t, {Reduction::mean, -100, 0.1});
           }, true, 2},
      Case{"matmul", {InputSpec{{33, 48}, {33, 48}}, InputSpec{{48, 20}, {48, 20}}},
           [](V x) { return matmul(x[0], x[1]); }, true, 8},
      Case{"matmul_batched_broadcast", {InputSpec{{3, 17, 24}, {1, 17, 24}}, InputSpec{{3, 24, 9}, {3, 24, 9}}},
           [](V x) { return matmul(x[0], x[1]); }, true, 8},
      Case{"matmul_vector", {InputSpec{{5, 16, 24}, {5, 16, 24}}, InputSpec{{24}, {24}}},
           [](V x) { return matmul(x[0], x[1]); }, true, 8},
      Case{"index_select", {InputSpec{{12, 9}, {12, 9}}, InputSpec{{20}, {}, -12, 12, true}},
           [](V x) { return index_select(x[0], 0, x[1]); }},
      Case{"gather", {InputSpec{{6, 10}, {6, 10}}, InputSpec{{6, 4}, {}, 0, 10, true}},
           [](V x) { return gather(x[0], 1, x[1]); }},
      Case{"cat_stack", {InputSpec{{4, 6}, {4, 6}}, InputSpec{{4, 6}, {1, 6}}},
           [](V x) { return cat({x[0], reshape(stack({x[0], expand(x[1], {4, 6})}, 0), {8, 6})}, 0); }},
      Case{"conv2d_grouped_strided",
           {InputSpec{{2, 4, 9, 9}, {2, 4, 9, 9}}, InputSpec{{6, 2, 3, 3}, {6, 2, 3, 3}}, InputSpec{{6}, {6}}},
           [](V x) {
             Conv2dParams p;
             p.stride_h = p.stride_w = 2;
             p.pad_h = p.pad_w = 1;
             p.groups = 2;
             return conv2d(x[0], x[1], x[2], p);
           }, true, 8},
      Case{"conv2d_dilated_1x1", {InputSpec{{3, 5, 8, 8}, {3, 5, 8, 8}}, InputSpec{{4, 5, 1, 1}, {4, 5, 1, 1}}},
           [](V x) { return conv2d(x[0], x[1]); }, true, 4},
      Case{"conv2d_dilated", {InputSpec{{2, 3, 11, 11}, {2, 3, 11, 11}}, InputSpec{{4, 3, 3, 3}, {4, 3, 3, 3}}},
           [](V x) {
             Conv2dParams p;
             p.dilation_h = p.dilation_w = 2;
             p.pad_h = 2;
             return conv2d(x[0], x[1], Tensor(), p);
           }, true, 8},
      Case{"max_pool2d", {InputSpec{{2, 3, 9, 9}, {2, 3, 9, 9}}}, [](V x) { return max_pool2d(x[0], 3, 2, 1); }},
      Case{"avg_pool2d", {InputSpec{{2, 3, 8, 8}, {2, 3, 8, 8}}}, [](V x) { return avg_pool2d(x[0], 2); }},
      Case{"avg_pool2d_pad_exclude", {InputSpec{{2, 3, 7, 7}, {2, 3, 7, 7}}},
           [](V x) { return avg_pool2d(x[0], 3, 2, 1, false); }},
      batch_norm_train_case("batch_norm_train", {4, 3, 5, 5}),            // planes of 25: one value at a time
      batch_norm_train_case("batch_norm_train_wide", {16, 8, 32, 32}),    // 16-byte loads, a channel over many blocks
      batch_norm_train_case("batch_norm_train_small_planes", {64, 16, 4, 4}),
      batch_norm_train_case("batch_norm_train_offset", {6, 4, 8, 8}, 38.0, 42.0),  // mean far from zero
      batch_norm_train_case("batch_norm_train_resnet_stem", {256, 64, 32, 32}),    // ResNet-18's widest
      Case{"batch_norm_eval", {InputSpec{{4, 3, 5, 5}, {4, 3, 5, 5}}, InputSpec{{3}, {3}}, InputSpec{{3}, {3}}},
           [](V x) {
             DType stat = x[0].dtype() == DType::f64 ? DType::f64 : DType::f32;
             TensorOptions o(stat, x[0].device());
             Tensor running_mean = full({3}, 0.25, o), running_var = full({3}, 1.5, o);
             return batch_norm(x[0], to(x[1], stat), to(x[2], stat), running_mean, running_var, false);
           }, true, 2},
      Case{"copy_contiguous", {InputSpec{{7, 19}, {1, 19}}}, [](V x) { return contiguous(x[0]) * 1.0; }},
      // One operand repeated along the leading dims (a position table over a batch): 16-byte
      // loads where the repeated block is whole vectors, the strided indexer where it is not (35).
      Case{"add_repeated_block", {InputSpec{{4, 6, 16}, {4, 6, 16}}, InputSpec{{4, 6, 16}, {6, 16}}},
           [](V x) { return add(x[0], x[1]); }},
      Case{"mul_repeated_odd_block", {InputSpec{{3, 5, 7}, {3, 5, 7}}, InputSpec{{3, 5, 7}, {1, 5, 7}}},
           [](V x) { return mul(x[1], x[0]); }},
  };
  return c;
}

Tensor widen(const Tensor& t) { return kernels::to_dtype(kernels::to_device(t, Device()), DType::f64); }

void run_parity(DType dtype) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const Case& c : cases()) {
    for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::broadcast}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype) + " " + layout_name(layout));
      std::vector<Tensor> host, reference_inputs, device_inputs;
      for (const InputSpec& spec : c.inputs) host.push_back(make_input(spec, dtype, layout));
      for (const Tensor& h : host) {
        bool grad = c.differentiable && is_floating(h.dtype());
        Tensor r = h.dtype() == DType::i64 ? h : widen(h).detach();
        Tensor d = to_cuda_keep_layout(h);
        if (grad) {
          r.requires_grad_();
          d.requires_grad_();
        }
        reference_inputs.push_back(r);
        device_inputs.push_back(d);
      }
      Tensor expected = c.fn(reference_inputs);
      Tensor got = c.fn(device_inputs);
      ASSERT_TRUE(got.device().is_cuda());
      double tol = tolerance(dtype) * c.tolerance_scale;
      EXPECT_TRUE(testing::all_close(widen(got), expected, tol, tol));
      if (!c.differentiable) continue;

      Tensor w = testing::random_tensor(expected.shape());
      sum(mul(expected, w)).backward();
      sum(mul(got, to(to(w, got.dtype()), got.device()))).backward();
      for (size_t i = 0; i < host.size(); ++i) {
        if (!reference_inputs[i].requires_grad()) continue;
        SCOPED_TRACE("gradient of input " + std::to_string(i));
        ASSERT_TRUE(device_inputs[i].grad().defined());
        EXPECT_TRUE(testing::all_close(widen(device_inputs[i].grad()), reference_inputs[i].grad(), 2 * tol, 2 * tol));
      }
    }
  }
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(CudaParity, F32) { run_parity(DType::f32); }
TEST(CudaParity, F16) { run_parity(DType::f16); }
TEST(CudaParity, BF16) { run_parity(DType::bf16); }

// Arg reductions split into chunks (long rows, tall columns, a whole tensor): the index is the
// CPU's, exactly, the first of equal extremes wherever the chunks end. In bf16 and f16 draws from
// [-2, 2) repeat, so a 70000-element row holds many copies of its maximum.
TEST(CudaParity, ArgReductionsAcrossChunksTakeTheFirstIndex) {
  TANDEM_REQUIRE_CUDA();
  auto same = [](const Tensor& cpu, const Tensor& gpu) {
    ASSERT_TRUE(gpu.device().is_cuda());
    EXPECT_EQ(to(cpu, DType::i64).to_vector<int64_t>(), to(to(gpu, Device("cpu")), DType::i64).to_vector<int64_t>());
  };
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor rows = to(testing::random_uniform({3, 70000}, -2.0, 2.0, DType::f32), dtype);     // (3, 70000)
    Tensor columns = to(testing::random_uniform({8192, 40}, -2.0, 2.0, DType::f32), dtype);  // (8192, 40)
    Tensor whole = to(testing::random_uniform({1024, 1024}, -2.0, 2.0, DType::f32), dtype);  // (1024, 1024)
    const Device gpu("cuda");
    same(argmax(rows, 1), argmax(to(rows, gpu), 1));
    same(argmin(rows, 1), argmin(to(rows, gpu), 1));
    same(argmax(columns, 0), argmax(to(columns, gpu), 0));
    same(argmin(columns, 0), argmin(to(columns, gpu), 0));
    same(argmax(whole), argmax(to(whole, gpu)));
  }
}

TEST(CudaParity, ArangeOnTheDeviceInEveryDType) {
  TANDEM_REQUIRE_CUDA();
  const double start = testing::random_uniform({1}, -3.0, 3.0).item();
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}) {
    SCOPED_TRACE(dtype_name(d));
    const double s = is_floating(d) ? start : std::floor(start);
    Tensor got = arange(s, s + 7.0, 0.5, TensorOptions(d, Device("cuda:0")));
    Tensor expected = arange(s, s + 7.0, 0.5, d);
    ASSERT_TRUE(got.device().is_cuda());
    EXPECT_EQ(got.shape(), expected.shape());
    EXPECT_EQ(widen(got).to_vector<double>(), widen(expected).to_vector<double>());
    Tensor down = arange(s + 7.0, s, -0.75, TensorOptions(d, Device("cuda:0")));  // a negative step
    EXPECT_EQ(widen(down).to_vector<double>(), widen(arange(s + 7.0, s, -0.75, d)).to_vector<double>());
  }
}

TEST(CudaParity, RandomMatchesCpuForTheSameSeed) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::f64}) {
    uint64_t seed = testing::next_seed();
    Generator cpu_gen(seed), gpu_gen(seed);
    EXPECT_TRUE(testing::all_close(widen(rand({1000}, TensorOptions(dtype, Device("cuda:0")), &gpu_gen)),
                                   rand({1000}, dtype, &cpu_gen), 1e-7, 0));
    EXPECT_TRUE(testing::all_close(widen(randn({1000}, TensorOptions(dtype, Device("cuda:0")), &gpu_gen)),
                                   randn({1000}, dtype, &cpu_gen), 1e-6, 1e-6));
    EXPECT_TRUE(testing::all_close(widen(bernoulli({1000}, 0.3, TensorOptions(dtype, Device("cuda:0")), &gpu_gen)),
                                   bernoulli({1000}, 0.3, dtype, &cpu_gen), 0, 0));
  }
}

TEST(CudaParity, CastsBetweenAllDtypes) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  Tensor source = mul(testing::random_uniform({9, 31}, -100.0, 100.0), 1.0);
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    for (DType to_type : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to_type));
      Tensor x = kernels::to_dtype(from == DType::u8 ? kernels::unary(UnaryOp::abs, source) : source, from);
      Tensor cpu = kernels::to_dtype(views::transpose(x, 0, 1), to_type);
      Tensor gpu = kernels::to_dtype(views::transpose(kernels::to_device(x, Device("cuda:0")), 0, 1), to_type);
      EXPECT_TRUE(testing::all_close(widen(gpu), widen(cpu), 0, 0));
    }
  }
  cuda::set_poison_allocations(false);
}

// The GPU digests the same bytes to the same value as the CPU (the divergence check compares ranks
// with them), for long tensors (many blocks), partial last words and views that start mid-word.
TEST(CudaParity, ContentHashesMatchTheCpu) {
  TANDEM_REQUIRE_CUDA();
  manual_seed(32);
  const Device gpu(DeviceType::cuda, 0);
  std::vector<Tensor> cpu_tensors = {
      randn({1 << 20, 3}),                                   // (1 Mi, 3) f32: many blocks
      kernels::to_dtype(randn({1001}), DType::bf16),         // (1001,) bf16: a partial last word
      randint(0, 256, {77}, DType::u8),                      // (77,) u8
      kernels::to_dtype(randn({5, 7}), DType::f64)};         // (5, 7) f64
  std::vector<Tensor> gpu_tensors;
  for (const Tensor& t : cpu_tensors) gpu_tensors.push_back(kernels::to_device(t, gpu));
  Tensor u8 = randint(0, 256, {64}, DType::u8);
  cpu_tensors.push_back(views::narrow(u8, 0, 5, 50));                             // a view starting mid-word
  gpu_tensors.push_back(views::narrow(kernels::to_device(u8, gpu), 0, 5, 50));
  EXPECT_EQ(kernels::content_hashes(gpu_tensors), kernels::content_hashes(cpu_tensors));
  EXPECT_EQ(kernels::content_hashes(gpu_tensors), kernels::content_hashes(gpu_tensors));
}

}  // namespace
}  // namespace tandem
