"""The stateful conversion behind ``make_stateful``: a past/present decoder becomes a
model whose caches are persistent, aliased and updated in place. :mod:`.convert`
finds the cache pairs and converts GroupQueryAttention decoders; :mod:`.concat_caches`
rewrites the ``Concat(past, new)`` caches of ``torch.onnx`` exports, with the
attention mask built at the capacity (:mod:`.capacity_mask`); :mod:`.paged` turns the
contiguous caches into paged ones. Import each name from its module.
"""
