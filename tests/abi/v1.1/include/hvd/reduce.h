/* hvd/reduce.h — element-wise reduction kernels for every hvd dtype and op, for plugin authors.
 *
 * C99, header-only, no dependencies. The loops are written so that compilers vectorize the
 * native types; float16 and bfloat16 are widened to float, reduced, and rounded back to nearest
 * even, which is what NCCL and Gloo do per reduction step. Signed integer arithmetic wraps
 * (computed in unsigned) instead of being undefined on overflow. */
#ifndef HVD_REDUCE_H
#define HVD_REDUCE_H

#include <string.h>

#include "hvd/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The dispatchers below are not inlined: one call per buffer costs nothing, and inlining a
 * switch over every dtype into a caller with a small buffer makes GCC 12 warn (-Warray-bounds)
 * about branches that cannot run. */
#if defined(__GNUC__)
#define HVD__DISPATCH static __attribute__((noinline, unused))
#else
#define HVD__DISPATCH static inline
#endif

/* ---- float16 / bfloat16 conversions (round to nearest even; NaN stays NaN) ---------------- */

static inline uint32_t hvd__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float hvd__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float hvd_float16_to_float(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (uint32_t)(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += (uint32_t)(128 - 16) << 23; /* Inf / NaN */
  } else if (exp == 0) {             /* zero / subnormal: renormalize through float arithmetic */
    o += 1u << 23;
    o = hvd__f32_bits(hvd__f32_from_bits(o) - hvd__f32_from_bits(113u << 23));
  }
  o |= ((uint32_t)h & 0x8000u) << 16;
  return hvd__f32_from_bits(o);
}

static inline uint16_t hvd_float_to_float16(float value) {
  const uint32_t f32_infinity = 255u << 23;
  const uint32_t f16_overflow = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = hvd__f32_bits(value);
  const uint32_t sign = f & 0x80000000u;
  uint16_t o;
  f ^= sign;
  if (f >= f16_overflow) {
    o = (uint16_t)(f > f32_infinity ? 0x7e00u : 0x7c00u);
  } else if (f < (113u << 23)) { /* result is subnormal or zero: let the FPU round */
    const float sum = hvd__f32_from_bits(f) + hvd__f32_from_bits(denorm_magic);
    o = (uint16_t)(hvd__f32_bits(sum) - denorm_magic);
  } else {
    const uint32_t mantissa_odd = (f >> 13) & 1u;
    f += (uint32_t)((15u - 127u) << 23) + 0xfffu;
    f += mantissa_odd;
    o = (uint16_t)(f >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

static inline float hvd_bfloat16_to_float(uint16_t b) {
  return hvd__f32_from_bits((uint32_t)b << 16);
}

static inline uint16_t hvd_float_to_bfloat16(float value) {
  uint32_t u = hvd__f32_bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- kernels -------------------------------------------------------------------------------- */

#define HVD__LOOP(T, EXPR)                    \
  do {                                        \
    T* o_ = (T*)out;                          \
    const T* a_ = (const T*)a;                \
    const T* b_ = (const T*)b;                \
    for (uint64_t i_ = 0; i_ < count; ++i_) { \
      const T x = a_[i_];                     \
      const T y = b_[i_];                     \
      o_[i_] = (T)(EXPR);                     \
    }                                         \
  } while (0)

#define HVD__HALF_LOOP(TO_FLOAT, FROM_FLOAT, EXPR) \
  do {                                             \
    uint16_t* o_ = (uint16_t*)out;                 \
    const uint16_t* a_ = (const uint16_t*)a;       \
    const uint16_t* b_ = (const uint16_t*)b;       \
    for (uint64_t i_ = 0; i_ < count; ++i_) {      \
      const float x = TO_FLOAT(a_[i_]);            \
      const float y = TO_FLOAT(b_[i_]);            \
      o_[i_] = FROM_FLOAT(EXPR);                   \
    }                                              \
  } while (0)

/* The four element-wise operators for a type T whose sum/product are computed in type W
 * (W is the unsigned twin for signed integers, so that overflow wraps instead of being UB). */
#define HVD__OPS(T, W)                 \
  switch (op) {                        \
    case HVD_SUM:                      \
    case HVD_AVERAGE:                  \
      HVD__LOOP(T, (W)x + (W)y);       \
      return HVD_SUCCESS;              \
    case HVD_PRODUCT:                  \
      HVD__LOOP(T, (W)x*(W)y);         \
      return HVD_SUCCESS;              \
    case HVD_MIN:                      \
      HVD__LOOP(T, y < x ? y : x);     \
      return HVD_SUCCESS;              \
    case HVD_MAX:                      \
      HVD__LOOP(T, y > x ? y : x);     \
      return HVD_SUCCESS;              \
    default:                           \
      return HVD_ERR_INVALID_ARGUMENT; \
  }

#define HVD__HALF_OPS(TO_FLOAT, FROM_FLOAT)                \
  switch (op) {                                            \
    case HVD_SUM:                                          \
    case HVD_AVERAGE:                                      \
      HVD__HALF_LOOP(TO_FLOAT, FROM_FLOAT, x + y);         \
      return HVD_SUCCESS;                                  \
    case HVD_PRODUCT:                                      \
      HVD__HALF_LOOP(TO_FLOAT, FROM_FLOAT, x* y);          \
      return HVD_SUCCESS;                                  \
    case HVD_MIN:                                          \
      HVD__HALF_LOOP(TO_FLOAT, FROM_FLOAT, y < x ? y : x); \
      return HVD_SUCCESS;                                  \
    case HVD_MAX:                                          \
      HVD__HALF_LOOP(TO_FLOAT, FROM_FLOAT, y > x ? y : x); \
      return HVD_SUCCESS;                                  \
    default:                                               \
      return HVD_ERR_INVALID_ARGUMENT;                     \
  }

/* ---- 16-bit floats eight at a time (x86 with F16C / AVX2, checked at run time) -------------
 * The same float operation and the same round-to-nearest-even as the scalar loops, so results
 * are bit for bit the scalar ones (NaN payloads aside). Each returns how many elements it did;
 * the scalar loop finishes the tail. Define HVD_NO_SIMD to compile the scalar code only. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(HVD_NO_SIMD)
#include <immintrin.h>
#define HVD__X86_SIMD 1

/* min/max keep the scalar's operand order: y < x ? y : x is _mm256_min_ps(y, x). */
#define HVD__SIMD8_LOOP(LOAD, STORE) \
  do {                               \
    for (; i + 8 <= count; i += 8) { \
      const __m256 x = LOAD(a + i);  \
      const __m256 y = LOAD(b + i);  \
      __m256 r;                      \
      switch (op) {                  \
        case HVD_PRODUCT:            \
          r = _mm256_mul_ps(x, y);   \
          break;                     \
        case HVD_MIN:                \
          r = _mm256_min_ps(y, x);   \
          break;                     \
        case HVD_MAX:                \
          r = _mm256_max_ps(y, x);   \
          break;                     \
        default:                     \
          r = _mm256_add_ps(x, y);   \
          break;                     \
      }                              \
      STORE(out + i, r);             \
    }                                \
  } while (0)

__attribute__((target("avx,f16c"), unused)) static inline __m256 hvd__load_f16x8(
    const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
__attribute__((target("avx,f16c"), unused)) static inline void hvd__store_f16x8(uint16_t* p,
                                                                                __m256 v) {
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("avx,f16c"), unused)) static uint64_t hvd__float16_simd(
    uint16_t* out, const uint16_t* a, const uint16_t* b, uint64_t count, hvd_reduce_op op) {
  uint64_t i = 0;
  HVD__SIMD8_LOOP(hvd__load_f16x8, hvd__store_f16x8);
  return i;
}

__attribute__((target("avx2"), unused)) static inline __m256 hvd__load_bf16x8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
/* hvd_float_to_bfloat16 on eight lanes: u + 0x7fff + lsb, or the quieted NaN. */
__attribute__((target("avx2"), unused)) static inline void hvd__store_bf16x8(uint16_t* p,
                                                                             __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i halves = _mm256_blendv_epi8(rounded, quiet, is_nan);
  /* 32 -> 16 bits per 128-bit lane, then the two lanes' low quadwords side by side. */
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves, halves), 0x08);
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(packed));
}
__attribute__((target("avx2"), unused)) static uint64_t hvd__bfloat16_simd(
    uint16_t* out, const uint16_t* a, const uint16_t* b, uint64_t count, hvd_reduce_op op) {
  uint64_t i = 0;
  HVD__SIMD8_LOOP(hvd__load_bf16x8, hvd__store_bf16x8);
  return i;
}

/* clang before 16 does not know "f16c" in __builtin_cpu_supports (a compile error): there the
 * float16 kernel waits for AVX2, which every CPU with AVX2 pairs with F16C. */
#if defined(__clang__) && __clang_major__ < 16
#define HVD__CPU_HAS(feature) __builtin_cpu_supports("avx2")
#else
#define HVD__CPU_HAS(feature) __builtin_cpu_supports(feature)
#endif

/* Run a SIMD kernel over the head of the arrays (when the CPU has `feature`), then leave the
 * tail to the scalar loop by advancing out/a/b and shrinking count. */
#define HVD__SIMD_HEAD(feature, kernel)                                              \
  do {                                                                               \
    if (op >= HVD_SUM && op <= HVD_PRODUCT && HVD__CPU_HAS(feature)) {               \
      const uint64_t done_ =                                                         \
          kernel((uint16_t*)out, (const uint16_t*)a, (const uint16_t*)b, count, op); \
      out = (uint16_t*)out + done_;                                                  \
      a = (const uint16_t*)a + done_;                                                \
      b = (const uint16_t*)b + done_;                                                \
      count -= done_;                                                                \
    }                                                                                \
  } while (0)
#else
#define HVD__SIMD_HEAD(feature, kernel) \
  do {                                  \
  } while (0)
#endif

/* out[i] = a[i] (op) b[i] for i < count. `out` may alias `a` or `b` exactly (in place); no
 * other overlap. HVD_AVERAGE reduces as HVD_SUM: finish it with hvd_divide() once all ranks
 * have been combined. */
HVD__DISPATCH hvd_status hvd_reduce(void* out, const void* a, const void* b, uint64_t count,
                                    hvd_dtype dtype, hvd_reduce_op op) {
  switch (dtype) {
    case HVD_UINT8:
      HVD__OPS(uint8_t, uint8_t)
    case HVD_INT8:
      HVD__OPS(int8_t, uint8_t)
    case HVD_INT32:
      HVD__OPS(int32_t, uint32_t)
    case HVD_INT64:
      HVD__OPS(int64_t, uint64_t)
    case HVD_FLOAT16:
      HVD__SIMD_HEAD("f16c", hvd__float16_simd);
      HVD__HALF_OPS(hvd_float16_to_float, hvd_float_to_float16)
    case HVD_BFLOAT16:
      HVD__SIMD_HEAD("avx2", hvd__bfloat16_simd);
      HVD__HALF_OPS(hvd_bfloat16_to_float, hvd_float_to_bfloat16)
    case HVD_FLOAT32:
      HVD__OPS(float, float)
    case HVD_FLOAT64:
      HVD__OPS(double, double)
    default:
      return HVD_ERR_INVALID_ARGUMENT;
  }
}

#define HVD__DIVIDE(T, EXPR)                  \
  do {                                        \
    T* p_ = (T*)buffer;                       \
    for (uint64_t i_ = 0; i_ < count; ++i_) { \
      const T x = p_[i_];                     \
      p_[i_] = (T)(EXPR);                     \
    }                                         \
  } while (0)

/* buffer[i] /= divisor for i < count: the last step of HVD_AVERAGE. Integer types truncate
 * toward zero; floating types divide in their own precision (float for the 16-bit types). */
HVD__DISPATCH hvd_status hvd_divide(void* buffer, uint64_t count, hvd_dtype dtype,
                                    int64_t divisor) {
  if (divisor <= 0) return HVD_ERR_INVALID_ARGUMENT;
  if (divisor == 1) return HVD_SUCCESS;
  switch (dtype) {
    case HVD_UINT8:
      HVD__DIVIDE(uint8_t, x / divisor);
      return HVD_SUCCESS;
    case HVD_INT8:
      HVD__DIVIDE(int8_t, x / divisor);
      return HVD_SUCCESS;
    case HVD_INT32:
      HVD__DIVIDE(int32_t, x / divisor);
      return HVD_SUCCESS;
    case HVD_INT64:
      HVD__DIVIDE(int64_t, x / divisor);
      return HVD_SUCCESS;
    case HVD_FLOAT16:
      HVD__DIVIDE(uint16_t, hvd_float_to_float16(hvd_float16_to_float(x) / (float)divisor));
      return HVD_SUCCESS;
    case HVD_BFLOAT16:
      HVD__DIVIDE(uint16_t, hvd_float_to_bfloat16(hvd_bfloat16_to_float(x) / (float)divisor));
      return HVD_SUCCESS;
    case HVD_FLOAT32:
      HVD__DIVIDE(float, x / (float)divisor);
      return HVD_SUCCESS;
    case HVD_FLOAT64:
      HVD__DIVIDE(double, x / (double)divisor);
      return HVD_SUCCESS;
    default:
      return HVD_ERR_INVALID_ARGUMENT;
  }
}

#undef HVD__LOOP
#undef HVD__HALF_LOOP
#undef HVD__OPS
#undef HVD__HALF_OPS
#undef HVD__DIVIDE

#ifdef __cplusplus
}
#endif

#endif /* HVD_REDUCE_H */
