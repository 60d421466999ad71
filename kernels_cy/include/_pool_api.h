/* Client side of the worker pool (kernels_cy/runtime/_pool.h), included by the kernel modules
 * through _pool_client.pxi: they reach the one pool owned by ``onnxforge.kernels_cy.runtime._pool``
 * through a capsule, so every module shares the same workers. Import the owner module from
 * Python first, then call of_pool_import() once (it raises on failure): PyCapsule_Import
 * does not import submodules. */
#ifndef ONNXFORGE_POOL_API_H
#define ONNXFORGE_POOL_API_H

#include <Python.h>

typedef void (*of_task_fn)(void *ctx, long i);

typedef struct {
    void (*parallel_for)(long n, of_task_fn fn, void *ctx, int threads);
} of_pool_api_t;

static of_pool_api_t *of_pool_api = NULL;

static int of_pool_import(void) {
    of_pool_api = (of_pool_api_t *)PyCapsule_Import("onnxforge.kernels_cy.runtime._pool._api", 0);
    return of_pool_api != NULL ? 0 : -1;
}

static inline void of_pool_parallel_for(long n, of_task_fn fn, void *ctx, int threads) {
    of_pool_api->parallel_for(n, fn, ctx, threads);
}

#endif
