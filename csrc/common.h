// Numerics shared by the CPU and CUDA kernels (host and device code).
//
// RMSNorm contract (see megatron_gamma/ops/reference.py, which implements the same in torch):
//
//   y = x / sqrt(mean(x^2) + eps) * w                  per row of `hidden` elements
//
// computed as
//
//   s     = 2^-e  where  max(max|x|, sqrt(eps)) = f * 2^e,  f in [0.5, 1)   (frexp)
//   x_hat = x * s                                         every |x_hat| < 1
//   r_hat = 1 / sqrt(mean(x_hat^2) + eps * s * s)
//   y     = x_hat * r_hat * w,     rstd = r_hat * s  (= 1 / sqrt(mean(x^2) + eps), saved)
//
// with every step in the accumulation type (fp32 for fp32/bf16/fp16 inputs, fp64 for fp64).
// Multiplying by a power of two is exact, so this equals the textbook formula in exact
// arithmetic and in rounding; it only removes the range problems: squares of tiny rows never
// underflow and squares of huge rows never overflow. eps is converted once from the Python
// float to the accumulation type (never to the input dtype: 1e-12 is 0 in fp16) and is added
// to the mean square of the *unscaled* row, which is what the scaled form computes.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif

namespace megatron_gamma {

MG_HOST_DEVICE float mg_frexp(float v, int* e) { return frexpf(v, e); }
MG_HOST_DEVICE double mg_frexp(double v, int* e) { return frexp(v, e); }
MG_HOST_DEVICE float mg_ldexp(float v, int e) { return ldexpf(v, e); }
MG_HOST_DEVICE double mg_ldexp(double v, int e) { return ldexp(v, e); }

// The power-of-two row scale s of the contract above. Non-finite rows get s = 1 so that the
// NaN/inf reaches the output unchanged.
template <typename acc_t>
MG_HOST_DEVICE acc_t rms_scale(acc_t amax, acc_t sqrt_eps) {
  const acc_t m = amax > sqrt_eps ? amax : sqrt_eps;
  if (!(m - m == acc_t(0))) {
    return acc_t(1);
  }
  int e = 0;
  mg_frexp(m, &e);
  return mg_ldexp(acc_t(1), -e);
}

// Sigmoid and its derivative from e = exp(-|g|) in (0, 1]:
//   p = sigmoid(|g|) = 1 / (1 + e),  q = sigmoid(-|g|) = e * p,
//   sigmoid(g) = g >= 0 ? p : q,     sigmoid'(g) = p * q.
// Both factors are computed directly, so sigmoid' keeps full relative precision for large |g|
// (1 - sigmoid(g) would cancel to 0).
template <typename acc_t>
MG_HOST_DEVICE void sigmoid_parts(acc_t g, acc_t e, acc_t* sig, acc_t* dsig) {
  const acc_t p = acc_t(1) / (acc_t(1) + e);
  const acc_t q = e * p;
  *sig = g >= acc_t(0) ? p : q;
  *dsig = p * q;
}

}  // namespace megatron_gamma
