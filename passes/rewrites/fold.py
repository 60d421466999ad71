"""Constant folding and lifting of Constant nodes to initializers.

A node whose inputs are all constants (initializers that are not graph inputs,
or outputs of ``Constant`` nodes) is evaluated once and replaced by an
initializer holding its result (a ``Constant`` node inside a function body,
which has no initializers). The node is evaluated by :func:`.fold_eval.evaluate_node`
(numpy where it computes onnx.reference's results, ``onnx.reference`` otherwise).
``Constant`` nodes of graphs become
initializers without reading their payload.

Never folded: nodes with side effects, random operators, nodes owning
subgraphs, attribute references, operators outside the default domain,
encoded (quantized) inputs, string or low-bit results, and results larger than
``max_output_bytes`` (known before evaluating for the operators that can
amplify: ConstantOfShape, Expand, Tile, Range, MatMul...).

Before / after::

    graph(x) -> y                      graph(x) -> y
      c = Constant(value=[1, 2])         init c = [1, 2]
      s = Shape(w)        # w init       init t = [3, 4]   (Add(c, Shape(w)) folded)
      t = Add(c, s)                      y = Mul(x, t)
      y = Mul(x, t)

A payload is never duplicated across scopes: a node of a control-flow body
folded from outer constants leaves its result in the innermost graph that
defines one of its inputs, and an equal node (same operator, attributes and
input values) elsewhere in that graph's bodies reads that same result.

One walk in node order: folding a node makes its consumers foldable when they
are visited (topological order), so the pass is O(N) evaluations.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS, imported_version, opsets_in_scope
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.rewrites.fold_eval import evaluate_node
from onnxforge.passes.framework.invariants import is_nondeterministic
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, check_int_option, register_pass
from onnxforge.passes.framework.records import copy_tensor
from onnxforge.passes.rewrites.rename import erase_node
from onnxforge.proto_ext.types import TensorType

__all__ = [
    "ConstantFoldingPass",
    "LiftConstantsPass",
    "constant_value",
    "fold_constants",
    "lift_constants",
]

Container = Graph | Function

# Result has the broadcast shape of the inputs.
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Where", "Equal",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Neg", "Abs",
    "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Relu", "Sigmoid",
    "Tanh", "Erf", "Cast", "CastLike", "Clip", "IsNaN", "IsInf", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor", "BitwiseNot", "Identity", "LeakyRelu", "Softplus", "Sin", "Cos",
})
# Result is no larger than all inputs together.
_BOUNDED = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Concat", "Shape",
    "Size", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax",
    "ArgMin", "Split", "Softmax", "LogSoftmax", "CumSum", "NonZero",
})
# Never evaluated: results depend on more than the inputs, or are not tensors.
_NEVER = frozenset({
    "Constant", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "SequenceInsert",
    "SequenceErase", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement",
    "OptionalHasElement", "StringNormalizer", "TfIdfVectorizer", "RegexFullMatch", "StringConcat",
    "StringSplit",
})


def _constant_attr_tensor(node: Node) -> Tensor | None:
    """The tensor a ``Constant`` node produces (None for sparse or referenced values)."""
    if len(node.attributes) != 1:
        return None
    (name, a), = node.attributes.items()
    if a.ref_attr_name:
        return None
    v = a.value
    if name == "value" and isinstance(v, Tensor):
        return v
    if name == "value_float":
        return Tensor.from_numpy(np.array(v, dtype=np.float32))
    if name == "value_floats":
        return Tensor.from_numpy(np.array(list(v), dtype=np.float32).reshape(-1))
    if name == "value_int":
        return Tensor.from_numpy(np.array(v, dtype=np.int64))
    if name == "value_ints":
        return Tensor.from_numpy(np.array(list(v), dtype=np.int64).reshape(-1))
    return None


def constant_value(v: Value | None) -> np.ndarray | None:
    """The value of ``v`` if it is a known dense constant (not overridable), else None."""
    if v is None:
        return None
    t = v.const
    if t is not None:
        if isinstance(t, EncodedTensor) or v.is_graph_input():
            return None
        return t.numpy()
    p = v.producer()
    if p is not None and p.op_type == "Constant" and p.domain in DEFAULT_DOMAINS:
        t = _constant_attr_tensor(p)
        if t is not None:
            return t.numpy()
    return None


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biuf" and a.dtype.itemsize > 0 and a.dtype.names is None and (
        a.dtype.kind != "f" or a.dtype in (np.float16, np.float32, np.float64))


# -- numpy fast path -------------------------------------------------------------------


# -- size limits --------------------------------------------------------------------------


def _predicted_elements(node: Node, arrays: list[np.ndarray | None]) -> int | None:
    """Upper bound on output elements before evaluating (None: cannot tell)."""
    op = node.op_type
    present = [a for a in arrays if a is not None]
    try:
        if op in _ELEMENTWISE:
            return math.prod(np.broadcast_shapes(*(a.shape for a in present))) if present else 1
        if op in _BOUNDED:
            return sum(a.size for a in present)
        if op == "ConstantOfShape":
            return math.prod(int(d) for d in arrays[0].reshape(-1))
        if op == "Expand":
            return math.prod(np.broadcast_shapes(arrays[0].shape, tuple(int(d) for d in arrays[1].reshape(-1))))
        if op == "Tile":
            return arrays[0].size * math.prod(int(d) for d in arrays[1].reshape(-1))
        if op == "Range":
            start, limit, delta = (float(a.reshape(-1)[0]) for a in arrays[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        if op in ("MatMul", "Gemm"):
            a, b = arrays[0], arrays[1]
            return math.prod(a.shape[:-1]) * (b.shape[-1] if b.ndim else 1) * max(
                1, math.prod(b.shape[:-2]))
    except (ValueError, TypeError, IndexError, OverflowError, AttributeError):
        return None
    return math.prod(a.size for a in present) if present else None


class _Folder:
    def __init__(self, model: Model, *, fold: bool, lift: bool, max_output_bytes: int,
                 max_input_bytes: int, max_growth_bytes: int = 1024, effects: Effects | None = None):
        self.model = model
        self.effects = effect_analysis(model) if effects is None else effects
        self.fold = fold
        self.lift = lift
        self.max_output_bytes = max_output_bytes
        self.max_input_bytes = max_input_bytes
        self.max_growth_bytes = max_growth_bytes
        self.changed = 0
        self.memo: dict[tuple[Any, ...], list[Value | None]] = {}

    def run(self, c: Container) -> None:
        for n in c:
            if n.attributes and any(a.type == AttrType.GRAPH or a.type == AttrType.GRAPHS
                                    for a in n.attributes.values()):
                for sg in n.subgraphs():
                    self.run(sg)
                continue
            if n.domain not in DEFAULT_DOMAINS:
                continue
            if n.op_type == "Constant":
                if self.lift and isinstance(c, Graph):
                    self.lift_constant(c, n)
                continue
            if self.fold:
                self.try_fold(c, n)

    def _home(self, c: Container, node: Node) -> Container:
        """Where ``node``'s folded results go: the innermost graph that defines one of its
        inputs (an ancestor of ``c``, or ``c``), so that one node of each branch of an ``If``
        folding the same outer weight makes one initializer, not one per branch."""
        if not isinstance(c, Graph) or c.parent is None:
            return c
        outer = False
        for v in node.inputs:  # no input from outside c (the usual case): c is the home
            if v is not None:
                p = v.producer()
                if (p.graph if p is not None else v.graph) is c:
                    return c
                outer = True
        if not outer or any(c.is_output(o) for o in node.outputs):
            return c
        depth: dict[int, int] = {}
        g: Graph | None = c
        k = 0
        while isinstance(g, Graph):
            depth[id(g)] = k
            k += 1
            owner = g.parent
            g = owner.graph if owner is not None and isinstance(owner.graph, Graph) else None
        best: Graph | None = None
        for v in node.inputs:
            if v is None:
                continue
            p = v.producer()
            d = p.graph if p is not None else v.graph
            if not isinstance(d, Graph) or id(d) not in depth:
                return c
            if best is None or depth[id(d)] < depth[id(best)]:
                best = d
        return c if best is None else best

    def _grows(self, node: Node, added: int) -> bool:
        """Whether folding ``node`` would grow the model's payload by more than
        ``max_growth_bytes``: its results minus the constants that nobody would
        read afterwards (read only by ``node`` and by equal nodes, which fold to the same
        result)."""
        if added <= self.max_growth_bytes:
            return False
        mine = self._key(node, None)
        freed = 0
        seen: set[int] = set()
        for v in node.inputs:
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            if v.is_graph_output() or (v.graph is not None and v.is_graph_input()):
                continue
            if mine is not None and all(self._key(u, None) == mine for u, _ in v.uses()):
                arr = constant_value(v)
                freed += 0 if arr is None else arr.nbytes
        return added - freed > self.max_growth_bytes

    @staticmethod
    def _key(node: Node, home: Container | None) -> tuple[Any, ...] | None:
        """Identity of a fold (operator, attributes, the very input values), or None."""
        attrs = []
        for name, a in sorted(node.attributes.items()):
            v = a.value
            if isinstance(v, list):
                v = tuple(v)
            if not isinstance(v, (int, float, str, bytes, tuple)) or a.ref_attr_name:
                return None
            attrs.append((name, a.type, v))
        return (id(home) if home is not None else 0, node.domain, node.op_type, node.overload, tuple(node.inputs), tuple(attrs))

    def _reuse(self, c: Container, node: Node) -> bool:
        """Point ``node``'s outputs at the results of an equal fold made earlier."""
        home = self._home(c, node)
        if home is c:
            return False
        key = self._key(node, home)
        hit = self.memo.get(key) if key is not None else None
        if hit is None or len(hit) != len(node.outputs):
            return False
        for old, new in zip(node.outputs, hit):
            if new is None and (old.num_uses() or c.is_output(old)):
                return False
        for old, new in zip(node.outputs, hit):
            if new is not None:
                old.replace_all_uses_with(new, outputs=False, aliases=not self.effects.stateless)
        erase_node(node)
        self.changed += 1
        return True

    def _replace(self, c: Container, node: Node, results: Sequence[Tensor | None]) -> None:
        """Replace ``node``'s outputs by constants (initializers, or Constant nodes in functions)."""
        home = self._home(c, node)
        key = self._key(node, home) if home is not c else None
        made: list[Value | None] = []
        for old, t in zip(node.outputs, results):
            if t is None or (not old.name and not old.num_uses()):
                made.append(None)
                continue
            new = Value(old.name, TensorType(t.dtype, t.dims), doc_string=old.doc_string)
            new.metadata.update(old.metadata)
            new.has_value_info = old.has_value_info and home is c
            if c.is_output(old) and old.type is not None:
                new.type = old.type
            old.name = ""
            old.replace_all_uses_with(new, outputs=True, aliases=not self.effects.stateless)
            made.append(new)
            if isinstance(home, Graph):
                home.add_initializer(new, t)
            else:
                c.insert_before(node, Node("", "Constant", [], [new], name=new.name,
                                           attributes=[Attr("value", AttrType.TENSOR, t)]))
        for v in erase_node(node):  # Constant nodes (in function bodies) nobody reads any more
            p = v.producer()
            if (p is not None and p.op_type == "Constant" and p.graph is c and not v.num_uses()
                    and not c.is_output(v)):
                erase_node(p)
        if key is not None:
            self.memo[key] = made
        self.changed += 1

    def lift_constant(self, g: Graph, node: Node) -> None:
        """:meth:`_replace` of a ``Constant`` node by an initializer of ``g``, its own home
        (it reads nothing and owns no body)."""
        t = _constant_attr_tensor(node)
        if t is None or len(node._outputs) != 1 or self.effects.has_side_effects(node):
            return
        old = node._outputs[0]
        if old.name or old._uses:
            new = Value(old.name, TensorType(t.dtype, t.dims), doc_string=old.doc_string)
            if old.metadata:
                new.metadata.update(old.metadata)
            new.has_value_info = old.has_value_info
            if old.type is not None and g.is_output(old):
                new.type = old.type
            old.name = ""
            old.replace_all_uses_with(new, outputs=True, aliases=not self.effects.stateless)
            g.add_initializer(new, copy_tensor(t))  # the attribute's record may be shared
        g.remove(node, safe=False)
        self.changed += 1

    def try_fold(self, c: Container, n: Node) -> None:
        for v in n._inputs:  # cheap rejection first: most nodes read a computed value
            if v is not None and v.const is None:
                p = v._producer
                if p is None or p.op_type != "Constant":
                    return
        op = n.op_type
        if op in _NEVER or not n.outputs or is_nondeterministic(n) or self.effects.has_side_effects(n):
            return
        if any(a.ref_attr_name for a in n.attributes.values()):
            return
        arrays: list[np.ndarray | None] = []
        total = 0
        for v in n.inputs:
            if v is None:
                arrays.append(None)
                continue
            a = constant_value(v)
            if a is None or not _numeric(a):
                return
            total += a.nbytes
            arrays.append(a)
        if total > self.max_input_bytes:
            return
        if self._reuse(c, n):
            return
        predicted = _predicted_elements(n, arrays)
        widest = max((a.dtype.itemsize for a in arrays if a is not None), default=8)
        if predicted is None or predicted * widest > 2 * self.max_output_bytes:
            return  # the exact size is checked after evaluating; this guards memory
        opsets = opsets_in_scope(self.model, c)
        opset = imported_version(opsets, n.domain) or 23
        # (numpy's floating-point errors are ignored for the whole pass: see _run)
        results = evaluate_node(n, arrays, opset, opsets)
        if results is None or len(results) != len(n.outputs):
            return
        tensors: list[Tensor | None] = []
        for r in results:
            if not isinstance(r, np.ndarray) or not _numeric(r) or r.nbytes > self.max_output_bytes:
                return
            tensors.append(Tensor.from_numpy(np.ascontiguousarray(r)))
        if self._grows(n, sum(r.nbytes for r in results)):
            return
        self._replace(c, n, tensors)


def _run(model: Model, **options: Any) -> int:
    folder = _Folder(model, **options)
    with np.errstate(all="ignore"):  # an evaluation's overflow or NaN is its result, not an error
        folder.run(model.graph)
        for fn in model.functions.values():
            folder.run(fn)
    return folder.changed


def fold_constants(model: Model, *, lift: bool = True, max_output_bytes: int = 1 << 24,
                   max_input_bytes: int = 1 << 26, max_growth_bytes: int = 1024,
                   effects: Effects | None = None) -> int:
    """Fold constant nodes (and lift Constant nodes with ``lift``); returns how many nodes went.

    A fold whose results are larger, by more than ``max_growth_bytes``, than the constants it
    leaves unread is not made: folding never makes a model file grow by more than that per
    node (``Transpose(W)`` of a weight ``W`` that other nodes read stays a node).
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
    when the caller has it (default: computed here)."""
    return _run(model, fold=True, lift=lift, max_output_bytes=max_output_bytes,
                max_input_bytes=max_input_bytes, max_growth_bytes=max_growth_bytes, effects=effects)


def lift_constants(model: Model, *, effects: Effects | None = None) -> int:
    """Turn every ``Constant`` node of a graph into an initializer; returns how many.
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
    when the caller has it (default: computed here)."""
    return _run(model, fold=False, lift=True, max_output_bytes=0, max_input_bytes=0, effects=effects)


@register_pass
class ConstantFoldingPass(Pass):
    """Evaluate constant nodes and lift Constant nodes (see the module docstring).

    ``max_output_bytes`` (default 16 MiB) bounds each folded result,
    ``max_input_bytes`` (default 64 MiB) the constant inputs read by one node;
    ``lift`` (default True) turns Constant nodes of graphs into initializers;
    ``max_growth_bytes`` (default 1 KiB) bounds the payload a fold may add beyond the
    constants it leaves unread.
    """

    name = "constant_folding"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline",)

    def __init__(self, *, lift: bool = True, max_output_bytes: int = 1 << 24,
                 max_input_bytes: int = 1 << 26, max_growth_bytes: int = 1024):
        check_int_option(self.name, "max_output_bytes", max_output_bytes, 0)
        check_int_option(self.name, "max_input_bytes", max_input_bytes, 0)
        check_int_option(self.name, "max_growth_bytes", max_growth_bytes, 0)
        self.max_growth_bytes = max_growth_bytes
        self.lift = lift
        self.max_output_bytes = max_output_bytes
        self.max_input_bytes = max_input_bytes

    def call(self, model: Model) -> PassResult:
        n = fold_constants(model, lift=self.lift, max_output_bytes=self.max_output_bytes,
                           max_input_bytes=self.max_input_bytes,
                           max_growth_bytes=self.max_growth_bytes,
                           effects=self.analyses.get("effects", model))
        return PassResult(model, n > 0)


@register_pass
class LiftConstantsPass(Pass):
    """Turn ``Constant`` nodes of graphs into initializers (payloads are not read).

    Before / after: ``c = Constant(value=[1, 2]); y = Add(x, c)`` becomes the
    initializer ``c = [1, 2]`` and ``y = Add(x, c)``.
    """

    name = "lift_constants"
    # Constant nodes become initializers: values and steps change
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, lift_constants(model, effects=self.analyses.get("effects", model)) > 0)
