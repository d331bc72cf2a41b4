/* qdot.c's vector helpers (QDOT_PATH 1-3, 256-bit registers): byte and word dot products, the widening of weights
 * to words, nibble and fifth-bit unpacking, and the side-by-side lane sums. Included by qdot.c only, after
 * ggml_blocks.h and <immintrin.h>, with QDOT_PATH defined. */
#ifndef QDOT_VEC_H
#define QDOT_VEC_H

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

/* 32 bytes as 32 words at w, in dot_w16's order; `sign`: a constant at every call (signed or unsigned bytes). */
static inline __attribute__((always_inline)) void widen_words(__m256i b, int sign, int16_t *w) {
    const __m256i order = _mm256_permute4x64_epi64(b, 0xD8); /* bytes 0-7, 16-23, 8-15, 24-31 */
    const __m128i lo = _mm256_castsi256_si128(order), hi = _mm256_extracti128_si256(order, 1);
    _mm256_storeu_si256((__m256i *)w, sign ? _mm256_cvtepi8_epi16(lo) : _mm256_cvtepu8_epi16(lo));
    _mm256_storeu_si256((__m256i *)(w + 16), sign ? _mm256_cvtepi8_epi16(hi) : _mm256_cvtepu8_epi16(hi));
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
#endif
