# The shared worker pool (``_pool.h``) seen from a kernel module, textually included:
# ``of_pool_parallel_for(n, fn, ctx, threads)`` runs ``fn(ctx, i)`` for i in [0, n).
cdef extern from "_pool_api.h":
    ctypedef void (*of_task_fn)(void* ctx, long i) noexcept nogil
    int of_pool_import() except -1
    void of_pool_parallel_for(long n, of_task_fn fn, void* ctx, int threads) nogil

import onnxforge.kernels_cy.runtime._pool  # noqa: F401  (the pool's owner must be imported first)

of_pool_import()


cdef inline Py_ssize_t _rows_per_task(Py_ssize_t rows, int nt) noexcept nogil:
    """Rows per pool task when ``rows`` independent rows run on ``nt`` threads: all of them
    on one thread; else about four tasks per thread (a row each when rows are few), so that
    uneven progress still balances and claiming a task costs little beside its rows."""
    if nt <= 1 or rows <= 1:
        return rows if rows > 0 else 1
    cdef Py_ssize_t tasks = 4 * <Py_ssize_t>nt
    return (rows + tasks - 1) // tasks


cdef inline void _run_row_tasks(of_task_fn fn, void* job, Py_ssize_t rows, Py_ssize_t chunk,
                                int nt) noexcept nogil:
    """``fn(job, t)`` for the ``ceil(rows / chunk)`` tasks of ``chunk`` rows: on the pool, or
    straight in the caller when one thread runs them."""
    cdef Py_ssize_t t, tasks = (rows + chunk - 1) // chunk
    if nt <= 1 or tasks <= 1:
        for t in range(tasks):
            fn(job, t)
    else:
        of_pool_parallel_for(tasks, fn, job, nt)
