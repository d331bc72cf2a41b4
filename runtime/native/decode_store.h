/* decode_store.c's pieces, for the decode layers (decode_layers.c), which check a pass's indices once and then
 * run each layer's q part and k/v part on two threads. */
#ifndef RADIXCACHE_DECODE_STORE_H
#define RADIXCACHE_DECODE_STORE_H

/* One layer's RoPE and stores: the arguments of native_rope_store, in its order. */
typedef struct {
    const float *qkv;
    int rows, heads, kv_heads, head_dim;
    const long *positions;
    const float *cos, *ssin;
    long max_position;
    float *q_out, *pool_k, *pool_v;
    const long *slots;
    long num_slots;
    float *mirror_k, *mirror_v;
    long mirror_row_stride, mirror_head_stride;
    const long *mirror_rows, *mirror_pos;
    long mirror_rows_cap, mirror_cap;
} rope_store_args;

/* 0, or -1 for a shape, position, slot or mirror place out of range (the same for every layer of a pass). */
int rope_store_check(const rope_store_args *a);
/* The q heads' RoPE into q_out. */
void rope_store_q(const rope_store_args *a);
/* The k heads' RoPE and the v heads: into the pool's slot and the mirror's place. */
void rope_store_kv(const rope_store_args *a);
#endif
