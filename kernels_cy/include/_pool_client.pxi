# The shared worker pool (``_pool.h``) seen from a kernel module, textually included:
# ``of_pool_parallel_for(n, fn, ctx, threads)`` runs ``fn(ctx, i)`` for i in [0, n).
cdef extern from "_pool_api.h":
    ctypedef void (*of_task_fn)(void* ctx, long i) noexcept nogil
    int of_pool_import() except -1
    void of_pool_parallel_for(long n, of_task_fn fn, void* ctx, int threads) nogil

import onnxforge.kernels_cy.runtime._pool  # noqa: F401  (the pool's owner must be imported first)

of_pool_import()
