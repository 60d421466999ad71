/* The backend's worker pool: a parallel-for whose workers spin only while a run is active.
 *
 * Every parallel loop of the backend's kernels runs here (no OpenMP). A pool whose idle
 * workers sleep at once pays a futex wake-up per parallel loop, tens of microseconds on a
 * loaded machine: a decode step runs one loop per product and would lose about a millisecond
 * that way. This pool keeps its workers spinning between kernels while a session run is active
 * (``of_pool_hot(+1)`` at run start, ``of_pool_hot(-1)`` at run end) and puts them to
 * sleep on a condition variable as soon as no run is active, so no thread busy-waits after
 * a run returns. A spinning worker yields the CPU after a short while, so a BLAS pool
 * running on the same cores is not starved.
 *
 * A job is ``fn(ctx, i)`` for ``i`` in ``[0, n)``. The caller runs tasks too and returns when
 * every task is done. Tasks are claimed from one 64-bit ticket holding the job's generation
 * (high 32 bits) and the next index (low 32 bits): a worker that read a job's ``fn`` and
 * ``ctx`` claims a task with a compare-and-swap on the ticket it read, so a late worker can
 * never run a task of a job it did not read. One job runs at a time; a call made while
 * another thread's job runs executes serially in the caller.
 */
#ifndef ONNXFORGE_POOL_H
#define ONNXFORGE_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OF_PAUSE() _mm_pause()
#else
#define OF_PAUSE() ((void)0)
#endif

#define OF_POOL_MAX_WORKERS 63
#define OF_POOL_SPIN_BEFORE_YIELD 4000

typedef void (*of_task_fn)(void *ctx, long i);

typedef struct {
    pthread_mutex_t mu;       /* guards sleeping, hot transitions and start-up */
    pthread_cond_t cv;
    pthread_mutex_t job_mu;   /* one job at a time */
    int started;              /* workers created */
    int nworkers;
    int sleepers;             /* workers blocked on cv */
    int hot;                  /* active runs: workers spin while > 0 */
    uint64_t ticket;          /* generation << 32 | next index */
    of_task_fn fn;
    void *ctx;
    long n;
    long done;                /* tasks finished in the current job */
    long jobs;                /* jobs run in parallel (for tests) */
    pthread_t th[OF_POOL_MAX_WORKERS];
} of_pool_t;

static of_pool_t of_pool_state = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                  PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0};

/* Claim one task of the job whose ticket generation is gen; -1 when none is left. */
static long of_pool_claim(uint32_t gen, of_task_fn *fn, void **ctx) {
    of_pool_t *P = &of_pool_state;
    for (;;) {
        uint64_t t = __atomic_load_n(&P->ticket, __ATOMIC_ACQUIRE);
        if ((uint32_t)(t >> 32) != gen) return -1;
        long i = (long)(uint32_t)t;
        of_task_fn f = __atomic_load_n(&P->fn, __ATOMIC_ACQUIRE);
        void *c = __atomic_load_n(&P->ctx, __ATOMIC_ACQUIRE);
        long n = __atomic_load_n(&P->n, __ATOMIC_ACQUIRE);
        if (i >= n) return -1;
        if (__atomic_compare_exchange_n(&P->ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *fn = f;
            *ctx = c;
            return i;
        }
    }
}

static void of_pool_drain(uint32_t gen) {
    of_pool_t *P = &of_pool_state;
    of_task_fn f;
    void *c;
    long i;
    while ((i = of_pool_claim(gen, &f, &c)) >= 0) {
        f(c, i);
        __atomic_add_fetch(&P->done, 1, __ATOMIC_RELEASE);
    }
}

static void *of_pool_worker(void *arg) {
    of_pool_t *P = &of_pool_state;
    uint32_t seen = (uint32_t)(__atomic_load_n(&P->ticket, __ATOMIC_ACQUIRE) >> 32);
    (void)arg;
    for (;;) {
        int spins = 0;
        uint32_t gen;
        while ((gen = (uint32_t)(__atomic_load_n(&P->ticket, __ATOMIC_ACQUIRE) >> 32)) == seen) {
            if (__atomic_load_n(&P->hot, __ATOMIC_ACQUIRE) > 0) {
                OF_PAUSE();
                if (++spins >= OF_POOL_SPIN_BEFORE_YIELD) {
                    sched_yield();
                    spins = 0;
                }
                continue;
            }
            pthread_mutex_lock(&P->mu);
            while ((uint32_t)(__atomic_load_n(&P->ticket, __ATOMIC_ACQUIRE) >> 32) == seen &&
                   __atomic_load_n(&P->hot, __ATOMIC_ACQUIRE) <= 0) {
                P->sleepers++;
                pthread_cond_wait(&P->cv, &P->mu);
                P->sleepers--;
            }
            pthread_mutex_unlock(&P->mu);
        }
        seen = gen;
        of_pool_drain(gen);
    }
    return NULL;
}

static void of_pool_atfork_child(void) {
    /* the workers do not exist in a forked child: start afresh */
    of_pool_t *P = &of_pool_state;
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->cv, NULL);
    pthread_mutex_init(&P->job_mu, NULL);
    P->started = 0;
    P->nworkers = 0;
    P->sleepers = 0;
    P->hot = 0;
}

/* Create up to ``want`` workers (once); returns the number running. */
static int of_pool_start(int want) {
    of_pool_t *P = &of_pool_state;
    pthread_mutex_lock(&P->mu);
    if (!P->started) {
        static int atfork_done = 0;
        if (!atfork_done) {
            pthread_atfork(NULL, NULL, of_pool_atfork_child);
            atfork_done = 1;
        }
        P->started = 1;
    }
    if (want > OF_POOL_MAX_WORKERS) want = OF_POOL_MAX_WORKERS;
    while (P->nworkers < want) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        int rc = pthread_create(&P->th[P->nworkers], &attr, of_pool_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        P->nworkers++;
    }
    int n = P->nworkers;
    pthread_mutex_unlock(&P->mu);
    return n;
}

/* A run starts (+1) or ends (-1): workers spin between jobs while any run is active. */
static void of_pool_hot(int delta) {
    of_pool_t *P = &of_pool_state;
    pthread_mutex_lock(&P->mu);
    P->hot += delta;
    if (P->hot < 0) P->hot = 0;
    if (P->hot > 0 && P->sleepers > 0) pthread_cond_broadcast(&P->cv);
    pthread_mutex_unlock(&P->mu);
}

/* fn(ctx, i) for i in [0, n) on the caller and up to ``threads - 1`` workers. */
static void of_parallel_for(long n, of_task_fn fn, void *ctx, int threads) {
    of_pool_t *P = &of_pool_state;
    long i;
    if (n <= 0) return;
    if (threads > n) threads = (int)n;
    if (threads <= 1 || n > 0x7fffffffL || pthread_mutex_trylock(&P->job_mu) != 0) {
        for (i = 0; i < n; ++i) fn(ctx, i);
        return;
    }
    if (__atomic_load_n(&P->nworkers, __ATOMIC_ACQUIRE) < threads - 1) of_pool_start(threads - 1);
    if (__atomic_load_n(&P->nworkers, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutex_unlock(&P->job_mu);
        for (i = 0; i < n; ++i) fn(ctx, i);
        return;
    }
    uint64_t t = __atomic_load_n(&P->ticket, __ATOMIC_ACQUIRE);
    uint32_t gen = (uint32_t)(t >> 32) + 1;
    __atomic_store_n(&P->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&P->fn, fn, __ATOMIC_RELEASE);
    __atomic_store_n(&P->ctx, ctx, __ATOMIC_RELEASE);
    __atomic_store_n(&P->n, n, __ATOMIC_RELEASE);
    __atomic_store_n(&P->ticket, (uint64_t)gen << 32, __ATOMIC_RELEASE);
    P->jobs++;
    if (__atomic_load_n(&P->hot, __ATOMIC_ACQUIRE) <= 0 || __atomic_load_n(&P->sleepers, __ATOMIC_ACQUIRE) > 0) {
        pthread_mutex_lock(&P->mu);
        if (P->sleepers > 0) pthread_cond_broadcast(&P->cv);
        pthread_mutex_unlock(&P->mu);
    }
    of_pool_drain(gen);
    while (__atomic_load_n(&P->done, __ATOMIC_ACQUIRE) < n) OF_PAUSE();
    pthread_mutex_unlock(&P->job_mu);
}

#endif
