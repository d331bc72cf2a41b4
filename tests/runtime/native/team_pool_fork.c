/* A fork while another thread holds team_pool.c's lock before any helper was started (the process's first step,
 * between team_pool_take and team_pool_run): the child's lock must be free, so that its first quiesce (any
 * NativeLayers.__del__) or step returns. The fork handlers were registered with the first helpers once, and the
 * child hung on the lock. Prints "child ok", or why not (test_team_pool.py). */
#define _GNU_SOURCE
#include "team_pool.c"
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static _Atomic int taken;
static void seat(void *job, int me, const team_live *live) { (void)job; (void)me; (void)live; }
static void *first_step(void *arg) {
    (void)arg;
    void *mem = team_pool_take(64); /* the process's first step: the lock held, no handlers yet */
    atomic_store(&taken, 1);
    usleep(200000);                 /* job_fill's time, stretched */
    team_pool_run(2, seat, mem);
    return NULL;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, first_step, NULL);
    while (!atomic_load(&taken)) usleep(100);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(3);
        native_team_quiesce(); /* as NativeLayers.__del__ in the child */
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    pthread_join(t, NULL);
    printf(WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "child ok\n" : "child hung on the pool's lock (killed by signal %d)\n",
           WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
