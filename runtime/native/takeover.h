/* Work that a team shares without waiting for a thread the machine has descheduled (decode_team.c).
 *
 * Barriers make every thread of a team wait for the slowest: on a busy machine, where a thread of ours loses its
 * core for a scheduler slice (milliseconds), each barrier it misses stops the others for that long. Here a team's
 * shared work is a sequence of phases, each a set of units (a product's rows, an attention's items) taken from
 * row shares (thread_rows.h). A thread publishes the claim it is computing in its own slot; a thread that finds
 * nothing left to claim in a phase that is not finished computes another thread's published claim itself. Units
 * are computed by the same code whoever runs them, into places used by this phase alone, so the late owner's
 * result is the same bits written over the same bits; whichever finishes first clears the slot (a compare-and-swap)
 * and counts the units. A phase is finished when its count is its total: no thread ever waits for another
 * thread to arrive somewhere, only for work, which it can do itself. So a unit's function must write final values
 * only into what others read (decode_team.c computes into the thread's own copy, then copies): a late owner's
 * partial values, over a unit another thread finished, would be read as its result.
 *
 * The one wait left is the window between a claim taken from a share and the claim published (a few
 * instructions): a thread that finds nothing to claim, nothing published and the phase unfinished spins there. */
#ifndef RADIXCACHE_TAKEOVER_H
#define RADIXCACHE_TAKEOVER_H
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "team_pool.h"
#include "thread_rows.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void takeover_pause(void) { _mm_pause(); }
#else
static inline void takeover_pause(void) {}
#endif

#define TAKEOVER_MAX_UNITS ((1L << 24) - 1) /* units of a phase a claim word holds */

typedef struct {
    _Alignas(64) _Atomic uint64_t word; /* (phase + 1) << 48 | lo << 24 | hi, or 0: nothing published */
} live_claim;

typedef struct {
    _Alignas(64) _Atomic long done; /* units of the phase computed and counted */
} phase_count;

static inline uint64_t claim_word(int phase, int lo, int hi) {
    return (uint64_t)(phase + 1) << 48 | (uint64_t)lo << 24 | (uint64_t)hi;
}

/* Tests only (NULL otherwise): thread `slow` loses its core right after publishing each claim, until another
 * thread took the claim over or `us` microseconds passed, and then computes the claim still (a late owner); the
 * other threads, entering a phase, first wait (as long at most) until `slow` has published a claim in it or the
 * phase is done, so that it has one to lose even on a machine whose scheduler keeps it behind. */
typedef struct {
    int slow, us;
} takeover_test;

/* Spins until `ready` or `us` microseconds passed. */
#ifdef _OPENMP
#define TAKEOVER_SPIN(ready, us)                                                                                       \
    for (const double t0_ = omp_get_wtime(); !(ready) && omp_get_wtime() - t0_ < (us) * 1e-6;) takeover_pause()
#else
#define TAKEOVER_SPIN(ready, us) (void)(us)
#endif

/* One phase's work for the thread that runs it: units [lo, hi) computed into the phase's own output. */
typedef void (*units_fn)(const void *work, int lo, int hi);

/* Thread `me` of a team of `count` slots in phase `phase` (`total` units in `shares`, claimed `chunk` at a time):
 * claims, computes and counts units until the phase is finished, computing other threads' published claims once
 * nothing is left to claim; each claim it finishes for another thread adds one to `*taken` (before it is counted).
 * Returns 0 with every unit's output written (the count's acquire pairs with each counter's release), or 1 where
 * `live`'s step closed first (a helper of team_pool.h that came late: nothing of the phase may be read then).
 * `test`: NULL, or takeover_test. */
static inline int takeover_phase(int phase, long total, row_share *shares, int count, int chunk, live_claim *slots,
                                 phase_count *counter, int me, units_fn run, const void *work,
                                 const takeover_test *test, const team_live *live, _Atomic long *taken) {
    unsigned spins = 0;
    if (test != NULL && me != test->slow && test->slow < count)
        TAKEOVER_SPIN((int)(atomic_load(&slots[test->slow].word) >> 48) == phase + 1 ||
                          atomic_load(&counter->done) >= total || !team_open(live),
                      test->us);
    for (;;) {
        if (!team_open(live)) return 1;
        int lo, hi;
        if (row_next(shares, count, me, chunk, &lo, &hi)) {
            const uint64_t w = claim_word(phase, lo, hi);
            atomic_store_explicit(&slots[me].word, w, memory_order_relaxed);
            if (test != NULL && me == test->slow)
                TAKEOVER_SPIN(atomic_load(&slots[me].word) != w || !team_open(live), test->us);
            run(work, lo, hi);
            uint64_t expect = w;
            if (atomic_compare_exchange_strong_explicit(&slots[me].word, &expect, 0, memory_order_acq_rel,
                                                        memory_order_relaxed))
                atomic_fetch_add_explicit(&counter->done, hi - lo, memory_order_release);
            continue;
        }
        if (atomic_load_explicit(&counter->done, memory_order_acquire) >= total) return 0;
        int found = 0;
        for (int o = 0; o < count; o++) {
            if (o == me) continue;
            uint64_t w = atomic_load_explicit(&slots[o].word, memory_order_acquire);
            if ((int)(w >> 48) != phase + 1) continue;
            found = 1;
            const int a = (int)(w >> 24 & 0xffffff), b = (int)(w & 0xffffff);
            run(work, a, b);
            if (atomic_compare_exchange_strong_explicit(&slots[o].word, &w, 0, memory_order_acq_rel,
                                                        memory_order_relaxed)) {
                atomic_fetch_add_explicit(taken, 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&counter->done, b - a, memory_order_release);
            }
        }
        if (!found && ++spins % 4096 == 0) sched_yield(); /* a claim not yet published: its owner lost its core */
        else if (!found) takeover_pause();
    }
}
#endif
