// Shared by the training kernels (fused_ops.cpp, fused_attention.cpp): bf16 <-> float32, a vectorisable exp, a
// vectorisable sum, the row loops' thread split, and the per-CPU-level clones of each row loop.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tinystack_train {

#define ROWS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define INLINE __attribute__((always_inline)) inline

using bf16 = uint16_t;

INLINE float from_bf16(bf16 h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

INLINE bf16 to_bf16(float f) {  // round to nearest even, as c10::BFloat16 does; NaN stays a (quiet) NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? bf16(0x7FC0) : bf16(rounded);
}

// exp(x) in float32 to ~1 ulp from arithmetic alone (so the row loops vectorise): 2^n * e^r, |r| <= ln2 / 2,
// e^r by Cephes' degree-7 polynomial; 0 below -87 (where the result would leave the normal floats; -inf too),
// x clamped at 88 above.
INLINE float exp_f32(float x0) {
  const float x = x0 < -87.0f ? -87.0f : (x0 > 88.0f ? 88.0f : x0);  // (not fmin/fmax: their NaN rules stop vectorisation)
  // n = round(x / ln2) by adding 1.5 * 2^23: the sum's low mantissa bits hold n (|n| <= 128 < 2^22), both as a
  // float (the sum minus the constant) and as an integer (the bits' difference); no converts, no selects
  constexpr float kRound = 12582912.0f;
  const float nr = x * 1.44269504088896341f + kRound;
  const float n = nr - kRound;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t nr_bits, round_bits;
  std::memcpy(&nr_bits, &nr, 4);
  std::memcpy(&round_bits, &kRound, 4);
  const uint32_t bits = (nr_bits - round_bits + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale * (x0 < -87.0f ? 0.f : 1.f);  // (a select of the result itself would not vectorise)
}

INLINE float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// A float sum cannot be vectorised as written (the compiler may not reorder it): 16 independent partial sums can.
template <typename F>
INLINE float sum16(int64_t n, const F& term) {
  float acc[16] = {0};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) acc[k] += term(j + k);
  float s = 0.f;
  for (; j < n; ++j) s += term(j);
  for (int k = 0; k < 16; ++k) s += acc[k];
  return s;
}

template <typename F>
void for_rows(int64_t n, int64_t row_cost, const F& f) {  // a grain of rows worth ~32 K elements per task
  at::parallel_for(0, n, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_cost)), f);
}

}  // namespace tinystack_train
