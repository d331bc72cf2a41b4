/* The helper threads of decode_team.c's steps (team_pool.h says what keeps a late helper harmless). */
#define _GNU_SOURCE
#include "team_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void pool_pause(void) { _mm_pause(); }
#else
static inline void pool_pause(void) {}
#endif

#define POOL_SLOTS 4    /* steps whose memory may be in use at once: the open one and late helpers' */
#define POOL_SPIN 4096  /* pauses a helper waits for the next step before it sleeps (tens of microseconds) */

typedef struct {
    _Alignas(64) _Atomic int users; /* helpers inside a step that used this slot */
    void *mem;
    size_t cap;
    /* the step's, written by the caller before it opens the step */
    team_seat_fn fn;
    void *job;
    int team;
} pool_slot;

typedef struct {
    _Alignas(64) _Atomic uint64_t word;
} seat_word;

/* The process's pool (one step at a time, like the OpenMP runtime's teams): the lock's holder alone writes `count`,
 * `chosen`, `helpers` and the slots' memory and step fields. */
static struct {
    pthread_mutex_t lock;
    _Alignas(64) _Atomic uint64_t open; /* the open step: its count * POOL_SLOTS + its slot; 0 between steps */
    _Alignas(64) _Atomic unsigned bell; /* rung as a step opens (wrapping): a sleeping helper's futex */
    _Atomic int sleepers;
    uint64_t count;
    int chosen, helpers;
    seat_word writing[TEAM_MAX_SEATS];
    pool_slot slot[POOL_SLOTS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void bell_wait(unsigned rung) {
#ifdef __linux__
    atomic_fetch_add(&pool.sleepers, 1);
    syscall(SYS_futex, &pool.bell, FUTEX_WAIT_PRIVATE, rung, NULL, NULL, 0); /* returns at once if rung again */
    atomic_fetch_sub(&pool.sleepers, 1);
#else
    (void)rung;
    sched_yield();
#endif
}

static void bell_ring(void) {
    atomic_fetch_add(&pool.bell, 1);
#ifdef __linux__
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.bell, FUTEX_WAKE_PRIVATE, TEAM_MAX_SEATS, NULL, NULL, 0);
#endif
}

static void *helper_main(void *arg) {
    const int seat = (int)(intptr_t)arg;
    unsigned rung = atomic_load(&pool.bell) - 1u; /* not yet heard: the step that started it may be open already */
    uint64_t last = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool.bell, memory_order_acquire) == rung) {
            if (++spins < POOL_SPIN) pool_pause();
            else bell_wait(rung);
        }
        rung = atomic_load(&pool.bell);
        const uint64_t step = atomic_load(&pool.open);
        if (step == 0 || step == last) continue;
        pool_slot *s = &pool.slot[step % POOL_SLOTS];
        atomic_fetch_add(&s->users, 1); /* then the step checked open: the caller reuses no slot a helper is in */
        if (atomic_load(&pool.open) == step && seat < s->team) {
            last = step;
            const team_live live = {&pool.open, step, &pool.writing[seat].word};
            s->fn(s->job, seat, &live);
        }
        atomic_fetch_sub_explicit(&s->users, 1, memory_order_release);
    }
    return NULL;
}

/* A fork copies the pool but none of its threads: the child starts with none, every slot free. */
static void before_fork(void) { pthread_mutex_lock(&pool.lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool.lock); }
static void after_fork_child(void) {
    pool.helpers = 0;
    atomic_store(&pool.open, 0);
    atomic_store(&pool.sleepers, 0);
    for (int i = 0; i < POOL_SLOTS; i++) atomic_store(&pool.slot[i].users, 0);
    for (int i = 0; i < TEAM_MAX_SEATS; i++) atomic_store(&pool.writing[i].word, 0);
    pthread_mutex_init(&pool.lock, NULL);
}

/* The fork handlers, registered before the pool's lock is ever taken: a fork while another thread holds it (a step,
 * a quiesce) then waits for it to be released, and the child's lock is free. */
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static void hook(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

static void pool_lock(void) {
    pthread_once(&hook_once, hook);
    pthread_mutex_lock(&pool.lock);
}

/* Helpers up to `want` (fewer where a thread cannot be started: seat 0 takes their shares), every signal blocked
 * in them so that Python's threads receive them. */
static void start_helpers(int want) {
    if (pool.helpers >= want) return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.helpers < want) {
        pthread_t t;
        if (pthread_create(&t, &attr, helper_main, (void *)(intptr_t)(pool.helpers + 1)) != 0) break;
        pool.helpers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void *team_pool_take(size_t bytes) {
    pool_lock();
    for (;;) {
        for (int i = 0; i < POOL_SLOTS; i++) { /* the first free slot: one or two slots' memory in use, not four */
            pool_slot *s = &pool.slot[i];
            if (atomic_load(&s->users) != 0) continue;
            if (s->cap < bytes) { /* a pass's outputs grow with its positions: room for half as much again */
                const size_t cap = ((bytes + bytes / 2) + 63) / 64 * 64;
                void *mem = aligned_alloc(64, cap);
                if (mem == NULL) {
                    pthread_mutex_unlock(&pool.lock);
                    return NULL;
                }
                free(s->mem);
                s->mem = mem;
                s->cap = cap;
            }
            pool.chosen = i;
            return s->mem;
        }
        sched_yield(); /* every slot has a helper that has not left its step yet: rare, and short */
    }
}

void team_pool_run(int team, team_seat_fn fn, void *job) {
    team = team < TEAM_MAX_SEATS ? team : TEAM_MAX_SEATS;
    start_helpers(team - 1);
    pool_slot *s = &pool.slot[pool.chosen];
    s->fn = fn;
    s->job = job;
    s->team = team;
    const uint64_t step = ++pool.count * POOL_SLOTS + (uint64_t)pool.chosen;
    atomic_store_explicit(&pool.open, step, memory_order_release);
    if (pool.helpers > 0) bell_ring();
    const team_live me = {NULL, step, NULL};
    fn(job, 0, &me);
    atomic_store(&pool.open, 0); /* sequentially consistent: pairs with team_write_begin */
    for (int h = 1; h < team && h <= pool.helpers; h++)
        for (unsigned spins = 1; atomic_load(&pool.writing[h].word) == step; spins++)
            if (spins % 1024 == 0) sched_yield();
            else pool_pause();
    pthread_mutex_unlock(&pool.lock);
}

int native_team_quiesce(void) {
    pool_lock();
    for (int i = 0; i < POOL_SLOTS; i++)
        while (atomic_load(&pool.slot[i].users) != 0) sched_yield();
    pthread_mutex_unlock(&pool.lock);
    return 0;
}
