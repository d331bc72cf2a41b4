/* y[t, o] = sum_k W[o, k] * x[t, k] with the activations x quantised on the fly: the products are integer.
 *
 * Each token row of x is cut into blocks of 32 values, and each block gets its own scale xd and integers xq:
 * - int8 (qdot_matmul): xd = max|x| / 127, xq = round(x / xd) in [-127, 127], as llama.cpp's Q8_0 activations;
 *   the rounding error of a value is at most xd / 2, 1/254 of its block's largest magnitude. (An earlier int8
 *   attempt through fbgemm used one scale per batch, and lost.)
 * - 16-bit (qdot16_matmul): xd = max|x| / 32639 and xq = 256 h + l, held as two int8 planes h and l in
 *   [-128, 127], so the same byte products serve: sum q xq = 256 sum q h + sum q l, exact. 257 times finer than int8
 *   (1/65278 of the block's largest magnitude), about twice its integer work. The planes only meet unsigned weights
 *   (Q4_0 and Q5_0 take their offset as a min; Q8_0 multiplies words), whose products a -128 cannot upset (the sign
 *   trick of int8's signed kinds could not negate it). The K-quants take the activations as words
 *   for calls of 2 tokens or more (dot_w16: their weights widened once per super-block, then one word product per
 *   16 values and token, half the planes' instructions): the same exact integers, so the same bits.
 * xs = xd * sum(xq) per block and the same per 16 values (s16) serve the weights' minimum and offset terms. A block
 * holding NaN or inf gets the scale NaN (its integers 0), so its token's outputs are NaN, not finite garbage.
 *
 * Per block of 32 weights (a K-quant sub-block of 32 included), with the weight's integers q, scale dw and min m:
 *   sum_j w_j x_j ~ (dw * xd) * sum_j q_j xq_j  (+ m * xs)
 * The inner sum is exact integer arithmetic: uint8 x int8 products into int32 lanes, then one float multiply-add
 * per block. Signed weights (Q4_0, Q5_0 after their offset, Q8_0) use |q| x sign(q) xq. Q6_K keeps its unsigned
 * 0..63 and takes the offset -32 through s16; its 16 sums of 16 values per super-block reduce side by side (sums16)
 * and take their scales in floats. Q4_K and Q5_K reduce a super-block's 8 sub-blocks' integer sums side by side
 * (sums8) and scale them in one vector: that float work per sub-block, and unpacking the 6-bit scales a byte at a
 * time, had been most of their time (4096 x 4096, one token, 2 threads: Q4_K 0.43 -> 0.26-0.29 ms, 2026-12-05).
 * No int16 pair sum saturates and no int32 lane overflows at either width (AVX2's pair sums are at most
 * 2 * 127 * 127 < 2^15, int8 Q8_0's; 16-bit planes at most 2 * 63 * 128, Q6_K's; words at most 2 * 127 * 32639);
 * tests/runtime/native/test_qdot.py checks the extremes.
 *
 * Vector paths, chosen at build time (-march=native): AVX-512 VNNI with VL (vpdpbusd on 256-bit registers),
 * AVX-VNNI (its VEX form), AVX2 (vpmaddubsw + vpmaddwd), else portable C with integer sums that the compiler
 * vectorises. `qdot_path()` names the one built. Kinds and the argument checks are blockdot.c's.
 * A row's arithmetic for a token never depends on how many tokens share the call. (Reading Q4_1 rows four at a
 * time, 15-20% faster on cached blocks, made SmolLM2's 120 decode products 25% slower with the weights streaming
 * from memory, int8 4.4 against 3.4 ms: one row at a time since 2026-12-05.)
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_blocks.h"
#include "thread_rows.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QDOT_PATH 3
#elif defined(__AVXVNNI__)
#define QDOT_PATH 2
#elif defined(__AVX2__) && defined(__FMA__)
#define QDOT_PATH 1
#else
#define QDOT_PATH 0
#endif

#if QDOT_PATH > 0
#include <immintrin.h>
#endif

#define QDOT_STACK_BYTES 65536 /* activations of up to 8 tokens x 1536 columns at 16 bits (planes and words) */

int blockdot_check_parts(int nparts, const int *kinds, const int *rows, int cols, int ntok, int ldy, int *start);

/* 3: AVX-512 VNNI, 2: AVX-VNNI, 1: AVX2, 0: portable C. */
int qdot_path(void) { return QDOT_PATH; }

#include "qdot_acts.h"

#if QDOT_PATH > 0
#include "qdot_vec.h"

#define XQ(t, blk) _mm256_loadu_si256((const __m256i *)(a->q + (size_t)(t) * a->cols + (size_t)(blk) * QK))
#define XL(t, blk) _mm256_loadu_si256((const __m256i *)(a->ql + (size_t)(t) * a->cols + (size_t)(blk) * QK))
/* Unsigned weights u times token t's block blk. `wide`: a constant. Signed weights w (|w| in aw) at int8: DOT_S. */
#define DOT_U(u, t, blk) (wide ? dot_us2((u), XQ(t, blk), XL(t, blk)) : dot_us((u), XQ(t, blk)))
#define DOT_S(aw, w, t, blk) dot_us((aw), _mm256_sign_epi8(XQ(t, blk), (w)))
#define XV(t, blk) (a->v + (size_t)(t) * a->cols + (size_t)(blk) * QK)
/* Unsigned K-quant weights of sub-block k (bytes u, or words wq[k] when `words`) times token t's block blk. */
#define DOT_K(u, k, t, blk) (words ? dot_w16(wq[k], XV(t, blk)) : DOT_U((u), t, blk))
#define XD(t, blk) a->d[(size_t)(t) * a->nb + (blk)]
#define XS(t, blk) a->s[(size_t)(t) * a->nb + (blk)]

/* One block of unsigned weights u (0..31) with weight scale dw into each token's accumulator. */
#define ACC_UNSIGNED(u, dw, blk)                                                                                   \
    for (int t = 0; t < ntok; t++)                                                                                 \
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT_U((u), t, blk)), _mm256_set1_ps((dw) * XD(t, blk)),    \
                                 acc[t]);

/* The same for signed weights w: |w| x sign(xq, w). */
#define ACC_SIGNED(w, dw, blk)                                                                                     \
    {                                                                                                              \
        const __m256i aw_ = _mm256_sign_epi8((w), (w));                                                            \
        for (int t = 0; t < ntok; t++)                                                                             \
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT_S(aw_, (w), t, blk)),           \
                                     _mm256_set1_ps((dw) * XD(t, blk)), acc[t]);                                    \
    }

static inline __attribute__((always_inline)) void row_kind(int kind, int wide, const uint8_t *row, const acts *a,
                                                           int ntok, float *out) {
    __m256 acc[BLOCKDOT_MAX_TOKENS], acc2[BLOCKDOT_MAX_TOKENS]; /* acc2: the K-quants' min terms */
    /* 16-bit activations for 2 tokens or more: a K-quant super-block's weights widened to words once (wq), each
     * token's products on words (dot_w16: the same integers as the planes, half the instructions per token) */
    const int words = wide && ntok > 1;
    _Alignas(32) int16_t wq[8][QK];
    float extra[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) {
        acc[t] = acc2[t] = _mm256_setzero_ps();
        extra[t] = 0.0f;
    }
    const int nb = a->nb;
    switch (kind) {
    case KIND_Q4_0: /* 16-bit: the stored 0..15 unsigned, the offset -8 d as a min */
        for (int b = 0; b < nb; b++) {
            const block_q4_0 *w = (const block_q4_0 *)row + b;
            const float d = half_to_float(w->d);
            if (wide) {
                const __m256i u = nibbles32(w->qs);
                ACC_UNSIGNED(u, d, b)
                for (int t = 0; t < ntok; t++) extra[t] += (-8.0f * d) * XS(t, b);
            } else {
                const __m256i q = _mm256_sub_epi8(nibbles32(w->qs), _mm256_set1_epi8(8));
                ACC_SIGNED(q, d, b)
            }
        }
        break;
    case KIND_Q4_1:
        for (int b = 0; b < nb; b++) {
            const block_q4_1 *w = (const block_q4_1 *)row + b;
            const __m256i q = nibbles32(w->qs);
            const float m = half_to_float(w->m);
            ACC_UNSIGNED(q, half_to_float(w->d), b)
            for (int t = 0; t < ntok; t++) extra[t] += m * XS(t, b);
        }
        break;
    case KIND_Q5_0: /* 16-bit: the stored 0..31 unsigned, the offset -16 d as a min */
        for (int b = 0; b < nb; b++) {
            const block_q5_0 *w = (const block_q5_0 *)row + b;
            const __m256i u = _mm256_or_si256(nibbles32(w->qs), qh_bits(w->qh));
            const float d = half_to_float(w->d);
            if (wide) {
                ACC_UNSIGNED(u, d, b)
                for (int t = 0; t < ntok; t++) extra[t] += (-16.0f * d) * XS(t, b);
            } else {
                ACC_SIGNED(_mm256_sub_epi8(u, _mm256_set1_epi8(16)), d, b)
            }
        }
        break;
    case KIND_Q5_1:
        for (int b = 0; b < nb; b++) {
            const block_q5_1 *w = (const block_q5_1 *)row + b;
            const __m256i q = _mm256_or_si256(nibbles32(w->qs), qh_bits(w->qh));
            const float m = half_to_float(w->m);
            ACC_UNSIGNED(q, half_to_float(w->d), b)
            for (int t = 0; t < ntok; t++) extra[t] += m * XS(t, b);
        }
        break;
    case KIND_Q8_0: /* 16-bit: the signed weights as words (dot_w16), no plane meets a sign */
        for (int b = 0; b < nb; b++) {
            const block_q8_0 *w = (const block_q8_0 *)row + b;
            const __m256i q = _mm256_loadu_si256((const __m256i *)w->qs);
            const float d = half_to_float(w->d);
            if (wide) {
                _Alignas(32) int16_t qw[QK];
                widen_words(q, 1, qw);
                for (int t = 0; t < ntok; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_w16(qw, XV(t, b))), _mm256_set1_ps(d * XD(t, b)),
                                             acc[t]);
            } else {
                ACC_SIGNED(q, d, b)
            }
        }
        break;
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K;
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int sb = 0; sb < nb / 8; sb++) {
            const block_q4_K *w4 = (const block_q4_K *)row + sb;
            const block_q5_K *w5 = (const block_q5_K *)row + sb;
            uint64_t sc, mn;
            k_scales_mins_packed(five ? w5->scales : w4->scales, &sc, &mn);
            const float d = half_to_float(five ? w5->d : w4->d), dmin = half_to_float(five ? w5->dmin : w4->dmin);
            const uint8_t *qs = five ? w5->qs : w4->qs;
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)w5->qh) : _mm256_setzero_si256();
            __m256i q[8]; /* the super-block's 8 sub-blocks of unsigned values */
            for (int i = 0; i < 4; i++) {
                const __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
                q[2 * i] = _mm256_and_si256(bytes, low);
                q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
            }
            if (five)
                for (int s = 0; s < 8; s++) {
                    const __m256i bit = _mm256_set1_epi8((char)(1 << s));
                    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                    q[s] = _mm256_or_si256(q[s], _mm256_and_si256(set, _mm256_set1_epi8(16)));
                }
            if (words)
                for (int s = 0; s < 8; s++) widen_words(q[s], 0, wq[s]);
            /* per token: the 8 sub-blocks' integer sums side by side (sums8), times their 8 scales in one vector;
             * the min terms likewise (one float multiply-add per 32 values cost more than the integer work) */
            const __m256 dsv = _mm256_mul_ps(_mm256_set1_ps(d), widen8(sc));
            const __m256 dmv = _mm256_mul_ps(_mm256_set1_ps(dmin), widen8(mn));
            for (int t = 0; t < ntok; t++) {
                __m256i p[8];
                for (int s = 0; s < 8; s++) p[s] = DOT_K(q[s], s, t, 8 * sb + s);
                const size_t i0 = (size_t)t * a->nb + 8 * (size_t)sb;
                const __m256 scale = _mm256_mul_ps(dsv, _mm256_loadu_ps(a->d + i0));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums8(p)), scale, acc[t]);
                acc2[t] = _mm256_fmadd_ps(dmv, _mm256_loadu_ps(a->s + i0), acc2[t]);
            }
        }
        for (int t = 0; t < ntok; t++) extra[t] -= hsum256(acc2[t]);
        break;
    }
    case KIND_Q6_K: {
        /* w = d sc (q - 32) with q unsigned (0..63): each 16 values' integer sum of q xq, times d sc xd in floats,
         * and the offset -32 d sc times each 16 values' scaled activation sum (s16), in acc2: no sign work and no
         * 16-bit scale products per token. Group k (values 32 k .. 32 k + 31 of the super-block, activation block
         * 8 sb + k) takes scales 2 k and 2 k + 1; its integer sums reduce with the other 7 groups' side by side
         * (sums16), and one float multiply-add per 8 of them. */
        const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
        /* scales 0, 2, 4, 6, 1, 3, 5, 7 (then 8 + the same): the order sums16 leaves the groups' halves in */
        const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        for (int sb = 0; sb < nb / 8; sb++) {
            const block_q6_K *w = (const block_q6_K *)row + sb;
            const float d = half_to_float(w->d);
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)w->scales);
            const __m256 off = _mm256_set1_ps(-32.0f * d);
            const __m256 off_lo = _mm256_mul_ps(off, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)));
            const __m256 off_hi = _mm256_mul_ps(off, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))));
            const __m128i sorted = _mm_shuffle_epi8(sc8, order);
            const __m256 dv = _mm256_set1_ps(d);
            const __m256 ws[2] = {_mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sorted))),
                                  _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sorted, 8))))};
            __m256i q[8];
            for (int h = 0; h < 2; h++) {
                const __m256i la = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h));
                const __m256i lb = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
                const __m256i lo4[4] = {_mm256_and_si256(la, low), _mm256_and_si256(lb, low),
                                        _mm256_and_si256(_mm256_srli_epi16(la, 4), low),
                                        _mm256_and_si256(_mm256_srli_epi16(lb, 4), low)};
                const __m256i hi2[4] = {_mm256_and_si256(qh, two), _mm256_and_si256(_mm256_srli_epi16(qh, 2), two),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 4), two),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 6), two)};
                for (int g = 0; g < 4; g++) q[4 * h + g] = _mm256_or_si256(lo4[g], _mm256_slli_epi16(hi2[g], 4));
            }
            if (words)
                for (int k = 0; k < 8; k++) widen_words(q[k], 0, wq[k]);
            for (int t = 0; t < ntok; t++) {
                const float *s16 = a->s16 + 2 * ((size_t)t * a->nb + 8 * (size_t)sb);
                acc2[t] = _mm256_fmadd_ps(off_lo, _mm256_loadu_ps(s16), acc2[t]);
                acc2[t] = _mm256_fmadd_ps(off_hi, _mm256_loadu_ps(s16 + 8), acc2[t]);
                __m256i p[8];
                for (int k = 0; k < 8; k++) p[k] = DOT_K(q[k], k, t, 8 * sb + k);
                const float *xd = a->d + (size_t)t * a->nb + 8 * (size_t)sb;
                for (int half = 0; half < 2; half++) {
                    /* lanes 0-3: groups 4 half .. 4 half + 3's first 16 values; lanes 4-7: their second 16 */
                    const __m256i *g4 = p + 4 * half;
                    const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(g4[0], g4[1]), _mm256_hadd_epi32(g4[2], g4[3]));
                    const __m128i x4 = _mm_loadu_si128((const __m128i *)(xd + 4 * half));
                    const __m256 xd8 = _mm256_castsi256_ps(_mm256_set_m128i(x4, x4));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(ws[half], xd8), acc[t]);
                }
            }
        }
        for (int t = 0; t < ntok; t++) extra[t] += hsum256(acc2[t]);
        break;
    }
    default:
        break;
    }
    for (int t = 0; t < ntok; t++) out[t] = hsum256(acc[t]) + extra[t];
}

#else /* portable C */
#include "qdot_portable.h"
#endif

/* A copy of row_kind per token count and activation width, so that each one's loops are unrolled with the
 * accumulators in registers. Past SPLIT_TOKENS tokens a row is done in two passes over its blocks (the first
 * SPLIT_TOKENS tokens, then the rest): more accumulators than registers spilled, 3x slower at 8 tokens (Q6_K). */
#ifndef SPLIT_TOKENS
#define SPLIT_TOKENS 4
#endif
#define ROW_FN(name, wide, n)                                                                                      \
    static void name(int kind, const uint8_t *row, const acts *a, float *out) {                                    \
        if (n <= SPLIT_TOKENS) {                                                                                   \
            row_kind(kind, wide, row, a, n <= SPLIT_TOKENS ? n : 1, out);                                         \
        } else {                                                                                                   \
            const acts rest = acts_from(a, SPLIT_TOKENS);                                                          \
            row_kind(kind, wide, row, a, SPLIT_TOKENS, out);                                                       \
            row_kind(kind, wide, row, &rest, n > SPLIT_TOKENS ? n - SPLIT_TOKENS : 1, out + SPLIT_TOKENS);         \
        }                                                                                                          \
    }
#define ROW_N(n) ROW_FN(row_n##n, 0, n) ROW_FN(row_w##n, 1, n)
ROW_N(1)
ROW_N(2)
ROW_N(3)
ROW_N(4)
ROW_N(5)
ROW_N(6)
ROW_N(7)
ROW_N(8)
typedef void (*row_fn)(int, const uint8_t *, const acts *, float *);
static const row_fn ROWS[2][BLOCKDOT_MAX_TOKENS + 1] = {
    {0, row_n1, row_n2, row_n3, row_n4, row_n5, row_n6, row_n7, row_n8},
    {0, row_w1, row_w2, row_w3, row_w4, row_w5, row_w6, row_w7, row_w8}};
/* The activations of one product, quantised per 32 values to int8 (wide = 0) or to 16 bits (wide = 1): an `acts`
 * header (64 bytes with its padding), then the values and scales it points to. qdot_prep_bytes: the bytes they
 * take for `ntok` rows of `cols` values (64-byte aligned storage). */
#define QDOT_HEAD 64
_Static_assert(sizeof(acts) <= QDOT_HEAD, "acts must fit its header");

size_t qdot_prep_bytes(int wide, int ntok, int cols) {
    const size_t nq = (size_t)ntok * cols, nb = (size_t)ntok * (cols / QK);
    return QDOT_HEAD + (wide ? 4 : 1) * nq + 4 * sizeof(float) * nb;
}

/* Quantise `ntok` rows of x into `buf` (qdot_prep_bytes of 64-byte aligned storage), by the calling thread: a few
 * microseconds at most, measured as fast as a loop shared out in the region, and no barrier between them. */
void qdot_prep(int wide, const float *x, int ntok, int cols, void *buf) {
    const int nb = cols / QK;
    const size_t nq = (size_t)ntok * cols;
    float *xd = (float *)(void *)((unsigned char *)buf + QDOT_HEAD), *xs = xd + (size_t)ntok * nb;
    float *xs16 = xs + (size_t)ntok * nb;
    int16_t *xv = wide ? (int16_t *)(void *)(xs16 + 2 * (size_t)ntok * nb) : NULL;
    int8_t *xq = wide ? (int8_t *)(xv + nq) : (int8_t *)(xs16 + 2 * (size_t)ntok * nb), *xl = wide ? xq + nq : NULL;
    *(acts *)buf = (acts){xq, xl, xv, xd, xs, xs16, cols, nb};
    for (int i = 0; i < ntok * nb; i++) quantise_block(x, cols, nb, i, xq, xl, xv, xd, xs, xs16);
}

/* What the threads' shares split: a checked product's output rows in groups of four. */
int qdot_units(int total) { return (total + 3) / 4; }

/* Groups of four rows per claim of a product whose first part is of `kind`. */
int qdot_chunk(int kind, int cols) { return row_chunk(4 * (long)(cols / block_elems(kind)) * (long)block_bytes(kind)); }

/* Groups [g0, g1) of four output rows of a checked product (blockdot_check_parts: part starts `start`), the
 * activations prepared in `buf` by qdot_prep: the same code whichever thread runs them, so the same bits. */
void qdot_claim_rows(int wide, int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                     int ntok, const void *buf, float *y, int ldy, int g0, int g1) {
    const acts *a = (const acts *)buf;
    const int total = start[nparts];
    const row_fn fn = ROWS[wide][ntok];
    for (int g = g0; g < g1; g++) {
        const int first = 4 * g, end = first + 4 < total ? first + 4 : total;
        int p = 0;
        while (first >= start[p + 1]) p++;
        for (int o = first; o < end; o++) {
            while (o >= start[p + 1]) p++;
            const int kind = kinds[p];
            const size_t row_bytes = (size_t)(cols / block_elems(kind)) * block_bytes(kind);
            float out[BLOCKDOT_MAX_TOKENS];
            fn(kind, (const uint8_t *)data[p] + (size_t)(o - start[p]) * row_bytes, a, out);
            for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = out[t];
        }
    }
}

/* Thread `me`'s groups of a checked product inside a parallel region whose `count` shares split
 * qdot_units(rows) (row_shares_init). No barrier. */
void qdot_team_rows(int wide, int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                    int ntok, const void *buf, float *y, int ldy, row_share *shares, int count, int me) {
    const int chunk = qdot_chunk(kinds[0], cols);
    int g0, g1;
    while (row_next(shares, count, me, chunk, &g0, &g1))
        qdot_claim_rows(wide, nparts, data, kinds, start, cols, ntok, buf, y, ldy, g0, g1);
}

/* The product with the activations quantised per 32 values to int8 (wide = 0) or to 16 bits (wide = 1), for the
 * same arguments as blockdot_matmul. Returns 0, -1 for arguments out of range (nothing is written then), or -2
 * when the activation buffer cannot be allocated. */
static int qdot_run(int wide, int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy) {
    int start[BLOCKDOT_MAX_PARTS + 1];
    if (blockdot_check_parts(nparts, kinds, rows, cols, ntok, ldy, start) != 0) return -1;
    const size_t bytes = qdot_prep_bytes(wide, ntok, cols);
    /* Small calls (every decode product of a 1-2B model) keep the activations on the stack: no allocation. */
    _Alignas(64) unsigned char local[QDOT_STACK_BYTES];
    void *heap = bytes > sizeof local ? aligned_alloc(64, (bytes + 63) / 64 * 64) : NULL;
    if (bytes > sizeof local && heap == NULL) return -2;
    void *buf = heap ? heap : (void *)local;
    qdot_prep(wide, x, ntok, cols, buf);
    const int team = omp_get_max_threads();
    row_share shares[team];
    row_shares_init(shares, team, qdot_units(start[nparts]));
#pragma omp parallel num_threads(team)
    qdot_team_rows(wide, nparts, data, kinds, start, cols, ntok, buf, y, ldy, shares, team, omp_get_thread_num());
    free(heap);
    return 0;
}

/* The product with int8 activations (see the top of this file). */
int qdot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols, const float *x,
                int ntok, float *y, int ldy) {
    return qdot_run(0, nparts, data, kinds, rows, cols, x, ntok, y, ldy);
}

/* The product with 16-bit activations: |v| <= WIDE_MAX per 32 values, 257 times finer than int8. */
int qdot16_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols, const float *x,
                  int ntok, float *y, int ldy) {
    return qdot_run(1, nparts, data, kinds, rows, cols, x, ntok, y, ldy);
}
