// softdot kernels: where K and V storage enters the attention kernels. Here
// a key index becomes an address (KeyRow, ValueRow, KeyScale, ValueScale;
// KvOffset maps it through the page table of a paged cache), stored rows
// are widened to float and the next tile is prefetched (PrefetchBlock,
// PrefetchLine). Three readers use it: the prefill form, the backward and
// the untiled decode see keys and values as float rows of one key tile
// through LoadBlock (KvWidened: whether a format needs widening scratch);
// the tiled decode (AVX2, AVX-512) reads each row in place in its stored
// type through FillDecodeRows and LoadRow, one instantiation per type that
// RunDecode (attention_decode-inl.h) picks by switching on kv_type; the
// units' prefill (attention_units-inl.h) reads bfloat16 rows through
// KeyRow / ValueRow and packs them into pairs. So a new format adds a
// kv_type in attention_args.h, its cases here (address, LoadBlock's
// widening, LoadRow, RowElement, element size) and a case in RunDecode.
// Today: float32 (read in place), float16 and bfloat16 (widened exactly),
// int8 and fp8 (e4m3fn, e5m2) with one float scale per row (widened to
// scale * q, one rounding: dequantize_int8 and dequantize_fp8 in
// dequantize.h are the scalar forms, the same bits; a per-tensor fp8 scale
// is a scale view with strides 0); each
// of them contiguous or paged (AttnArgs::block_table: KvOffset maps a key
// through the page table; float32 tiles that cross a page are gathered).

#if defined(SOFTDOT_KERNELS_ATTENTION_KV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_KV_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_KV_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_KV_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/attention_args.h"
#include "kernels/attention_common-inl.h"
#include "kernels/dequantize.h"
#include "softdot/float16.h"
#include "softdot/float8.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace attn {

using detail::kKvBF16;
using detail::kKvE4M3;
using detail::kKvE5M2;
using detail::kKvF32;
using detail::kKvI8;

// Whether LoadBlock may put a tile into scratch (kc, vc) rather than hand
// out the caller's memory: widened formats always, paged float32 when a tile
// crosses a page boundary (its rows are then gathered).
HWY_INLINE bool KvWidened(const AttnArgs& a) {
  return a.kv_type != kKvF32 || a.block_table != nullptr;
}

// Bytes per stored element.
HWY_INLINE std::size_t KvElementBytes(const AttnArgs& a) {
  switch (a.kv_type) {
    case kKvF32:
      return 4;
    case kKvI8:
    case kKvE4M3:
    case kKvE5M2:
      return 1;
    default:
      return 2;
  }
}

// The offset (in elements) of key j's row in storage whose rows are
// row_stride apart, and whose pages (when paged) page_stride apart.
HWY_INLINE std::size_t KvOffset(const AttnArgs& a, std::size_t j,
                                std::size_t row_stride,
                                std::size_t page_stride) {
  if (a.block_table == nullptr) return j * row_stride;
  const auto page = static_cast<std::size_t>(a.block_table[j / a.page_size]);
  return page * page_stride + (j % a.page_size) * row_stride;
}

// The address of key j's stored row (in kv_type's elements) and of value
// j's, and their int8 scales: the one place a key index becomes an address
// (a paged cache maps j through its page table here).
HWY_INLINE const void* KeyRow(const AttnArgs& a, std::size_t j) {
  return static_cast<const char*>(a.k) +
         KvOffset(a, j, a.k_stride, a.k_page_stride) * KvElementBytes(a);
}
HWY_INLINE const void* ValueRow(const AttnArgs& a, std::size_t j) {
  return static_cast<const char*>(a.v) +
         KvOffset(a, j, a.v_stride, a.v_page_stride) * KvElementBytes(a);
}
HWY_INLINE float KeyScale(const AttnArgs& a, std::size_t j) {
  return a.k_scale[KvOffset(a, j, a.k_scale_stride, a.k_scale_page_stride)];
}
HWY_INLINE float ValueScale(const AttnArgs& a, std::size_t j) {
  return a.v_scale[KvOffset(a, j, a.v_scale_stride, a.v_scale_page_stride)];
}

// Widens n elements of K or V storage to float.
HWY_INLINE void Widen(const float* src, float* dst, std::size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
HWY_INLINE void Widen(const std::uint16_t* src, float* dst, std::size_t n,
                      bool bf16) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if (bf16) {
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> d16;
    for (; i + N <= n; i += N) {
      const auto w = hn::PromoteTo(du, hn::LoadU(d16, src + i));
      hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(w)), df, dst + i);
    }
    for (; i < n; ++i)
      dst[i] = ::softdot::to_float(::softdot::BFloat16{src[i]});
  } else {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
    // F16C / NEON conversions: exact, infinities and NaN included.
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, h + i)), df, dst + i);
    }
#endif
    // Elsewhere Highway 1.0.3 emulates the conversion and turns exponent 31
    // (inf, NaN) into finite numbers, so the rest goes bit by bit.
    for (; i < n; ++i) dst[i] = ::softdot::to_float(Float16{src[i]});
  }
}

// dst[c] = scale * float(src[c]) for n int8 elements, rounded once to float
// (float(src[c]) is exact), as dequantize_int8 does.
HWY_INLINE void WidenInt8(const std::int8_t* src, float scale, float* dst,
                          std::size_t n) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::int8_t, DF> d8;
  const VF s = hn::Set(df, scale);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const VF x = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, src + i)));
    hn::StoreU(hn::Mul(x, s), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = detail::dequantize_int8(src[i], scale);
}

// The bits of 8-bit storage as 16-bit lanes of D's lane count.
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, D>> LoadBytes16(
    D, const std::uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<std::uint16_t, D> d16;
  const hn::Rebind<std::uint8_t, D> d8;
  return hn::PromoteTo(d16, hn::LoadU(d8, p));
}

// (Defined again for each target: this file is included once per target.)
#undef SOFTDOT_HAVE_LOAD_FP8
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL
#define SOFTDOT_HAVE_LOAD_FP8 1
// fp8 widened through float16 (F16C: exact, subnormals included, and not
// subject to the DAZ flag). e5m2 is a float16's top byte. e4m3fn's byte,
// sign-extended to 16 bits and shifted left by 7, has its magnitude in
// bits 13..7 and the sign in bits 15 and 14; bit 14 cleared, it is a
// float16 of the value times 2^-8 (subnormals too). Its NaN (magnitude
// 0x7f) becomes +-1.875 there, a magnitude no other pattern gives (448 is
// 1.75 2^8), and is put back as NaN. LoadFp8 returns the value times
// Fp8Unit (1 or 2^-8): the caller's scale times 2^8 (exact while below
// 2^120) folds the 2^8 back in, so fl(value * scale) costs one product.
template <class T>
inline constexpr float kFp8Unit =
    std::is_same_v<T, Float8E4M3> ? 0x1p-8f : 1.0f;
template <class D>
HWY_INLINE hn::Vec<D> LoadFp8(D d, const Float8E5M2* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, D> dh;
  const auto b = LoadBytes16(d, reinterpret_cast<const std::uint8_t*>(p));
  return hn::PromoteTo(d, hn::BitCast(dh, hn::ShiftLeft<8>(b)));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadFp8(D d, const Float8E4M3* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, D> dh;
  const hn::Rebind<std::int16_t, D> di16;
  const hn::Rebind<std::int8_t, D> di8;
  const auto x = hn::PromoteTo(
      di16, hn::LoadU(di8, reinterpret_cast<const std::int8_t*>(p)));
  const auto h =
      hn::And(hn::ShiftLeft<7>(x), hn::Set(di16, -16385));  // ~0x4000
  const auto v = hn::PromoteTo(d, hn::BitCast(dh, h));
  return hn::IfThenElse(hn::Eq(hn::Abs(v), hn::Set(d, 1.875f)), hn::NaN(d), v);
}
// fl(value * scale) for a vector of fp8 elements: one product when the
// scale times 2^8 is finite, else two (both exact but the last).
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadFp8Scaled(D d, const T* HWY_RESTRICT p, float scale) {
  const float folded = scale / kFp8Unit<T>;
  if (HWY_LIKELY(folded <= std::numeric_limits<float>::max())) {
    return hn::Mul(LoadFp8(d, p), hn::Set(d, folded));
  }
  return hn::Mul(hn::Mul(LoadFp8(d, p), hn::Set(d, 1.0f / kFp8Unit<T>)),
                 hn::Set(d, scale));
}
#endif

// dst[c] = scale * value(src[c]) for n fp8 elements, rounded once to float,
// as dequantize_fp8 does.
template <class T>
HWY_INLINE void WidenFp8(const T* src, float scale, float* dst, std::size_t n) {
  std::size_t i = 0;
#ifdef SOFTDOT_HAVE_LOAD_FP8
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (; i + N <= n; i += N) {
    hn::StoreU(LoadFp8Scaled(df, src + i, scale), df, dst + i);
  }
#endif
  for (; i < n; ++i) dst[i] = detail::dequantize_fp8(src[i], scale);
}

// The rows of one block of keys and values as the decode form reads them
// on AVX2 and AVX-512: a pointer per key in its storage format T (float,
// hwy::bfloat16_t, hwy::float16_t or std::int8_t) and, for int8, the row's
// scale; LoadRow widens a vector of a row inside the compute loops with the
// same bits as LoadBlock's widening pass (so there is no pass, and no
// scratch written and read back).
template <class T>
struct DecodeRows {
  const T* k[detail::kKeyTile];
  const T* v[detail::kKeyTile];
  float ks[detail::kKeyTile];
  float vs[detail::kKeyTile];
};

template <class T>
HWY_INLINE void FillDecodeRows(const AttnArgs& a, std::size_t j0,
                               std::size_t kb, DecodeRows<T>& r) {
  for (std::size_t j = 0; j < kb; ++j) {
    r.k[j] = static_cast<const T*>(KeyRow(a, j0 + j));
    r.v[j] = static_cast<const T*>(ValueRow(a, j0 + j));
  }
  if constexpr (detail::kScaledKv<T>) {
    for (std::size_t j = 0; j < kb; ++j) {
      r.ks[j] = KeyScale(a, j0 + j);
      r.vs[j] = ValueScale(a, j0 + j);
    }
  }
}

template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const float* HWY_RESTRICT p, float) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const hwy::bfloat16_t* HWY_RESTRICT p,
                              float) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, D> d16;
  const auto w = hn::PromoteTo(
      du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(p)));
  return hn::BitCast(d, hn::ShiftLeft<16>(w));
}
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL
// F16C: exact, infinities and NaN included (see Widen).
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const hwy::float16_t* HWY_RESTRICT p,
                              float) {
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, p));
}
#endif
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const std::int8_t* HWY_RESTRICT p,
                              float scale) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::int8_t, D> d8;
  return hn::Mul(hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p))),
                 hn::Set(d, scale));
}

#ifdef SOFTDOT_HAVE_LOAD_FP8
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const Float8E4M3* HWY_RESTRICT p,
                              float scale) {
  return LoadFp8Scaled(d, p, scale);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadRow(D d, const Float8E5M2* HWY_RESTRICT p,
                              float scale) {
  return LoadFp8Scaled(d, p, scale);
}
#endif

// Element c of a row, widened as LoadRow does (the scalar tails).
HWY_INLINE float RowElement(const float* p, std::size_t c, float) {
  return p[c];
}
HWY_INLINE float RowElement(const hwy::bfloat16_t* p, std::size_t c, float) {
  std::uint16_t b;
  std::memcpy(&b, p + c, 2);
  return ::softdot::to_float(::softdot::BFloat16{b});
}
HWY_INLINE float RowElement(const hwy::float16_t* p, std::size_t c, float) {
  std::uint16_t b;
  std::memcpy(&b, p + c, 2);
  return ::softdot::to_float(Float16{b});
}
HWY_INLINE float RowElement(const std::int8_t* p, std::size_t c, float scale) {
  return detail::dequantize_int8(p[c], scale);
}
HWY_INLINE float RowElement(const Float8E4M3* p, std::size_t c, float scale) {
  return detail::dequantize_fp8(p[c], scale);
}
HWY_INLINE float RowElement(const Float8E5M2* p, std::size_t c, float scale) {
  return detail::dequantize_fp8(p[c], scale);
}

// The float rows of one block of keys and values: the caller's memory for
// float32 (unpaged, or paged with the tile inside one page), else the block
// widened or gathered into scratch (kc [kb][d], vc [kb][dv]).
struct BlockRows {
  const float* k;
  std::size_t k_stride;
  const float* v;
  std::size_t v_stride;
};

HWY_INLINE BlockRows LoadBlock(const AttnArgs& a, std::size_t j0,
                               std::size_t kb, float* kc, float* vc) {
  if (a.kv_type == kKvF32) {
    // In place when the tile lies in one page (always, unpaged).
    if (a.block_table == nullptr ||
        j0 / a.page_size == (j0 + kb - 1) / a.page_size) {
      return {static_cast<const float*>(KeyRow(a, j0)), a.k_stride,
              static_cast<const float*>(ValueRow(a, j0)), a.v_stride};
    }
    // A tile across pages: its rows gathered (exact copies, so the bits
    // are those of the same rows in place).
    for (std::size_t j = 0; j < kb; ++j) {
      Widen(static_cast<const float*>(KeyRow(a, j0 + j)), kc + j * a.d, a.d);
      Widen(static_cast<const float*>(ValueRow(a, j0 + j)), vc + j * a.dv,
            a.dv);
    }
    return {kc, a.d, vc, a.dv};
  }
  if (a.kv_type == kKvI8) {
    for (std::size_t j = 0; j < kb; ++j) {
      const std::size_t jj = j0 + j;
      WidenInt8(static_cast<const std::int8_t*>(KeyRow(a, jj)), KeyScale(a, jj),
                kc + j * a.d, a.d);
      WidenInt8(static_cast<const std::int8_t*>(ValueRow(a, jj)),
                ValueScale(a, jj), vc + j * a.dv, a.dv);
    }
    return {kc, a.d, vc, a.dv};
  }
  if (a.kv_type == kKvE4M3 || a.kv_type == kKvE5M2) {
    for (std::size_t j = 0; j < kb; ++j) {
      const std::size_t jj = j0 + j;
      if (a.kv_type == kKvE4M3) {
        WidenFp8(static_cast<const Float8E4M3*>(KeyRow(a, jj)), KeyScale(a, jj),
                 kc + j * a.d, a.d);
        WidenFp8(static_cast<const Float8E4M3*>(ValueRow(a, jj)),
                 ValueScale(a, jj), vc + j * a.dv, a.dv);
      } else {
        WidenFp8(static_cast<const Float8E5M2*>(KeyRow(a, jj)), KeyScale(a, jj),
                 kc + j * a.d, a.d);
        WidenFp8(static_cast<const Float8E5M2*>(ValueRow(a, jj)),
                 ValueScale(a, jj), vc + j * a.dv, a.dv);
      }
    }
    return {kc, a.d, vc, a.dv};
  }
  const bool bf16 = a.kv_type == kKvBF16;
  for (std::size_t j = 0; j < kb; ++j) {
    Widen(static_cast<const std::uint16_t*>(KeyRow(a, j0 + j)), kc + j * a.d,
          a.d, bf16);
    Widen(static_cast<const std::uint16_t*>(ValueRow(a, j0 + j)), vc + j * a.dv,
          a.dv, bf16);
  }
  return {kc, a.d, vc, a.dv};
}

// Prefetches the nb keys and values from key j0 on, a cache line at a time,
// with __builtin_prefetch's locality kLocality: 3 (the default) into L1,
// 2 into L2 (the tiled decode spreads these over its score loop: issued all
// at once into L1, they filled the line buffers and stalled it).
// One cache line at p into the caches kLocality names (3: L1, 2: L2, 1: L3,
// 0: non-temporal). On x86 this is an asm statement: GCC 12 dropped the
// __builtin_prefetch calls of the tiled decode's score loop altogether (no
// prefetch instruction in the object), which left decode from DRAM waiting
// on every block (AMD EPYC Zen 4: 8 GB/s against 12 with the prefetches).
template <int kLocality>
HWY_INLINE void PrefetchLine(const char* p) {
#if HWY_ARCH_X86 && (defined(__GNUC__) || defined(__clang__))
  if constexpr (kLocality == 3) {
    asm volatile("prefetcht0 %0" : : "m"(*p));
  } else if constexpr (kLocality == 2) {
    asm volatile("prefetcht1 %0" : : "m"(*p));
  } else if constexpr (kLocality == 1) {
    asm volatile("prefetcht2 %0" : : "m"(*p));
  } else {
    asm volatile("prefetchnta %0" : : "m"(*p));
  }
#else
  __builtin_prefetch(p, 0, kLocality);
#endif
}

template <int kLocality = 3>
HWY_INLINE void PrefetchBlock(const AttnArgs& a, std::size_t j0,
                              std::size_t nb) {
  const std::size_t esize = KvElementBytes(a);
  for (std::size_t j = 0; j < nb; ++j) {
    const char* kn = static_cast<const char*>(KeyRow(a, j0 + j));
    const char* vn = static_cast<const char*>(ValueRow(a, j0 + j));
    for (std::size_t off = 0; off < a.d * esize; off += 64) {
      PrefetchLine<kLocality>(kn + off);
    }
    for (std::size_t off = 0; off < a.dv * esize; off += 64) {
      PrefetchLine<kLocality>(vn + off);
    }
  }
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_KV_INL_H_
