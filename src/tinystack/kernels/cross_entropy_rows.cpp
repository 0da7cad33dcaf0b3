// The training loss's row loops (train/cross_entropy.py, train/frozen_head.py), one pass each way over a row:
//
//   logsumexp_rows(logits bf16|f32 [N, V]) -> lse f32 [N]
//   cross_entropy_grad(logits, targets, lse, scale, inplace) -> (softmax - onehot) * scale per row, in the logits'
//        dtype (inplace: written over the logits; train/frozen_head.py's chunks)
//
// Built into the same extension as fused_ops.cpp (its header comment says how the row loops are compiled).
#include "fused_ops.h"

namespace tinystack_train {

// ---- cross-entropy over a large vocabulary (train/cross_entropy.py) -----------------------------------------
// lse_i = log sum_j exp(l_ij) per row, in float32 from bf16 or float32 logits; the backward writes
// (exp(l_ij - lse_i) - [j == t_i]) * scale_i in the logits' dtype. One read of a row forward, one read and one
// write backward, where PyTorch upcast a block of rows, subtracted, exponentiated and scaled in separate passes.
INLINE float load(const float* p, int64_t j) { return p[j]; }
INLINE float load(const bf16* p, int64_t j) { return from_bf16(p[j]); }
INLINE void store(float* p, int64_t j, float v) { p[j] = v; }
INLINE void store(bf16* p, int64_t j, float v) { p[j] = to_bf16(v); }

template <typename T>
INLINE void lse_rows(const T* logits, float* lse, int64_t r0, int64_t r1, int64_t V) {
  for (int64_t i = r0; i < r1; ++i) {
    const T* l = logits + i * V;
    float mx[16], acc[16];
    for (int k = 0; k < 16; ++k) mx[k] = -INFINITY, acc[k] = 0.f;
    int64_t j = 0;
    for (; j + 16 <= V; j += 16)
      for (int k = 0; k < 16; ++k) mx[k] = std::max(mx[k], load(l, j + k));
    float m = -INFINITY;
    for (; j < V; ++j) m = std::max(m, load(l, j));
    for (int k = 0; k < 16; ++k) m = std::max(m, mx[k]);
    if (m == -INFINITY || m != m) {  // a row of -inf (or with NaN): what logsumexp gives
      lse[i] = m;
      continue;
    }
    const float s = sum16(V, [&](int64_t jj) { return exp_f32(load(l, jj) - m); });
    lse[i] = m + std::log(s);
  }
}

ROWS void lse_rows_bf16(const bf16* l, float* lse, int64_t r0, int64_t r1, int64_t V) { lse_rows(l, lse, r0, r1, V); }
ROWS void lse_rows_f32(const float* l, float* lse, int64_t r0, int64_t r1, int64_t V) { lse_rows(l, lse, r0, r1, V); }

template <typename T>
INLINE void ce_grad_rows(const T* logits, const int64_t* target, const float* lse, const float* scale, T* grad,
                         int64_t r0, int64_t r1, int64_t V) {
  for (int64_t i = r0; i < r1; ++i) {
    const T* l = logits + i * V;
    T* g = grad + i * V;
    const float sc = scale[i], m = lse[i];
    if (sc == 0.f) {  // an ignored row
      for (int64_t j = 0; j < V; ++j) store(g, j, 0.f);
      continue;
    }
    const int64_t t = target[i];
    const float lt = load(l, t);  // read before the row is written: g may be l itself (inplace)
    for (int64_t j = 0; j < V; ++j) store(g, j, exp_f32(load(l, j) - m) * sc);
    store(g, t, (exp_f32(lt - m) - 1.0f) * sc);
  }
}

ROWS void ce_grad_rows_bf16(const bf16* l, const int64_t* t, const float* lse, const float* sc, bf16* g, int64_t r0,
                            int64_t r1, int64_t V) {
  ce_grad_rows(l, t, lse, sc, g, r0, r1, V);
}
ROWS void ce_grad_rows_f32(const float* l, const int64_t* t, const float* lse, const float* sc, float* g, int64_t r0,
                           int64_t r1, int64_t V) {
  ce_grad_rows(l, t, lse, sc, g, r0, r1, V);
}

at::Tensor logsumexp_rows(at::Tensor logits) {
  TORCH_CHECK(logits.dim() == 2 && (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat));
  logits = logits.contiguous();
  const int64_t N = logits.size(0), V = logits.size(1);
  auto lse = at::empty({N}, logits.options().dtype(at::kFloat));
  float* out = lse.data_ptr<float>();
  if (logits.scalar_type() == at::kBFloat16) {
    const auto* l = reinterpret_cast<const bf16*>(logits.data_ptr<at::BFloat16>());
    at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) { lse_rows_bf16(l, out, r0, r1, V); });
  } else {
    const float* l = logits.data_ptr<float>();
    at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) { lse_rows_f32(l, out, r0, r1, V); });
  }
  return lse;
}

// targets must lie in [0, V) (the caller maps ignored rows to 0 and gives them scale 0)
// inplace: the gradient overwrites the logits (which must be contiguous), for a caller that needs them no more
at::Tensor cross_entropy_grad(at::Tensor logits, at::Tensor targets, at::Tensor lse, at::Tensor scale, bool inplace) {
  TORCH_CHECK(!inplace || logits.is_contiguous(), "cross_entropy_grad: inplace needs contiguous logits");
  logits = logits.contiguous();
  targets = targets.to(at::kLong).contiguous();
  lse = lse.contiguous();
  scale = scale.to(at::kFloat).contiguous();
  const int64_t N = logits.size(0), V = logits.size(1);
  auto grad = inplace ? logits : at::empty({N, V}, logits.options());
  const int64_t* t = targets.data_ptr<int64_t>();
  const float *m = lse.data_ptr<float>(), *sc = scale.data_ptr<float>();
  if (logits.scalar_type() == at::kBFloat16) {
    const auto* l = reinterpret_cast<const bf16*>(logits.data_ptr<at::BFloat16>());
    auto* g = reinterpret_cast<bf16*>(grad.data_ptr<at::BFloat16>());
    at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) { ce_grad_rows_bf16(l, t, m, sc, g, r0, r1, V); });
  } else {
    const float* l = logits.data_ptr<float>();
    float* g = grad.data_ptr<float>();
    at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) { ce_grad_rows_f32(l, t, m, sc, g, r0, r1, V); });
  }
  return grad;
}

}  // namespace tinystack_train

TORCH_LIBRARY_FRAGMENT(tinystack_train, m) {
  using namespace tinystack_train;
  m.def("logsumexp_rows", &logsumexp_rows);
  m.def("cross_entropy_grad", &cross_entropy_grad);
}
