// CPU kernels: small-eps-safe RMSNorm forward/backward and the sigmoid output gate.
//
// Rows (tokens) are split over threads with at::parallel_for (OpenMP, torch.set_num_threads);
// within a row every loop runs over the hidden dimension in fp32 (fp64 for fp64 inputs) and is
// written for the auto-vectorizer (`omp simd`, branch-free dtype conversions). With GCC >= 12
// on x86-64 each loop is compiled three times (AVX-512, AVX2, baseline SSE2) and the best one
// for the running CPU is picked at load time (target_clones), so the wheel stays portable.
// bf16/fp16 rows are converted to fp32 in a per-thread buffer of `hidden` floats (L1/L2).
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
#include <vector>

#include "checks.h"
#include "common.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    __GNUC__ >= 12
#define MG_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MG_CLONES
#endif

namespace megatron_gamma {
namespace {

// ---------------------------------------------------------------------------------------------
// Branch-free, exactly rounded dtype conversions (vectorizable; bit-identical to c10's).

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float bf16_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

// Round to nearest even; NaN -> canonical quiet NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t is_nan = 0u - uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return uint16_t((0x7fc0u & is_nan) | (rounded & ~is_nan));
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = uint32_t(h & 0x7fffu);
  const uint32_t normal = (em << 13) + (112u << 23);     // rebias exponent 15 -> 127
  const uint32_t infnan = normal + (112u << 23);         // exponent 31 -> 255
  const uint32_t sub = bits_of(float(int32_t(em)) * 5.9604644775390625e-08f);  // em * 2^-24
  const uint32_t is_sub = 0u - uint32_t(em < 0x0400u);
  const uint32_t is_inf = 0u - uint32_t(em >= 0x7c00u);
  return float_of(sign | (sub & is_sub) | (infnan & is_inf) | (normal & ~(is_sub | is_inf)));
}

// Round to nearest even with fp16 subnormals, overflow to inf, NaN -> quiet NaN
// (the float-arithmetic algorithm of FP16 / c10::detail::fp16_ieee_from_fp32_value).
inline uint16_t float_to_half(float f) {
  const float scale_to_inf = float_of(239u << 23);   // 2^112
  const float scale_to_zero = float_of(17u << 23);   // 2^-110
  const uint32_t w = bits_of(f);
  float base = (float_of(w & 0x7fffffffu) * scale_to_inf) * scale_to_zero;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = bits_of(base);
  const uint32_t nonsign = ((b >> 13) & 0x00007c00u) + (b & 0x00000fffu);
  return uint16_t((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

MG_CLONES void load_row(float* dst, const c10::BFloat16* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i].x);
}

MG_CLONES void load_row(float* dst, const c10::Half* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i].x);
}

MG_CLONES void store_row(c10::BFloat16* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i].x = float_to_bf16(src[i]);
}

MG_CLONES void store_row(c10::Half* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i].x = float_to_half(src[i]);
}

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// A row in the accumulation type: the input itself when it already is, else `buf` filled.
template <typename scalar_t>
const acc_t<scalar_t>* acc_row(const scalar_t* src, acc_t<scalar_t>* buf, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, acc_t<scalar_t>>) {
    return src;
  } else {
    load_row(buf, src, n);
    return buf;
  }
}

// Where to compute an output row: the output itself when it has the accumulation type, else
// `buf`, converted by commit_row.
template <typename scalar_t>
acc_t<scalar_t>* out_row(scalar_t* dst, acc_t<scalar_t>* buf) {
  if constexpr (std::is_same_v<scalar_t, acc_t<scalar_t>>) {
    return dst;
  } else {
    return buf;
  }
}

template <typename scalar_t>
void commit_row(scalar_t* dst, const acc_t<scalar_t>* buf, int64_t n) {
  if constexpr (!std::is_same_v<scalar_t, acc_t<scalar_t>>) {
    store_row(dst, buf, n);
  }
}

// Row buffer of the accumulation type, empty when the input already has that type.
template <typename scalar_t>
std::vector<acc_t<scalar_t>> row_buffer(int64_t n) {
  return std::vector<acc_t<scalar_t>>(std::is_same_v<scalar_t, acc_t<scalar_t>> ? 0 : n);
}

// Rows per parallel task: about 16k elements, so small rows are batched.
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// ---------------------------------------------------------------------------------------------
// RMSNorm row primitives (T = float or double).

template <typename T>
MG_CLONES T row_amax(const T* x, int64_t n) {
  T m = 0;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const T a = x[i] < T(0) ? -x[i] : x[i];
    m = a > m ? a : m;
  }
  return m;
}

template <typename T>
MG_CLONES T row_sumsq(const T* x, int64_t n, T s) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i] * s;
    acc += v * v;
  }
  return acc;
}

// y = (x * s) * r_hat * w
template <typename T>
MG_CLONES void row_normalize(T* __restrict y, const T* __restrict x, const T* __restrict w, T s,
                             T r_hat, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * s) * r_hat * w[i];
}

// sum_i (dy_i * w_i) * (x_i * rstd)
template <typename T>
MG_CLONES T row_dot(const T* __restrict dy, const T* __restrict w, const T* __restrict x, T rstd,
                    int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += (dy[i] * w[i]) * (x[i] * rstd);
  return acc;
}

// dx = rstd * (dy * w - y_hat * c),  dw += dy * y_hat,  y_hat = x * rstd
template <typename T>
MG_CLONES void row_grads(T* __restrict dx, T* __restrict dw, const T* __restrict dy,
                         const T* __restrict w, const T* __restrict x, T rstd, T c, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T y_hat = x[i] * rstd;
    dx[i] = rstd * (dy[i] * w[i] - y_hat * c);
    dw[i] += dy[i] * y_hat;
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
    auto xbuf = row_buffer<scalar_t>(n);
    auto ybuf = row_buffer<scalar_t>(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = acc_row(x + r * n, xbuf.data(), n);
      const T s = rms_scale(row_amax(xr, n), sqrt_eps);
      const T mean_sq = row_sumsq(xr, n, s) / static_cast<T>(n);
      const T r_hat = T(1) / std::sqrt(mean_sq + eps * s * s);
      rstd[r] = r_hat * s;
      T* yr = out_row(y + r * n, ybuf.data());
      row_normalize(yr, xr, w, s, r_hat, n);
      commit_row(y + r * n, yr, n);
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
    auto xbuf = row_buffer<scalar_t>(n);
    auto dybuf = row_buffer<scalar_t>(n);
    auto dxbuf = row_buffer<scalar_t>(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = acc_row(x + r * n, xbuf.data(), n);
      const T* dyr = acc_row(dy + r * n, dybuf.data(), n);
      const T rs = rstd[r];
      const T c = row_dot(dyr, w, xr, rs, n) / static_cast<T>(n);
      T* dxr = out_row(dx + r * n, dxbuf.data());
      row_grads(dxr, dw_t, dyr, w, xr, rs, c, n);
      commit_row(dx + r * n, dxr, n);
    }
  });
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    std::fill(dw + begin, dw + end, T(0));
    for (int64_t t = 0; t < threads; ++t) row_add(dw + begin, dw_partial + t * n + begin, end - begin);
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

template <typename T>
MG_CLONES void gate_fwd_elementwise(T* __restrict y, const T* __restrict o, const T* __restrict g,
                                    int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T sig, dsig;
    sigmoid_parts(g[i], exp_neg(g[i] < T(0) ? -g[i] : g[i]), &sig, &dsig);
    y[i] = o[i] * sig;
  }
}

template <typename T>
MG_CLONES void gate_bwd_elementwise(T* __restrict d_o, T* __restrict d_g, const T* __restrict dy,
                                    const T* __restrict o, const T* __restrict g, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T sig, dsig;
    sigmoid_parts(g[i], exp_neg(g[i] < T(0) ? -g[i] : g[i]), &sig, &dsig);
    d_o[i] = dy[i] * sig;
    d_g[i] = dy[i] * o[i] * dsig;
  }
}

template <typename T>
MG_CLONES void row_scale(T* __restrict y, const T* __restrict v, T a, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = v[i] * a;
}

template <typename T>
MG_CLONES T row_dot2(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Elementwise gates are processed in flat chunks of this many elements.
constexpr int64_t kGateChunk = 4096;

template <typename scalar_t>
void gate_fwd_impl(const scalar_t* o, const scalar_t* g, scalar_t* y, int64_t numel, int64_t d,
                   bool headwise) {
  using T = acc_t<scalar_t>;
  const int64_t len = headwise ? d : kGateChunk;
  const int64_t tiles = (numel + len - 1) / len;
  at::parallel_for(0, tiles, row_grain(len), [&](int64_t begin, int64_t end) {
    auto obuf = row_buffer<scalar_t>(len);
    auto gbuf = row_buffer<scalar_t>(len);
    auto ybuf = row_buffer<scalar_t>(len);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * len;
      const int64_t n = std::min(len, numel - start);
      const T* ot = acc_row(o + start, obuf.data(), n);
      T* yt = out_row(y + start, ybuf.data());
      if (headwise) {
        const T gv = static_cast<T>(g[t]);
        T sig, dsig;
        sigmoid_parts(gv, exp_neg(gv < T(0) ? -gv : gv), &sig, &dsig);
        row_scale(yt, ot, sig, n);
      } else {
        gate_fwd_elementwise(yt, ot, acc_row(g + start, gbuf.data(), n), n);
      }
      commit_row(y + start, yt, n);
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
    auto dybuf = row_buffer<scalar_t>(len);
    auto obuf = row_buffer<scalar_t>(len);
    auto gbuf = row_buffer<scalar_t>(len);
    auto dobuf = row_buffer<scalar_t>(len);
    auto dgbuf = row_buffer<scalar_t>(len);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * len;
      const int64_t n = std::min(len, numel - start);
      const T* dyt = acc_row(dy + start, dybuf.data(), n);
      const T* ot = acc_row(o + start, obuf.data(), n);
      T* d_ot = out_row(d_o + start, dobuf.data());
      if (headwise) {
        const T gv = static_cast<T>(g[t]);
        T sig, dsig;
        sigmoid_parts(gv, exp_neg(gv < T(0) ? -gv : gv), &sig, &dsig);
        row_scale(d_ot, dyt, sig, n);
        d_g[t] = static_cast<scalar_t>(row_dot2(dyt, ot, n) * dsig);
      } else {
        T* dgt = out_row(d_g + start, dgbuf.data());
        gate_bwd_elementwise(d_ot, dgt, dyt, ot, acc_row(g + start, gbuf.data(), n), n);
        commit_row(d_g + start, dgt, n);
      }
      commit_row(d_o + start, d_ot, n);
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
