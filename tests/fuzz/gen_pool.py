"""Generators for the pooling operators and the channel normalizations: MaxPool,
AveragePool, LpPool, their global forms, BatchNormalization (inference) and
InstanceNormalization.

Windows are drawn where onnxruntime follows the specification (no ``auto_pad=SAME_*``
with dilations, no ``ceil_mode`` with ``auto_pad=VALID``, no NaN in a max window: see
tests/kernels_cy/test_pool.py, which checks those forms against the specification)."""
from __future__ import annotations

from typing import Any

import numpy as np

from tests.fuzz.case import F32, F64, Case, Draw

__all__ = ["GENERATORS"]


def _window(d: Draw, spatial: tuple[int, ...], dilations: bool, ceil_mode: bool) -> dict[str, Any]:
    n = len(spatial)
    kernel = [d.int(1, min(3, s)) for s in spatial]
    mode = d.pick(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"])
    # SAME with a stride longer than the kernel needs negative padding, which onnxruntime
    # refuses or misreads (the specification pads by max(0, ...))
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": [
        d.int(1, k if mode.startswith("SAME") else 3) for k in kernel]}
    if mode != "NOTSET":
        attrs["auto_pad"] = mode
    dil = [1] * n
    if dilations and mode in ("NOTSET", "VALID") and d.chance(0.4):
        dil = [d.int(1, 2) if (k - 1) * 2 + 1 <= s else 1 for k, s in zip(kernel, spatial)]
        attrs["dilations"] = dil
    if mode == "NOTSET":
        attrs["pads"] = [d.int(0, kernel[i % n] - 1) for i in range(2 * n)]
        if ceil_mode and d.chance(0.5):
            attrs["ceil_mode"] = 1
    return attrs


def _spatial(d: Draw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = d.int(1, 3)
    return (d.int(1, 2), d.int(1, 3)), tuple(d.int(1, 6) for _ in range(n))


def max_pool(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64, np.dtype(np.int8), np.dtype(np.uint8)))
    batch, spatial = _spatial(d)
    attrs = _window(d, spatial, True, True)
    x = d.values(dt, batch + spatial, lo=-100, hi=100, special=0.0)
    n_out = 2 if d.chance(0.4) else 1
    if n_out == 2 and d.chance(0.3):
        attrs["storage_order"] = 1
    return Case("MaxPool", [("x", x)], attrs, n_out=n_out, opset=22, oracle="ort")


def avg_pool(d: Draw) -> Case:
    batch, spatial = _spatial(d)
    attrs = _window(d, spatial, True, True)
    if d.chance(0.5):
        attrs["count_include_pad"] = 1
    x = d.values(F32, batch + spatial)
    return Case("AveragePool", [("x", x)], attrs, opset=22, oracle="ort", rtol=1e-5, atol=1e-6)


def lp_pool(d: Draw) -> Case:
    batch, spatial = _spatial(d)
    attrs = _window(d, spatial, True, True)
    attrs["p"] = d.pick([1, 2, 3])
    x = d.values(F32, batch + spatial, special=0.0)
    return Case("LpPool", [("x", x)], attrs, opset=22, oracle="ort", rtol=1e-5, atol=1e-5)


def global_pool(op: str) -> Any:
    """float64 numpy is the oracle: onnxruntime has float32 kernels only (and no GlobalLpPool
    after opset 2), onnx.reference's GlobalMaxPool reduces the wrong axes for rank 3."""
    reduce = {"GlobalAveragePool": lambda v: v.mean(axis=2), "GlobalMaxPool": lambda v: v.max(axis=2),
              "GlobalLpPool": lambda v: np.sqrt((v * v).sum(axis=2))}[op]

    def gen(d: Draw) -> Case:
        shape = tuple(d.int(1, 4) for _ in range(d.int(3, 6)))
        x = d.values(d.pick((F32, F64)), shape, special=0.0)

        def oracle(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            v = feeds["x"].astype(np.float64).reshape(shape[:2] + (-1,))
            return [reduce(v).reshape(shape[:2] + (1,) * (len(shape) - 2)).astype(feeds["x"].dtype)]
        attrs = {"p": 2} if op == "GlobalLpPool" else {}
        return Case(op, [("x", x)], attrs, opset=2 if op == "GlobalLpPool" else 22, oracle=oracle,
                    rtol=1e-5, atol=1e-6)
    return gen


def batch_norm(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64))
    shape = (d.int(1, 3), d.int(1, 4)) + tuple(d.int(1, 5) for _ in range(d.int(0, 3)))
    c = shape[1]
    # finite parameters: onnxruntime folds the mean into the bias, so infinities meet in a
    # different order there (x * a + (B - mean * a) against (x - mean) * a + B)
    inputs = [("x", d.values(dt, shape)), ("scale", d.values(dt, (c,), special=0.0)),
              ("B", d.values(dt, (c,), special=0.0)), ("mean", d.values(dt, (c,), special=0.0)),
              ("var", d.values(dt, (c,), positive=True, special=0.0))]
    attrs = {"epsilon": d.pick([1e-5, 1e-3])}
    return Case("BatchNormalization", inputs, attrs, opset=d.pick([9, 15]), oracle="ort", rtol=1e-5, atol=1e-5)


def instance_norm(d: Draw) -> Case:
    dt = d.pick((F32, F32, F64))
    shape = (d.int(1, 3), d.int(1, 4)) + tuple(d.int(1, 5) for _ in range(d.int(1, 3)))
    c = shape[1]
    inputs = [("x", d.values(dt, shape, special=0.0)), ("scale", d.values(dt, (c,), special=0.0)),
              ("B", d.values(dt, (c,), special=0.0))]
    return Case("InstanceNormalization", inputs, {"epsilon": 1e-3}, opset=22, oracle="ort", rtol=1e-4, atol=1e-4)


GENERATORS: dict[tuple[str, str], Any] = {
    ("", "MaxPool"): max_pool, ("", "AveragePool"): avg_pool, ("", "LpPool"): lp_pool,
    ("", "GlobalAveragePool"): global_pool("GlobalAveragePool"),
    ("", "GlobalMaxPool"): global_pool("GlobalMaxPool"), ("", "GlobalLpPool"): global_pool("GlobalLpPool"),
    ("", "BatchNormalization"): batch_norm, ("", "InstanceNormalization"): instance_norm,
}
