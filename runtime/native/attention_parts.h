/* What decode_attention.c (the decode mirror's kernel) and paged_attention.c (queries over the paged pool) share:
 * the work item's size, the float32 softmax pieces and the merge of a row's spans in position order. Both kernels
 * run the same arithmetic per score (`dot`, scaled), per exp (`exp_shifted`) and per merge, so that a decode row
 * gets the same bits from either (tests/runtime/native/test_paged_attention.py). */
#ifndef RADIXCACHE_ATTENTION_PARTS_H
#define RADIXCACHE_ATTENTION_PARTS_H
#include <math.h>
#include <stddef.h>

#define ATTN_SPAN 128     /* positions per work item */
#define ATTN_MAX_GROUP 16 /* query rows an item handles at once; more run in slices of this many */

#include "vector_exp.h"

/* s[j] = exp(s[j] - m) for j < n; returns their sum. */
static inline float exp_shifted(float *s, int n, float m) {
    int j = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(m)));
        _mm512_storeu_ps(s + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(m)));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; i++) sum += lanes[i];
#endif
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    return sum;
}

#if defined(__AVX512F__)
/* The sum of a vector's 16 lanes by a fixed tree: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1
 * (the order GCC's _mm512_reduce_add_ps uses, spelled out so that no compiler changes it). sum16x16 below adds
 * the same pairs, so a score has the same bits by either. */
static inline float hsum16(__m512 a) {
    const __m256 h = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)),
                                    _mm512_castps512_ps256(a));
    const __m128 f = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
    const __m128 t = _mm_add_ps(f, _mm_shuffle_ps(f, f, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_shuffle_ps(t, t, _MM_SHUFFLE(3, 2, 0, 1)));
}
#endif

static inline float dot(const float *a, const float *b, int d) {
#if defined(__AVX512F__)
    if (d % 16 == 0) {
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b));
        for (int i = 16; i < d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return hsum16(acc);
    }
#endif
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < d; i++) s += a[i] * b[i];
    return s;
}

/* One query row's output from its spans' partial results: span k's (max, sum, unnormalised output) for row gi are
 * at p + k * stride (max at p[gi], sum at p[slot + gi], output at p + 2 * slot + gi * head_dim; `slot`: the rows an
 * item's results hold room for, ATTN_MAX_GROUP but where packed); merged in span order. A span whose sum is 0 saw
 * no position of the row and is skipped. */
static inline void merge_spans(float *o, const float *p, size_t stride, int count, int gi, int head_dim, int slot) {
    float m = -INFINITY;
    for (int k = 0; k < count; k++) {
        const float *pk = p + (size_t)k * stride;
        if (pk[slot + gi] > 0.0f && pk[gi] > m) m = pk[gi];
    }
    for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < count; k++) {
        const float *pk = p + (size_t)k * stride;
        if (!(pk[slot + gi] > 0.0f)) continue;
        const float w = expf(pk[gi] - m);
        sum += w * pk[slot + gi];
        const float *po = pk + 2 * slot + (size_t)gi * head_dim;
#pragma omp simd
        for (int i = 0; i < head_dim; i++) o[i] += w * po[i];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < head_dim; i++) o[i] *= inv;
}

#endif
