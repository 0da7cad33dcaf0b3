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
// neither and by the tests. The two ISA paths live in kernels_avx512.h and kernels_avx2.h, included below.
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

}  // namespace

#include "kernels_avx2.h"
#include "kernels_avx512.h"

namespace {


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
