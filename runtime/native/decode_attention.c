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
 * the outputs summed in registers, and a thread's items taken head by head. The same bits as attend_span
 * (tests/runtime/native/test_paged_attention.py). Measured 2026-12-05 inside SmolLM2's fp32 decode (2 threads,
 * 576-704 positions, timers around each call of a layer): 50-57 -> 37-38 us a layer.
 *
 * Prefetches (to L2): an item's value rows while its keys are read, the first line of each at the first head's
 * pass and the rest at the second's (all of them at once held the first head's pass on the core's miss buffers:
 * cold, 3.4 us of an item's 5.4); the thread's next item's key rows, whole, while its values are read. Measured
 * 2026-12-06 against the next span's first key line and one value line per row while the keys are read (SmolLM2's
 * shapes, 120 layers' KV read cold, a C loop, builds alternating): 29-31 against 33-35 us a layer at 576 and 640
 * positions; inside SmolLM2's fp32 decode, builds alternating step by step (scripts/bench_native_ab.py), the 30
 * layers 1.2% faster at 512 + 129 positions and 1.5% at 2,000 + 129 (with the threads' runs cut by positions,
 * below). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#include "attention_parts.h"
#include "decode_attention.h"

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
                                                           float *l, float *o, const float *next_k, int next_n) {
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
                /* the value row the output pass reads, whole, its lines spread over two heads' passes (hints:
                 * never fault) */
                const char *vrow = (const char *)(vb + (size_t)(j0 + j + t) * head_dim);
                if (h == 0) _mm_prefetch(vrow, _MM_HINT_T1);
                if (h == 1 || g == 1)
                    for (int c = 64; c < head_dim * 4; c += 64) _mm_prefetch(vrow + c, _MM_HINT_T1);
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
            if (h0 == 0 && j < next_n) /* the next item's key row j, whole: its keys pass starts in L2 */
                for (int c = 0; c < head_dim * 4; c += 64)
                    _mm_prefetch((const char *)(next_k + (size_t)j * head_dim) + c, _MM_HINT_T1);
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

/* Work item `run` of native_decode_attention: items go KV head by KV head, a head's slices, a slice's spans in
 * position order (so that a thread's run of items reads few long runs of K and V rows). */
typedef struct {
    int h, slice, s, b, j0, j1; /* KV head, slice of its query heads, span (global index), sequence, positions */
} attn_item;

static inline attn_item item_at(long run, int spans, int slices, const int *first, const int *span_seq,
                                const int *lengths) {
    attn_item it;
    it.h = (int)(run / ((long)spans * slices));
    it.slice = (int)(run / spans % slices);
    it.s = (int)(run % spans);
    it.b = span_seq[it.s];
    it.j0 = (it.s - first[it.b]) * ATTN_SPAN;
    it.j1 = it.j0 + ATTN_SPAN < lengths[it.b] ? it.j0 + ATTN_SPAN : lengths[it.b];
    return it;
}

/* The first item of thread t's run of items: the runs are contiguous and hold about equal numbers of positions
 * (an item goes to the run where the middle of its positions falls), so that a head's short last span does not
 * leave one thread idle while another does a whole span more. Monotonic in t; 0 for t = 0, items for t = team. */
static long first_item_of(int t, int team, long items, long positions, int spans, int slices, const int *first,
                          const int *span_seq, const int *lengths) {
    if (t <= 0) return 0;
    if (t >= team) return items;
    long before = 0;
    for (long run = 0; run < items; run++) {
        const attn_item it = item_at(run, spans, slices, first, span_seq, lengths);
        const long w = it.j1 - it.j0;
        if ((2 * before + w) * team >= 2 * (long)t * positions) return run;
        before += w;
    }
    return items;
}

/* What one decode step's attention needs besides q, K, V and out, the same for every layer of the step (it depends
 * on the lengths and shapes only): made once by attn_plan_init, used by each layer's attn_team. */
int attn_plan_init(attn_plan *plan, int batch, int heads, int kv_heads, int head_dim, const int *lengths,
                   int capacity, int with_part) {
    if (batch < 1 || kv_heads < 1 || heads < kv_heads || heads % kv_heads || head_dim < 1) return -1;
    for (int b = 0; b < batch; b++)
        if (lengths[b] < 1 || lengths[b] > capacity) return -1;
    const int group = heads / kv_heads, slices = (group + ATTN_MAX_GROUP - 1) / ATTN_MAX_GROUP;
    /* first[b]: sequence b's first span's index; its spans are first[b] .. first[b + 1] - 1 (per KV head slice) */
    int *first = malloc(sizeof(int) * (size_t)(batch + 1));
    if (first == NULL) return -1;
    first[0] = 0;
    long positions = 0;
    for (int b = 0; b < batch; b++) {
        first[b + 1] = first[b] + (lengths[b] + ATTN_SPAN - 1) / ATTN_SPAN;
        positions += lengths[b];
    }
    const int spans = first[batch];
    const long items = (long)spans * kv_heads * slices;
    const size_t per_head = (size_t)head_dim + 2; /* per item and query head: max, sum, then head_dim outputs */
    int *span_seq = malloc(sizeof(int) * (size_t)(spans > 0 ? spans : 1));
    if (span_seq == NULL) {
        free(first);
        return -1;
    }
    for (int b = 0; b < batch; b++)
        for (int s = first[b]; s < first[b + 1]; s++) span_seq[s] = b;
    *plan = (attn_plan){batch,    heads, kv_heads, head_dim, group,    slices,  spans, items,
                        positions * kv_heads * slices, per_head, 1.0f / sqrtf((float)head_dim), lengths,
                        first,    span_seq, NULL};
    if (with_part && attn_plan_part(plan) != 0) {
        attn_plan_free(plan);
        return -1;
    }
    return 0;
}

int attn_plan_part(attn_plan *plan) {
    if (plan->part == NULL) plan->part = malloc(sizeof(float) * (size_t)plan->items * ATTN_MAX_GROUP * plan->per_head);
    return plan->part != NULL ? 0 : -1;
}

void attn_plan_free(attn_plan *plan) {
    free(plan->first);
    free(plan->span_seq);
    free(plan->part);
}

long attn_first_item(const attn_plan *pl, int t, int team) {
    return first_item_of(t, team, pl->items, pl->positions, pl->spans, pl->slices, pl->first, pl->span_seq,
                         pl->lengths);
}

/* Items [lo, hi) into `part` (the layout of plan->part), prefetching each item's next one's keys during its output
 * pass. The same code whichever thread runs an item, so the same bits. */
void attn_items(const attn_plan *pl, float *part, const float *q, const float *k, const float *v, long row_stride,
                long head_stride, long lo, long hi) {
    const int head_dim = pl->head_dim;
    for (long run = lo; run < hi; run++) {
        const attn_item it = item_at(run, pl->spans, pl->slices, pl->first, pl->span_seq, pl->lengths);
        const int g0 = it.slice * ATTN_MAX_GROUP;
        const int g = pl->group - g0 < ATTN_MAX_GROUP ? pl->group - g0 : ATTN_MAX_GROUP;
        const float *qh = q + ((size_t)it.b * pl->heads + (size_t)it.h * pl->group + g0) * head_dim;
        const float *kb = k + (size_t)it.b * row_stride + (size_t)it.h * head_stride;
        const float *vb = v + (size_t)it.b * row_stride + (size_t)it.h * head_stride;
        /* each item's results go where the merge looks for span s */
        float *p = part + (size_t)(((long)it.s * pl->kv_heads + it.h) * pl->slices + it.slice) * ATTN_MAX_GROUP *
                              pl->per_head;
#if defined(__AVX512F__)
        const float *next_k = NULL; /* the next item's first key row, and its row count */
        int next_n = 0;
        if (run + 1 < hi) {
            const attn_item nx = item_at(run + 1, pl->spans, pl->slices, pl->first, pl->span_seq, pl->lengths);
            next_k = k + (size_t)nx.b * row_stride + (size_t)nx.h * head_stride + (size_t)nx.j0 * head_dim;
            next_n = nx.j1 - nx.j0;
        }
        if (head_dim == 64)
            span_vec(qh, g, 4, kb, vb, it.j0, it.j1, pl->scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP, next_k,
                     next_n);
        else if (head_dim == 128)
            span_vec(qh, g, 8, kb, vb, it.j0, it.j1, pl->scale, p, p + ATTN_MAX_GROUP, p + 2 * ATTN_MAX_GROUP, next_k,
                     next_n);
        else
#endif
            attend_span(qh, g, head_dim, kb, vb, it.j0, it.j1, pl->scale, p, p + ATTN_MAX_GROUP,
                        p + 2 * ATTN_MAX_GROUP);
    }
}

/* The query rows an item's results hold room for: ATTN_MAX_GROUP in plan->part, its group (at most that) packed. */
static int packed_slot(const attn_plan *pl) { return pl->group < ATTN_MAX_GROUP ? pl->group : ATTN_MAX_GROUP; }

size_t attn_packed_floats(const attn_plan *pl) { return (size_t)pl->items * packed_slot(pl) * pl->per_head; }

/* Item it's place in a part buffer whose items hold `slot` rows each. */
static size_t item_place(const attn_plan *pl, attn_item it, int slot) {
    return (size_t)(((long)it.s * pl->kv_heads + it.h) * pl->slices + it.slice) * slot * pl->per_head;
}

void attn_items_pack(const attn_plan *pl, const float *from, float *to, long lo, long hi) {
    const int slot = packed_slot(pl);
    for (long run = lo; run < hi; run++) {
        const attn_item it = item_at(run, pl->spans, pl->slices, pl->first, pl->span_seq, pl->lengths);
        const int g0 = it.slice * ATTN_MAX_GROUP;
        const int g = pl->group - g0 < ATTN_MAX_GROUP ? pl->group - g0 : ATTN_MAX_GROUP;
        const float *f = from + item_place(pl, it, ATTN_MAX_GROUP);
        float *t = to + item_place(pl, it, slot);
        memcpy(t, f, sizeof(float) * (size_t)g);
        memcpy(t + slot, f + ATTN_MAX_GROUP, sizeof(float) * (size_t)g);
        memcpy(t + 2 * slot, f + 2 * ATTN_MAX_GROUP, sizeof(float) * (size_t)g * pl->head_dim);
    }
}

/* Output row r = b * heads + hq (sequence b's query head hq), its spans merged in position order from a part
 * buffer whose items hold `slot` rows each. */
static void merge_row(const attn_plan *pl, const float *part, int slot, float *out, int r) {
    const int b = r / pl->heads, hq = r % pl->heads;
    const int h = hq / pl->group, slice = (hq % pl->group) / ATTN_MAX_GROUP, gi = (hq % pl->group) % ATTN_MAX_GROUP;
    const size_t stride = (size_t)pl->kv_heads * pl->slices * slot * pl->per_head; /* span to span */
    const size_t first = ((size_t)((long)pl->first[b] * pl->kv_heads + h) * pl->slices + slice) * slot;
    const float *p = part + first * pl->per_head;
    merge_spans(out + (size_t)r * pl->head_dim, p, stride, pl->first[b + 1] - pl->first[b], gi, pl->head_dim, slot);
}

void attn_merge(const attn_plan *pl, const float *part, float *out, int r) {
    merge_row(pl, part, ATTN_MAX_GROUP, out, r);
}

void attn_merge_packed(const attn_plan *pl, const float *packed, float *out, int r) {
    merge_row(pl, packed, packed_slot(pl), out, r);
}

/* One layer's attention, run by every thread of a parallel region (thread `me` of its team): each thread its run
 * of items (first_item_of), then, after a barrier, a share of the merges (an `omp for`, whose closing barrier ends
 * it: out is whole when it returns). */
void attn_team(const attn_plan *pl, const float *q, const float *k, const float *v, long row_stride,
               long head_stride, float *out) {
    const int team = omp_get_num_threads(), me = omp_get_thread_num();
    attn_items(pl, pl->part, q, k, v, row_stride, head_stride, attn_first_item(pl, me, team),
               attn_first_item(pl, me + 1, team));
#pragma omp barrier
#pragma omp for schedule(static)
    for (int r = 0; r < pl->batch * pl->heads; r++) attn_merge(pl, pl->part, out, r);
}

/* Returns 0, or -1 for bad arguments (nothing is written then) or a failed allocation. One parallel region runs
 * attn_team.
 *
 * Measured 2026-12-06 on the project's VM (SmolLM2's shapes, 120 layers' KV read cold, C loop, builds alternating):
 * 640 positions 29-31 us a layer against 32-35 with only the next span's first key line and one value line a row
 * prefetched, the runs split by items and a second region for the merge; with the KV in the caches 13-18 against
 * 16-19 at 576 positions. */
int native_decode_attention(const float *q, int batch, int heads, int kv_heads, int head_dim, const float *k,
                            const float *v, long row_stride, long head_stride, const int *lengths, int capacity,
                            float *out) {
    attn_plan plan;
    if (attn_plan_init(&plan, batch, heads, kv_heads, head_dim, lengths, capacity, 1) != 0) return -1;
#pragma omp parallel
    attn_team(&plan, q, k, v, row_stride, head_stride, out);
    attn_plan_free(&plan);
    return 0;
}
