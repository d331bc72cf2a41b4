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

#if QDOT_PATH > 0
/* uint8 x int8 -> 8 int32 lanes, each the sum of 4 neighbouring products (exact: no lane can overflow here). */
static inline __m256i dot_us(__m256i u, __m256i s) {
#if QDOT_PATH == 3
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif QDOT_PATH == 2
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* The same for 16-bit activations in planes h (high) and l (low), unsigned weights u of at most 63:
 * u . (256 h + l), exact. */
static inline __m256i dot_us2(__m256i u, __m256i h, __m256i l) {
#if QDOT_PATH == 3
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(dot_us(u, h), 8), u, l);
#elif QDOT_PATH == 2
    return _mm256_dpbusd_avx_epi32(_mm256_slli_epi32(dot_us(u, h), 8), u, l);
#else /* int16 pair sums are at most 2 * 63 * 128, so they do not saturate */
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, h), _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, l), _mm256_set1_epi16(1)));
#endif
}

/* 32 16-bit weights w (at most 127 in magnitude) times 32 16-bit activations x, as 8 int32 lanes (exact). Both in the
 * order values 0-7, 16-23, 8-15, 24-31 (widen_words; quantise_block for x), so that lanes 0-3 sum values 0-15 and
 * lanes 4-7 values 16-31, as dot_us2's do (Q6_K's two scales per 32 rely on it). The same integer sums as dot_us2 on
 * the planes of x, with half its instructions per token once the weights are words: the K-quants widen their
 * weights once per super-block for calls of 2 tokens or more. */
static inline __m256i dot_w16(const int16_t *w, const int16_t *x) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)w), w1 = _mm256_loadu_si256((const __m256i *)(w + 16));
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 16));
#if QDOT_PATH == 3
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(w0, x0), w1, x1);
#elif QDOT_PATH == 2
    return _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w0, x0), w1, x1);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
#endif
}

/* 32 signed bytes as 32 words at w, in dot_w16's order. */
static inline void widen_words_signed(__m256i q, int16_t *w) {
    const __m256i order = _mm256_permute4x64_epi64(q, 0xD8); /* bytes 0-7, 16-23, 8-15, 24-31 */
    _mm256_storeu_si256((__m256i *)w, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(order)));
    _mm256_storeu_si256((__m256i *)(w + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(order, 1)));
}

/* 32 unsigned bytes as 32 words at w, in dot_w16's order. */
static inline void widen_words(__m256i u, int16_t *w) {
    const __m256i order = _mm256_permute4x64_epi64(u, 0xD8); /* bytes 0-7, 16-23, 8-15, 24-31 */
    _mm256_storeu_si256((__m256i *)w, _mm256_cvtepu8_epi16(_mm256_castsi256_si128(order)));
    _mm256_storeu_si256((__m256i *)(w + 16), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(order, 1)));
}

/* 16 packed bytes -> 32 values: low nibbles first, then the high ones. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* A Q5 block's qh as its fifth bits (ggml_blocks.h). */
static inline __m256i qh_bits(const uint8_t *qh) {
    uint32_t v;
    memcpy(&v, qh, sizeof v);
    return fifth_bits(v);
}

/* The lane sums of 8 vectors side by side: lane s of the result is the sum of p[s]'s 8 lanes (exact integers). */
static inline __m256i sums8(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* a: sums of p[0..3] over lanes 0-3 (low half) and 4-7 (high half); b the same for p[4..7] */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

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
                widen_words_signed(q, qw);
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
                for (int s = 0; s < 8; s++) widen_words(q[s], wq[s]);
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
                for (int k = 0; k < 8; k++) widen_words(q[k], wq[k]);
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

/* Weight block `blk` of a row as int16 values (a Q6_K value times its 16-element scale), with the float scale
 * that multiplies the integer sum and the min that multiplies xs. */
static inline void unpack_block(int kind, const uint8_t *row, int blk, int16_t *v, float *dw, float *m) {
    *m = 0.0f;
    switch (kind) {
    case KIND_Q4_0:
    case KIND_Q4_1: {
        const int one = kind == KIND_Q4_1;
        const uint8_t *qs = one ? ((const block_q4_1 *)row)[blk].qs : ((const block_q4_0 *)row)[blk].qs;
        for (int j = 0; j < 16; j++) {
            v[j] = (int16_t)((qs[j] & 0x0F) - (one ? 0 : 8));
            v[j + 16] = (int16_t)((qs[j] >> 4) - (one ? 0 : 8));
        }
        *dw = half_to_float(one ? ((const block_q4_1 *)row)[blk].d : ((const block_q4_0 *)row)[blk].d);
        if (one) *m = half_to_float(((const block_q4_1 *)row)[blk].m);
        break;
    }
    case KIND_Q5_0: {
        const block_q5_0 *w = (const block_q5_0 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = (int16_t)(q5_value(w->qs, w->qh, j) - 16);
        *dw = half_to_float(w->d);
        break;
    }
    case KIND_Q5_1: {
        const block_q5_1 *w = (const block_q5_1 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = (int16_t)q5_value(w->qs, w->qh, j);
        *dw = half_to_float(w->d);
        *m = half_to_float(w->m);
        break;
    }
    case KIND_Q8_0: {
        const block_q8_0 *w = (const block_q8_0 *)row + blk;
        for (int j = 0; j < QK; j++) v[j] = w->qs[j];
        *dw = half_to_float(w->d);
        break;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K, s = blk % 8;
        const block_q4_K *w4 = (const block_q4_K *)row + blk / 8;
        const block_q5_K *w5 = (const block_q5_K *)row + blk / 8;
        uint8_t sc[8], mn[8];
        k_scales_mins(five ? w5->scales : w4->scales, sc, mn);
        const uint8_t *q = (five ? w5->qs : w4->qs) + 32 * (s / 2);
        for (int l = 0; l < QK; l++) {
            int x = (q[l] >> (4 * (s % 2))) & 0x0F;
            if (five) x |= ((w5->qh[l] >> s) & 1) << 4;
            v[l] = (int16_t)x;
        }
        *dw = half_to_float(five ? w5->d : w4->d) * (float)sc[s];
        *m = -(half_to_float(five ? w5->dmin : w4->dmin) * (float)mn[s]);
        break;
    }
    case KIND_Q6_K: {
        const block_q6_K *w = (const block_q6_K *)row + blk / 8;
        const int h = (blk % 8) / 4, g = blk % 4;
        const uint8_t *ql = w->ql + 64 * h, *qh = w->qh + 32 * h;
        for (int l = 0; l < QK; l++) {
            const int lo = g < 2 ? ql[l + 32 * g] & 0x0F : ql[l + 32 * (g - 2)] >> 4;
            const int x = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
            v[l] = (int16_t)(x * w->scales[8 * h + 2 * g + l / 16]);
        }
        *dw = half_to_float(w->d);
        break;
    }
    default:
        *dw = 0.0f;
        memset(v, 0, QK * sizeof *v);
    }
}

static inline void row_kind(int kind, int wide, const uint8_t *row, const acts *a, int ntok, float *out) {
    float acc[BLOCKDOT_MAX_TOKENS] = {0};
    int16_t v[QK];
    for (int b = 0; b < a->nb; b++) {
        float dw, m;
        unpack_block(kind, row, b, v, &dw, &m);
        for (int t = 0; t < ntok; t++) {
            const int8_t *xq = a->q + (size_t)t * a->cols + (size_t)b * QK;
            const int8_t *xl = wide ? a->ql + (size_t)t * a->cols + (size_t)b * QK : NULL;
            int64_t sum = 0; /* 16-bit activations times Q6_K's scaled values pass 2^31 over a block */
            for (int j = 0; j < QK; j++) sum += (int64_t)v[j] * (wide ? 256 * xq[j] + xl[j] : xq[j]);
            const size_t i = (size_t)t * a->nb + b;
            acc[t] += (dw * a->d[i]) * (float)sum + m * a->s[i];
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = acc[t];
}
#endif

/* Token t0's activations onward, as their own call's. */
static inline acts acts_from(const acts *a, int t0) {
    const size_t q = (size_t)t0 * a->cols, b = (size_t)t0 * a->nb;
    const acts out = {a->q + q,     a->ql ? a->ql + q : NULL, a->v ? a->v + q : NULL, a->d + b, a->s + b,
                      a->s16 + 2 * b, a->cols,                 a->nb};
    return out;
}

/* A copy of row_kind per token count and activation width, so that each one's loops are unrolled with the
 * accumulators in registers. Past SPLIT_TOKENS tokens a row is done in two passes over its blocks (the first
 * SPLIT_TOKENS tokens, then the rest): more accumulators than registers spilled, 3x slower at 8 tokens (Q6_K). */
#ifndef SPLIT_TOKENS
#define SPLIT_TOKENS 4
#endif
#define ROW_N(n)                                                                                                   \
    static void row_n##n(int kind, const uint8_t *row, const acts *a, float *out) {                                \
        if (n <= SPLIT_TOKENS) {                                                                                   \
            row_kind(kind, 0, row, a, n <= SPLIT_TOKENS ? n : 1, out);                                            \
        } else {                                                                                                   \
            const acts rest = acts_from(a, SPLIT_TOKENS);                                                          \
            row_kind(kind, 0, row, a, SPLIT_TOKENS, out);                                                          \
            row_kind(kind, 0, row, &rest, n > SPLIT_TOKENS ? n - SPLIT_TOKENS : 1, out + SPLIT_TOKENS);            \
        }                                                                                                          \
    }                                                                                                              \
    static void row_w##n(int kind, const uint8_t *row, const acts *a, float *out) {                                \
        if (n <= SPLIT_TOKENS) {                                                                                   \
            row_kind(kind, 1, row, a, n <= SPLIT_TOKENS ? n : 1, out);                                            \
        } else {                                                                                                   \
            const acts rest = acts_from(a, SPLIT_TOKENS);                                                          \
            row_kind(kind, 1, row, a, SPLIT_TOKENS, out);                                                          \
            row_kind(kind, 1, row, &rest, n > SPLIT_TOKENS ? n - SPLIT_TOKENS : 1, out + SPLIT_TOKENS);            \
        }                                                                                                          \
    }
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
/* The product with the activations quantised per 32 values to int8 (wide = 0) or to 16 bits (wide = 1), for the
 * same arguments as blockdot_matmul. Returns 0, -1 for arguments out of range (nothing is written then), or -2
 * when the activation buffer cannot be allocated. */
static int qdot_run(int wide, int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy) {
    int start[BLOCKDOT_MAX_PARTS + 1];
    if (blockdot_check_parts(nparts, kinds, rows, cols, ntok, ldy, start) != 0) return -1;
    const int nb = cols / QK;
    const size_t nq = (size_t)ntok * cols, bytes = (wide ? 4 : 1) * nq + 4 * sizeof(float) * (size_t)ntok * nb;
    /* Small calls (every decode product of a 1-2B model) keep the activations on the stack: no allocation. */
    _Alignas(64) unsigned char local[QDOT_STACK_BYTES];
    void *heap = bytes > sizeof local ? malloc(bytes) : NULL;
    if (bytes > sizeof local && heap == NULL) return -2;
    float *xd = heap ? (float *)heap : (float *)(void *)local, *xs = xd + (size_t)ntok * nb;
    float *xs16 = xs + (size_t)ntok * nb;
    int16_t *xv = wide ? (int16_t *)(void *)(xs16 + 2 * (size_t)ntok * nb) : NULL;
    int8_t *xq = wide ? (int8_t *)(xv + nq) : (int8_t *)(xs16 + 2 * (size_t)ntok * nb), *xl = wide ? xq + nq : NULL;
    const acts a = {xq, xl, xv, xd, xs, xs16, cols, nb};
    /* Quantised by the calling thread before the region (a few microseconds at most): no barrier inside it between
     * quantising and the rows (measured as fast as a loop shared out in the region). */
    for (int i = 0; i < ntok * nb; i++) quantise_block(x, cols, nb, i, xq, xl, xv, xd, xs, xs16);
    const int total = start[nparts];
    const row_fn fn = ROWS[wide][ntok];
    const int team = omp_get_max_threads(), groups = (total + 3) / 4; /* output rows in groups of four */
    const int chunk = row_chunk(4 * (long)(cols / block_elems(kinds[0])) * (long)block_bytes(kinds[0]));
    row_share shares[team];
    row_shares_init(shares, team, groups);
#pragma omp parallel num_threads(team)
    {
        int g0, g1;
        while (row_next(shares, team, omp_get_thread_num(), chunk, &g0, &g1))
            for (int g = g0; g < g1; g++) {
                const int first = 4 * g, end = first + 4 < total ? first + 4 : total;
                int p = 0;
                while (first >= start[p + 1]) p++;
                for (int o = first; o < end; o++) {
                    while (o >= start[p + 1]) p++;
                    const int kind = kinds[p];
                    const size_t row_bytes = (size_t)(cols / block_elems(kind)) * block_bytes(kind);
                    float out[BLOCKDOT_MAX_TOKENS];
                    fn(kind, (const uint8_t *)data[p] + (size_t)(o - start[p]) * row_bytes, &a, out);
                    for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = out[t];
                }
            }
    }
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
