/* A decode pass's layers on a team whose threads never wait for each other between phases (takeover.h).
 *
 * The barriers' way (decode_layers.c) runs a layer's norms, activations, RoPE and residual adds on thread 0 and
 * makes the team meet ten times a layer. On a busy machine a thread of ours that loses its core holds the others at
 * the next meeting for the rest of a scheduler slice: beside two busy single-thread processes on 2 cores, 2 threads
 * that way decoded SmolLM2's gguf step at 6-18% of their idle speed, one thread alone at about 35%.
 *
 * Here each thread runs the whole layer sequence itself: the cheap parts (norms, the products' prepared
 * activations, RoPE of q, the attention's merge, SiLU, bias and residual adds) on its own copies, which come out
 * the same bits on every thread because they are computed by the same code from the same inputs; the K/V store by
 * every thread (the same bits into the same places); and the expensive parts, the four products and the
 * attention's items, as shared phases whose units any thread may finish for another (takeover.h). Every phase
 * writes outputs of its own for the whole pass (a layer's products and attention parts are not reused by the next
 * layer), so a late thread writing a unit someone else already finished writes it where nothing else is kept. With
 * native_decode_step the final norm (each thread's own) and the output head's rows (one more shared phase, into
 * the caller's logits) run in the same region. The region's end is the one place a thread waits for the others,
 * once a step (the layers' region, the head's and the greedy tokens' were three such places before).
 *
 * The cost: each thread repeats the cheap parts (a few microseconds a layer at batch 1), and a pass keeps its
 * layers' outputs: (qkv + 2 hidden + 2 inter) floats a row a layer and the attention's items packed, so the way is
 * taken for at most TEAM_MAX_ROWS rows and TEAM_MAX_BYTES of them. The result is the barriers' way's bits
 * (tests/runtime/engine/test_decode_team.py). */
#include <stdlib.h>
#include <string.h>

#include "attention_parts.h"
#include "decode_pass.h"
#include "takeover.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define TEAM_MAX_ROWS 8
#define TEAM_MAX_BYTES (32L << 20) /* the layers' outputs a pass keeps (SmolLM2, 1 row, 513 positions: 1 MB) */
#define PHASES_PER_LAYER 5 /* the qkv product, the attention's items, the o, gate_up and down products */

/* A unit's results are computed into the thread's own staging copy of the phase's output, then copied to the
 * shared one: the kernels write partial values on the way (the attention accumulates into its parts), and a late
 * owner's partial values over a finished unit would be read by the threads that moved on. Copies write final
 * values only, the same bits whoever copies. */
typedef struct {
    const native_linear *w;
    const int *start;
    const float *x;
    const void *prep;
    float *y, *stage; /* stage: this thread's, laid out as y */
    int rows;
} product_work;

static void product_units(const void *work, int lo, int hi) {
    const product_work *p = work;
    team_claim(p->w, p->start, p->x, p->rows, p->prep, p->stage, lo, hi);
    const int total = p->start[p->w->nparts], grouped = p->w->kernel == KERNEL_INT8 || p->w->kernel == KERNEL_INT16;
    const int first = grouped ? 4 * lo : lo, end = grouped ? (4 * hi < total ? 4 * hi : total) : hi;
    for (int t = 0; t < p->rows; t++) {
        const size_t at = (size_t)t * p->w->out + first;
        memcpy(p->y + at, p->stage + at, sizeof(float) * (size_t)(end - first));
    }
}

typedef struct {
    const attn_plan *plan;
    float *part, *stage; /* part: packed (attn_items_pack); stage: this thread's, in plan->part's layout */
    const float *q, *k, *v;
    long row_stride, head_stride;
} attention_work;

static void attention_units(const void *work, int lo, int hi) {
    const attention_work *a = work;
    attn_items(a->plan, a->stage, a->q, a->k, a->v, a->row_stride, a->head_stride, lo, hi);
    attn_items_pack(a->plan, a->stage, a->part, lo, hi);
}

static size_t aligned_floats(size_t n) { return (n + 15) / 16 * 16; }

/* Floats of one layer's attention items in plan->part's layout (a thread's staging copy). */
static size_t part_floats(const attn_plan *plan) {
    return aligned_floats((size_t)plan->items * ATTN_MAX_GROUP * plan->per_head);
}

/* Floats of one layer's shared outputs: its four products' and its attention's parts. */
static size_t layer_floats(const decode_pass *d) {
    const size_t rows = (size_t)d->rows;
    return aligned_floats(rows * d->qkv_width) + 2 * aligned_floats(rows * d->hidden) +
           aligned_floats(rows * 2 * d->inter) + aligned_floats(attn_packed_floats(&d->plan));
}

int decode_team_fits(const decode_pass *d, int team) {
    if (team < 2 || d->rows > TEAM_MAX_ROWS || d->plan.items > TAKEOVER_MAX_UNITS) return 0;
    if (layer_floats(d) * sizeof(float) * (size_t)d->num_layers > (size_t)TEAM_MAX_BYTES) return 0;
    if (d->head != NULL) { /* its output is the caller's logits, whole values only: no bias added after */
        int start[BLOCKDOT_MAX_PARTS + 1];
        if (d->head->bias != NULL || team_check(d->head, d->rows, start) != 0) return 0;
        if (team_units(d->head, start) > TAKEOVER_MAX_UNITS) return 0;
    }
    for (int l = 0; l < d->num_layers; l++) {
        const native_linear *w[4] = {&d->layers[l].qkv, &d->layers[l].o, &d->layers[l].gate_up, &d->layers[l].down};
        for (int k = 0; k < 4; k++) {
            int start[BLOCKDOT_MAX_PARTS + 1];
            team_check(w[k], d->rows, start);
            if (team_units(w[k], start) > TAKEOVER_MAX_UNITS) return 0;
        }
    }
    return 1;
}

/* out = y + bias (the barriers' way adds the bias into y: the same sum), or y itself without a bias. */
static const float *with_bias(const native_linear *w, const float *y, int rows, float *out) {
    if (w->bias == NULL) return y;
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < w->out; i++) out[(size_t)t * w->out + i] = y[(size_t)t * w->out + i] + w->bias[i];
    return out;
}

/* x = x + (y + bias), the barriers' way's residual add. */
static void add_product(const native_linear *w, float *x, const float *y, int rows) {
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < w->out; i++) {
            const float v = w->bias != NULL ? y[(size_t)t * w->out + i] + w->bias[i] : y[(size_t)t * w->out + i];
            x[(size_t)t * w->out + i] = x[(size_t)t * w->out + i] + v;
        }
}

/* What a thread needs to take part in a pass's shared phases. */
typedef struct {
    row_share *shares; /* the pass's phases' shares, `team` a phase */
    phase_count *counts;
    live_claim *slots;
    int team, me;
    const takeover_test *test;
} team_seat;

/* Thread `s->me`'s part of product `w` (phase `phase`): x's activations prepared into its own `prep`, then the
 * product's units into y until every one is done. Returns the claims it finished for another thread. */
static long team_product(const team_seat *s, int phase, const native_linear *w, const int *start, const float *x,
                         int rows, void *prep, float *stage, float *y) {
    team_prep_acts(w, x, rows, prep);
    const product_work work = {w, start, x, prep, y, stage, rows};
    return takeover_phase(phase, team_units(w, start), s->shares + (size_t)phase * s->team, s->team, team_chunk(w),
                          s->slots, s->counts + phase, s->me, product_units, &work, s->test);
}

/* One thread's copies of the cheap parts' buffers. */
typedef struct {
    float *x, *h, *qkv, *q, *q_rows, *att_rows, *att, *gu, *act, *stage, *part;
    void *prep;
} own_buffers;

static void free_all(void *scratch, void *shares, void *counts, void *slots, void *starts) {
    free(scratch);
    free(shares);
    free(counts);
    free(slots);
    free(starts);
}

int decode_team_run(const decode_pass *d, int team, const team_options *opt) {
    const int rows = d->rows, hidden = d->hidden, inter = d->inter, layers = d->num_layers;
    const size_t qkv_n = (size_t)rows * d->qkv_width, att_n = (size_t)rows * d->att_width;
    const size_t hid_n = (size_t)rows * hidden, gu_n = (size_t)rows * 2 * inter, act_n = (size_t)rows * inter;
    /* shared, per layer: the four products' outputs and the attention's parts */
    const size_t layer_n = layer_floats(d);
    /* each thread's own */
    size_t stage_n = gu_n > qkv_n ? gu_n : qkv_n; /* the widest product's output */
    stage_n = hid_n > stage_n ? hid_n : stage_n;
    const size_t head_n = d->head != NULL ? (size_t)rows * d->head->out : 0;
    stage_n = head_n > stage_n ? head_n : stage_n;
    const size_t own_n = 2 * aligned_floats(hid_n) + aligned_floats(qkv_n) + 4 * aligned_floats(att_n) +
                         aligned_floats(gu_n) + aligned_floats(act_n) + aligned_floats(stage_n) +
                         part_floats(&d->plan) + aligned_floats((d->prep_bytes + 3) / 4);
    const int phases = PHASES_PER_LAYER * layers + (d->head != NULL); /* the head's product last */
    float *scratch = aligned_alloc(64, (layer_n * layers + own_n * team) * sizeof(float));
    row_share *shares = aligned_alloc(64, sizeof(row_share) * (size_t)phases * team);
    phase_count *counts = aligned_alloc(64, sizeof(phase_count) * (size_t)phases);
    live_claim *slots = aligned_alloc(64, sizeof(live_claim) * (size_t)team);
    int(*starts)[4][BLOCKDOT_MAX_PARTS + 1] = malloc(sizeof(*starts) * (size_t)layers);
    const int whole = scratch != NULL && shares != NULL && counts != NULL && slots != NULL && starts != NULL;
    if (!whole) {
        free_all(scratch, shares, counts, slots, starts);
        return -2;
    }
    /* every phase's shares before the region: no thread sets up anything another one reads */
    for (int l = 0; l < layers; l++) {
        const native_layer *L = d->layers + l;
        const native_linear *w[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        const int product_phase[4] = {0, 2, 3, 4};
        for (int k = 0; k < 4; k++) {
            team_check(w[k], rows, starts[l][k]); /* checked before: the starts */
            row_shares_init(shares + (size_t)(PHASES_PER_LAYER * l + product_phase[k]) * team, team,
                            team_units(w[k], starts[l][k]));
        }
        row_share *attn = shares + (size_t)(PHASES_PER_LAYER * l + 1) * team; /* runs cut by positions */
        for (int t = 0; t < team; t++) {
            const uint64_t lo = (uint64_t)attn_first_item(&d->plan, t, team);
            const uint64_t hi = (uint64_t)attn_first_item(&d->plan, t + 1, team);
            atomic_init(&attn[t].span, hi << 32 | lo);
        }
    }
    int head_start[BLOCKDOT_MAX_PARTS + 1];
    if (d->head != NULL) {
        team_check(d->head, rows, head_start); /* checked before: the starts */
        row_shares_init(shares + (size_t)(phases - 1) * team, team, team_units(d->head, head_start));
    }
    for (int p = 0; p < phases; p++) atomic_init(&counts[p].done, 0);
    for (int t = 0; t < team; t++) atomic_init(&slots[t].word, 0);
    const long *order = d->order, *inverse = d->inverse;
    const size_t att_w = d->att_width;
    long taken = 0;
    const takeover_test stalled = {opt->stall_thread, opt->stall_us};
    const takeover_test *test = opt->stall_thread >= 0 && opt->stall_us > 0 ? &stalled : NULL;
#pragma omp parallel num_threads(team) reduction(+ : taken)
    {
        const int me = omp_get_thread_num();
        const team_seat seat = {shares, counts, slots, team, me, test};
        float *at = scratch + layer_n * layers + own_n * me;
        own_buffers b;
        float **next[] = {&b.x, &b.h, &b.qkv, &b.q, &b.q_rows, &b.att_rows, &b.att, &b.gu, &b.act, &b.stage, &b.part};
        const size_t size[] = {hid_n, hid_n, qkv_n, att_n,   att_n,
                               att_n, att_n, gu_n,  act_n, stage_n, part_floats(&d->plan)};
        for (int i = 0; i < 11; i++) {
            *next[i] = at;
            at += aligned_floats(size[i]);
        }
        b.prep = at;
        memcpy(b.x, d->x, hid_n * sizeof(float)); /* d->x is written after the region only */
        for (int l = 0; l < layers; l++) {
            const native_layer *L = d->layers + l;
            float *yqkv = scratch + layer_n * l, *yo = yqkv + aligned_floats(qkv_n), *ygu = yo + aligned_floats(hid_n);
            float *ydown = ygu + aligned_floats(gu_n), *part = ydown + aligned_floats(hid_n);
            const int phase = PHASES_PER_LAYER * l;
            const native_linear *w[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
            int(*start)[BLOCKDOT_MAX_PARTS + 1] = starts[l];
            native_rms_norm(b.x, L->ln_in, rows, hidden, d->eps, b.h);
            taken += team_product(&seat, phase, w[0], start[0], b.h, rows, b.prep, b.stage, yqkv);
            const rope_store_args here = pass_rope(d, l, with_bias(w[0], yqkv, rows, b.qkv), b.q);
            rope_store_q(&here);
            rope_store_kv(&here); /* by every thread: the same bits into the same places, before its attention */
            for (int r = 0; order != NULL && r < rows; r++)
                memcpy(b.q_rows + (size_t)r * att_w, b.q + (size_t)order[r] * att_w, att_w * sizeof(float));
            const float *q_rows = order != NULL ? b.q_rows : b.q;
            float *att_rows = order != NULL ? b.att_rows : b.att;
            const attention_work aw = {&d->plan, part, b.part, q_rows, d->mirror_k[l], d->mirror_v[l],
                                       d->mirror_row_stride, d->mirror_head_stride};
            taken += takeover_phase(phase + 1, d->plan.items, shares + (size_t)(phase + 1) * team, team, 4, slots,
                                    counts + phase + 1, me, attention_units, &aw, test);
            for (int r = 0; r < rows * d->heads; r++) attn_merge_packed(&d->plan, part, att_rows, r);
            for (int t = 0; order != NULL && t < rows; t++)
                memcpy(b.att + (size_t)t * att_w, att_rows + (size_t)inverse[t] * att_w, att_w * sizeof(float));
            taken += team_product(&seat, phase + 2, w[1], start[1], b.att, rows, b.prep, b.stage, yo);
            add_product(w[1], b.x, yo, rows);
            native_rms_norm(b.x, L->ln_post, rows, hidden, d->eps, b.h);
            taken += team_product(&seat, phase + 3, w[2], start[2], b.h, rows, b.prep, b.stage, ygu);
            native_silu_mul(with_bias(w[2], ygu, rows, b.gu), rows, inter, b.act); /* on this thread alone */
            taken += team_product(&seat, phase + 4, w[3], start[3], b.act, rows, b.prep, b.stage, ydown);
            add_product(w[3], b.x, ydown, rows);
        }
        if (d->head != NULL) { /* the final norm on each thread's own copy, the head's rows shared */
            native_rms_norm(b.x, d->head_norm, rows, hidden, d->eps, b.h);
            taken += team_product(&seat, phases - 1, d->head, head_start, b.h, rows, b.prep, b.stage, d->logits);
        }
    }
    memcpy(d->x, scratch + layer_n * layers, hid_n * sizeof(float)); /* thread 0's x: every thread's bits */
    if (opt->taken != NULL) *opt->taken += taken;
    free_all(scratch, shares, counts, slots, starts);
    return 0;
}
