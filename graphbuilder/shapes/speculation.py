"""Speculative shape inference: what some assumed types imply, where an error need not be one.

A pass that asks whether some types would make the model fail (the ``If`` branch
whose types break a later node: :mod:`onnxforge.passes.analyses.failing_branches`)
infers on a copy of its context, :meth:`ShapesContext.speculation
<onnxforge.graphbuilder.shapes.context.ShapesContext.speculation>`, made by
:func:`speculate`. The copy never writes the IR, replaces the declared types the
assumption contradicts instead of failing (value_info never makes a run fail),
and knows through its ``live`` nodes which nodes run whenever their graph runs:

* an ``If`` whose condition is known infers only the branch that runs;
* a rule's error in a node that need not run, in a body that need not run (a
  ``Loop``, a ``Scan``, an ``If`` whose condition is unknown), in a local
  function's body, or symbolic arithmetic that cannot be carried out, raises
  :class:`Undecided` instead of :class:`~onnxforge.graphbuilder.shapes.symtensor.ShapeError`
  (:func:`check_failure`): no run need fail for it;
* the nodes of ``pinned`` take given output contents and the nodes of ``kept``
  (which read nothing the assumption changes) keep their results instead of being
  inferred (:func:`assumed_types`).

Before / after::

    s = ctx.speculation(live, pinned={if_node: [then_branch_contents]})
    s.infer_for([later_value])   # ShapeError in a live node: these contents fail every run
                                 # Undecided: nothing is known
"""
from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from onnxforge.graphbuilder.ir.core import Node
from onnxforge.graphbuilder.shapes.replay import node_label
from onnxforge.proto_ext.types import Type

if TYPE_CHECKING:
    from onnxforge.graphbuilder.shapes.context import ShapesContext
    from onnxforge.graphbuilder.shapes.symtensor import SymTensor

__all__ = ["Undecided", "assumed_types", "check_failure", "speculate"]


class Undecided(Exception):
    """Raised in a speculative inference (``ShapesContext.live``) by an error that need
    not happen at run time: in a node no output depends on, in a loop body, in a branch of
    an ``If`` whose condition is unknown, in a local function's body, or symbolic
    arithmetic that cannot be carried out."""


def speculate(ctx: ShapesContext, live: Container[Node], pinned: dict[Node, list[SymTensor]] | None,
              kept: Container[Node] | None) -> ShapesContext:
    """A :meth:`~onnxforge.graphbuilder.shapes.context.ShapesContext.scratch` copy of
    ``ctx`` that infers what some assumed types imply (see the module docstring)."""
    c = ctx.scratch()
    c.live, c.strict, c._pinned, c._kept = live, False, pinned, kept
    c._storage = getattr(ctx, "_storage", None)  # a speculation runs on the IR unchanged
    c._ordered = ctx._was_ordered
    return c


def assumed_types(ctx: ShapesContext, node: Node) -> list[Type] | None:
    """In a speculation, the output types of a node of ``kept`` (as they are) or of
    ``pinned`` (its given contents, recorded); None when ``node`` is to be inferred."""
    if ctx._kept is not None and node in ctx._kept:
        return [ctx.type_of(o) for o in node.outputs]
    if ctx._pinned is not None and node in ctx._pinned:
        for o, content in zip(node.outputs, ctx._pinned[node]):
            ctx.set_value(o, content, "pinned")
        return [ctx.type_of(o) for o in node.outputs]
    return None


def check_failure(ctx: ShapesContext, node: Node, reason: str) -> None:
    """In a speculation, raise :class:`Undecided` when the error ``node`` met need not
    happen at run time (see ``ShapesContext.live``)."""
    live = ctx.live
    if live is None:
        return
    if node not in live:
        raise Undecided(f"{_label(node)} need not run: {reason}")
    if node.attributes and node.subgraphs():
        if node.op_type != "If" or ctx.condition_of(node) is None:
            raise Undecided(f"the body of {_label(node)} need not run: {reason}")


def _label(node: Node) -> str:
    return node_label(node.domain, node.op_type, node.name)
