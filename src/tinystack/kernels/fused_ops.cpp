// The Llama block's elementwise work for bf16 training on CPU, forward and backward, one pass each.
//
// Under autocast the matmuls run in bf16 but everything between them is a chain of small PyTorch ops, each
// reading and writing a whole activation, most in float32: RMSNorm's forward is one kernel but its backward
// six, rotary position embedding four plus the casts around attention, SwiGLU three plus their backward.
// At SmolLM2's width (576) those passes cost more than the data they move. Here each is one loop over rows
// that reads its inputs once and writes its outputs once, computing in float32:
//
//   rms_norm_fwd(x f32 [N, H], w f32 [H], eps)  -> y = bf16(x * rstd * w), rstd f32 [N]
//   rms_norm_bwd(gy bf16, x, w, rstd, want_gw)  -> gx f32 [N, H], gw f32 [H] (or empty)
//   rope_split_fwd(qkv bf16 [B, T, Hq + 2 Hk, D], cos, sin f32 [B, T, D], Hq, Hk)
//        -> q f32 [B, Hq, T, D], k f32 [B, Hk, T, D] rotated, v f32 [B, Hk, T, D]: attention's layout and dtype
//   rope_split_bwd(dq, dk, dv f32 in that layout, cos, sin) -> dqkv bf16 [B, T, Hq + 2 Hk, D]
//   swiglu_fwd(gu bf16 [N, 2 I])     -> h = bf16(silu(gate) * up) [N, I]  (gate = gu[:, :I], up = gu[:, I:])
//   swiglu_bwd(gh bf16 [N, I], gu)   -> dgu bf16 [N, 2 I]
//   residual_add(x f32 [.., H], y bf16 [.., H]) -> x + y in float32 (the block's residual stream; PyTorch's
//        mixed-dtype add first writes a float32 copy of y, then adds)
// The training loss's rows are in cross_entropy_rows.cpp, causal attention in fused_attention.cpp.
//
// Rows are split over torch's intra-op threads (at::parallel_for). Each row loop is compiled for AVX-512,
// AVX2 and baseline x86-64 (target_clones by feature level; the loader picks one at run time), so one build
// runs anywhere. -fno-trapping-math lets the compiler turn the clamps and selects into vector blends.
// Only ATen's core headers and torch/library.h (not torch/extension.h): the build takes a few seconds, not half a
// minute. The functions are registered as operators, torch.ops.tinystack_train.*.
#include "fused_ops.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

namespace tinystack_train {

// ---- RMSNorm ----------------------------------------------------------------------------------------------
ROWS void rms_rows_fwd(const float* x, const float* w, bf16* y, float* rstd, int64_t r0, int64_t r1, int64_t H,
                       float eps) {
  for (int64_t i = r0; i < r1; ++i) {
    const float* xi = x + i * H;
    const float ss = sum16(H, [&](int64_t j) { return xi[j] * xi[j]; });
    const float r = 1.0f / std::sqrt(ss / float(H) + eps);
    rstd[i] = r;
    bf16* yi = y + i * H;
    for (int64_t j = 0; j < H; ++j) yi[j] = to_bf16(xi[j] * r * w[j]);
  }
}

ROWS void rms_rows_bwd(const bf16* gy, const float* x, const float* w, const float* rstd, float* gx, float* gw,
                       int64_t r0, int64_t r1, int64_t H) {
  for (int64_t i = r0; i < r1; ++i) {
    const float *xi = x + i * H, r = rstd[i];
    const bf16* gi = gy + i * H;
    const float dot = sum16(H, [&](int64_t j) { return from_bf16(gi[j]) * w[j] * xi[j]; });  // sum (gy w) x
    const float c = dot * r * r / float(H);  // xhat_j * mean(gy w xhat) = x_j * r * (dot * r / H)
    float* o = gx + i * H;
    for (int64_t j = 0; j < H; ++j) o[j] = r * (from_bf16(gi[j]) * w[j] - xi[j] * c);
    if (gw)
      for (int64_t j = 0; j < H; ++j) gw[j] += from_bf16(gi[j]) * xi[j] * r;
  }
}

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd(at::Tensor x, at::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.is_contiguous());
  const int64_t H = w.numel(), N = x.numel() / H;
  auto y = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  auto rstd = at::empty({N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.contiguous().data_ptr<float>();
  auto* yp = reinterpret_cast<bf16*>(y.data_ptr<at::BFloat16>());
  float* rp = rstd.data_ptr<float>();
  for_rows(N, H, [&](int64_t r0, int64_t r1) { rms_rows_fwd(xp, wp, yp, rp, r0, r1, H, float(eps)); });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_bwd(at::Tensor gy, at::Tensor x, at::Tensor w, at::Tensor rstd,
                                        bool want_gw) {
  TORCH_CHECK(gy.scalar_type() == at::kBFloat16 && x.is_contiguous());
  gy = gy.contiguous();
  w = w.contiguous();
  const int64_t H = w.numel(), N = x.numel() / H;
  auto gx = at::empty(x.sizes(), x.options());
  const int threads = at::get_num_threads();
  // the weight's gradient: one partial sum per thread, added at the end (no two threads write one row)
  auto partial = want_gw ? at::zeros({threads, H}, x.options()) : at::Tensor();
  const auto* gp = reinterpret_cast<const bf16*>(gy.data_ptr<at::BFloat16>());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *rp = rstd.data_ptr<float>();
  float* gxp = gx.data_ptr<float>();
  float* pp = want_gw ? partial.data_ptr<float>() : nullptr;
  for_rows(N, H, [&](int64_t r0, int64_t r1) {
    rms_rows_bwd(gp, xp, wp, rp, gxp, pp ? pp + at::get_thread_num() * H : nullptr, r0, r1, H);
  });
  return {gx, want_gw ? partial.sum(0) : at::empty({0}, x.options())};
}

// ---- rotary position embedding + the split into attention's layout -----------------------------------------
// out_j = x_j cos_j + x_s(j) sin_j, s(j) = (j + D/2) mod D: Hugging Face's rotate_half with a signed sin table
// (model/llama.rotary_table). Its transpose (the backward): dx_j = g_j cos_j + g_s(j) sin_s(j).
ROWS void rope_rows_fwd(const bf16* qkv, const float* cos, const float* sin, float* q, float* k, float* v,
                        int64_t r0, int64_t r1, int64_t T, int64_t Hq, int64_t Hk, int64_t D) {
  const int64_t heads = Hq + 2 * Hk, half = D / 2;
  for (int64_t row = r0; row < r1; ++row) {  // row = b T + t
    const int64_t b = row / T, t = row % T;
    const float *c = cos + row * D, *s = sin + row * D;
    for (int64_t h = 0; h < heads; ++h) {
      const bf16* x = qkv + (row * heads + h) * D;
      float* o = h < Hq ? q + ((b * Hq + h) * T + t) * D
                 : h < Hq + Hk ? k + ((b * Hk + h - Hq) * T + t) * D
                               : v + ((b * Hk + h - Hq - Hk) * T + t) * D;
      if (h >= Hq + Hk) {
        for (int64_t j = 0; j < D; ++j) o[j] = from_bf16(x[j]);
        continue;
      }
      for (int64_t j = 0; j < half; ++j) o[j] = from_bf16(x[j]) * c[j] + from_bf16(x[j + half]) * s[j];
      for (int64_t j = half; j < D; ++j) o[j] = from_bf16(x[j]) * c[j] + from_bf16(x[j - half]) * s[j];
    }
  }
}

ROWS void rope_rows_bwd(const float* dq, const float* dk, const float* dv, const float* cos, const float* sin,
                        bf16* dqkv, int64_t r0, int64_t r1, int64_t T, int64_t Hq, int64_t Hk, int64_t D) {
  const int64_t heads = Hq + 2 * Hk, half = D / 2;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t b = row / T, t = row % T;
    const float *c = cos + row * D, *s = sin + row * D;
    for (int64_t h = 0; h < heads; ++h) {
      bf16* o = dqkv + (row * heads + h) * D;
      const float* g = h < Hq ? dq + ((b * Hq + h) * T + t) * D
                       : h < Hq + Hk ? dk + ((b * Hk + h - Hq) * T + t) * D
                                     : dv + ((b * Hk + h - Hq - Hk) * T + t) * D;
      if (h >= Hq + Hk) {
        for (int64_t j = 0; j < D; ++j) o[j] = to_bf16(g[j]);
        continue;
      }
      for (int64_t j = 0; j < half; ++j) o[j] = to_bf16(g[j] * c[j] + g[j + half] * s[j + half]);
      for (int64_t j = half; j < D; ++j) o[j] = to_bf16(g[j] * c[j] + g[j - half] * s[j - half]);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rope_split_fwd(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t Hq,
                                          int64_t Hk) {
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16 && qkv.dim() == 4 && qkv.size(2) == Hq + 2 * Hk);
  TORCH_CHECK(qkv.size(3) % 2 == 0, "rotary needs an even head size");
  qkv = qkv.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(3);
  TORCH_CHECK(cos.numel() == B * T * D && sin.numel() == B * T * D, "rotary tables must be [B, T, D]");
  auto opts = qkv.options().dtype(at::kFloat);
  auto q = at::empty({B, Hq, T, D}, opts), k = at::empty({B, Hk, T, D}, opts),
       v = at::empty({B, Hk, T, D}, opts);
  const auto* xp = reinterpret_cast<const bf16*>(qkv.data_ptr<at::BFloat16>());
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  for_rows(B * T, (Hq + 2 * Hk) * D, [&](int64_t r0, int64_t r1) {
    rope_rows_fwd(xp, cp, sp, qp, kp, vp, r0, r1, T, Hq, Hk, D);
  });
  return {q, k, v};
}

at::Tensor rope_split_bwd(at::Tensor dq, at::Tensor dk, at::Tensor dv, at::Tensor cos,
                             at::Tensor sin) {
  dq = dq.to(at::kFloat).contiguous();
  dk = dk.to(at::kFloat).contiguous();
  dv = dv.to(at::kFloat).contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  const int64_t B = dq.size(0), Hq = dq.size(1), T = dq.size(2), D = dq.size(3), Hk = dk.size(1);
  auto dqkv = at::empty({B, T, Hq + 2 * Hk, D}, dq.options().dtype(at::kBFloat16));
  auto* op = reinterpret_cast<bf16*>(dqkv.data_ptr<at::BFloat16>());
  const float *qp = dq.data_ptr<float>(), *kp = dk.data_ptr<float>(), *vp = dv.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  for_rows(B * T, (Hq + 2 * Hk) * D, [&](int64_t r0, int64_t r1) {
    rope_rows_bwd(qp, kp, vp, cp, sp, op, r0, r1, T, Hq, Hk, D);
  });
  return dqkv;
}

// ---- SwiGLU -----------------------------------------------------------------------------------------------
// h = silu(g) u = g sigma(g) u;  dh/dg = u sigma(g) (1 + g (1 - sigma(g))),  dh/du = g sigma(g)
ROWS void swiglu_rows_fwd(const bf16* gu, bf16* h, int64_t r0, int64_t r1, int64_t I) {
  for (int64_t i = r0; i < r1; ++i) {
    const bf16 *g = gu + i * 2 * I, *u = g + I;
    bf16* o = h + i * I;
    for (int64_t j = 0; j < I; ++j) {
      const float gj = from_bf16(g[j]);
      o[j] = to_bf16(gj * sigmoid_f32(gj) * from_bf16(u[j]));
    }
  }
}

ROWS void swiglu_rows_bwd(const bf16* gh, const bf16* gu, bf16* dgu, int64_t r0, int64_t r1, int64_t I) {
  for (int64_t i = r0; i < r1; ++i) {
    const bf16 *g = gu + i * 2 * I, *u = g + I, *d = gh + i * I;
    bf16 *dg = dgu + i * 2 * I, *du = dg + I;
    for (int64_t j = 0; j < I; ++j) {
      const float gj = from_bf16(g[j]), uj = from_bf16(u[j]), dj = from_bf16(d[j]);
      const float sg = sigmoid_f32(gj);
      dg[j] = to_bf16(dj * uj * sg * (1.0f + gj * (1.0f - sg)));
      du[j] = to_bf16(dj * gj * sg);
    }
  }
}

at::Tensor swiglu_fwd(at::Tensor gu) {
  TORCH_CHECK(gu.scalar_type() == at::kBFloat16 && gu.size(-1) % 2 == 0);
  gu = gu.contiguous();
  const int64_t I = gu.size(-1) / 2, N = gu.numel() / (2 * I);
  auto sizes = gu.sizes().vec();
  sizes.back() = I;
  auto h = at::empty(sizes, gu.options());
  const auto* gp = reinterpret_cast<const bf16*>(gu.data_ptr<at::BFloat16>());
  auto* hp = reinterpret_cast<bf16*>(h.data_ptr<at::BFloat16>());
  for_rows(N, 2 * I, [&](int64_t r0, int64_t r1) { swiglu_rows_fwd(gp, hp, r0, r1, I); });
  return h;
}

at::Tensor swiglu_bwd(at::Tensor gh, at::Tensor gu) {
  gh = gh.to(at::kBFloat16).contiguous();
  gu = gu.contiguous();
  const int64_t I = gu.size(-1) / 2, N = gu.numel() / (2 * I);
  auto dgu = at::empty(gu.sizes(), gu.options());
  const auto* hp = reinterpret_cast<const bf16*>(gh.data_ptr<at::BFloat16>());
  const auto* gp = reinterpret_cast<const bf16*>(gu.data_ptr<at::BFloat16>());
  auto* dp = reinterpret_cast<bf16*>(dgu.data_ptr<at::BFloat16>());
  for_rows(N, 3 * I, [&](int64_t r0, int64_t r1) { swiglu_rows_bwd(hp, gp, dp, r0, r1, I); });
  return dgu;
}

// ---- residual add ------------------------------------------------------------------------------------------
ROWS void residual_rows(const float* x, const bf16* y, float* out, int64_t r0, int64_t r1, int64_t H) {
  for (int64_t j = r0 * H; j < r1 * H; ++j) out[j] = x[j] + from_bf16(y[j]);
}

at::Tensor residual_add(at::Tensor x, at::Tensor y) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kBFloat16 && x.sizes() == y.sizes(),
              "residual_add: x float32 and y bf16 of one shape");
  x = x.contiguous();
  y = y.contiguous();
  const int64_t H = x.size(-1), N = x.numel() / std::max<int64_t>(H, 1);
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const auto* yp = reinterpret_cast<const bf16*>(y.data_ptr<at::BFloat16>());
  float* op = out.mutable_data_ptr<float>();
  for_rows(N, H, [&](int64_t r0, int64_t r1) { residual_rows(xp, yp, op, r0, r1, H); });
  return out;
}

}  // namespace tinystack_train

TORCH_LIBRARY(tinystack_train, m) {
  using namespace tinystack_train;
  m.def("rms_norm_fwd", &rms_norm_fwd);
  m.def("rms_norm_bwd", &rms_norm_bwd);
  m.def("rope_split_fwd", &rope_split_fwd);
  m.def("rope_split_bwd", &rope_split_bwd);
  m.def("residual_add", &residual_add);
  m.def("swiglu_fwd", &swiglu_fwd);
  m.def("swiglu_bwd", &swiglu_bwd);
}
