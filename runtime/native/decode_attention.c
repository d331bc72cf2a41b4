/* Decode attention: one query token per sequence over contiguous head-major KV rows (runtime/kv/mirror.py),
 * k[b * row_stride + h * head_stride + j * head_dim + i] for sequence b, KV head h, position j < lengths[b] <=
 * capacity. q and out are [batch, heads, head_dim]; the heads / kv_heads query heads of a group share KV head h
 * (no KV head is repeated). Softmax in float32 with the maximum subtracted.
 *
 * Split-K ("flash decoding"): the work items are (sequence, KV head, span of ATTN_SPAN positions), so that batch 1
 * with 3 KV heads still keeps every thread busy. An item reads each key and value row once for all the query
 * heads of its group, and keeps (max, sum of exp, unnormalised output) per query head; a second pass merges the
 * spans of each (sequence, head) in position order. Spans are fixed by position, never by the thread count, so
 * the result is the same bits on any number of threads. exp runs 16 (AVX-512) or 8 (AVX2) lanes at a time: a
 * Cephes-style polynomial: relative error at most 8.1e-8 against exp in double over [-87, 0] (checked).
 *
 * Measured 2026-12-04 (SmolLM2's 9 query / 3 KV heads of 64, one sequence, 30 layers' KV so that each call reads
 * it cold, against the one-item-per-KV-head loop this replaced): 2 threads 80 -> 58 us a layer at 600 positions,
 * 251 -> 146 at 2,000, 551 -> 298 at 4,000 (about 20 GB/s of KV, the machine's read bandwidth); 1 thread 1.3x to
 * 1.4x. Outputs within 3e-7 of the old loop's.
 *
 * With AVX-512 and head sizes 64 and 128 an item runs span_vec: 16 positions' scores reduced together, each block
 * of 16 keys serving every query head of its group (KV in the caches 10-16% faster than a pass per head, cold 0-12%),
 * the outputs summed in registers, the span's values and the next span's keys prefetched while its keys are read,
 * and a thread's items taken head by head. The same bits as attend_span (tests/runtime/native/test_paged_attention.py).
 * Measured 2026-12-05 inside SmolLM2's fp32 decode (2 threads, 576-704 positions, timers around each call of
 * a layer): 50-57 -> 37-38 us a layer. The prefetches name one line of each row (to L2), and the hardware fetches
 * the rest of the row: a prefetch of every line held the first head's pass on the core's miss buffers (cold, an
 * item's first head took 3.4 us of its 5.4, the other two 0.9); one a row is 8% faster at 640 and 4,000 positions
 * (30 layers' KV read cold, builds alternating; inside the Engine's decode the difference is within its noise). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define ATTN_SPAN 128     /* positions per work item */
#define ATTN_MAX_GROUP 16 /* query heads an item handles at once; larger groups run in slices of this many */

#include "vector_exp.h"

/* s[j] = exp(s[j] - m) for j < n; returns their sum. */
static float exp_shifted(float *s, int n, float m) {
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

/* One work item: query heads q[0..g) (rows of head_dim) over positions [j0, j1) of one KV head. Writes per head
 * its maximum score mx[h], its sum of exp(score - mx) l[h], and o[h * head_dim ..] = sum of exp(score - mx) v. */
static void attend_span(const float *q, int g, int head_dim, const float *kb, const float *vb, int j0, int j1,
                        float scale, float *mx, float *l, float *o) {
    float scores[ATTN_MAX_GROUP * ATTN_SPAN];
    const int n = j1 - j0;
    for (int h = 0; h < g; h++) mx[h] = -INFINITY;
    for (int j = 0; j < n; j++) {
        const float *kj = kb + (size_t)(j0 + j) * head_dim;
        for (int h = 0; h < g; h++) {
            const float s = dot(q + (size_t)h * head_dim, kj, head_dim) * scale;
            scores[h * ATTN_SPAN + j] = s;
            if (s > mx[h]) mx[h] = s;
        }
    }
    for (int h = 0; h < g; h++) l[h] = exp_shifted(scores + h * ATTN_SPAN, n, mx[h]);
    for (int i = 0; i < g * head_dim; i++) o[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *vj = vb + (size_t)(j0 + j) * head_dim;
        for (int h = 0; h < g; h++) {
            const float p = scores[h * ATTN_SPAN + j];
            float *oh = o + (size_t)h * head_dim;
#pragma omp simd
            for (int i = 0; i < head_dim; i++) oh[i] += p * vj[i];
        }
    }
}

#if defined(__AVX512F__)
/* hsum16 of 16 vectors at once: lane j of the result is hsum16(v[j]), by the same pairs (so the same bits), in 15
 * shuffle-and-add steps instead of 16 reductions of 4 steps each. After the four levels lane 4 c + k holds vector
 * c + 4 k's sum; the last permute puts vector j in lane j. */
static inline __m512 sum16x16(const __m512 *v) {
    __m512 w[8], y[4];
    for (int i = 0; i < 8; i++) /* i and i + 8 */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44));
    for (int i = 0; i < 4; i++) /* i and i + 4 */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88));
    __m512 z[2];
    for (int i = 0; i < 2; i++) /* i and i + 2 */
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)), /* i and i + 1 */
                                   _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* attend_span for head_dim = 16 m (m = 4 or 8, constants where it is inlined), with its results' bits: the same
 * products and sums per score (16 positions' dots reduced together), the same maximum (a vector of maxima: exact
 * in any order, a NaN score skipped), exp and sums, and the outputs summed over positions in the same order from
 * registers (mul, then add: no contraction here) instead of memory. Heads go in groups of 16 / m (16 registers). */
static inline __attribute__((always_inline)) void span_vec(const float *q, int g, const int m, const float *kb,
                                                           const float *vb, int j0, int j1, float scale, float *mx,
                                                           float *l, float *o) {
    float scores[ATTN_MAX_GROUP * ATTN_SPAN];
    const int n = j1 - j0, head_dim = 16 * m;
    __m512 vmax[ATTN_MAX_GROUP];
    for (int h = 0; h < g; h++) vmax[h] = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16) { /* each block of 16 keys read once, for every head of the group */
        for (int h = 0; h < g; h++) {
            const float *qh = q + (size_t)h * head_dim;
            __m512 acc[16];
            for (int t = 0; t < 16; t++) {
                const float *kj = kb + (size_t)(j0 + j + t) * head_dim;
                if (h == 0) { /* the row the output pass reads next, and the next span's (hints: never fault) */
                    _mm_prefetch((const char *)(vb + (size_t)(j0 + j + t) * head_dim), _MM_HINT_T1);
                    _mm_prefetch((const char *)(kj + (size_t)ATTN_SPAN * head_dim), _MM_HINT_T1);
                }
                acc[t] = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(kj));
                for (int c = 1; c < m; c++)
                    acc[t] = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c), _mm512_loadu_ps(kj + 16 * c), acc[t]);
            }
            const __m512 sv = _mm512_mul_ps(sum16x16(acc), _mm512_set1_ps(scale));
            vmax[h] = _mm512_max_ps(sv, vmax[h]); /* a NaN in sv yields vmax: skipped, as attend_span skips it */
            _mm512_storeu_ps(scores + h * ATTN_SPAN + j, sv);
        }
    }
    for (int h = 0; h < g; h++) {
        const float *qh = q + (size_t)h * head_dim;
        float *sh = scores + h * ATTN_SPAN;
        float mh = _mm512_reduce_max_ps(vmax[h]);
        for (int jj = j; jj < n; jj++) {
            sh[jj] = dot(qh, kb + (size_t)(j0 + jj) * head_dim, head_dim) * scale;
            if (sh[jj] > mh) mh = sh[jj];
        }
        mx[h] = mh;
        l[h] = exp_shifted(sh, n, mx[h]);
    }
    const int per = 16 / m; /* heads whose outputs share the 16 accumulators */
    for (int h0 = 0; h0 < g; h0 += per) {
        const int gh = g - h0 < per ? g - h0 : per;
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const float *vj = vb + (size_t)(j0 + j) * head_dim;
            for (int h = 0; h < per; h++) {
                if (h >= gh) break;
                const __m512 p = _mm512_set1_ps(scores[(h0 + h) * ATTN_SPAN + j]);
                for (int c = 0; c < m; c++)
                    acc[h * m + c] = _mm512_add_ps(acc[h * m + c], _mm512_mul_ps(p, _mm512_loadu_ps(vj + 16 * c)));
            }
        }
        for (int h = 0; h < gh; h++)
            for (int c = 0; c < m; c++) _mm512_storeu_ps(o + (size_t)(h0 + h) * head_dim + 16 * c, acc[h * m + c]);
    }
}
#endif

/* One query row's output from its spans' partial results: span k's (max, sum, unnormalised output) for row gi are
 * at p + k * stride (max at p[gi], sum at p[ATTN_MAX_GROUP + gi], output at p + 2 * ATTN_MAX_GROUP + gi * head_dim);
 * merged in span order. A span whose sum is 0 saw no position of the row and is skipped. */
static void merge_spans(float *o, const float *p, size_t stride, int count, int gi, int head_dim) {
    float m = -INFINITY;
    for (int k = 0; k < count; k++) {
        const float *pk = p + (size_t)k * stride;
        if (pk[ATTN_MAX_GROUP + gi] > 0.0f && pk[gi] > m) m = pk[gi];
    }
    for (int i = 0; i < head_dim; i++) o[i] = 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < count; k++) {
        const float *pk = p + (size_t)k * stride;
        if (!(pk[ATTN_MAX_GROUP + gi] > 0.0f)) continue;
        const float w = expf(pk[gi] - m);
        sum += w * pk[ATTN_MAX_GROUP + gi];
        const float *po = pk + 2 * ATTN_MAX_GROUP + (size_t)gi * head_dim;
#pragma omp simd
        for (int i = 0; i < head_dim; i++) o[i] += w * po[i];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < head_dim; i++) o[i] *= inv;
}

/* Returns 0, or -1 for bad arguments (nothing is written then) or a failed allocation. */
int native_decode_attention(const float *q, int batch, int heads, int kv_heads, int head_dim, const float *k,
                            const float *v, long row_stride, long head_stride, const int *lengths, int capacity,
                            float *out) {
    if (batch < 1 || kv_heads < 1 || heads < kv_heads || heads % kv_heads || head_dim < 1) return -1;
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 1 || lengths[b] > capacity) return -1;
    const int group = heads / kv_heads;
    const int slices = (group + ATTN_MAX_GROUP - 1) / ATTN_MAX_GROUP;
    const float scale = 1.0f / sqrtf((float)head_dim);
    /* first[b]: sequence b's first span's index; its spans are first[b] .. first[b + 1] - 1 (per KV head slice) */
    int *first = malloc(sizeof(int) * (size_t)(batch + 1));
    if (first == NULL) return -1;
    first[0] = 0;
    for (int b = 0; b < batch; b++) first[b + 1] = first[b] + (lengths[b] + ATTN_SPAN - 1) / ATTN_SPAN;
    const int spans = first[batch];
    const long items = (long)spans * kv_heads * slices;
    /* per item and query head: max, sum, then head_dim outputs */
    const size_t per_head = (size_t)head_dim + 2;
    float *part = malloc(sizeof(float) * (size_t)items * ATTN_MAX_GROUP * per_head);
    int *span_seq = malloc(sizeof(int) * (size_t)(spans > 0 ? spans : 1));
    if (part == NULL || span_seq == NULL) {
        free(first);
        free(part);
        free(span_seq);
        return -1;
    }
    for (int b = 0; b < batch; b++)
        for (int s = first[b]; s < first[b + 1]; s++) span_seq[s] = b;
    /* items run KV head by KV head, a head's spans in position order, so that a thread's share of the items
     * reads few long runs of K and V rows; each item's results go where the merge looks for span s */
#pragma omp parallel for schedule(static)
    for (long run = 0; run < items; run++) {
        const int h = (int)(run / ((long)spans * slices));
        const int slice = (int)(run / spans % slices);
        const int s = (int)(run % spans);
        const long it = ((long)s * kv_heads + h) * slices + slice;
        const int b = span_seq[s];
        const int j0 = (s - first[b]) * ATTN_SPAN;
        const int j1 = j0 + ATTN_SPAN < lengths[b] ? j0 + ATTN_SPAN : lengths[b];
        const int g0 = slice * ATTN_MAX_GROUP;
        const int g = group - g0 < ATTN_MAX_GROUP ? group - g0 : ATTN_MAX_GROUP;
        const float *qh = q + ((size_t)b * heads + (size_t)h * group + g0) * head_dim;
        const float *kb = k + (size_t)b * row_stride + (size_t)h * head_stride;
        const float *vb = v + (size_t)b * row_stride + (size_t)h * head_stride;
        float *p = part + (size_t)it * ATTN_MAX_GROUP * per_head;
#if defined(__AVX512F__)
        if (head_dim == 64)
            span_vec(qh, g, 4, kb, vb, j0, j1, scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP);
        else if (head_dim == 128)
            span_vec(qh, g, 8, kb, vb, j0, j1, scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP);
        else
#endif
            attend_span(qh, g, head_dim, kb, vb, j0, j1, scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP);
    }
    /* merge each (sequence, query head)'s spans in position order */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < batch; b++) {
        for (int hq = 0; hq < heads; hq++) {
            const int h = hq / group, slice = (hq % group) / ATTN_MAX_GROUP, gi = (hq % group) % ATTN_MAX_GROUP;
            const size_t stride = (size_t)kv_heads * slices * ATTN_MAX_GROUP * per_head; /* from one span to the next */
            const float *p = part + ((size_t)((long)first[b] * kv_heads + h) * slices + slice) * ATTN_MAX_GROUP * per_head;
            merge_spans(out + ((size_t)b * heads + hq) * head_dim, p, stride, first[b + 1] - first[b], gi, head_dim);
        }
    }
    free(first);
    free(part);
    free(span_seq);
    return 0;
}

/* Paged attention: n consecutive queries of one sequence, at positions start .. start + n - 1 (causal), over its
 * K/V read in place from the paged pool (runtime/kv/pool.py): key j of KV head h at k + table[j / page] *
 * block_stride + (j % page) * pos_stride + h * head_dim, values alike. q and out are [n, heads, head_dim].
 *
 * The query rows (t, query head), t-major, in slices of ATTN_MAX_GROUP rows, and spans of ATTN_SPAN positions
 * make the work items: an item reads each position's keys and values once for every row of its slice, all KV
 * heads together, so a page's rows stream as one contiguous block (one item per span for a decode: every KV row
 * read once; more than one slice reads them again). Items are per span, so batch 1 keeps every thread busy.
 * Row t's positions past start + t are a suffix of a span: it stops there. Spans are fixed by position, never by
 * the thread count: the same bits on any number of threads. (An item per KV head, reading 256 of every 768 bytes
 * of SmolLM2's pages, took 2.6x the time of the mirror's kernel over the same bytes.)
 *
 * Returns 0, or -1 for bad arguments (a block id outside [0, pool_blocks), a table too short for the positions;
 * nothing is written then) or a failed allocation. */
static void attend_rows(const float *const *qr, const int *valid, const int *head_at, int g, int head_dim,
                        const float *const *kr, const float *const *vr, float scale, float *mx, float *l, float *o) {
    float scores[ATTN_MAX_GROUP * ATTN_SPAN];
    int most = 0;
    for (int r = 0; r < g; r++) {
        mx[r] = -INFINITY;
        if (valid[r] > most) most = valid[r];
    }
    for (int j = 0; j < most; j++) {
        const float *kj = kr[j];
        for (int r = 0; r < g; r++) {
            if (j >= valid[r]) continue;
            const float s = dot(qr[r], kj + head_at[r], head_dim) * scale;
            scores[r * ATTN_SPAN + j] = s;
            if (s > mx[r]) mx[r] = s;
        }
    }
    for (int r = 0; r < g; r++) l[r] = valid[r] > 0 ? exp_shifted(scores + r * ATTN_SPAN, valid[r], mx[r]) : 0.0f;
    for (int i = 0; i < g * head_dim; i++) o[i] = 0.0f;
    for (int j = 0; j < most; j++) {
        const float *vj = vr[j];
        for (int r = 0; r < g; r++) {
            if (j >= valid[r]) continue;
            const float p = scores[r * ATTN_SPAN + j];
            const float *vh = vj + head_at[r];
            float *orow = o + (size_t)r * head_dim;
#pragma omp simd
            for (int i = 0; i < head_dim; i++) orow[i] += p * vh[i];
        }
    }
}

int native_paged_attention(const float *q, int n, int heads, int kv_heads, int head_dim, const float *k, const float *v,
                           long block_stride, long pos_stride, int page, const int64_t *table, int table_len,
                           int pool_blocks, int start, float *out) {
    if (n < 1 || start < 0 || page < 1 || kv_heads < 1 || heads < kv_heads || heads % kv_heads || head_dim < 1)
        return -1;
    const int length = start + n;
    const int used = (length + page - 1) / page;
    if (used > table_len) return -1;
    for (int i = 0; i < used; i++)
        if (table[i] < 0 || table[i] >= pool_blocks) return -1;
    const int group = heads / kv_heads;
    const int rows = n * heads;
    const int slices = (rows + ATTN_MAX_GROUP - 1) / ATTN_MAX_GROUP;
    const int spans = (length + ATTN_SPAN - 1) / ATTN_SPAN;
    const long items = (long)spans * slices;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const size_t per_row = (size_t)head_dim + 2;
    float *part = malloc(sizeof(float) * (size_t)items * ATTN_MAX_GROUP * per_row);
    if (part == NULL) return -1;
#pragma omp parallel for schedule(static)
    for (long it = 0; it < items; it++) {
        const int s = (int)(it / slices), slice = (int)(it % slices);
        const int j0 = s * ATTN_SPAN;
        const int j1 = j0 + ATTN_SPAN < length ? j0 + ATTN_SPAN : length;
        const int r0 = slice * ATTN_MAX_GROUP;
        const int g = rows - r0 < ATTN_MAX_GROUP ? rows - r0 : ATTN_MAX_GROUP;
        const float *qr[ATTN_MAX_GROUP];
        int valid[ATTN_MAX_GROUP], head_at[ATTN_MAX_GROUP];
        for (int r = 0; r < g; r++) {
            const int t = (r0 + r) / heads, hq = (r0 + r) % heads;
            qr[r] = q + ((size_t)t * heads + hq) * head_dim;
            head_at[r] = hq / group * head_dim;
            const int seen = start + t + 1 - j0; /* positions of this span that row t sees */
            valid[r] = seen < 0 ? 0 : (seen < j1 - j0 ? seen : j1 - j0);
        }
        const float *kr[ATTN_SPAN], *vr[ATTN_SPAN];
        for (int j = j0; j < j1; j++) {
            const size_t at = (size_t)table[j / page] * block_stride + (size_t)(j % page) * pos_stride;
            kr[j - j0] = k + at;
            vr[j - j0] = v + at;
        }
        float *p = part + (size_t)it * ATTN_MAX_GROUP * per_row;
        attend_rows(qr, valid, head_at, g, head_dim, kr, vr, scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP);
    }
    /* merge each query row's spans in position order */
#pragma omp parallel for schedule(static)
    for (int row = 0; row < rows; row++) { /* row = t * heads + hq: out's own layout */
        const int slice = row / ATTN_MAX_GROUP, gi = row % ATTN_MAX_GROUP;
        const size_t stride = (size_t)slices * ATTN_MAX_GROUP * per_row;
        merge_spans(out + (size_t)row * head_dim, part + (size_t)slice * ATTN_MAX_GROUP * per_row, stride, spans, gi,
                    head_dim);
    }
    free(part);
    return 0;
}
