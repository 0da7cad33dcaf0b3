// A model step of a Llama-family model in one call: every layer in C++, for the step's packed tokens (decodes,
// speculative verification rows, short prefill chunks).
//
// Per layer, for the tokens' residual stream x [N, H] (float32):
//   h = rms(x) * g_in;   qkv = h @ Wqkv^T (+ b);   (Qwen3: each q and k head RMS-normed, gains g_q / g_k [hd])
//   q and k heads rotated at each row's position (rope tables)
//   k, v written to the row's slot in the paged cache;  each query head attends over its row's keys 0..its position,
//   read in place through the block table (no gather);  x += attn @ Wo^T
//   h = rms(x) * g_post;  [g | u] = h @ Wgu^T;  x += (silu(g) * u) @ Wdown^T
// The arithmetic of model/llama.py over infer/paged_cache.BatchView, without its ~40 PyTorch calls per
// layer from Python: for a thin model (SmolLM2: 30 layers of width 576) that dispatch, not reading the
// weights, was most of a decode step. Linear layers come in the engine's formats: float32 (at::mm),
// bfloat16 and the block formats (the kernels of kernels.cpp, called directly).
// LoRA adapters (infer/lora.py): set_lora() takes each linear's stacks of resident adapters, and a step's
// `slots` name each token's adapter (-1: the base); a linear then adds y_t[part i] += s B_a[part i] (A_a,i x_t)
// for each token of adapter a, after the base product: the model's forward through LoRAProjection.
#include <torch/extension.h>

#include <immintrin.h>

#include "kernels.h"
#include "pool.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace tinystack {

#define AVX512_ATTN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

enum Kind { F32 = -1, BF16 = 3 };  // 0..2: the block formats of kernels.h

struct Lin {  // F32: a = w [N, K] (any strides); BF16: a = w [N, Kp]; block formats: a = qs, b = d, c = m
  int64_t kind = F32, N = 0;
  torch::Tensor a, b, c, bias;
  torch::Tensor lora_a, lora_bt;  // LoRA stacks (infer/lora.py): A [adapters, P W, K], s B^T [adapters, W, N]; or none
  std::vector<int64_t> parts;     // where each fused part's outputs start, and N: {0, q, q + k, N} for qkv
};

struct Layer {
  const float *in_norm, *post_norm, *q_norm = nullptr, *k_norm = nullptr;  // q/k: Qwen3's per-head norms
  Lin qkv, o, gate_up, down;
};

// Sums of 16 independent lanes: the compiler vectorises these without reordering any one sum.
__attribute__((always_inline)) inline float dot(const float* a, const float* b, int n) {
  float acc[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// Each of `rows` rows of p [rows, S] -> its softmax, in float32 as the engine's path does.
__attribute__((always_inline)) inline void softmax_rows(float* p, int rows, int S) {
  for (int j = 0; j < rows; ++j, p += S) {
    float mx = -INFINITY, sum = 0.f;
    for (int s = 0; s < S; ++s) mx = std::max(mx, p[s]);
    for (int s = 0; s < S; ++s) sum += (p[s] = std::exp(p[s] - mx));
    const float inv = 1.f / sum;
    for (int s = 0; s < S; ++s) p[s] *= inv;
  }
}

// Attention of one row's `grp` query heads (q [grp, hd]) over keys/values 0..S-1 of one kv head, whose
// slots are table[p / bs] * bs + p % bs in K, V [slots, hd]; out [grp, hd]; scores: scratch [grp, S].
__attribute__((always_inline)) inline void attend_body(const float* q, const float* K, const float* V,
                                                       const int64_t* table, int64_t bs, int S, int grp, int hd,
                                                       float scale, float* scores, float* out) {
  for (int s = 0; s < S; ++s) {
    const float* key = K + (table[s / bs] * bs + s % bs) * hd;
    for (int j = 0; j < grp; ++j) scores[j * S + s] = dot(q + j * hd, key, hd) * scale;
  }
  softmax_rows(scores, grp, S);
  std::memset(out, 0, sizeof(float) * grp * hd);
  for (int s = 0; s < S; ++s) {
    const float* val = V + (table[s / bs] * bs + s % bs) * hd;
    for (int j = 0; j < grp; ++j) {
      const float w = scores[j * S + s];
      float* o = out + j * hd;
      for (int i = 0; i < hd; ++i) o[i] += w * val[i];
    }
  }
}

// The same with explicit 16-lane vectors for head sizes that are a multiple of 16 (64 for most models): one
// key's dot products with the group's queries as fused multiply-adds and one tree reduction each.
AVX512_ATTN void attend_avx512(const float* q, const float* K, const float* V, const int64_t* table, int64_t bs,
                               int S, int grp, int hd, float scale, float* scores, float* out) {
  if (hd % 16 != 0) return attend_body(q, K, V, table, bs, S, grp, hd, scale, scores, out);
  const int nv = hd / 16;
  for (int s = 0; s < S; ++s) {
    const float* key = K + (table[s / bs] * bs + s % bs) * hd;
    for (int j = 0; j < grp; ++j) {
      const float* qj = q + j * hd;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qj), _mm512_loadu_ps(key));
      for (int v = 1; v < nv; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * v), _mm512_loadu_ps(key + 16 * v), acc);
      scores[j * S + s] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
  softmax_rows(scores, grp, S);
  std::memset(out, 0, sizeof(float) * grp * hd);
  for (int s = 0; s < S; ++s) {
    const float* val = V + (table[s / bs] * bs + s % bs) * hd;
    for (int j = 0; j < grp; ++j) {
      const __m512 w = _mm512_set1_ps(scores[j * S + s]);
      float* o = out + j * hd;
      for (int v = 0; v < nv; ++v)
        _mm512_storeu_ps(o + 16 * v, _mm512_fmadd_ps(w, _mm512_loadu_ps(val + 16 * v), _mm512_loadu_ps(o + 16 * v)));
    }
  }
}

// y[0..n) += a x[0..n): vectorised by the compiler, with AVX2 where the kernel path has it
__attribute__((always_inline)) inline void axpy_body(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) { axpy_body(a, x, y, n); }
void axpy(float a, const float* x, float* y, int64_t n) { axpy_body(a, x, y, n); }

void attend_plain(const float* q, const float* K, const float* V, const int64_t* table, int64_t bs, int S, int grp,
                  int hd, float scale, float* scores, float* out) {
  attend_body(q, K, V, table, bs, S, grp, hd, scale, scores, out);
}

class FusedLayers {
 public:
  // dims = {n_layer, hidden, n_head, n_kv_head, head_dim, intermediate}; norms = [in_0, post_0, in_1, ...],
  // or with per-head q/k norms (Qwen3) [in_0, post_0, q_0, k_0, in_1, ...];
  // per layer 4 linears (qkv, o, gate_up, down), each 4 tensors in `parts` (a, b, c, bias; numel 0 = absent)
  // and a kind in `kinds`; path: 1 AVX-512 kernels, 2 AVX2 (attention in plain C++), 0 plain C++.
  FusedLayers(std::vector<int64_t> dims, double eps, std::vector<torch::Tensor> norms, std::vector<int64_t> kinds,
               std::vector<torch::Tensor> parts, int64_t path)
      : L_(dims.at(0)), H_(dims.at(1)), nh_(dims.at(2)), nkv_(dims.at(3)), hd_(dims.at(4)), I_(dims.at(5)),
        eps_((float)eps), path_((int)path), norms_(std::move(norms)), parts_(std::move(parts)) {
    const int64_t per = (int64_t)norms_.size() == 4 * L_ ? 4 : 2;  // 4: with q/k norms
    TORCH_CHECK((int64_t)norms_.size() == per * L_ && (int64_t)kinds.size() == 4 * L_ &&
                (int64_t)parts_.size() == 16 * L_, "expected 2 (or 4) norms, 4 linears and 16 parts per layer");
    TORCH_CHECK(nh_ % nkv_ == 0, "n_head must be a multiple of n_kv_head");
    TORCH_CHECK(path_available(path_), "kernel path ", path_, " needs a CPU feature this one lacks");
    const int64_t outs[4] = {(nh_ + 2 * nkv_) * hd_, H_, 2 * I_, H_};
    for (int64_t l = 0; l < L_; ++l) {
      Layer y;
      for (int i = 0; i < per; ++i) {
        const auto& g = norms_[per * l + i];
        TORCH_CHECK(g.scalar_type() == torch::kFloat32 && g.is_contiguous() && g.numel() == (i < 2 ? H_ : hd_),
                    "norm weights");
      }
      y.in_norm = norms_[per * l].data_ptr<float>();
      y.post_norm = norms_[per * l + 1].data_ptr<float>();
      if (per == 4) y.q_norm = norms_[per * l + 2].data_ptr<float>(), y.k_norm = norms_[per * l + 3].data_ptr<float>();
      Lin* lins[4] = {&y.qkv, &y.o, &y.gate_up, &y.down};
      for (int i = 0; i < 4; ++i) {
        Lin& lin = *lins[i];
        lin.kind = kinds[4 * l + i];
        lin.N = outs[i];
        lin.parts = i == 0 ? std::vector<int64_t>{0, nh_ * hd_, (nh_ + nkv_) * hd_, lin.N}
                    : i == 2 ? std::vector<int64_t>{0, I_, lin.N} : std::vector<int64_t>{0, lin.N};
        const torch::Tensor* p = &parts_[16 * l + 4 * i];
        lin.a = p[0], lin.b = p[1], lin.c = p[2], lin.bias = p[3];
        TORCH_CHECK(lin.a.size(0) == lin.N, "layer ", l, " linear ", i, ": ", lin.a.size(0), " outputs, expected ",
                    lin.N);
        TORCH_CHECK(lin.kind == F32 ? lin.a.scalar_type() == torch::kFloat32
                    : lin.kind == BF16 ? lin.a.scalar_type() == torch::kBFloat16 && lin.a.is_contiguous()
                                       : lin.kind >= 0 && lin.kind <= 2 && lin.a.is_contiguous() && lin.b.is_contiguous(),
                    "layer ", l, " linear ", i, ": unsupported weights");
        TORCH_CHECK(lin.kind != Q4_1 || lin.c.is_contiguous(), "Q4_1 needs m");
        TORCH_CHECK(lin.bias.numel() == 0 || (lin.bias.scalar_type() == torch::kFloat32 && lin.bias.numel() == lin.N),
                    "bias must be float32 [N]");
      }
      layers_.push_back(y);
    }
  }

  // stacks: per layer and linear (qkv, o, gate_up, down) A [K, P W, in] and s B^T [K, W, out], contiguous float32
  // (P: the linear's fused parts, 3, 1, 2, 1), the same K for all (numel 0: that linear has no adapter); empty:
  // none at all.
  void set_lora(std::vector<torch::Tensor> stacks) {
    TORCH_CHECK(stacks.empty() || (int64_t)stacks.size() == 8 * L_, "expected A and s B for each of 4 linears per layer");
    const int64_t ins[4] = {H_, nh_ * hd_, H_, I_};
    lora_k_ = -1;
    for (int64_t l = 0; l < L_; ++l) {
      Lin* lins[4] = {&layers_[l].qkv, &layers_[l].o, &layers_[l].gate_up, &layers_[l].down};
      for (int i = 0; i < 4; ++i) {
        Lin& lin = *lins[i];
        lin.lora_a = lin.lora_bt = torch::Tensor();
        if (stacks.empty() || stacks[8 * l + 2 * i].numel() == 0) continue;
        const auto &a = stacks[8 * l + 2 * i], &b = stacks[8 * l + 2 * i + 1];
        TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32 && a.is_contiguous() &&
                    b.is_contiguous() && a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) &&
                    a.size(1) == b.size(1) * (int64_t)(lin.parts.size() - 1) && a.size(2) == ins[i] &&
                    b.size(2) == lin.N,
                    "layer ", l, " linear ", i, ": LoRA stacks must be float32 A [K, P W, in] and s B^T [K, W, out]");
        TORCH_CHECK(lora_k_ < 0 || lora_k_ == a.size(0), "every LoRA stack must hold the same adapters");
        lora_k_ = a.size(0), lin.lora_a = a, lin.lora_bt = b;
      }
    }
  }

  // x [N, H] float32: the step's new tokens' embeddings, rows packed one after another; cos, sin [P, hd]
  // (model/llama.rotary_table); pos [N] each token's position; rows [N] the row of `tables` [R, T] (int64 block
  // tables, padding unread) that token belongs to; kc, vc [n_layer, n_kv_head, blocks, block_size, hd] float32.
  // Every token's key/value is written at its slot before any token attends, so token t sees its row's keys
  // 0..pos[t]: the cached history and the step's own earlier tokens (causal within a chunk).
  // -> the hidden states after the last layer [N, H].
  // slots [N] int64: each token's place in the LoRA stacks of set_lora (-1: the base); empty: no adapters.
  torch::Tensor step(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor pos, torch::Tensor rows,
                     torch::Tensor kc, torch::Tensor vc, torch::Tensor tables, torch::Tensor slots_t) {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == H_ && x.scalar_type() == torch::kFloat32, "x must be [N, hidden] float32");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == hd_ && cos.scalar_type() == torch::kFloat32,
                "rope tables [P, head_dim] float32");
    TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous() && kc.dim() == 5 && kc.size(0) == L_ && kc.size(1) == nkv_ &&
                kc.size(4) == hd_ && kc.scalar_type() == torch::kFloat32 && vc.sizes() == kc.sizes(),
                "KV storage must be contiguous float32 [n_layer, n_kv_head, blocks, block_size, head_dim]");
    const int N = x.size(0);
    TORCH_CHECK(pos.numel() == N && rows.numel() == N && tables.dim() == 2 && tables.is_contiguous() &&
                pos.is_contiguous() && rows.is_contiguous() && pos.scalar_type() == torch::kLong &&
                rows.scalar_type() == torch::kLong && tables.scalar_type() == torch::kLong,
                "pos [N], rows [N], tables [R, T]: contiguous int64");
    const int64_t bs = kc.size(3), slots = kc.size(2) * bs, T = tables.size(1);
    const int64_t *P = pos.data_ptr<int64_t>(), *row = rows.data_ptr<int64_t>(), *tab = tables.data_ptr<int64_t>();
    for (int t = 0; t < N; ++t) {
      TORCH_CHECK(row[t] >= 0 && row[t] < tables.size(0), "token ", t, ": row ", row[t], " out of range");
      TORCH_CHECK(P[t] >= 0 && P[t] < cos.size(0) && P[t] / bs < T, "token ", t, ": position ", P[t], " out of range");
      const int64_t block = tab[row[t] * T + P[t] / bs];
      TORCH_CHECK(block >= 0 && block < kc.size(2), "token ", t, ": block ", block, " out of range");
    }
    const int64_t* slot = nullptr;  // each token's adapter (-1: the base), or none at all
    if (slots_t.numel()) {
      TORCH_CHECK(slots_t.numel() == N && slots_t.is_contiguous() && slots_t.scalar_type() == torch::kLong,
                  "slots [N]: contiguous int64");
      slot = slots_t.data_ptr<int64_t>();
      for (int t = 0; t < N; ++t)
        TORCH_CHECK(slot[t] >= -1 && slot[t] < std::max<int64_t>(lora_k_, 0), "token ", t, ": adapter slot ",
                    slot[t], " is not set (set_lora)");
    }
    auto out = x.contiguous().clone();
    float* X = out.data_ptr<float>();
    const int Q = (nh_ + 2 * nkv_) * hd_, grp = nh_ / nkv_;
    std::vector<float> h((size_t)N * H_), qkv((size_t)N * Q), att((size_t)N * nh_ * hd_), gu((size_t)N * 2 * I_),
        act((size_t)N * I_), tmp((size_t)N * H_), rot(hd_);
    const float scale = 1.f / std::sqrt((float)hd_);
    float *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
    for (int64_t l = 0; l < L_; ++l) {
      const Layer& y = layers_[l];
      rms(X, y.in_norm, N, h.data());
      matmul(y.qkv, h.data(), N, H_, qkv.data(), slot);
      for (int t = 0; t < N; ++t) {  // rotary on the q and k heads: x cos + roll(x, hd/2) signed_sin
        const float *c = cos.data_ptr<float>() + P[t] * hd_, *s = sin.data_ptr<float>() + P[t] * hd_;
        for (int head = 0; head < nh_ + nkv_; ++head) {
          float* v = qkv.data() + (size_t)t * Q + head * hd_;
          if (y.q_norm != nullptr) {  // x * rsqrt(mean(x^2) + eps) * g, over the head, before the rotation
            const float* g = head < nh_ ? y.q_norm : y.k_norm;
            const float inv = 1.f / std::sqrt(dot(v, v, hd_) / (float)hd_ + eps_);
            for (int i = 0; i < hd_; ++i) v[i] = g[i] * (v[i] * inv);
          }
          for (int i = 0; i < hd_; ++i) rot[i] = v[i] * c[i] + v[(i + hd_ / 2) % hd_] * s[i];
          std::memcpy(v, rot.data(), sizeof(float) * hd_);
        }
        const int64_t slot = tab[row[t] * T + P[t] / bs] * bs + P[t] % bs;
        for (int g = 0; g < nkv_; ++g) {
          const size_t at = ((size_t)(l * nkv_ + g) * slots + slot) * hd_;
          std::memcpy(kp + at, qkv.data() + (size_t)t * Q + (nh_ + g) * hd_, sizeof(float) * hd_);
          std::memcpy(vp + at, qkv.data() + (size_t)t * Q + (nh_ + nkv_ + g) * hd_, sizeof(float) * hd_);
        }
      }
      row_pool().run((int64_t)N * nkv_, 1, [&](int64_t t0, int64_t t1) {  // one task per (token, kv head)
        std::vector<float> scores;
        for (int64_t task = t0; task < t1; ++task) {
          const int t = task / nkv_, g = task % nkv_, S = P[t] + 1;
          scores.resize((size_t)grp * S);
          const size_t base = (size_t)(l * nkv_ + g) * slots * hd_;
          (path_ == 1 ? attend_avx512 : attend_plain)(qkv.data() + (size_t)t * Q + g * grp * hd_, kp + base, vp + base,
                                                 tab + row[t] * T, bs, S, grp, hd_, scale, scores.data(),
                                                 att.data() + ((size_t)t * nh_ + g * grp) * hd_);
        }
      });
      matmul(y.o, att.data(), N, nh_ * hd_, tmp.data(), slot);
      for (size_t i = 0; i < tmp.size(); ++i) X[i] += tmp[i];
      rms(X, y.post_norm, N, h.data());
      matmul(y.gate_up, h.data(), N, H_, gu.data(), slot);
      for (int r = 0; r < N; ++r)
        for (int64_t i = 0; i < I_; ++i) {
          const float g = gu[(size_t)r * 2 * I_ + i], u = gu[(size_t)r * 2 * I_ + I_ + i];
          act[(size_t)r * I_ + i] = g / (1.f + std::exp(-g)) * u;
        }
      matmul(y.down, act.data(), N, I_, tmp.data(), slot);
      for (size_t i = 0; i < tmp.size(); ++i) X[i] += tmp[i];
    }
    return out;
  }

 private:
  void rms(const float* x, const float* g, int D, float* y) const {  // float32, as Hugging Face's LlamaRMSNorm
    for (int r = 0; r < D; ++r) {
      const float* xr = x + (size_t)r * H_;
      const float inv = 1.f / std::sqrt(dot(xr, xr, H_) / (float)H_ + eps_);
      for (int64_t i = 0; i < H_; ++i) y[(size_t)r * H_ + i] = g[i] * (xr[i] * inv);
    }
  }

  // y [M, N] = x [M, K] @ W^T (+ b), plus each token's adapter delta where `slot` names one
  void matmul(const Lin& w, const float* x, int M, int64_t K, float* y, const int64_t* slot) const {
    const float* x_in = x;  // the BF16 path may swap x for a padded copy
    if (w.kind == F32) {
      auto xt = torch::from_blob(const_cast<float*>(x), {M, K}, torch::kFloat32);
      auto yt = torch::from_blob(y, {M, w.N}, torch::kFloat32);
      at::mm_out(yt, xt, w.a.t());
    } else if (w.kind == BF16) {
      const int64_t Kp = w.a.size(1);
      std::vector<float> padded;
      if (Kp != K) {  // the packed rows are zero padded to a multiple of 32; the activations must be too
        padded.assign((size_t)M * Kp, 0.f);
        for (int r = 0; r < M; ++r) std::memcpy(padded.data() + (size_t)r * Kp, x + (size_t)r * K, sizeof(float) * K);
        x = padded.data();
      }
      bf16_matmul_raw(x, M, Kp, (const uint16_t*)w.a.data_ptr(), w.N, y, path_);
    } else {
      block_matmul_raw(x, M, K, w.kind, (const uint8_t*)w.a.data_ptr(), (const uint16_t*)w.b.data_ptr(),
                       w.kind == Q4_1 ? (const uint16_t*)w.c.data_ptr() : nullptr, w.N, w.a.size(1), y, path_);
    }
    if (w.bias.numel()) {
      const float* b = w.bias.data_ptr<float>();
      for (int r = 0; r < M; ++r)
        for (int64_t n = 0; n < w.N; ++n) y[(size_t)r * w.N + n] += b[n];
    }
    if (slot != nullptr && w.lora_a.defined()) lora(w, x_in, M, K, y, slot);
  }

  // y[t][part i] += s B_a[part i] (A_a,i x[t]) for each token t of an adapter a = slot[t]: the P W dot
  // products of length K (A x), then W axpys along the part's outputs (s B^T rows). One task per token on the
  // pool (a decode of one row runs inline; each linear's delta is small beside its base product).
  void lora(const Lin& w, const float* x, int M, int64_t K, float* y, const int64_t* slot) const {
    const int64_t PW = w.lora_a.size(1), W = w.lora_bt.size(1);
    const float *A = w.lora_a.data_ptr<float>(), *BT = w.lora_bt.data_ptr<float>();
    const bool avx2 = path_ != 0;
    row_pool().run(M, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> ax(PW);
      for (int64_t t = t0; t < t1; ++t) {
        if (slot[t] < 0) continue;
        const float *a = A + (size_t)slot[t] * PW * K, *bt = BT + (size_t)slot[t] * W * w.N;
        for (int64_t j = 0; j < PW; ++j) ax[j] = dot(a + j * K, x + (size_t)t * K, (int)K);
        float* yt = y + (size_t)t * w.N;
        for (size_t i = 0; i + 1 < w.parts.size(); ++i) {  // part i's outputs take ax's W columns from i W
          const int64_t lo = w.parts[i], n = w.parts[i + 1] - lo;
          for (int64_t c = 0; c < W; ++c) (avx2 ? axpy_avx2 : axpy)(ax[i * W + c], bt + c * w.N + lo, yt + lo, n);
        }
      }
    });
  }

  int64_t L_, H_, nh_, nkv_, hd_, I_, lora_k_ = -1;
  float eps_;
  int path_;
  std::vector<torch::Tensor> norms_, parts_;  // kept alive: layers_ points into them
  std::vector<Layer> layers_;
};

}  // namespace tinystack

void register_fused_step(pybind11::module_& mod) {
  // the GIL is released while a step runs, as for the matmuls
  pybind11::class_<tinystack::FusedLayers>(mod, "FusedLayers")
      .def(pybind11::init<std::vector<int64_t>, double, std::vector<torch::Tensor>, std::vector<int64_t>,
                          std::vector<torch::Tensor>, int64_t>())
      .def("set_lora", &tinystack::FusedLayers::set_lora)
      .def("step", &tinystack::FusedLayers::step, pybind11::call_guard<pybind11::gil_scoped_release>());
}
