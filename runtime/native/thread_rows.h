/* A product's output rows shared by the threads of a parallel region (densedot.c, blockdot.c, qdot.c; inside the
 * decode layers' region through team_product.h).
 *
 * Each thread owns one contiguous share of the rows, in thread order, and takes it from the front a chunk at a
 * time (less near its end: row_claim): one sequential stream of weights per thread. A thread whose share is done
 * takes rows from the back of the share with the most rows left (half of what is left), so a thread on a slower
 * core no longer holds the whole product back. Measured on the project's 2-vCPU VM (docs/benchmarks.md): in the
 * minutes when a `sum` reads 50-60 GB/s, one vCPU streams its equal share 15-25% slower than the other (whichever
 * thread runs there), and the products of 30 layers ran 4-8% faster with these shares than with fixed halves
 * (paired medians; the same where the memory reads 30-35 GB/s).
 *
 * A row is computed whole by whichever thread takes it, by the same code, so the bits never depend on who took it
 * or on the thread count. Claims are compare-and-swaps on one word per share (front in the low 32 bits, back in
 * the high 32), each share on its own cache line; the region's closing barrier orders the outputs. Threads the
 * runtime does not start (a nested or smaller team) leave their shares to be taken by the others: every row is
 * still computed once. */
#ifndef RADIXCACHE_THREAD_ROWS_H
#define RADIXCACHE_THREAD_ROWS_H
#include <stdatomic.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#define ROW_CHUNK_BYTES 65536 /* what an owner claims at a time, and the least a thread takes from another */

typedef struct {
    _Alignas(64) _Atomic uint64_t span; /* rows [front, back): front in the low 32 bits, back in the high 32 */
} row_share;

/* `count` shares of rows [0, total), share i the i-th contiguous part (the team's share before the region). */
static inline void row_shares_init(row_share *shares, int count, int total) {
    for (int i = 0; i < count; i++) {
        const uint64_t lo = (uint64_t)((long)total * i / count), hi = (uint64_t)((long)total * (i + 1) / count);
        atomic_init(&shares[i].span, hi << 32 | lo);
    }
}

/* Rows per claim for rows of `row_bytes` bytes: about ROW_CHUNK_BYTES, at least one. */
static inline int row_chunk(long row_bytes) {
    const long rows = row_bytes > 0 ? ROW_CHUNK_BYTES / row_bytes : 1;
    return rows > 0 ? (int)rows : 1;
}

/* Claims rows [*a, *b) from one share: from the front (its owner) `chunk` rows, or a quarter of what is left once
 * that is less than `chunk`; from the back (another thread) half of what is left. Neither takes fewer than
 * chunk / 8 rows (one at least), nor more than is left. 0 when the share is empty.
 *
 * The claims shrink as a share runs out so that the team ends a product together: with claims of `chunk` rows
 * (64 KiB), a thread done first waited for up to one chunk of the other's, about 2 us at the ~31 GB/s a vCPU
 * streams, at each of a float32 decode step's 120 products. Measured inside SmolLM2's fp32 decode (2 threads,
 * .so builds alternating step by step, adjacent steps paired): the layers' time 0.974 of fixed claims where the
 * memory is fast (8.6 against 8.9 ms), the same where it is slow; gguf the same (1.001). Smaller floors (chunk /
 * 16) or halves for the owner were slower: each claim from the back starts a new stream. */
static inline int row_claim(row_share *share, int chunk, int from_back, int *a, int *b) {
    uint64_t cur = atomic_load_explicit(&share->span, memory_order_relaxed);
    for (;;) {
        const uint32_t front = (uint32_t)cur, back = (uint32_t)(cur >> 32), left = back - front;
        if (front >= back) return 0;
        const uint32_t least = chunk / 8 > 0 ? (uint32_t)chunk / 8 : 1;
        uint32_t take = from_back ? left / 2 : left / 4 < (uint32_t)chunk ? left / 4 : (uint32_t)chunk;
        if (take < least) take = least;
        if (take > left) take = left;
        const uint64_t next = from_back ? (uint64_t)(back - take) << 32 | front : (uint64_t)back << 32 | (front + take);
        if (atomic_compare_exchange_weak_explicit(&share->span, &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *a = (int)(from_back ? back - take : front);
            *b = (int)(from_back ? back : front + take);
            return 1;
        }
    }
}

/* The rows [*a, *b) of a claim [lo, hi) that fall in part p of a stack of parts (part p: rows start[p] ..
 * start[p + 1] - 1), or 0 when none do: the products cut their claims where parts meet. */
static inline int rows_in_part(const int *start, int p, int lo, int hi, int *a, int *b) {
    *a = lo > start[p] ? lo : start[p];
    *b = hi < start[p + 1] ? hi : start[p + 1];
    return *a < *b;
}

/* The next rows [*a, *b) for thread `me` of a team over `count` shares: its own share's front, else the back of
 * the share with the most rows left. 0 when every share is empty. */
static inline int row_next(row_share *shares, int count, int me, int chunk, int *a, int *b) {
    if (me < count && row_claim(&shares[me], chunk, 0, a, b)) return 1;
    for (;;) {
        int most_at = -1;
        uint32_t most = 0;
        for (int i = 0; i < count; i++) {
            const uint64_t cur = atomic_load_explicit(&shares[i].span, memory_order_relaxed);
            const uint32_t front = (uint32_t)cur, back = (uint32_t)(cur >> 32);
            if (back > front && back - front > most) {
                most = back - front;
                most_at = i;
            }
        }
        if (most_at < 0) return 0;
        if (row_claim(&shares[most_at], chunk, 1, a, b)) return 1;
    }
}
#endif
