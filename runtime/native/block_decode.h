/* The block kinds without a hand-written row in blockdot.c (Q4_0, Q5_1; and Q5_0, Q4_K, Q5_K, Q6_K where that row
 * is not built) decoded into float32, 16 (AVX-512) or 8 (AVX2 + FMA) values at a time, for blockdot.c's generic
 * rows. `decode_block_vec(kind, block, w)` writes the block's `block_elems(kind)` values to w in dequant.py's order
 * and returns 1, or returns 0 for a kind it does not take (the caller's scalar loops decode it then). The same
 * operations on each value, in the same order, as those scalar loops, so the same bits (the kernels are compiled as
 * ISO C: no contraction into fused multiply-adds).
 *
 * Why: the scalar loops ran about 90 cycles a 32-value block; the products of one token of a SmolLM2 Q4_K_M-like
 * file took 38.6 ms, against 7.3 with this and vector sums across a row (2 threads, AVX-512, 2026-12-04). Included
 * by blockdot.c only, after ggml_blocks.h and <immintrin.h>. */
#ifndef BLOCK_DECODE_H
#define BLOCK_DECODE_H

#if defined(__AVX512F__)
/* 16 bytes as 16 int32 lanes. */
static inline __m512i bytes16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }

static inline __attribute__((always_inline)) int decode_block_vec(int kind, const uint8_t *blk, float *w) {
    const __m512i nibble = _mm512_set1_epi32(0x0F);
    switch (kind) {
    case KIND_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)blk;
        const __m512 d = _mm512_set1_ps(half_to_float(b->d));
        const __m512i q = bytes16(b->qs), eight = _mm512_set1_epi32(8);
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, nibble), eight);
        const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
        _mm512_storeu_ps(w, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(w + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
        return 1;
    }
    case KIND_Q5_0:
    case KIND_Q5_1: {
        const int one = kind == KIND_Q5_1;
        const block_q5_0 *b0 = (const block_q5_0 *)blk;
        const block_q5_1 *b1 = (const block_q5_1 *)blk;
        uint32_t h;
        memcpy(&h, one ? b1->qh : b0->qh, sizeof h);
        const __m512 d = _mm512_set1_ps(half_to_float(one ? b1->d : b0->d));
        const __m512 m = _mm512_set1_ps(one ? half_to_float(b1->m) : 0.0f);
        const __m512i q = bytes16(one ? b1->qs : b0->qs), bit4 = _mm512_set1_epi32(16);
        const __m512i off = _mm512_set1_epi32(one ? 0 : 16);
        __m512i lo = _mm512_and_si512(q, nibble), hi = _mm512_srli_epi32(q, 4);
        lo = _mm512_mask_or_epi32(lo, (__mmask16)(h & 0xFFFF), lo, bit4);
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(h >> 16), hi, bit4);
        _mm512_storeu_ps(w, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, off)), d), m));
        _mm512_storeu_ps(w + 16, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, off)), d), m));
        return 1;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K;
        const block_q4_K *b4 = (const block_q4_K *)blk;
        const block_q5_K *b5 = (const block_q5_K *)blk;
        const uint8_t *qs = five ? b5->qs : b4->qs;
        uint8_t sc[8], mn[8];
        k_scales_mins(five ? b5->scales : b4->scales, sc, mn);
        const float d = half_to_float(five ? b5->d : b4->d), dmin = half_to_float(five ? b5->dmin : b4->dmin);
        for (int s = 0; s < 8; s++) {
            const __m512 ds = _mm512_set1_ps(d * (float)sc[s]), dm = _mm512_set1_ps(dmin * (float)mn[s]);
            const uint8_t *q = qs + 32 * (s / 2);
            for (int half = 0; half < 2; half++) {
                __m512i v = _mm512_and_si512(_mm512_srli_epi32(bytes16(q + 16 * half), 4 * (s % 2)), nibble);
                if (five) {
                    const __m512i hb = _mm512_and_si512(_mm512_srli_epi32(bytes16(b5->qh + 16 * half), s),
                                                        _mm512_set1_epi32(1));
                    v = _mm512_or_si512(v, _mm512_slli_epi32(hb, 4));
                }
                _mm512_storeu_ps(w + 32 * s + 16 * half, _mm512_sub_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(v)), dm));
            }
        }
        return 1;
    }
    case KIND_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        const float d = half_to_float(b->d);
        const __m512i two = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                const uint8_t *ql = b->ql + 64 * h + 32 * (g & 1), *qh = b->qh + 32 * h;
                for (int half = 0; half < 2; half++) {
                    const int e0 = 128 * h + 32 * g + 16 * half;
                    const __m512 ds = _mm512_set1_ps(d * (float)b->scales[e0 / 16]);
                    const __m512i l4 = _mm512_srli_epi32(bytes16(ql + 16 * half), 4 * (g >> 1));
                    const __m512i lo = _mm512_and_si512(l4, nibble);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * half), 2 * g), two);
                    const __m512i v = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), bias);
                    _mm512_storeu_ps(w + e0, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(v)));
                }
            }
        }
        return 1;
    }
    default: return 0;
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* 8 bytes as 8 int32 lanes. */
static inline __m256i bytes8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

static inline __attribute__((always_inline)) int decode_block_vec(int kind, const uint8_t *blk, float *w) {
    const __m256i nibble = _mm256_set1_epi32(0x0F), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    switch (kind) {
    case KIND_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)blk;
        const __m256 d = _mm256_set1_ps(half_to_float(b->d));
        const __m256i eight = _mm256_set1_epi32(8);
        for (int j = 0; j < 16; j += 8) {
            const __m256i q = bytes8(b->qs + j);
            const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, nibble), eight);
            const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight);
            _mm256_storeu_ps(w + j, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d));
            _mm256_storeu_ps(w + 16 + j, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d));
        }
        return 1;
    }
    case KIND_Q5_0:
    case KIND_Q5_1: {
        const int one = kind == KIND_Q5_1;
        const block_q5_0 *b0 = (const block_q5_0 *)blk;
        const block_q5_1 *b1 = (const block_q5_1 *)blk;
        uint32_t h;
        memcpy(&h, one ? b1->qh : b0->qh, sizeof h);
        const __m256 d = _mm256_set1_ps(half_to_float(one ? b1->d : b0->d));
        const __m256 m = _mm256_set1_ps(one ? half_to_float(b1->m) : 0.0f);
        const __m256i hv = _mm256_set1_epi32((int)h), one_bit = _mm256_set1_epi32(1);
        const __m256i off = _mm256_set1_epi32(one ? 0 : 16);
        const uint8_t *qs = one ? b1->qs : b0->qs;
        for (int j = 0; j < 16; j += 8) {
            const __m256i q = bytes8(qs + j), at = _mm256_add_epi32(lane, _mm256_set1_epi32(j));
            const __m256i hlo = _mm256_and_si256(_mm256_srlv_epi32(hv, at), one_bit);
            const __m256i hhi = _mm256_and_si256(_mm256_srlv_epi32(hv, _mm256_add_epi32(at, _mm256_set1_epi32(16))),
                                                 one_bit);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, nibble), _mm256_slli_epi32(hlo, 4));
            const __m256i hi = _mm256_or_si256(_mm256_srli_epi32(q, 4), _mm256_slli_epi32(hhi, 4));
            _mm256_storeu_ps(w + j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, off)), d), m));
            _mm256_storeu_ps(w + 16 + j,
                             _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, off)), d), m));
        }
        return 1;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K;
        const block_q4_K *b4 = (const block_q4_K *)blk;
        const block_q5_K *b5 = (const block_q5_K *)blk;
        const uint8_t *qs = five ? b5->qs : b4->qs;
        uint8_t sc[8], mn[8];
        k_scales_mins(five ? b5->scales : b4->scales, sc, mn);
        const float d = half_to_float(five ? b5->d : b4->d), dmin = half_to_float(five ? b5->dmin : b4->dmin);
        for (int s = 0; s < 8; s++) {
            const __m256 ds = _mm256_set1_ps(d * (float)sc[s]), dm = _mm256_set1_ps(dmin * (float)mn[s]);
            const uint8_t *q = qs + 32 * (s / 2);
            for (int k = 0; k < 32; k += 8) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi32(bytes8(q + k), 4 * (s % 2)), nibble);
                if (five) {
                    const __m256i hb = _mm256_and_si256(_mm256_srli_epi32(bytes8(b5->qh + k), s), _mm256_set1_epi32(1));
                    v = _mm256_or_si256(v, _mm256_slli_epi32(hb, 4));
                }
                _mm256_storeu_ps(w + 32 * s + k, _mm256_sub_ps(_mm256_mul_ps(ds, _mm256_cvtepi32_ps(v)), dm));
            }
        }
        return 1;
    }
    case KIND_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        const float d = half_to_float(b->d);
        const __m256i two = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                const uint8_t *ql = b->ql + 64 * h + 32 * (g & 1), *qh = b->qh + 32 * h;
                for (int k = 0; k < 32; k += 8) {
                    const int e = 128 * h + 32 * g + k;
                    const __m256 ds = _mm256_set1_ps(d * (float)b->scales[e / 16]);
                    const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(bytes8(ql + k), 4 * (g >> 1)), nibble);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(bytes8(qh + k), 2 * g), two);
                    const __m256i v = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), bias);
                    _mm256_storeu_ps(w + e, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(v)));
                }
            }
        }
        return 1;
    }
    default: return 0;
    }
}
#endif

#endif
