/* qdot.c's quantised activations: the layout of one call's (`acts`), the quantiser of one block of 32 values
 * (int8, or 16 bits as two int8 planes and as words), and a call's activations from a token onward. Included by
 * qdot.c only, after ggml_blocks.h. */
#ifndef QDOT_ACTS_H
#define QDOT_ACTS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The quantised activations of one call: token t's values at q + t * cols, its block scales and scaled sums at
 * d + t * nb and s + t * nb. */
typedef struct {
    const int8_t *q, *ql; /* ql: the low plane of 16-bit activations (NULL for int8) */
    const int16_t *v;     /* 16-bit activations as words, 256 q + ql (NULL for int8) */
    const float *d, *s, *s16; /* s16: the scaled sums of each 16 values (Q6_K's offset), 2 nb per token */
    int cols, nb;
} acts;

/* 16-bit activations as two int8 planes: v = 256 h + l with h, l in [-128, 127] and |v| <= WIDE_MAX (so that
 * h = floor((v + 128) / 256) stays within int8). */
#define WIDE_MAX (256 * 127 + 127)

/* Quantise block i (token i / nb, block i % nb) of x: to int8 in q (ql NULL), or to 16-bit values v, also split into
 * the planes q (high) and ql (low). */
static inline void quantise_block(const float *x, int cols, int nb, int i, int8_t *q, int8_t *ql, int16_t *v16,
                                  float *d, float *s, float *s16) {
    const int t = i / nb, b = i % nb;
    const float *xb = x + (size_t)t * cols + (size_t)b * QK;
    int8_t *qb = q + (size_t)t * cols + (size_t)b * QK;
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < QK; j++) {
        amax = fmaxf(amax, fabsf(xb[j]));
        finite &= isfinite(xb[j]) != 0;
    }
    if (!finite) { /* NaN or inf: no integers stand for it; a NaN scale makes every product of the block NaN, as a
                    * float product would be non-finite, so a model fault still shows (the engine fails that request) */
        for (int j = 0; j < QK; j++) {
            qb[j] = 0;
            if (ql) {
                ql[(size_t)t * cols + (size_t)b * QK + j] = 0;
                v16[(size_t)t * cols + (size_t)b * QK + j] = 0;
            }
        }
        d[i] = s[i] = s16[2 * i] = s16[2 * i + 1] = NAN;
        return;
    }
    const float dx = amax / (ql ? (float)WIDE_MAX : 127.0f), id = dx != 0.0f ? 1.0f / dx : 0.0f;
    int sum = 0, half = 0;
    for (int j = 0; j < QK; j++) {
        const int v = (int)nearbyintf(xb[j] * id);
        if (j == 16) half = sum;
        if (ql) {
            const int h = (v + 128) >> 8; /* floor: v - 256 h in [-128, 127] (an arithmetic shift on every target) */
            qb[j] = (int8_t)h;
            ql[(size_t)t * cols + (size_t)b * QK + j] = (int8_t)(v - 256 * h);
            /* words in the order dot_w16 takes them: values 8-15 and 16-23 swapped */
            const int at = (j >> 3) == 1 ? j + 8 : (j >> 3) == 2 ? j - 8 : j;
            v16[(size_t)t * cols + (size_t)b * QK + at] = (int16_t)v;
        } else {
            qb[j] = (int8_t)v;
        }
        sum += v;
    }
    d[i] = dx;
    s[i] = dx * (float)sum;
    s16[2 * i] = dx * (float)half;
    s16[2 * i + 1] = dx * (float)(sum - half);
}

/* Token t0's activations onward, as their own call's. */
static inline acts acts_from(const acts *a, int t0) {
    const size_t q = (size_t)t0 * a->cols, b = (size_t)t0 * a->nb;
    const acts out = {a->q + q,     a->ql ? a->ql + q : NULL, a->v ? a->v + q : NULL, a->d + b, a->s + b,
                      a->s16 + 2 * b, a->cols,                 a->nb};
    return out;
}
#endif
