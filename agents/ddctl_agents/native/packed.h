/* What fused.c and step.c share: reading int8/int4 codes a block and a tile
 * at a time (codec.py's wire contract), portable and on AVX2. */
#ifndef DDCTL_NATIVE_PACKED_H
#define DDCTL_NATIVE_PACKED_H

#include <stdint.h>
#include <string.h>

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

#ifdef DDCTL_AVX2_PATH
/* One int4 block of 64 codes as floats, on AVX2: elements 2j in even[j / 8]
 * lane j % 8, elements 2j + 1 in odd (the Acc layout, eight lanes at a time). */
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

/* Block b (int4, 64 codes) of every update, weighted by coef[k * updates + m] times the block's scale and summed
 * into e[k], o[k] (the Acc layout, eight lanes at a time), k < K: the scalar path's products, added in its order. */
__attribute__((target("avx2"), always_inline)) static inline void sum64_avx2(int K, int64_t updates,
                                                                           const uint8_t *const *scales,
                                                                           const uint8_t *const *codes,
                                                                           const float *coef, int64_t b,
                                                                           __m256 e[2][4], __m256 o[2][4]) {
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
}

/* Sixteen elements in order from the sums of their even (e) and odd (o) positions: ``low`` the first eight, ``high``
 * the next eight. */
__attribute__((target("avx2"), always_inline)) static inline void interleave16(__m256 e, __m256 o, __m256 *low,
                                                                             __m256 *high) {
    __m256 first = _mm256_unpacklo_ps(e, o), second = _mm256_unpackhi_ps(e, o);
    *low = _mm256_permute2f128_ps(first, second, 0x20);
    *high = _mm256_permute2f128_ps(first, second, 0x31);
}

/* sum64_avx2 on AVX-512F, with the same bits: each update's 16 possible weighted values s * q are one vector, and
 * vpermps looks every code up in it by its nibble (it reads an index's low four bits only, so the bytes need no
 * masking), which replaces the widening to int32, the conversion to float and the multiply of each code. */
__attribute__((target("avx512f"), always_inline)) static inline void sum64_avx512f(int K, int64_t updates,
                                                                                const uint8_t *const *scales,
                                                                                const uint8_t *const *codes,
                                                                                const float *coef, int64_t b,
                                                                                __m256 e[2][4], __m256 o[2][4]) {
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1); /* nibble u: (u ^ 8) - 8 */
    __m512 even[2][2], odd[2][2]; /* even[k][h]: elements 2j of the block's half h, j < 16 */
    for (int k = 0; k < K; k++)
        for (int h = 0; h < 2; h++) even[k][h] = odd[k][h] = _mm512_setzero_ps();
    for (int64_t m = 0; m < updates; m++) {
        __m256i bytes = _mm256_loadu_si256((const __m256i *)(codes[m] + 32 * b));
        __m256i high = _mm256_srli_epi16(bytes, 4); /* each byte's high nibble in its low four bits */
        __m512i lo[2] = {_mm512_cvtepu8_epi32(_mm256_castsi256_si128(bytes)),
                         _mm512_cvtepu8_epi32(_mm256_extracti128_si256(bytes, 1))};
        __m512i hi[2] = {_mm512_cvtepu8_epi32(_mm256_castsi256_si128(high)),
                         _mm512_cvtepu8_epi32(_mm256_extracti128_si256(high, 1))};
        float scale = load_scale(scales[m], b);
        for (int k = 0; k < K; k++) {
            __m512 values = _mm512_mul_ps(_mm512_set1_ps(coef[k * updates + m] * scale), q);
            for (int h = 0; h < 2; h++) {
                even[k][h] = _mm512_add_ps(even[k][h], _mm512_permutexvar_ps(lo[h], values));
                odd[k][h] = _mm512_add_ps(odd[k][h], _mm512_permutexvar_ps(hi[h], values));
            }
        }
    }
    for (int k = 0; k < K; k++)
        for (int h = 0; h < 2; h++) {
            e[k][2 * h] = _mm512_castps512_ps256(even[k][h]);
            e[k][2 * h + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(even[k][h]), 1));
            o[k][2 * h] = _mm512_castps512_ps256(odd[k][h]);
            o[k][2 * h + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(odd[k][h]), 1));
        }
}

/* Whether the AVX-512 sums are used where the CPU has them (1, the default); ddctl_use_avx512 sets it, so that the
 * tests compare the two paths on a machine that has both. */
extern __attribute__((visibility("hidden"))) int ddctl_avx512_allowed;

static inline int use_avx512(void) { return ddctl_avx512_allowed && __builtin_cpu_supports("avx512f"); }
#endif

#endif
