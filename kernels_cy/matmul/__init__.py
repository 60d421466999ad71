"""Product family: MatMul, Gemm and com.microsoft MatMulNBits (:mod:`.kernels`), the
one-row streaming products of ``_gemv`` and ``_matmul_nbits``, and the plan-time
SwiGLU fusion (:mod:`.fused`)."""
