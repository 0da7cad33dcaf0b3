// Causal self-attention for bf16 training on CPU (kernels/fused_attention.py), forward and backward.
//
//   causal_attention_fwd(q f32 [B, H, T, D], k f32 [B, KV, T, D], v bf16 [B, KV, T, D], scale)
//        -> o bf16 [B, H, T, D], p bf16 [B KV, G T, T] (the probabilities, kept for the backward),
//           q, k in bf16 (the backward's operands)
//   causal_attention_bwd(do [B, H, T, D], q, k, v bf16, p, scale) -> dq, dk, dv bf16
//
// The H / KV query heads that share a key/value head (G = H / KV, grouped-query attention) are stacked as the
// rows of one [G T, D] matrix: their queries see the same keys, so one (batch, kv head) group is five matrix
// products (one forward, four backward, bf16 on the machine's fastest matmul) around two row passes here:
//
//   s = q k^T (float32: the softmax's exp turns an absolute error in s into a relative one in p)
//   p_j = softmax_j(scale s_j) over the keys j <= t, 0 after (row r is query position r mod T)   -> bf16
//   ds_j = scale p_j (dp_j - sum_k p_k dp_k), dp = do v^T: the softmax's Jacobian at p applied to dp
//
// Each thread takes whole groups (when they divide evenly over the threads), so a group's [G T, T] block stays
// in that core's cache from one product through the row pass to the next; otherwise the groups run one after
// another with each product and row pass split over the threads. p costs B H T^2 bf16 values a layer until
// the backward: the Python side uses this path only while that stays small.
#include "fused_ops.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>

namespace tinystack_train {

ROWS void softmax_rows_fwd(const float* s, bf16* p, int64_t r0, int64_t r1, int64_t T, float scale) {
  std::vector<float> e(T);
  float* ep = e.data();
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t n = i % T + 1;  // the keys this query sees
    const float* si = s + i * T;
    bf16* pi = p + i * T;
    float mx[16];
    for (int k = 0; k < 16; ++k) mx[k] = -INFINITY;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (int k = 0; k < 16; ++k) mx[k] = std::max(mx[k], si[j + k]);
    float m = -INFINITY;
    for (; j < n; ++j) m = std::max(m, si[j]);
    for (int k = 0; k < 16; ++k) m = std::max(m, mx[k]);
    m *= scale;  // scale > 0: the max of the scaled row
    for (j = 0; j < n; ++j) ep[j] = exp_f32(si[j] * scale - m);
    const float inv = 1.0f / sum16(n, [&](int64_t jj) { return ep[jj]; });
    for (j = 0; j < n; ++j) pi[j] = to_bf16(ep[j] * inv);
    std::memset(pi + n, 0, (T - n) * sizeof(bf16));
  }
}

// in place allowed (ds == dp): a row's sum is taken before the row is written
ROWS void softmax_rows_bwd(const bf16* p, const bf16* dp, bf16* ds, int64_t r0, int64_t r1, int64_t T, float scale) {
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t n = i % T + 1;
    const bf16 *pi = p + i * T, *gi = dp + i * T;
    bf16* o = ds + i * T;
    const float delta = sum16(n, [&](int64_t j) { return from_bf16(pi[j]) * from_bf16(gi[j]); });
    for (int64_t j = 0; j < n; ++j) o[j] = to_bf16(scale * from_bf16(pi[j]) * (from_bf16(gi[j]) - delta));
    std::memset(o + n, 0, (T - n) * sizeof(bf16));
  }
}

ROWS void to_bf16_rows(const float* x, bf16* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = to_bf16(x[j]);
}

// fn(g, scratch) for every group g: whole groups per thread when they divide evenly (or are many), else one group
// after another with the work inside each split over the threads (nested parallel_for and the products do that).
template <typename F>
void each_group(int64_t groups, at::IntArrayRef scratch_shape, const at::TensorOptions& opts, const F& fn) {
  const int64_t threads = at::get_num_threads();
  if (groups % threads == 0 || groups >= 4 * threads) {
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      auto scratch = at::empty(scratch_shape, opts);
      for (int64_t g = g0; g < g1; ++g) fn(g, scratch);
    });
  } else {
    auto scratch = at::empty(scratch_shape, opts);
    for (int64_t g = 0; g < groups; ++g) fn(g, scratch);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> causal_attention_fwd(at::Tensor q, at::Tensor k,
                                                                                at::Tensor v, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kBFloat16,
              "causal_attention_fwd: q, k float32 and v bf16");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0 && q.size(0) == k.size(0) &&
              q.size(2) == k.size(2) && q.size(3) == k.size(3), "causal_attention_fwd: shapes");
  TORCH_CHECK(scale > 0, "causal_attention_fwd: scale must be positive");
  q = q.detach().contiguous();  // (detached: the products below write into given outputs, which autograd refuses)
  k = k.detach().contiguous();
  v = v.detach().contiguous();
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KV = k.size(1), G = H / KV;
  const auto bf = v.options();
  auto o = at::empty({B, H, T, D}, bf), p = at::empty({B * KV, G * T, T}, bf);
  auto qb = at::empty_like(q, bf), kb = at::empty_like(k, bf);
  auto qg = q.view({B * KV, G * T, D}), kg = k.view({B * KV, T, D}), vg = v.view({B * KV, T, D});
  auto og = o.view({B * KV, G * T, D}), qbg = qb.view({B * KV, G * T, D}), kbg = kb.view({B * KV, T, D});
  each_group(B * KV, {G * T, T}, q.options(), [&](int64_t g, at::Tensor& s) {
    at::mm_out(s, qg[g], kg[g].t());
    const float* sp = s.data_ptr<float>();
    auto* pp = reinterpret_cast<bf16*>(p[g].data_ptr<at::BFloat16>());
    for_rows(G * T, T, [&](int64_t r0, int64_t r1) { softmax_rows_fwd(sp, pp, r0, r1, T, float(scale)); });
    auto out = og[g];
    at::mm_out(out, p[g], vg[g]);
    to_bf16_rows(qg[g].data_ptr<float>(), reinterpret_cast<bf16*>(qbg[g].data_ptr<at::BFloat16>()), G * T * D);
    to_bf16_rows(kg[g].data_ptr<float>(), reinterpret_cast<bf16*>(kbg[g].data_ptr<at::BFloat16>()), T * D);
  });
  return {o, p, qb, kb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> causal_attention_bwd(at::Tensor dout, at::Tensor q, at::Tensor k,
                                                                    at::Tensor v, at::Tensor p, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
              v.scalar_type() == at::kBFloat16 && p.scalar_type() == at::kBFloat16, "causal_attention_bwd: bf16");
  dout = dout.detach().to(at::kBFloat16).contiguous();
  q = q.detach().contiguous();
  k = k.detach().contiguous();
  v = v.detach().contiguous();
  p = p.detach().contiguous();
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KV = k.size(1), G = H / KV;
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto qg = q.view({B * KV, G * T, D}), kg = k.view({B * KV, T, D}), vg = v.view({B * KV, T, D});
  auto dog = dout.view({B * KV, G * T, D});
  auto dqg = dq.view({B * KV, G * T, D}), dkg = dk.view({B * KV, T, D}), dvg = dv.view({B * KV, T, D});
  each_group(B * KV, {G * T, T}, p.options(), [&](int64_t g, at::Tensor& dp) {
    auto pg = p[g], dv_g = dvg[g], dq_g = dqg[g], dk_g = dkg[g];
    at::mm_out(dv_g, pg.t(), dog[g]);  // dv = p^T do (summed over the group's query heads by the product)
    at::mm_out(dp, dog[g], vg[g].t());
    const auto* pp = reinterpret_cast<const bf16*>(pg.data_ptr<at::BFloat16>());
    auto* dpp = reinterpret_cast<bf16*>(dp.data_ptr<at::BFloat16>());
    for_rows(G * T, 2 * T, [&](int64_t r0, int64_t r1) { softmax_rows_bwd(pp, dpp, dpp, r0, r1, T, float(scale)); });
    at::mm_out(dq_g, dp, kg[g]);       // dq = ds k
    at::mm_out(dk_g, dp.t(), qg[g]);   // dk = ds^T q
  });
  return {dq, dk, dv};
}

}  // namespace tinystack_train

TORCH_LIBRARY_FRAGMENT(tinystack_train, m) {
  using namespace tinystack_train;
  m.def("causal_attention_fwd", &causal_attention_fwd);
  m.def("causal_attention_bwd", &causal_attention_bwd);
}
