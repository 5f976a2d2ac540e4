// CUDA reductions over the middle dim of a contiguous (outer, n, inner) tensor. Every op carries
// a (value, index) state so sums, extremes and arg-extremes share one pair of kernels:
//  - inner == 1: a block per row (and per chunk of a long row), cub::BlockReduce across threads;
//  - inner > 1: 32 columns per block, rows split over threadIdx.y, combined through shared memory;
//    for sums and extremes over aligned rows, 32 * V columns per block, each lane loading V
//    neighbouring columns (16 bytes) at once, in the same order per column.
// When a reduction is split into chunks, partial states go to a workspace (chunk-major, so that
// the combining kernel reads it coalesced) and a second kernel combines them in a fixed order
// (several threads per output, each a share of the chunks), so a few long rows, or a few columns
// over many rows, still fill the GPU.
#include <cub/block/block_reduce.cuh>

#include <limits>

#include "tandem/core/backend.h"
#include "tandem/core/content_hash.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/scalar_math.h"

namespace tandem::cuda {

namespace {
constexpr int kRowThreads = 256;
constexpr int kColumnsPerBlock = 32;
constexpr int kRowsPerBlock = 8;
constexpr int64_t kMinChunk = 4096;       // elements per chunk when a row is split
constexpr int64_t kMinColumnChunk = 64;   // rows per chunk when columns are split
constexpr int64_t kTargetBlocks = 132 * 4;  // enough blocks to fill an H100 or H200 (~4 per SM)

template <typename A>
struct State {
  A value;
  int64_t index;
};

template <ReduceOp Op, typename A>
struct Reducer {
  static constexpr bool kArg = Op == ReduceOp::argmax || Op == ReduceOp::argmin;

  __host__ __device__ static State<A> identity() {
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::mean) {
      return {A(0), 0};
    } else if constexpr (Op == ReduceOp::max || Op == ReduceOp::argmax) {
      return {std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                   : std::numeric_limits<A>::lowest(),
              std::numeric_limits<int64_t>::max()};
    } else {
      return {std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max(),
              std::numeric_limits<int64_t>::max()};
    }
  }

  // Associative and commutative, so any combination order gives the same extreme and the first
  // index among equals (NaN counts as the extreme, as on the CPU).
  __device__ State<A> operator()(const State<A>& a, const State<A>& b) const {
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::mean) {
      return {a.value + b.value, 0};
    } else {
      bool a_nan = a.value != a.value, b_nan = b.value != b.value;
      if (a_nan || b_nan) {
        if (a_nan && b_nan) return a.index <= b.index ? a : b;
        return a_nan ? a : b;
      }
      constexpr bool max_like = Op == ReduceOp::max || Op == ReduceOp::argmax;
      bool a_better = max_like ? a.value > b.value : a.value < b.value;
      bool b_better = max_like ? b.value > a.value : b.value < a.value;
      if (a_better) return a;
      if (b_better) return b;
      return a.index <= b.index ? a : b;
    }
  }
};

template <ReduceOp Op, typename T, typename A>
__device__ void write_result(const State<A>& s, int64_t n, T* out, int64_t* out_index, int64_t pos) {
  if constexpr (Reducer<Op, A>::kArg) {
    out_index[pos] = s.index == std::numeric_limits<int64_t>::max() ? 0 : s.index;
  } else if constexpr (Op == ReduceOp::mean && std::is_floating_point_v<A>) {  // mean is for floats only
    out[pos] = cast_to<T>(n == 0 ? A(NAN) : s.value / static_cast<A>(n));
  } else {
    out[pos] = cast_to<T>(s.value);
  }
}

// grid (outer, chunks); block kRowThreads. Each block reduces one chunk of one row.
template <ReduceOp Op, typename T, typename A>
__global__ void reduce_rows(const T* __restrict__ x, int64_t n, int64_t chunk, T* out, int64_t* out_index,
                            State<A>* partial) {
  dependent_kernel_begin();
  using Block = cub::BlockReduce<State<A>, kRowThreads>;
  __shared__ typename Block::TempStorage temp;
  Reducer<Op, A> combine;
  const int64_t row = blockIdx.x;
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = min(n, begin + chunk);
  const T* in = x + row * n;
  State<A> s = Reducer<Op, A>::identity();
  for (int64_t i = begin + threadIdx.x; i < end; i += kRowThreads) s = combine(s, State<A>{static_cast<A>(to_acc(in[i])), i});
  s = Block(temp).Reduce(s, combine);
  if (threadIdx.x != 0) return;
  if (partial != nullptr) partial[blockIdx.y * gridDim.x + row] = s;  // (chunks, outer)
  else write_result<Op>(s, n, out, out_index, row);
}

// grid (outer * ceil(inner / 32), chunks); block (32, 8).
template <ReduceOp Op, typename T, typename A>
__global__ void reduce_columns(const T* __restrict__ x, int64_t n, int64_t inner, int64_t chunk, T* out,
                               int64_t* out_index, State<A>* partial) {
  dependent_kernel_begin();
  __shared__ State<A> shared[kRowsPerBlock][kColumnsPerBlock];
  Reducer<Op, A> combine;
  const int64_t tiles = (inner + kColumnsPerBlock - 1) / kColumnsPerBlock;
  const int64_t o = blockIdx.x / tiles;
  const int64_t col = (blockIdx.x % tiles) * kColumnsPerBlock + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = min(n, begin + chunk);
  State<A> s = Reducer<Op, A>::identity();
  if (col < inner) {
    const T* in = x + o * n * inner + col;
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowsPerBlock) s = combine(s, State<A>{static_cast<A>(to_acc(in[r * inner])), r});
  }
  shared[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= inner) return;
  for (int k = 1; k < kRowsPerBlock; ++k) s = combine(s, shared[k][threadIdx.x]);
  int64_t pos = o * inner + col;
  const int64_t outputs = gridDim.x / tiles * inner;
  if (partial != nullptr) partial[blockIdx.y * outputs + pos] = s;  // (chunks, outputs)
  else write_result<Op>(s, n, out, out_index, pos);
}

// reduce_columns for sums and extremes (no index to keep) when inner % V == 0 and x is 16-byte
// aligned: grid (outer * ceil(inner / (32 V)), chunks); block (32, 8). Lane x owns columns
// x V .. x V + V - 1 of its tile; per column the rows are combined in reduce_columns' order.
template <ReduceOp Op, typename T, typename A, int V>
__global__ void reduce_columns_vectorised(const T* __restrict__ x, int64_t n, int64_t inner, int64_t chunk, T* out,
                                          State<A>* partial) {
  dependent_kernel_begin();
  static_assert(!Reducer<Op, A>::kArg, "arg reductions keep their indices: reduce_columns");
  constexpr int kWidth = kColumnsPerBlock * V;
  __shared__ A shared[kRowsPerBlock][kWidth];  // each row group's values per column of the tile
  Reducer<Op, A> combine;
  const int64_t tiles = (inner + kWidth - 1) / kWidth;
  const int64_t o = blockIdx.x / tiles;
  const int64_t col = (blockIdx.x % tiles) * kWidth + static_cast<int64_t>(threadIdx.x) * V;  // first of V
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = min(n, begin + chunk);
  State<A> s[V];
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = Reducer<Op, A>::identity();
  if (col < inner) {  // inner % V == 0: all V columns exist
    const T* in = x + o * n * inner + col;
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowsPerBlock) {
      const Packed<T, V> v = *reinterpret_cast<const Packed<T, V>*>(in + r * inner);
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = combine(s[k], State<A>{static_cast<A>(to_acc(v.v[k])), r});
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) shared[threadIdx.y][threadIdx.x * V + k] = s[k].value;
  __syncthreads();
  if (threadIdx.y != 0 || col >= inner) return;
  const int64_t outputs = gridDim.x / tiles * inner;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    State<A> t = s[k];
    for (int y = 1; y < kRowsPerBlock; ++y) t = combine(t, State<A>{shared[y][threadIdx.x * V + k], 0});
    const int64_t pos = o * inner + col + k;
    if (partial != nullptr) partial[blockIdx.y * outputs + pos] = t;  // (chunks, outputs)
    else write_result<Op>(t, n, out, nullptr, pos);
  }
}

// Combines each output's partial states (chunks, outputs) in a fixed order. Block (32, rows):
// 32 outputs; thread row y combines chunks y, y + rows, ... in order, then row 0 combines the
// rows' results in order. (One thread walking all of an output's chunks waits on each load in
// turn: a full sum of 1M floats spent 23 us there, on one H200, against 3 us for its chunks.)
constexpr int kMaxCombineRows = 32;
template <ReduceOp Op, typename T, typename A>
__global__ void combine_partials(const State<A>* partial, int64_t outputs, int64_t chunks, int64_t n, T* out,
                                 int64_t* out_index) {
  dependent_kernel_begin();
  __shared__ State<A> shared[kMaxCombineRows][32];
  Reducer<Op, A> combine;
  const int64_t pos = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  State<A> s = Reducer<Op, A>::identity();
  if (pos < outputs) {
    for (int64_t c = threadIdx.y; c < chunks; c += blockDim.y) s = combine(s, partial[c * outputs + pos]);
  }
  shared[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || pos >= outputs) return;
  for (unsigned r = 1; r < blockDim.y; ++r) s = combine(s, shared[r][threadIdx.x]);
  write_result<Op>(s, n, out, out_index, pos);
}

// One output's partial states (chunks,), combined by a whole block: thread t combines chunks t,
// t + kRowThreads, ... in order, then cub's block reduction combines the threads' results in its
// fixed order. (combine_partials gives a single output 32 threads, one per warp: the MLP loss's
// 528 partial sums took 8.4 us there and take 3.0 us here, one H200, 2026-11-25.)
template <ReduceOp Op, typename T, typename A>
__global__ void __launch_bounds__(kRowThreads)
    combine_partials_one(const State<A>* partial, int64_t chunks, int64_t n, T* out, int64_t* out_index) {
  dependent_kernel_begin();
  using Block = cub::BlockReduce<State<A>, kRowThreads>;
  __shared__ typename Block::TempStorage temp;
  Reducer<Op, A> combine;
  State<A> s = Reducer<Op, A>::identity();
  for (int64_t c = threadIdx.x; c < chunks; c += kRowThreads) s = combine(s, partial[c]);
  s = Block(temp).Reduce(s, combine);
  if (threadIdx.x == 0) write_result<Op>(s, n, out, out_index, 0);
}

// Launches the combining kernel that suits the number of outputs.
template <ReduceOp Op, typename T, typename A>
void launch_combine_partials(const State<A>* partial, int64_t outputs, int64_t chunks, int64_t n, T* out,
                             int64_t* out_index, cudaStream_t stream, const char* what) {
  if (outputs == 1) {
    launch_dependent(combine_partials_one<Op, T, A>, 1, kRowThreads, 0, stream, partial, chunks, n, out, out_index);
  } else {
    // Few outputs get more threads per output: each walks fewer chunks.
    const unsigned rows = outputs <= 32 ? kMaxCombineRows : 8;
    const dim3 grid(static_cast<unsigned>((outputs + 31) / 32));
    launch_dependent(combine_partials<Op, T, A>, grid, dim3(32, rows), 0, stream, partial, outputs, chunks, n, out,
                     out_index);
  }
  check_launch(what);
}

template <typename T>
using reduce_acc_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, acc_t<T>, int64_t>;

template <ReduceOp Op, typename T>
void reduce_typed(const Tensor& x, const Tensor& out) {
  using A = reduce_acc_t<T>;
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2];
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  NvtxRange range(reduce_op_name(Op));
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = stream_of(x);
  const T* px = device_ptr<const T>(x);
  T* po = Reducer<Op, A>::kArg ? nullptr : device_ptr<T>(out);
  int64_t* pi = Reducer<Op, A>::kArg ? device_ptr<int64_t>(out) : nullptr;

  constexpr int V = 16 / sizeof(T);  // columns per 16-byte load
  const bool vectorised = !Reducer<Op, A>::kArg && inner > 1 && inner % V == 0 &&
                          reinterpret_cast<uintptr_t>(px) % 16 == 0;
  const int64_t width = vectorised ? kColumnsPerBlock * V : kColumnsPerBlock;  // columns per block
  const int64_t tiles = (inner + width - 1) / width;

  // Split long reductions until there are enough blocks to fill the GPU.
  const int64_t blocks_without_split = inner == 1 ? outer : outer * tiles;
  const int64_t min_chunk = inner == 1 ? kMinChunk : kMinColumnChunk;
  int64_t chunks = 1;
  while (blocks_without_split * chunks < kTargetBlocks && n / (chunks * 2) >= min_chunk && chunks < 1024) chunks *= 2;
  const int64_t chunk = (n + chunks - 1) / chunks;

  Tensor workspace;
  State<A>* partial = nullptr;
  if (chunks > 1) {
    workspace = empty({static_cast<int64_t>(outputs * chunks * sizeof(State<A>))}, TensorOptions(DType::u8, x.device()));
    partial = device_ptr<State<A>>(workspace);
  }
  if (inner == 1) {
    dim3 grid(static_cast<unsigned>(outer), static_cast<unsigned>(chunks));
    launch_dependent(reduce_rows<Op, T, A>, grid, kRowThreads, 0, stream, px, n, chunk, po, pi, partial);
  } else {
    dim3 grid(static_cast<unsigned>(outer * tiles), static_cast<unsigned>(chunks));
    dim3 block(kColumnsPerBlock, kRowsPerBlock);
    bool launched = false;
    if constexpr (!Reducer<Op, A>::kArg) {  // (vectorised is false for arg ops, which need each index)
      if (vectorised) {
        launch_dependent(reduce_columns_vectorised<Op, T, A, V>, grid, block, 0, stream, px, n, inner, chunk, po,
                         partial);
        launched = true;
      }
    }
    if (!launched)
      launch_dependent(reduce_columns<Op, T, A>, grid, block, 0, stream, px, n, inner, chunk, po, pi, partial);
  }
  check_launch(reduce_op_name(Op));
  if (chunks > 1) launch_combine_partials<Op, T, A>(partial, outputs, chunks, n, po, pi, stream, "reduce combine");
}

template <typename T>
void reduce_dispatch_op(ReduceOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
    case ReduceOp::sum: return reduce_typed<ReduceOp::sum, T>(x, out);
    case ReduceOp::mean: return reduce_typed<ReduceOp::mean, T>(x, out);
    case ReduceOp::max: return reduce_typed<ReduceOp::max, T>(x, out);
    case ReduceOp::min: return reduce_typed<ReduceOp::min, T>(x, out);
    case ReduceOp::argmax: return reduce_typed<ReduceOp::argmax, T>(x, out);
    case ReduceOp::argmin: return reduce_typed<ReduceOp::argmin, T>(x, out);
  }
}

// Each thread adds the mixes of a grid-stride set of words; the block's sum goes into *out with an
// integer atomic add (wrapping, so the order does not matter).
__global__ void content_hash_kernel(const unsigned char* bytes, size_t nbytes, unsigned long long* out) {
  dependent_kernel_begin();
  const size_t full = nbytes / 8;  // whole words; a partial last one is thread 0's
  const auto* words = reinterpret_cast<const uint64_t*>(bytes);
  uint64_t sum = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < full;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    sum += hashing::mix(words[i], i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && full * 8 < nbytes) {
    uint64_t word = 0;
    for (size_t k = 0; full * 8 + k < nbytes; ++k) word |= static_cast<uint64_t>(bytes[full * 8 + k]) << (8 * k);
    sum += hashing::mix(word, full);
  }
  using BlockReduce = cub::BlockReduce<unsigned long long, 256>;
  __shared__ typename BlockReduce::TempStorage temp;
  const unsigned long long block_sum = BlockReduce(temp).Sum(static_cast<unsigned long long>(sum));
  if (threadIdx.x == 0) atomicAdd(out, block_sum);
}

// The squared error and its gradient (kernels::squared_error_with_grad): each block takes a
// grid-stride share of the elements (16-byte loads where every pointer allows), writes their
// gradients and its partial sum of squares; combine_partials_one then adds the partial sums in a
// fixed order (and divides by n for the mean).
constexpr int kSquaredErrorThreads = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kSquaredErrorThreads)
    squared_error_partials(const T* __restrict__ input, const T* __restrict__ target, int64_t n, acc_t<T> unit,
                           T* __restrict__ grad, State<acc_t<T>>* __restrict__ partials) {  // (n,) x 3, (gridDim.x,)
  dependent_kernel_begin();
  using A = acc_t<T>;
  using Block = cub::BlockReduce<A, kSquaredErrorThreads>;
  __shared__ typename Block::TempStorage temp;
  A squares = 0;
  auto one = [&](T x, T y) -> T {
    const A d = to_acc(x) - to_acc(y);
    const A half = unit * d;  // the mean's share of the gradient, added twice: d(d^2) = 2 d
    squares += d * d;
    return cast_to<T>(half + half);
  };
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kSquaredErrorThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kSquaredErrorThreads;
  const int64_t vectors = n / V;
  for (int64_t i = first; i < vectors; i += stride) {
    const Packed<T, V> x = reinterpret_cast<const Packed<T, V>*>(input)[i];
    const Packed<T, V> y = reinterpret_cast<const Packed<T, V>*>(target)[i];
    Packed<T, V> g;
#pragma unroll
    for (int k = 0; k < V; ++k) g.v[k] = one(x.v[k], y.v[k]);
    reinterpret_cast<Packed<T, V>*>(grad)[i] = g;
  }
  for (int64_t i = vectors * V + first; i < n; i += stride) grad[i] = one(input[i], target[i]);
  const A block_squares = Block(temp).Sum(squares);
  if (threadIdx.x == 0) partials[blockIdx.x] = State<A>{block_squares, 0};
}
}  // namespace

void reduce(ReduceOp op, const Tensor& x, const Tensor& out) {
  dispatch_numeric(x.dtype(), reduce_op_name(op), "cuda",
                   [&](auto tag) { reduce_dispatch_op<device_t<decltype(tag)>>(op, x, out); });
}

void content_hash(const Tensor& x, const Tensor& out) {
  DeviceGuard guard(x.device().index);
  const size_t words = (x.nbytes() + 7) / 8;
  launch_dependent(content_hash_kernel, blocks_for(static_cast<int64_t>(words), 256, 132 * 8), 256, 0, stream_of(x),
                   static_cast<const unsigned char*>(x.data_ptr()), x.nbytes(), device_ptr<unsigned long long>(out));
  check_launch("content_hash");
}

void squared_error_with_grad(const Tensor& input, const Tensor& target, bool mean, const Tensor& loss,
                             const Tensor& grad) {
  dispatch_floating(input.dtype(), "mse_loss", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using A = acc_t<T>;
    NvtxRange range("mse_loss");
    const int device = input.device().index;
    DeviceGuard guard(device);
    cudaStream_t stream = stream_of(input);
    const int64_t n = input.numel();
    constexpr int V = 16 / sizeof(T);
    const bool vectorised = aligned16(input.data_ptr()) && aligned16(target.data_ptr()) && aligned16(grad.data_ptr());
    // A few blocks per SM: enough loads in flight, and few partial sums to add.
    const int blocks =
        blocks_for(vectorised ? (n + V - 1) / V : n, kSquaredErrorThreads, 4LL * multiprocessors(device));
    Tensor partials = empty({static_cast<int64_t>(blocks * sizeof(State<A>))},
                            TensorOptions(DType::u8, input.device()));  // (blocks,) State<A>
    State<A>* pp = device_ptr<State<A>>(partials);
    const A unit = mean ? static_cast<A>(1.0 / static_cast<double>(n)) : A(1);
    auto kernel = vectorised ? squared_error_partials<T, V> : squared_error_partials<T, 1>;
    launch_dependent(kernel, blocks, kSquaredErrorThreads, 0, stream, device_ptr<const T>(input),
                     device_ptr<const T>(target), n, unit, device_ptr<T>(grad), pp);
    check_launch("mse_loss");
    A* out = device_ptr<A>(loss);  // the loss in the compute type (f32 for 16-bit inputs)
    if (mean)
      launch_combine_partials<ReduceOp::mean, A, A>(pp, 1, blocks, n, out, nullptr, stream, "mse_loss total");
    else
      launch_combine_partials<ReduceOp::sum, A, A>(pp, 1, blocks, n, out, nullptr, stream, "mse_loss total");
  });
}

}  // namespace tandem::cuda
