"""Paged KV cache family: the page pool and its transactions (:mod:`.pages`),
ai.onnxforge PagedCacheUpdate and PagedAttention (:mod:`.kernels`), and the compiled
page codecs and attention of ``_paged`` with their SIMD bodies."""
