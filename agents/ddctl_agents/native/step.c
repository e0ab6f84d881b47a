/* The outer Nesterov step of the syncer's round, from the combination the
 * round chose (fused.c forms it from the learners' packed updates):
 *   ddctl_step_from      from a combination already written;
 *   ddctl_q_combine_step forming one combination and stepping in the same
 *                        pass, so it is never written or read back.
 * Both keep the largest |value| they write (the result's check). Values are
 * float32, the portable, AVX2 and AVX-512 paths the same operations in the same order.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "packed.h"

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
 * max_ps drops a NaN, so an unordered compare keeps it in ``nan``. */
typedef struct {
    __m256 mu, lr, top[2], nan[2];
    int nesterov;
} Step8;

__attribute__((target("avx2"))) static inline Step8 step8_start(float mu, float lr, int nesterov) {
    Step8 st = {_mm256_set1_ps(mu), _mm256_set1_ps(lr), {_mm256_setzero_ps(), _mm256_setzero_ps()},
                {_mm256_setzero_ps(), _mm256_setzero_ps()}, nesterov};
    return st;
}

/* Elements [i, i + 8) stepped from their delta d (already scaled). */
__attribute__((target("avx2"), always_inline)) static inline void step8(Step8 *st, __m256 d, int64_t i, const float *theta,
                                                                      const float *buf, float *theta_out, float *buf_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 nb = buf ? _mm256_add_ps(_mm256_mul_ps(st->mu, _mm256_loadu_ps(buf + i)), d) : d;
    __m256 step = st->nesterov ? _mm256_add_ps(d, _mm256_mul_ps(st->mu, nb)) : nb;
    __m256 nt = _mm256_sub_ps(_mm256_loadu_ps(theta + i), _mm256_mul_ps(st->lr, step));
    _mm256_storeu_ps(buf_out + i, nb);
    _mm256_storeu_ps(theta_out + i, nt);
    st->top[0] = _mm256_max_ps(st->top[0], _mm256_andnot_ps(sign, nt));
    st->top[1] = _mm256_max_ps(st->top[1], _mm256_andnot_ps(sign, nb));
    st->nan[0] = _mm256_or_ps(st->nan[0], _mm256_cmp_ps(nt, nt, _CMP_UNORD_Q));
    st->nan[1] = _mm256_or_ps(st->nan[1], _mm256_cmp_ps(nb, nb, _CMP_UNORD_Q));
}

__attribute__((target("avx2"))) static void step8_finish(const Step8 *st, Largest *seen) {
    for (int k = 0; k < 2; k++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, st->top[k]);
        for (int j = 0; j < 8; j++)
            if (lanes[j] > seen->top[k]) seen->top[k] = lanes[j];
        seen->nan[k] |= _mm256_movemask_ps(st->nan[k]) != 0;
    }
}

/* Returns where it stopped (the portable loop does the rest). */
__attribute__((target("avx2"))) static int64_t step_avx2(const float *delta, float scale, int64_t n, const float *theta,
                                                         const float *buf, float mu, float lr, int nesterov,
                                                         float *theta_out, float *buf_out, Largest *seen) {
    const __m256 s = _mm256_set1_ps(scale);
    Step8 st = step8_start(mu, lr, nesterov);
    int64_t end = n / 8 * 8;
    for (int64_t i = 0; i < end; i += 8) step8(&st, _mm256_mul_ps(_mm256_loadu_ps(delta + i), s), i, theta, buf, theta_out, buf_out);
    step8_finish(&st, seen);
    return end;
}

/* combine64 (K = 1) and step8 in one pass: each block's 64 sums go from
 * registers into the step, so the combination is never written or read back. */
#define COMBINE_STEP64(ISA)                                                                                             \
    __attribute__((target(#ISA))) static void combine_step64_##ISA(                                                   \
        int64_t updates, const uint8_t *const *scales, const uint8_t *const *codes, const float *coef, int64_t blocks, \
        float scale, const float *theta, const float *buf, float mu, float lr, int nesterov, float *theta_out,         \
        float *buf_out, Largest *seen) {                                                                              \
        const __m256 s = _mm256_set1_ps(scale);                                                                         \
        Step8 st = step8_start(mu, lr, nesterov);                                                                       \
        for (int64_t b = 0; b < blocks; b++) {                                                                          \
            __m256 e[2][4], o[2][4];                                                                                    \
            sum64_##ISA(1, updates, scales, codes, coef, b, e, o);                                                      \
            for (int i = 0; i < 4; i++) {                                                                               \
                __m256 low, high;                                                                                       \
                int64_t at = 64 * b + 16 * i;                                                                           \
                interleave16(e[0][i], o[0][i], &low, &high);                                                            \
                step8(&st, _mm256_mul_ps(low, s), at, theta, buf, theta_out, buf_out);                                  \
                step8(&st, _mm256_mul_ps(high, s), at + 8, theta, buf, theta_out, buf_out);                             \
            }                                                                                                           \
        }                                                                                                               \
        step8_finish(&st, seen);                                                                                        \
    }
COMBINE_STEP64(avx2)
COMBINE_STEP64(avx512f)
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

/* ddctl_q_combine (one combination, coef[m]) then ddctl_step_from (delta = scale * it) in one pass, with the same
 * values: a tile's (or a block's) combination goes straight into its step, never to memory. */
DDCTL_EXPORT DDCTL_CLONES void ddctl_q_combine_step(int bits, int64_t updates, const uint8_t *const *scales,
                                                    const uint8_t *const *codes, const float *coef, int64_t n,
                                                    int64_t block, float scale, const float *theta, const float *buf,
                                                    float mu, float lr, int nesterov, float *theta_out, float *buf_out,
                                                    float *largest) {
    static _Thread_local Acc acc;
    static _Thread_local float delta[TILE];
    Acc *accs[1] = {&acc};
    Largest seen = {{0.0f, 0.0f}, {0, 0}};
    int64_t begin = 0;
    advise_hugepages(theta_out, n * (int64_t)sizeof(float));
    advise_hugepages(buf_out, n * (int64_t)sizeof(float));
#ifdef DDCTL_AVX2_PATH
    if (bits == 4 && block == 64 && __builtin_cpu_supports("avx2")) {
        begin = n / TILE * TILE;
        (use_avx512() ? combine_step64_avx512f : combine_step64_avx2)(updates, scales, codes, coef, begin / 64, scale,
                                                                      theta, buf, mu, lr, nesterov, theta_out, buf_out,
                                                                      &seen);
    }
#endif
    for (int64_t start = begin; start < n; start += TILE) {
        int64_t len = n - start < TILE ? n - start : TILE;
        acc_clear(&acc);
        for (int64_t m = 0; m < updates; m++) acc_add1(bits, scales[m], codes[m], start, len, block, coef + m, accs);
        acc_values(bits, &acc, len, delta);
        step_portable(delta, scale, 0, len, theta + start, buf ? buf + start : NULL, mu, lr, nesterov, theta_out + start,
                      buf_out + start, &seen);
    }
    for (int k = 0; k < 2; k++) largest[k] = seen.nan[k] ? NAN : seen.top[k];
}
