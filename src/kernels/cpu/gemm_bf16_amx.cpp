// The bf16 GEMM on AMX tiles. Eight tiles: C0..C3 (a 32 x 32 fp32 block of C), A0, A1 (its
// 32 rows x 32 k of packed A) and B0, B1 (16 k pairs x 32 columns of packed B). Each 32-wide
// step of k is four tile loads (1 KiB contiguous each) and four TDPBF16PS (fp32 accumulation
// inside the tiles), interleaved so that each product starts as soon as its two operands are
// in: B0, A0, C0 += A0 B0, A1, C2 += A1 B0, B1, C1 += A0 B1, C3 += A1 B1. On packed
// operands 16 bytes off a cache line that order ran the expert products and 1024^3 3-10%
// faster than four loads, then four products; on 64-byte aligned ones (Bf16Buffer) the two
// orders ran within the noise of each other (one thread, same run). Software prefetch of the
// next block's B tiles gained nothing measurable; prefetching the next block's C rows sped
// the accumulating dW products by 11-15% in some runs and by nothing in others.
// Cache blocking: k in blocks of kBlockK, columns in passes of kPassCols. Within a k block
// the 32-row block of A (64 KiB at most) is reused across the pass's column blocks, and the
// pass's B panels (1 MiB at most) from L2 across the row blocks; C is stored and reloaded
// once per k block (4 KiB per 32 x 32 x 1024 products).
// C tiles that stick out of C (m or n not a multiple of 16) are configured with fewer rows
// (A and C tiles) or fewer columns (B and C tiles): the products of a partial tile cost in
// proportion to its rows, and C is loaded and stored in place, nothing read or written
// outside it. Each element is the same sum in the same order as in a full tile, so the bits
// do not depend on where a tile lies.
//
// Only the functions marked PARM_AMX are compiled for AMX; they run after amx_usable().
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cpuid.h>

#include "kernels/cpu/bf16_detail.h"

#define PARM_AMX __attribute__((target("amx-tile,amx-bf16")))

namespace parm::cpu::detail {
namespace {

// The 64-byte tile configuration (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tile shapes of one block: rows of its tile rows 0 and 1 (A and C tiles), columns of its
// tile columns 0 and 1 (B and C tiles), each 1..16; an absent second row or column repeats
// the first (its tiles are configured but never touched).
struct BlockShape {
  int rows0 = kTileRows, rows1 = kTileRows, cols0 = kTileRows, cols1 = kTileRows;
  bool operator==(const BlockShape&) const = default;
};

TileConfig make_config(const BlockShape& s) {
  TileConfig cfg;
  const int rows[2] = {s.rows0, s.rows1}, cols[2] = {s.cols0, s.cols1};
  for (int ti = 0; ti < 2; ++ti)
    for (int tj = 0; tj < 2; ++tj) {  // C tile 2 ti + tj: fp32, 4 bytes a column
      cfg.rows[2 * ti + tj] = static_cast<uint8_t>(rows[ti]);
      cfg.colsb[2 * ti + tj] = static_cast<uint16_t>(cols[tj] * 4);
    }
  for (int t = 0; t < 2; ++t) {
    cfg.rows[4 + t] = static_cast<uint8_t>(rows[t]);  // A: 32 bf16 of k a row
    cfg.colsb[4 + t] = kTileK * 2;
    cfg.rows[6 + t] = kTileK / 2;  // B: 16 k pairs, a bf16 pair (4 bytes) per column
    cfg.colsb[6 + t] = static_cast<uint16_t>(cols[t] * 4);
  }
  return cfg;
}

// One C tile: where it is written and its row stride in bytes.
struct CTile {
  float* ptr;
  int64_t stride;
};

// The MT x NT tiles (each 1 or 2) of a C block over k in [k0, k1); c[ti * 2 + tj] is tile
// (ti, tj) of the block; a points at the block's first 16-row block of packed A.
template <int MT, int NT>
PARM_AMX void block(const uint16_t* a, const uint16_t* b0, const uint16_t* b1, int64_t kp,
                    int64_t k0, int64_t k1, const CTile* c, bool load) {
  if (load) {
    _tile_loadd(0, c[0].ptr, c[0].stride);
    if constexpr (NT > 1) _tile_loadd(1, c[1].ptr, c[1].stride);
    if constexpr (MT > 1) _tile_loadd(2, c[2].ptr, c[2].stride);
    if constexpr (MT > 1 && NT > 1) _tile_loadd(3, c[3].ptr, c[3].stride);
  } else {
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (MT > 1) _tile_zero(2);
    if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  }
  // Packed A: the 16-row block below starts kp * 16 values further; tile kk at kk * 16.
  const uint16_t* a1 = a + kp * kTileRows;
  for (int64_t kk = k0; kk < k1; kk += kTileK) {
    _tile_loadd(6, b0 + kk * kTileRows, 64);
    _tile_loadd(4, a + kk * kTileRows, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (MT > 1) {
      _tile_loadd(5, a1 + kk * kTileRows, 64);
      _tile_dpbf16ps(2, 5, 6);
    }
    if constexpr (NT > 1) {
      _tile_loadd(7, b1 + kk * kTileRows, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MT > 1 && NT > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0].ptr, c[0].stride);
  if constexpr (NT > 1) _tile_stored(1, c[1].ptr, c[1].stride);
  if constexpr (MT > 1) _tile_stored(2, c[2].ptr, c[2].stride);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, c[3].ptr, c[3].stride);
}

PARM_AMX void load_config(const TileConfig& cfg) { _tile_loadconfig(&cfg); }
PARM_AMX void release_tiles() { _tile_release(); }

}  // namespace

bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); an older kernel refuses and AMX stays off.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

void gemm_bf16_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                   float* c, int64_t ldc, bool accumulate) {
  const int64_t mp = round_up(m, kTileRows), np = round_up(n, kTileRows);
  const int64_t kp = round_up(k, kTileK), panel = kp * kTileRows;  // values per B panel
  // Measured on the expert products (R = 512, M = 512, H = 2048) and 1024^3, one thread:
  // 1024 x 512 ran as fast as or up to 20% faster than 256 x 256, 256 x 1024 and 512 x 512;
  // the A layout mattered more (see packed_a_offset). k blocks of 512 (A's 32-row block
  // 32 KiB, inside L1) and passes of 256 columns ran no faster.
  constexpr int64_t kBlockK = 1024, kPassCols = 512;
  // Per call: other code (oneDNN) may have loaded its own configuration in between.
  BlockShape loaded;
  load_config(make_config(loaded));
  const auto tile_extent = [](int64_t left) { return static_cast<int>(std::min(kTileRows, left)); };
  for (int64_t k0 = 0; k0 < kp; k0 += kBlockK) {
    const int64_t k1 = std::min(kp, k0 + kBlockK);
    const bool load = accumulate || k0 > 0;
    for (int64_t j0 = 0; j0 < np; j0 += kPassCols) {
      const int64_t j1 = std::min(np, j0 + kPassCols);
      for (int64_t i = 0; i < mp; i += 2 * kTileRows) {
        const int mt = mp - i >= 2 * kTileRows ? 2 : 1;
        for (int64_t j = j0; j < j1; j += 2 * kTileRows) {
          const int nt = j1 - j >= 2 * kTileRows ? 2 : 1;
          BlockShape shape;
          shape.rows0 = tile_extent(m - i);
          shape.rows1 = mt > 1 ? tile_extent(m - i - kTileRows) : shape.rows0;
          shape.cols0 = tile_extent(n - j);
          shape.cols1 = nt > 1 ? tile_extent(n - j - kTileRows) : shape.cols0;
          if (!(shape == loaded)) {  // edge blocks only: full blocks share one configuration
            loaded = shape;
            load_config(make_config(shape));
          }
          // Absent tiles (mt or nt 1) are never touched: they point at tile 0, inside C.
          float* c00 = c + i * ldc + j;
          float* c10 = mt > 1 ? c00 + kTileRows * ldc : c00;
          const int64_t dj = nt > 1 ? kTileRows : 0;
          const CTile tiles[4] = {{c00, ldc * 4}, {c00 + dj, ldc * 4}, {c10, ldc * 4},
                                  {c10 + dj, ldc * 4}};
          const uint16_t* ab = a + i * kp;
          const uint16_t* b0 = b + (j / kTileRows) * panel;
          const uint16_t* b1 = b0 + panel;
          if (mt == 2 && nt == 2) block<2, 2>(ab, b0, b1, kp, k0, k1, tiles, load);
          else if (mt == 2) block<2, 1>(ab, b0, b1, kp, k0, k1, tiles, load);
          else if (nt == 2) block<1, 2>(ab, b0, b1, kp, k0, k1, tiles, load);
          else block<1, 1>(ab, b0, b1, kp, k0, k1, tiles, load);
        }
      }
    }
  }
  release_tiles();
}

}  // namespace parm::cpu::detail
