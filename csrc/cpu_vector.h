// Building blocks of the vectorized CPU kernels (cpu_kernels.cpp, init_cpu.cpp): the
// target_clones attribute, bit casts, and branch-free, exactly rounded conversions between
// float32 and bf16/fp16 (bit-identical to c10::BFloat16 / c10::Half).
#pragma once

#include <cstdint>
#include <cstring>

// With GCC >= 12 on x86-64 a function marked MG_CLONES is compiled three times (AVX-512, AVX2,
// baseline SSE2) and the best one for the running CPU is picked at load time.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    __GNUC__ >= 12
#define MG_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MG_CLONES
#endif

namespace megatron_gamma {

// memcpy rather than C++20's std::bit_cast: torch 2.11 builds extensions with -std=c++17 (its g++
// rejected std::bit_cast on the H200; 2.13 passes -std=c++20); compilers make it a register move.
template <typename To, typename From>
inline To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

inline uint32_t bits_of(float f) { return bit_cast<uint32_t>(f); }
inline float float_of(uint32_t u) { return bit_cast<float>(u); }
inline uint64_t bits_of(double d) { return bit_cast<uint64_t>(d); }
inline double double_of(uint64_t u) { return bit_cast<double>(u); }

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

}  // namespace megatron_gamma
