// softdot kernels: the arguments of one attention kernel call (one block of
// query rows against a range of keys), shared by the kernel and its caller.
#ifndef SOFTDOT_SRC_KERNELS_ATTENTION_ARGS_H_
#define SOFTDOT_SRC_KERNELS_ATTENTION_ARGS_H_

#include <cstddef>
#include <cstdint>

namespace softdot::detail {

// Keys per step of the online softmax (a key tile; the docs' "64-key
// block"). Fixed for every target: it decides where the output sums are
// rounded, so it is part of the result's bits. ("Block" in the kernels means
// Block<T>, the 64-byte lane group of block-inl.h.)
inline constexpr std::size_t kKeyTile = 64;
// The prefill form's score is blocked chains: a float FMA chain over each
// block of this many features (in index order), the blocks' chains added in
// order into a float total. Each product then passes through at most
// min(d, 16) + ceil(d / 16) - 1 roundings (23 at d = 128, against 128 for
// one chain): attention.h's gamma_{n_d}. Fixed for every target: part of
// the result's bits.
inline constexpr std::size_t kScoreBlock = 16;
// The same for the prefill form's P V sums over a key tile: a float FMA
// chain over each block of this many keys, the blocks' chains added in order
// (at most 16 + 3 roundings per term of a 64-key tile, against 64 for one
// chain). The decode form keeps one chain over the tile.
inline constexpr std::size_t kValueBlock = 16;
// The units' score chains (attention_units-inl.h): a chain over each block
// of 32 features (16 pair steps, two roundings each: at most
// min(d, 32) + ceil(d / 32) - 1 roundings per product, 35 at d = 128); their
// P V is one chain over the key tile (64 roundings per term, 128 split). At
// 16 the blocks' flushes cost a third as many instructions as the pair
// products, and the units' rounding of P (2^-8 or 2^-16 relative) dwarfs
// the longer chains' (2^-24 per rounding).
inline constexpr std::size_t kUnitsScoreBlock = 32;
// The decode form on the units (attention_decode_units-inl.h) takes d and
// d_v multiples of 32 (a 32-feature block is one pair step per lane), and
// its weight pairs and a row of zero values fit in the room the float
// decode form widens a block's keys into (kKeyTile d floats).
inline constexpr bool decode_units_fit(std::size_t d, std::size_t dv,
                                       std::size_t rows) {
  return d != 0 && dv != 0 && d % 32 == 0 && dv % 32 == 0 && rows <= 16 &&
         rows * 64 + dv / 2 <= 64 * d;
}
// KV heads of one decode chunk that the decode form on the units runs block
// by block in one task (attention_decode_units_heads, dispatch_call.h).
inline constexpr std::size_t kDecodeHeadGroup = 8;
// Rows per kernel call are at most this many on any target.
inline constexpr std::size_t kMaxKernelRows = 64;

// The decode form (features in lanes) takes at most this many rows.
inline constexpr std::size_t kDecodeMaxRows = 16;

// Storage of K and V (where it enters the kernels: attention_kv-inl.h).
inline constexpr int kKvF32 = 0;
inline constexpr int kKvF16 = 1;
inline constexpr int kKvBF16 = 2;
inline constexpr int kKvI8 = 3;  // int8 with one float scale per row
// fp8 with one float scale per row (a per-tensor scale: strides 0).
inline constexpr int kKvE4M3 = 4;
inline constexpr int kKvE5M2 = 5;

// The units the prefill form's products run on (AttnArgs::units; bits of
// attention_units(), dispatch.h). 0: float32 FMAs (the reference path).
inline constexpr unsigned kUnitsModel = 1;       // VDPBF16PS's model
inline constexpr unsigned kUnitsAvx512Bf16 = 2;  // VDPBF16PS (AVX512-BF16)

struct AttnArgs {
  int kv_type = kKvF32;
  const void* k = nullptr;  // key j at k + j * k_stride (elements)
  std::size_t k_stride = 0;
  const void* v = nullptr;  // value j at v + j * v_stride
  std::size_t v_stride = 0;
  // kKvI8, kKvE4M3, kKvE5M2: the scale of key j at
  // k_scale[j * k_scale_stride] (values: v_; a per-tensor scale has stride 0).
  const float* k_scale = nullptr;
  std::size_t k_scale_stride = 0;
  const float* v_scale = nullptr;
  std::size_t v_scale_stride = 0;
  // Paged K and V (block_table non-null): key j lies in page
  // p = block_table[j / page_size], row j % page_size, at
  // k + p * k_page_stride + (j % page_size) * k_stride (elements; k is page
  // 0's row 0 of this KV head), and the same for v and the int8 scales.
  // The caller has checked every entry a key in [j_begin, j_end) maps to.
  const std::int32_t* block_table = nullptr;
  std::size_t page_size = 0;
  std::size_t k_page_stride = 0;
  std::size_t v_page_stride = 0;
  std::size_t k_scale_page_stride = 0;
  std::size_t v_scale_page_stride = 0;
  std::size_t d = 0;
  std::size_t dv = 0;
  std::size_t j_begin = 0;  // keys j_begin <= j < j_end, in blocks of
  std::size_t j_end = 0;    // kKeyTile from j_begin
  // Keys below this exist (the whole key range of the call, of which
  // [j_begin, j_end) is one chunk): the decode form prefetches past j_end
  // up to it, so that the next chunk does not start on a cold block.
  // 0: no further than j_end.
  std::size_t prefetch_end = 0;
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: off
  std::size_t rows = 0;  // <= AttentionMaxRows(), or kDecodeMaxRows
  bool decode = false;   // the decode form (features in lanes)
  bool precise = false;  // prefill only: scores in double, kept as hi + lo
  // bfloat16 queries (q_rows hold bfloat16 values), keys and values, not
  // precise; the prefill form, or the decode form where decode_units_fit:
  // the products on these units (kUnits*; 0: FMAs),
  // and P entering P V as two bfloat16 parts (pv_split) rather than one.
  unsigned units = 0;
  bool pv_split = false;
  const float* const* q_rows = nullptr;            // [rows], d floats each
  const std::int32_t* first_key = nullptr;         // [rows] first visible key
  const std::int32_t* last_key = nullptr;          // [rows] last visible key
  const std::uint8_t* const* mask_rows = nullptr;  // null, or [rows] (entries
                                                   // may be null), by key j
  const float* const* bias_rows = nullptr;         // the same for the bias
  // ALiBi (AttentionOptions::alibi_slopes): null, or per row its slope and
  // base, key j's term alibi_term(slope, j, base, alibi_stride).
  const float* alibi_slopes = nullptr;  // [rows]
  const double* alibi_base = nullptr;   // [rows]
  double alibi_stride = 1.0;
  const float* sinks = nullptr;  // null or [rows]
  float* scratch = nullptr;      // attention_scratch_floats(d, dv) floats
  // The state of each row: max, sum (NaN if the row saw a NaN), and the
  // unnormalised output sum_j exp(s_j - max) V_j.
  float* out_m = nullptr;   // [rows]
  double* out_l = nullptr;  // [rows]
  double* out_o = nullptr;  // [rows * dv]
};

// One backward kernel call (attention_backward-inl.h): the keys
// f.j_begin .. f.j_end - 1 (at most kKeyTile) against f.rows query rows,
// with f's query rows, key limits, mask, bias, ALiBi, K/V source, scale and
// soft-cap as the forward's prefill form reads them (f.sinks, f.decode,
// f.precise, f.units and the out_* pointers are not used).
struct AttnBackArgs {
  AttnArgs f;
  // The rows packed transposed by the caller: Qt[k][r] at qt[k bq + r]
  // (k < d) and dOt[c][r] at dot[c bq + r] (c < dv), r < bq, with zeros in
  // the lanes past f.rows; bq >= f.rows, a multiple of the lanes.
  const float* qt = nullptr;
  const float* dot = nullptr;
  std::size_t bq = 0;
  const float* const* do_rows = nullptr;  // [rows] dO rows (dv floats)
  // [rows]: 1 where the Q row (dO row) holds inf or NaN.
  const std::uint8_t* q_bad = nullptr;
  const std::uint8_t* do_bad = nullptr;
  const float* lse = nullptr;    // [rows] the forward's lse
  const float* delta = nullptr;  // [rows] rowsum(dO * O) - dlse
  // Null, or [rows]: 1/k for a row whose lse is +inf (k scores of +inf).
  const float* inf_share = nullptr;
  // dV [kb][dv] and dK [kb][d] (unscaled): each element's float FMA chain
  // over the rows of a group of kBackRowGroup rows lives in the float
  // tiles (zero at the group's start) across the group's calls; the call
  // with flush set adds the chains into the double accumulators and zeroes
  // the tiles. Row strides >= d and dv rounded up to 16.
  float* dv_tile = nullptr;
  float* dk_tile = nullptr;
  double* dv_acc = nullptr;
  std::size_t dv_stride = 0;
  double* dk_acc = nullptr;
  std::size_t dk_stride = 0;
  bool flush = true;
  // Written: dQt[c][r] = sum_j dT[j][r] K[j][c] (unscaled), c < d, r < bq,
  // at dq + c * dq_stride + r: each one float FMA chain over the key tile
  // (exact in double, where the caller adds it).
  float* dq = nullptr;
  std::size_t dq_stride = 0;
  // Null, or [rows] rows (entries may be null) of the bias gradient dS, by
  // key j: written at the block's visible keys.
  float* const* dbias_rows = nullptr;
  // Non-null: count each row's +inf scores of the block into inf_count[r]
  // and do nothing else.
  double* inf_count = nullptr;
};

// Rows per group of the backward's dK and dV chains (AttnBackArgs): fixed
// for every target, so the bits are too.
inline constexpr std::size_t kBackRowGroup = 64;

// Floats of scratch one backward kernel call needs.
inline constexpr std::size_t attention_backward_scratch_floats(std::size_t d,
                                                               std::size_t dv) {
  const std::size_t bq = kMaxKernelRows;
  const std::size_t pad = 16;
  return d * bq + kKeyTile * bq + kKeyTile * (d + dv) + 4 * bq + dv * bq +
         bq * (d + pad) + bq * (dv + pad) + 3 * kKeyTile * bq + 5 * bq +
         std::size_t{16} * 24;
}

// The ALiBi term of key j for a row: slope (pos_j - pos_i), pos_j - pos_i
// = j stride + base (base = the key offset minus the row's position),
// computed in double (exact while |j stride + base| < 2^53: the product of
// a float and such an integer is exact in double) and rounded once to float.
// The kernels add it to the score as they add a bias; attention_weights()
// too.
inline float alibi_term(float slope, std::size_t j, double base,
                        double stride) {
  return static_cast<float>(static_cast<double>(slope) *
                            (static_cast<double>(j) * stride + base));
}

// Floats of scratch one kernel call needs (with room for 64-byte alignment).
// precise adds Qt in double and the scores' low parts (2 more pieces).
// units adds the packed bfloat16 pairs of Q, P (two parts) and V.
inline constexpr std::size_t attention_scratch_floats(std::size_t d,
                                                      std::size_t dv,
                                                      bool precise = false,
                                                      bool units = false) {
  const std::size_t bq = kMaxKernelRows;
  // Room to align up to 16 pieces to 64 bytes (16 floats) each.
  const std::size_t align_room = std::size_t{16} * 16;
  const std::size_t extra =
      precise ? 2 * d * bq + kKeyTile * bq + std::size_t{2} * 16 : 0;
  const std::size_t packed =
      units ? (d / 2 + 1) * bq + kKeyTile * bq + (kKeyTile / 2) * dv + 64 : 0;
  return (d + 16) * bq + 2 * kKeyTile * bq + kKeyTile * (d + dv) + bq +
         2 * dv * bq + 4 * bq + 4 * bq + align_room + extra + packed;
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_ATTENTION_ARGS_H_
