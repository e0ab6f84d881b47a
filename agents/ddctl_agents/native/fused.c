/* The syncer's round, fused: M learners' int8/int4 updates of one tensor,
 * still in their wire form, merged and stepped without decoding them first.
 *
 * Why: decoding each update to fp32, then weighting, accumulating, taking
 * norms and applying the outer step makes ~4 passes over M full-size fp32
 * tensors. Here every pass reads only the codes (0.56 bytes per parameter for
 * int4 at block 64) and works a tile at a time in L1:
 *   ddctl_q_stats   one update's exact max|value| and sum of squares, from its
 *                   codes and scales (the admission check and RDA's norms);
 *   ddctl_q_combine one or two combinations sum_m c_m v_m (the mean; RDA's
 *                   summed unit directions) with their norms, decoding each
 *                   update once (RDA's premise check needs both norms), or
 *                   the norms alone;
 * and in step.c the outer Nesterov step from the combination chosen
 * (ddctl_step_from), or formed and stepped in one pass (ddctl_q_combine_step).
 * The codes and scales are exactly those of codec.py's wire contract; a
 * learner is not trusted to have produced them with our encoder, so a code of
 * -8 (int4) or -128 (int8) and any scale are handled as what they decode to.
 * Sums of squares are float64; values are float32 as in the torch reference
 * (merge.py, outer.py), which this matches to rounding, not bit for bit.
 */
#define _GNU_SOURCE /* madvise, in common.h */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "packed.h"

/* Sum of squares in 8 independent lanes: a single running float sum is a
 * dependency chain the compiler may not reorder (no -ffast-math here). */
static inline float sum_squares(const float *restrict x, int64_t n) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] += x[i + k] * x[i + k];
    for (; i < n; i++) lane[0] += x[i] * x[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static inline float acc_squares(int bits, const Acc *restrict acc, int64_t len) {
    if (bits == 8) return sum_squares(acc->even, len);
    return sum_squares(acc->even, (len + 1) / 2) + sum_squares(acc->odd, len / 2);
}

/* Sum of q^2 and max |q| over one block's codes (exact small integers). */
static inline void block_codes(int bits, const uint8_t *codes, int64_t start, int64_t n, int64_t *sq, int32_t *top) {
    int64_t s = 0;
    int32_t t = 0;
    if (bits == 8) {
        const int8_t *q = (const int8_t *)codes + start;
        for (int64_t i = 0; i < n; i++) {
            int32_t v = q[i];
            s += v * v;
            int32_t a = v < 0 ? -v : v;
            t = a > t ? a : t;
        }
    } else {
        const uint8_t *pb = codes + start / 2;
        for (int64_t j = 0; j < n / 2; j++) {
            int32_t lo = low_nibble(pb[j]), hi = high_nibble(pb[j]);
            s += lo * lo + hi * hi;
            int32_t a = lo < 0 ? -lo : lo, b = hi < 0 ? -hi : hi;
            a = a > b ? a : b;
            t = a > t ? a : t;
        }
        if (n & 1) {
            int32_t lo = low_nibble(pb[n / 2]);
            s += lo * lo;
            int32_t a = lo < 0 ? -lo : lo;
            t = a > t ? a : t;
        }
    }
    *sq = s;
    *top = t;
}

#ifdef DDCTL_AVX2_PATH
/* One int4 block of 64's |q| as bytes (low and high nibbles), and its q^2 summed in eight int32 lanes: |q| <= 8,
 * so q^2 sums fit in 16 bits pairwise (maddubs). */
__attribute__((target("avx2"), always_inline)) static inline __m256i block_abs64(const uint8_t *p, __m256i *quads) {
    const __m256i mask = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    __m256i bytes = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_abs_epi8(_mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(bytes, mask), eight), eight));
    __m256i hi = _mm256_abs_epi8(
        _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), eight), eight));
    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, lo), _mm256_maddubs_epi16(hi, hi));
    *quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    return _mm256_max_epu8(lo, hi);
}

/* block_codes for one int4 block of 64 on AVX2. */
__attribute__((target("avx2"))) static void block_codes64_avx2(const uint8_t *p, int64_t *sq, int32_t *top) {
    __m256i quads, big = block_abs64(p, &quads);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    *sq = _mm_cvtsi128_si32(s);
    __m128i m = _mm_max_epu8(_mm256_castsi256_si128(big), _mm256_extracti128_si256(big, 1));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
    *top = _mm_cvtsi128_si32(m) & 0xff;
}

/* 32 bytes' max reduced to 8 (two 32-bit lanes' worth, in the low 64 bits of a 128-bit half-pair). */
__attribute__((target("avx2"), always_inline)) static inline __m128i max16(__m256i big) {
    return _mm_max_epu8(_mm256_castsi256_si128(big), _mm256_extracti128_si256(big, 1));
}

/* ddctl_q_stats's loop for int4 blocks of 64, four blocks at a time: the four blocks' sums of q^2 and largest
 * |q| are reduced together (a block at a time spends most of its work on horizontal reductions). Per block the
 * same products as the scalar loop, and the squares are added in block order: the same result. Returns the
 * blocks done, or -1 at a scale that is not finite. */
__attribute__((target("avx2"))) static int64_t stats64x4_avx2(const uint8_t *scales, const uint8_t *codes, int64_t blocks,
                                                              double *squares, float *largest) {
    const __m128i exponent = _mm_set1_epi32(0x7f800000), low_byte = _mm_set1_epi32(0xff);
    __m128 top = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= blocks; b += 4) {
        __m128 s = _mm_loadu_ps((const float *)(const void *)(scales + 4 * b));
        __m128i bits = _mm_castps_si128(s);
        if (_mm_movemask_epi8(_mm_cmpeq_epi32(_mm_and_si128(bits, exponent), exponent))) return -1;
        __m256i q[4], m[4];
        for (int j = 0; j < 4; j++) m[j] = block_abs64(codes + 32 * (b + j), &q[j]);
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
        __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        __m256d wide = _mm256_cvtps_pd(s);
        double part[4];
        _mm256_storeu_pd(part, _mm256_mul_pd(_mm256_mul_pd(wide, wide), _mm256_cvtepi32_pd(sums)));
        for (int j = 0; j < 4; j++) *squares += part[j];
        __m128i m0 = max16(m[0]), m1 = max16(m[1]), m2 = max16(m[2]), m3 = max16(m[3]);
        __m128i u01 = _mm_max_epu8(_mm_unpacklo_epi64(m0, m1), _mm_unpackhi_epi64(m0, m1)); /* [b0 b0 b1 b1] */
        __m128i u23 = _mm_max_epu8(_mm_unpacklo_epi64(m2, m3), _mm_unpackhi_epi64(m2, m3)); /* [b2 b2 b3 b3] */
        u01 = _mm_max_epu8(u01, _mm_shuffle_epi32(u01, 0xb1));
        u23 = _mm_max_epu8(u23, _mm_shuffle_epi32(u23, 0xb1));
        __m128i x = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(u01), _mm_castsi128_ps(u23), 0x88)); /* b0..b3 */
        x = _mm_max_epu8(x, _mm_srli_epi32(x, 16));
        x = _mm_and_si128(_mm_max_epu8(x, _mm_srli_epi32(x, 8)), low_byte);
        __m128 magnitude = _mm_andnot_ps(_mm_set1_ps(-0.0f), s);
        top = _mm_max_ps(top, _mm_mul_ps(magnitude, _mm_cvtepi32_ps(x)));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, top);
    for (int j = 0; j < 4; j++) *largest = lanes[j] > *largest ? lanes[j] : *largest;
    return b;
}
#endif

/* out[0] = sum of squares (float64), out[1] = max |value| (NaN when a scale is
 * not finite: its block decodes to NaN or Inf). */
DDCTL_EXPORT DDCTL_CLONES void ddctl_q_stats(int bits, const uint8_t *scales, const uint8_t *codes, int64_t n, int64_t block,
                                             double *out) {
    double squares = 0.0;
    float largest = 0.0f;
    int64_t b = 0;
#ifdef DDCTL_AVX2_PATH
    const int fast = bits == 4 && __builtin_cpu_supports("avx2");
    if (fast && block == 64) {
        b = stats64x4_avx2(scales, codes, n / 64, &squares, &largest);
        if (b < 0) {
            out[0] = out[1] = (double)NAN;
            return;
        }
    }
#endif
    for (int64_t start = b * block; start < n; start += block, b++) {
        int64_t len = n - start < block ? n - start : block;
        float s = load_scale(scales, b);
        if (!isfinite(s)) {
            out[0] = out[1] = (double)NAN;
            return;
        }
        int64_t sq;
        int32_t top;
#ifdef DDCTL_AVX2_PATH
        if (fast && len == 64)
            block_codes64_avx2(codes + start / 2, &sq, &top);
        else
#endif
            block_codes(bits, codes, start, len, &sq, &top);
        squares += (double)s * (double)s * (double)sq;
        float big = fabsf(s) * (float)top;
        largest = big > largest ? big : largest;
    }
    out[0] = squares;
    out[1] = (double)largest;
}

/* outs[k] = sum_m coef[k][m] v_m (element order) over elements [begin, n),
 * k < K; norms[k] += |outs[k]|^2 over them. begin is a multiple of TILE. */
__attribute__((always_inline)) static inline void combine_tiles(int bits, int K, int64_t updates,
                                                              const uint8_t *const *scales, const uint8_t *const *codes,
                                                              const float *coef, int64_t begin, int64_t n,
                                                              int64_t block, float *const *outs, double *norms) {
    static _Thread_local Acc acc[2];
    Acc *accs[2] = {&acc[0], &acc[1]};
    for (int64_t start = begin; start < n; start += TILE) {
        int64_t len = n - start < TILE ? n - start : TILE;
        for (int k = 0; k < K; k++) acc_clear(accs[k]);
        for (int64_t m = 0; m < updates; m++) {
            float c[2] = {coef[m], K > 1 ? coef[updates + m] : 0.0f};
            if (K == 1)
                acc_add1(bits, scales[m], codes[m], start, len, block, c, accs);
            else
                acc_add2(bits, scales[m], codes[m], start, len, block, c, accs);
        }
        for (int k = 0; k < K; k++) {
            norms[k] += acc_squares(bits, accs[k], len);
            if (outs) acc_values(bits, accs[k], len, outs[k] + start);
        }
    }
}

#ifdef DDCTL_AVX2_PATH
/* The hot case by hand: int4 in blocks of 64, on AVX2 or AVX-512. A block's
 * 64 sums stay in registers across all M updates (the portable path goes
 * through L1 for each), and each byte of codes is decoded once (sum64_avx2,
 * sum64_avx512f). Same operations in the same order as the portable path (no
 * FMA): the same values. */
__attribute__((target("avx2"))) static inline double horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return (double)_mm_cvtss_f32(s);
}

/* A block's K sums written in element order (when outs) and their squares added to norms[k]. */
__attribute__((target("avx2"), always_inline)) static inline void emit64(int K, int64_t b, __m256 e[2][4],
                                                                       __m256 o[2][4], float *const *outs,
                                                                       double *norms) {
    for (int k = 0; k < K; k++) {
        __m256 sq = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            if (outs) {
                __m256 low, high;
                interleave16(e[k][i], o[k][i], &low, &high);
                _mm256_storeu_ps(outs[k] + 64 * b + 16 * i, low);
                _mm256_storeu_ps(outs[k] + 64 * b + 16 * i + 8, high);
            }
            sq = _mm256_add_ps(sq, _mm256_add_ps(_mm256_mul_ps(e[k][i], e[k][i]), _mm256_mul_ps(o[k][i], o[k][i])));
        }
        norms[k] += horizontal_sum(sq);
    }
}

/* Whole blocks, K combinations (a constant once inlined), the sums on AVX2 or AVX-512. */
#define COMBINE64(ISA, K)                                                                                               \
    __attribute__((target(#ISA))) static void combine64_##ISA##_##K(int64_t updates, const uint8_t *const *scales,    \
                                                                    const uint8_t *const *codes, const float *coef,   \
                                                                    int64_t blocks, float *const *outs,               \
                                                                    double *norms) {                                  \
        for (int64_t b = 0; b < blocks; b++) {                                                                          \
            __m256 e[2][4], o[2][4];                                                                                    \
            sum64_##ISA(K, updates, scales, codes, coef, b, e, o);                                                      \
            emit64(K, b, e, o, outs, norms);                                                                            \
        }                                                                                                               \
    }
COMBINE64(avx2, 1)
COMBINE64(avx2, 2)
COMBINE64(avx512f, 1)
COMBINE64(avx512f, 2)
#endif

__attribute__((visibility("hidden"))) int ddctl_avx512_allowed = 1;

/* Allow (1) or forbid (0) the AVX-512 sums; returns the previous setting, or -1 where they cannot run (no AVX-512F
 * on this CPU, or a build without the hand-written paths): the other sums run either way. */
DDCTL_EXPORT int ddctl_use_avx512(int allowed) {
    int before = ddctl_avx512_allowed;
    ddctl_avx512_allowed = allowed != 0;
#ifdef DDCTL_AVX2_PATH
    return __builtin_cpu_supports("avx512f") ? before : -1;
#else
    (void)before;
    return -1;
#endif
}

/* Which sums the int4 combinations at block 64 run on now: 2 AVX-512, 1 AVX2, 0 portable C (what a benchmark reports). */
DDCTL_EXPORT int ddctl_sums_path(void) {
#ifdef DDCTL_AVX2_PATH
    if (use_avx512()) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

/* outs[k] = sum_m coef[k * updates + m] v_m for k < K (1 or 2), in element
 * order, decoding each update once; norms[k] = |outs[k]|^2. */
DDCTL_EXPORT DDCTL_CLONES void ddctl_q_combine(int bits, int K, int64_t updates, const uint8_t *const *scales,
                                  const uint8_t *const *codes, const float *coef, int64_t n, int64_t block,
                                  float *const *outs, double *norms) {
    int64_t begin = 0;
    for (int k = 0; k < K; k++) {
        norms[k] = 0.0;
        if (outs) advise_hugepages(outs[k], n * (int64_t)sizeof(float));
    }
#ifdef DDCTL_AVX2_PATH
    if (bits == 4 && block == 64 && __builtin_cpu_supports("avx2")) {
        begin = n / TILE * TILE; /* whole tiles by hand, the rest below */
        if (use_avx512())
            (K == 1 ? combine64_avx512f_1 : combine64_avx512f_2)(updates, scales, codes, coef, begin / 64, outs, norms);
        else
            (K == 1 ? combine64_avx2_1 : combine64_avx2_2)(updates, scales, codes, coef, begin / 64, outs, norms);
    }
#endif
    if (K == 1)
        combine_tiles(bits, 1, updates, scales, codes, coef, begin, n, block, outs, norms);
    else
        combine_tiles(bits, 2, updates, scales, codes, coef, begin, n, block, outs, norms);
}
