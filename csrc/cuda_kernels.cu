// CUDA kernels: small-eps-safe RMSNorm forward/backward and the sigmoid output gate.
//
// RMSNorm forward and dx: one thread block per row (grid-stride over rows), fp32 accumulation
// (fp64 for fp64), 16-byte vector loads when the row allows. A row is read three times
// (max|x|, sum of scaled squares, output); the second and third reads hit L1/L2.
// dweight: a deterministic two-stage column reduction (per-block partial sums over row slices,
// then one sum per column in a fixed order), no atomics.
// Numerics (power-of-two row scale, eps in fp32, sigmoid from exp(-|g|)): common.h.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "checks.h"
#include "common.h"

namespace megatron_gamma {
namespace {

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <int VEC, typename T>
__device__ __forceinline__ Vec<T, VEC> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, VEC>& v) {
  *reinterpret_cast<Vec<T, VEC>*>(p) = v;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// max for non-negative values; a NaN operand is dropped (the NaN reaches the output through
// the sum of squares instead).
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Reduce over the block; every thread gets the result. `smem` holds kWarp values; the leading
// __syncthreads makes back-to-back calls with the same buffer safe.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* smem) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T r = lane < warps ? smem[lane] : identity;
  return warp_reduce(r, op);
}

// Threads per row block: enough for about 4 vectors per thread, a multiple of 32, <= 1024.
int row_threads(int64_t n, int vec) {
  const int64_t vectors = (n + vec - 1) / vec;
  const int64_t t = ((vectors + 3) / 4 + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(t, kWarp), kMaxThreads));
}

int row_blocks(int64_t rows) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(rows, 1), int64_t(1) << 30));
}

template <typename scalar_t>
int vec_width(int64_t n, std::initializer_list<const void*> ptrs) {
  constexpr int kVec = sizeof(scalar_t) >= 16 ? 1 : 16 / sizeof(scalar_t);
  if (n % kVec != 0) return 1;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  }
  return kVec;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm forward: y = (x * s) * r_hat * w, rstd = r_hat * s.

template <typename scalar_t, int VEC>
__global__ void rms_norm_fwd_kernel(const scalar_t* __restrict__ x, const acc_t<scalar_t>* __restrict__ w,
                                    scalar_t* __restrict__ y, acc_t<scalar_t>* __restrict__ rstd,
                                    int64_t rows, int64_t n, acc_t<scalar_t> eps,
                                    acc_t<scalar_t> sqrt_eps) {
  using T = acc_t<scalar_t>;
  __shared__ T smem[kWarp];
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* xr = x + row * n;
    scalar_t* yr = y + row * n;
    T amax = 0;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < n; i += step) {
      const Vec<scalar_t, VEC> xv = load_vec<VEC>(xr + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) amax = MaxOp()(amax, fabs(static_cast<T>(xv.v[k])));
    }
    const T s = rms_scale(block_reduce(amax, MaxOp(), T(0), smem), sqrt_eps);
    T sumsq = 0;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < n; i += step) {
      const Vec<scalar_t, VEC> xv = load_vec<VEC>(xr + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const T v = static_cast<T>(xv.v[k]) * s;
        sumsq += v * v;
      }
    }
    sumsq = block_reduce(sumsq, SumOp(), T(0), smem);
    const T r_hat = T(1) / sqrt(sumsq / static_cast<T>(n) + eps * s * s);
    if (threadIdx.x == 0) rstd[row] = r_hat * s;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < n; i += step) {
      const Vec<scalar_t, VEC> xv = load_vec<VEC>(xr + i);
      Vec<scalar_t, VEC> yv;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        yv.v[k] = static_cast<scalar_t>((static_cast<T>(xv.v[k]) * s) * r_hat * w[i + k]);
      }
      store_vec<VEC>(yr + i, yv);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm backward dx = rstd * (dy * w - y_hat * mean(dy * w * y_hat)), y_hat = x * rstd.

template <typename scalar_t, int VEC>
__global__ void rms_norm_bwd_dx_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                       const acc_t<scalar_t>* __restrict__ w,
                                       const acc_t<scalar_t>* __restrict__ rstd,
                                       scalar_t* __restrict__ dx, int64_t rows, int64_t n) {
  using T = acc_t<scalar_t>;
  __shared__ T smem[kWarp];
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const scalar_t* xr = x + row * n;
    const scalar_t* dyr = dy + row * n;
    scalar_t* dxr = dx + row * n;
    const T rs = rstd[row];
    T dot = 0;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < n; i += step) {
      const Vec<scalar_t, VEC> xv = load_vec<VEC>(xr + i);
      const Vec<scalar_t, VEC> dyv = load_vec<VEC>(dyr + i);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        dot += (static_cast<T>(dyv.v[k]) * w[i + k]) * (static_cast<T>(xv.v[k]) * rs);
      }
    }
    const T c = block_reduce(dot, SumOp(), T(0), smem) / static_cast<T>(n);
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < n; i += step) {
      const Vec<scalar_t, VEC> xv = load_vec<VEC>(xr + i);
      const Vec<scalar_t, VEC> dyv = load_vec<VEC>(dyr + i);
      Vec<scalar_t, VEC> dxv;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const T y_hat = static_cast<T>(xv.v[k]) * rs;
        dxv.v[k] = static_cast<scalar_t>(rs * (static_cast<T>(dyv.v[k]) * w[i + k] - y_hat * c));
      }
      store_vec<VEC>(dxr + i, dxv);
    }
  }
}

// dweight stage 1: block (32 columns, 8 row lanes) sums dy * x * rstd over the rows
// blockIdx.y * 8 + ty + k * gridDim.y * 8 of its 32 columns into partial[blockIdx.y][col].
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

template <typename scalar_t>
__global__ void rms_norm_bwd_dw_partial_kernel(const scalar_t* __restrict__ dy,
                                               const scalar_t* __restrict__ x,
                                               const acc_t<scalar_t>* __restrict__ rstd,
                                               acc_t<scalar_t>* __restrict__ partial, int64_t rows,
                                               int64_t n) {
  using T = acc_t<scalar_t>;
  __shared__ T tile[kRowLanes][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  T acc = 0;
  if (col < n) {
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * kRowLanes + threadIdx.y; row < rows;
         row += static_cast<int64_t>(gridDim.y) * kRowLanes) {
      const int64_t idx = row * n + col;
      acc += static_cast<T>(dy[idx]) * (static_cast<T>(x[idx]) * rstd[row]);
    }
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    T sum = 0;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) sum += tile[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * n + col] = sum;
  }
}

// dweight stage 2: dw[col] = sum over the partial rows, in order.
template <typename T>
__global__ void rms_norm_bwd_dw_final_kernel(const T* __restrict__ partial, T* __restrict__ dw,
                                             int64_t parts, int64_t n) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  T sum = 0;
  for (int64_t p = 0; p < parts; ++p) sum += partial[p * n + col];
  dw[col] = sum;
}

int sm_count() {
  int device = 0;
  int count = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

at::Tensor effective_weight(const at::Tensor& weight, at::ScalarType acc, bool zero_centered) {
  at::Tensor w = weight.to(acc).contiguous();
  return zero_centered ? w.add(1) : w;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_cuda(const at::Tensor& x, const at::Tensor& weight,
                                                     double eps, bool zero_centered_gamma) {
  check_rms_norm_inputs(x, weight, eps);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor w = effective_weight(weight, acc, zero_centered_gamma);
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor rstd = at::empty(row_shape(x), x.options().dtype(acc));
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  if (rows == 0) return {y, rstd};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_fwd_cuda", [&] {
        using T = acc_t<scalar_t>;
        const T eps_acc = static_cast<T>(eps);
        const T sqrt_eps = std::sqrt(eps_acc);
        const scalar_t* xp = xc.const_data_ptr<scalar_t>();
        scalar_t* yp = y.mutable_data_ptr<scalar_t>();
        const int vec = vec_width<scalar_t>(n, {xp, yp});
        const int threads = row_threads(n, vec);
        if (vec == 1) {
          rms_norm_fwd_kernel<scalar_t, 1><<<row_blocks(rows), threads, 0, stream>>>(
              xp, w.const_data_ptr<T>(), yp, rstd.mutable_data_ptr<T>(), rows, n, eps_acc,
              sqrt_eps);
        } else {
          constexpr int kVec = sizeof(scalar_t) >= 16 ? 1 : 16 / sizeof(scalar_t);
          rms_norm_fwd_kernel<scalar_t, kVec><<<row_blocks(rows), threads, 0, stream>>>(
              xp, w.const_data_ptr<T>(), yp, rstd.mutable_data_ptr<T>(), rows, n, eps_acc,
              sqrt_eps);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                     const at::Tensor& weight,
                                                     const at::Tensor& rstd,
                                                     bool zero_centered_gamma) {
  check_rms_norm_grad_inputs(dy, x, weight, rstd);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor dyc = dy.contiguous();
  const at::Tensor rc = rstd.contiguous();
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor w = effective_weight(weight, acc, zero_centered_gamma);
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dw = at::empty({n}, x.options().dtype(acc));
  if (rows == 0) return {dx, dw.zero_().to(weight.scalar_type())};
  // Stage-1 blocks: about 8 per SM over all column tiles, each with at least 8 rows' work.
  const int64_t col_tiles = (n + kColTile - 1) / kColTile;
  const int64_t max_parts = (rows + kRowLanes - 1) / kRowLanes;
  const int64_t parts = std::min<int64_t>(
      std::max<int64_t>(int64_t(8) * sm_count() / col_tiles, 1), std::min<int64_t>(max_parts, 1024));
  at::Tensor partial = at::empty({parts, n}, x.options().dtype(acc));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_bwd_cuda", [&] {
        using T = acc_t<scalar_t>;
        const scalar_t* xp = xc.const_data_ptr<scalar_t>();
        const scalar_t* dyp = dyc.const_data_ptr<scalar_t>();
        scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
        const int vec = vec_width<scalar_t>(n, {xp, dyp, dxp});
        const int threads = row_threads(n, vec);
        if (vec == 1) {
          rms_norm_bwd_dx_kernel<scalar_t, 1><<<row_blocks(rows), threads, 0, stream>>>(
              dyp, xp, w.const_data_ptr<T>(), rc.const_data_ptr<T>(), dxp, rows, n);
        } else {
          constexpr int kVec = sizeof(scalar_t) >= 16 ? 1 : 16 / sizeof(scalar_t);
          rms_norm_bwd_dx_kernel<scalar_t, kVec><<<row_blocks(rows), threads, 0, stream>>>(
              dyp, xp, w.const_data_ptr<T>(), rc.const_data_ptr<T>(), dxp, rows, n);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(parts));
        const dim3 block(kColTile, kRowLanes);
        rms_norm_bwd_dw_partial_kernel<scalar_t><<<grid, block, 0, stream>>>(
            dyp, xp, rc.const_data_ptr<T>(), partial.mutable_data_ptr<T>(), rows, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        constexpr int kFinalThreads = 256;
        const unsigned final_blocks = static_cast<unsigned>((n + kFinalThreads - 1) / kFinalThreads);
        rms_norm_bwd_dw_final_kernel<T><<<final_blocks, kFinalThreads, 0, stream>>>(
            partial.const_data_ptr<T>(), dw.mutable_data_ptr<T>(), parts, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return {dx, dw.to(weight.scalar_type())};
}

// ---------------------------------------------------------------------------------------------
// Sigmoid gate.

__device__ __forceinline__ float exp_neg(float a) { return expf(-a); }
__device__ __forceinline__ double exp_neg(double a) { return exp(-a); }

// y[i] = o[i] * sigmoid(g[headwise ? i / d : i])
template <typename scalar_t>
__global__ void gate_fwd_kernel(const scalar_t* __restrict__ o, const scalar_t* __restrict__ g,
                                scalar_t* __restrict__ y, int64_t numel, int64_t d, bool headwise) {
  using T = acc_t<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    const T gv = static_cast<T>(g[headwise ? i / d : i]);
    T sig, dsig;
    sigmoid_parts(gv, exp_neg(fabs(gv)), &sig, &dsig);
    y[i] = static_cast<scalar_t>(static_cast<T>(o[i]) * sig);
  }
}

template <typename scalar_t>
__global__ void gate_bwd_elementwise_kernel(const scalar_t* __restrict__ dy,
                                            const scalar_t* __restrict__ o,
                                            const scalar_t* __restrict__ g,
                                            scalar_t* __restrict__ d_o, scalar_t* __restrict__ d_g,
                                            int64_t numel) {
  using T = acc_t<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    const T gv = static_cast<T>(g[i]);
    const T dyv = static_cast<T>(dy[i]);
    T sig, dsig;
    sigmoid_parts(gv, exp_neg(fabs(gv)), &sig, &dsig);
    d_o[i] = static_cast<scalar_t>(dyv * sig);
    d_g[i] = static_cast<scalar_t>(dyv * static_cast<T>(o[i]) * dsig);
  }
}

// One warp per head row of d elements: d_o = dy * sigmoid(g), d_g = sigmoid'(g) * sum(dy * o).
constexpr int kGateWarps = 8;

template <typename scalar_t>
__global__ void gate_bwd_headwise_kernel(const scalar_t* __restrict__ dy,
                                         const scalar_t* __restrict__ o,
                                         const scalar_t* __restrict__ g,
                                         scalar_t* __restrict__ d_o, scalar_t* __restrict__ d_g,
                                         int64_t rows, int64_t d) {
  using T = acc_t<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kGateWarps + threadIdx.x / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kGateWarps;
  for (int64_t row = warp; row < rows; row += warps) {
    const T gv = static_cast<T>(g[row]);
    T sig, dsig;
    sigmoid_parts(gv, exp_neg(fabs(gv)), &sig, &dsig);
    T dot = 0;
    for (int64_t j = lane; j < d; j += kWarp) {
      const int64_t idx = row * d + j;
      const T dyv = static_cast<T>(dy[idx]);
      dot += dyv * static_cast<T>(o[idx]);
      d_o[idx] = static_cast<scalar_t>(dyv * sig);
    }
    dot = warp_reduce(dot, SumOp());
    if (lane == 0) d_g[row] = static_cast<scalar_t>(dot * dsig);
  }
}

unsigned elementwise_blocks(int64_t numel, int threads) {
  return static_cast<unsigned>(
      std::min<int64_t>((numel + threads - 1) / threads, int64_t(sm_count()) * 32));
}

at::Tensor sigmoid_gate_fwd_cuda(const at::Tensor& o, const at::Tensor& g) {
  const bool headwise = check_gate_inputs(o, g);
  const c10::cuda::CUDAGuard guard(o.device());
  const at::Tensor oc = o.contiguous();
  const at::Tensor gc = g.contiguous();
  at::Tensor y = at::empty(o.sizes(), o.options());
  const int64_t numel = o.numel();
  if (numel == 0) return y;
  constexpr int kThreads = 256;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, o.scalar_type(), "sigmoid_gate_fwd_cuda", [&] {
        gate_fwd_kernel<scalar_t><<<elementwise_blocks(numel, kThreads), kThreads, 0, stream>>>(
            oc.const_data_ptr<scalar_t>(), gc.const_data_ptr<scalar_t>(),
            y.mutable_data_ptr<scalar_t>(), numel, o.size(-1), headwise);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return y;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_gate_bwd_cuda(const at::Tensor& dy, const at::Tensor& o,
                                                         const at::Tensor& g) {
  const bool headwise = check_gate_inputs(o, g);
  TORCH_CHECK(dy.sizes() == o.sizes() && dy.scalar_type() == o.scalar_type(),
              "sigmoid_gate backward: grad ", dy.sizes(), " ", dy.scalar_type(),
              " does not match o ", o.sizes(), " ", o.scalar_type());
  const c10::cuda::CUDAGuard guard(o.device());
  const at::Tensor dyc = dy.contiguous();
  const at::Tensor oc = o.contiguous();
  const at::Tensor gc = g.contiguous();
  at::Tensor d_o = at::empty(o.sizes(), o.options());
  at::Tensor d_g = at::empty(g.sizes(), g.options());
  const int64_t numel = o.numel();
  if (numel == 0) return {d_o, d_g.zero_()};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, o.scalar_type(), "sigmoid_gate_bwd_cuda", [&] {
        if (headwise) {
          const int64_t d = o.size(-1);
          const int64_t rows = numel / d;
          const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(
              (rows + kGateWarps - 1) / kGateWarps, int64_t(sm_count()) * 32));
          gate_bwd_headwise_kernel<scalar_t><<<blocks, kGateWarps * kWarp, 0, stream>>>(
              dyc.const_data_ptr<scalar_t>(), oc.const_data_ptr<scalar_t>(),
              gc.const_data_ptr<scalar_t>(), d_o.mutable_data_ptr<scalar_t>(),
              d_g.mutable_data_ptr<scalar_t>(), rows, d);
        } else {
          constexpr int kThreads = 256;
          gate_bwd_elementwise_kernel<scalar_t>
              <<<elementwise_blocks(numel, kThreads), kThreads, 0, stream>>>(
                  dyc.const_data_ptr<scalar_t>(), oc.const_data_ptr<scalar_t>(),
                  gc.const_data_ptr<scalar_t>(), d_o.mutable_data_ptr<scalar_t>(),
                  d_g.mutable_data_ptr<scalar_t>(), numel);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return {d_o, d_g};
}

}  // namespace

TORCH_LIBRARY_IMPL(megatron_gamma, CUDA, m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd_cuda);
  m.impl("rms_norm_bwd", &rms_norm_bwd_cuda);
  m.impl("sigmoid_gate_fwd", &sigmoid_gate_fwd_cuda);
  m.impl("sigmoid_gate_bwd", &sigmoid_gate_bwd_cuda);
}

}  // namespace megatron_gamma
