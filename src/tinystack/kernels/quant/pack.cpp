// Packing float weights into GGUF's Q8_0 / Q4_0 / Q4_1 blocks and back, in C++: one pass over the
// weights on all threads. Fallbacks and references: formats.quantize_torch (the same packing in torch
// operations) and model/gguf_dequant.py (the importer's NumPy dequantiser).
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// roundf (half away from zero) for |v| <= 127 without a libm call, so the loop vectorises:
// v - trunc(v) is exact in float, so the comparison with 0.5 decides exactly as roundf does.
static inline int round_half_away(float v) {
  const int t = (int)v;
  const float frac = v - (float)t;
  return t + (frac >= 0.5f) - (frac <= -0.5f);
}

// ---- packing: llama.cpp's quantize_row_*_ref, bit for bit
// w [N, K] float32 -> qs [N, nb, 32 | 16] uint8, d [N, nb] fp16, m [N, nb] fp16 (Q4_1 only).
std::vector<at::Tensor> block_quantize(at::Tensor w, int64_t fmt) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(),
              "w must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(fmt >= 0 && fmt <= 2, "unknown block format ", fmt);
  const int64_t N = w.size(0), K = w.size(1), nb = (K + 31) / 32, bpb = fmt == Q8_0 ? 32 : 16;
  auto u8 = at::TensorOptions().dtype(at::kByte);
  auto f16 = at::TensorOptions().dtype(at::kHalf);
  auto qs = at::empty({N, nb, bpb}, u8), d = at::empty({N, nb}, f16);
  auto m = fmt == Q4_1 ? at::empty({N, nb}, f16) : at::Tensor();
  const float* wp = w.data_ptr<float>();
  uint8_t* qp = qs.data_ptr<uint8_t>();
  at::Half* dp = d.data_ptr<at::Half>();
  at::Half* mp = fmt == Q4_1 ? m.data_ptr<at::Half>() : nullptr;
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        float v[32] = {0};
        for (int64_t i = 0; i < 32 && b * 32 + i < K; ++i) v[i] = wp[n * K + b * 32 + i];
        uint8_t* q = qp + (n * nb + b) * bpb;
        const int64_t j = n * nb + b;
        if (fmt == Q8_0) {
          float amax = 0.f;
          for (float x : v) amax = std::max(amax, std::fabs(x));
          const float dd = amax / 127.f, id = dd ? 1.f / dd : 0.f;
          for (int i = 0; i < 32; ++i) q[i] = (uint8_t)(int8_t)round_half_away(v[i] * id);
          dp[j] = at::Half(dd);
        } else if (fmt == Q4_0) {
          float amax = 0.f, max = 0.f;
          for (float x : v) if (amax < std::fabs(x)) amax = std::fabs(x), max = x;
          const float dd = max / -8.f, id = dd ? 1.f / dd : 0.f;
          for (int i = 0; i < 16; ++i) {
            const int a = std::min(15, (int)(int8_t)(v[i] * id + 8.5f));
            const int c = std::min(15, (int)(int8_t)(v[i + 16] * id + 8.5f));
            q[i] = (uint8_t)(a | (c << 4));
          }
          dp[j] = at::Half(dd);
        } else {
          float lo = v[0], hi = v[0];
          for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
          const float dd = (hi - lo) / 15.f, id = dd ? 1.f / dd : 0.f;
          for (int i = 0; i < 16; ++i) {
            const int a = std::min(15, (int)(int8_t)((v[i] - lo) * id + 0.5f));
            const int c = std::min(15, (int)(int8_t)((v[i + 16] - lo) * id + 0.5f));
            q[i] = (uint8_t)(a | (c << 4));
          }
          dp[j] = at::Half(dd);
          mp[j] = at::Half(lo);
        }
      }
  });
  return {qs, d, m};
}

// qs, d[, m] -> float32 [N, K] (the first K of the nb * 32 columns)
at::Tensor block_dequantize(int64_t fmt, at::Tensor qs, at::Tensor d, c10::optional<at::Tensor> m,
                               int64_t K) {
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && qs.dim() == 3, "qs [N, nb, bytes], d [N, nb] contiguous");
  const int64_t N = qs.size(0), nb = qs.size(1), bpb = qs.size(2);
  TORCH_CHECK(K <= nb * 32 && bpb == (fmt == Q8_0 ? 32 : 16), "qs does not hold ", K, " columns in format ", fmt);
  auto out = at::empty({N, K}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* qp = (const uint8_t*)qs.data_ptr();
  const uint16_t* dp = (const uint16_t*)d.data_ptr();
  const uint16_t* mp = fmt == Q4_1 ? (const uint16_t*)m->data_ptr() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    float v[32];
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* q = qp + (n * nb + b) * bpb;
        const float dd = fp16_to_float(dp[n * nb + b]);
        if (fmt == Q8_0) {
          for (int i = 0; i < 32; ++i) v[i] = dd * (float)(int8_t)q[i];
        } else {
          if (fmt == Q4_0) {  // d * (q - 8), one rounding, as ggml
            for (int i = 0; i < 16; ++i) v[i] = dd * (float)((q[i] & 15) - 8), v[i + 16] = dd * (float)((q[i] >> 4) - 8);
          } else {
            const float mm = fp16_to_float(mp[n * nb + b]);
            for (int i = 0; i < 16; ++i) v[i] = dd * (float)(q[i] & 15) + mm, v[i + 16] = dd * (float)(q[i] >> 4) + mm;
          }
        }
        const int64_t cnt = std::min<int64_t>(32, K - b * 32);
        std::memcpy(op + n * K + b * 32, v, cnt * sizeof(float));
      }
  });
  return out;
}
