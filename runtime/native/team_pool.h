/* Helper threads of our own for the barrier-free decode team (decode_team.c): a step the caller leaves as soon as its
 * work is done, without waiting for a helper the machine took off its core.
 *
 * An OpenMP region ends with every thread of its team arriving: beside two busy single-thread programs on 2 cores,
 * the one wait a step had left (the end of decode_team.c's region) still held the caller for the rest of a
 * scheduler slice whenever its other thread had lost its core. Here the caller runs seat 0 of a step and helper
 * threads (started once, asleep between steps) run the other seats; when seat 0's work is done (every unit counted:
 * takeover.h) the caller closes the step and returns. A helper still inside a closed step reads only memory that
 * stays valid (see below) and gives up at its next check.
 *
 * What keeps a late helper harmless:
 * - The step's own memory (its copies of the caller's small arrays, its outputs, its claims) is a pool slot that
 *   the next step does not reuse while a helper is inside it (`users`): the next step takes another slot.
 * - Memory outside the slot that a seat writes (the KV pool and the mirror: their contents outlive the step) is
 *   written between team_write_begin and team_write_end: a helper announces the step it writes for, then checks the
 *   step is still open; the caller, closing the step, waits for any helper between the two (a few microseconds of
 *   stores). Either the helper sees the step closed and writes nothing, or the caller sees it writing and waits.
 * - Memory outside the slot that a seat reads and the caller may free later (the weights, the mirror) lives as long
 *   as the model's plan or the mirror it caches; whoever frees it first calls native_team_quiesce, which waits
 *   until no helper is inside any step (runtime/model/native_layers.py).
 *
 * One step runs at a time in a process (a lock); the pool and its threads are the process's, like OpenMP's. A
 * forked child starts with no helpers (pthread_atfork). */
#ifndef RADIXCACHE_TEAM_POOL_H
#define RADIXCACHE_TEAM_POOL_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TEAM_MAX_SEATS 64

/* The step a seat runs: `open` NULL for the caller's seat (its step is open until it returns). */
typedef struct {
    const _Atomic uint64_t *open;
    uint64_t step;
    _Atomic uint64_t *writing; /* this helper's announcement (team_write_begin) */
} team_live;

/* 1 while the seat's step is open (always for the caller's seat). */
static inline int team_open(const team_live *live) {
    return live->open == NULL || atomic_load_explicit(live->open, memory_order_relaxed) == live->step;
}

/* Before a write to memory outside the step's slot: 1 to go ahead (then team_write_end), 0 when the step is closed
 * (write nothing). Sequentially consistent with the caller's close, so one of the two sees the other. */
static inline int team_write_begin(const team_live *live) {
    if (live->open == NULL) return 1;
    atomic_store(live->writing, live->step);
    if (atomic_load(live->open) == live->step) return 1;
    atomic_store_explicit(live->writing, 0, memory_order_release);
    return 0;
}

static inline void team_write_end(const team_live *live) {
    if (live->open != NULL) atomic_store_explicit(live->writing, 0, memory_order_release);
}

/* A step's work for one seat: seat 0 is the caller; it must return only once the step's results are whole. */
typedef void (*team_seat_fn)(void *job, int seat, const team_live *live);

/* Takes the pool (waiting for another thread's step) and returns 64-byte aligned memory of at least `bytes` that no
 * helper reads until team_pool_run opens the step, or NULL (the pool released) where it cannot be allocated. */
void *team_pool_take(size_t bytes);
/* Runs `fn(job, seat, live)` on the caller as seat 0 and on helpers as seats 1 .. team - 1 (those that can be
 * started); returns when seat 0 has returned and no helper writes outside the slot, with the pool released. `job`:
 * in the memory team_pool_take gave. */
void team_pool_run(int team, team_seat_fn fn, void *job);
/* Waits until no helper is inside any step: call before freeing memory a step read (weights, a mirror). 0. */
int native_team_quiesce(void);
#endif
