/* A decode pass's decoder layers, checked, as the two ways of running them take it: with barriers
 * (decode_layers.c) or with claims other threads may finish (decode_team.c). */
#ifndef RADIXCACHE_DECODE_PASS_H
#define RADIXCACHE_DECODE_PASS_H
#include <stddef.h>

#include "decode_attention.h"
#include "decode_store.h"
#include "team_product.h"

/* One decoder layer's weights. Layout must match NativeLayer in runtime/model/native_layers.py. */
typedef struct {
    const float *ln_in;
    const float *ln_post;
    native_linear qkv, o, gate_up, down;
} native_layer;

/* Everything a pass's layers read, every index checked (decode_layers.c's native_decode_layers). */
typedef struct {
    const native_layer *layers;
    int num_layers, rows, hidden, heads, kv_heads, head_dim, inter;
    float eps;
    float *x; /* [rows, hidden], updated in place */
    rope_store_args rope; /* qkv, q_out, the pool's and the mirror's layer: set per layer */
    long pool_layer_stride;
    float *const *mirror_k, *const *mirror_v;
    long mirror_row_stride, mirror_head_stride;
    const long *order, *inverse; /* mirror rows out of batch order, or both NULL */
    attn_plan plan; /* its part is NULL on decode_team.c's way (the seats keep their own) */
    /* each layer's four products' part starts (qkv, o, gate_up, down) and the head's: team_check's, made once by
     * decode_layers' argument check and read by both ways */
    const int (*starts)[4][BLOCKDOT_MAX_PARTS + 1];
    const int *head_start;
    size_t qkv_width, att_width, prep_bytes; /* prep_bytes: the largest product's prepared activations */
    /* the step's head where it runs in the same call (native_decode_step), else NULL: logits `[rows, head->out]` =
     * head(rms_norm(x, head_norm)) */
    const float *head_norm;
    const native_linear *head;
    float *logits;
} decode_pass;

/* Layer l's RoPE and store arguments over `qkv`, q heads into `q`. */
static inline rope_store_args pass_rope(const decode_pass *d, int l, const float *qkv, float *q) {
    rope_store_args here = d->rope;
    here.qkv = qkv;
    here.q_out = q;
    here.pool_k += (size_t)l * d->pool_layer_stride;
    here.pool_v += (size_t)l * d->pool_layer_stride;
    here.mirror_k = d->mirror_k[l];
    here.mirror_v = d->mirror_v[l];
    return here;
}

/* How decode_team.c runs a pass (tests): thread `stall_thread` (-1: none) loses its core after each claim it
 * publishes, for up to `stall_us` microseconds (takeover.h's takeover_test); claims finished for another thread
 * added to `*taken` where not NULL. stall_us < 0: the helper seat `stall_thread` loses its core for -stall_us
 * microseconds just before its first K/V store instead, and the step closes meanwhile (decode_team.c's
 * late_store); `*taken` gets 1 where it was inside the step then. */
typedef struct {
    int stall_thread, stall_us;
    long *taken;
    int barriers; /* tests: the barriers' way whatever fits (native_decode_step_barriers) */
} team_options;

int native_rms_norm(const float *x, const float *w, int rows, int cols, float eps, float *out);
int native_silu_mul(const float *gu, int rows, int inter, float *out);
/* native_silu_mul's rows on the calling thread alone (never a parallel region: decode_team.c's helpers are not
 * OpenMP threads, and a region opened there would start a team of its own). */
void silu_mul_rows(const float *gu, int rows, int inter, float *out);
/* 1 when decode_team_run takes a pass of `team` threads (few rows, every phase's units in a claim word). */
int decode_team_fits(const decode_pass *d, int team);
/* The pass on `team` threads without barriers between its phases: 0, or -2 when scratch cannot be allocated. */
int decode_team_run(const decode_pass *d, int team, const team_options *opt);
#endif
