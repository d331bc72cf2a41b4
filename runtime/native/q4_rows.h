/* The float32-activation rows of Q4_1 and, on AVX2, Q4_0 weights, for blockdot.c, and the order the AVX2 rows read
 * x in.
 *
 * A Q4_1 block is 32 weights w_j = d * q_j + m (q_j in 0..15: the low nibble of byte j for j < 16, the high nibble
 * of byte j - 16 after), so  sum_j w_j x_j = d * sum_j q_j x_j + m * sum_j x_j,  the block sums of x computed once
 * per call (blockdot_prep). A Q4_0 block has the same nibbles and w_j = d * (q_j - 8): the same sum with m = -8 d.
 *
 * AVX2: one 32-bit word of a block's bytes (bytes 4k .. 4k+3) broadcast to eight lanes and shifted right by
 * 0, 8, 16, 24, 4, 12, 20, 28 holds weights 4k .. 4k+3 and 16+4k .. 16+4k+3 in its lanes' low nibbles: a load, a
 * variable shift, an and and a conversion per eight weights, where unpacking the bytes in order took two shuffles
 * more (the cross-lane zero extension and the byte shift), and the shuffle ports were what bound the row. x is
 * read in that order: the prepared activations carry each token's x permuted within each block (q4_prep), so the
 * permutation is paid once per call rather than once per row. The block's (d, m) pair is converted from half
 * precision by one instruction; m times the tokens' block sums (also prepared, one vector a block) sums in one vector.
 * A 4096 x 4096 Q4_1 product on 2 threads of this project's AVX2 VM took 0.67-0.78 ms against 0.87-1.31 with the
 * byte-unpacking row it replaced at one token, 3.0-3.5 against 3.6-5.3 at eight (scripts/bench_block_kinds.py, the
 * builds' runs alternating; docs/benchmarks.md). Only the summation order changed: the same products of the same
 * float32 values, so the same bits for any thread count and batch.
 *
 * AVX-512 and the portable path read x in its own order and leave the prepared order unused (Q4_ORDERED 0); their
 * Q4_0 rows are blockdot.c's generic decode. */
#ifndef RADIXCACHE_Q4_ROWS_H
#define RADIXCACHE_Q4_ROWS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ggml_blocks.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define Q4_ORDERED 1
typedef int32_t __attribute__((may_alias, aligned(2))) q4_word; /* a block's bytes read as 32-bit words */
typedef uint16_t __attribute__((may_alias)) q4_half;    /* and as a half-precision scale */
#else
#define Q4_ORDERED 0
#endif

/* Floats the ordered copy of `ntok` rows of x takes after the block sums: x permuted (cols a row), then the block
 * sums by block (8 lanes a block); 0 where the row reads x as it is. */
static inline size_t q4_prep_floats(int cols, int ntok) {
    return Q4_ORDERED ? (size_t)ntok * (size_t)cols + 8 * (size_t)(cols / QK) : 0;
}

/* The ordered copy of x into `ordered` (q4_prep_floats of them), from x and its block sums `xsum` (ntok x nb):
 * each block of each row permuted, then 8 lanes a block: with one token (0, s, 0, ...), which the block's (d, m)
 * pair multiplies as converted; with more, token t's sum s in lane t (zeros after the last token). */
static inline void q4_prep(const float *x, int cols, int ntok, const float *xsum, float *ordered) {
    const int nb = cols / QK;
    float *sums = ordered + (size_t)ntok * cols;
    for (int t = 0; Q4_ORDERED && t < ntok; t++) {
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)t * cols + (size_t)b * QK;
            float *ob = ordered + (size_t)t * cols + (size_t)b * QK;
            for (int k = 0; k < 4; k++) {
                memcpy(ob + 8 * k, xb + 4 * k, 4 * sizeof(float));
                memcpy(ob + 8 * k + 4, xb + 16 + 4 * k, 4 * sizeof(float));
            }
        }
    }
    for (int b = 0; Q4_ORDERED && b < nb; b++) {
        float *lanes = sums + 8 * (size_t)b;
        for (int i = 0; i < 8; i++) lanes[i] = 0.0f;
        for (int t = 0; t < ntok; t++) lanes[ntok == 1 ? 1 : t] = xsum[(size_t)t * nb + b];
    }
}

#if Q4_ORDERED
/* out[t] = row . x[t] of a Q4_1 (`q4_0` 0: blocks (d, m, quants)) or Q4_0 row (`q4_0` 1: blocks (d, quants),
 * w = d * (q - 8), so its m is -8 d), from the prepared activations `prep` (blockdot_prep: the block sums, then
 * the ordered copy). `q4_0` and `ntok` are constants where it is inlined. */
static inline __attribute__((always_inline)) void q4_row_ordered(const uint8_t *row, size_t block_bytes, int q4_0,
                                                                 int nb, int cols, int ntok, const float *prep,
                                                                 float *out) {
    const float *xo = prep + (size_t)ntok * nb, *sums = xo + (size_t)ntok * cols;
    __m256 acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = _mm256_setzero_ps();
    __m128 macc1 = _mm_setzero_ps(); /* one token: lane 1 sums m * s (Q4_0: d * s) */
    __m256 macc = _mm256_setzero_ps(); /* more: lane t sums it for token t */
    const __m256i shifts = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28), low = _mm256_set1_epi32(0x0F);
    for (int b = 0; b < nb; b++) {
        const uint8_t *block = row + (size_t)b * block_bytes;
        /* Q4_1: (d, m) converted together; Q4_0: d alone (the word's upper half would be quants) */
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(q4_0 ? *(const q4_half *)block : *(const q4_word *)block));
        const __m256 d = _mm256_broadcastss_ps(dm);
        const q4_word *word = (const q4_word *)(block + (q4_0 ? 2 : 4)); /* the quants' four words */
        __m256 q[4];
        for (int k = 0; k < 4; k++) /* the broadcast from memory takes no shuffle port */
            q[k] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word[k]), shifts), low));
        for (int t = 0; t < ntok; t++) {
            const float *xb = xo + (size_t)t * cols + (size_t)b * QK;
            __m256 p = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
            p = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), p);
            p = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), p);
            p = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), p);
            acc[t] = _mm256_fmadd_ps(p, d, acc[t]);
        }
        /* the same multiply-add of m (or d) and each token's block sum either way, so the same bits in any batch */
        const float *lanes = sums + 8 * (size_t)b;
        if (ntok == 1)
            macc1 = _mm_fmadd_ps(q4_0 ? _mm256_castps256_ps128(d) : dm, _mm_loadu_ps(lanes), macc1);
        else
            macc = _mm256_fmadd_ps(q4_0 ? d : _mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_loadu_ps(lanes), macc);
    }
    float m_terms[8];
    _mm256_storeu_ps(m_terms, macc);
    if (ntok == 1) m_terms[0] = _mm_cvtss_f32(_mm_movehdup_ps(macc1));
    /* Q4_0: sum_b (-8 d_b) s_b as -8 * sum_b d_b s_b, the same bits (a power of two scales exactly) */
    for (int t = 0; t < ntok; t++) out[t] = hsum256(acc[t]) + (q4_0 ? -8.0f * m_terms[t] : m_terms[t]);
}

/* One output row of a Q4_0 weight for `ntok` tokens (AVX2: the ordered row; elsewhere the generic decode). */
static inline __attribute__((always_inline)) void q4_0_row(const block_q4_0 *row, int nb, int cols, int ntok,
                                                           const float *prep, float *out) {
    q4_row_ordered((const uint8_t *)row, sizeof(block_q4_0), 1, nb, cols, ntok, prep, out);
}
#endif

/* out[t] = row . x[t] for `ntok` tokens. xsum: the prepared activations (blockdot_prep): block sums x[t] (nb a
 * token), then, where Q4_ORDERED, the ordered copy (q4_prep). Always inlined into block_rows_n's cases: with
 * `ntok` a constant the per-token accumulators stay in registers (as a variable they lived on the stack: all
 * SmolLM2 Q4_1 products of a token took 6.7 ms against 5.1 at 1 row, 12.3 against 10.4 at 4; 2026-12-04). */
static inline __attribute__((always_inline)) void q4_1_row(const block_q4_1 *row, int nb, const float *x, int cols,
                                                           int ntok, const float *xsum, float *out) {
    float mterm[BLOCKDOT_MAX_TOKENS] = {0};
#if defined(__AVX512F__)
    __m512 acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(0x0F);
    for (int b = 0; b < nb; b++) {
        const __m512i q32 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(q32, low));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q32, 4));
        const __m512 d = _mm512_set1_ps(half_to_float(row[b].d));
        const float m = half_to_float(row[b].m);
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + b * QK;
            __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(xb));
            p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), p);
            acc[t] = _mm512_fmadd_ps(p, d, acc[t]);
            mterm[t] += m * xsum[t * nb + b];
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = _mm512_reduce_add_ps(acc[t]) + mterm[t];
#elif Q4_ORDERED
    (void)mterm;
    (void)x;
    q4_row_ordered((const uint8_t *)row, sizeof(block_q4_1), 0, nb, cols, ntok, xsum, out);
#else
    float acc[BLOCKDOT_MAX_TOKENS] = {0};
    float q[QK];
    for (int b = 0; b < nb; b++) {
        for (int j = 0; j < 16; j++) {
            q[j] = (float)(row[b].qs[j] & 0x0F);
            q[j + 16] = (float)(row[b].qs[j] >> 4);
        }
        const float d = half_to_float(row[b].d), m = half_to_float(row[b].m);
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + b * QK;
            float p = 0.0f;
            for (int j = 0; j < QK; j++) p += q[j] * xb[j];
            acc[t] += d * p;
            mterm[t] += m * xsum[t * nb + b];
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = acc[t] + mterm[t];
#endif
}
#endif
