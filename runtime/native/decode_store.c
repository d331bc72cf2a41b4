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

int native_rope_store(const float *qkv, int rows, int heads, int kv_heads, int head_dim, const long *positions,
                      const float *cos, const float *ssin, long max_position, float *q_out, float *pool_k,
                      float *pool_v, const long *slots, long num_slots, float *mirror_k, float *mirror_v,
                      long mirror_row_stride, long mirror_head_stride, const long *mirror_rows,
                      const long *mirror_pos, long mirror_rows_cap, long mirror_cap) {
    if (rows < 1 || heads < 1 || kv_heads < 1 || head_dim < 2 || head_dim % 2) return -1;
    for (int t = 0; t < rows; t++) {
        if (positions[t] < 0 || positions[t] >= max_position || slots[t] < 0 || slots[t] >= num_slots) return -1;
        if (mirror_rows[t] < 0 || mirror_rows[t] >= mirror_rows_cap || mirror_pos[t] < 0 ||
            mirror_pos[t] >= mirror_cap)
            return -1;
    }
    const int d = head_dim, half = head_dim / 2;
    const size_t width = (size_t)(heads + 2 * kv_heads) * d, kv_width = (size_t)kv_heads * d;
    for (int t = 0; t < rows; t++) {
        const float *row = qkv + (size_t)t * width;
        const float *c = cos + (size_t)positions[t] * d;
        const float *s = ssin + (size_t)positions[t] * d;
        float *pk = pool_k + (size_t)slots[t] * kv_width;
        float *pv = pool_v + (size_t)slots[t] * kv_width;
        const size_t at = (size_t)mirror_rows[t] * mirror_row_stride + (size_t)mirror_pos[t] * d;
        for (int h = 0; h < heads + kv_heads; h++) {
            const float *x = row + (size_t)h * d;
            float *o = h < heads ? q_out + ((size_t)t * heads + h) * d : pk + (size_t)(h - heads) * d;
            for (int i = 0; i < half; i++) {
                const float a = x[i] * c[i], b = x[i + half] * s[i];
                o[i] = a + b;
            }
            for (int i = half; i < d; i++) {
                const float a = x[i] * c[i], b = x[i - half] * s[i];
                o[i] = a + b;
            }
        }
        for (int h = 0; h < kv_heads; h++) {
            const float *kh = pk + (size_t)h * d;
            const float *vh = row + (size_t)(heads + kv_heads + h) * d;
            float *mk = mirror_k + at + (size_t)h * mirror_head_stride;
            float *mv = mirror_v + at + (size_t)h * mirror_head_stride;
            for (int i = 0; i < d; i++) {
                pv[(size_t)h * d + i] = vh[i];
                mk[i] = kh[i];
                mv[i] = vh[i];
            }
        }
    }
    return 0;
}
