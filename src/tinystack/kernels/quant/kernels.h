// Shared by the quantised-weight kernels (kernels.cpp) and the packer (pack.cpp); see formats.py for the formats.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <vector>

enum Fmt { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

inline float fp16_to_float(uint16_t h) { return at::Half(h, at::Half::from_bits()); }

// w [N, K] float32 -> {qs [N, nb, 32 | 16] uint8, d [N, nb] fp16, m [N, nb] fp16 (Q4_1) or undefined}
std::vector<at::Tensor> block_quantize(at::Tensor w, int64_t fmt);
// the inverse: float32 [N, K]
at::Tensor block_dequantize(int64_t fmt, at::Tensor qs, at::Tensor d, c10::optional<at::Tensor> m, int64_t K);

// y [M, N] = x [M, K] @ W^T with W in a block format (qs [N, nb, 32|16], d/m [N, nb] fp16 bits; m only for
// Q4_1), activations quantised to int8 blocks on the way (kernels.cpp). path: 1 AVX-512 VNNI, 2 AVX2, 0 plain C++.
void block_matmul_raw(const float* x, int M, int K, int fmt, const uint8_t* qs, const uint16_t* d,
                      const uint16_t* m, int N, int nb, float* y, int path);
// y [M, N] = x [M, Kp] @ W^T with W [N, Kp] bfloat16 bits, Kp a multiple of 32 and x zero padded to it.
void bf16_matmul_raw(const float* x, int M, int Kp, const uint16_t* w, int N, float* y, int path);
bool avx512_available();
bool avx2_available();
bool path_available(int64_t path);  // 0 always; 1 AVX-512 VNNI; 2 AVX2 + FMA + F16C
