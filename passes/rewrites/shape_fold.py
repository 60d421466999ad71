"""Static shape folding: shape computations whose result is known become constants.

The ``shapes`` analysis (:class:`~onnxforge.graphbuilder.shapes.context.ShapesContext`)
knows the (possibly symbolic) type of every value and the content of small
integer tensors. This pass replaces by an initializer (a ``Constant`` node in
a function body) every output of a shape computation whose content it knows
exactly: ``Shape`` and ``Size`` of values with static dimensions,
``Gather(Shape(x), i)`` of a static dimension, and whatever arithmetic on
them (Concat, Slice, Unsqueeze, Cast...) the analysis resolves to numbers
even when some of its inputs stay symbolic. Leftover arithmetic on the new
constants is left to ``constant_folding``.

``Slice(Shape(x), s, e)`` with a unit step along axis 0 that stays symbolic
becomes ``Shape(x, start=s, end=e)`` at opset >= 15 (both clamp the same way:
``shape[s:e]`` in Python slice semantics).

A ``Reshape`` target computed at run time whose entries the analysis knows
except for one becomes a constant with ``-1`` there, when every other entry is
a positive number (Reshape requires the element counts to agree, so the
inferred entry is the one the computation produced); entries equal to the
input's dimension at the same position become ``0`` (copy, ``allowzero=0``)::

    x: FLOAT[n, 200, 1, 1]                 y = Reshape(x, [-1, 200])
    t = Concat(Cast(Slice(Shape(x), 0, 1)), [200])
    y = Reshape(x, t)

Results that hold only on the runs that return are folded too: when one branch of an
``If`` gives a value types that make a later node fail, what follows from the other
branch's types is a constant of every such run (:mod:`~onnxforge.passes.analyses.failing_branches`).

Only integer and boolean results are folded (the analysis computes them
exactly); nodes with side effects, random operators, nodes owning subgraphs
and graph outputs are left alone; values are forwarded with
:func:`~onnxforge.passes.rewrites.rename.replace_value` (rule L13).

Before / after (``x: FLOAT[2, n, 8]``)::

    s = Shape(x)                          init d = [2]     (int64)
    d = Gather(s, [0])                    t = Shape(x, start=1)
    t = Slice(s, [1], [INT64_MAX])        y = Reshape(x, Concat(d, [-1]))
    y = Reshape(x, Concat(d, [-1]))
"""
from __future__ import annotations

import math
from functools import cache, partial
from typing import Any

import numpy as np
from onnx import TensorProto
from onnxforge.graphbuilder.ir.core import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.graphbuilder.shapes.symexpr import SymExpr
from onnxforge.graphbuilder.shapes.symparse import parse_dim
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.passes.framework.analysis_manager import AnalysisManager
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS, imported_version, opsets_in_scope
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.analyses.failing_branches import branch_constants
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.passes.framework.invariants import containers, is_nondeterministic
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, check_int_option, register_pass
from onnxforge.passes.rewrites.rename import NameScope, can_replace, erase_node, replace_value
from onnxforge.proto_ext.types import SparseTensorType, TensorType

__all__ = ["LazyShapes", "ShapeFoldPass", "fold_shapes", "shapes_for_rewrite"]

Container = Graph | Function

_INTEGER_TYPES = frozenset({
    TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
    TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
    TensorProto.BOOL,
})
# Operators whose integer results the analysis tracks; every other operator is left
# to constant folding (which evaluates it when its inputs are constants).
_SHAPE_OPS = frozenset({
    "Shape", "Size", "Gather", "GatherElements", "Slice", "Concat", "Unsqueeze", "Squeeze",
    "Reshape", "Flatten", "Cast", "CastLike", "Identity", "Add", "Sub", "Mul", "Div", "Mod",
    "Neg", "Abs", "Max", "Min", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
    "Not", "And", "Or", "Xor", "Where", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
    "Range", "ConstantOfShape", "Expand", "Tile", "Transpose", "Split", "Sign", "Clip",
})
_INT64_MAX = (1 << 63) - 1


def _static_shape(ctx: ShapesContext, v: Value | None) -> tuple[int, ...] | None:
    shape = ctx.shape_of(v)
    if shape is None or not all(type(d) is int and d >= 0 for d in shape):
        return None
    return tuple(shape)  # type: ignore[arg-type]  # every dimension was checked to be an int


def _shape_range(node: Node, rank: int) -> tuple[int, int]:
    """The ``[start, end)`` a Shape node reads, clamped to ``[0, rank]`` (opset 15)."""
    start = int(node.attr("start", 0))
    end = node.attr("end")
    end = rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, end


def _same_dim(dim: object, e: SymExpr) -> bool:
    """Whether a type's dimension (int or symbol name) is the symbolic value ``e``."""
    if isinstance(dim, int):
        return False  # a concrete dimension gives a concrete entry
    if isinstance(dim, str):
        try:
            return parse_dim(dim) == e
        except ValueError:
            return False
    return isinstance(dim, SymExpr) and dim == e


def _shape_dims(ctx: ShapesContext, node: Node) -> list[object] | None:
    """The dims a Shape node returns (ints or symbols), or None for an unknown rank."""
    shape = ctx.shape_of(node.inputs[0]) if node.inputs else None
    if shape is None:
        return None
    start, end = _shape_range(node, len(shape))
    return list(shape[start:end])


def _known_by_rule(ctx: ShapesContext, node: Node) -> list[np.ndarray] | None:
    """Results read directly from the input types, for the operators whose inference
    rule may not track contents."""
    op = node.op_type
    if op == "Shape":
        dims = _shape_dims(ctx, node)
        if dims is not None and all(type(d) is int and d >= 0 for d in dims):
            return [np.array(dims, dtype=np.int64)]
    elif op == "Size":
        shape = _static_shape(ctx, node.inputs[0])
        if shape is not None:
            return [np.array(math.prod(shape), dtype=np.int64)]
    elif op == "Gather" and len(node.inputs) == 2:
        src = node.inputs[0].producer() if node.inputs[0] is not None else None
        idx = constant_value(node.inputs[1])
        if (src is None or src.op_type != "Shape" or src.domain not in DEFAULT_DOMAINS
                or idx is None or idx.dtype.kind not in "iu" or int(node.attr("axis", 0)) not in (0, -1)):
            return None
        dims = _shape_dims(ctx, src)
        if dims is None:
            return None
        r = len(dims)
        flat = [int(i) + r if int(i) < 0 else int(i) for i in idx.reshape(-1)]
        if not all(0 <= i < r for i in flat):
            return None
        got = [dims[i] for i in flat]
        if all(type(d) is int and d >= 0 for d in got):
            return [np.array(got, dtype=np.int64).reshape(idx.shape)]
    return None


def _known(ctx: ShapesContext, node: Node) -> list[np.ndarray] | None:
    """Every output's exact content, or None."""
    out: list[np.ndarray] = []
    for o in node.outputs:
        t = ctx.type_of(o)
        if not isinstance(t, TensorType) or t.elem_type not in _INTEGER_TYPES:
            return None
        st = ctx.value_of(o)
        if st is None or not st.is_concrete() or st.elem_type != t.elem_type:
            out = []
            break
        arr = np.ascontiguousarray(st.to_numpy())
        shape = t.shape
        if (shape is not None and arr.shape != tuple(shape) and all(type(d) is int for d in shape)
                and math.prod(shape) == arr.size):
            arr = arr.reshape(shape)  # a scalar's content held as [1]: the value keeps its declared rank
        out.append(arr)
    if len(out) == len(node.outputs):
        return out
    return _known_by_rule(ctx, node)


class _ShapeFolder:
    def __init__(self, model: Model, ctx: ShapesContext, effects: Effects, max_elements: int):
        self.model = model
        self.ctx = ctx
        self.effects = effects
        self.max_elements = max_elements
        self.names = cache(partial(NameScope.from_model, model))  # built when first needed
        self.changed = 0
        self.pins = branch_constants(model, ctx, effects, self._small_known, self.foldable)
        """Contents that hold on every run that returns (:mod:`~onnxforge.passes.analyses.failing_branches`)."""

    def _small_known(self, ctx: ShapesContext, n: Node) -> list[np.ndarray] | None:
        """:func:`_known`, when every result is small enough to fold (the constants
        ``branch_constants`` checks are the ones this pass folds)."""
        known = _known(ctx, n)
        return known if known is not None and all(a.size <= self.max_elements for a in known) else None

    def foldable(self, n: Node) -> bool:
        """Whether ``n`` is a shape computation this pass may replace by its result."""
        return not (n.domain not in DEFAULT_DOMAINS or n.op_type not in _SHAPE_OPS or not n.outputs
                    or (n.attributes and any(a.type in (AttrType.GRAPH, AttrType.GRAPHS) or a.ref_attr_name
                                             for a in n.attributes.values()))
                    or is_nondeterministic(n) or self.effects.has_side_effects(n)
                    or any(n.graph.is_output(o) for o in n.outputs))

    def run(self, c: Container) -> None:
        opsets = opsets_in_scope(self.model, c)
        opset = imported_version(opsets, "") or 1
        for n in list(c):
            if n.graph is not c:
                continue
            if n.attributes and any(a.type in (AttrType.GRAPH, AttrType.GRAPHS)
                                    for a in n.attributes.values()):
                for sg in n.subgraphs():
                    self.run(sg)
                continue
            if (n.domain not in DEFAULT_DOMAINS or n.op_type not in _SHAPE_OPS or not n.outputs
                    or is_nondeterministic(n) or self.effects.has_side_effects(n)
                    or any(a.ref_attr_name for a in n.attributes.values())):
                continue
            known = self.pins.get(n) or _known(self.ctx, n)
            if known is not None and all(a.size <= self.max_elements for a in known):
                self.fold(c, n, known)
            elif n.op_type == "Slice" and opset >= 15:
                self.slice_of_shape(c, n)
            elif n.op_type == "Reshape":
                self.reshape_target(c, n)

    def _constant(self, c: Container, anchor: Node, array: np.ndarray, like: Value) -> Value:
        name = self.names().fresh(like.name or f"{anchor.op_type}_folded")
        t = Tensor.from_numpy(array)
        new = Value(name, TensorType(t.dtype, t.dims))
        if isinstance(c, Graph):
            c.add_initializer(new, t)
        else:
            c.insert_before(anchor, Node("", "Constant", [], [new], name=name,
                                         attributes=[Attr("value", AttrType.TENSOR, t)]))
        return new

    def fold(self, c: Container, n: Node, known: list[np.ndarray]) -> None:
        if any(c.is_output(o) for o in n.outputs):
            return  # an initializer cannot take over a graph output
        done = False
        for o, arr in zip(n.outputs, known):
            if not o.num_uses():
                continue
            new = self._constant(c, n, arr, o)
            if can_replace(o, new) and replace_value(o, new):
                done = True
            elif isinstance(c, Graph):
                c.remove_initializer(new)
        if not any(o.num_uses() for o in n.outputs):
            erase_node(n)
            done = True
        if done:
            self.changed += 1

    def reshape_target(self, c: Container, n: Node) -> None:
        """``Reshape(x, t)`` with ``t`` known but for one entry -> ``Reshape(x, constant)``."""
        if len(n.inputs) != 2 or int(n.attr("allowzero", 0) or 0) != 0 or n.inputs[1] is None:
            return
        x, target = n.inputs
        if constant_value(target) is not None:
            return
        st = self.ctx.value_of(target)
        if st is None or len(st.shape) != 1 or st.size == 0:
            return
        dims = self.ctx.shape_of(x)
        new: list[int] = []
        known: list[int] = []  # the entries given as numbers
        unknown = 0
        for i, e in enumerate(st.flat()):
            if e is not None and not isinstance(e, SymExpr):
                new.append(int(e))
                known.append(int(e))
            elif e is not None and dims is not None and i < len(dims) and _same_dim(dims[i], e):
                new.append(0)
            else:
                unknown += 1
                new.append(-1)
        if unknown > 1 or (unknown == 1 and (any(v <= 0 for v in known) or new.count(0))):
            # -1 infers the entry only when every other one is a known positive size (a
            # copied dimension may be 0 at run time, and -1 cannot be inferred then)
            return
        if any(v < -1 for v in new) or new.count(-1) > 1:
            return
        const = self._constant(c, n, np.array(new, dtype=np.int64), target)
        n.set_input(1, const)
        self.changed += 1

    def slice_of_shape(self, c: Container, n: Node) -> None:
        """``Slice(Shape(x), [s], [e], [0], [1])`` -> ``Shape(x, start=s, end=e)``."""
        ins = list(n.inputs) + [None] * (5 - len(n.inputs))
        data, starts, ends, axes, steps = ins[:5]
        src = data.producer() if data is not None else None
        if (src is None or src.op_type != "Shape" or src.domain not in DEFAULT_DOMAINS
                or src.graph is not c or self.effects.has_side_effects(src)
                or src.attr("start") not in (None, 0) or src.attr("end") is not None):
            return
        arrays = [constant_value(v) if v is not None else None for v in (starts, ends, axes, steps)]
        if arrays[0] is None or arrays[1] is None or arrays[0].size != 1 or arrays[1].size != 1:
            return
        if axes is not None and (arrays[2] is None or int(arrays[2].reshape(-1)[0]) not in (0, -1)):
            return
        if steps is not None and (arrays[3] is None or int(arrays[3].reshape(-1)[0]) != 1):
            return
        out = n.outputs[0]
        if c.is_output(out):
            return
        s = int(arrays[0].reshape(-1)[0])
        e = min(max(int(arrays[1].reshape(-1)[0]), -_INT64_MAX), _INT64_MAX)
        attrs = [Attr("start", AttrType.INT, s)]
        if e < _INT64_MAX:
            attrs.append(Attr("end", AttrType.INT, e))
        name = self.names().fresh(out.name or "shape")
        new = Node("", "Shape", [src.inputs[0]], [Value(name, out.type)],
                   name=self.names().fresh(n.name or "Shape"), attributes=attrs)
        c.insert_before(n, new)
        if can_replace(out, new.outputs[0]) and replace_value(out, new.outputs[0]):
            erase_node(n)
            self.changed += 1
        else:
            erase_node(new)


def shapes_for_rewrite(analyses: AnalysisManager | None, model: Model) -> ShapesContext | None:
    """A scratch copy of the cached ``shapes`` analysis of ``model`` (reading a context seeds
    types, which must not change the cached result), or None when shapes cannot be
    inferred (a model whose declared shapes contradict each other is still rewritten, by
    the rules that need no shapes)."""
    am = analyses if analyses is not None else AnalysisManager(model)
    try:
        return am.get("shapes", model).scratch()
    except ShapeError:
        return None


class LazyShapes:
    """The ``shapes`` answers a rewrite asks for, inferred when asked: most rewrites never
    ask, and inferring the whole model costs a walk of every node.

    A model that declares no storage (no aliases, bindings or READ_WRITE inputs) infers,
    for each question, only what the value depends on
    (:meth:`~onnxforge.graphbuilder.shapes.context.ShapesContext.infer_for`), unless a whole
    inference of the model as it is now is still cached. A model with storage is
    inferred whole on the first question (alias classes share types beyond a value's
    ancestors). Inferred on a partly rewritten model, the types still hold (rewrites keep
    every value's meaning)."""

    def __init__(self, analyses: AnalysisManager | None, model: Model):
        self._analyses, self._model = analyses, model
        self._ctx: ShapesContext | None = None
        self._asked = False
        self._on_demand = False

    def prefetch(self) -> None:
        """Be ready before any rewrite: a model inferred whole is inferred now, on the model
        as the pass found it (the nodes the last inference saw replay its results,
        :mod:`~onnxforge.graphbuilder.shapes.replay`); one inferred on demand needs nothing."""
        if self._asked:
            return
        self._asked = True
        am = self._analyses
        cached = am.cached("shapes", self._model) if am is not None else None
        if isinstance(cached, ShapesContext):
            self._ctx = cached.scratch()
            return
        effects = am.get("effects", self._model) if am is not None else effect_analysis(self._model)
        if effects.stateless:
            self._ctx = ShapesContext(self._model, write_back=False, strict=False, storage=effects)
            self._on_demand = True
        else:
            self._ctx = shapes_for_rewrite(am, self._model)

    def type_of(self, v: Value) -> Any:
        self.prefetch()
        ctx = self._ctx
        if ctx is None:
            return None
        if self._on_demand:
            try:
                ctx.infer_for((v,))
            except ShapeError:
                # the model's types contradict each other somewhere v depends on: no more
                # answers (what was inferred before the error may be incomplete)
                self._ctx = None
                return None
        return ctx.type_of(v)

    def shape_of(self, v: Value) -> tuple[Any, ...] | None:
        """The (possibly symbolic) shape of tensor ``v``; None for an unknown rank."""
        t = self.type_of(v)
        return t.shape if isinstance(t, (TensorType, SparseTensorType)) else None


def fold_shapes(model: Model, ctx: ShapesContext | None = None, *, max_elements: int = 128,
                effects: Effects | None = None) -> int:
    """Fold the shape computations ``ctx`` (default: a fresh inference) knows exactly;
    returns how many nodes were folded or rewritten. ``effects``: the model's current
    :class:`~onnxforge.passes.analyses.effects.Effects` when the caller has it (default: computed
    here)."""
    if ctx is None:
        ctx = shapes_for_rewrite(None, model)
        if ctx is None:
            return 0
    folder = _ShapeFolder(model, ctx, effect_analysis(model) if effects is None else effects, max_elements)
    for c in list(containers(model)):
        if isinstance(c, Function) or c is model.graph:
            folder.run(c)
    return folder.changed


@register_pass
class ShapeFoldPass(Pass):
    """Replace shape computations with known results by constants (see the module docstring).

    Reads the ``shapes`` analysis; ``max_elements`` (default 128) bounds each folded
    result (a folded value adds its payload to the model).
    """

    name = "shape_folding"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline", "topological_sort")
    runs_before = ("dce",)

    def __init__(self, *, max_elements: int = 128):
        check_int_option(self.name, "max_elements", max_elements, 0)
        self.max_elements = max_elements

    def call(self, model: Model) -> PassResult:
        ctx = shapes_for_rewrite(self.analyses, model)
        if ctx is None:
            return PassResult(model, False)
        return PassResult(model, fold_shapes(model, ctx, max_elements=self.max_elements,
                                             effects=self.analyses.get("effects", model)) > 0)
