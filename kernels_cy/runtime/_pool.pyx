# cython: boundscheck=False, wraparound=False
"""The backend's worker pool (``_pool.h``): one parallel-for shared by every kernel module.

Workers spin between kernels only while a run is active, so a decode step's many small
parallel products do not each pay a thread wake-up, and sleep as soon as no run is
active (no thread busy-waits after a run returns). :func:`run_begins` / :func:`run_ends`
mark a run (the session calls them); kernel modules call the pool from C through the
capsule ``_api`` (``_pool_api.h``).
"""
from cpython.pycapsule cimport PyCapsule_New
from libc.stdlib cimport free, malloc

cdef extern from "_pool.h" nogil:
    ctypedef void (*of_task_fn)(void* ctx, long i) noexcept nogil
    ctypedef struct of_pool_t:
        int nworkers
        int hot
        long jobs
    of_pool_t of_pool_state
    void of_parallel_for(long n, of_task_fn fn, void* ctx, int threads)
    void of_pool_hot(int delta)
    int of_pool_start(int want)

cdef extern from "_pool_api.h":
    ctypedef struct of_pool_api_t:
        void (*parallel_for)(long n, of_task_fn fn, void* ctx, int threads) noexcept nogil

__all__ = ["run_begins", "run_ends", "stats"]

cdef of_pool_api_t _API
_API.parallel_for = of_parallel_for
_api = PyCapsule_New(<void*>&_API, b"onnxforge.kernels_cy.runtime._pool._api", NULL)


def run_begins() -> None:
    """A run starts: the workers spin between jobs until the matching :func:`run_ends`."""
    of_pool_hot(1)


def run_ends() -> None:
    """A run ended: when no other run is active the workers go to sleep."""
    of_pool_hot(-1)


def stats() -> dict:
    """Workers started, active runs and jobs run in parallel so far."""
    return {"workers": of_pool_state.nworkers, "active_runs": of_pool_state.hot,
            "jobs": of_pool_state.jobs}


cdef void _noop(void* ctx, long i) noexcept nogil:
    (<long*>ctx)[i] = i + 1


def _selftest(long n, int threads) -> list:
    """Run a job writing ``i + 1`` into slot ``i`` (for tests of the pool itself)."""
    cdef long* buf = <long*>malloc(sizeof(long) * (n if n > 0 else 1))
    cdef long i
    if buf == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            buf[i] = 0
        with nogil:
            of_parallel_for(n, _noop, buf, threads)
        return [buf[i] for i in range(n)]
    finally:
        free(buf)
