/* y[t, o] = sum_k W[o, k] * x[t, k] for a float32 weight W (row-major `[rows, cols]`) and 1 to 8 rows of x:
 * the float32 model's decode products (runtime/model/linear.py's "native" path, and the native decode layers).
 *
 * At a decode batch the product reads every weight once and does two flops per 4 bytes read: its speed is how
 * fast the cores stream W. Each thread takes a contiguous share of W's rows (one sequential stream per thread;
 * thread_rows.h: a thread done early takes rows left in another's) and reads each weight vector once for all
 * `ntok` rows of x, whose per-row sums stay in registers (`ntok` a compile-time constant in each case of
 * dense_rows_n). Sums are float32 in a fixed order per output (16 lanes, then a tree), whatever the thread
 * count or the thread that takes the row: the result never depends on them.
 *
 * Same arguments as blockdot_matmul (blockdot.c), so the decode layers call either through one pointer type: a
 * weight may be up to BLOCKDOT_MAX_PARTS parts stacked by rows, every kind KIND_F32 (ggml's type id 0). */
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ggml_blocks.h"
#include "thread_rows.h"

/* Accumulator chains per row of x. A float32 FMA's result feeds the next one 4 cycles later, so one chain per row
 * lets a batch-1 product do one 16-wide FMA every 4 cycles, which was under what the memory delivers: measured on
 * the project's 2-core Zen 4 VM over SmolLM2's 538 MB of weights, batch 1 streamed 40-42 GB/s with one chain and
 * 55-57 with two while a `sum` read 65-70 GB/s, and 32-33 against 35-37 while it read 36-38 (4 chains: 43-44, and
 * 1 KiB software prefetch ahead: no gain). Two rows and more have a chain per row already (two each was slower). */
#define DENSE_CHAINS(ntok) ((ntok) == 1 ? 2 : 1)
#define DENSE_MAX_CHAINS 2

/* One output row for `ntok` rows of x: out[t] = w . x[t]. Per row of x: chain c sums vectors c, c + U, c + 2U, ...
 * (U = DENSE_CHAINS(ntok)), the vectors past the last whole group of U go to chain 0, then the chains add in order,
 * then the 16 lanes: a fixed order whatever the thread count. */
static inline __attribute__((always_inline)) void dense_row(const float *w, const float *x, int cols, int ntok,
                                                            float *out) {
    int k = 0;
    const int chains = DENSE_CHAINS(ntok);
#if defined(__AVX512F__)
    __m512 acc[DENSE_MAX_CHAINS][BLOCKDOT_MAX_TOKENS];
    for (int c = 0; c < chains; c++)
        for (int t = 0; t < ntok; t++) acc[c][t] = _mm512_setzero_ps();
    for (; k + 16 * chains <= cols; k += 16 * chains) {
        for (int c = 0; c < chains; c++) {
            const __m512 wv = _mm512_loadu_ps(w + k + 16 * c);
            for (int t = 0; t < ntok; t++)
                acc[c][t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)t * cols + k + 16 * c), acc[c][t]);
        }
    }
    for (; k + 16 <= cols; k += 16) {
        const __m512 wv = _mm512_loadu_ps(w + k);
        for (int t = 0; t < ntok; t++)
            acc[0][t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (size_t)t * cols + k), acc[0][t]);
    }
    for (int t = 0; t < ntok; t++) {
        __m512 sum = acc[0][t];
        for (int c = 1; c < chains; c++) sum = _mm512_add_ps(sum, acc[c][t]);
        out[t] = _mm512_reduce_add_ps(sum);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[DENSE_MAX_CHAINS][BLOCKDOT_MAX_TOKENS];
    for (int c = 0; c < chains; c++)
        for (int t = 0; t < ntok; t++) acc[c][t] = _mm256_setzero_ps();
    for (; k + 8 * chains <= cols; k += 8 * chains) {
        for (int c = 0; c < chains; c++) {
            const __m256 wv = _mm256_loadu_ps(w + k + 8 * c);
            for (int t = 0; t < ntok; t++)
                acc[c][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)t * cols + k + 8 * c), acc[c][t]);
        }
    }
    for (; k + 8 <= cols; k += 8) {
        const __m256 wv = _mm256_loadu_ps(w + k);
        for (int t = 0; t < ntok; t++)
            acc[0][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)t * cols + k), acc[0][t]);
    }
    for (int t = 0; t < ntok; t++) {
        __m256 sum = acc[0][t];
        for (int c = 1; c < chains; c++) sum = _mm256_add_ps(sum, acc[c][t]);
        out[t] = hsum256(sum);
    }
#else
    (void)chains;
    for (int t = 0; t < ntok; t++) out[t] = 0.0f;
#endif
    for (; k < cols; k++) /* the tail past the last full vector (none for widths that are multiples of 16) */
        for (int t = 0; t < ntok; t++) out[t] += w[k] * x[(size_t)t * cols + k];
}

/* out rows [0, count) of one part, rows of w from the first: y[t * ldy + o] for t < ntok. One loop per token count
 * with dense_row inlined into it: a call per row (a jump on ntok, the registers saved, a 1 KB frame for the
 * generic accumulators) held the product to about 80% of a `sum`'s read bandwidth where the memory is fast (the
 * project's VM reads 35-70 GB/s as the host's load moves; at the top, 48-54 GB/s against 60-67), and 98-99%
 * with it inlined (the same sums, so the same bits). */
static inline __attribute__((always_inline)) void dense_rows(const float *w, const float *x, int cols, int ntok,
                                                             float *y, int ldy, int count) {
    for (int o = 0; o < count; o++) {
        float out[BLOCKDOT_MAX_TOKENS];
        dense_row(w + (size_t)o * cols, x, cols, ntok, out);
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = out[t];
    }
}

static void dense_rows_n(const float *w, const float *x, int cols, int ntok, float *y, int ldy, int count) {
    switch (ntok) {
    case 1: dense_rows(w, x, cols, 1, y, ldy, count); break;
    case 2: dense_rows(w, x, cols, 2, y, ldy, count); break;
    case 3: dense_rows(w, x, cols, 3, y, ldy, count); break;
    case 4: dense_rows(w, x, cols, 4, y, ldy, count); break;
    case 5: dense_rows(w, x, cols, 5, y, ldy, count); break;
    case 6: dense_rows(w, x, cols, 6, y, ldy, count); break;
    case 7: dense_rows(w, x, cols, 7, y, ldy, count); break;
    case 8: dense_rows(w, x, cols, 8, y, ldy, count); break;
    default: break; /* never: densedot_matmul keeps ntok in 1..BLOCKDOT_MAX_TOKENS */
    }
}

/* Checks a product's arguments and fills `start`, each part's first output row (start[0] = 0, start[p + 1] =
 * start[p] + rows[p]): 0, or -1 for arguments out of range. */
int densedot_check(int nparts, const int *kinds, const int *rows, int cols, int ntok, int ldy, int *start) {
    if (nparts < 1 || nparts > BLOCKDOT_MAX_PARTS || ntok < 1 || ntok > BLOCKDOT_MAX_TOKENS || cols < 1) return -1;
    start[0] = 0;
    for (int p = 0; p < nparts; p++) {
        if (kinds[p] != KIND_F32 || rows[p] < 0) return -1;
        start[p + 1] = start[p] + rows[p];
    }
    return start[nparts] > ldy ? -1 : 0;
}

/* Rows [lo, hi) of a checked product (densedot_check: part starts `start`). */
void densedot_claim_rows(int nparts, const void *const *data, const int *start, int cols, const float *x, int ntok,
                         float *y, int ldy, int lo, int hi) {
    int a, b;
    for (int p = 0; p < nparts; p++)
        if (rows_in_part(start, p, lo, hi, &a, &b))
            dense_rows_n((const float *)data[p] + (size_t)(a - start[p]) * cols, x, cols, ntok, y + a, ldy, b - a);
}

/* Thread `me`'s part of a checked product, inside a parallel region whose `count` shares were set up over the
 * product's rows (row_shares_init): the rows it claims, until every share is empty. No barrier. */
void densedot_team_rows(int nparts, const void *const *data, const int *start, int cols, const float *x, int ntok,
                        float *y, int ldy, row_share *shares, int count, int me) {
    const int chunk = row_chunk((long)cols * (long)sizeof(float));
    int lo, hi;
    while (row_next(shares, count, me, chunk, &lo, &hi))
        densedot_claim_rows(nparts, data, start, cols, x, ntok, y, ldy, lo, hi);
}

/* y[t * ldy + o] for the rows of `nparts` stacked float32 parts (part p: `rows[p]` rows at `data[p]`, kind
 * KIND_F32), all with `cols` columns. The threads share the stacked rows as thread_rows.h says (a contiguous share
 * each, one sequential stream, rows left over taken by whichever thread is done first), cut where parts meet.
 * Returns 0, or -1 for arguments out of range (nothing is written then). */
int densedot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy) {
    int start[BLOCKDOT_MAX_PARTS + 1];
    if (densedot_check(nparts, kinds, rows, cols, ntok, ldy, start) != 0) return -1;
    const int team = omp_get_max_threads();
    row_share shares[team];
    row_shares_init(shares, team, start[nparts]);
#pragma omp parallel num_threads(team)
    densedot_team_rows(nparts, data, start, cols, x, ntok, y, ldy, shares, team, omp_get_thread_num());
    return 0;
}

/* For tests (tests/runtime/native/test_row_shares.py): `threads` threads take rows [0, total) from `count` shares
 * as the products do (a team smaller than the shares leaves some to be taken by others), thread `slow` first
 * spinning `slow_us` microseconds; counts[r] is incremented once per claim of row r, *taken the rows a thread took
 * from a share not its own. Returns the number of threads that ran, or -1 for arguments out of range. */
int native_row_shares_check(int total, int count, int threads, int chunk, int slow, int slow_us, int *counts,
                            long *taken) {
    if (total < 0 || count < 1 || threads < 1 || chunk < 1 || slow_us < 0) return -1;
    row_share shares[count];
    row_shares_init(shares, count, total);
    long others = 0;
    int ran = 1;
#pragma omp parallel num_threads(threads) reduction(+ : others)
    {
        const int me = omp_get_thread_num();
#ifdef _OPENMP
        if (me == 0) ran = omp_get_num_threads();
        if (me == slow)
            for (const double t0 = omp_get_wtime(); omp_get_wtime() - t0 < slow_us * 1e-6;) {
            }
#else
        (void)slow;
#endif
        const int own_lo = me < count ? (int)((long)total * me / count) : 0; /* row_shares_init's share */
        const int own_hi = me < count ? (int)((long)total * (me + 1) / count) : 0;
        int lo, hi;
        while (row_next(shares, count, me, chunk, &lo, &hi))
            for (int r = lo; r < hi; r++) {
#pragma omp atomic
                counts[r]++;
                others += r < own_lo || r >= own_hi;
            }
    }
    *taken = others;
    return ran;
}

/* For tests: the successive claims one thread makes alone on a share of rows [0, total), from the front (`from_back`
 * 0) or the back; sizes[i] is the i-th claim's row count, for at most `cap` claims. Returns the number of claims
 * (more than `cap` when the share needed more), or -1 for arguments out of range. */
int native_row_claims_check(int total, int chunk, int from_back, int *sizes, int cap) {
    if (total < 0 || chunk < 1 || cap < 0) return -1;
    row_share share;
    row_shares_init(&share, 1, total);
    int n = 0, a, b;
    while (row_claim(&share, chunk, from_back != 0, &a, &b)) {
        if (n < cap) sizes[n] = b - a;
        n++;
    }
    return n;
}
