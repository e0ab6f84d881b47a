/* Native blockwise int8/int4 outer-gradient codecs for ddctl.
 *
 * Why C: the torch reference (ddctl_agents/core/_codec_ref.py) makes several
 * full passes over a multi-GB outer gradient; these kernels make one pass per
 * block (absmax, then quantize+pack while the block is still in L1).
 *
 * The wire format is specified in ddctl_agents/core/codec.py; this file must
 * produce the same bytes as the reference, bit for bit:
 *   scale = absmax / L            (float32 division, L = 127 or 7)
 *   inv   = 1 / scale, or 0 when that is not finite (scale 0 or tiny)
 *   q     = round_half_even(x * inv), clamped to [-L, L]
 *   x'    = (float)q * scale
 * Compile with -ffp-contract=off: a fused multiply-add would change roundings.
 *
 * Python calls these through ctypes (which releases the GIL); the module
 * object itself has no methods. Functions take raw pointers and never
 * allocate. Encoders return 0, or -1 when the input holds NaN or Inf.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first: its pyconfig.h sets _GNU_SOURCE (madvise) */

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define ABS_MASK 0x7fffffffu
#define INF_BITS 0x7f800000u
#define MAX_BLOCK 4096

/* (y + 1.5*2^23) - 1.5*2^23 rounds to the nearest integer, ties to even,
 * for |y| < 2^22, and unlike rintf it vectorizes on baseline SSE2. */
static const float ROUND_MAGIC = 12582912.0f;

/* Largest |x| as IEEE bits: for non-negative floats the bit patterns order
 * like the values, so an integer max (which vectorizes without -ffast-math)
 * gives absmax, and any NaN/Inf shows up as a result >= INF_BITS. */
static inline uint32_t absmax_bits(const float *x, int64_t len) {
    uint32_t m = 0;
    for (int64_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= ABS_MASK;
        m = u > m ? u : m;
    }
    return m;
}

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float safe_inverse(float scale) {
    float inv = 1.0f / scale;
    return inv <= FLT_MAX ? inv : 0.0f;
}

/* Quantize one block to int8 codes in [-level, level] and store its scale
 * (float32 LE) at *scale_out; returns -1 if the block holds NaN or Inf. */
static inline int quantize_block(const float *restrict x, int64_t len, float level,
                                 int8_t *restrict q, uint8_t *restrict scale_out) {
    uint32_t bits = absmax_bits(x, len);
    if (bits >= INF_BITS) return -1;
    float scale = bits_to_float(bits) / level;
    float inv = safe_inverse(scale);
    int32_t lim = (int32_t)level;
    for (int64_t i = 0; i < len; i++) {
        float y = (x[i] * inv + ROUND_MAGIC) - ROUND_MAGIC;
        int32_t v = (int32_t)y;
        v = v < -lim ? -lim : v;
        v = v > lim ? lim : v;
        q[i] = (int8_t)v;
    }
    memcpy(scale_out, &scale, sizeof scale);
    return 0;
}

DDCTL_EXPORT DDCTL_CLONES int ddctl_int8_encode(const float *x, int64_t n, int64_t block,
                                                uint8_t *scales, int8_t *q) {
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        int64_t len = n - start < block ? n - start : block;
        if (quantize_block(x + start, len, 127.0f, q + start, scales + 4 * b)) return -1;
    }
    return 0;
}

DDCTL_EXPORT DDCTL_CLONES void ddctl_int8_decode(const uint8_t *scales, const int8_t *q,
                                                 int64_t n, int64_t block, float *out) {
    advise_hugepages(out, n * (int64_t)sizeof(float));
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        int64_t len = n - start < block ? n - start : block;
        float scale;
        memcpy(&scale, scales + 4 * b, sizeof scale);
        const int8_t *qb = q + start;
        float *ob = out + start;
        for (int64_t i = 0; i < len; i++) ob[i] = (float)qb[i] * scale;
    }
}

/* int4: element 2i in the low nibble of byte i, element 2i+1 in the high
 * nibble; an odd total count leaves a zero high nibble in the last byte. */
DDCTL_EXPORT DDCTL_CLONES int ddctl_int4_encode(const float *x, int64_t n, int64_t block,
                                                uint8_t *scales, uint8_t *packed) {
    int8_t tmp[MAX_BLOCK];
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        int64_t len = n - start < block ? n - start : block;
        if (quantize_block(x + start, len, 7.0f, tmp, scales + 4 * b)) return -1;
        uint8_t *pb = packed + start / 2;
        for (int64_t i = 0; i < len / 2; i++)
            pb[i] = (uint8_t)((tmp[2 * i] & 0x0f) | ((tmp[2 * i + 1] & 0x0f) << 4));
        if (len & 1) pb[len / 2] = (uint8_t)(tmp[len - 1] & 0x0f);
    }
    return 0;
}

/* The low 4 bits of b as a two's complement value in [-8, 7]. */
static inline int32_t nibble_value(uint32_t b) { return (int32_t)((b & 0x0fu) ^ 0x08u) - 8; }

DDCTL_EXPORT DDCTL_CLONES void ddctl_int4_decode(const uint8_t *scales, const uint8_t *packed,
                                                 int64_t n, int64_t block, float *out) {
    advise_hugepages(out, n * (int64_t)sizeof(float));
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
        int64_t len = n - start < block ? n - start : block;
        float scale;
        memcpy(&scale, scales + 4 * b, sizeof scale);
        const uint8_t *pb = packed + start / 2;
        float *ob = out + start;
        for (int64_t i = 0; i < len / 2; i++) {
            ob[2 * i] = (float)nibble_value(pb[i]) * scale;
            ob[2 * i + 1] = (float)nibble_value(pb[i] >> 4) * scale;
        }
        if (len & 1) ob[len - 1] = (float)nibble_value(pb[len / 2]) * scale;
    }
}

static struct PyModuleDef kernels_module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Native int8/int4 codec kernels; called through ctypes, see ddctl_agents.core._native.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&kernels_module); }
