"""Attention family: ONNX and com.microsoft RotaryEmbedding, ONNX Attention and
com.microsoft GroupQueryAttention (:mod:`.kernels`), over the compiled ``_attention``
(one-query and prefill loops, online softmax) and ``_rotary`` modules."""
