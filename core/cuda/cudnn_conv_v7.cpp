#include "tandem/core/cuda/cudnn_conv_v7.h"
#include "tandem/core/determinism.h"

namespace tandem::cuda::cudnn {

namespace {
// One of cuDNN's algorithm results.
struct Algo {
  int algo = -1;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

// The results that ran, in cuDNN's order; only those cuDNN marks deterministic when asked.
template <typename Perf>
std::vector<Algo> successful(const Perf* results, int count, const char* what, bool deterministic) {
  std::vector<Algo> out;
  for (int i = 0; i < count; ++i) {
    if (deterministic && results[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (results[i].status == CUDNN_STATUS_SUCCESS) {
      out.push_back({static_cast<int>(results[i].algo), results[i].memory, results[i].mathType});
    }
  }
  if (out.empty() && deterministic) {
    alert_not_deterministic(detail::concat(what, " (cuDNN marks none of its ", count, " algorithms for this shape deterministic)"));
  }
  if (out.empty()) TANDEM_THROW(BackendError, "cuDNN has no usable algorithm for ", what);
  return out;
}

// cuDNN's results in its order (heuristics: expected speed; benchmark mode: measured time),
// successful ones only.
std::vector<Algo> candidates(Direction dir, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                             cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t cd, bool benchmark,
                             bool deterministic) {
  constexpr int kMax = 16;
  int count = 0;
  switch (dir) {
    case Direction::forward: {
      cudnnConvolutionFwdAlgoPerf_t r[kMax];
      if (benchmark) TANDEM_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, x, w, cd, y, kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, cd, y, kMax, &count, r));
      return successful(r, count, "conv2d forward", deterministic);
    }
    case Direction::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t r[kMax];
      if (benchmark) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, cd, x, kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, cd, x, kMax, &count, r));
      return successful(r, count, "conv2d backward data", deterministic);
    }
    case Direction::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t r[kMax];
      if (benchmark) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, cd, w, kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, cd, w, kMax, &count, r));
      return successful(r, count, "conv2d backward filter", deterministic);
    }
  }
  return {};
}
}  // namespace

const char* direction_name(Direction dir) {
  static const char* names[] = {"fwd", "bwd_data", "bwd_filter"};
  return names[static_cast<int>(dir)];
}

Tensor workspace_for(size_t bytes, const Tensor& like) {
  return empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::u8, like.device()));
}

V7Conv::V7Conv(Direction dir, cudnnHandle_t h, const ConvTensors& t, const Conv2dParams& p, bool benchmark,
               bool deterministic)
    : dir_(dir), x_(t.x), y_(t.y), w_(t.w), conv_(p, t.x.dtype(), math_type(t.x.dtype())) {
  std::vector<Algo> found = candidates(dir, h, x_.get(), w_.get(), y_.get(), conv_.get(), benchmark, deterministic);
  candidates_ = found.size();
  for (const Algo& a : found) {
    try {
      workspace_for(a.workspace, t.x);
    } catch (const OutOfMemoryError&) {
      continue;  // too large for what is free: the next result
    }
    algo_ = a.algo;
    workspace_ = a.workspace;
    math_ = a.math;
    conv_.set_math(a.math);
    return;
  }
  TANDEM_THROW(BackendError, "cuDNN: no v7 algorithm for conv2d ", direction_name(dir), " could get its workspace");
}

void V7Conv::run(cudnnHandle_t h, const ConvTensors& t) const {
  Tensor workspace = workspace_for(workspace_, t.x);  // (workspace_,) u8
  const void* one = kScalars.one(t.x.dtype());
  const void* zero = kScalars.zero(t.x.dtype());
  switch (dir_) {
    case Direction::forward:
      TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, one, x_.get(), t.x.data_ptr(), w_.get(), t.w.data_ptr(),
                                                 conv_.get(), static_cast<cudnnConvolutionFwdAlgo_t>(algo_),
                                                 workspace.data_ptr(), workspace_, zero, y_.get(), t.y.data_ptr()));
      break;
    case Direction::backward_data:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(h, one, w_.get(), t.w.data_ptr(), y_.get(), t.y.data_ptr(),
                                                      conv_.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(algo_),
                                                      workspace.data_ptr(), workspace_, zero, x_.get(),
                                                      t.x.data_ptr()));
      break;
    case Direction::backward_filter:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, one, x_.get(), t.x.data_ptr(), y_.get(), t.y.data_ptr(),
                                                        conv_.get(),
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo_),
                                                        workspace.data_ptr(), workspace_, zero, w_.get(),
                                                        t.w.data_ptr()));
      break;
  }
}

std::string V7Conv::str() const {
  return detail::concat("algo ", algo_, " math ", static_cast<int>(math_), " workspace ", workspace_, " B (of ",
                        candidates_, " results)");
}

}  // namespace tandem::cuda::cudnn
