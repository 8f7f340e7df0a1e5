// CPU kernels: small-eps-safe RMSNorm forward/backward and the sigmoid output gate.
//
// Rows (tokens) are split over threads with at::parallel_for (OpenMP, torch.set_num_threads);
// within a row every loop runs over the hidden dimension in fp32 (fp64 for fp64 inputs) and is
// written for the auto-vectorizer (`omp simd`, branch-free dtype conversions). With GCC >= 12
// on x86-64 each loop is compiled three times (AVX-512, AVX2, baseline SSE2) and the best one
// for the running CPU is picked at load time (target_clones), so the wheel stays portable.
// bf16/fp16 elements are converted to fp32 inside those loops (exactly rounded, branch-free),
// so a row is read three times (max|x|, sum of squares, output) from L1/L2 and never copied.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "checks.h"
#include "common.h"
#include "cpu_vector.h"

namespace megatron_gamma {
namespace {

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Element conversions to the accumulation type and back (inlined into the vector loops).
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
inline float to_acc(c10::BFloat16 v) { return bf16_to_float(v.x); }
inline float to_acc(c10::Half v) { return half_to_float(v.x); }
inline void put(float* p, float v) { *p = v; }
inline void put(double* p, double v) { *p = v; }
inline void put(c10::BFloat16* p, float v) { p->x = float_to_bf16(v); }
inline void put(c10::Half* p, float v) { p->x = float_to_half(v); }

// Rows per parallel task: about 16k elements, so small rows are batched.
inline int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
}

// ---------------------------------------------------------------------------------------------
// RMSNorm row primitives (S: the storage dtype, T = acc_t<S>).

template <typename S>
MG_CLONES acc_t<S> row_amax(const S* x, int64_t n) {
  using T = acc_t<S>;
  T m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const T v = to_acc(x[i]);
    const T a = v < T(0) ? -v : v;
    m = a > m ? a : m;
  }
  return m;
}

template <typename S>
MG_CLONES acc_t<S> row_sumsq(const S* x, int64_t n, acc_t<S> s) {
  using T = acc_t<S>;
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const T v = to_acc(x[i]) * s;
    acc += v * v;
  }
  return acc;
}

// y = (x * s) * r_hat * w
template <typename S>
MG_CLONES void row_normalize(S* __restrict y, const S* __restrict x, const acc_t<S>* __restrict w,
                             acc_t<S> s, acc_t<S> r_hat, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) put(y + i, (to_acc(x[i]) * s) * r_hat * w[i]);
}

// sum_i (dy_i * w_i) * (x_i * rstd)
template <typename S>
MG_CLONES acc_t<S> row_dot(const S* __restrict dy, const acc_t<S>* __restrict w,
                           const S* __restrict x, acc_t<S> rstd, int64_t n) {
  using T = acc_t<S>;
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += (to_acc(dy[i]) * w[i]) * (to_acc(x[i]) * rstd);
  return acc;
}

// dx = rstd * (dy * w - y_hat * c),  dw += dy * y_hat,  y_hat = x * rstd
template <typename S>
MG_CLONES void row_grads(S* __restrict dx, acc_t<S>* __restrict dw, const S* __restrict dy,
                         const acc_t<S>* __restrict w, const S* __restrict x, acc_t<S> rstd,
                         acc_t<S> c, int64_t n) {
  using T = acc_t<S>;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T y_hat = to_acc(x[i]) * rstd;
    const T g = to_acc(dy[i]);
    put(dx + i, rstd * (g * w[i] - y_hat * c));
    dw[i] += g * y_hat;
  }
}

template <typename T>
MG_CLONES void row_add(T* __restrict acc, const T* __restrict v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] += v[i];
}

template <typename scalar_t>
void rms_norm_fwd_rows(const scalar_t* x, const acc_t<scalar_t>* w, scalar_t* y,
                       acc_t<scalar_t>* rstd, int64_t rows, int64_t n, double eps_in) {
  using T = acc_t<scalar_t>;
  const T eps = static_cast<T>(eps_in);
  const T sqrt_eps = std::sqrt(eps);
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * n;
      const T s = rms_scale(row_amax(xr, n), sqrt_eps);
      const T mean_sq = row_sumsq(xr, n, s) / static_cast<T>(n);
      const T r_hat = T(1) / std::sqrt(mean_sq + eps * s * s);
      rstd[r] = r_hat * s;
      row_normalize(y + r * n, xr, w, s, r_hat, n);
    }
  });
}

// dx per row; dweight reduced over rows: per-thread fp32 partial sums, then summed over threads
// in a fixed order (deterministic for a given thread count).
template <typename scalar_t>
void rms_norm_bwd_rows(const scalar_t* dy, const scalar_t* x, const acc_t<scalar_t>* w,
                       const acc_t<scalar_t>* rstd, scalar_t* dx, acc_t<scalar_t>* dw_partial,
                       int64_t threads, acc_t<scalar_t>* dw, int64_t rows, int64_t n) {
  using T = acc_t<scalar_t>;
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    T* dw_t = dw_partial + at::get_thread_num() * n;
    for (int64_t r = begin; r < end; ++r) {
      const T rs = rstd[r];
      const T c = row_dot(dy + r * n, w, x + r * n, rs, n) / static_cast<T>(n);
      row_grads(dx + r * n, dw_t, dy + r * n, w, x + r * n, rs, c, n);
    }
  });
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    std::fill(dw + begin, dw + end, T(0));
    for (int64_t t = 0; t < threads; ++t) {
      row_add(dw + begin, dw_partial + t * n + begin, end - begin);
    }
  });
}

// The gain in the accumulation type, contiguous, with the +1 of zero-centered gamma applied.
at::Tensor effective_weight(const at::Tensor& weight, at::ScalarType acc, bool zero_centered) {
  at::Tensor w = weight.to(acc).contiguous();
  return zero_centered ? w.add(1) : w;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_cpu(const at::Tensor& x, const at::Tensor& weight,
                                                    double eps, bool zero_centered_gamma) {
  check_rms_norm_inputs(x, weight, eps);
  const at::Tensor xc = x.contiguous();
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor w = effective_weight(weight, acc, zero_centered_gamma);
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor rstd = at::empty(row_shape(x), x.options().dtype(acc));
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_fwd_cpu",
                                  [&] {
                                    using T = acc_t<scalar_t>;
                                    rms_norm_fwd_rows<scalar_t>(
                                        xc.const_data_ptr<scalar_t>(), w.const_data_ptr<T>(),
                                        y.mutable_data_ptr<scalar_t>(),
                                        rstd.mutable_data_ptr<T>(), rows, n, eps);
                                  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_bwd_cpu(const at::Tensor& dy, const at::Tensor& x,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& rstd,
                                                    bool zero_centered_gamma) {
  check_rms_norm_grad_inputs(dy, x, weight, rstd);
  const at::Tensor xc = x.contiguous();
  const at::Tensor dyc = dy.contiguous();
  const at::Tensor rc = rstd.contiguous();
  const auto acc = acc_dtype(x.scalar_type());
  const at::Tensor w = effective_weight(weight, acc, zero_centered_gamma);
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  const int64_t threads = at::get_num_threads();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dw = at::empty({n}, x.options().dtype(acc));
  at::Tensor partial = at::zeros({threads, n}, x.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_bwd_cpu", [&] {
        using T = acc_t<scalar_t>;
        rms_norm_bwd_rows<scalar_t>(dyc.const_data_ptr<scalar_t>(), xc.const_data_ptr<scalar_t>(),
                                    w.const_data_ptr<T>(), rc.const_data_ptr<T>(),
                                    dx.mutable_data_ptr<scalar_t>(), partial.mutable_data_ptr<T>(),
                                    threads, dw.mutable_data_ptr<T>(), rows, n);
      });
  return {dx, dw.to(weight.scalar_type())};
}

// ---------------------------------------------------------------------------------------------
// Sigmoid gate.

// exp(-a) for a >= 0 (a NaN gives NaN). fp32: Cephes expf (range reduction by ln 2 in two
// parts, degree-6 polynomial, about 1 ulp), branch-free so the loops vectorize; arguments are
// clamped at -87 so 2^n stays a normal number (exp(-87) = 1.6e-38: sigmoid(-87) and below are
// returned as 1.6e-38 instead of a smaller subnormal).
inline float exp_neg(float a) {
  const float x = a < 87.0f ? -a : -87.0f;
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest integer, |t| < 2^22
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * r) * r + r + 1.0f;
  const uint32_t scale = uint32_t(int32_t(n) + 127) << 23;
  return e * float_of(scale);
}

inline double exp_neg(double a) { return std::exp(-a); }

template <typename S>
MG_CLONES void gate_fwd_elementwise(S* __restrict y, const S* __restrict o, const S* __restrict g,
                                    int64_t n) {
  using T = acc_t<S>;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T gv = to_acc(g[i]);
    T sig, dsig;
    sigmoid_parts(gv, exp_neg(gv < T(0) ? -gv : gv), &sig, &dsig);
    put(y + i, to_acc(o[i]) * sig);
  }
}

template <typename S>
MG_CLONES void gate_bwd_elementwise(S* __restrict d_o, S* __restrict d_g, const S* __restrict dy,
                                    const S* __restrict o, const S* __restrict g, int64_t n) {
  using T = acc_t<S>;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T gv = to_acc(g[i]);
    const T dyv = to_acc(dy[i]);
    T sig, dsig;
    sigmoid_parts(gv, exp_neg(gv < T(0) ? -gv : gv), &sig, &dsig);
    put(d_o + i, dyv * sig);
    put(d_g + i, dyv * to_acc(o[i]) * dsig);
  }
}

// y = v * a
template <typename S>
MG_CLONES void row_scale(S* __restrict y, const S* __restrict v, acc_t<S> a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) put(y + i, to_acc(v[i]) * a);
}

template <typename S>
MG_CLONES acc_t<S> row_dot2(const S* __restrict a, const S* __restrict b, int64_t n) {
  acc_t<S> acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += to_acc(a[i]) * to_acc(b[i]);
  return acc;
}

template <typename T>
void sigmoid_of(T g, T* sig, T* dsig) {
  sigmoid_parts(g, exp_neg(g < T(0) ? -g : g), sig, dsig);
}

// Elementwise gates are processed in flat chunks of this many elements; headwise gates per
// head row of head_dim elements.
constexpr int64_t kGateChunk = 4096;

template <typename scalar_t>
void gate_fwd_impl(const scalar_t* o, const scalar_t* g, scalar_t* y, int64_t numel, int64_t d,
                   bool headwise) {
  using T = acc_t<scalar_t>;
  const int64_t len = headwise ? d : kGateChunk;
  const int64_t tiles = (numel + len - 1) / len;
  at::parallel_for(0, tiles, row_grain(len), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * len;
      const int64_t n = std::min(len, numel - start);
      if (headwise) {
        T sig, dsig;
        sigmoid_of(to_acc(g[t]), &sig, &dsig);
        row_scale(y + start, o + start, sig, n);
      } else {
        gate_fwd_elementwise(y + start, o + start, g + start, n);
      }
    }
  });
}

template <typename scalar_t>
void gate_bwd_impl(const scalar_t* dy, const scalar_t* o, const scalar_t* g, scalar_t* d_o,
                   scalar_t* d_g, int64_t numel, int64_t d, bool headwise) {
  using T = acc_t<scalar_t>;
  const int64_t len = headwise ? d : kGateChunk;
  const int64_t tiles = (numel + len - 1) / len;
  at::parallel_for(0, tiles, row_grain(len), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * len;
      const int64_t n = std::min(len, numel - start);
      if (headwise) {
        T sig, dsig;
        sigmoid_of(to_acc(g[t]), &sig, &dsig);
        row_scale(d_o + start, dy + start, sig, n);
        put(d_g + t, row_dot2(dy + start, o + start, n) * dsig);
      } else {
        gate_bwd_elementwise(d_o + start, d_g + start, dy + start, o + start, g + start, n);
      }
    }
  });
}

at::Tensor sigmoid_gate_fwd_cpu(const at::Tensor& o, const at::Tensor& g) {
  const bool headwise = check_gate_inputs(o, g);
  const at::Tensor oc = o.contiguous();
  const at::Tensor gc = g.contiguous();
  at::Tensor y = at::empty(o.sizes(), o.options());
  if (o.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, o.scalar_type(), "sigmoid_gate_fwd_cpu",
                                  [&] {
                                    gate_fwd_impl<scalar_t>(
                                        oc.const_data_ptr<scalar_t>(), gc.const_data_ptr<scalar_t>(),
                                        y.mutable_data_ptr<scalar_t>(), o.numel(), o.size(-1),
                                        headwise);
                                  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_gate_bwd_cpu(const at::Tensor& dy, const at::Tensor& o,
                                                        const at::Tensor& g) {
  const bool headwise = check_gate_inputs(o, g);
  TORCH_CHECK(dy.sizes() == o.sizes() && dy.scalar_type() == o.scalar_type(),
              "sigmoid_gate backward: grad ", dy.sizes(), " ", dy.scalar_type(),
              " does not match o ", o.sizes(), " ", o.scalar_type());
  const at::Tensor dyc = dy.contiguous();
  const at::Tensor oc = o.contiguous();
  const at::Tensor gc = g.contiguous();
  at::Tensor d_o = at::empty(o.sizes(), o.options());
  at::Tensor d_g = at::empty(g.sizes(), g.options());
  if (o.numel() == 0) return {d_o, d_g.zero_()};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, o.scalar_type(), "sigmoid_gate_bwd_cpu", [&] {
        gate_bwd_impl<scalar_t>(dyc.const_data_ptr<scalar_t>(), oc.const_data_ptr<scalar_t>(),
                                gc.const_data_ptr<scalar_t>(), d_o.mutable_data_ptr<scalar_t>(),
                                d_g.mutable_data_ptr<scalar_t>(), o.numel(), o.size(-1),
                                headwise);
      });
  return {d_o, d_g};
}

}  // namespace

TORCH_LIBRARY_IMPL(megatron_gamma, CPU, m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd_cpu);
  m.impl("rms_norm_bwd", &rms_norm_bwd_cpu);
  m.impl("sigmoid_gate_fwd", &sigmoid_gate_fwd_cpu);
  m.impl("sigmoid_gate_bwd", &sigmoid_gate_bwd_cpu);
}

}  // namespace megatron_gamma
