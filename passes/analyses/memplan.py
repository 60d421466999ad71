"""Memory plan: the bytes a run of the main graph allocates, step by step.

:func:`memory_plan` walks the schedule of :mod:`.liveness` with the types of
the ``shapes`` analysis (symbolic dims kept) and counts *buffers*: storage a
run allocates for node outputs. The rule, which the backend's counters follow:

* a node output owns a buffer of ``numel * itemsize`` bytes (the numpy
  itemsize: low-bit and float8 types take one byte per element in memory),
  allocated at its step, unless it is
  - written in place (its producer's MUST_ALIAS port, or a function output
    aliasing an input: :meth:`Effects.root`): zero bytes, kind ``in_place``;
  - a view (:func:`~onnxforge.passes.analyses.liveness.view_source`: Identity,
    Reshape, Squeeze, Unsqueeze, Flatten, unit-step Slice of a version no node
    overwrites later): zero bytes, kind ``view``;
  - an unnamed optional output, which is not produced: kind ``absent``;
* a buffer is live from its step through the step after which liveness
  releases it (a view keeps its source's buffer alive); a buffer returned by
  the run (a graph output, bound outputs included) is live to the end
  (kind ``result``; the others are kind ``buffer``);
* graph inputs, initializers and ``Constant`` nodes (decoded once when a plan
  is built) are not allocated by the run (kinds ``input`` and ``constant``). Storage that outlives the run, a READ_WRITE or
  persistently bound input (kind ``state``), is counted once in
  ``state_bytes`` however many values alias it, and never released or reused.

``step_bytes[i]`` is the bytes of buffers live during step ``i`` (its inputs
and outputs included); ``peak_bytes`` their maximum; ``allocated_bytes`` the sum
of every buffer (the backend's bytes-allocated counter for one run). Sizes are
``int`` when shapes are concrete, :class:`SymExpr` otherwise (the peak of
symbolic steps is a ``max(...)`` expression; :meth:`MemoryPlan.peak_for`
evaluates it for given dims). A value whose size is unknown (unknown rank or
dimension, non-tensor type) counts as 0 and is listed in ``unknown``; a step
that runs a control-flow body or a local function counts only its outputs and
is listed in ``nested``. ``exact`` is True when nothing is unknown or nested
and every counted size is a number. Kernel workspaces are not values and are
not counted.

Example (float32 [4, 8] chain, 128 bytes a value)::

    a = Relu(x); b = Neg(a); y = Abs(b)      step_bytes == (128, 256, 256)
                                             peak_bytes == 256, allocated_bytes == 384
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from onnxforge.graphbuilder.ir.core import Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symbolic import SymExpr, as_dim, product, sym_max
from onnxforge.graphbuilder.ir.tensors import np_dtype
from onnxforge.passes.framework.analysis_manager import Analysis, AnalysisManager, register_analysis
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.analyses.liveness import Liveness, liveness
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType, Type

__all__ = ["MemoryPlan", "MemoryPlanAnalysis", "memory_plan", "value_bytes"]

Size = int | SymExpr


@dataclass(frozen=True, slots=True, eq=False)
class MemoryPlan:
    """Bytes allocated by one run of the main graph (see the module docstring)."""

    order: tuple[Node, ...]
    kind: Mapping[Value, str]
    buffers: Mapping[Value, Size]
    step_bytes: tuple[Size, ...]
    peak_bytes: Size
    allocated_bytes: Size
    state_bytes: Size
    unknown: tuple[Value, ...]
    nested: tuple[Node, ...]
    exact: bool

    def peak_for(self, dims: Mapping[str, int]) -> int:
        """The peak with every symbol bound to a number (``{"seq": 7}``)."""
        return max((_evaluate(s, dims) for s in self.step_bytes), default=0)

    def bytes_of(self, v: Value) -> Size:
        """Bytes of the buffer ``v`` owns (0 for values that own none)."""
        return self.buffers.get(v, 0)


def _evaluate(s: Size, dims: Mapping[str, int]) -> int:
    return s if isinstance(s, int) else s.evaluate(dims)


def value_bytes(t: Type) -> Size | None:
    """In-memory bytes of a tensor of type ``t``; None when not known."""
    if not isinstance(t, TensorType) or t.shape is None or not t.elem_type:
        return None
    if any(d is None or (isinstance(d, int) and d < 0) or isinstance(d, str) for d in t.shape):
        return None
    try:
        item = np_dtype(t.elem_type).itemsize
    except OnnxforgeError:
        return None
    n = product(t.shape)
    return None if n is None else as_dim(n * item)


def _add(a: Size, b: Size) -> Size:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return as_dim(a + b)


def _peak(steps: list[Size]) -> Size:
    if not steps:
        return 0
    numbers = [s for s in steps if isinstance(s, int)]
    if len(numbers) == len(steps):
        return max(numbers)
    return as_dim(sym_max(*dict.fromkeys(steps)))


def memory_plan(model: Model, ctx: ShapesContext | None = None, *, effects: Effects | None = None,
                live: Liveness | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``model``'s main graph.

    ``ctx``: inferred types (a fresh, non-writing ShapesContext when omitted);
    ``effects`` / ``live``: the model's effects and the main graph's liveness,
    computed when omitted."""
    if ctx is None:
        ctx = ShapesContext(model, write_back=False, strict=False).infer_graph()
    fx = effect_analysis(model) if effects is None else effects
    lv = liveness(model.graph, fx) if live is None else live
    g = model.graph
    kind: dict[Value, str] = {}
    unknown: dict[Value, None] = {}

    def size(v: Value) -> Size:
        b = value_bytes(ctx.type_of(v))
        if b is None:
            unknown[v] = None
            return 0
        return b

    state: dict[Value, Size] = {}
    for v in g.inputs:
        if fx.is_state(v):
            kind[v] = "state"
            root = fx.root(v)
            if root not in state:
                state[root] = size(root)
        else:
            kind[v] = "input"
    for v in g.all_initializers():
        kind.setdefault(v, "constant")
    released = {v for step in lv.release_after for v in step}
    buffers: dict[Value, Size] = {}
    nested: list[Node] = []
    step_bytes: list[Size] = []
    live_bytes: Size = 0
    for i, n in enumerate(lv.order):
        if (n.attributes and n.subgraphs()) or (n.domain, n.op_type, n.overload) in model.functions:
            nested.append(n)
        constant = n.op_type == "Constant" and n.domain in ("", "ai.onnx") and not n.inputs
        for o in n.outputs:
            if not o.name:
                kind[o] = "absent"
            elif constant:
                kind[o] = "constant"  # decoded once when the plan is built, like an initializer
            elif fx.root(o) is not o:
                kind[o] = "in_place"
            elif lv.storage_of(o) is not o:
                kind[o] = "view"
            else:
                kind[o] = "buffer" if o in released else "result"
                buffers[o] = size(o)
                live_bytes = _add(live_bytes, buffers[o])
        step_bytes.append(live_bytes)
        for v in lv.release_after[i]:
            b = buffers.get(v)
            if b is not None:
                live_bytes = as_dim(live_bytes - b)
    allocated: Size = 0
    for b in buffers.values():
        allocated = _add(allocated, b)
    state_bytes: Size = 0
    for b in state.values():
        state_bytes = _add(state_bytes, b)
    counted = [*buffers.values(), *state.values()]
    exact = not unknown and not nested and all(isinstance(b, int) for b in counted)
    return MemoryPlan(lv.order, MappingProxyType(kind), MappingProxyType(buffers), tuple(step_bytes),
                      _peak(step_bytes), allocated, state_bytes, tuple(unknown), tuple(nested), exact)


@register_analysis
class MemoryPlanAnalysis(Analysis[MemoryPlan]):
    """The main graph's :class:`MemoryPlan`, from the ``shapes``, ``effects`` and
    ``liveness`` analyses."""

    name = "memory_plan"

    def compute(self, model: Model, analyses: AnalysisManager) -> MemoryPlan:
        ctx: ShapesContext = analyses.get("shapes", model)
        fx: Effects = analyses.get("effects", model)
        live: Liveness = analyses.get("liveness", model).main
        return memory_plan(model, ctx, effects=fx, live=live)

    def fingerprint(self, result: MemoryPlan) -> Hashable:
        """Every field: the schedule, each value's kind and buffer, the byte counts (sizes
        as text: symbolic ones compare by their expression) and what was not counted."""
        return (tuple(id(n) for n in result.order), tuple(map(str, result.step_bytes)),
                str(result.peak_bytes), str(result.allocated_bytes), str(result.state_bytes),
                frozenset((id(v), k) for v, k in result.kind.items()),
                frozenset((id(v), str(b)) for v, b in result.buffers.items()),
                tuple(id(v) for v in result.unknown), tuple(id(n) for n in result.nested),
                result.exact)
