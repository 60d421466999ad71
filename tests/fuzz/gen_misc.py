"""Operators whose cases need structured inputs the generic draws do not make (index
tensors, equations, boxes, windows): each is covered by its own differential tests against
onnxruntime and onnx.reference, named in the skip reason."""
from __future__ import annotations

from typing import Any

from tests.fuzz.case import Case, Draw, Skip

__all__ = ["GENERATORS"]

_TESTS = {
    "tests/kernels_cy/test_activations.py": ("BitShift", "Dropout", "PRelu", "Swish"),
    "tests/kernels_cy/test_topk_einsum_nms.py": ("TopK", "Einsum", "NonMaxSuppression"),
    "tests/kernels_cy/test_rearrange_cumulative.py": (
        "BitCast", "BlackmanWindow", "Compress", "CumProd", "CumSum", "DepthToSpace", "EyeLike",
        "HammingWindow", "HannWindow", "NonZero", "OneHot", "ReverseSequence", "ScatterElements", "SpaceToDepth"),
    "tests/test_backend_interface.py (onnx's scatter conformance cases)": ("Scatter",),
    "tests/kernels_cy/test_recurrent.py": ("GRU", "LSTM", "RNN"),
}


def _covered(where: str) -> Any:
    def gen(d: Draw) -> Case:
        raise Skip(f"structured inputs: covered by the differential tests of {where}")
    return gen


GENERATORS: dict[tuple[str, str], Any] = {("", op): _covered(where) for where, ops in _TESTS.items() for op in ops}
