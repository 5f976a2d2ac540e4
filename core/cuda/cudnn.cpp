// Convolution, pooling and batch norm through cuDNN's (v7-style) descriptor API, on NCHW
// tensors. Convolution algorithms come from cuDNN's heuristics, or from timing every algorithm
// once per shape when benchmark mode is on (like torch.backends.cudnn.benchmark); either choice
// is cached per shape. Workspaces come from the caching allocator. 16-bit inputs compute in f32
// with tensor cores; f32 convolutions use TF32 only under MatmulPrecision::high.
#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/runtime.h"

#define TANDEM_CUDNN_CHECK(call)                                                                           \
  do {                                                                                                     \
    cudnnStatus_t tandem_status_ = (call);                                                                 \
    if (tandem_status_ != CUDNN_STATUS_SUCCESS) {                                                          \
      throw ::tandem::BackendError(::tandem::detail::concat("cuDNN error: ", cudnnGetErrorString(tandem_status_)), \
                                   #call, __FILE__, __LINE__);                                             \
    }                                                                                                      \
  } while (0)

namespace tandem::cuda {

namespace {
bool benchmark_mode = false;

cudnnHandle_t handle(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it == handles.end()) {
    DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    TANDEM_CUDNN_CHECK(cudnnCreate(&h));
    it = handles.emplace(device, h).first;
  }
  TANDEM_CUDNN_CHECK(cudnnSetStream(it->second, current_stream(device)));
  return it->second;
}

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: TANDEM_THROW(TypeError, "cuDNN: dtype ", dtype_name(dtype), " is not supported (f32, f64, f16, bf16)");
  }
}

cudnnDataType_t compute_type(DType dtype) { return dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

cudnnMathType_t math_type(DType dtype) {
  if (is_half(dtype)) return CUDNN_TENSOR_OP_MATH;
  if (dtype == DType::f32 && matmul_precision() == MatmulPrecision::high) return CUDNN_DEFAULT_MATH;
  return CUDNN_FMA_MATH;
}

// Scaling factors are double for double data and float otherwise.
struct Scalars {
  float f_one = 1.0f, f_zero = 0.0f;
  double d_one = 1.0, d_zero = 0.0;
  const void* one(DType dtype) const { return dtype == DType::f64 ? static_cast<const void*>(&d_one) : &f_one; }
  const void* zero(DType dtype) const { return dtype == DType::f64 ? static_cast<const void*>(&d_zero) : &f_zero; }
};
const Scalars kScalars;

class TensorDesc {
 public:
  TensorDesc(const Tensor& t) : TensorDesc(t.dtype(), t.shape()) {}  // NOLINT
  TensorDesc(DType dtype, const Shape& s) {
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
    Shape four = s;
    while (four.size() < 4) four.push_back(1);  // per-channel (C,) tensors as (1, C, 1, 1) below
    TANDEM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, data_type(dtype), static_cast<int>(four[0]),
                                                  static_cast<int>(four[1]), static_cast<int>(four[2]),
                                                  static_cast<int>(four[3])));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  explicit FilterDesc(const Tensor& w) {
    TANDEM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
    TANDEM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, data_type(w.dtype()), CUDNN_TENSOR_NCHW,
                                                  static_cast<int>(w.shape()[0]), static_cast<int>(w.shape()[1]),
                                                  static_cast<int>(w.shape()[2]), static_cast<int>(w.shape()[3])));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc(const Conv2dParams& p, DType dtype) {
    TANDEM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
    TANDEM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        desc_, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
        static_cast<int>(p.stride_w), static_cast<int>(p.dilation_h), static_cast<int>(p.dilation_w),
        CUDNN_CROSS_CORRELATION, compute_type(dtype)));
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc_, static_cast<int>(p.groups)));
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, math_type(dtype)));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// The three convolution directions differ only in which cuDNN functions they call.
enum class Direction { forward, backward_data, backward_filter };

struct Choice {
  int algo = -1;
  size_t workspace = 0;
};

// Everything a convolution of one shape needs, made once: descriptors and, per direction, the
// chosen algorithm and its workspace size.
struct ConvPlan {
  std::unique_ptr<TensorDesc> x, y;
  std::unique_ptr<FilterDesc> w;
  std::unique_ptr<ConvDesc> conv;
  Choice choice[3];
};

using ConvKey = std::tuple<int, int, int, Shape, Shape, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           bool>;

template <typename Perf>
Choice best_of(const Perf* results, int count, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (results[i].status == CUDNN_STATUS_SUCCESS) return {static_cast<int>(results[i].algo), results[i].memory};
  }
  TANDEM_THROW(BackendError, "cuDNN has no usable algorithm for ", what);
}

Choice choose(Direction dir, cudnnHandle_t h, const ConvPlan& p) {
  constexpr int kMax = 16;
  int count = 0;
  switch (dir) {
    case Direction::forward: {
      cudnnConvolutionFwdAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, p.x->get(), p.w->get(), p.conv->get(), p.y->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x->get(), p.w->get(), p.conv->get(), p.y->get(), kMax, &count, r));
      return best_of(r, count, "conv2d forward");
    }
    case Direction::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, p.w->get(), p.y->get(), p.conv->get(), p.x->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w->get(), p.y->get(), p.conv->get(), p.x->get(), kMax, &count, r));
      return best_of(r, count, "conv2d backward data");
    }
    case Direction::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, p.x->get(), p.y->get(), p.conv->get(), p.w->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x->get(), p.y->get(), p.conv->get(), p.w->get(), kMax, &count, r));
      return best_of(r, count, "conv2d backward filter");
    }
  }
  return {};
}

// x: input (N, C, H, W), w: filter, y: output (N, K, P, Q); which of them is written depends on
// the direction.
void convolve(Direction dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  static const char* names[] = {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"};
  NvtxRange range(names[static_cast<int>(dir)]);
  int device = x.device().index;
  DeviceGuard guard(device);
  cudnnHandle_t h = handle(device);
  static std::mutex mutex;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  ConvKey key{device, static_cast<int>(x.dtype()), static_cast<int>(math_type(x.dtype())), x.shape(), w.shape(),
              p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups, benchmark_mode};
  ConvPlan* plan = nullptr;
  Choice c;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = plans[key];
    if (!slot) {
      slot = std::make_unique<ConvPlan>();
      slot->x = std::make_unique<TensorDesc>(x);
      slot->y = std::make_unique<TensorDesc>(y);
      slot->w = std::make_unique<FilterDesc>(w);
      slot->conv = std::make_unique<ConvDesc>(p, x.dtype());
    }
    plan = slot.get();
    Choice& chosen = plan->choice[static_cast<int>(dir)];
    if (chosen.algo < 0) chosen = choose(dir, h, *plan);
    c = chosen;
  }
  Tensor workspace = empty({static_cast<int64_t>(c.workspace)}, TensorOptions(DType::u8, x.device()));
  const void* one = kScalars.one(x.dtype());
  const void* zero = kScalars.zero(x.dtype());
  switch (dir) {
    case Direction::forward:
      TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, one, plan->x->get(), x.data_ptr(), plan->w->get(), w.data_ptr(),
                                                 plan->conv->get(), static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                                 workspace.data_ptr(), c.workspace, zero, plan->y->get(), y.data_ptr()));
      break;
    case Direction::backward_data:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(h, one, plan->w->get(), w.data_ptr(), plan->y->get(), y.data_ptr(),
                                                      plan->conv->get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                      workspace.data_ptr(), c.workspace, zero, plan->x->get(),
                                                      x.data_ptr()));
      break;
    case Direction::backward_filter:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, one, plan->x->get(), x.data_ptr(), plan->y->get(),
                                                        y.data_ptr(), plan->conv->get(),
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                                        workspace.data_ptr(), c.workspace, zero, plan->w->get(),
                                                        w.data_ptr()));
      break;
  }
}

class PoolDesc {
 public:
  explicit PoolDesc(const Pool2dParams& p) {
    TANDEM_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc_));
    cudnnPoolingMode_t mode = p.mode == PoolMode::max ? CUDNN_POOLING_MAX
                              : p.count_include_pad   ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    TANDEM_CUDNN_CHECK(cudnnSetPooling2dDescriptor(desc_, mode, CUDNN_PROPAGATE_NAN, static_cast<int>(p.kernel_h),
                                                   static_cast<int>(p.kernel_w), static_cast<int>(p.pad_h),
                                                   static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
                                                   static_cast<int>(p.stride_w)));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(desc_); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return desc_; }

 private:
  cudnnPoolingDescriptor_t desc_ = nullptr;
};

// Per-channel tensors as cuDNN wants them: (1, C, 1, 1).
TensorDesc channel_desc(const Tensor& per_channel) { return TensorDesc(per_channel.dtype(), {1, per_channel.shape()[0], 1, 1}); }
}  // namespace

void set_cudnn_benchmark(bool enabled) { benchmark_mode = enabled; }

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Conv2dParams& p) {
  convolve(Direction::forward, x, w, out, p);
}

void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_x, const Conv2dParams& p) {
  convolve(Direction::backward_data, grad_x, w, grad_out, p);
}

void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Conv2dParams& p) {
  convolve(Direction::backward_filter, x, grad_w, grad_out, p);
}

void pool2d_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  NvtxRange range(p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d");
  int device = x.device().index;
  DeviceGuard guard(device);
  PoolDesc pd(p);
  TensorDesc xd(x), yd(out);
  TANDEM_CUDNN_CHECK(cudnnPoolingForward(handle(device), pd.get(), kScalars.one(x.dtype()), xd.get(), x.data_ptr(),
                                         kScalars.zero(x.dtype()), yd.get(), out.data_ptr()));
}

void pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& grad_x,
                     const Pool2dParams& p) {
  NvtxRange range("pool2d_backward");
  int device = x.device().index;
  DeviceGuard guard(device);
  PoolDesc pd(p);
  TensorDesc xd(x), yd(out);
  TANDEM_CUDNN_CHECK(cudnnPoolingBackward(handle(device), pd.get(), kScalars.one(x.dtype()), yd.get(), out.data_ptr(),
                                          yd.get(), grad_out.data_ptr(), xd.get(), x.data_ptr(),
                                          kScalars.zero(x.dtype()), xd.get(), grad_x.data_ptr()));
}

void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& out, const Tensor& save_mean,
                                 const Tensor& save_invstd, double momentum, double eps) {
  NvtxRange range("batch_norm");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  // cuDNN updates the running variance with the unbiased batch variance, as PyTorch does.
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      handle(device), CUDNN_BATCHNORM_SPATIAL, kScalars.one(x.dtype()), kScalars.zero(x.dtype()), xd.get(),
      x.data_ptr(), xd.get(), out.data_ptr(), cd.get(), weight.data_ptr(), bias.data_ptr(), momentum,
      running_mean.data_ptr(), running_var.data_ptr(), std::max(eps, CUDNN_BN_MIN_EPSILON), save_mean.data_ptr(),
      save_invstd.data_ptr()));
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& out, double eps) {
  NvtxRange range("batch_norm");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      handle(device), CUDNN_BATCHNORM_SPATIAL, kScalars.one(x.dtype()), kScalars.zero(x.dtype()), xd.get(),
      x.data_ptr(), xd.get(), out.data_ptr(), cd.get(), weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(),
      running_var.data_ptr(), std::max(eps, CUDNN_BN_MIN_EPSILON)));
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias) {
  NvtxRange range("batch_norm_backward");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  const void* one = kScalars.one(x.dtype());
  const void* zero = kScalars.zero(x.dtype());
  // The saved mean and inverse std are given, so cuDNN does not use epsilon here.
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationBackward(handle(device), CUDNN_BATCHNORM_SPATIAL, one, zero, one, zero,
                                                     xd.get(), x.data_ptr(), xd.get(), grad_out.data_ptr(), xd.get(),
                                                     grad_x.data_ptr(), cd.get(), weight.data_ptr(),
                                                     grad_weight.data_ptr(), grad_bias.data_ptr(), CUDNN_BN_MIN_EPSILON,
                                                     save_mean.data_ptr(), save_invstd.data_ptr()));
}

}  // namespace tandem::cuda
