"""Control flow: ``If``, ``Loop`` and ``Scan`` infer their bodies in place.

``If`` infers both branches; its outputs take the branch types merged: equal
element types (a difference is an error), equal ranks (otherwise the rank is
unknown) and, per dimension, the dimension when both branches agree and
``None`` when they do not. When the condition is known, the taken branch's
types are used. An output whose branches resolve to different alias roots
(storage owners outside the branch) is rejected. In a speculation
(``ShapesContext.live`` set), an ``If`` whose condition is known infers only
the branch that runs.

``Loop`` carries types through its body: a carried value whose dimension
changes between iterations gets a fresh symbol for that dimension (found by a
trial inference that never touches the IR), so the body is inferred once with
types valid for every iteration. Scan outputs gain a leading dimension: the
trip count when ``M`` is known and no condition is given, else ``None``.

``Scan`` binds state and per-slice input types (scan axis removed) and inserts
the scan length into its scan outputs.
"""
from __future__ import annotations

from collections.abc import Sequence

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.ir.core import Graph
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.graphbuilder.shapes.type_merge import format_type
from onnxforge.graphbuilder.shapes.symbolic import Dim, dims_equal
from onnxforge.proto_ext.types import (
    OptionalType,
    SequenceType,
    TensorType,
    Type,
    type_name,
)

__all__ = ["join_types"]


def join_types(a: Type, b: Type, what: str, fresh: bool = False, op: NodeInference | None = None) -> Type:
    """The type covering both ``a`` and ``b`` (two branches, or two iterations).

    Dimensions that differ become ``None`` (or a fresh symbol when ``fresh``);
    different element types or kinds raise :class:`ShapeError`.
    """
    if a is None or b is None:
        return None
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
            raise ShapeError(f"{what}: element types differ ({type_name(a.elem_type)} vs "
                             f"{type_name(b.elem_type)})")
        elem = a.elem_type if a.elem_type == b.elem_type else 0
        if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return TensorType(elem, None)
        dims: list[Dim] = []
        for x, y in zip(a.shape, b.shape):
            if dims_equal(x, y):
                dims.append(x)
            else:
                dims.append(op.fresh("l") if fresh and op is not None else None)
        return TensorType(elem, tuple(dims))
    if isinstance(a, SequenceType) and isinstance(b, SequenceType):
        return SequenceType(join_types(a.elem, b.elem, what, fresh, op))
    if isinstance(a, OptionalType) and isinstance(b, OptionalType):
        return OptionalType(join_types(a.elem, b.elem, what, fresh, op))
    if a == b:
        return a
    raise ShapeError(f"{what}: {format_type(a)} and {format_type(b)} cannot be joined")


@register("If")
def _if(op: NodeInference) -> None:
    then_g, else_g = op.attr("then_branch"), op.attr("else_branch")
    if not isinstance(then_g, Graph) or not isinstance(else_g, Graph):
        op.fail("needs then_branch and else_branch graphs")
    ctx = op.ctx
    taken_then = ctx.condition_of(op.node)
    if taken_then is not None and ctx.live is not None:
        _if_taken(op, then_g if taken_then else else_g)
        return
    t_then = ctx.infer_subgraph(then_g, [], f"then_branch of {op.label}")
    t_else = ctx.infer_subgraph(else_g, [], f"else_branch of {op.label}")
    if len(t_then) != len(t_else) or len(t_then) != op.n_outputs:
        op.fail(f"branches have {len(t_then)} and {len(t_else)} outputs for {op.n_outputs} node outputs")
    taken = None if taken_then is None else t_then if taken_then else t_else
    for i, (a, b) in enumerate(zip(t_then, t_else)):
        t = taken[i] if taken is not None else join_types(a, b, f"{op.label} output {i}")
        op.set_type(i, t)
        o_then, o_else = then_g.outputs[i], else_g.outputs[i]
        ra, rb = ctx.alias_root(o_then), ctx.alias_root(o_else)
        aliased_a, aliased_b = ra is not o_then, rb is not o_else
        if aliased_a and aliased_b and ra is not rb:
            op.fail(f"output {i} aliases {ra.name!r} in then_branch but {rb.name!r} in else_branch")
        declared = op.output(i).alias_of not in (None, "") or any(
            al.output_index == i for al in op.node.output_alias)
        if aliased_a != aliased_b and declared:
            op.fail(f"output {i} is declared as an alias but only one branch resolves it to storage "
                    f"({(ra if aliased_a else rb).name!r})")
        if aliased_a and aliased_b:
            ctx.add_alias(op.output(i), ra, f"branches of {op.label}")


def _if_taken(op: NodeInference, branch: Graph) -> None:
    """A speculation's ``If`` with a known condition: only the branch that runs is inferred
    (an error in the other one would never happen)."""
    ctx = op.ctx
    types = ctx.infer_subgraph(branch, [], f"{branch.name or 'branch'} of {op.label}")
    if len(types) != op.n_outputs:
        op.fail(f"the branch that runs has {len(types)} outputs for {op.n_outputs} node outputs")
    for i, t in enumerate(types):
        op.set_type(i, t)
        o = branch.outputs[i]
        root = ctx.alias_root(o)
        if root is not o:
            ctx.add_alias(op.output(i), root, f"branch of {op.label}")


def _carried(op: NodeInference, body: Graph, bound: Sequence[Type], init: Sequence[Type],
             out_offset: int) -> list[Type]:
    """State types valid for every iteration: a trial inference finds changing dimensions."""
    if not init:
        return []
    trial = op.ctx.scratch()
    outs = trial.infer_subgraph(body, list(bound), f"trial body of {op.label}")
    return [a if b is not None and isinstance(a, OptionalType) != isinstance(b, OptionalType) else
            join_types(a, b, f"{op.label} carried value {k}", fresh=True, op=op)
            for k, (a, b) in enumerate(zip(init, outs[out_offset:out_offset + len(init)]))]


@register("Loop")
def _loop(op: NodeInference) -> None:
    body = op.attr("body")
    if not isinstance(body, Graph):
        op.fail("needs a body graph")
    n_state = op.n_inputs - 2
    if len(body.inputs) != n_state + 2:
        op.fail(f"body takes {len(body.inputs)} inputs for {n_state} carried values")
    scalar_i64, scalar_bool = TensorType(TensorProto.INT64, ()), TensorType(TensorProto.BOOL, ())
    init = [op.type(2 + k) for k in range(n_state)]
    carried = _carried(op, body, [scalar_i64, scalar_bool, *init], init, 1)
    outs = op.ctx.infer_subgraph(body, [scalar_i64, scalar_bool, *carried], f"body of {op.label}")
    for k in range(n_state):
        op.set_type(k, _final_state(init[k], op.ctx.type_of(body.inputs[2 + k]), outs[1 + k],
                                    f"{op.label} carried value {k}"))
    trip = op.ints(0) if op.has(0) and not op.has(1) else None
    count: Dim = trip[0] if trip is not None and len(trip) == 1 else None
    for j, t in enumerate(outs[1 + n_state:]):
        if isinstance(t, TensorType):
            op.set(n_state + j, t.elem_type, None if t.shape is None else [count, *t.shape])


def _innermost_shape_known(t: Type) -> bool:
    while isinstance(t, (SequenceType, OptionalType)):
        t = t.elem
    return isinstance(t, TensorType) and t.shape is not None


def _final_state(init: Type, body_in: Type, body_out: Type, what: str) -> Type:
    """The type of a carried value after the loop: what the body's input (bound to a type
    valid for the initial value and every iteration, refined by its declaration) and its
    output have in common; the body's output alone when the initial value is an optional
    (an absent initial value) or has no known shape (as an empty sequence)."""
    if body_out is not None and (isinstance(init, OptionalType) != isinstance(body_out, OptionalType)
                                 or not _innermost_shape_known(init)):
        return body_out
    return join_types(body_in if body_in is not None else init, body_out, what)


def _scan_axes(op: NodeInference, name: str, n: int) -> list[int]:
    axes = op.ints_attr(name, [0] * n)
    if len(axes) != n:
        op.fail(f"{name} has {len(axes)} entries for {n} scan values")
    return axes


@register("Scan")
def _scan(op: NodeInference) -> None:
    body = op.attr("body")
    if not isinstance(body, Graph):
        op.fail("needs a body graph")
    m = op.int_attr("num_scan_inputs")
    if m is None:
        op.fail("needs num_scan_inputs")
    if op.version < 9:
        _scan8(op, body, m)
        return
    if not 0 <= m <= op.n_inputs:
        op.fail(f"num_scan_inputs {m} is out of range for {op.n_inputs} inputs")
    n_state = op.n_inputs - m
    in_axes = _scan_axes(op, "scan_input_axes", m)
    slices: list[Type] = []
    length: Dim = None
    for j in range(m):
        t = op.tensor(n_state + j)
        if t is None or t.shape is None:
            slices.append(None if t is None else TensorType(t.elem_type, None))
            continue
        a = op.norm_axis(in_axes[j], len(t.shape), "scan input axis")
        length = length if length is not None else t.shape[a]
        slices.append(TensorType(t.elem_type, t.shape[:a] + t.shape[a + 1:]))
    init = [op.type(k) for k in range(n_state)]
    carried = _carried(op, body, [*init, *slices], init, 0)
    outs = op.ctx.infer_subgraph(body, [*carried, *slices], f"body of {op.label}")
    for k in range(n_state):
        op.set_type(k, _final_state(init[k], op.ctx.type_of(body.inputs[k]), outs[k], f"{op.label} state {k}"))
    k_out = len(outs) - n_state
    out_axes = _scan_axes(op, "scan_output_axes", k_out)
    for j, out_t in enumerate(outs[n_state:]):
        if isinstance(out_t, TensorType):
            if out_t.shape is None:
                op.set(n_state + j, out_t.elem_type, None)
                continue
            a = op.norm_axis(out_axes[j], len(out_t.shape) + 1, "scan output axis")
            op.set(n_state + j, out_t.elem_type, [*out_t.shape[:a], length, *out_t.shape[a:]])


def _scan8(op: NodeInference, body: Graph, m: int) -> None:
    """Scan-8: input 0 is the optional ``sequence_lens``; every other input and output
    has a leading batch axis, the scan axis is axis 1 of the scan inputs."""
    n_state = op.n_inputs - 1 - m
    if n_state < 0:
        op.fail(f"num_scan_inputs {m} is out of range for {op.n_inputs} inputs")
    batch: Dim = None
    length: Dim = None
    init: list[Type] = []
    for k in range(n_state):
        t = op.tensor(1 + k)
        if t is not None and t.shape:
            batch = batch if batch is not None else t.shape[0]
        init.append(None if t is None else TensorType(t.elem_type, None if not t.shape else t.shape[1:]))
    slices: list[Type] = []
    for j in range(m):
        t = op.tensor(1 + n_state + j)
        if t is None or t.shape is None or len(t.shape) < 2:
            slices.append(None if t is None else TensorType(t.elem_type, None))
            continue
        batch = batch if batch is not None else t.shape[0]
        length = length if length is not None else t.shape[1]
        slices.append(TensorType(t.elem_type, t.shape[2:]))
    carried = _carried(op, body, [*init, *slices], init, 0)
    outs = op.ctx.infer_subgraph(body, [*carried, *slices], f"body of {op.label}")
    for k, out_t in enumerate(outs):
        if isinstance(out_t, TensorType):
            extra = [batch] if k < n_state else [batch, length]
            op.set(k, out_t.elem_type, None if out_t.shape is None else [*extra, *out_t.shape])
