"""One fuzz case (a one-node model, its feeds and its oracle) and the random pieces the
generators draw from: shapes, element types, values (valid and hostile)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

__all__ = ["Case", "Draw", "Skip", "F16", "F32", "F64", "BF16", "FLOATS", "INTS", "SIGNED", "NUMERIC"]

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (F32, F32, F32, F16, F64)  # float32 most often
SIGNED = tuple(np.dtype(t) for t in (np.int64, np.int32, np.int8, np.int16))
INTS = SIGNED + tuple(np.dtype(t) for t in (np.uint8, np.uint32, np.uint64))
NUMERIC = FLOATS + INTS

MAX_ELEMS = 1 << 20


class Skip(Exception):
    """A generator declines this draw; the message is the reason (counted by reason)."""


@dataclass(slots=True)
class Case:
    """A one-node model: ``inputs`` in order (a None array is an omitted optional input),
    ``consts`` the input names given as initializers (known at plan time).

    ``oracle`` is ``"reference"`` (onnx.reference, onnxruntime consulted on a
    disagreement), ``"ort"`` (onnxruntime only) or a function of the feeds returning the
    expected outputs (float64 numpy). ``out_of_spec`` names the entry of
    ``known.OUT_OF_SPEC`` that allows a typed rejection where an oracle computes
    something. ``build`` replaces the onnx.helper model (extension ops)."""

    op: str
    inputs: list[tuple[str, np.ndarray | None]]
    attrs: dict[str, Any] = field(default_factory=dict)
    n_out: int = 1
    domain: str = ""
    opset: int = 23
    oracle: Any = "reference"
    consts: frozenset[str] = frozenset()
    out_of_spec: str | None = None
    rtol: float | None = None
    atol: float | None = None
    build: Callable[[Case], Any] | None = None
    outputs_used: tuple[int, ...] | None = None  # graph outputs (default: all)
    node_name: str = "n0"  # what a typed error must name

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        return {n: a for n, a in self.inputs if a is not None and n not in self.consts}

    def model(self) -> Any:
        if self.build is not None:
            return self.build(self)
        names = [n if a is not None else "" for n, a in self.inputs]
        ins = [helper.make_tensor_value_info(n, onnx_type(a), list(a.shape)) for n, a in self.inputs
               if a is not None and n not in self.consts]
        inits = [from_array(a, n) for n, a in self.inputs if a is not None and n in self.consts]
        outs = [f"y{i}" for i in range(self.n_out)]
        node = helper.make_node(self.op, names, outs, name="n0", domain=self.domain, **self.attrs)
        used = range(self.n_out) if self.outputs_used is None else self.outputs_used
        g = helper.make_graph([node], "fuzz", ins, [helper.make_empty_tensor_value_info(outs[i]) for i in used],
                              initializer=inits)
        opsets = [helper.make_opsetid("", self.opset)]
        if self.domain:
            opsets.append(helper.make_opsetid(self.domain, 1))
        return typed_outputs(helper.make_model(g, opset_imports=opsets, ir_version=10))

    def describe(self) -> str:
        ins = ", ".join("-" if a is None else f"{n}:{a.dtype}{list(a.shape)}" for n, a in self.inputs)
        dom = f"{self.domain}::" if self.domain else ""
        attrs = {k: v for k, v in self.attrs.items() if not isinstance(v, onnx.GraphProto)}
        return f"{dom}{self.op}(opset {self.opset}; {ins}; {attrs})"


def typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give each graph output the element type onnx shape inference finds for it (the
    backend's verifier wants typed outputs), else the first input's; no shapes."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        found = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) +
                 list(inferred.graph.output) if v.type.HasField("tensor_type")}
    except Exception:  # noqa: BLE001 - inference refuses hostile models; the fallback types them
        found = {}
    fallback = model.graph.input[0].type.tensor_type.elem_type if model.graph.input else onnx.TensorProto.FLOAT
    for o in model.graph.output:
        if not o.type.tensor_type.elem_type:
            o.type.tensor_type.elem_type = found.get(o.name) or fallback
    return model


def onnx_type(a: np.ndarray) -> int:
    if a.dtype == BF16:
        return onnx.TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(a.dtype)


def from_array(a: np.ndarray, name: str) -> onnx.TensorProto:
    if a.dtype == BF16:
        t = helper.make_tensor(name, onnx.TensorProto.BFLOAT16, a.shape, a.view(np.uint16).tobytes(), raw=True)
        return t
    return onnx.numpy_helper.from_array(a, name)


class Draw:
    """Random choices for one case (a seeded numpy Generator)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq: Any) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def dim(self) -> int:
        r = self.rng.random()
        if r < 0.04:
            return 0
        if r < 0.3:
            return 1
        return self.int(2, 5)

    def shape(self, rank: int | None = None, lo: int = 0, hi: int = 4) -> tuple[int, ...]:
        rank = self.int(lo, hi) if rank is None else rank
        if self.chance(0.01) and rank >= 1:  # now and then a large tensor
            big = [1] * rank
            big[-1] = self.int(1000, MAX_ELEMS // 4)
            return tuple(big)
        return tuple(self.dim() for _ in range(rank))

    def broadcast_pair(self, rank: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Two shapes that broadcast (now and then two that do not)."""
        a = self.shape(rank)
        b = list(a)
        for i in range(len(b)):
            if self.chance(0.25):
                b[i] = 1
        if self.chance(0.3):
            b = b[self.int(0, len(b)):]
        if self.chance(0.03) and b:
            b[self.int(0, len(b) - 1)] += 2  # hostile: does not broadcast
        if self.chance(0.5):
            a, b = b, a
        return tuple(a), tuple(b)

    def values(self, dtype: np.dtype, shape: tuple[int, ...], *, lo: float = -4, hi: float = 4,
               special: float = 0.05, positive: bool = False) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        if dtype == np.bool_:
            return self.rng.random(n).reshape(shape) < 0.5
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            a, b = max(int(lo), int(info.min)), min(int(hi), int(info.max))
            if positive:
                a = max(a, 1)
            v = self.rng.integers(a, b + 1, size=n, dtype=np.int64) if n else np.zeros(0, np.int64)
            if special and n and self.chance(special):
                v[self.int(0, n - 1)] = self.pick([0, a, b])
            return v.astype(dtype).reshape(shape)
        v = self.rng.uniform(lo, hi, size=n)
        if positive:
            v = np.abs(v) + 0.1
        if special and n and self.chance(special * 4):
            k = self.int(1, max(1, n // 4))
            at = self.rng.integers(0, n, size=k)
            v[at] = self.rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-30]), size=k)
        with np.errstate(over="ignore"):
            return v.astype(dtype).reshape(shape)

    def indices(self, n: int, shape: tuple[int, ...], dtype: Any = np.int64, hostile: float = 0.05) -> np.ndarray:
        """Indices into an axis of length ``n`` (negative ones too); now and then one out of range."""
        size = int(np.prod(shape, dtype=np.int64))
        if n == 0:
            v = np.zeros(size, np.int64)
        else:
            v = self.rng.integers(-n, n, size=size)
        if size and self.chance(hostile):
            v[self.int(0, size - 1)] = self.pick([n, -n - 1, n + 7, 2**40])
        return v.astype(dtype).reshape(shape)
