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
#include <stdint.h>
#include <stdlib.h>

#include "attention_parts.h"

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
                    head_dim, ATTN_MAX_GROUP);
    }
    free(part);
    return 0;
}
