/* y[t, o] = sum_k W[o, k] * x[t, k] for a weight W stored as GGUF blocks, with float32 x and y.
 *
 * W is row-major: each row is `cols / 32` blocks of 32 weights (or `cols / 256` super-blocks of the K-quants), in
 * ggml's block layouts (ggml_blocks.h; the decoding rules are in runtime/model/dequant.py). The weights are used
 * exactly as stored (no activation quantisation; the int8-activation kernels are in qdot.c). With Q4_1,
 *   sum_j w_j x_j = d * sum_j q_j x_j + m * sum_j x_j,
 * and the block sums of x are computed once per call. Products and sums are float32, as in a float32 GEMM of
 * the dequantised weights; only the summation order differs. Q4_1 (q4_rows.h: on AVX2 it reads x in its nibbles'
 * order, prepared once per call, and so does Q4_0 there) and Q8_0 have hand-written vector paths (AVX-512, AVX2 +
 * FMA), and so do Q5_0, Q4_K, Q5_K and Q6_K (kquant_rows.h: Q4_K_M and Q5_K_M files' kinds);
 * Q5_1 (and Q4_0 but on AVX2) decode a block into float32 (block_decode.h) and multiply it, and without AVX2 + FMA
 * every kind but Q4_1 and Q8_0 does so in portable C that the compiler vectorises.
 *
 * A weight may be several parts stacked by rows (a fused q/k/v or gate/up matrix whose source tensors have
 * their own block types): one call covers them all, the threads taking the output rows as thread_rows.h says (a
 * contiguous share each, then rows left in the others').
 * `ntok` (1 .. BLOCKDOT_MAX_TOKENS) rows of x share each decoded block: a small decode batch reads W once.
 * The library is built against the libgomp that torch has loaded (runtime/native/__init__.py).
 * Vector paths: AVX-512, AVX2 + FMA, else portable C (chosen at build time by -march=native).
 *
 * The same mode's decode step also calls `native_rms_norm` from here and `native_decode_attention`
 * (decode_attention.c) through runtime/native/ops.py: at batch 1 the eager step's per-call overhead, not
 * arithmetic, is what they remove.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ggml_blocks.h"
#include "thread_rows.h"

int blockdot_max_tokens(void) { return BLOCKDOT_MAX_TOKENS; }

int blockdot_max_parts(void) { return BLOCKDOT_MAX_PARTS; }

int blockdot_vector_width(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 1;
#endif
}

#include "q4_rows.h"
#include "kquant_rows.h"

/* One output row of a Q8_0 weight for `ntok` tokens (inlined as q4_rows.h's rows are). */
static inline __attribute__((always_inline)) void q8_0_row(const block_q8_0 *row, int nb, const float *x, int cols,
                                                           int ntok, float *out) {
#if defined(__AVX512F__)
    __m512 acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row[b].qs + 16))));
        const __m512 d = _mm512_set1_ps(half_to_float(row[b].d));
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + b * QK;
            __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(xb));
            p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), p);
            acc[t] = _mm512_fmadd_ps(p, d, acc[t]);
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[BLOCKDOT_MAX_TOKENS];
    for (int t = 0; t < ntok; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256 q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row[b].qs + 8 * k))));
        const __m256 d = _mm256_set1_ps(half_to_float(row[b].d));
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + b * QK;
            __m256 p = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
            for (int k = 1; k < 4; k++) p = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(xb + 8 * k), p);
            acc[t] = _mm256_fmadd_ps(p, d, acc[t]);
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = hsum256(acc[t]);
#else
    float acc[BLOCKDOT_MAX_TOKENS] = {0};
    for (int b = 0; b < nb; b++) {
        const float d = half_to_float(row[b].d);
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + b * QK;
            float p = 0.0f;
            for (int j = 0; j < QK; j++) p += (float)row[b].qs[j] * xb[j];
            acc[t] += d * p;
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = acc[t];
#endif
}

#include "block_decode.h"

/* One block of any other kind decoded into float32 (`block_elems(kind)` values), in dequant.py's order. */
static inline __attribute__((always_inline)) void decode_block(int kind, const uint8_t *blk, float *w) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    if (decode_block_vec(kind, blk, w)) return;
#endif
    switch (kind) {
    case KIND_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)blk;
        const float d = half_to_float(b->d);
        for (int j = 0; j < 16; j++) {
            w[j] = (float)((b->qs[j] & 0x0F) - 8) * d;
            w[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case KIND_Q5_0:
    case KIND_Q5_1: {
        const int one = kind == KIND_Q5_1;
        const block_q5_0 *b0 = (const block_q5_0 *)blk;
        const block_q5_1 *b1 = (const block_q5_1 *)blk;
        const uint8_t *qs = one ? b1->qs : b0->qs;
        uint32_t h;
        memcpy(&h, one ? b1->qh : b0->qh, sizeof h);
        const float d = half_to_float(one ? b1->d : b0->d), m = one ? half_to_float(b1->m) : 0.0f;
        const int off = one ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            const int lo = (qs[j] & 0x0F) | (int)(((h >> j) & 1u) << 4);
            const int hi = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1u) << 4);
            w[j] = (float)(lo - off) * d + m;
            w[j + 16] = (float)(hi - off) * d + m;
        }
        break;
    }
    case KIND_Q4_K:
    case KIND_Q5_K: {
        const int five = kind == KIND_Q5_K;
        const block_q4_K *b4 = (const block_q4_K *)blk;
        const block_q5_K *b5 = (const block_q5_K *)blk;
        const uint8_t *qs = five ? b5->qs : b4->qs;
        uint8_t sc[8], m[8];
        k_scales_mins(five ? b5->scales : b4->scales, sc, m);
        const float d = half_to_float(five ? b5->d : b4->d), dmin = half_to_float(five ? b5->dmin : b4->dmin);
        for (int s = 0; s < 8; s++) {
            const float ds = d * (float)sc[s], dm = dmin * (float)m[s];
            const uint8_t *q = qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0x0F;
                if (five) v |= ((b5->qh[l] >> s) & 1) << 4;
                w[32 * s + l] = ds * (float)v - dm;
            }
        }
        break;
    }
    case KIND_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        const float d = half_to_float(b->d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *qh = b->qh + 32 * h;
            for (int g = 0; g < 4; g++) {
                const uint8_t *ql = b->ql + 64 * h + 32 * (g & 1);
                const int shift = 4 * (g >> 1), hshift = 2 * g;
                for (int half = 0; half < 2; half++) {
                    const int e0 = 128 * h + 32 * g + 16 * half;
                    const float ds = d * (float)b->scales[e0 / 16];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        const int v = (((ql[l] >> shift) & 0x0F) | (((qh[l] >> hshift) & 3) << 4)) - 32;
                        w[e0 + l - 16 * half] = ds * (float)v;
                    }
                }
            }
        }
        break;
    }
    default: /* never reached: blockdot_check_parts refuses other kinds */
        memset(w, 0, QK_K * sizeof *w);
        break;
    }
}

/* One output row of any kind without a hand-written path: each block decoded once, then one dot per token. With
 * AVX-512 the per-token sums stay vectors across blocks (reduced once, at the end of the row; another summation
 * order than the other paths'). */
static inline __attribute__((always_inline)) void generic_row_of(int kind, const uint8_t *row, int nblocks,
                                                                 const float *x, int cols, int ntok, float *out) {
    const int n = block_elems(kind);
    const size_t bytes = block_bytes(kind);
#if defined(__AVX512F__)
    if (kind != KIND_Q4_1 && kind != KIND_Q8_0) { /* every kind decode_block_vec takes: n is 32 or 256 */
        __m512 vacc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) vacc[t] = _mm512_setzero_ps();
        float wv[QK_K];
        for (int b = 0; b < nblocks; b++) {
            decode_block(kind, row + (size_t)b * bytes, wv);
            for (int j = 0; j < n; j += 16) {
                const __m512 wj = _mm512_loadu_ps(wv + j);
                for (int t = 0; t < ntok; t++)
                    vacc[t] = _mm512_fmadd_ps(wj, _mm512_loadu_ps(x + (size_t)t * cols + (size_t)b * n + j), vacc[t]);
            }
        }
        for (int t = 0; t < ntok; t++) out[t] = _mm512_reduce_add_ps(vacc[t]);
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (kind != KIND_Q4_1 && kind != KIND_Q8_0) {
        __m256 vacc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) vacc[t] = _mm256_setzero_ps();
        float wv[QK_K];
        for (int b = 0; b < nblocks; b++) {
            decode_block(kind, row + (size_t)b * bytes, wv);
            for (int j = 0; j < n; j += 8) {
                const __m256 wj = _mm256_loadu_ps(wv + j);
                for (int t = 0; t < ntok; t++)
                    vacc[t] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(x + (size_t)t * cols + (size_t)b * n + j), vacc[t]);
            }
        }
        for (int t = 0; t < ntok; t++) out[t] = hsum256(vacc[t]);
        return;
    }
#endif
    float acc[BLOCKDOT_MAX_TOKENS] = {0};
    float w[QK_K];
    for (int b = 0; b < nblocks; b++) {
        decode_block(kind, row + (size_t)b * bytes, w);
        for (int t = 0; t < ntok; t++) {
            const float *xb = x + (size_t)t * cols + (size_t)b * n;
            float p = 0.0f;
#pragma omp simd reduction(+ : p)
            for (int j = 0; j < n; j++) p += w[j] * xb[j];
            acc[t] += p;
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = acc[t];
}

/* generic_row_of compiled once per kind and token count (constants: the decoding switch and the block length fold
 * away, and the per-token sums stay in registers, as block_rows_n's do). */
#define GENERIC_ROWS(KIND)                                                                                          \
    static void generic_rows_##KIND(const uint8_t *row, int nblocks, const float *x, int cols, int ntok,           \
                                    float *out) {                                                                   \
        switch (ntok) {                                                                                             \
        case 1: generic_row_of(KIND, row, nblocks, x, cols, 1, out); break;                                         \
        case 2: generic_row_of(KIND, row, nblocks, x, cols, 2, out); break;                                         \
        case 3: generic_row_of(KIND, row, nblocks, x, cols, 3, out); break;                                         \
        case 4: generic_row_of(KIND, row, nblocks, x, cols, 4, out); break;                                         \
        case 5: generic_row_of(KIND, row, nblocks, x, cols, 5, out); break;                                         \
        case 6: generic_row_of(KIND, row, nblocks, x, cols, 6, out); break;                                         \
        case 7: generic_row_of(KIND, row, nblocks, x, cols, 7, out); break;                                         \
        case 8: generic_row_of(KIND, row, nblocks, x, cols, 8, out); break;                                         \
        default: break; /* never: blockdot_check_parts keeps ntok in 1..BLOCKDOT_MAX_TOKENS */                      \
        }                                                                                                           \
    }
GENERIC_ROWS(KIND_Q4_0)
GENERIC_ROWS(KIND_Q5_0)
GENERIC_ROWS(KIND_Q5_1)
GENERIC_ROWS(KIND_Q4_K)
GENERIC_ROWS(KIND_Q5_K)
GENERIC_ROWS(KIND_Q6_K)

static void generic_row(int kind, const uint8_t *row, int nblocks, const float *x, int cols, int ntok, float *out) {
    switch (kind) {
    case KIND_Q4_0: generic_rows_KIND_Q4_0(row, nblocks, x, cols, ntok, out); break;
    case KIND_Q5_0: generic_rows_KIND_Q5_0(row, nblocks, x, cols, ntok, out); break;
    case KIND_Q5_1: generic_rows_KIND_Q5_1(row, nblocks, x, cols, ntok, out); break;
    case KIND_Q4_K: generic_rows_KIND_Q4_K(row, nblocks, x, cols, ntok, out); break;
    case KIND_Q5_K: generic_rows_KIND_Q5_K(row, nblocks, x, cols, ntok, out); break;
    case KIND_Q6_K: generic_rows_KIND_Q6_K(row, nblocks, x, cols, ntok, out); break;
    default: generic_row_of(kind, row, nblocks, x, cols, ntok, out);
    }
}

/* Rows [0, count) of one part (its rows from `rows0`, `row_bytes` apart): y[t * ldy + o] for t < ntok. Each
 * thread runs its share in one loop per token count with the Q4_1 and Q8_0 rows inlined: as in densedot.c, a
 * call per row costs what a short row's arithmetic does (SmolLM2's 576 columns are 18 blocks). The same row
 * functions, so the same bits. */
static inline __attribute__((always_inline)) void block_rows(int kind, const uint8_t *rows0, size_t row_bytes,
                                                             int nblocks, const float *x, int cols, int ntok,
                                                             const float *xsum, float *y, int ldy, int count) {
    for (int o = 0; o < count; o++) {
        const uint8_t *row = rows0 + (size_t)o * row_bytes;
        float out[BLOCKDOT_MAX_TOKENS];
        if (kind == KIND_Q4_1)
            q4_1_row((const block_q4_1 *)row, nblocks, x, cols, ntok, xsum, out);
#if Q4_ORDERED
        else if (kind == KIND_Q4_0)
            q4_0_row((const block_q4_0 *)row, nblocks, cols, ntok, xsum, out);
#endif
        else if (kind == KIND_Q8_0)
            q8_0_row((const block_q8_0 *)row, nblocks, x, cols, ntok, out);
#ifdef BLOCKDOT_KQUANT_ROWS
        else if (kind == KIND_Q5_0)
            q5_0_row((const block_q5_0 *)row, nblocks, x, cols, ntok, xsum, out);
        else if (kind == KIND_Q4_K)
            k45_row(row, 0, nblocks, x, cols, ntok, xsum, out);
        else if (kind == KIND_Q5_K)
            k45_row(row, 1, nblocks, x, cols, ntok, xsum, out);
        else if (kind == KIND_Q6_K)
            q6_k_row((const block_q6_K *)row, nblocks, x, cols, ntok, out);
#endif
        else
            generic_row(kind, row, nblocks, x, cols, ntok, out);
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = out[t];
    }
}

static void block_rows_n(int kind, const uint8_t *rows0, size_t row_bytes, int nblocks, const float *x, int cols,
                         int ntok, const float *xsum, float *y, int ldy, int count) {
    switch (ntok) {
    case 1: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 1, xsum, y, ldy, count); break;
    case 2: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 2, xsum, y, ldy, count); break;
    case 3: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 3, xsum, y, ldy, count); break;
    case 4: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 4, xsum, y, ldy, count); break;
    case 5: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 5, xsum, y, ldy, count); break;
    case 6: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 6, xsum, y, ldy, count); break;
    case 7: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 7, xsum, y, ldy, count); break;
    case 8: block_rows(kind, rows0, row_bytes, nblocks, x, cols, 8, xsum, y, ldy, count); break;
    default: break; /* never: blockdot_check_parts keeps ntok in 1..BLOCKDOT_MAX_TOKENS */
    }
}

/* Whether a kind's row takes the block sums of x (its minimum or offset term). */
static inline int needs_xsum(int kind) {
#ifdef BLOCKDOT_KQUANT_ROWS
    if (kind == KIND_Q5_0 || kind == KIND_Q4_K || kind == KIND_Q5_K) return 1;
#endif
    return kind == KIND_Q4_1 || (Q4_ORDERED && kind == KIND_Q4_0);
}

/* Whether a kind's row reads q4_rows.h's ordered copy of x. */
static inline int needs_ordered(int kind) { return Q4_ORDERED && (kind == KIND_Q4_1 || kind == KIND_Q4_0); }

/* Checks the parts of a call and fills `start` (first output row of each part): 0, or -1 for arguments out of
 * range (a kind the kernels do not take, columns that are not whole blocks of every part, too many rows). */
int blockdot_check_parts(int nparts, const int *kinds, const int *rows, int cols, int ntok, int ldy, int *start) {
    if (nparts < 1 || nparts > BLOCKDOT_MAX_PARTS || ntok < 1 || ntok > BLOCKDOT_MAX_TOKENS || cols < QK)
        return -1;
    start[0] = 0;
    for (int p = 0; p < nparts; p++) {
        const int n = block_elems(kinds[p]);
        if (n == 0 || cols % n || rows[p] < 0) return -1;
        start[p + 1] = start[p] + rows[p];
    }
    return start[nparts] > ldy ? -1 : 0;
}

/* Floats of prepared activations (blockdot_prep) a checked product of `ntok` rows takes: the block sums, then the
 * ordered copy of x where a part reads it (q4_rows.h). */
size_t blockdot_prep_floats(int nparts, const int *kinds, int cols, int ntok) {
    int any_ordered = 0;
    for (int p = 0; p < nparts; p++) any_ordered |= needs_ordered(kinds[p]);
    return (size_t)ntok * (size_t)(cols / QK) + (any_ordered ? q4_prep_floats(cols, ntok) : 0);
}

/* The prepared activations (blockdot_prep_floats of them) into `xsum`: xsum[t * (cols / QK) + b], the sum of block b
 * of row t of x, where some part's kind reads it (else nothing is written), then q4_rows.h's ordered copy where a
 * part reads it. What a product computes once before its rows. */
void blockdot_prep(int nparts, const int *kinds, const float *x, int cols, int ntok, float *xsum) {
    int any_xsum = 0, any_ordered = 0;
    for (int p = 0; p < nparts; p++) {
        any_xsum |= needs_xsum(kinds[p]);
        any_ordered |= needs_ordered(kinds[p]);
    }
    if (!any_xsum) return;
    const int nb = cols / QK;
    for (int t = 0; t < ntok; t++) {
        for (int b = 0; b < nb; b++) {
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += x[(size_t)t * cols + b * QK + j];
            xsum[t * nb + b] = s;
        }
    }
    if (any_ordered) q4_prep(x, cols, ntok, xsum, xsum + (size_t)ntok * nb);
}

/* Rows per claim of a product whose first part is of `kind` (thread_rows.h's row_chunk). */
int blockdot_chunk(int kind, int cols) {
    return row_chunk((long)(cols / block_elems(kind)) * (long)block_bytes(kind));
}

/* Rows [lo, hi) of a checked product (blockdot_check_parts: part starts `start`), x's block sums from
 * blockdot_prep: the same code whichever thread runs them, so the same bits. */
void blockdot_claim_rows(int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                         const float *x, int ntok, const float *xsum, float *y, int ldy, int lo, int hi) {
    int first, end;
    for (int p = 0; p < nparts; p++) {
        if (!rows_in_part(start, p, lo, hi, &first, &end)) continue;
        const int nblocks = cols / block_elems(kinds[p]);
        const size_t row_bytes = (size_t)nblocks * block_bytes(kinds[p]);
        const uint8_t *rows0 = (const uint8_t *)data[p] + (size_t)(first - start[p]) * row_bytes;
        block_rows_n(kinds[p], rows0, row_bytes, nblocks, x, cols, ntok, xsum, y + first, ldy, end - first);
    }
}

/* Thread `me`'s rows of a checked product inside a parallel region whose `count` shares split its rows
 * (row_shares_init). No barrier. */
void blockdot_team_rows(int nparts, const void *const *data, const int *kinds, const int *start, int cols,
                        const float *x, int ntok, const float *xsum, float *y, int ldy, row_share *shares, int count,
                        int me) {
    const int chunk = blockdot_chunk(kinds[0], cols);
    int lo, hi;
    while (row_next(shares, count, me, chunk, &lo, &hi))
        blockdot_claim_rows(nparts, data, kinds, start, cols, x, ntok, xsum, y, ldy, lo, hi);
}

/* y[t * ldy + o] for the rows of `nparts` stacked parts (part p: `kinds[p]`, `rows[p]` rows at `data[p]`), all
 * with `cols` columns. Returns 0, -1 for arguments out of range (nothing is written then), or -2 for a failed
 * allocation. */
int blockdot_matmul(int nparts, const void *const *data, const int *kinds, const int *rows, int cols,
                    const float *x, int ntok, float *y, int ldy) {
    int start[BLOCKDOT_MAX_PARTS + 1];
    if (blockdot_check_parts(nparts, kinds, rows, cols, ntok, ldy, start) != 0) return -1;
    /* on the stack up to 64 KiB (decode's products), else on the heap (a long row of 8 tokens, ~0.5 MB) */
    const size_t floats = blockdot_prep_floats(nparts, kinds, cols, ntok);
    float small[16384];
    float *xsum = floats <= 16384 ? small : malloc(floats * sizeof(float));
    if (xsum == NULL) return -2;
    blockdot_prep(nparts, kinds, x, cols, ntok, xsum);
    const int team = omp_get_max_threads();
    row_share shares[team];
    row_shares_init(shares, team, start[nparts]);
#pragma omp parallel num_threads(team)
    blockdot_team_rows(nparts, data, kinds, start, cols, x, ntok, xsum, y, ldy, shares, team, omp_get_thread_num());
    if (xsum != small) free(xsum);
    return 0;
}

/* out[r, c] = w[c] * (x[r, c] / sqrt(mean_c x[r, c]^2 + eps)): RMSNorm of `rows` float32 rows (sum of squares
 * in double). Returns 0, or -1 for a bad shape. */
int native_rms_norm(const float *x, const float *w, int rows, int cols, float eps, float *out) {
    if (rows < 0 || cols < 1) return -1;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        double ss = 0.0;
        for (int c = 0; c < cols; c++) ss += (double)xr[c] * xr[c];
        const float rms = sqrtf((float)(ss / cols) + eps);
        float *o = out + (size_t)r * cols;
#pragma omp simd
        for (int c = 0; c < cols; c++) o[c] = w[c] * (xr[c] / rms);
    }
    return 0;
}
