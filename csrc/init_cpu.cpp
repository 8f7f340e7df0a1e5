// CPU kernels of the gamma-init: the counter-based normal generator and the init audit's
// streaming moments.
//
// counter_normal_ implements, operation for operation, the algorithm of
// megatron_gamma/model/counter_rng.py (whose torch implementation runs on GPUs and where the
// extension is not built): a keyed SplitMix64 hash per pair of elements, then Box-Muller in
// float64 using only IEEE-754 basic operations (+, -, *, /, sqrt; no fused multiply-add: the
// extension is compiled with -ffp-contract=off), each correctly rounded on every CPU and GPU,
// so the result is the same float32 bits as the torch implementation's, wherever it runs:
//   ln u1    exact exponent/mantissa split of the integer (x >> 32) + 1, then
//            ln m = 2 atanh(s), s = (m - 1) / (m + 1), as a degree-10 series in s^2;
//   cos/sin  exact quadrant reduction of the 32-bit angle word, then Taylor series (to a^16 and
//            a^15) on |a| <= pi/4.
// The loops are written for the auto-vectorizer (branch-free, `omp simd`) and compiled for
// AVX-512, AVX2 and SSE2 (target_clones, as cpu_kernels.cpp); without FMA contraction all three
// give the same bits.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_vector.h"

namespace megatron_gamma {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMul1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMul2 = 0x94D049BB133111EBull;
constexpr uint64_t kMantissa = 0x000FFFFFFFFFFFFFull;
constexpr uint64_t kSqrt2Mantissa = 0x6A09E667F3BCDull;  // mantissa bits of sqrt(2)
constexpr double kLn2 = 0.6931471805599453;               // ln 2 rounded to double
constexpr double kAngleUnit = 3.141592653589793 / 2147483648.0;  // (pi / 2) / 2^30
constexpr double kTwo52 = 4503599627370496.0;
constexpr int64_t kPairsPerStep = 2048;  // a 16 KiB float32 buffer per task

inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= kMul1;
  x ^= x >> 27;
  x *= kMul2;
  return x ^ (x >> 31);
}

// ln(n * 2^-32) for an integer n in [1, 2^32].
inline double log_u1(uint64_t n) {
  const uint64_t b = bits_of(double_of(0x4330000000000000ull | n) - kTwo52);  // exact n
  const uint64_t big = (b & kMantissa) >= kSqrt2Mantissa ? 1 : 0;
  const double m = double_of((b & kMantissa) | ((1023 - big) << 52));  // [sqrt(1/2), sqrt(2))
  const int32_t e = int32_t(b >> 52) - 1023 + int32_t(big) - 32;
  const double f = m - 1.0;
  const double s = f / (f + 2.0);
  const double z = s * s;
  double p = 1.0 / 21.0;
  p = p * z + 1.0 / 19.0;
  p = p * z + 1.0 / 17.0;
  p = p * z + 1.0 / 15.0;
  p = p * z + 1.0 / 13.0;
  p = p * z + 1.0 / 11.0;
  p = p * z + 1.0 / 9.0;
  p = p * z + 1.0 / 7.0;
  p = p * z + 1.0 / 5.0;
  p = p * z + 1.0 / 3.0;
  p = p * z + 1.0;
  return double(e) * kLn2 + (s + s) * p;
}

// (cos, sin) of 2 pi w / 2^32 for a 32-bit word w.
inline void cos_sin_turns(uint32_t w, double* c, double* s) {
  const uint32_t shifted = w + (1u << 29);  // mod 2^32
  const uint32_t q = shifted >> 30;
  const int32_t r = int32_t(shifted & ((1u << 30) - 1)) - (1 << 29);  // w - q 2^30 (mod 2^32)
  const double a = double(r) * kAngleUnit;                               // |a| <= pi / 4
  const double z = a * a;
  double sp = -1.0 / 1307674368000.0;  // -1/15!
  sp = sp * z + 1.0 / 6227020800.0;    // 1/13!
  sp = sp * z - 1.0 / 39916800.0;      // -1/11!
  sp = sp * z + 1.0 / 362880.0;        // 1/9!
  sp = sp * z - 1.0 / 5040.0;          // -1/7!
  sp = sp * z + 1.0 / 120.0;           // 1/5!
  sp = sp * z - 1.0 / 6.0;             // -1/3!
  double cp = 1.0 / 20922789888000.0;  // 1/16!
  cp = cp * z - 1.0 / 87178291200.0;   // -1/14!
  cp = cp * z + 1.0 / 479001600.0;     // 1/12!
  cp = cp * z - 1.0 / 3628800.0;       // -1/10!
  cp = cp * z + 1.0 / 40320.0;         // 1/8!
  cp = cp * z - 1.0 / 720.0;           // -1/6!
  cp = cp * z + 1.0 / 24.0;            // 1/4!
  cp = cp * z - 0.5;                   // -1/2!
  const double sin_a = a + (a * z) * sp;
  const double cos_a = 1.0 + z * cp;
  const double c0 = (q & 1u) ? sin_a : cos_a;
  const double s0 = (q & 1u) ? cos_a : sin_a;
  *c = ((q + 1u) & 2u) ? -c0 : c0;  // quadrants 1, 2
  *s = (q & 2u) ? -s0 : s0;         // quadrants 2, 3
}

// out[2t], out[2t + 1] = the cosine and sine normals of pair counter j0 + t, t < n.
MG_CLONES void normal_pairs(float* __restrict out, uint64_t j0, int64_t n, uint64_t key,
                            double sigma) {
#pragma omp simd
  for (int64_t t = 0; t < n; ++t) {
    const uint64_t x = mix(key + (j0 + uint64_t(t) + 1) * kGolden);
    const double radius = std::sqrt(log_u1((x >> 32) + 1) * -2.0);
    double c, s;
    cos_sin_turns(uint32_t(x), &c, &s);
    out[2 * t] = float((radius * c) * sigma);
    out[2 * t + 1] = float((radius * s) * sigma);
  }
}

inline void put(float* p, float v) { *p = v; }
inline void put(double* p, float v) { *p = v; }
inline void put(c10::BFloat16* p, float v) { p->x = float_to_bf16(v); }
inline void put(c10::Half* p, float v) { p->x = float_to_half(v); }

template <typename S>
MG_CLONES void store(S* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) put(dst + i, src[i]);
}

template <typename S>
void counter_normal_impl(S* out, int64_t rows, int64_t width, int64_t start, int64_t stride,
                         uint64_t key, double sigma) {
  const int64_t step = 2 * kPairsPerStep - 2;  // elements per task (an odd start needs 1 more)
  const int64_t segments = (width + step - 1) / step;
  at::parallel_for(0, rows * segments, 16, [&](int64_t begin, int64_t end) {
    float buf[2 * kPairsPerStep];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / segments;
      const int64_t c0 = (item % segments) * step;
      const int64_t len = std::min(step, width - c0);
      const uint64_t g0 = uint64_t(start + r * stride + c0);
      const uint64_t pairs = ((g0 + uint64_t(len) - 1) >> 1) - (g0 >> 1) + 1;
      normal_pairs(buf, g0 >> 1, int64_t(pairs), key, sigma);
      store(out + r * width + c0, buf + (g0 & 1u), len);
    }
  });
}

// counter_normal_(out, start, stride, key, sigma): out (rows, width) contiguous; element
// (r, c) is global element start + r * stride + c of the stream `key`.
void counter_normal_cpu(const at::Tensor& out, int64_t start, int64_t stride, int64_t key,
                        double sigma) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous(),
              "counter_normal_: out must be a contiguous (rows, width) tensor, got ",
              out.sizes(), out.is_contiguous() ? "" : " (not contiguous)");
  TORCH_CHECK(start >= 0 && stride >= out.size(1),
              "counter_normal_: start=", start, " stride=", stride, " for width ", out.size(1),
              ": need start >= 0 and stride >= width");
  if (out.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "counter_normal_",
                                  [&] {
                                    counter_normal_impl<scalar_t>(
                                        out.mutable_data_ptr<scalar_t>(), out.size(0),
                                        out.size(1), start, stride, uint64_t(key), sigma);
                                  });
}

inline double widen(float v) { return v; }
inline double widen(double v) { return v; }
inline double widen(c10::BFloat16 v) { return bf16_to_float(v.x); }
inline double widen(c10::Half v) { return half_to_float(v.x); }

// Sum and sum of squares of n elements in float64, over 32 interleaved partial sums (four
// AVX-512 accumulators: the adds do not wait on each other), combined in a fixed order.
template <typename S>
MG_CLONES void block_moments(const S* __restrict x, int64_t n, double* sum, double* squares) {
  constexpr int64_t kLanes = 32;
  double a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int64_t j = 0; j < kLanes; ++j) {
      const double v = widen(x[i + j]);
      a[j] += v;
      b[j] += v * v;
    }
  }
  for (int64_t j = 0; i + j < n; ++j) {
    const double v = widen(x[i + j]);
    a[j] += v;
    b[j] += v * v;
  }
  double total = 0, total_sq = 0;
  for (int64_t j = 0; j < kLanes; ++j) {
    total += a[j];
    total_sq += b[j];
  }
  *sum = total;
  *squares = total_sq;
}

// moments(x) -> float64 [sum, sum of squares] of every element of contiguous x: float64
// partial sums per block of 2^16 elements, added in block order (the same result for any
// thread count).
at::Tensor moments_cpu(const at::Tensor& x) {
  TORCH_CHECK(x.is_contiguous(), "moments: x must be contiguous, got strides ", x.strides());
  constexpr int64_t kBlock = 1 << 16;
  const int64_t n = x.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(2 * size_t(blocks), 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "moments", [&] {
    const scalar_t* p = x.const_data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t len = std::min(kBlock, n - k * kBlock);
        block_moments(p + k * kBlock, len, &partial[2 * k], &partial[2 * k + 1]);
      }
    });
  });
  at::Tensor result = at::zeros({2}, x.options().dtype(at::kDouble));
  double* r = result.mutable_data_ptr<double>();
  for (int64_t k = 0; k < blocks; ++k) {
    r[0] += partial[2 * k];
    r[1] += partial[2 * k + 1];
  }
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(megatron_gamma, CPU, m) {
  m.impl("counter_normal_", &counter_normal_cpu);
  m.impl("moments", &moments_cpu);
}

}  // namespace megatron_gamma
