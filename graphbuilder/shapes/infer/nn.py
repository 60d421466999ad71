"""Linear algebra and normalisation: ``MatMul``, ``Gemm``, ``LayerNormalization`` and
the shape-preserving normalisations."""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, broadcast_shapes, register
from onnxforge.graphbuilder.shapes.symbolic import Dim

__all__ = ["matmul_shape", "stats_shape"]


def matmul_shape(op: NodeInference, a: tuple[Dim, ...] | None,
                 b: tuple[Dim, ...] | None) -> list[Dim] | None:
    """Shape of ``numpy.matmul(a, b)``; fails when the contracted dimensions provably differ."""
    if a is None or b is None:
        return None
    if not a or not b:
        op.fail("MatMul does not take scalars")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    op.check_dims(a2[-1], b2[-2], "contracted dimension")
    batch = broadcast_shapes(op, a2[:-2], b2[:-2])
    out = list(batch or ()) + [a2[-2], b2[-1]]
    if len(b) == 1:
        out.pop(-1)
    if len(a) == 1:
        out.pop(-2 if len(b) != 1 else -1)
    return out


@register("MatMul")
def _matmul(op: NodeInference) -> None:
    op.set(0, op.elem(0) or op.elem(1), matmul_shape(op, op.shape(0), op.shape(1)))


@register("Gemm")
def _gemm(op: NodeInference) -> None:
    a, b = op.shape(0), op.shape(1)
    out = None
    if a is not None and b is not None:
        if len(a) != 2 or len(b) != 2:
            op.fail(f"Gemm takes 2-D inputs, got ranks {len(a)} and {len(b)}")
        m, k = (a[1], a[0]) if op.int_attr("transA", 0) else (a[0], a[1])
        k2, n = (b[1], b[0]) if op.int_attr("transB", 0) else (b[0], b[1])
        op.check_dims(k, k2, "contracted dimension")
        out = [m, n]
    op.set(0, op.elem(0) or op.elem(1), out)


def stats_shape(op: NodeInference) -> list[Dim] | None:
    """Shape of the mean / inverse-deviation outputs of a normalisation over the axes
    from ``axis`` (default -1) on: input 0's shape with those axes set to 1."""
    s = op.shape(0)
    if s is None:
        return None
    a = op.norm_axis(op.int_attr("axis", -1), len(s))
    return list(s[:a]) + [1] * (len(s) - a)


@register("LayerNormalization")
def _layer_norm(op: NodeInference) -> None:
    op.same_as_input()
    stash = op.int_attr("stash_type", TensorProto.FLOAT)
    stats = stats_shape(op)
    for i in (1, 2):
        if op.has_output(i):
            op.set(i, stash, stats)


@register("BatchNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization",
          "MeanVarianceNormalization")
def _same_shape_norm(op: NodeInference) -> None:
    op.same_as_input()
    if op.node.op_type == "BatchNormalization":
        # running mean / variance have the shape of the inputs they update; the saved
        # statistics of opsets before 14 (outputs 3 and 4) have the shape of the scale
        for i, src in ((1, 3), (2, 4), (3, 1), (4, 1)):
            if op.has_output(i):
                op.same_as_input(i, src)
