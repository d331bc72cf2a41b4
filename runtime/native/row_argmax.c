/* The greedy token of each row of logits, found by the threads that wrote them (runtime/native/decode_layers.c's
 * `native_decode_head`, for the Engine's plain-greedy rows: runtime/engine/output.py's greedy_tokens).
 *
 * best[r] = the first index of row r's maximum, or -1 when that maximum is not finite (a NaN anywhere in the row,
 * or a maximum of +inf or -inf): what greedy_tokens' numpy argmax and finiteness check give, where the sampler
 * then decides (and refuses the row). Thread t of the team scans the t-th contiguous part of every row, the part
 * its own share of the head's product wrote (thread_rows.h: shares in thread order), so the logits are read from
 * the core that holds them: one thread reading a 49,152-entry row after a two-thread product waited about 50 us
 * on the other core's cache (SmolLM2, 2 cores), where each part takes a few. Parts merge in index order, so the
 * answer never depends on the thread count. */
#include <math.h>
#include <stddef.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "thread_rows.h" /* OpenMP, or its one-thread stand-ins */

/* One part [a, b) of a row: its first maximum's index and value in *at / *top, or *nan = 1 if it holds a NaN. */
typedef struct {
    long at;
    float top;
    int nan;
} part_max;

static part_max scan_part(const float *x, long a, long b) {
    part_max p = {a, -INFINITY, 0};
    if (a >= b) return p;
    long i = a;
    p.top = x[a];
    if (isnan(p.top)) return (part_max){a, p.top, 1};
#if defined(__AVX512F__)
    if (b - a >= 16) {
        /* per lane: its largest value and the first index holding it (a strictly greater value replaces it) */
        __m512 top = _mm512_loadu_ps(x + a);
        __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); /* from a */
        __mmask16 unordered = _mm512_cmp_ps_mask(top, top, _CMP_UNORD_Q);
        __m512i offset = at;
        for (i = a + 16; i + 16 <= b && !unordered; i += 16) {
            const __m512 v = _mm512_loadu_ps(x + i);
            offset = _mm512_add_epi32(offset, _mm512_set1_epi32(16));
            unordered = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            const __mmask16 greater = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);
            top = _mm512_mask_blend_ps(greater, top, v);
            at = _mm512_mask_blend_epi32(greater, at, offset);
        }
        if (unordered) return (part_max){a, NAN, 1};
        float lanes[16];
        int idx[16];
        _mm512_storeu_ps(lanes, top);
        _mm512_storeu_si512((void *)idx, at);
        p.top = lanes[0];
        p.at = a + idx[0];
        for (int l = 1; l < 16; l++)
            if (lanes[l] > p.top || (lanes[l] == p.top && a + idx[l] < p.at)) {
                p.top = lanes[l];
                p.at = a + idx[l];
            }
    }
#endif
    for (; i < b; i++) {
        if (isnan(x[i])) return (part_max){i, x[i], 1};
        if (x[i] > p.top) {
            p.top = x[i];
            p.at = i;
        }
    }
    return p;
}

/* best[r] as native_row_argmax gives it, on the calling thread alone (decode_layers.c, after a region whose
 * threads wrote the logits: no second region to wait for). */
void row_argmax_one_thread(const float *x, int rows, long cols, long *best) {
    for (int r = 0; r < rows; r++) {
        const part_max m = scan_part(x + (size_t)r * cols, 0, cols);
        best[r] = m.nan || isinf(m.top) ? -1 : m.at;
    }
}

/* best[r] for rows r < rows of x `[rows, cols]` (see the file comment). Returns 0, or -1 for bad arguments. */
int native_row_argmax(const float *x, int rows, long cols, long *best) {
    if (rows < 0 || cols < 1 || cols > 0x7fffffffL - 16) return -1;
    const int team = omp_get_max_threads();
    part_max found[team > 0 ? team : 1][rows > 0 ? rows : 1];
    int ran = 1;
#pragma omp parallel num_threads(team)
    {
        const int me = omp_get_thread_num(), count = omp_get_num_threads();
        if (me == 0) ran = count;
        const long a = cols * me / count, b = cols * (me + 1) / count;
        for (int r = 0; r < rows; r++) found[me][r] = scan_part(x + (size_t)r * cols, a, b);
    }
    for (int r = 0; r < rows; r++) {
        part_max m = found[0][r];
        for (int t = 1; t < ran && !m.nan; t++) {
            const part_max p = found[t][r];
            if (p.nan || p.top > m.top) m = p; /* parts in index order: ties keep the earlier */
        }
        best[r] = m.nan || isinf(m.top) ? -1 : m.at;
    }
    return 0;
}
