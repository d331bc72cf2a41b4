/* decode_attention.c's step plan and per-layer team call, for the decode layers (decode_layers.c), which run every
 * layer's attention inside their one parallel region. */
#ifndef RADIXCACHE_DECODE_ATTENTION_H
#define RADIXCACHE_DECODE_ATTENTION_H
#include <stddef.h>

/* What a step's attention needs besides q, K, V and out: the same for every layer (lengths and shapes only). */
typedef struct {
    int batch, heads, kv_heads, head_dim, group, slices, spans;
    long items, positions; /* work items (sequence, KV head, slice, span); positions summed over them */
    size_t per_head;       /* floats a query head's partial result takes: max, sum, head_dim outputs */
    float scale;
    const int *lengths;    /* the caller's, read while the plan is used */
    int *first, *span_seq; /* each sequence's first span; each span's sequence */
    float *part;           /* the items' partial results */
} attn_plan;

/* 0, or -1 for bad arguments or a failed allocation (nothing to free then). `with_part`: allocate plan->part (what
 * attn_team writes); 0 leaves it NULL for a caller whose threads keep copies of their own (decode_team.c), or that
 * allocates it with attn_plan_part once it knows it will run attn_team. */
int attn_plan_init(attn_plan *plan, int batch, int heads, int kv_heads, int head_dim, const int *lengths,
                   int capacity, int with_part);
/* plan->part allocated where it is NULL: 0, or -1 (a failed allocation; the plan is still whole to free). */
int attn_plan_part(attn_plan *plan);
void attn_plan_free(attn_plan *plan);
/* Called by every thread of a parallel region; out is whole when it returns (it ends with a barrier). */
void attn_team(const attn_plan *plan, const float *q, const float *k, const float *v, long row_stride,
               long head_stride, float *out);
/* The pieces attn_team runs, for a team that shares items otherwise (decode_team.c): thread t's first item of a
 * team's runs cut by positions; items [lo, hi) into `part` (plan->part's layout; its values are written as they
 * are accumulated, not once); output row r (sequence r / heads, query head r % heads) merged from `part`. */
long attn_first_item(const attn_plan *plan, int t, int team);
void attn_items(const attn_plan *plan, float *part, const float *q, const float *k, const float *v, long row_stride,
                long head_stride, long lo, long hi);
void attn_merge(const attn_plan *plan, const float *part, float *out, int r);
/* The same results packed: each item holds its group's rows only, not ATTN_MAX_GROUP (SmolLM2's 3 of 16): floats
 * of a packed buffer; items [lo, hi) copied from plan->part's layout into one (only what the merge reads); output
 * row r merged from one. */
size_t attn_packed_floats(const attn_plan *plan);
void attn_items_pack(const attn_plan *plan, const float *from, float *to, long lo, long hi);
void attn_merge_packed(const attn_plan *plan, const float *packed, float *out, int r);
int native_decode_attention(const float *q, int batch, int heads, int kv_heads, int head_dim, const float *k,
                            const float *v, long row_stride, long head_stride, const int *lengths, int capacity,
                            float *out);
#endif
