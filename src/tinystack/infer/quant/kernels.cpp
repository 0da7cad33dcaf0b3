// Weight-only quantised matmuls for the CPU: y[M, N] = x[M, K] @ W^T, W kept in a block format.
//
// Formats (GGUF's, values and nibble order identical; see formats.py): blocks of 32 weights along K,
//   Q8_0: int8 qs[32],            w = d * q
//   Q4_0: uint8 qs[16] (2 nibbles: low = element i, high = element i + 16), w = d * (q - 8)
//   Q4_1: same nibbles,           w = d * q + m
// stored as separate arrays qs [N, nb, 32 or 16], d [N, nb] fp16, m [N, nb] fp16 (nb = K padded / 32).
//
// Activations are quantised per row and per block to int8 on the fly (xd = max|x| / 127), as
// llama.cpp does, so one block's dot product is an integer dot product:
//   sum_i w_i x_i = d_w d_x sum_i q_i p_i + off * s_x      with s_x = d_x sum_i p_i and
//   off = m (Q4_1), -8 d_w (Q4_0), -128 d_w (Q8_0, whose weights enter VNNI as unsigned q + 128).
// AVX-512 VNNI's vpdpbusd multiplies 64 unsigned by 64 signed bytes and adds groups of 4 into
// 16 int32 lanes: four blocks per instruction pair. BF16 weights are widened to fp32 (a shift)
// and multiplied with fp32 activations. AVX2 CPUs without AVX-512 (AMD Zen 2/3, older Intel; path 2)
// take one block per step: vpmaddubsw multiplies 32 unsigned by 32 signed bytes into 16-bit pair sums,
// vpmaddwd with ones widens them to 8 int32 lanes (Q8_0's signed weights enter as |q| with the
// activation given q's sign). Every kernel has a plain C++ twin (path 0), used where the CPU has
// neither and by the tests.
#include <torch/extension.h>
#include <immintrin.h>

#include "kernels.h"
#include "pool.h"
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// Activation rows 0..M as tiles of 4 and one tile of the 1-3 left over: tile(std::integral_constant<int, MT>(), r0)
// each. The kernels take their row count as a template parameter (one unrolled body per tile size); this is the
// one place that walks the rows. The callers are `flatten`ed, so the tiles inline into the ISA-specific range.
#define FLATTEN __attribute__((flatten))  // inline every call in the function, the row_tiles lambdas included

template <class Tile>
inline void row_tiles(int M, Tile&& tile) {
  int r = 0;
  for (; r + 4 <= M; r += 4) tile(std::integral_constant<int, 4>(), r);
  switch (M - r) {
    case 3: tile(std::integral_constant<int, 3>(), r); break;
    case 2: tile(std::integral_constant<int, 2>(), r); break;
    case 1: tile(std::integral_constant<int, 1>(), r); break;
  }
}

// ---- activations -> int8 blocks. Q4 kernels want each group of 4 blocks as [lo halves | hi halves]
// (matching the nibble split of 4 consecutive 16-byte weight blocks); Q8 keeps the natural order.
struct QuantX {
  std::vector<int8_t> q;   // [M, ng * 128]
  std::vector<float> d, s; // [M, ng * 4]
  int ng;                  // groups of 4 blocks per row, rounded up to a multiple of 4 (16-block loads stay inside)
};

inline int q_index(bool q4, int b, int i) {  // position of element i (0..31) of block b in its row
  if (!q4) return b * 32 + i;
  return (b / 4) * 128 + (i / 16) * 64 + (b % 4) * 16 + (i % 16);
}

QuantX quantize_x(const float* x, int M, int K, int nb, bool q4) {
  QuantX out;
  out.ng = (nb + 15) / 16 * 4;
  out.q.assign((size_t)M * out.ng * 128, 0);
  out.d.assign((size_t)M * out.ng * 4, 0.f);
  out.s.assign((size_t)M * out.ng * 4, 0.f);
  for (int r = 0; r < M; ++r) {
    const float* xr = x + (size_t)r * K;
    int8_t* qr = out.q.data() + (size_t)r * out.ng * 128;
    for (int b = 0; b < nb; ++b) {
      float v[32] = {0};
      int n = std::min(32, K - b * 32);
      for (int i = 0; i < n; ++i) v[i] = xr[b * 32 + i];
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        int q = (int)std::nearbyint(v[i] * id);
        qr[q_index(q4, b, i)] = (int8_t)q;
        sum += q;
      }
      out.d[(size_t)r * out.ng * 4 + b] = d;
      out.s[(size_t)r * out.ng * 4 + b] = d * (float)sum;
    }
  }
  return out;
}

// ---- plain C++ (path 0)
void block_rows_scalar(int fmt, const uint8_t* qs, const uint16_t* d, const uint16_t* m, int nb, const QuantX& X,
                       int r0, int mt, float* y, int64_t ystride) {
  const bool q4 = fmt != Q8_0;
  for (int r = r0; r < r0 + mt; ++r) {
    const int8_t* xq = X.q.data() + (size_t)r * X.ng * 128;
    const float* xd = X.d.data() + (size_t)r * X.ng * 4;
    const float* xs = X.s.data() + (size_t)r * X.ng * 4;
    float acc = 0.f;
    for (int b = 0; b < nb; ++b) {
      int isum = 0;
      for (int i = 0; i < 32; ++i) {
        int w = fmt == Q8_0 ? (int)((const int8_t*)qs)[b * 32 + i]
                            : (i < 16 ? qs[b * 16 + i] & 15 : qs[b * 16 + i - 16] >> 4);
        isum += w * xq[q_index(q4, b, i)];
      }
      float dw = fp16_to_float(d[b]);
      float off = fmt == Q4_1 ? fp16_to_float(m[b]) : fmt == Q4_0 ? -8.f * dw : 0.f;
      acc += dw * xd[b] * (float)isum + off * xs[b];
    }
    y[(size_t)r * ystride] = acc;
  }
}

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

// ---- bf16 weights [N, Kp] (Kp a multiple of 32), fp32 activations [M, Kp]
void bf16_row_scalar(const uint16_t* w, const float* x, int M, int Kp, float* y, int64_t ystride) {
  for (int r = 0; r < M; ++r) {
    float acc = 0.f;
    for (int k = 0; k < Kp; ++k) {
      uint32_t bits = (uint32_t)w[k] << 16;
      float wf;
      std::memcpy(&wf, &bits, 4);
      acc += wf * x[(size_t)r * Kp + k];
    }
    y[(size_t)r * ystride] = acc;
  }
}

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

// Output rows per chunk (pool.h): ~64 KiB of weights, so a small matrix is one chunk and runs on the caller.
int64_t grain_rows(int64_t row_bytes) { return std::max<int64_t>(16, (64 << 10) / std::max<int64_t>(1, row_bytes)); }

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous 2-D float32 CPU tensor");
}

void check_path(int64_t path) {
  TORCH_CHECK(path_available(path), "kernel path ", path,
              " needs a CPU feature this one lacks (1: AVX-512 VNNI, 2: AVX2)");
}

torch::Tensor add_bias(torch::Tensor y, const c10::optional<torch::Tensor>& bias) {
  if (bias.has_value() && bias->defined()) y.add_(bias->to(torch::kFloat32));
  return y;
}

}  // namespace

bool avx2_available() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool path_available(int64_t path) {
  return path == 0 || (path == 1 && avx512_available()) || (path == 2 && avx2_available());
}

bool avx512_available() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// The raw kernels (kernels.h): y [M, N] = x [M, K] @ W^T, output rows split over row_pool's threads.
void block_matmul_raw(const float* x, int M, int K, int fmt, const uint8_t* qp, const uint16_t* dp,
                      const uint16_t* mp, int N, int nb, float* yp, int path) {
  const int bpb = fmt == Q8_0 ? 32 : 16;
  const QuantX X = quantize_x(x, M, K, nb, fmt != Q8_0);
  row_pool().run(N, grain_rows(nb * (bpb + 4)), [&](int64_t n0, int64_t n1) {
    if (path == 0) {
      for (int64_t n = n0; n < n1; ++n)
        block_rows_scalar(fmt, qp + (size_t)n * nb * bpb, dp + (size_t)n * nb, mp ? mp + (size_t)n * nb : nullptr,
                          nb, X, 0, M, yp + n, N);
    } else if (path == 2) {
      if (fmt == Q8_0) block_range_avx2<Q8_0>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
      else if (fmt == Q4_0) block_range_avx2<Q4_0>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
      else block_range_avx2<Q4_1>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
    } else if (fmt == Q8_0) {
      block_range_avx512<Q8_0>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
    } else if (fmt == Q4_0) {
      block_range_avx512<Q4_0>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
    } else {
      block_range_avx512<Q4_1>(qp, dp, mp, nb, X, M, n0, n1, yp, N);
    }
  });
}

void bf16_matmul_raw(const float* x, int M, int Kp, const uint16_t* wp, int N, float* yp, int path) {
  row_pool().run(N, grain_rows((int64_t)Kp * 2), [&](int64_t n0, int64_t n1) {
    if (path == 0) {
      for (int64_t n = n0; n < n1; ++n) bf16_row_scalar(wp + (size_t)n * Kp, x, M, Kp, yp + n, N);
    } else if (path == 2) {
      bf16_range_avx2(wp, x, M, Kp, n0, n1, yp, N);
    } else {
      bf16_range_avx512(wp, x, M, Kp, n0, n1, yp, N);
    }
  });
}

// x [M, K] float32; qs [N, nb, 32 or 16] uint8; d, m [N, nb] fp16 (m only for Q4_1). path: 1 AVX-512, 2 AVX2,
// 0 plain C++.
torch::Tensor block_matmul(torch::Tensor x, int64_t fmt, torch::Tensor qs, torch::Tensor d,
                           c10::optional<torch::Tensor> m, c10::optional<torch::Tensor> bias, int64_t path) {
  check_x(x);
  TORCH_CHECK(fmt >= 0 && fmt <= 2, "unknown block format ", fmt);
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && qs.dim() == 3 && d.scalar_type() == torch::kFloat16,
              "qs [N, nb, bytes] and d [N, nb] fp16, contiguous");
  TORCH_CHECK(fmt != Q4_1 || (m.has_value() && m->is_contiguous()), "Q4_1 needs m");
  check_path(path);
  const int M = x.size(0), K = x.size(1), N = qs.size(0), nb = qs.size(1);
  TORCH_CHECK(K <= nb * 32 && K > (nb - 1) * 32, "x has ", K, " columns, weights ", nb, " blocks of 32");
  const int bpb = fmt == Q8_0 ? 32 : 16;
  TORCH_CHECK(qs.size(2) == bpb, "qs holds ", qs.size(2), " bytes per block, format needs ", bpb);
  auto y = torch::empty({M, N}, x.options());
  block_matmul_raw(x.data_ptr<float>(), M, K, fmt, (const uint8_t*)qs.data_ptr(), (const uint16_t*)d.data_ptr(),
                   fmt == Q4_1 ? (const uint16_t*)m->data_ptr() : nullptr, N, nb, y.data_ptr<float>(), path);
  return add_bias(y, bias);
}

// x [M, K] float32; w [N, Kp] bfloat16 with Kp >= K a multiple of 32 (zero padded).
torch::Tensor bf16_matmul(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t path) {
  check_x(x);
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.is_contiguous() && w.dim() == 2 && w.size(1) % 32 == 0,
              "w must be contiguous [N, Kp] bfloat16 with Kp a multiple of 32");
  check_path(path);
  const int M = x.size(0), K = x.size(1), N = w.size(0), Kp = w.size(1);
  TORCH_CHECK(K <= Kp && K > Kp - 32, "x has ", K, " columns, weights ", Kp);
  torch::Tensor xp = K == Kp ? x : torch::constant_pad_nd(x, {0, Kp - K});
  auto y = torch::empty({M, N}, x.options());
  bf16_matmul_raw(xp.data_ptr<float>(), M, Kp, (const uint16_t*)w.data_ptr(), N, y.data_ptr<float>(), path);
  return add_bias(y, bias);
}

void register_fused_step(pybind11::module_& mod);  // fused_step.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("avx512_available", &avx512_available, "AVX-512 F/BW/VL/DQ + VNNI on this CPU");
  mod.def("avx2_available", &avx2_available, "AVX2 + FMA + F16C on this CPU");
  // the GIL is released while a matmul runs: the server's event loop keeps going during a decode step
  mod.def("block_matmul", &block_matmul, "x @ W^T for Q8_0 / Q4_0 / Q4_1 block weights",
          py::call_guard<py::gil_scoped_release>());
  mod.def("bf16_matmul", &bf16_matmul, "x @ W^T for bfloat16 weights, float32 activations",
          py::call_guard<py::gil_scoped_release>());
  mod.def("block_quantize", &block_quantize, "float32 [N, K] -> (qs, d, m) in a block format, as llama.cpp");
  mod.def("block_dequantize", &block_dequantize, "(qs, d, m) -> float32 [N, K]");
  register_fused_step(mod);
}
