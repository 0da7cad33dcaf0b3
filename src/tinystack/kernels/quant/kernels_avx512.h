// kernels.cpp's AVX-512 VNNI path (path 1): the block formats' and bf16's row kernels.
// Included once, by kernels.cpp, after the shared pieces it uses (QuantX, row_tiles, FLATTEN, the format
// constants of kernels.h): one translation unit, so the kernels inline into their ranges as before.
#pragma once

namespace {

// ---- AVX-512 VNNI (path 1)
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#define AVX512_INLINE __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

template <int FMT, int MT>
AVX512_INLINE inline void block_rows_avx512(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int nb,
                                           const QuantX& X, int r0, float* y, int64_t ystride) {
  const __m512i lo4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
  const __m512i pick_a = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i pick_b = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512i bcast[4] = {  // block scale j of a 16-block vector -> the 4 lanes of its group's block
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
  constexpr int bpb = FMT == Q8_0 ? 32 : 16;  // weight bytes per block
  const size_t xq_stride = (size_t)X.ng * 128, xf_stride = (size_t)X.ng * 4;
  const int8_t* xq0 = X.q.data() + r0 * xq_stride;
  const float* xd0 = X.d.data() + r0 * xf_stride;
  const float* xs0 = X.s.data() + r0 * xf_stride;
  __m512 acc[MT], oacc[MT], sc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps(), oacc[r] = _mm512_setzero_ps();
  // 16 blocks' scales at a time (one fp16 load and multiply per row); full super-groups without masks
  auto super_group = [&](int s, auto full) AVX512_INLINE {
    constexpr bool FULL = decltype(full)::value;
    const int nbs = FULL ? 16 : nb - s;
    const __mmask16 m16 = (__mmask16)(FULL ? 0xFFFF : (1u << nbs) - 1);
    const __m512 dw = _mm512_cvtph_ps(FULL ? _mm256_loadu_si256((const __m256i*)(d + s))
                                           : _mm256_maskz_loadu_epi16(m16, d + s));
    const __m512 offw = FMT != Q4_1 ? dw : _mm512_cvtph_ps(FULL ? _mm256_loadu_si256((const __m256i*)(m + s))
                                                                 : _mm256_maskz_loadu_epi16(m16, m + s));
    for (int r = 0; r < MT; ++r) {
      sc[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd0 + r * xf_stride + s));
      oacc[r] = _mm512_fmadd_ps(offw, _mm512_loadu_ps(xs0 + r * xf_stride + s), oacc[r]);
    }
    const int ngs = FULL ? 4 : (nbs + 3) / 4;
#pragma GCC unroll 4
    for (int j = 0; j < ngs; ++j) {
      const int g = s / 4 + j, nbg = FULL ? 4 : std::min(4, nb - 4 * g);
      const uint8_t* wp = qs + (size_t)g * 4 * bpb;
      __m512i w0, w1;
      if (FMT == Q8_0) {
        const int nbytes = nbg * 32;
        w0 = FULL ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8(nbytes >= 64 ? ~0ull : (1ull << nbytes) - 1, wp);
        w1 = FULL ? _mm512_loadu_si512(wp + 64)
                  : _mm512_maskz_loadu_epi8(nbytes <= 64 ? 0ull : nbytes == 128 ? ~0ull : (1ull << (nbytes - 64)) - 1,
                                            wp + 64);
        w0 = _mm512_xor_si512(w0, flip), w1 = _mm512_xor_si512(w1, flip);  // q + 128 as unsigned
      } else {
        const __m512i w = FULL ? _mm512_loadu_si512(wp)
                               : _mm512_maskz_loadu_epi8(nbg == 4 ? ~0ull : (1ull << (nbg * 16)) - 1, wp);
        w0 = _mm512_and_si512(w, lo4);
        w1 = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
      }
      for (int r = 0; r < MT; ++r) {
        const int8_t* xq = xq0 + r * xq_stride + g * 128;
        const __m512i x0 = _mm512_loadu_si512(xq), x1 = _mm512_loadu_si512(xq + 64);
        __m512i isum;
        if (FMT == Q8_0) {  // blocks 0,1 in a's lanes 0-7, 8-15 and 2,3 in b's: regroup to 4 lanes per block
          const __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, x0);
          const __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1, x1);
          isum = _mm512_add_epi32(_mm512_permutex2var_epi32(a, pick_a, b), _mm512_permutex2var_epi32(a, pick_b, b));
        } else {  // 128-bit lane j = block j: its low nibbles with x0, high with x1
          isum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w0, x0), w1, x1);
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(bcast[j], sc[r]), acc[r]);
      }
    }
  };
  int s = 0;
  for (; s + 16 <= nb; s += 16) super_group(s, std::true_type{});
  if (s < nb) super_group(s, std::false_type{});
  const float k = FMT == Q4_1 ? 1.f : FMT == Q4_0 ? -8.f : -128.f;  // off = m, -8 d or -128 d
  for (int r = 0; r < MT; ++r)  // one horizontal sum per output
    y[(size_t)(r0 + r) * ystride] = _mm512_reduce_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(k), oacc[r], acc[r]));
}

// Output rows n0..n1 for all M activation rows, in tiles of up to 4 (the kernel is inlined here, so its
// constants are set up once per range, not per output row).
template <int FMT>
AVX512 FLATTEN void block_range_avx512(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int nb, const QuantX& X,
                                       int M, int64_t n0, int64_t n1, float* y, int64_t N) {
  constexpr int bpb = FMT == Q8_0 ? 32 : 16;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = qs + (size_t)n * nb * bpb;
    const uint16_t* dn = d + (size_t)n * nb;
    const uint16_t* mn = m ? m + (size_t)n * nb : nullptr;
    row_tiles(M, [&](auto mt, int r) AVX512 {
      block_rows_avx512<FMT, decltype(mt)::value>(q, dn, mn, nb, X, r, y + n, N);
    });
  }
}

// ---- bf16 weights [N, Kp], fp32 activations [M, Kp]
AVX512_INLINE inline __m512 widen_bf16_avx512(__m256i h) {  // 16 bf16 -> 16 fp32: the bits, 16 places up
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int MT>
AVX512_INLINE inline void bf16_rows_avx512(const uint16_t* w, const float* x, int r0, int Kp, float* y,
                                           int64_t ystride) {
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int k = 0; k < Kp; k += 32) {
    const __m512i raw = _mm512_loadu_si512(w + k);
    const __m512 w0 = widen_bf16_avx512(_mm512_castsi512_si256(raw));
    const __m512 w1 = widen_bf16_avx512(_mm512_extracti64x4_epi64(raw, 1));
    for (int r = 0; r < MT; ++r) {
      const float* xr = x + (size_t)(r0 + r) * Kp + k;
      acc[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r]);
      acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) y[(size_t)(r0 + r) * ystride] = _mm512_reduce_add_ps(acc[r]);
}

AVX512 FLATTEN void bf16_range_avx512(const uint16_t* w, const float* x, int M, int Kp, int64_t n0, int64_t n1,
                                      float* y, int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* wn = w + (size_t)n * Kp;
    row_tiles(M, [&](auto mt, int r) AVX512 { bf16_rows_avx512<decltype(mt)::value>(wn, x, r, Kp, y + n, N); });
  }
}
}  // namespace
