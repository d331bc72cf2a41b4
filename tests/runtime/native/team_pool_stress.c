/* Test harness (tests/runtime/native/test_team_pool.py) for runtime/native/team_pool.c with takeover.h's phases,
 * outside Python: `callers` threads each run `steps` steps of a random team size (1 to 8 seats, whatever the
 * cores), while the main thread waits for quiet pools (native_team_quiesce) or forks children that run steps of
 * their own. Helpers lose their core at random (before their first claim, inside claims, before their store).
 * Each step's units read caller memory ("weights", freed once the step returned and the pool was quiet) and seat
 * 0 checks every unit's value; every seat stores into caller memory outside the slot ("the KV pool") between
 * team_write_begin and team_write_end and checks that its step's call has not returned yet.
 * Prints "callers C steps S violations V" and exits 1 on a violation; an address sanitizer build also catches a
 * read of weights freed while a helper was still inside. Usage: team_pool_stress callers steps [fork] */
#define _GNU_SOURCE
#include "team_pool.c"
#include "takeover.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define UNITS 256
#define MAX_TEAM 8
#define MAX_CALLERS 64

static _Atomic int violations;
static _Atomic uint64_t returned[MAX_CALLERS]; /* per caller: the tag of its last step whose call returned */
static _Atomic uint64_t stored[MAX_CALLERS];   /* "the KV pool": every seat of a step stores its tag */
static _Atomic int running;
static int steps;

typedef struct {
    uint64_t tag;
    int caller, team;
    const long *weights;
    row_share shares[MAX_TEAM];
    live_claim claims[MAX_TEAM];
    phase_count count;
    _Atomic long taken;
    long out[UNITS];
} job_t;

typedef struct {
    job_t *j;
    int me;
    unsigned *seed;
} work_t;

static void stall(int me, unsigned *seed, unsigned one_in, unsigned us) {
    if (me != 0 && rand_r(seed) % one_in == 0) usleep(rand_r(seed) % us);
}

static void units(const void *work, int lo, int hi) {
    const work_t *w = work;
    for (int u = lo; u < hi; u++) {
        stall(w->me, w->seed, 64, 300);
        w->j->out[u] = w->j->weights[u] + (long)w->j->tag; /* the same value whoever computes it */
    }
}

static void seat(void *job, int me, const team_live *live) {
    job_t *j = job;
    unsigned seed = (unsigned)(j->tag * 31 + (uint64_t)me);
    const work_t w = {j, me, &seed};
    stall(me, &seed, 16, 500);
    if (takeover_phase(0, UNITS, j->shares, j->team, 4, j->claims, &j->count, me, units, &w, NULL, live, &j->taken))
        return;
    stall(me, &seed, 8, 500);
    if (!team_write_begin(live)) return;
    if (atomic_load(&returned[j->caller]) >= j->tag) atomic_fetch_add(&violations, 1); /* a store after return */
    atomic_store(&stored[j->caller], j->tag);
    team_write_end(live);
    if (me != 0) return;
    for (int u = 0; u < UNITS; u++) /* every unit counted is written */
        if (j->out[u] != j->weights[u] + (long)j->tag) atomic_fetch_add(&violations, 1);
}

static void *caller_main(void *arg) {
    const int c = (int)(intptr_t)arg;
    unsigned seed = (unsigned)c * 7919u + 1u;
    for (int s = 1; s <= steps; s++) {
        const uint64_t tag = (uint64_t)c << 40 | (uint64_t)s;
        long *weights = malloc(sizeof(long) * UNITS);
        for (int u = 0; u < UNITS; u++) weights[u] = 3L * u + c;
        const int team = 1 + (int)(rand_r(&seed) % MAX_TEAM);
        job_t *j = team_pool_take(sizeof(job_t) + rand_r(&seed) % 4096); /* slots grow on the way */
        memset(j, 0, sizeof(*j));
        j->tag = tag;
        j->caller = c;
        j->team = team;
        j->weights = weights;
        row_shares_init(j->shares, team, UNITS);
        team_pool_run(team, seat, j);
        atomic_store(&returned[c], tag);
        if (atomic_load(&stored[c]) != tag) atomic_fetch_add(&violations, 1); /* seat 0 stores before it returns */
        native_team_quiesce();
        free(weights);
    }
    return NULL;
}

static int fork_child(void) {
    const pid_t pid = fork();
    if (pid == 0) { /* no helpers here: the pool starts its own */
        alarm(60);
        steps = 50;
        caller_main((void *)(intptr_t)(MAX_CALLERS - 1));
        _exit(atomic_load(&violations) != 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Whether the pool has started helpers (and so registered its fork handlers: h-lead registers them then). */
static int hooked(void) {
    pthread_mutex_lock(&pool.lock);
    const int yes = pool.helpers > 0;
    pthread_mutex_unlock(&pool.lock);
    return yes;
}

static void *counted(void *arg) {
    caller_main(arg);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

int main(int argc, char **argv) {
    const int callers = argc > 1 ? atoi(argv[1]) : 3;
    steps = argc > 2 ? atoi(argv[2]) : 300;
    const int forks = argc > 3 && strcmp(argv[3], "fork") == 0;
    if (callers < 1 || callers >= MAX_CALLERS - 1 || steps < 1) return 2;
    alarm(120); /* a hang ends the run (SIGALRM) */
    pthread_t t[MAX_CALLERS];
    atomic_store(&running, callers);
    for (int c = 0; c < callers; c++) pthread_create(&t[c], NULL, counted, (void *)(intptr_t)c);
    int children = 0;
    for (int t = 0; forks && !hooked() && t < 100000; t++) usleep(10);
    while (atomic_load(&running) > 0 || (forks && children < 10)) {
        if (forks && children < 10 && hooked()) {
            children++;
            if (!fork_child()) atomic_fetch_add(&violations, 1);
        }
        native_team_quiesce(); /* as a plan dropped on another thread does */
        usleep(1000);
    }
    for (int c = 0; c < callers; c++) pthread_join(t[c], NULL);
    printf("callers %d steps %d forks %d violations %d\n", callers, steps, children, atomic_load(&violations));
    return atomic_load(&violations) != 0;
}
