// AMX BF16 building blocks for the fused LoRA product (lora_amx.cpp): the tile layout, a 32 x 32-block product
// driver whose output is written while the next block computes, and sums over rows.
//
//   available()                    whether this CPU and kernel run AMX BF16 (asks the kernel for the tile state once)
//   configure_tiles()              eight 16 x 64-byte tiles on the calling thread (release with _tile_release())
//   pack_into(src, rows, C, t, d)  src [rows, C] as B [K, N] (B = src^T if t, else src) in tiles at d, padded to 32s
//   at_tile(k, n, kbs)             where element (k, n) of such a B lies
//   gemm(rows, N, o0, o1, ...)     dst = o0 (+ o1, more of K) (+ bias), hooks per row block (first / last)
//   to_tiles + sum_rows            acc += lhs^T src: a sum over rows, src's rows made into K
//
// Tiles 0-3 accumulate a 32 x 32 float32 block, 4-5 hold A's 32 rows x 32 of K, 6-7 B's two 16-column halves.
#pragma once

#include <ATen/Parallel.h>

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tinystack_amx {

using bf16 = uint16_t;

constexpr int64_t kTile = 512;   // bf16 in one packed B tile: 16 rows (K pairs) x 32

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline bool available() {
  static const bool ok = [] {
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool amx = (d >> 22) & 1 && (d >> 24) & 1;  // AMX-BF16, AMX-TILE
    return amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }();
  return ok;
}

static void configure_tiles() {  // eight 16 x 64-byte tiles, on the calling thread
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  __asm__ volatile("" : : "r"(&cfg) : "memory");  // gcc otherwise drops the stores the config is made of
  _tile_loadconfig(&cfg);
}

static inline int64_t up32(int64_t n) { return (n + 31) / 32 * 32; }

// src [rows, C] (bf16, row-major) as B [K, N] in tiles at d: B = src^T (trans) or src, K and N padded to multiples
// of 32 with zeros. Tile (n block of 16, k block of 32): row p holds, for each of its 16 columns n, B[2p][n] and
// B[2p + 1][n].
static void pack_into(const bf16* s, int64_t rows, int64_t C, bool trans, bf16* d) {
  const int64_t K = trans ? C : rows, N = trans ? rows : C, kbs = up32(K) / 32;
  auto tiles = [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb)
      for (int64_t kb = 0; kb < kbs; ++kb) {
        bf16* t = d + (nb * kbs + kb) * kTile;
        // the pairs (rows p of the tile) and columns inside src; the rest of the tile is padding: zeros
        const int64_t k0 = kb * 32, n0 = nb * 16;
        const int pairs = int(std::clamp<int64_t>((K - k0) / 2, 0, 16)), cols = int(std::clamp<int64_t>(N - n0, 0, 16));
        const bool odd = pairs < 16 && k0 + 2 * pairs < K;  // a last k with no partner
        if (pairs < 16 || cols < 16) std::memset(t, 0, kTile * sizeof(bf16));
        if (trans) {  // B's (k, k + 1) pair is two neighbours in a row of src: one 32-bit copy
          for (int n = 0; n < cols; ++n) {
            const bf16* row = s + (n0 + n) * C + k0;
            for (int p = 0; p < pairs; ++p) std::memcpy(t + p * 32 + n * 2, row + 2 * p, 4);
            if (odd) t[pairs * 32 + n * 2] = row[2 * pairs];
          }
        } else {
          for (int p = 0; p < pairs; ++p) {
            const bf16 *r0 = s + (k0 + 2 * p) * C + n0, *r1 = r0 + C;
            for (int n = 0; n < cols; ++n) t[p * 32 + n * 2] = r0[n], t[p * 32 + n * 2 + 1] = r1[n];
          }
          if (odd)
            for (int n = 0; n < cols; ++n) t[pairs * 32 + n * 2] = s[(k0 + 2 * pairs) * C + n0 + n];
        }
      }
  };
  const int64_t blocks = up32(N) / 16;
  if (blocks * kbs * kTile < (int64_t(1) << 18)) tiles(0, blocks);  // an adapter's matrix: not worth the threads
  else at::parallel_for(0, blocks, 1, tiles);
}

static int64_t packed_size(int64_t K, int64_t N) { return up32(K) * up32(N); }

// Where element (k, n) of a B [K, N] lies in pack()'s tile layout (kbs: K's blocks of 32).
static inline int64_t at_tile(int64_t k, int64_t n, int64_t kbs) {
  return ((n / 16) * kbs + k / 32) * kTile + (k % 32) / 2 * 32 + (n % 16) * 2 + (k & 1);
}

// One operand pair of a product: A's rows (bf16, row stride lda, the thread's first row) over kb blocks of 32
// along K, and B packed (pack(): 16-column blocks of kb tiles each).
struct Operand {
  const bf16* a = nullptr;
  int64_t lda = 0, kb = 0;
  const bf16* b = nullptr;
  bool half = false;  // only the first 16 of each 32 columns are wanted (the rest of B is zeros): half the products
};

// A finished 32 x 32 block waiting to be written: its float32 tiles, its 32 rows' destination and a bias. Its rows
// are rounded and written a few at a time between the next block's tile products (the AMX unit and the vector
// units work side by side), not all at once after it: written at once they cost a block of K = 576 a third more.
struct Pending {
  alignas(64) float buf[2][1024];
  int p = 0, row = 32;  // buf[p] is pending from `row` on (32: nothing pending); buf[1 - p] is free
  bf16* dst = nullptr;
  int64_t ld = 0;
  const float* bias = nullptr;

  float* free_buf() { return buf[1 - p]; }
  void flush_to(int until) {
    for (; row < until; ++row) {
      const float* b = buf[p] + row * 32;  // [32, 32] row-major (store_tiles with ld 32)
      __m512 lo = _mm512_load_ps(b), hi = _mm512_load_ps(b + 16);
      if (bias) lo = _mm512_add_ps(lo, _mm512_loadu_ps(bias)), hi = _mm512_add_ps(hi, _mm512_loadu_ps(bias + 16));
      const __m256i l = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo));
      const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi));
      _mm512_storeu_si512(dst + row * ld, _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1));
    }
  }
  void queue(bf16* d, int64_t l, const float* b) {  // the free buffer (just stored) becomes the pending block
    flush_to(32);
    p = 1 - p, row = 0, dst = d, ld = l, bias = b;
  }
};

// C tiles 0-3 (rows 0-15 / 16-31 x columns 0-15 / 16-31 of the block) += A [32, 32 k] B over k blocks k0 .. k1 of
// o, for the 32 rows at `a` and the 32 columns whose packed tiles start at `b`; the pending block is written
// alongside, its rows spread over the steps (done .. of total).
static inline void steps(const Operand& o, const bf16* a, const bf16* b, int64_t k0, int64_t k1, Pending& pend,
                         int64_t done, int64_t total) {
  for (int64_t k = k0; k < k1; ++k) {
    _tile_loadd(4, a + k * 32, o.lda * 2);
    _tile_loadd(5, a + 16 * o.lda + k * 32, o.lda * 2);
    _tile_loadd(6, b + k * kTile, 64);
    if (o.half) {  // tiles 1 and 3 stay zero
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6);
    } else {
      _tile_loadd(7, b + (o.kb + k) * kTile, 64);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    pend.flush_to(int((done + k - k0 + 1) * 32 / total));
  }
}

// Bytes of packed weight a group of column panels may take: the group stays in L2 while every row block of the
// chunk passes it (half of L2, as the OS reports it; 1 MiB where it does not). Panel by panel, each panel met
// every row block with its weight gone from L1 and its output rows' pages from the TLB: in a training step
// (not in a benchmark loop) that made the products several times slower.
static int64_t group_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? int64_t(l2) / 2 : int64_t(1) << 20;
  }();
  return bytes;
}

// dst [rows, N] (bf16, row stride ldd) = o0 (+ o1) (+ bias) for a chunk's rows: groups of 32-column panels, each
// group passed by every 32-row block, each block one run of tile products over K. first(m) runs before the first
// group meets row block m (what o1 reads of those rows must be written there); after the last group has met row
// block m, last(m) (both while block m's rows of o0 are in cache).
struct NoHook {
  void operator()(int64_t) const {}
};
template <class First = NoHook, class Last = NoHook>
static void gemm(int64_t rows, int64_t N, const Operand& o0, const Operand& o1, const float* bias, bf16* dst,
                 int64_t ldd, Pending& pend, First first = {}, Last last = {}) {
  const int64_t total = o0.kb + o1.kb;
  const int64_t group = std::max<int64_t>(32, group_bytes() / (o0.kb * 2048) * 32);  // a panel: kb x 2 KiB
  for (int64_t n0 = 0; n0 < N; n0 += group)
    for (int64_t m = 0; m < rows; m += 32) {
      if (n0 == 0) first(m);
      for (int64_t n = n0; n < std::min(N, n0 + group); n += 32) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        steps(o0, o0.a + m * o0.lda, o0.b + n / 16 * o0.kb * kTile, 0, o0.kb, pend, 0, total);
        if (o1.kb) steps(o1, o1.a + m * o1.lda, o1.b + n / 16 * o1.kb * kTile, 0, o1.kb, pend, o0.kb, total);
        pend.flush_to(32);
        _tile_stored(0, pend.free_buf(), 128); _tile_stored(1, pend.free_buf() + 16, 128);
        _tile_stored(2, pend.free_buf() + 512, 128); _tile_stored(3, pend.free_buf() + 528, 128);
        pend.queue(dst + m * ldd + n, ldd, bias ? bias + n : nullptr);
      }
      if (n0 + group >= N) last(m);
    }
}

// rows [rows (a multiple of 32), cols] of src (row stride ld) as B tiles (K = the rows, N = the columns) into t:
// tile (32-row block i, 16-column block j) at t + (i * cols / 16 + j) * kTile. Read two whole rows at a time, in
// order (the hardware prefetcher follows two streams; 32 rows' worth of 64-byte pieces it does not).
static void to_tiles(const bf16* src, int64_t ld, int64_t rows, int64_t cols, bf16* t) {
  static const __m512i idx = [] {
    alignas(64) uint16_t v[32];
    for (int i = 0; i < 32; ++i) v[i] = (i % 2 ? 16 : 0) + i / 2;
    return _mm512_load_si512(v);
  }();
  const int64_t per_block = cols / 16 * kTile;
  for (int64_t r = 0; r < rows; r += 2) {
    const bf16 *r0 = src + r * ld, *r1 = r0 + ld;
    bf16* dst = t + r / 32 * per_block + (r % 32) / 2 * 32;
    for (int64_t j = 0; j < cols / 16; ++j) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + 16 * j));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + 16 * j));
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_storeu_si512(dst + j * kTile, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// acc [R, cols] (float32, this thread's; fresh: not yet written, so set rather than added to) += lhs_t [R, rows]
// (bf16, row stride ldl) src [rows, cols] (row stride lds): a sum over rows, so src goes in as B (its rows as K),
// made into tiles first (tiles: rows x cols scratch); then each 32-column panel's sums are held in tiles across
// all the rows.
static void sum_rows(float* acc, int64_t R, int64_t cols, const bf16* lhs_t, int64_t ldl, const bf16* src,
                     int64_t lds, int64_t rows, bf16* tiles, bool fresh, bool half) {
  to_tiles(src, lds, rows, cols, tiles);
  const int64_t per_block = cols / 16 * kTile;
  for (int64_t c = 0; c < cols; c += 32)
    for (int64_t r = 0; r < R; r += 32) {
      float* o = acc + r * cols + c;
      if (fresh) {  // acc not written yet (its memory uninitialised): start from zeros
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      } else {
        _tile_loadd(0, o, cols * 4); _tile_loadd(1, o + 16, cols * 4);
        if (!half) {
          _tile_loadd(2, o + 16 * cols, cols * 4); _tile_loadd(3, o + 16 * cols + 16, cols * 4);
        }
      }
      for (int64_t m = 0; m < rows; m += 32) {
        const bf16* b = tiles + m / 32 * per_block + c / 16 * kTile;
        _tile_loadd(4, lhs_t + r * ldl + m, ldl * 2);
        _tile_loadd(6, b, 64); _tile_loadd(7, b + kTile, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (!half) {  // lhs rows 16-31 (all zeros when half: only rows 0-15 of acc are ever read then)
          _tile_loadd(5, lhs_t + (r + 16) * ldl + m, ldl * 2);
          _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, o, cols * 4); _tile_stored(1, o + 16, cols * 4);
      if (!half) {
        _tile_stored(2, o + 16 * cols, cols * 4); _tile_stored(3, o + 16 * cols + 16, cols * 4);
      }
    }
}

static void transpose(const bf16* src, int64_t rows, int64_t cols, bf16* dst) {  // [rows, cols] -> [cols, rows]
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

}  // namespace tinystack_amx
