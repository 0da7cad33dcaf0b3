// LoRA's product (train/lora.py) on CPUs with AMX: each direction one pass over the activations, the adapters'
// thin products fused into the frozen weight's product instead of run as library calls of their own.
//
// Through library calls a LoRA layer's six thin products (x A^T, y += xa (s B)^T, g (s B), grad_x += g_xa A,
// g_xa^T x, g^T xa) each read an activation from memory again: that traffic, not their arithmetic, is what they
// cost. Here each thread takes its rows (a chunk) and runs every product of the chunk while the
// chunk's rows are in its cache:
//
//   forward:  xa = x A^T;  y = [x | xa] [W | s B]^T           (the rank update as 32 more columns of K)
//   backward: g_xa = g (s B);  grad_x = [g | g_xa] [W ; A];  grad_B^T += xa^T g;  grad_A += g_xa^T x
//
// The frozen weight is packed into AMX's tile layout once (two copies: for x W^T and for g W); A and s B change
// each optimiser step and are packed then (train/lora.py keeps them). The sums over rows (the gradients of A and
// B) are kept per thread in float32 and added at the end. Products accumulate in float32, as the library's bf16
// products do, and round once.
//
//   available()                             -> whether this CPU and kernel run AMX BF16 (asked once)
//   pack(src [R, C], trans)                 -> B [K, N] in tiles: B = src^T (trans) or src, K and N padded to
//                                              multiples of 32 with zeros
//   prepare(a, b, scale, spans, rank, out, reuse?, reuse_copies?)
//                                           -> [adapters, copies, copy of a, copy of b]: one optimiser step's
//                                              operands, `adapters` holding s B and A packed both ways (Layout),
//                                              written into an earlier step's buffers when given
//   fwd(x [M, in], wt, adapters, bias?, out, P r)
//                                           -> y [M, out], xa [M, R]      wt = pack(W, 1); R = P r padded to 32
//   bwd(g [M, out], w, adapters, x, xa, need_x, spans, rank, scale)
//                                           -> grad_x [M, in] (undefined unless need_x), grad_A [P r, in],
//                                              grad_B [rows of B, r] (both float32)      w = pack(W, 0); spans,
//                                              rank, scale as linear_ops.cpp's lora_bwd takes them
//
// All operands bf16 and contiguous; M, in and out multiples of 32 (train/lora.py takes the library path
// otherwise).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <vector>

#include "amx_tiles.h"

namespace tinystack_lora_amx {

using at::Tensor;
using namespace tinystack_amx;

constexpr int64_t kMaxChunk = 1024;  // rows a thread takes at a time, at most (fewer: every thread gets a chunk)
constexpr int64_t kSumRows = 128;  // rows per pass of the sums over rows (their pages stay in the TLB)

Tensor pack(const Tensor& src_, bool trans) {
  const Tensor src = src_.detach().contiguous();
  TORCH_CHECK(src.dim() == 2 && src.scalar_type() == at::kBFloat16, "pack: a 2-D bf16 tensor");
  Tensor out = at::empty({packed_size(src.size(0), src.size(1))}, src.options());
  pack_into(reinterpret_cast<const bf16*>(src.data_ptr()), src.size(0), src.size(1), trans,
            reinterpret_cast<bf16*>(out.data_ptr()));
  return out;
}

// Where prepare() puts an adapter's operands in its one bf16 buffer: s B packed for x-side products (K = P r), s B
// packed for g-side ones (K = out), A packed both ways.
struct Layout {
  int64_t sb_t, sb_n, a_t, a_n, total;
  Layout(int64_t out, int64_t in, int64_t pr) {
    sb_t = 0, sb_n = packed_size(out, pr), a_t = sb_n + packed_size(out, pr), a_n = a_t + packed_size(pr, in);
    total = a_n + packed_size(pr, in);
  }
};

// One optimiser step's adapter operands from the float32 masters, in one call: the Layout buffer (bf16) and copies
// of A and B (what a later forward compares against: views of one float32 buffer). Each element of s B and A is
// written straight to its places in the tiles (s B spread over the parts is mostly zeros: never formed here).
std::vector<Tensor> prepare(const Tensor& a_, const Tensor& b_, double scale, at::IntArrayRef spans, int64_t rank,
                            int64_t out, const std::optional<Tensor>& reuse_buf,
                            const std::optional<Tensor>& reuse_copies) {
  const Tensor a = a_.detach().contiguous().to(at::kFloat), b = b_.detach().contiguous().to(at::kFloat);
  const int64_t n_parts = int64_t(spans.size()) / 2, pr = n_parts * rank, in = a.size(1);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && b.size(1) == rank && a.size(0) == pr,
              "lora_amx.prepare: a [P r, in], b [rows of B, r], spans for P parts");
  const Layout lay(out, in, pr);
  // A buffer of an earlier step of this layer is overwritten where its values go; its zeros are where zeros stay
  // (the layout's padding and s B's off-diagonal blocks). Its version moves, so a backward still holding it
  // (saved by its forward) refuses to run on changed operands instead of running on them.
  const bool reuse = reuse_buf.has_value() && reuse_buf->defined() && reuse_buf->numel() == lay.total
                     && reuse_copies.has_value() && reuse_copies->numel() == a.numel() + b.numel();
  Tensor buf = reuse ? *reuse_buf : at::zeros({lay.total}, a.options().dtype(at::kBFloat16));
  Tensor copies = reuse ? *reuse_copies : at::empty({a.numel() + b.numel()}, a.options());
  if (reuse) {
    buf.unsafeGetTensorImpl()->bump_version();
    copies.unsafeGetTensorImpl()->bump_version();
  }
  bf16* d = reinterpret_cast<bf16*>(buf.data_ptr());
  const float *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* cp = copies.data_ptr<float>();
  std::memcpy(cp, ap, a.numel() * sizeof(float));
  std::memcpy(cp + a.numel(), bp, b.numel() * sizeof(float));
  const auto to_bf16 = [](float v) { return c10::BFloat16(v).x; };  // round to nearest even, as .to(bfloat16)
  const int64_t kb_pr = up32(pr) / 32, kb_out = up32(out) / 32, kb_in = up32(in) / 32;
  bf16 *sb_t = d + lay.sb_t, *sb_n = d + lay.sb_n, *a_t = d + lay.a_t, *a_n = d + lay.a_n;
  const float s = float(scale);
  for (int64_t j = 0, b_row = 0; j < n_parts; ++j) {  // s B spread: part j's rows of B in columns j r .. (j + 1) r
    const int64_t row = spans[2 * j], size = spans[2 * j + 1];
    for (int64_t i = 0; i < size; ++i)
      for (int64_t c = 0; c < rank; ++c) {
        const bf16 v = to_bf16(bp[(b_row + i) * rank + c] * s);
        sb_t[at_tile(j * rank + c, row + i, kb_pr)] = v;  // B = (s B)^T [P r, out]
        sb_n[at_tile(row + i, j * rank + c, kb_out)] = v;  // B = s B [out, P r]
      }
    b_row += size;
  }
  for (int64_t k = 0; k < pr; ++k)
    for (int64_t i = 0; i < in; ++i) {
      const bf16 v = to_bf16(ap[k * in + i]);
      a_t[at_tile(i, k, kb_in)] = v;  // B = A^T [in, P r]
      a_n[at_tile(k, i, kb_pr)] = v;  // B = A [P r, in]
    }
  return {buf, copies, copies.narrow(0, 0, a.numel()).view(a.sizes()),
          copies.narrow(0, a.numel(), b.numel()).view(b.sizes())};
}

static int64_t chunk_rows(int64_t M) {  // M / threads rounded up to 32, at most kMaxChunk
  const int64_t threads = std::max(1, at::get_num_threads());
  return std::min(kMaxChunk, up32((M + threads - 1) / threads));
}

static const bf16* ptr(const Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }
static bf16* mptr(Tensor& t) { return reinterpret_cast<bf16*>(t.data_ptr()); }

static void check(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kBFloat16 && t.size(0) == rows
                  && t.size(1) == cols && rows % 32 == 0 && cols % 32 == 0,
              "lora_amx: ", what, " must be contiguous bf16 [", rows, ", ", cols, "], multiples of 32");
}

std::tuple<Tensor, Tensor> fwd(const Tensor& x_, const Tensor& wt, const Tensor& adapters,
                               const std::optional<Tensor>& bias_, int64_t out, int64_t pr) {
  TORCH_CHECK(available(), "lora_amx: this CPU has no AMX BF16");
  const Tensor x = x_.detach();
  const int64_t M = x.size(0), in = x.size(1), R = up32(pr);
  check(x, M, in, "x");
  const Layout lay(out, in, pr);
  TORCH_CHECK(wt.numel() == in * out && adapters.numel() == lay.total,
              "lora_amx.fwd: packed operands do not match x [M, in], out and P r");
  Tensor bias;
  if (bias_.has_value() && bias_->defined()) bias = bias_->detach().to(at::kFloat).contiguous();
  Tensor y = at::empty({M, out}, x.options()), xa = at::empty({M, R}, x.options());
  const bf16 *xp = ptr(x), *wp = ptr(wt), *ap = ptr(adapters) + lay.a_t, *sp = ptr(adapters) + lay.sb_t;
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  bf16 *yp = mptr(y), *xap = mptr(xa);
  const int64_t kin = in / 32, kr = R / 32;
  const int64_t chunk = chunk_rows(M);
  at::parallel_for(0, (M + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    configure_tiles();
    auto pend = std::make_unique<Pending>();
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t m0 = c * chunk, rows = std::min(M, m0 + chunk) - m0;
      const auto thin = [&](int64_t m) {  // xa = x A^T for the rows of block m, whole before y's products read it
        gemm(32, R, Operand{xp + (m0 + m) * in, in, kin, ap, pr <= 16}, Operand{}, nullptr, xap + (m0 + m) * R, R,
             *pend);
        pend->flush_to(32);
      };
      gemm(rows, out, Operand{xp + m0 * in, in, kin, wp}, Operand{xap + m0 * R, R, kr, sp}, bp, yp + m0 * out, out,
           *pend, thin);  // y = [x | xa] [W | s B]^T
    }
    pend->flush_to(32);
    _tile_release();
  });
  return {y, xa};
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& g_, const Tensor& w, const Tensor& adapters, const Tensor& x_,
                                       const Tensor& xa_, bool need_x, at::IntArrayRef spans, int64_t rank,
                                       double scale) {
  TORCH_CHECK(available(), "lora_amx: this CPU has no AMX BF16");
  const Tensor g = g_.detach(), x = x_.detach(), xa = xa_.detach();
  const int64_t M = g.size(0), out = g.size(1), in = x.size(1), R = xa.size(1), n_parts = int64_t(spans.size()) / 2;
  check(g, M, out, "g"); check(x, M, in, "x"); check(xa, M, R, "xa");
  const Layout lay(out, in, n_parts * rank);
  TORCH_CHECK(w.numel() == in * out && adapters.numel() == lay.total && up32(n_parts * rank) == R,
              "lora_amx.bwd: packed operands or spans do not match g [M, out], x [M, in] and xa [M, R]");
  const int threads = at::get_num_threads();
  Tensor grad_x = need_x ? at::empty({M, in}, g.options()) : Tensor();
  // per thread: grad_A [R, in] and grad_B^T [R, out] in float32, added into the outputs at the end
  // (uninitialised: a thread's first sums write them; a thread with no rows leaves them unused)
  std::vector<std::unique_ptr<float[]>> sums_a(threads), sums_b(threads);
  const bf16 *gp = ptr(g), *wp = ptr(w), *sp = ptr(adapters) + lay.sb_n, *ap = ptr(adapters) + lay.a_n;
  const bf16 *xp = ptr(x), *xap = ptr(xa);
  bf16* gxp = need_x ? mptr(grad_x) : nullptr;
  const int64_t kout = out / 32, kr = R / 32;
  const int64_t chunk = chunk_rows(M);
  at::parallel_for(0, (M + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    configure_tiles();
    auto pend = std::make_unique<Pending>();
    // scratch, every element written before it is read (a zeroed vector would clear ~1 MiB a call for nothing)
    std::unique_ptr<bf16[]> g_xa(new bf16[chunk * R]), g_xa_t(new bf16[R * kSumRows]), xa_t(new bf16[R * kSumRows]);
    std::unique_ptr<bf16[]> tiles(new bf16[kSumRows * std::max(in, out)]);
    auto &sa = sums_a[at::get_thread_num()], &sb = sums_b[at::get_thread_num()];
    sa.reset(new float[R * in]), sb.reset(new float[R * out]);
    float *my_a = sa.get(), *my_b = sb.get();
    bool fresh = true;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t m0 = c * chunk, rows = std::min(M, m0 + chunk) - m0;
      const auto thin = [&](int64_t m) {  // g_xa = g (s B) for the rows of block m, whole before grad_x reads it
        gemm(32, R, Operand{gp + (m0 + m) * out, out, kout, sp, n_parts * rank <= 16}, Operand{}, nullptr,
             g_xa.get() + m * R, R, *pend);
        pend->flush_to(32);
      };
      const auto sums = [&](int64_t m) {  // the sums over a batch of kSumRows rows, once its last block is done
        const int64_t end = m + 32;
        if (end % kSumRows && end != rows) return;
        const int64_t begin = (end - 1) / kSumRows * kSumRows, n = end - begin;
        transpose(xap + (m0 + begin) * R, n, R, xa_t.get());
        transpose(g_xa.get() + begin * R, n, R, g_xa_t.get());
        // grad_B^T += xa^T g;  grad_A += g_xa^T x
        const bool half = n_parts * rank <= 16;  // P r <= 16: the sums' rows 16-31 would be zeros
        sum_rows(my_b, R, out, xa_t.get(), n, gp + (m0 + begin) * out, out, n, tiles.get(), fresh, half);
        sum_rows(my_a, R, in, g_xa_t.get(), n, xp + (m0 + begin) * in, in, n, tiles.get(), fresh, half);
        fresh = false;
      };
      if (need_x) {  // grad_x = [g | g_xa] [W ; A], the thin products and the sums beside it, row block by block
        gemm(rows, in, Operand{gp + m0 * out, out, kout, wp}, Operand{g_xa.get(), R, kr, ap}, nullptr,
             gxp + m0 * in, in, *pend, thin, sums);
      } else {
        for (int64_t m = 0; m < rows; m += 32) thin(m), sums(m);
      }
      pend->flush_to(32);
    }
    _tile_release();
  });
  const int64_t pr = n_parts * rank;
  Tensor grad_a = at::zeros({pr, in}, g.options().dtype(at::kFloat));
  float* ga = grad_a.data_ptr<float>();
  for (const auto& sa : sums_a)
    if (sa)
      for (int64_t i = 0; i < pr * in; ++i) ga[i] += sa[i];
  // B's gradient: part j's rows of B only ever meet part j's output rows and rank columns (the diagonal blocks
  // of g^T xa), times s
  int64_t b_rows = 0;
  for (int64_t j = 0; j < n_parts; ++j) b_rows += spans[2 * j + 1];
  Tensor grad_b = at::zeros({b_rows, rank}, grad_a.options());
  float* gb = grad_b.data_ptr<float>();
  for (const auto& sb : sums_b)
    if (sb)
      for (int64_t j = 0, b_row = 0; j < n_parts; ++j) {
        const int64_t row = spans[2 * j], size = spans[2 * j + 1];
        for (int64_t i = 0; i < size; ++i)
          for (int64_t c = 0; c < rank; ++c) gb[(b_row + i) * rank + c] += sb[(j * rank + c) * out + row + i];
        b_row += size;
      }
  for (int64_t i = 0; i < b_rows * rank; ++i) gb[i] *= float(scale);
  return {grad_x, grad_a, grad_b};
}

}  // namespace tinystack_lora_amx

TORCH_LIBRARY(tinystack_lora_amx, m) {
  m.def("available() -> bool", &tinystack_amx::available);
  m.def("pack(Tensor src, bool trans) -> Tensor", &tinystack_lora_amx::pack);
  m.def("prepare", &tinystack_lora_amx::prepare);
  m.def("fwd", &tinystack_lora_amx::fwd);
  m.def("bwd", &tinystack_lora_amx::bwd);
}
