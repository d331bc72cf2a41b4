/* A decode layer's product run by the threads of a parallel region that is already running (decode_layers.c runs
 * every layer of a decode pass in one region): its weights (`native_linear`), checked before the region; its
 * activations prepared by one thread (block sums, or int8 / 16-bit quantisation); then every thread's rows, taken
 * from shares as each kernel's own call takes them (thread_rows.h), with no barrier of its own. The same rows by the
 * same code as blockdot_matmul, qdot_matmul, qdot16_matmul and densedot_matmul, so the same bits. */
#ifndef RADIXCACHE_TEAM_PRODUCT_H
#define RADIXCACHE_TEAM_PRODUCT_H
#include <stddef.h>

#include "ggml_blocks.h"
#include "thread_rows.h"

/* One product: weights as the parts of runtime/model/block_linear.py, `kernel` 0 (blocks, float activations), 1
 * (blocks, int8 activations), 2 (plain float32 rows: densedot.c) or 3 (blocks, 16-bit activations), an optional
 * bias of `out` values. Layout must match NativeLinear in runtime/model/native_layers.py. */
typedef struct {
    const void *const *data;
    const int *kinds;
    const int *rows;
    const float *bias;
    int nparts;
    int cols;
    int out;
    int kernel;
} native_linear;

enum { KERNEL_BLOCKS = 0, KERNEL_INT8 = 1, KERNEL_DENSE = 2, KERNEL_INT16 = 3 };

/* the kernels' pieces (blockdot.c, qdot.c, densedot.c) */
int blockdot_check_parts(int nparts, const int *kinds, const int *rows, int cols, int ntok, int ldy, int *start);
size_t blockdot_prep_floats(int nparts, const int *kinds, int cols, int ntok);
void blockdot_prep(int nparts, const int *kinds, const float *x, int cols, int ntok, float *xsum);
int blockdot_chunk(int kind, int cols);
void blockdot_claim_rows(int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                         const float *x, int ntok, const float *xsum, float *y, int ldy, int lo, int hi);
void blockdot_team_rows(int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                        const float *x, int ntok, const float *xsum, float *y, int ldy, row_share *shares, int count,
                        int me);
size_t qdot_prep_bytes(int wide, int ntok, int cols);
void qdot_prep(int wide, const float *x, int ntok, int cols, void *buf);
int qdot_units(int total);
int qdot_chunk(int kind, int cols);
void qdot_claim_rows(int wide, int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                     int ntok, const void *buf, float *y, int ldy, int g0, int g1);
void qdot_team_rows(int wide, int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                    int ntok, const void *buf, float *y, int ldy, row_share *shares, int count, int me);
int densedot_check(int nparts, const int *kinds, const int *rows, int cols, int ntok, int ldy, int *start);
void densedot_claim_rows(int nparts, const void *const *data, const int *start, int cols, const float *x, int ntok,
                         float *y, int ldy, int lo, int hi);
void densedot_team_rows(int nparts, const void *const *data, const int *start, int cols, const float *x, int ntok,
                        float *y, int ldy, row_share *shares, int count, int me);

/* Checks `w` for `rows` rows of x and fills `start` (each part's first output row): 0, or -1. */
static inline int team_check(const native_linear *w, int rows, int *start) {
    if (w->kernel == KERNEL_DENSE) return densedot_check(w->nparts, w->kinds, w->rows, w->cols, rows, w->out, start);
    if (w->kernel < 0 || w->kernel > KERNEL_INT16) return -1;
    return blockdot_check_parts(w->nparts, w->kinds, w->rows, w->cols, rows, w->out, start);
}

/* Bytes of prepared activations a checked product needs (64-byte aligned storage). */
static inline size_t team_prep_bytes(const native_linear *w, int rows) {
    switch (w->kernel) {
    case KERNEL_BLOCKS: return blockdot_prep_floats(w->nparts, w->kinds, w->cols, rows) * sizeof(float);
    case KERNEL_INT8: return qdot_prep_bytes(0, rows, w->cols);
    case KERNEL_INT16: return qdot_prep_bytes(1, rows, w->cols);
    default: return 0;
    }
}

/* The units a checked product's rows are shared in: rows, or groups of four rows for the integer kernels. */
static inline int team_units(const native_linear *w, const int *start) {
    const int total = start[w->nparts];
    return w->kernel == KERNEL_INT8 || w->kernel == KERNEL_INT16 ? qdot_units(total) : total;
}

/* x's activations prepared for `w` into `prep` (team_prep's code without the shares). */
static inline void team_prep_acts(const native_linear *w, const float *x, int rows, void *prep) {
    if (w->kernel == KERNEL_BLOCKS) blockdot_prep(w->nparts, w->kinds, x, w->cols, rows, (float *)prep);
    if (w->kernel == KERNEL_INT8 || w->kernel == KERNEL_INT16)
        qdot_prep(w->kernel == KERNEL_INT16, x, rows, w->cols, prep);
}

/* By one thread, before the barrier that precedes team_rows: x's prepared activations into `prep`, and `count`
 * shares over the product's units. */
static inline void team_prep(const native_linear *w, const int *start, const float *x, int rows, void *prep,
                             row_share *shares, int count) {
    team_prep_acts(w, x, rows, prep);
    row_shares_init(shares, count, team_units(w, start));
}

/* Units per claim of a checked product (about ROW_CHUNK_BYTES of weights). */
static inline int team_chunk(const native_linear *w) {
    if (w->kernel == KERNEL_DENSE) return row_chunk((long)w->cols * (long)sizeof(float));
    if (w->kernel == KERNEL_BLOCKS) return blockdot_chunk(w->kinds[0], w->cols);
    return qdot_chunk(w->kinds[0], w->cols);
}

/* Units [lo, hi) of a checked product, activations prepared by team_prep's code (any thread's copy: the same
 * bits), y[t * w->out + o]. */
static inline void team_claim(const native_linear *w, const int *start, const float *x, int rows, const void *prep,
                              float *y, int lo, int hi) {
    switch (w->kernel) {
    case KERNEL_DENSE: densedot_claim_rows(w->nparts, w->data, start, w->cols, x, rows, y, w->out, lo, hi); break;
    case KERNEL_BLOCKS:
        blockdot_claim_rows(w->nparts, w->data, w->kinds, start, w->cols, x, rows, (const float *)prep, y, w->out, lo,
                            hi);
        break;
    default:
        qdot_claim_rows(w->kernel == KERNEL_INT16, w->nparts, w->data, w->kinds, start, w->cols, rows, prep, y, w->out,
                        lo, hi);
    }
}

/* By every thread of the region (thread `me`): the rows it claims, y[t * w->out + o]; no barrier. */
static inline void team_rows(const native_linear *w, const int *start, const float *x, int rows, const void *prep,
                             float *y, row_share *shares, int count, int me) {
    switch (w->kernel) {
    case KERNEL_DENSE:
        densedot_team_rows(w->nparts, w->data, start, w->cols, x, rows, y, w->out, shares, count, me);
        break;
    case KERNEL_BLOCKS:
        blockdot_team_rows(w->nparts, w->data, w->kinds, start, w->cols, x, rows, (const float *)prep, y, w->out,
                           shares, count, me);
        break;
    default:
        qdot_team_rows(w->kernel == KERNEL_INT16, w->nparts, w->data, w->kinds, start, w->cols, rows, prep, y, w->out,
                       shares, count, me);
    }
}

/* y[t, i] += bias[i] (one thread, after the product's rows are whole), where the product has a bias. */
static inline void team_bias(const native_linear *w, float *y, int rows) {
    for (int t = 0; w->bias != NULL && t < rows; t++)
        for (int i = 0; i < w->out; i++) y[(size_t)t * w->out + i] += w->bias[i];
}
#endif
