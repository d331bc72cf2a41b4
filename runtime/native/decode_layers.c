/* A decode pass's decoder layers in one native call (runtime/model/native_layers.py), and SiLU(gate) * up.
 *
 * The eager layer of a quant="gguf" decode step is about a dozen Python-level calls (two norms, four block
 * products, the fused RoPE and K/V stores, the mirror's attention, SiLU, a product and two residual adds): a few
 * microseconds of interpreter and dispatch each, about 1.5 ms of a 10 ms SmolLM2 step at batch 1 on this
 * project's 2-core machine. `native_decode_layers` runs the same sequence of the same native functions over
 * every layer from C, in the same order on the same buffers, so its result is the eager pass's bits
 * (tests/runtime/engine/test_native_layers.py):
 *
 *   h = rms_norm(x, ln_in); qkv = Wqkv h (+ bias); q = rope_store(qkv) (pool and mirror K/V written);
 *   a = decode_attention(q, mirror); x = x + (Wo a (+ bias));
 *   h = rms_norm(x, ln_post); gu = Wgu h (+ bias); x = x + (Wdown silu_mul(gu) (+ bias)).
 *
 * A product runs the rows of blockdot (float activations), qdot (int8 or 16-bit) or densedot (a float32 model's
 * plain weights), as the layer's `kernel` says. `native_decode_head` (at the end) runs what follows the last
 * layer: the final norm, the output head and each row's greedy token (row_argmax.c); `native_decode_step` runs
 * the layers and that in one call.
 *
 * On two threads or more a pass of a few rows runs decode_team.c's way: every thread walks the whole layer sequence,
 * the cheap steps on its own copies, the products and the attention's items shared as claims that a thread finishes
 * for another whose core the machine took (no barrier between the steps; the same bits). Otherwise (one thread, or
 * a pass whose layers' outputs would take more than decode_team.c keeps) the barriers' way below.
 *
 * The barriers' way runs the layers in one parallel region: the products' rows and the attention's items are
 * shared by the threads (team_product.h, attn_team), the q heads' RoPE goes to thread 0 and the k and v heads' RoPE
 * and stores to the last thread (decode_store.h), the norms, residual adds, SiLU and each product's prepared
 * activations are thread 0's, and barriers order them. A call per product and two per attention each started a
 * region of their own before (5 regions a layer): the 30 layers of SmolLM2's fp32 decode step take 1.1-2.7% less
 * time in one region where the memory reads fast, 0.5% where it reads 35-38 GB/s (steps alternating between the
 * builds, 372 pairs a run, 2026-12-06; gguf 0.6%), and nothing is written when a product's arguments are wrong
 * (every layer's are checked first). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "decode_pass.h"
#include "vector_exp.h"

int blockdot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy);
int qdot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols, const float *x,
                int ntok, float *y, int ldy);
int qdot16_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols, const float *x,
                  int ntok, float *y, int ldy);
int densedot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy);
int native_row_argmax(const float *x, int rows, long cols, long *best);
void row_argmax_one_thread(const float *x, int rows, long cols, long *best);
int native_decode_head(const float *x, int rows, int hidden, float eps, const float *norm, const native_linear *head,
                       float *logits, long *best);

#define SILU_EXP_MAX 88.0f /* exp(88) ~ 1.7e38: the largest exponent the vector exp takes (vector_exp.h) */

/* out[t, i] = silu(gu[t, i]) * gu[t, inter + i], silu(g) = g / (1 + exp(-g)), for t < rows, i < inter. Below
 * g = -SILU_EXP_MAX, where exp(-g) would be clamped, silu(g) is g * 0 (-0, NaN for -inf), what g / (1 + inf) is:
 * g / (1 + exp(88)) grew with |g| to -1.8 at g = -3e38, where SiLU is -0. Lanes and the scalar tail see the same
 * positions whatever the thread count: the result never depends on it. */
static void silu_mul_row(const float *g, const float *u, int inter, float *o) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= inter; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv), _mm512_set1_ps(SILU_EXP_MAX)));
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        const __mmask16 far = _mm512_cmp_ps_mask(gv, _mm512_set1_ps(-SILU_EXP_MAX), _CMP_LT_OQ);
        s = _mm512_mask_mul_ps(s, far, gv, _mm512_setzero_ps());
        _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= inter; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv), _mm256_set1_ps(SILU_EXP_MAX)));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        const __m256 far = _mm256_cmp_ps(gv, _mm256_set1_ps(-SILU_EXP_MAX), _CMP_LT_OQ);
        s = _mm256_blendv_ps(s, _mm256_mul_ps(gv, _mm256_setzero_ps()), far);
        _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < inter; i++) {
        const float e = expf(fminf(-g[i], SILU_EXP_MAX));
        const float s = g[i] < -SILU_EXP_MAX ? g[i] * 0.0f : g[i] / (1.0f + e);
        o[i] = s * u[i];
    }
}

int native_silu_mul(const float *gu, int rows, int inter, float *out) {
    if (rows < 0 || inter < 1) return -1;
#pragma omp parallel for schedule(static) if ((long)rows * inter >= 65536)
    for (int t = 0; t < rows; t++)
        silu_mul_row(gu + (size_t)t * 2 * inter, gu + (size_t)t * 2 * inter + inter, inter, out + (size_t)t * inter);
    return 0;
}

void silu_mul_rows(const float *gu, int rows, int inter, float *out) {
    for (int t = 0; t < rows; t++)
        silu_mul_row(gu + (size_t)t * 2 * inter, gu + (size_t)t * 2 * inter + inter, inter, out + (size_t)t * inter);
}

static int product(const native_linear *w, const float *x, int rows, float *y) {
    typedef int (*matmul_fn)(int, const void *const *, const int *, const int *, int, const float *, int, float *, int);
    static const matmul_fn kernels[4] = {blockdot_matmul, qdot_matmul, densedot_matmul, qdot16_matmul};
    if (w->kernel < 0 || w->kernel > 3) return -1;
    const int status = kernels[w->kernel](w->nparts, w->data, w->kinds, w->rows, w->cols, x, rows, y, w->out);
    if (status == 0) team_bias(w, y, rows);
    return status;
}

static void add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* Every thread of the layers' region: a barrier (thread 0 has prepared the product), its rows of the product
 * (team_product.h), a barrier (y is whole). */
static void product_rows(const native_linear *w, const int *start, const float *x, int rows, const void *prep, float *y,
                         row_share *shares, int count, int me) {
#pragma omp barrier
    team_rows(w, start, x, rows, prep, y, shares, count, me);
#pragma omp barrier
}

/* The pass with barriers between its phases: every thread waits for the others at each. */
static int run_with_barriers(const decode_pass *d) {
    const int rows = d->rows, hidden = d->hidden, inter = d->inter;
    const size_t qkv_width = d->qkv_width, att_width = d->att_width;
    const size_t sizes[9] = {(size_t)rows * hidden,    (size_t)rows * qkv_width, (size_t)rows * att_width,
                             (size_t)rows * att_width, (size_t)rows * 2 * inter, (size_t)rows * inter,
                             (size_t)rows * att_width, (size_t)rows * att_width, (d->prep_bytes + 3) / 4};
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += (sizes[i] + 16) / 16 * 16; /* 64-byte aligned pieces */
    float *scratch = aligned_alloc(64, total * sizeof(float));
    if (scratch == NULL) return -2;
    float *piece[9];
    float *at = scratch;
    for (int i = 0; i < 9; i++) {
        piece[i] = at;
        at += (sizes[i] + 16) / 16 * 16;
    }
    float *x = d->x, *h = piece[0], *qkv = piece[1], *q = piece[2], *att = piece[3], *gu = piece[4], *act = piece[5];
    void *prep = piece[8];
    const long *order = d->order, *inverse = d->inverse;
    /* mirror rows out of batch order: q is taken to row order for the attention and its output back, as the
     * eager mirror does with index_select (copies: the same bits) */
    float *q_rows = order != NULL ? piece[6] : q, *att_rows = order != NULL ? piece[7] : att;
    const int team = omp_get_max_threads();
    row_share shares[4][team]; /* each product's, set by thread 0 before the barrier that precedes its rows */
#pragma omp parallel num_threads(team)
    {
        const int me = omp_get_thread_num();
        for (int l = 0; l < d->num_layers; l++) {
            const native_layer *L = d->layers + l;
            const native_linear *w[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
            const int(*start)[BLOCKDOT_MAX_PARTS + 1] = d->starts[l];
            if (me == 0) {
                native_rms_norm(x, L->ln_in, rows, hidden, d->eps, h);
                team_prep(w[0], start[0], h, rows, prep, shares[0], team);
            }
            product_rows(w[0], start[0], h, rows, prep, qkv, shares[0], team, me);
            if (w[0]->bias != NULL) { /* the same for every thread: all meet the barrier, or none */
                if (me == 0) team_bias(w[0], qkv, rows);
#pragma omp barrier
            }
            /* the q heads' RoPE on thread 0, the k and v heads' (the other end of qkv, most of it written by the
             * last thread's share) and their stores on the last thread */
            const rope_store_args here = pass_rope(d, l, qkv, q);
            if (me == 0) {
                rope_store_q(&here);
                for (int r = 0; order != NULL && r < rows; r++)
                    memcpy(q_rows + (size_t)r * att_width, q + (size_t)order[r] * att_width, att_width * sizeof(float));
            }
            if (me == omp_get_num_threads() - 1) rope_store_kv(&here);
#pragma omp barrier
            attn_team(&d->plan, q_rows, d->mirror_k[l], d->mirror_v[l], d->mirror_row_stride, d->mirror_head_stride,
                      att_rows);
            if (me == 0) {
                for (int t = 0; order != NULL && t < rows; t++)
                    memcpy(att + (size_t)t * att_width, att_rows + (size_t)inverse[t] * att_width,
                           att_width * sizeof(float));
                team_prep(w[1], start[1], att, rows, prep, shares[1], team);
            }
            product_rows(w[1], start[1], att, rows, prep, h, shares[1], team, me); /* h is free until the next norm */
            if (me == 0) {
                team_bias(w[1], h, rows);
                add_into(x, h, (size_t)rows * hidden);
                native_rms_norm(x, L->ln_post, rows, hidden, d->eps, h);
                team_prep(w[2], start[2], h, rows, prep, shares[2], team);
            }
            product_rows(w[2], start[2], h, rows, prep, gu, shares[2], team, me);
            if (me == 0) {
                team_bias(w[2], gu, rows);
                native_silu_mul(gu, rows, inter, act); /* inside the region: on this thread alone */
                team_prep(w[3], start[3], act, rows, prep, shares[3], team);
            }
            product_rows(w[3], start[3], act, rows, prep, h, shares[3], team, me);
            if (me == 0) {
                team_bias(w[3], h, rows);
                add_into(x, h, (size_t)rows * hidden);
            }
        }
    }
    free(scratch);
    return 0;
}

/* The decoder layers over `rows` decode rows x `[rows, hidden]` (updated in place), as native_decode_layers says;
 * `opt` NULL: decode_team.c's run on `team` seats where it fits the pass, else the barriers'; not NULL:
 * decode_team.c's, or -1. */
static int decode_layers(const native_layer *layers, int num_layers, float *x, int rows, int hidden, int heads,
                         int kv_heads, int head_dim, int inter, float eps, const long *positions, const float *cos,
                         const float *ssin, long max_position, float *pool, long pool_layer_stride,
                         long pool_v_offset, const long *slots, long num_slots, float *const *mirror_k,
                         float *const *mirror_v, long mirror_row_stride, long mirror_head_stride,
                         const long *mirror_rows, const long *mirror_pos, long mirror_rows_cap, long mirror_cap,
                         const int *lengths, const long *order, const long *inverse, const float *norm,
                         const native_linear *head, float *logits, long *best, int team,
                         const team_options *opt) {
    if (num_layers < 1 || rows < 1 || hidden < 1 || inter < 1 || heads < 1 || head_dim < 1 || team < 0) return -1;
    int head_start[BLOCKDOT_MAX_PARTS + 1];
    if (head != NULL && (head->cols != hidden || norm == NULL || team_check(head, rows, head_start) != 0)) return -1;
    if ((order == NULL) != (inverse == NULL)) return -1;
    for (int t = 0; order != NULL && t < rows; t++)
        if (order[t] < 0 || order[t] >= rows || inverse[t] < 0 || inverse[t] >= rows) return -1;
    /* every product checked before anything runs, its part starts kept for both ways; the largest prepared
     * activations */
    int(*starts)[4][BLOCKDOT_MAX_PARTS + 1] = malloc(sizeof(*starts) * (size_t)num_layers);
    if (starts == NULL) return -2;
    size_t prep_bytes = 0;
    for (int l = 0; l < num_layers; l++) {
        const native_linear *w[4] = {&layers[l].qkv, &layers[l].o, &layers[l].gate_up, &layers[l].down};
        for (int k = 0; k < 4; k++) {
            if (team_check(w[k], rows, starts[l][k]) != 0) {
                free(starts);
                return -1;
            }
            const size_t b = team_prep_bytes(w[k], rows);
            prep_bytes = b > prep_bytes ? b : prep_bytes;
        }
    }
    if (head != NULL && team_prep_bytes(head, rows) > prep_bytes) prep_bytes = team_prep_bytes(head, rows);
    /* RoPE and the stores: the same positions, slots and mirror places for every layer, checked once */
    decode_pass d = {.layers = layers, .num_layers = num_layers, .rows = rows, .hidden = hidden, .heads = heads,
                     .kv_heads = kv_heads, .head_dim = head_dim, .inter = inter, .eps = eps, .x = x,
                     .rope = {.rows = rows, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                              .positions = positions, .cos = cos, .ssin = ssin, .max_position = max_position,
                              .pool_k = pool, .pool_v = pool + pool_v_offset, .slots = slots, .num_slots = num_slots,
                              .mirror_row_stride = mirror_row_stride, .mirror_head_stride = mirror_head_stride,
                              .mirror_rows = mirror_rows, .mirror_pos = mirror_pos,
                              .mirror_rows_cap = mirror_rows_cap, .mirror_cap = mirror_cap},
                     .pool_layer_stride = pool_layer_stride, .mirror_k = mirror_k, .mirror_v = mirror_v,
                     .mirror_row_stride = mirror_row_stride, .mirror_head_stride = mirror_head_stride,
                     .order = order, .inverse = inverse,
                     .starts = (const int(*)[4][BLOCKDOT_MAX_PARTS + 1])starts, .head_start = head_start,
                     .qkv_width = (size_t)(heads + 2 * kv_heads) * head_dim, .att_width = (size_t)heads * head_dim,
                     .prep_bytes = prep_bytes, .head_norm = norm, .head = head, .logits = logits};
    if (rope_store_check(&d.rope) != 0 ||
        attn_plan_init(&d.plan, rows, heads, kv_heads, head_dim, lengths, (int)mirror_cap, 0) != 0) {
        free(starts);
        return -1;
    }
    if (team == 0) team = omp_get_max_threads();
    const team_options none = {.stall_thread = -1, .stall_us = 0, .taken = NULL, .barriers = 0};
    const int barriers = opt != NULL && opt->barriers;
    int status = -3; /* not run yet */
    if (!barriers && decode_team_fits(&d, team)) {
        status = decode_team_run(&d, team, opt != NULL ? opt : &none);
        if (status == 0 && head != NULL) row_argmax_one_thread(logits, rows, head->out, best);
    } else if (opt != NULL && !barriers) {
        status = -1; /* the tests' way must be the team's */
    }
    if (status == -3 || (status == -2 && opt == NULL)) { /* no team scratch: the barriers' way needs far less */
        status = attn_plan_part(&d.plan) != 0 ? -2 : run_with_barriers(&d);
        if (status == 0 && head != NULL) status = native_decode_head(x, rows, hidden, eps, norm, head, logits, best);
    }
    attn_plan_free(&d.plan);
    free(starts);
    return status;
}

/* The decoder layers over `rows` decode rows x `[rows, hidden]` (updated in place). The pool is one tensor
 * `[layers, 2, slots..]`: layer l's K at pool + l * pool_layer_stride, its V pool_v_offset further. mirror_k[l] /
 * mirror_v[l]: layer l's mirror rows (`[rows cap, kv_heads, cap, head_dim]`, strides as given); lengths: the
 * positions each row attends. A few rows on a `team` of two threads or more run decode_team.c's way (no barrier
 * between the layer's parts: the caller and helpers of the library's own, whatever OpenMP's count), more rows or a
 * team of one the barriers' (an OpenMP region of the calling thread's count, omp_get_max_threads). `team` 0: that
 * count. The loop asks for its configured threads there while it runs torch's kernels on fewer on a busy machine
 * (runtime/engine/threads.py). Returns 0, or -1 for bad arguments (a product's, the lengths', a position, slot or
 * mirror place out of range, a negative team: every one is checked first, so nothing is written then), or -2 when
 * scratch memory cannot be allocated. */
int native_decode_layers(const native_layer *layers, int num_layers, float *x, int rows, int hidden, int heads,
                         int kv_heads, int head_dim, int inter, float eps, const long *positions, const float *cos,
                         const float *ssin, long max_position, float *pool, long pool_layer_stride,
                         long pool_v_offset, const long *slots, long num_slots, float *const *mirror_k,
                         float *const *mirror_v, long mirror_row_stride, long mirror_head_stride,
                         const long *mirror_rows, const long *mirror_pos, long mirror_rows_cap, long mirror_cap,
                         const int *lengths, const long *order, const long *inverse, int team) {
    return decode_layers(layers, num_layers, x, rows, hidden, heads, kv_heads, head_dim, inter, eps, positions, cos,
                         ssin, max_position, pool, pool_layer_stride, pool_v_offset, slots, num_slots, mirror_k,
                         mirror_v, mirror_row_stride, mirror_head_stride, mirror_rows, mirror_pos, mirror_rows_cap,
                         mirror_cap, lengths, order, inverse, NULL, NULL, NULL, NULL, team, NULL);
}

/* native_decode_layers, then what native_decode_head computes (the final norm by `norm`, `head`'s logits, each
 * row's greedy token) in the same call: on decode_team.c's way the head's rows are one more shared phase of the
 * layers' step and the greedy tokens are read by the calling thread after it (no wait for a thread the machine may
 * have descheduled: decode_team.c, team_pool.h); else the barriers' way and then
 * native_decode_head. The same bits either way. Returns as native_decode_layers (-1 also for a head that does not
 * take `hidden` columns or `rows` rows). */
int native_decode_step(const native_layer *layers, int num_layers, float *x, int rows, int hidden, int heads,
                       int kv_heads, int head_dim, int inter, float eps, const long *positions, const float *cos,
                       const float *ssin, long max_position, float *pool, long pool_layer_stride, long pool_v_offset,
                       const long *slots, long num_slots, float *const *mirror_k, float *const *mirror_v,
                       long mirror_row_stride, long mirror_head_stride, const long *mirror_rows,
                       const long *mirror_pos, long mirror_rows_cap, long mirror_cap, const int *lengths,
                       const long *order, const long *inverse, const float *norm, const native_linear *head,
                       float *logits, long *best, int team) {
    if (head == NULL) return -1;
    return decode_layers(layers, num_layers, x, rows, hidden, heads, kv_heads, head_dim, inter, eps, positions, cos,
                         ssin, max_position, pool, pool_layer_stride, pool_v_offset, slots, num_slots, mirror_k,
                         mirror_v, mirror_row_stride, mirror_head_stride, mirror_rows, mirror_pos, mirror_rows_cap,
                         mirror_cap, lengths, order, inverse, norm, head, logits, best, team, NULL);
}

/* For tests (tests/runtime/engine/test_decode_team.py): native_decode_step's arguments (`head` NULL: the layers
 * alone), always decode_team.c's way (-1 where it does not fit the pass), thread `stall_thread` waiting after
 * publishing each claim until another thread took it or `stall_us` microseconds passed; *taken: the claims
 * finished for another thread. */
int native_decode_step_stalled(const native_layer *layers, int num_layers, float *x, int rows, int hidden, int heads,
                               int kv_heads, int head_dim, int inter, float eps, const long *positions,
                               const float *cos, const float *ssin, long max_position, float *pool,
                               long pool_layer_stride, long pool_v_offset, const long *slots, long num_slots,
                               float *const *mirror_k, float *const *mirror_v, long mirror_row_stride,
                               long mirror_head_stride, const long *mirror_rows, const long *mirror_pos,
                               long mirror_rows_cap, long mirror_cap, const int *lengths, const long *order,
                               const long *inverse, const float *norm, const native_linear *head, float *logits,
                               long *best, int team, int stall_thread, int stall_us, long *taken) {
    const team_options opt = {.stall_thread = stall_thread, .stall_us = stall_us, .taken = taken, .barriers = 0};
    *taken = 0;
    return decode_layers(layers, num_layers, x, rows, hidden, heads, kv_heads, head_dim, inter, eps, positions, cos,
                         ssin, max_position, pool, pool_layer_stride, pool_v_offset, slots, num_slots, mirror_k,
                         mirror_v, mirror_row_stride, mirror_head_stride, mirror_rows, mirror_pos, mirror_rows_cap,
                         mirror_cap, lengths, order, inverse, norm, head, logits, best, team, &opt);
}

/* For tests: native_decode_step's arguments (`head` NULL: the layers alone), always the barriers' way, on
 * OpenMP's count of threads (the way a pass too big for decode_team.c's scratch takes; `team` is not read). */
int native_decode_step_barriers(const native_layer *layers, int num_layers, float *x, int rows, int hidden, int heads,
                                int kv_heads, int head_dim, int inter, float eps, const long *positions,
                                const float *cos, const float *ssin, long max_position, float *pool,
                                long pool_layer_stride, long pool_v_offset, const long *slots, long num_slots,
                                float *const *mirror_k, float *const *mirror_v, long mirror_row_stride,
                                long mirror_head_stride, const long *mirror_rows, const long *mirror_pos,
                                long mirror_rows_cap, long mirror_cap, const int *lengths, const long *order,
                                const long *inverse, const float *norm, const native_linear *head, float *logits,
                                long *best, int team) {
    const team_options opt = {.stall_thread = -1, .stall_us = 0, .taken = NULL, .barriers = 1};
    return decode_layers(layers, num_layers, x, rows, hidden, heads, kv_heads, head_dim, inter, eps, positions, cos,
                         ssin, max_position, pool, pool_layer_stride, pool_v_offset, slots, num_slots, mirror_k,
                         mirror_v, mirror_row_stride, mirror_head_stride, mirror_rows, mirror_pos, mirror_rows_cap,
                         mirror_cap, lengths, order, inverse, norm, head, logits, best, team, &opt);
}

/* The decode rows' logits after the last layer: logits = head(rms_norm(x, norm)) `[rows, head->out]`, the same calls
 * as the eager `LlamaModel.logits` (native norm, then the head's product), and best[r] the greedy token of row r
 * (row_argmax.c; -1 where the row's maximum is not finite). Returns 0, or the failing call's status (-1 bad
 * arguments, -2 allocation). */
int native_decode_head(const float *x, int rows, int hidden, float eps, const float *norm, const native_linear *head,
                       float *logits, long *best) {
    if (rows < 1 || hidden < 1 || head == NULL || head->cols != hidden) return -1;
    float *h = aligned_alloc(64, ((size_t)rows * hidden + 16) / 16 * 16 * sizeof(float));
    if (h == NULL) return -2;
    int status = native_rms_norm(x, norm, rows, hidden, eps, h);
    if (status == 0) status = product(head, h, rows, logits);
    free(h);
    if (status == 0) status = native_row_argmax(logits, rows, head->out, best);
    return status;
}
