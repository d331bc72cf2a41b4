/* A decode step's rotary embedding and K/V stores for one layer, in one call (runtime/model/fused_decode.py).
 *
 * At batch 1 the eager step spent about 37 us a layer on this glue (RoPE as 5 ATen calls, a dense copy of q, the
 * pool's two index_copy_ and the decode mirror's two copies), for 2.3 KB of data; here it is one pass.
 *
 * For each row t < rows of qkv `[rows, (heads + 2 kv_heads) * head_dim]` (q heads, then k heads, then v heads):
 * - q_out[t] = rope(q heads), at position positions[t];
 * - k = rope(k heads), v = v heads, written to the pool at flat slot slots[t] (pool_k / pool_v:
 *   `[num_slots, kv_heads, head_dim]`) and to the mirror at row mirror_rows[t], position mirror_pos[t] (mirror_k /
 *   mirror_v: `[mirror_rows_cap, kv_heads, mirror_cap, head_dim]` with strides mirror_row_stride,
 *   mirror_head_stride; positions contiguous).
 * RoPE is rotate-half with the tables `[max_position, head_dim]`: x * cos + rotate_half(x) * signed_sin, where
 * signed_sin's first half holds -sin (runtime/model/llama.py `_rope_signed`). Two products and a sum, each
 * rounded (this file is compiled as ISO C, so no fused multiply-add): the same bits as the PyTorch expression.
 * Every index is checked before anything is written: returns 0, or -1 (nothing written) for one out of range. */
#include <stddef.h>

#include "decode_store.h"

int rope_store_check(const rope_store_args *a) {
    if (a->rows < 1 || a->heads < 1 || a->kv_heads < 1 || a->head_dim < 2 || a->head_dim % 2) return -1;
    for (int t = 0; t < a->rows; t++) {
        if (a->positions[t] < 0 || a->positions[t] >= a->max_position || a->slots[t] < 0 ||
            a->slots[t] >= a->num_slots)
            return -1;
        if (a->mirror_rows[t] < 0 || a->mirror_rows[t] >= a->mirror_rows_cap || a->mirror_pos[t] < 0 ||
            a->mirror_pos[t] >= a->mirror_cap)
            return -1;
    }
    return 0;
}

/* o = rope(x) for one head at the position whose table rows are c and s. */
static void rope_head(const float *x, const float *c, const float *s, int d, float *o) {
    const int half = d / 2;
    for (int i = 0; i < half; i++) {
        const float p = x[i] * c[i], q = x[i + half] * s[i];
        o[i] = p + q;
    }
    for (int i = half; i < d; i++) {
        const float p = x[i] * c[i], q = x[i - half] * s[i];
        o[i] = p + q;
    }
}

void rope_store_q(const rope_store_args *a) {
    const int d = a->head_dim;
    const size_t width = (size_t)(a->heads + 2 * a->kv_heads) * d;
    for (int t = 0; t < a->rows; t++) {
        const float *c = a->cos + (size_t)a->positions[t] * d, *s = a->ssin + (size_t)a->positions[t] * d;
        for (int h = 0; h < a->heads; h++)
            rope_head(a->qkv + (size_t)t * width + (size_t)h * d, c, s, d, a->q_out + ((size_t)t * a->heads + h) * d);
    }
}

void rope_store_kv(const rope_store_args *a) {
    const int d = a->head_dim;
    const size_t width = (size_t)(a->heads + 2 * a->kv_heads) * d, kv_width = (size_t)a->kv_heads * d;
    for (int t = 0; t < a->rows; t++) {
        const float *row = a->qkv + (size_t)t * width;
        const float *c = a->cos + (size_t)a->positions[t] * d, *s = a->ssin + (size_t)a->positions[t] * d;
        float *pk = a->pool_k + (size_t)a->slots[t] * kv_width, *pv = a->pool_v + (size_t)a->slots[t] * kv_width;
        const size_t at = (size_t)a->mirror_rows[t] * a->mirror_row_stride + (size_t)a->mirror_pos[t] * d;
        for (int h = 0; h < a->kv_heads; h++) rope_head(row + (size_t)(a->heads + h) * d, c, s, d, pk + (size_t)h * d);
        for (int h = 0; h < a->kv_heads; h++) {
            const float *kh = pk + (size_t)h * d;
            const float *vh = row + (size_t)(a->heads + a->kv_heads + h) * d;
            float *mk = a->mirror_k + at + (size_t)h * a->mirror_head_stride;
            float *mv = a->mirror_v + at + (size_t)h * a->mirror_head_stride;
            for (int i = 0; i < d; i++) {
                pv[(size_t)h * d + i] = vh[i];
                mk[i] = kh[i];
                mv[i] = vh[i];
            }
        }
    }
}

int native_rope_store(const float *qkv, int rows, int heads, int kv_heads, int head_dim, const long *positions,
                      const float *cos, const float *ssin, long max_position, float *q_out, float *pool_k,
                      float *pool_v, const long *slots, long num_slots, float *mirror_k, float *mirror_v,
                      long mirror_row_stride, long mirror_head_stride, const long *mirror_rows,
                      const long *mirror_pos, long mirror_rows_cap, long mirror_cap) {
    const rope_store_args a = {.qkv = qkv, .rows = rows, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                               .positions = positions, .cos = cos, .ssin = ssin, .max_position = max_position,
                               .q_out = q_out, .pool_k = pool_k, .pool_v = pool_v, .slots = slots,
                               .num_slots = num_slots, .mirror_k = mirror_k, .mirror_v = mirror_v,
                               .mirror_row_stride = mirror_row_stride, .mirror_head_stride = mirror_head_stride,
                               .mirror_rows = mirror_rows, .mirror_pos = mirror_pos,
                               .mirror_rows_cap = mirror_rows_cap, .mirror_cap = mirror_cap};
    if (rope_store_check(&a) != 0) return -1;
    rope_store_q(&a);
    rope_store_kv(&a);
    return 0;
}
