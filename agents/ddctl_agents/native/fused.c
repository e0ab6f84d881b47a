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
 *                   update once (RDA's premise check needs both norms);
 *   ddctl_step_from the outer Nesterov step from the combination chosen.
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

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DDCTL_NO_CLONES)
#include <immintrin.h>
#define DDCTL_AVX2_PATH 1
#endif

#define TILE 1024 /* elements per tile: its accumulators stay in L1 */

static inline float load_scale(const uint8_t *scales, int64_t b) {
    float s;
    memcpy(&s, scales + 4 * b, sizeof s);
    return s;
}

static inline int32_t low_nibble(uint32_t b) { return (int32_t)((b & 0x0fu) ^ 0x08u) - 8; }
static inline int32_t high_nibble(uint32_t b) { return (int32_t)(((b >> 4) & 0x0fu) ^ 0x08u) - 8; }

/* A tile's weighted sum of codes, kept the way int4 stores them so every loop
 * runs over contiguous memory and vectorizes: int4 element 2j goes to even[j]
 * and 2j+1 to odd[j]; int8 element i goes to even[i]. */
typedef struct {
    float even[TILE];
    float odd[TILE / 2];
} Acc;

static inline void acc_clear(Acc *acc) { memset(acc, 0, sizeof *acc); }

/* One block of codes added, scaled by s[k], into accumulator k < K (e[k], and
 * o[k] for int4's odd elements): the codes are decoded once for all K. */
__attribute__((always_inline)) static inline void add_block(int bits, int K, const uint8_t *restrict codes, int64_t n,
                                                           const float *s, float *restrict *e, float *restrict *o) {
    if (bits == 8) {
        const int8_t *restrict q = (const int8_t *)codes;
        for (int64_t i = 0; i < n; i++)
            for (int k = 0; k < K; k++) e[k][i] += s[k] * (float)q[i];
        return;
    }
    int64_t pairs = n / 2;
    for (int64_t j = 0; j < pairs; j++) {
        float lo = (float)low_nibble(codes[j]), hi = (float)high_nibble(codes[j]);
        for (int k = 0; k < K; k++) {
            e[k][j] += s[k] * lo;
            o[k][j] += s[k] * hi;
        }
    }
    if (n & 1)
        for (int k = 0; k < K; k++) e[k][pairs] += s[k] * (float)low_nibble(codes[pairs]);
}

/* acc[k] += coef[k] * (the values of elements [start, start + len)), k < K, one
 * block (or the part of one inside the tile) at a time. start is even, and so is
 * every block boundary (blocks are multiples of 8): int4 pieces start on a byte. */
__attribute__((always_inline)) static inline void acc_add_blocks(int bits, int K, const uint8_t *scales,
                                                                const uint8_t *codes, int64_t start, int64_t len,
                                                                int64_t block, const float *coef, Acc *const *acc) {
    int64_t per_byte = bits == 8 ? 1 : 2;
    for (int64_t at = start, end = start + len; at < end;) {
        int64_t b = at / block, stop = (b + 1) * block < end ? (b + 1) * block : end, off = at - start;
        float scale = load_scale(scales, b), s[2];
        float *e[2], *o[2];
        for (int k = 0; k < K; k++) {
            s[k] = coef[k] * scale;
            e[k] = acc[k]->even + off / per_byte;
            o[k] = acc[k]->odd + off / 2;
        }
        add_block(bits, K, codes + at / per_byte, stop - at, s, e, o);
        at = stop;
    }
}

/* The same for a tile of whole blocks of a constant size: no remainders per block. */
__attribute__((always_inline)) static inline void acc_add_whole(int bits, int K, const uint8_t *scales,
                                                               const uint8_t *codes, int64_t start, int64_t len,
                                                               const int64_t block, const float *coef,
                                                               Acc *const *acc) {
    int64_t per_byte = bits == 8 ? 1 : 2;
    for (int64_t off = 0; off < len; off += block) {
        float scale = load_scale(scales, (start + off) / block), s[2];
        float *e[2], *o[2];
        for (int k = 0; k < K; k++) {
            s[k] = coef[k] * scale;
            e[k] = acc[k]->even + off / per_byte;
            o[k] = acc[k]->odd + off / 2;
        }
        add_block(bits, K, codes + (start + off) / per_byte, block, s, e, o);
    }
}

/* Specialised copies for K = 1 or 2 accumulators, with the default block (64) constant. */
#define ACC_ADD(K)                                                                                                      \
    static inline void acc_add##K(int bits, const uint8_t *scales, const uint8_t *codes, int64_t start, int64_t len,  \
                                  int64_t block, const float *coef, Acc *const *acc) {                                \
        if (block == 64 && len % 64 == 0 && bits == 4)                                                                  \
            acc_add_whole(4, K, scales, codes, start, len, 64, coef, acc);                                              \
        else if (block == 64 && len % 64 == 0)                                                                          \
            acc_add_whole(8, K, scales, codes, start, len, 64, coef, acc);                                              \
        else                                                                                                            \
            acc_add_blocks(bits, K, scales, codes, start, len, block, coef, acc);                                       \
    }
ACC_ADD(1)
ACC_ADD(2)

/* The tile's values in element order. */
static inline void acc_values(int bits, const Acc *restrict acc, int64_t len, float *restrict out) {
    if (bits == 8) {
        memcpy(out, acc->even, sizeof(float) * (size_t)len);
        return;
    }
    for (int64_t j = 0; j < len / 2; j++) {
        out[2 * j] = acc->even[j];
        out[2 * j + 1] = acc->odd[j];
    }
    if (len & 1) out[len - 1] = acc->even[len / 2];
}

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
/* block_codes for one int4 block of 64 on AVX2: |q| <= 8, so q^2 sums fit in
 * 16 bits pairwise (maddubs) and the largest |q| is a byte max. */
__attribute__((target("avx2"))) static void block_codes64_avx2(const uint8_t *p, int64_t *sq, int32_t *top) {
    const __m256i mask = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    __m256i bytes = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_abs_epi8(_mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(bytes, mask), eight), eight));
    __m256i hi = _mm256_abs_epi8(
        _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), eight), eight));
    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, lo), _mm256_maddubs_epi16(hi, hi));
    __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    *sq = _mm_cvtsi128_si32(s);
    __m256i big = _mm256_max_epu8(lo, hi);
    __m128i m = _mm_max_epu8(_mm256_castsi256_si128(big), _mm256_extracti128_si256(big, 1));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
    *top = _mm_cvtsi128_si32(m) & 0xff;
}
#endif

/* out[0] = sum of squares (float64), out[1] = max |value| (NaN when a scale is
 * not finite: its block decodes to NaN or Inf). */
DDCTL_EXPORT DDCTL_CLONES void ddctl_q_stats(int bits, const uint8_t *scales, const uint8_t *codes, int64_t n, int64_t block,
                                             double *out) {
    double squares = 0.0;
    float largest = 0.0f;
#ifdef DDCTL_AVX2_PATH
    const int fast = bits == 4 && __builtin_cpu_supports("avx2");
#endif
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
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
            acc_values(bits, accs[k], len, outs[k] + start);
        }
    }
}

#ifdef DDCTL_AVX2_PATH
/* The hot case by hand: int4 in blocks of 64, on AVX2. A block's 64 sums stay
 * in registers across all M updates (the portable path goes through L1 for
 * each), and each byte of codes is widened to floats once. Same operations in
 * the same order as the portable path (no FMA): the same values. */
__attribute__((target("avx2"))) static inline void nibbles64(const uint8_t *p, __m256 even[4], __m256 odd[4]) {
    const __m256i mask = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
    __m256i bytes = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(bytes, mask), eight), eight);
    __m256i hi = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), eight), eight);
    __m128i halves[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1), _mm256_castsi256_si128(hi),
                         _mm256_extracti128_si256(hi, 1)};
    for (int h = 0; h < 2; h++) {
        even[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
        even[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8)));
        odd[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[2 + h]));
        odd[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[2 + h], 8)));
    }
}

__attribute__((target("avx2"))) static inline double horizontal_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return (double)_mm_cvtss_f32(s);
}

__attribute__((target("avx2"), always_inline)) static inline void combine64_avx2(
    int K, int64_t updates, const uint8_t *const *scales, const uint8_t *const *codes, const float *coef,
    int64_t blocks, float *const *outs, double *norms) {
    for (int64_t b = 0; b < blocks; b++) {
        __m256 e[2][4], o[2][4];
        for (int k = 0; k < K; k++)
            for (int i = 0; i < 4; i++) e[k][i] = o[k][i] = _mm256_setzero_ps();
        for (int64_t m = 0; m < updates; m++) {
            __m256 ev[4], od[4];
            nibbles64(codes[m] + 32 * b, ev, od);
            float scale = load_scale(scales[m], b);
            for (int k = 0; k < K; k++) {
                __m256 s = _mm256_set1_ps(coef[k * updates + m] * scale);
                for (int i = 0; i < 4; i++) {
                    e[k][i] = _mm256_add_ps(e[k][i], _mm256_mul_ps(s, ev[i]));
                    o[k][i] = _mm256_add_ps(o[k][i], _mm256_mul_ps(s, od[i]));
                }
            }
        }
        for (int k = 0; k < K; k++) {
            float *out = outs[k] + 64 * b;
            __m256 sq = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                __m256 first = _mm256_unpacklo_ps(e[k][i], o[k][i]), second = _mm256_unpackhi_ps(e[k][i], o[k][i]);
                _mm256_storeu_ps(out + 16 * i, _mm256_permute2f128_ps(first, second, 0x20));
                _mm256_storeu_ps(out + 16 * i + 8, _mm256_permute2f128_ps(first, second, 0x31));
                sq = _mm256_add_ps(sq, _mm256_add_ps(_mm256_mul_ps(e[k][i], e[k][i]), _mm256_mul_ps(o[k][i], o[k][i])));
            }
            norms[k] += horizontal_sum(sq);
        }
    }
}

__attribute__((target("avx2"))) static void combine64_avx2_1(int64_t updates, const uint8_t *const *scales,
                                                           const uint8_t *const *codes, const float *coef,
                                                           int64_t blocks, float *const *outs, double *norms) {
    combine64_avx2(1, updates, scales, codes, coef, blocks, outs, norms);
}

__attribute__((target("avx2"))) static void combine64_avx2_2(int64_t updates, const uint8_t *const *scales,
                                                           const uint8_t *const *codes, const float *coef,
                                                           int64_t blocks, float *const *outs, double *norms) {
    combine64_avx2(2, updates, scales, codes, coef, blocks, outs, norms);
}
#endif

/* outs[k] = sum_m coef[k * updates + m] v_m for k < K (1 or 2), in element
 * order, decoding each update once; norms[k] = |outs[k]|^2. */
DDCTL_EXPORT DDCTL_CLONES void ddctl_q_combine(int bits, int K, int64_t updates, const uint8_t *const *scales,
                                  const uint8_t *const *codes, const float *coef, int64_t n, int64_t block,
                                  float *const *outs, double *norms) {
    int64_t begin = 0;
    for (int k = 0; k < K; k++) {
        norms[k] = 0.0;
        advise_hugepages(outs[k], n * (int64_t)sizeof(float));
    }
#ifdef DDCTL_AVX2_PATH
    if (bits == 4 && block == 64 && __builtin_cpu_supports("avx2")) {
        begin = n / TILE * TILE; /* whole tiles by hand, the rest below */
        (K == 1 ? combine64_avx2_1 : combine64_avx2_2)(updates, scales, codes, coef, begin / 64, outs, norms);
    }
#endif
    if (K == 1)
        combine_tiles(bits, 1, updates, scales, codes, coef, begin, n, block, outs, norms);
    else
        combine_tiles(bits, 2, updates, scales, codes, coef, begin, n, block, outs, norms);
}

/* The outer step from a delta already combined: d = scale * delta[i];
 * buf' = mu*buf + d (d when buf is NULL); step = d + mu*buf' (Nesterov) or
 * buf'; theta' = theta - lr*step. delta may be theta_out or buf_out (each
 * element is read before either is written). The same pass keeps what the
 * result's check asks (admission.check_result): largest[0] = max |theta'| and
 * largest[1] = max |buf'|, NaN if either holds a NaN, so the check reads no
 * tensor again. */
typedef struct {
    float top[2];
    int nan[2];
} Largest;

static inline void keep_largest(Largest *seen, int k, float x) {
    float a = fabsf(x);
    if (a > seen->top[k]) seen->top[k] = a;
    seen->nan[k] |= x != x;
}

static void step_portable(const float *delta, float scale, int64_t begin, int64_t n, const float *theta,
                          const float *buf, float mu, float lr, int nesterov, float *theta_out, float *buf_out,
                          Largest *seen) {
    for (int64_t i = begin; i < n; i++) {
        float d = delta[i] * scale;
        float nb = buf ? mu * buf[i] + d : d;
        float step = nesterov ? d + mu * nb : nb;
        float nt = theta[i] - lr * step;
        buf_out[i] = nb;
        theta_out[i] = nt;
        keep_largest(seen, 0, nt);
        keep_largest(seen, 1, nb);
    }
}

#ifdef DDCTL_AVX2_PATH
/* step_portable eight at a time, same operations in the same order (no FMA);
 * max_ps drops a NaN, so an unordered compare keeps it. Returns where it stopped. */
__attribute__((target("avx2"))) static int64_t step_avx2(const float *delta, float scale, int64_t n, const float *theta,
                                                         const float *buf, float mu, float lr, int nesterov,
                                                         float *theta_out, float *buf_out, Largest *seen) {
    const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(mu), l = _mm256_set1_ps(lr), sign = _mm256_set1_ps(-0.0f);
    __m256 top[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, nan[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t end = n / 8 * 8;
    for (int64_t i = 0; i < end; i += 8) {
        __m256 d = _mm256_mul_ps(_mm256_loadu_ps(delta + i), s);
        __m256 nb = buf ? _mm256_add_ps(_mm256_mul_ps(m, _mm256_loadu_ps(buf + i)), d) : d;
        __m256 step = nesterov ? _mm256_add_ps(d, _mm256_mul_ps(m, nb)) : nb;
        __m256 nt = _mm256_sub_ps(_mm256_loadu_ps(theta + i), _mm256_mul_ps(l, step));
        _mm256_storeu_ps(buf_out + i, nb);
        _mm256_storeu_ps(theta_out + i, nt);
        top[0] = _mm256_max_ps(top[0], _mm256_andnot_ps(sign, nt));
        top[1] = _mm256_max_ps(top[1], _mm256_andnot_ps(sign, nb));
        nan[0] = _mm256_or_ps(nan[0], _mm256_cmp_ps(nt, nt, _CMP_UNORD_Q));
        nan[1] = _mm256_or_ps(nan[1], _mm256_cmp_ps(nb, nb, _CMP_UNORD_Q));
    }
    for (int k = 0; k < 2; k++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, top[k]);
        for (int j = 0; j < 8; j++)
            if (lanes[j] > seen->top[k]) seen->top[k] = lanes[j];
        seen->nan[k] |= _mm256_movemask_ps(nan[k]) != 0;
    }
    return end;
}
#endif

DDCTL_EXPORT DDCTL_CLONES void ddctl_step_from(const float *delta, float scale, int64_t n, const float *theta,
                                               const float *buf, float mu, float lr, int nesterov, float *theta_out,
                                               float *buf_out, float *largest) {
    Largest seen = {{0.0f, 0.0f}, {0, 0}};
    int64_t begin = 0;
#ifdef DDCTL_AVX2_PATH
    if (__builtin_cpu_supports("avx2"))
        begin = step_avx2(delta, scale, n, theta, buf, mu, lr, nesterov, theta_out, buf_out, &seen);
#endif
    step_portable(delta, scale, begin, n, theta, buf, mu, lr, nesterov, theta_out, buf_out, &seen);
    for (int k = 0; k < 2; k++) largest[k] = seen.nan[k] ? NAN : seen.top[k];
}
