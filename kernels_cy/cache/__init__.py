"""Contiguous cache family: ai.onnxforge CacheUpdate (:mod:`.kernels`), written in place
by the compiled ``_cache`` copy."""
