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
 * native_decode_step the final norm (each thread's own) and the output head's rows (one more shared phase) run in
 * the same step. The threads are the caller (seat 0) and helper threads of team_pool.c, not an OpenMP team: an
 * OpenMP region's end waited, once a step, for a thread the machine had descheduled; the caller here returns as
 * soon as every unit is counted, and a late helper gives up at its next check (team_pool.h says what it may still
 * touch: the step's memory is a pool slot the next step does not reuse, its K/V stores are fenced).
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
    /* the head's output is the caller's logits, whole values only: no bias added after */
    if (d->head != NULL && (d->head->bias != NULL || team_units(d->head, d->head_start) > TAKEOVER_MAX_UNITS))
        return 0;
    for (int l = 0; l < d->num_layers; l++) {
        const native_linear *w[4] = {&d->layers[l].qkv, &d->layers[l].o, &d->layers[l].gate_up, &d->layers[l].down};
        for (int k = 0; k < 4; k++)
            if (team_units(w[k], d->starts[l][k]) > TAKEOVER_MAX_UNITS) return 0;
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

/* One thread's copies of the cheap parts' buffers. */
typedef struct {
    float *x, *h, *qkv, *q, *q_rows, *att_rows, *att, *gu, *act, *stage, *part;
    void *prep;
} own_buffers;

/* A pass as its seats read it. What the caller passed and a late helper could still read after the call returned
 * is copied here (team_pool.h): the small arrays, the layer table, the head's entry and norm, and the RoPE tables'
 * rows at the pass's positions. Left pointing at the caller's memory: the weights and the mirror (they outlive
 * the plan's steps: native_team_quiesce before they are freed), the KV pool and the mirror's stores (written
 * between team_write_begin and team_write_end), and the caller_ pointers, which seat 0 alone writes before it
 * returns. */
typedef struct {
    decode_pass d;
    takeover_test stalled;
    const takeover_test *test;
    row_share *shares; /* the pass's phases' shares, `team` a phase */
    phase_count *counts;
    live_claim *claims;
    int (*starts)[4][BLOCKDOT_MAX_PARTS + 1];
    int head_start[BLOCKDOT_MAX_PARTS + 1];
    float *outputs, *own; /* the layers' shared outputs; the seats' own buffers, own_n floats each */
    size_t layer_n, own_n, hid_n, qkv_n, att_n, gu_n, act_n, stage_n;
    int team, phases;
    _Atomic long taken; /* claims finished for another seat */
    _Atomic int late;   /* tests: the late seat reached its first store inside the step (late_store) */
    float *caller_x, *caller_logits;
    long *caller_taken;
} team_job;

/* Offsets in the job's memory (team_pool_take's), each 64-byte aligned. */
typedef struct {
    size_t job, layers, head, norm, x, pos, cos, sin, slots, mrows, mpos, mk, mv, lengths, order, inverse, first,
        span_seq, logits, shares, counts, claims, starts, outputs, own, total;
} job_layout;

static size_t carve(size_t *at, size_t bytes) {
    const size_t here = (*at + 63) / 64 * 64;
    *at = here + bytes;
    return here;
}

static job_layout layout_of(const decode_pass *d, const team_job *j) {
    const size_t rows = (size_t)d->rows, layers = (size_t)d->num_layers, per_row = (size_t)d->head_dim * sizeof(float);
    job_layout o;
    size_t at = 0;
    o.job = carve(&at, sizeof(team_job));
    o.layers = carve(&at, layers * sizeof(native_layer));
    o.head = carve(&at, sizeof(native_linear));
    o.norm = carve(&at, (size_t)d->hidden * sizeof(float));
    o.x = carve(&at, j->hid_n * sizeof(float));
    o.pos = carve(&at, rows * sizeof(long));
    o.cos = carve(&at, rows * per_row);
    o.sin = carve(&at, rows * per_row);
    o.slots = carve(&at, rows * sizeof(long));
    o.mrows = carve(&at, rows * sizeof(long));
    o.mpos = carve(&at, rows * sizeof(long));
    o.mk = carve(&at, layers * sizeof(float *));
    o.mv = carve(&at, layers * sizeof(float *));
    o.lengths = carve(&at, rows * sizeof(int));
    o.order = carve(&at, rows * sizeof(long));
    o.inverse = carve(&at, rows * sizeof(long));
    o.first = carve(&at, (rows + 1) * sizeof(int));
    o.span_seq = carve(&at, (size_t)(d->plan.spans > 0 ? d->plan.spans : 1) * sizeof(int));
    o.logits = carve(&at, d->head != NULL ? rows * (size_t)d->head->out * sizeof(float) : 0);
    o.shares = carve(&at, sizeof(row_share) * (size_t)j->phases * (size_t)j->team);
    o.counts = carve(&at, sizeof(phase_count) * (size_t)j->phases);
    o.claims = carve(&at, sizeof(live_claim) * (size_t)j->team);
    o.starts = carve(&at, sizeof(*j->starts) * layers);
    o.outputs = carve(&at, j->layer_n * layers * sizeof(float));
    o.own = carve(&at, j->own_n * (size_t)j->team * sizeof(float));
    o.total = at;
    return o;
}

/* The job's copies of the caller's pass (see team_job), its phases' shares and counts set: nothing a seat reads is
 * set up by another seat. */
static void job_fill(team_job *j, char *base, const job_layout *o, const decode_pass *src) {
    const int rows = src->rows, layers = src->num_layers, hd = src->head_dim;
    decode_pass *d = &j->d;
    *d = *src;
    native_layer *table = (native_layer *)(base + o->layers);
    memcpy(table, src->layers, sizeof(native_layer) * (size_t)layers);
    d->layers = table;
    d->x = memcpy(base + o->x, src->x, j->hid_n * sizeof(float));
    long *pos = (long *)(base + o->pos);
    float *cos = (float *)(base + o->cos), *sin = (float *)(base + o->sin);
    for (int t = 0; t < rows; t++) { /* the rows of the tables at the pass's positions: position t is row t's */
        pos[t] = t;
        memcpy(cos + (size_t)t * hd, src->rope.cos + (size_t)src->rope.positions[t] * hd, sizeof(float) * hd);
        memcpy(sin + (size_t)t * hd, src->rope.ssin + (size_t)src->rope.positions[t] * hd, sizeof(float) * hd);
    }
    d->rope.positions = pos;
    d->rope.cos = cos;
    d->rope.ssin = sin;
    d->rope.max_position = rows;
    const size_t row_longs = sizeof(long) * (size_t)rows;
    d->rope.slots = memcpy(base + o->slots, src->rope.slots, row_longs);
    d->rope.mirror_rows = memcpy(base + o->mrows, src->rope.mirror_rows, row_longs);
    d->rope.mirror_pos = memcpy(base + o->mpos, src->rope.mirror_pos, row_longs);
    d->mirror_k = memcpy(base + o->mk, src->mirror_k, sizeof(float *) * (size_t)layers);
    d->mirror_v = memcpy(base + o->mv, src->mirror_v, sizeof(float *) * (size_t)layers);
    d->order = src->order != NULL ? memcpy(base + o->order, src->order, row_longs) : NULL;
    d->inverse = src->inverse != NULL ? memcpy(base + o->inverse, src->inverse, row_longs) : NULL;
    d->plan.lengths = memcpy(base + o->lengths, src->plan.lengths, sizeof(int) * (size_t)rows);
    d->plan.first = memcpy(base + o->first, src->plan.first, sizeof(int) * (size_t)(rows + 1));
    d->plan.span_seq = memcpy(base + o->span_seq, src->plan.span_seq, sizeof(int) * (size_t)src->plan.spans);
    d->plan.part = NULL; /* the seats' own copies instead */
    j->starts = (void *)(base + o->starts); /* the caller's starts are freed when it returns */
    memcpy(j->starts, src->starts, sizeof(*j->starts) * (size_t)layers);
    d->starts = (const int(*)[4][BLOCKDOT_MAX_PARTS + 1])j->starts;
    d->head_start = j->head_start;
    if (src->head != NULL) {
        d->head = memcpy(base + o->head, src->head, sizeof(native_linear));
        d->head_norm = memcpy(base + o->norm, src->head_norm, sizeof(float) * (size_t)src->hidden);
        d->logits = (float *)(base + o->logits);
    }
    j->shares = (row_share *)(base + o->shares);
    j->counts = (phase_count *)(base + o->counts);
    j->claims = (live_claim *)(base + o->claims);
    j->outputs = (float *)(base + o->outputs);
    j->own = (float *)(base + o->own);
    const int team = j->team;
    for (int l = 0; l < layers; l++) {
        const native_layer *L = d->layers + l;
        const native_linear *w[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        const int product_phase[4] = {0, 2, 3, 4};
        for (int k = 0; k < 4; k++) {
            row_shares_init(j->shares + (size_t)(PHASES_PER_LAYER * l + product_phase[k]) * team, team,
                            team_units(w[k], j->starts[l][k]));
        }
        row_share *attn = j->shares + (size_t)(PHASES_PER_LAYER * l + 1) * team; /* runs cut by positions */
        for (int t = 0; t < team; t++) {
            const uint64_t lo = (uint64_t)attn_first_item(&d->plan, t, team);
            const uint64_t hi = (uint64_t)attn_first_item(&d->plan, t + 1, team);
            atomic_init(&attn[t].span, hi << 32 | lo);
        }
    }
    if (d->head != NULL) {
        memcpy(j->head_start, src->head_start, sizeof(j->head_start));
        row_shares_init(j->shares + (size_t)(j->phases - 1) * team, team, team_units(d->head, j->head_start));
    }
    for (int p = 0; p < j->phases; p++) atomic_init(&j->counts[p].done, 0);
    for (int t = 0; t < team; t++) atomic_init(&j->claims[t].word, 0);
    atomic_init(&j->taken, 0);
    atomic_init(&j->late, 0);
}

/* Seat `me`'s part of product `w` (phase `phase`): x's activations prepared into its own `prep`, then the
 * product's units into y until every one is done. 1 where the step closed first (takeover_phase). */
static int seat_product(team_job *j, const team_live *live, int me, int phase, const native_linear *w,
                        const int *start, const float *x, void *prep, float *stage, float *y) {
    const int rows = j->d.rows;
    team_prep_acts(w, x, rows, prep);
    const product_work work = {w, start, x, prep, y, stage, rows};
    return takeover_phase(phase, team_units(w, start), j->shares + (size_t)phase * j->team, j->team, team_chunk(w),
                          j->claims, j->counts + phase, me, product_units, &work, j->test, live, &j->taken);
}

/* Tests (takeover_test with us < 0): seat `slow` (a helper) stops before its first store for -us microseconds, as
 * a helper the machine took off its core there would, while the others, having waited for it to get there (1 s at
 * most), finish the step and close it; its store must then write nothing (team_write_begin). */
static void late_store(team_job *j, int me, int l) {
    const takeover_test *t = j->test;
    if (t == NULL || t->us >= 0 || t->slow < 1 || l != 0) return;
    if (me == t->slow) {
        atomic_store(&j->late, 1);
        TAKEOVER_SPIN(0, -t->us);
    } else {
        TAKEOVER_SPIN(atomic_load(&j->late), 1000000);
    }
}

/* The whole pass on seat `me` (team_pool.h's seat function): the cheap steps on its own buffers, the shared
 * phases with the other seats. A helper gives up where the step closed; seat 0 ends with the results copied out. */
static void seat_walk(void *job, int me, const team_live *live) {
    team_job *j = job;
    const decode_pass *d = &j->d;
    const int rows = d->rows, hidden = d->hidden, inter = d->inter, layers = d->num_layers, team = j->team;
    float *at = j->own + j->own_n * (size_t)me;
    own_buffers b;
    float **next[] = {&b.x, &b.h, &b.qkv, &b.q, &b.q_rows, &b.att_rows, &b.att, &b.gu, &b.act, &b.stage, &b.part};
    const size_t size[] = {j->hid_n, j->hid_n, j->qkv_n, j->att_n, j->att_n, j->att_n,
                           j->att_n, j->gu_n,  j->act_n, j->stage_n, part_floats(&d->plan)};
    for (int i = 0; i < 11; i++) {
        *next[i] = at;
        at += aligned_floats(size[i]);
    }
    b.prep = at;
    memcpy(b.x, d->x, j->hid_n * sizeof(float));
    const long *order = d->order, *inverse = d->inverse;
    const size_t att_w = d->att_width, layer_n = j->layer_n;
    for (int l = 0; l < layers; l++) {
        const native_layer *L = d->layers + l;
        float *yqkv = j->outputs + layer_n * l, *yo = yqkv + aligned_floats(j->qkv_n);
        float *ygu = yo + aligned_floats(j->hid_n), *ydown = ygu + aligned_floats(j->gu_n);
        float *part = ydown + aligned_floats(j->hid_n);
        const int phase = PHASES_PER_LAYER * l;
        const native_linear *w[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        int(*start)[BLOCKDOT_MAX_PARTS + 1] = j->starts[l];
        native_rms_norm(b.x, L->ln_in, rows, hidden, d->eps, b.h);
        if (seat_product(j, live, me, phase, w[0], start[0], b.h, b.prep, b.stage, yqkv)) return;
        const rope_store_args here = pass_rope(d, l, with_bias(w[0], yqkv, rows, b.qkv), b.q);
        rope_store_q(&here);
        late_store(j, me, l);
        if (!team_write_begin(live)) return; /* the pool and the mirror outlive the step */
        rope_store_kv(&here); /* by every seat: the same bits into the same places, before its attention */
        team_write_end(live);
        for (int r = 0; order != NULL && r < rows; r++)
            memcpy(b.q_rows + (size_t)r * att_w, b.q + (size_t)order[r] * att_w, att_w * sizeof(float));
        const float *q_rows = order != NULL ? b.q_rows : b.q;
        float *att_rows = order != NULL ? b.att_rows : b.att;
        const attention_work aw = {&d->plan, part, b.part, q_rows, d->mirror_k[l], d->mirror_v[l],
                                   d->mirror_row_stride, d->mirror_head_stride};
        if (takeover_phase(phase + 1, d->plan.items, j->shares + (size_t)(phase + 1) * team, team, 4, j->claims,
                           j->counts + phase + 1, me, attention_units, &aw, j->test, live, &j->taken))
            return;
        for (int r = 0; r < rows * d->heads; r++) attn_merge_packed(&d->plan, part, att_rows, r);
        for (int t = 0; order != NULL && t < rows; t++)
            memcpy(b.att + (size_t)t * att_w, att_rows + (size_t)inverse[t] * att_w, att_w * sizeof(float));
        if (seat_product(j, live, me, phase + 2, w[1], start[1], b.att, b.prep, b.stage, yo)) return;
        add_product(w[1], b.x, yo, rows);
        native_rms_norm(b.x, L->ln_post, rows, hidden, d->eps, b.h);
        if (seat_product(j, live, me, phase + 3, w[2], start[2], b.h, b.prep, b.stage, ygu)) return;
        silu_mul_rows(with_bias(w[2], ygu, rows, b.gu), rows, inter, b.act); /* never a parallel region */
        if (seat_product(j, live, me, phase + 4, w[3], start[3], b.act, b.prep, b.stage, ydown)) return;
        add_product(w[3], b.x, ydown, rows);
    }
    if (d->head != NULL) { /* the final norm on each seat's own copy, the head's rows shared */
        native_rms_norm(b.x, d->head_norm, rows, hidden, d->eps, b.h);
        if (seat_product(j, live, me, j->phases - 1, d->head, j->head_start, b.h, b.prep, b.stage, d->logits)) return;
    }
    if (me != 0) return;
    memcpy(j->caller_x, b.x, j->hid_n * sizeof(float)); /* every seat's x has these bits */
    if (d->head != NULL) memcpy(j->caller_logits, d->logits, sizeof(float) * (size_t)rows * d->head->out);
    if (j->caller_taken != NULL) *j->caller_taken += j->test != NULL && j->test->us < 0 ? atomic_load(&j->late)
                                                                                    : atomic_load(&j->taken);
}

int decode_team_run(const decode_pass *d, int team, const team_options *opt) {
    const int rows = d->rows;
    team_job sizes = {.team = team, .phases = PHASES_PER_LAYER * d->num_layers + (d->head != NULL)};
    sizes.qkv_n = (size_t)rows * d->qkv_width, sizes.att_n = (size_t)rows * d->att_width;
    sizes.hid_n = (size_t)rows * d->hidden, sizes.gu_n = (size_t)rows * 2 * d->inter;
    sizes.act_n = (size_t)rows * d->inter;
    sizes.layer_n = layer_floats(d);
    size_t stage_n = sizes.gu_n > sizes.qkv_n ? sizes.gu_n : sizes.qkv_n; /* the widest product's output */
    stage_n = sizes.hid_n > stage_n ? sizes.hid_n : stage_n;
    const size_t head_n = d->head != NULL ? (size_t)rows * d->head->out : 0;
    sizes.stage_n = head_n > stage_n ? head_n : stage_n;
    sizes.own_n = 2 * aligned_floats(sizes.hid_n) + aligned_floats(sizes.qkv_n) + 4 * aligned_floats(sizes.att_n) +
                  aligned_floats(sizes.gu_n) + aligned_floats(sizes.act_n) + aligned_floats(sizes.stage_n) +
                  part_floats(&d->plan) + aligned_floats((d->prep_bytes + 3) / 4);
    const job_layout o = layout_of(d, &sizes);
    char *base = team_pool_take(o.total);
    if (base == NULL) return -2;
    team_job *j = (team_job *)(base + o.job);
    memcpy(j, &sizes, sizeof(team_job)); /* a fresh _Atomic: set again by job_fill */
    job_fill(j, base, &o, d);
    j->stalled = (takeover_test){opt->stall_thread, opt->stall_us};
    j->test = opt->stall_thread >= 0 && opt->stall_us != 0 ? &j->stalled : NULL;
    j->caller_x = d->x;
    j->caller_logits = d->logits;
    j->caller_taken = opt->taken;
    team_pool_run(team, seat_walk, j);
    return 0;
}
