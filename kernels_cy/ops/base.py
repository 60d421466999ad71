"""Kernel objects and the registry that maps ``(domain, op_type)`` to them.

A kernel is built once per node at plan time from a :class:`NodeSpec` (attributes
parsed and validated there, constant inputs available) and then called as
``kernel.run(*inputs)`` by the run loop: it returns one array, or a tuple when the
node has several outputs. After construction a kernel object is read-only: one
plan serves every thread and every state at once, so whatever a run writes
(scratch, lengths, counters) lives in the run's context. A kernel that needs it
sets ``uses_context = True`` and is called as ``kernel.run(ctx, *inputs)`` with a
:class:`~onnxforge.kernels_cy.runtime.runctx.RunContext`.

``fresh`` says whether every output is a new buffer (counted as allocated). A
view kernel (``views_input = True``, ``fresh = False``) returns a view of its
first input where it can; when it returns other storage (a copy), the run loop
counts that copy as allocated and copied.

Example::

    @register("", "Relu")
    class Relu(Kernel):
        def run(self, x):
            return np.maximum(x, 0)
"""
from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from onnxforge.kernels_cy.errors import KernelError, UnsupportedAttributeError

__all__ = ["Kernel", "NodeSpec", "REGISTRY", "register", "claimed_ops", "norm_domain"]

ONNX_DOMAINS = ("", "ai.onnx")
PARALLEL_WORK = 1 << 20


def norm_domain(domain: str) -> str:
    return "" if domain in ONNX_DOMAINS else domain


@dataclass(slots=True, eq=False)
class NodeSpec:
    """What a kernel may know about its node at plan time (no IR object is kept)."""

    op_type: str
    domain: str
    name: str
    path: str
    opset: int
    attrs: dict[str, Any]
    n_inputs: int
    n_outputs: int
    consts: dict[int, np.ndarray] = field(default_factory=dict)
    input_types: list[Any] = field(default_factory=list)
    output_types: list[Any] = field(default_factory=list)
    present: tuple[bool, ...] = ()
    outputs_used: tuple[bool, ...] = ()
    subgraph: Callable[[str], Any] | None = None  # attribute name -> compiled sub-plan
    aliases: tuple[tuple[int, int], ...] = ()  # MUST_ALIAS (output index, input index) pairs
    threads: int = 1  # the session's thread bound for the kernels' own parallel loops

    def threads_for(self, work: int) -> int | None:
        """Threads for a parallel kernel doing ``work`` multiply-adds: 1 below ~1M (the
        fork/join costs more than it saves), else the session's bound."""
        return self.threads if self.threads > 1 and work >= PARALLEL_WORK else None

    # -- attribute access with plan-time validation --------------------------------
    def fail(self, message: str) -> UnsupportedAttributeError:
        return UnsupportedAttributeError(f"{self.path} ({self.op_type}): {message}")

    def int(self, name: str, default: int | None = None) -> int:
        v = self.attrs.get(name, default)
        if v is None:
            raise self.fail(f"attribute {name!r} is required")
        if not isinstance(v, (int, np.integer)):
            raise self.fail(f"attribute {name!r} must be an int, got {v!r}")
        return int(v)

    def float(self, name: str, default: float | None = None) -> float:
        v = self.attrs.get(name, default)
        if v is None:
            raise self.fail(f"attribute {name!r} is required")
        return float(v)

    # below the int() method, annotations name the built-in type as builtins.int
    def ints(self, name: str, default: Any = None) -> list[builtins.int] | None:
        v = self.attrs.get(name, default)
        return None if v is None else [int(i) for i in v]

    def string(self, name: str, default: str | None = None) -> str | None:
        v = self.attrs.get(name, default)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        return v

    def choice(self, name: str, default: Any, allowed: Any) -> Any:
        v = self.attrs.get(name, default)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        if v not in allowed:
            raise self.fail(f"attribute {name}={v!r} is not supported (supported: {sorted(allowed)})")
        return v

    def const(self, index: builtins.int) -> np.ndarray | None:
        return self.consts.get(index)

    def has_input(self, index: builtins.int) -> bool:
        return index < len(self.present) and self.present[index]


class Kernel:
    """Base of kernel objects; subclasses override :meth:`run`."""

    fresh: ClassVar[bool] = True
    uses_context: ClassVar[bool] = False  # run(ctx, *inputs): the run's RunContext first
    views_input: ClassVar[bool] = False  # the output is a view of input 0 unless copied

    def __init__(self, spec: NodeSpec):
        self.spec_path = spec.path

    def error(self, message: str) -> KernelError:
        return KernelError(f"{self.spec_path}: {message}")

    def run(self, *xs: Any) -> Any:  # pragma: no cover - every kernel overrides it
        raise NotImplementedError


REGISTRY: dict[tuple[str, str], Callable[[NodeSpec], Kernel]] = {}


def register(domain: str, *op_types: str) -> Callable[[Any], Any]:
    """Class decorator: claim ``(domain, op_type)`` for each op type."""

    def deco(cls: Any) -> Any:
        for op in op_types:
            REGISTRY[(norm_domain(domain), op)] = cls
        return cls

    return deco


def claimed_ops() -> list[tuple[str, str]]:
    """Sorted ``(domain, op_type)`` pairs the backend claims (``""`` is the ONNX domain)."""
    from onnxforge.kernels_cy import ops  # noqa: F401  (importing registers every kernel)

    return sorted(REGISTRY)
