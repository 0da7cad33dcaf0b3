// The training's linear products: a product with its rows split over the threads, and LoRA's product
// (train/lora.py, _LoRAProduct) forward and backward as one operator call each.
//
//   rows_mm(a [M, K], b [K, N], parts) -> a b: a's rows in `parts` blocks, each block's product one call on a
//        thread of its own (inside a parallel region the library runs one thread per call), or one library call
//        when parts <= 1. Which is faster depends on the shape, the library and the machine: kernels/matmul_plan.py
//        measures it and passes `parts`.
//
// A step of SmolLM2 runs 120 adapted products; written as PyTorch calls from Python each was ~20 small ops (slices,
// casts, thin products) plus the autograd Function's Python: overhead per product and direction.
// Here the same products run from C++.
//
//   lora_fwd(x [N, in], w [out, in], sb [out, P r], bias (or None), a [P r, in], parts)
//        -> y = x w^T (+ bias) + (x a^T) sb^T [N, out],  x and x a^T in w's dtype (the backward's operands)
//   lora_bwd(g [N, out], w, sb, x, xa, a, need_x, spans, rank, scale, parts)
//        -> grad_x [N, in] (undefined unless need_x), grad_a [P r, in], grad_b [rows of B, r]
//
// w is the frozen weight and sb = s B spread (part j's rows of B in columns j r .. (j + 1) r), both contiguous in
// the compute dtype; spans: (first output row, rows) of each adapted part, in B's row order; parts: rows_mm's
// for the large product (x w^T forward, g w backward). Everything is computed in w's dtype; the caller casts the
// gradients to its own.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

namespace tinystack_linear {

using at::Tensor;

constexpr int64_t kRowAlign = 32;  // block rows a multiple of the AMX / AVX-512 kernels' row tiles

Tensor rows_mm(const Tensor& a_, const Tensor& b_, int64_t parts) {
  const Tensor a = a_.detach(), b = b_.detach();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "rows_mm: a [M, K], b [K, N]");
  const int64_t M = a.size(0);
  const int64_t step = ((M + std::max<int64_t>(parts, 1) - 1) / std::max<int64_t>(parts, 1) + kRowAlign - 1)
                       / kRowAlign * kRowAlign;
  if (parts <= 1 || step >= M) return at::mm(a, b);
  Tensor out = at::empty({M, b.size(1)}, a.options());
  const int64_t blocks = (M + step - 1) / step;
  at::parallel_for(0, blocks, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * step, rows = std::min(M, r0 + step) - r0;
      Tensor block = out.narrow(0, r0, rows);  // whole rows of a contiguous result: contiguous
      at::mm_out(block, a.narrow(0, r0, rows), b);
    }
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor> lora_fwd(const Tensor& x_, const Tensor& w_, const Tensor& sb_,
                                            const std::optional<Tensor>& bias, const Tensor& a_, int64_t parts) {
  // detached: the products write into given outputs, which autograd refuses (the Function owns the gradients)
  const Tensor w = w_.detach(), sb = sb_.detach(), a = a_.detach();
  TORCH_CHECK(x_.dim() == 2 && w.dim() == 2 && a.dim() == 2 && a.size(1) == x_.size(1) && w.size(1) == x_.size(1)
                  && sb.size(0) == w.size(0) && sb.size(1) == a.size(0),
              "lora_fwd: x [N, in], w [out, in], sb [out, P r], a [P r, in]");
  const auto dt = w.scalar_type();
  const Tensor x = x_.detach().to(dt), ac = a.to(dt);
  const Tensor xa = at::mm(x, ac.t());  // [N, P r]
  Tensor y = rows_mm(x, w.t(), parts);
  if (bias.has_value() && bias->defined()) y.add_(bias->detach().to(dt));
  y.addmm_(xa, sb.t());  // + s (x A^T) B^T
  return {y, x, xa};
}

std::tuple<Tensor, Tensor, Tensor> lora_bwd(const Tensor& g_, const Tensor& w_, const Tensor& sb_, const Tensor& x_,
                                            const Tensor& xa_, const Tensor& a_, bool need_x,
                                            at::IntArrayRef spans, int64_t rank, double scale, int64_t parts) {
  const Tensor w = w_.detach(), sb = sb_.detach(), xs = x_.detach(), xa = xa_.detach();
  const Tensor g = g_.detach().to(w.scalar_type()), ac = a_.detach().to(w.scalar_type());
  const int64_t width = ac.size(0), n_parts = int64_t(spans.size()) / 2;
  TORCH_CHECK(n_parts * rank == width, "lora_bwd: spans do not match the adapter's rows");
  const Tensor g_xa = at::mm(g, sb);  // d loss / d (x A^T) [N, P r]
  // B's gradient: part j's rows of B only ever meet part j's output rows and rank columns, the diagonal blocks of
  // g^T (x a^T) [out, P r]. One product of the whole and its blocks copied out: a product per part (r columns
  // each) ran slower than the whole one, which reads g once.
  const Tensor whole = at::mm(g.t(), xa);
  int64_t b_rows = 0;
  for (int64_t j = 0; j < n_parts; ++j) b_rows += spans[2 * j + 1];
  Tensor grad_b = at::empty({b_rows, rank}, g.options());
  for (int64_t j = 0, b_row = 0; j < n_parts; ++j) {
    const int64_t row = spans[2 * j], size = spans[2 * j + 1];
    grad_b.narrow(0, b_row, size).copy_(whole.narrow(0, row, size).narrow(1, j * rank, rank));
    b_row += size;
  }
  grad_b.mul_(scale);
  Tensor grad_x;
  if (need_x) grad_x = rows_mm(g, w, parts).addmm_(g_xa, ac);  // g W + the adapter's path, in place
  Tensor grad_a = at::mm(g_xa.t(), xs);
  return {grad_x, grad_a, grad_b};
}

}  // namespace tinystack_linear

TORCH_LIBRARY(tinystack_linear, m) {
  m.def("rows_mm", &tinystack_linear::rows_mm);
  m.def("lora_fwd", &tinystack_linear::lora_fwd);
  m.def("lora_bwd", &tinystack_linear::lora_bwd);
}
