/* blockdot.c's own float32 rows of the kinds Q4_K_M and Q5_K_M files hold besides Q8_0: Q5_0, Q4_K, Q5_K and Q6_K
 * (a model whose rows are not whole super-blocks of 256, as SmolLM2's 576-wide ones, falls back to Q5_0).
 *
 * At one token these products are bound by arithmetic, not memory, and the generic row (block_decode.h: a block
 * decoded into a float buffer, then multiplied) spends a third of its time on the buffer's stores and loads. Here the
 * weights' integers go from the block's bytes to float registers and straight into the products, and each kind's
 * scale and offset are applied per block (per sub-block of 32 for Q4_K, per 16 values for Q6_K) as q4_rows.h's Q4_1
 * row does:
 *   Q5_0  w = d (q - 16)          sum_j w_j x_j = d sum_j q_j x_j - 16 d sum_j x_j
 *   Q4_K  w = d sc q - dmin m     sum_j w_j x_j = (d sc) sum_j q_j x_j - (dmin m) sum_j x_j   (per sub-block)
 *   Q5_K  the same, q with a fifth bit
 *   Q6_K  w = d sc (q - 32)       (d sc) sum_j (q_j - 32) x_j                                 (per 16 values)
 * with the block sums of x (xsum, one per 32 values) computed once per call. Another summation order than the
 * generic row's, float32 throughout; a token row's arithmetic does not depend on how many rows share the call.
 * A super-block's scales are unpacked and multiplied in vectors, once (per sub-block scalar work cost a fifth).
 * Measured (one 4096 x 4096 product, one token, 2 threads, the generic row -> these; 2026-12-05, Zen 4): AVX-512
 * Q5_0 0.77 -> 0.62 ms, Q4_K 0.77 -> 0.50, Q5_K 1.03 -> 0.53, Q6_K 0.99 -> 0.66; the AVX2 build on the same CPU
 * Q5_0 1.17 -> 0.83, Q4_K 1.82 -> 0.57, Q5_K 2.33 -> 0.62, Q6_K 2.24 -> 0.67 (Q4_1 0.51 and Q8_0 0.42 for scale).
 *
 * AVX-512: Q5_0 sets each value's fifth bit through a mask register; the K-quants work on 32 bytes at a time and
 * widen them to float32 at the end (wide32), which takes a quarter of the vector slots bit work on int32 lanes
 * does. AVX2 + FMA: the same byte work for all four. Without either, the generic row runs. Included by
 * blockdot.c only, after ggml_blocks.h, <immintrin.h> and q4_rows.h; defines BLOCKDOT_KQUANT_ROWS where built. */
#ifndef KQUANT_ROWS_H
#define KQUANT_ROWS_H

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define BLOCKDOT_KQUANT_ROWS 1

/* 32 values as float32, widened from 32 bytes (value l from byte l), and the vector of partial sums they make. */
#if defined(__AVX512F__)
typedef struct {
    __m512 v[2];
} wide32;
typedef __m512 partials;
#define PARTIALS_ZERO() _mm512_setzero_ps()
#define PARTIALS_FMA(p, s, acc) _mm512_fmadd_ps((p), _mm512_set1_ps(s), (acc))
#define PARTIALS_SUM(acc) _mm512_reduce_add_ps(acc)

/* 32 bytes as 32 float lanes; `sign`: a constant at every call (signed or unsigned bytes). */
static inline __attribute__((always_inline)) __m512 widen16_of(__m128i b, int sign) {
    return _mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
}

static inline __attribute__((always_inline)) wide32 widen_bytes(__m256i b, int sign) {
    wide32 w = {{widen16_of(_mm256_castsi256_si128(b), sign), widen16_of(_mm256_extracti128_si256(b, 1), sign)}};
    return w;
}

/* sum over values lo .. lo + 15 of w * x (half 0: values 0..15, half 1: 16..31), as partial sums. */
static inline __attribute__((always_inline)) partials dot16(wide32 w, int half, const float *xb) {
    return _mm512_mul_ps(w.v[half], _mm512_loadu_ps(xb + 16 * half));
}

/* sum over all 32 values of w * x, as partial sums. */
static inline __attribute__((always_inline)) partials dot32(wide32 w, const float *xb) {
    return _mm512_fmadd_ps(w.v[1], _mm512_loadu_ps(xb + 16), _mm512_mul_ps(w.v[0], _mm512_loadu_ps(xb)));
}
#else
typedef struct {
    __m256 v[4];
} wide32;
typedef __m256 partials;
#define PARTIALS_ZERO() _mm256_setzero_ps()
#define PARTIALS_FMA(p, s, acc) _mm256_fmadd_ps((p), _mm256_set1_ps(s), (acc))
#define PARTIALS_SUM(acc) hsum256(acc)

/* `sign`: a constant at every call (signed or unsigned bytes). */
static inline __attribute__((always_inline)) __m256 widen8_of(__m128i b, int sign) {
    return _mm256_cvtepi32_ps(sign ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

static inline __attribute__((always_inline)) wide32 widen_bytes(__m256i b, int sign) {
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    wide32 w = {{widen8_of(lo, sign), widen8_of(_mm_srli_si128(lo, 8), sign), widen8_of(hi, sign),
                 widen8_of(_mm_srli_si128(hi, 8), sign)}};
    return w;
}

static inline __attribute__((always_inline)) partials dot16(wide32 w, int half, const float *xb) {
    const float *x = xb + 16 * half;
    return _mm256_fmadd_ps(w.v[2 * half + 1], _mm256_loadu_ps(x + 8), _mm256_mul_ps(w.v[2 * half], _mm256_loadu_ps(x)));
}

static inline __attribute__((always_inline)) partials dot32(wide32 w, const float *xb) {
    __m256 p = _mm256_mul_ps(w.v[0], _mm256_loadu_ps(xb));
    p = _mm256_fmadd_ps(w.v[1], _mm256_loadu_ps(xb + 8), p);
    p = _mm256_fmadd_ps(w.v[2], _mm256_loadu_ps(xb + 16), p);
    return _mm256_fmadd_ps(w.v[3], _mm256_loadu_ps(xb + 24), p);
}
#endif

/* One output row of a Q5_0 weight for `ntok` tokens (xsum: block sums of x, `nb` per token). */
static inline __attribute__((always_inline)) void q5_0_row(const block_q5_0 *row, int nb, const float *x, int cols,
                                                           int ntok, const float *xsum, float *out) {
    float mterm[BLOCKDOT_MAX_TOKENS] = {0};
    partials acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = PARTIALS_ZERO();
    for (int b = 0; b < nb; b++) {
        uint32_t h;
        memcpy(&h, row[b].qh, sizeof h);
#if defined(__AVX512F__)
        const __m512i q32 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs));
        const __m512i lo4 = _mm512_and_si512(q32, _mm512_set1_epi32(0x0F)), hi4 = _mm512_srli_epi32(q32, 4);
        const __m512i bit4 = _mm512_set1_epi32(0x10);
        const wide32 w = {{_mm512_cvtepi32_ps(_mm512_mask_or_epi32(lo4, (__mmask16)h, lo4, bit4)),
                           _mm512_cvtepi32_ps(_mm512_mask_or_epi32(hi4, (__mmask16)(h >> 16), hi4, bit4))}};
#else
        const __m128i qs = _mm_loadu_si128((const __m128i *)row[b].qs), low = _mm_set1_epi8(0x0F);
        const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low), _mm_and_si128(qs, low));
        const wide32 w = widen_bytes(_mm256_or_si256(nibbles, fifth_bits(h)), 0);
#endif
        const float d = half_to_float(row[b].d);
        for (int t = 0; t < ntok; t++) {
            acc[t] = PARTIALS_FMA(dot32(w, x + (size_t)t * cols + b * QK), d, acc[t]);
            mterm[t] += (-16.0f * d) * xsum[t * nb + b];
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = PARTIALS_SUM(acc[t]) + mterm[t];
}

/* A Q4_K or Q5_K super-block's 8 sub-block scales times d and mins times dmin, as floats (ds, dm): the 6-bit
 * fields unpacked four at a time (k_scales_mins_packed), then widened and scaled in vectors. `b`: the block's
 * d, dmin and scales, which both kinds lay out alike. */
static inline __attribute__((always_inline)) void k_scales(const block_q4_K *b, float ds[8], float dm[8]) {
    uint64_t sc, mn;
    k_scales_mins_packed(b->scales, &sc, &mn);
    const __m256 d = _mm256_set1_ps(half_to_float(b->d)), dmin = _mm256_set1_ps(half_to_float(b->dmin));
    _mm256_storeu_ps(ds, _mm256_mul_ps(widen8(sc), d));
    _mm256_storeu_ps(dm, _mm256_mul_ps(widen8(mn), dmin));
}

/* One output row of a Q4_K (five = 0) or Q5_K (five = 1) weight for `ntok` tokens (`nsb` super-blocks; xsum per
 * 32 values). Sub-blocks 2i and 2i + 1 are the low and high nibbles of the same 32 bytes, and Q5_K's fifth bit of
 * sub-block s is bit s of each of its 32 qh bytes; a super-block's min terms are one 8-lane product with its 8
 * block sums of x. `five` is a constant at every call, so each kind gets its own loop. */
static inline __attribute__((always_inline)) void k45_row(const uint8_t *row, int five, int nsb, const float *x,
                                                          int cols, int ntok, const float *xsum, float *out) {
    const size_t bytes_per_block = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const int nb = nsb * 8;
    partials acc[BLOCKDOT_MAX_TOKENS];
    __m256 mins[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) {
        acc[t] = PARTIALS_ZERO();
        mins[t] = _mm256_setzero_ps();
    }
    const __m256i low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk0 = row + (size_t)sb * bytes_per_block;
        const uint8_t *qs = five ? ((const block_q5_K *)blk0)->qs : ((const block_q4_K *)blk0)->qs;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)((const block_q5_K *)blk0)->qh) : low;
        float ds[8], dm[8];
        k_scales((const block_q4_K *)blk0, ds, dm);
        const __m256 dmv = _mm256_loadu_ps(dm);
        for (int t = 0; t < ntok; t++)
            mins[t] = _mm256_add_ps(mins[t], _mm256_mul_ps(dmv, _mm256_loadu_ps(xsum + (size_t)t * nb + 8 * sb)));
        for (int i = 0; i < 4; i++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
            for (int k = 0; k < 2; k++) {
                const int s = 2 * i + k, blk = 8 * sb + s;
                __m256i q = _mm256_and_si256(k ? _mm256_srli_epi16(bytes, 4) : bytes, low);
                if (five) /* bit s of each qh byte to bit 4 (16-bit shifts: what crosses a byte is masked off) */
                    q = _mm256_or_si256(q, _mm256_and_si256(s < 4 ? _mm256_slli_epi16(qh, 4 - s)
                                                                   : _mm256_srli_epi16(qh, s - 4), bit4));
                const wide32 w = widen_bytes(q, 0);
                for (int t = 0; t < ntok; t++)
                    acc[t] = PARTIALS_FMA(dot32(w, x + (size_t)t * cols + (size_t)blk * QK), ds[s], acc[t]);
            }
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = PARTIALS_SUM(acc[t]) - hsum256(mins[t]);
}

/* Q6_K's values 32 g .. 32 g + 31 of half h of a super-block as signed bytes q - 32: low 4 bits from ql (low or
 * high nibbles of 32 bytes), top 2 from qh (bits 2g, 2g + 1 of 32 bytes), as dequant.py lays them out. */
static inline __attribute__((always_inline)) __m256i q6_k_values(const block_q6_K *b, int h, int g) {
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    const __m256i l4 = _mm256_and_si256(g >> 1 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
    /* bits 2g, 2g + 1 of each byte to bits 4, 5 (16-bit shifts: what crosses a byte is masked off) */
    const __m256i top = g == 0   ? _mm256_slli_epi16(qh, 4)
                        : g == 1 ? _mm256_slli_epi16(qh, 2)
                        : g == 2 ? qh
                                 : _mm256_srli_epi16(qh, 2);
    const __m256i q = _mm256_or_si256(l4, _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
}

/* One output row of a Q6_K weight for `ntok` tokens (`nsb` super-blocks): each 16 values' products, times d sc. */
static inline __attribute__((always_inline)) void q6_k_row(const block_q6_K *row, int nsb, const float *x, int cols,
                                                           int ntok, float *out) {
    partials acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = PARTIALS_ZERO();
    for (int sb = 0; sb < nsb; sb++) {
        const block_q6_K *b = row + sb;
        float ds[16]; /* d times each 16 values' scale, widened in two vectors */
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const __m256 d = _mm256_set1_ps(half_to_float(b->d));
        _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
        _mm256_storeu_ps(ds + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) {
                const wide32 w = widen_bytes(q6_k_values(b, h, g), 1);
                const int e0 = 128 * h + 32 * g;
                for (int t = 0; t < ntok; t++) {
                    const float *xb = x + (size_t)t * cols + (size_t)sb * QK_K + e0;
                    acc[t] = PARTIALS_FMA(dot16(w, 0, xb), ds[e0 / 16], acc[t]);
                    acc[t] = PARTIALS_FMA(dot16(w, 1, xb), ds[e0 / 16 + 1], acc[t]);
                }
            }
    }
    for (int t = 0; t < ntok; t++) out[t] = PARTIALS_SUM(acc[t]);
}
#endif

#endif
