// kernels.cpp's AVX2 + FMA path (path 2): the block formats' and bf16's row kernels.
// Included once, by kernels.cpp, after the shared pieces it uses (QuantX, row_tiles, FLATTEN, the format
// constants of kernels.h): one translation unit, so the kernels inline into their ranges as before.
#pragma once

namespace {

// ---- AVX2 + FMA (path 2): one block of 32 weights per step, 4 activation rows at a time
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int FMT, int MT>
AVX2_INLINE inline void block_rows_avx2(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int nb,
                                        const QuantX& X, int r0, float* y, int64_t ystride) {
  constexpr int bpb = FMT == Q8_0 ? 32 : 16;
  const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const size_t xq_stride = (size_t)X.ng * 128, xf_stride = (size_t)X.ng * 4;
  const int8_t* xq0 = X.q.data() + r0 * xq_stride;
  const float* xd0 = X.d.data() + r0 * xf_stride;
  const float* xs0 = X.s.data() + r0 * xf_stride;
  __m256 acc[MT];
  float off[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps(), off[r] = 0.f;
  for (int b = 0; b < nb; ++b) {
    const float dw = _cvtsh_ss(d[b]);
    const float ow = FMT == Q4_1 ? _cvtsh_ss(m[b]) : FMT == Q4_0 ? -8.f * dw : 0.f;
    const uint8_t* wp = qs + (size_t)b * bpb;
    __m256i w;
    if (FMT == Q8_0) {
      w = _mm256_loadu_si256((const __m256i*)wp);
    } else {  // nibbles: low = elements 0-15, high = 16-31 (the activations' [lo half | hi half] of this block)
      const __m128i raw = _mm_loadu_si128((const __m128i*)wp);
      w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lo4);
    }
    const __m256i wu = FMT == Q8_0 ? _mm256_sign_epi8(w, w) : w;  // |q|: the unsigned operand
    for (int r = 0; r < MT; ++r) {
      const int8_t* xq = xq0 + r * xq_stride;
      __m256i x;
      if (FMT == Q8_0) {
        x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xq + b * 32)), w);  // p with q's sign
      } else {
        const int8_t* g = xq + (b / 4) * 128 + (b % 4) * 16;
        x = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(g + 64)), _mm_loadu_si128((const __m128i*)g));
      }
      const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(wu, x), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * xd0[r * xf_stride + b]), acc[r]);
      off[r] += ow * xs0[r * xf_stride + b];
    }
  }
  for (int r = 0; r < MT; ++r) y[(size_t)(r0 + r) * ystride] = hsum_avx2(acc[r]) + off[r];
}

template <int FMT>
AVX2 FLATTEN void block_range_avx2(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int nb, const QuantX& X,
                                   int M, int64_t n0, int64_t n1, float* y, int64_t N) {
  constexpr int bpb = FMT == Q8_0 ? 32 : 16;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = qs + (size_t)n * nb * bpb;
    const uint16_t* dn = d + (size_t)n * nb;
    const uint16_t* mn = m ? m + (size_t)n * nb : nullptr;
    row_tiles(M, [&](auto mt, int r) AVX2 {
      block_rows_avx2<FMT, decltype(mt)::value>(q, dn, mn, nb, X, r, y + n, N);
    });
  }
}

AVX2_INLINE inline __m256 widen_bf16_avx2(__m128i h) {  // 8 bf16 -> 8 fp32
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int MT>
AVX2_INLINE inline void bf16_rows_avx2(const uint16_t* w, const float* x, int r0, int Kp, float* y, int64_t ystride) {
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int k = 0; k < Kp; k += 16) {
    const __m256i raw = _mm256_loadu_si256((const __m256i*)(w + k));
    const __m256 w0 = widen_bf16_avx2(_mm256_castsi256_si128(raw));
    const __m256 w1 = widen_bf16_avx2(_mm256_extracti128_si256(raw, 1));
    for (int r = 0; r < MT; ++r) {
      const float* xr = x + (size_t)(r0 + r) * Kp + k;
      acc[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc[r]);
      acc[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) y[(size_t)(r0 + r) * ystride] = hsum_avx2(acc[r]);
}

AVX2 FLATTEN void bf16_range_avx2(const uint16_t* w, const float* x, int M, int Kp, int64_t n0, int64_t n1,
                                  float* y, int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wn = w + (size_t)n * Kp;
    row_tiles(M, [&](auto mt, int r) AVX2 { bf16_rows_avx2<decltype(mt)::value>(wn, x, r, Kp, y + n, N); });
  }
}
}  // namespace
