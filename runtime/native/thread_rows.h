/* Each thread of a parallel region takes one contiguous share of `total` output rows, in thread order: one
 * sequential stream of weights per thread. Shared by densedot.c and blockdot.c, whose stacked parts the callers
 * then cut their share at. A row's sums never depend on the share it falls in, so neither do the bits. */
#ifndef RADIXCACHE_THREAD_ROWS_H
#define RADIXCACHE_THREAD_ROWS_H
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif

/* This thread's rows [*lo, *hi) of `total` (inside a parallel region; all of them outside one). */
static inline void thread_rows(int total, int *lo, int *hi) {
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    *lo = (int)((long)total * me / threads);
    *hi = (int)((long)total * (me + 1) / threads);
}
#endif
