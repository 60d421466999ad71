"""Constant-condition ``If`` inlining: the taken branch replaces the ``If`` node.

An ``If`` whose condition is a known constant (an initializer that is not a
graph input, or a ``Constant`` node's output) always runs the same branch. Its
nodes move into the enclosing graph right before the ``If`` (names and
attributes kept; nested subgraphs move with their nodes and keep reading the
same values), its initializers become initializers of the enclosing graph
(``Constant`` nodes in a function body; equal payloads are merged later by
``dedup_initializers``), outer names stay resolved (a branch reads outer values
by reference, and the enclosing graph sees every value the branch saw), and
the ``If``'s outputs are forwarded to the branch's outputs with
:func:`~onnxforge.passes.rewrites.rename.replace_value`: an ``If`` output that is a graph
output keeps its name (the branch value, or an ``Identity`` of it when the
branch returns an outer value or returns one value twice, takes it over).

Left alone: ``If`` nodes with side effects (rule L13), with aliased outputs,
whose branch has inputs or sparse initializers, and (in a function body) whose
branch holds encoded initializers.

Before / after::

    graph(x) -> y                          graph(x) -> y
      init c = True                          init w = [2.0]
      y = If(c) then { t = Mul(x, w)         t = Mul(x, w)
                       -> t }                y = Neg(t)
                else { -> x }
      ... y = Neg(If output)
"""
from __future__ import annotations

from functools import cache, partial

from onnxforge.graphbuilder.ir.core import (
    Attr,
    AttrType,
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.passes.framework.domains import DEFAULT_DOMAINS
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.rewrites.fold import constant_value
from onnxforge.passes.framework.pass_manager import ALL, Pass, PassResult, register_pass
from onnxforge.passes.rewrites.rename import NameScope, can_replace, erase_node, replace_value
from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = ["IfInlineError", "IfInlinePass", "inline_constant_ifs"]

Container = Graph | Function


class IfInlineError(OnnxforgeError, RuntimeError):
    """An ``If`` output could not be forwarded to its branch's value after the branch moved."""


def _condition(node: Node) -> bool | None:
    """The constant condition of an ``If`` node, or None."""
    if not node.inputs or node.inputs[0] is None:
        return None
    c = constant_value(node.inputs[0])
    if c is None or c.size != 1 or c.dtype.kind not in "biuf":
        return None
    return bool(c.reshape(-1)[0])


def _clone_value(old: Value) -> Value:
    new = Value(old.name, old.type, doc_string=old.doc_string, access=old.access)
    new.metadata.update(old.metadata)
    new.has_value_info = old.has_value_info
    new.extra = old.extra
    return new


class _IfInliner:
    def __init__(self, model: Model, effects: Effects):
        self.model = model
        self.effects = effects
        self.names = cache(partial(NameScope.from_model, model))  # built when first needed
        self.inlined = 0

    def run(self, c: Container) -> None:
        changed = True
        while changed:
            changed = False
            for n in list(c):
                if n.graph is not c:
                    continue
                if n.op_type == "If" and n.domain in DEFAULT_DOMAINS and self.inline(c, n):
                    changed = True
        for n in c:
            for sg in n.subgraphs():
                self.run(sg)

    def _inlinable(self, c: Container, node: Node, branch: Graph) -> bool:
        if self.effects.has_side_effects(node) or node.output_alias:
            return False
        if any(o.alias_of is not None for o in node.outputs):
            return False
        if branch.inputs or branch.sparse_initializers or len(branch.outputs) != len(node.outputs):
            return False
        return not (isinstance(c, Function) and branch.encoded_initializers)

    def inline(self, c: Container, node: Node) -> bool:
        cond = _condition(node)
        if cond is None:
            return False
        branch = node.attr("then_branch" if cond else "else_branch")
        if not isinstance(branch, Graph) or not self._inlinable(c, node, branch):
            return False
        moved: dict[int, Value] = {}
        for old in list(branch.all_initializers()):
            new = _clone_value(old)
            tensor = old.const
            old.replace_all_uses_with(new, outputs=False, aliases=not self.effects.stateless)
            if isinstance(c, Graph):
                c.add_initializer(new, tensor)
            else:
                c.insert_before(node, Node("", "Constant", [], [new], name=self.names().fresh(new.name),
                                           attributes=[Attr("value", AttrType.TENSOR, tensor)]))
            moved[id(old)] = new
        for old_node in list(branch):
            outs = [_clone_value(o) for o in old_node.outputs]
            for o, n in zip(old_node.outputs, outs):
                n.alias_of = o.alias_of
            clone = Node(old_node.domain, old_node.op_type, old_node.inputs, outs, name=old_node.name,
                         attributes=old_node.attributes, overload=old_node.overload,
                         doc_string=old_node.doc_string, output_alias=old_node.output_alias)
            clone.metadata.update(old_node.metadata)
            clone.extra = old_node.extra
            old_node.attributes = {}  # the subgraphs belong to the clone now
            c.insert_before(node, clone)
            for o, n in zip(old_node.outputs, outs):
                o.replace_all_uses_with(n, outputs=False, aliases=not self.effects.stateless)  # a move
                moved[id(o)] = n
            branch.remove(old_node, safe=False)
        listed = [v.name for v in moved.values() if v.has_value_info]
        if listed:
            order = set(c.value_info_order)
            c.value_info_order.extend(name for name in listed if name not in order)
        sources = [moved.get(id(o), o) for o in branch.outputs]
        taken: set[int] = set()
        for k, (y, src) in enumerate(zip(node.outputs, sources)):
            if not y.num_uses() and not c.is_output(y):
                continue
            p = src.producer()
            direct = not c.is_output(y) or (p is not None and p.graph is c and id(src) not in taken
                                            and not c.is_output(src))
            if not direct or not can_replace(y, src):
                base = y.name or f"{node.name or 'If'}_output{k}"
                ident = Node("", "Identity", [src], [Value(self.names().fresh(f"{base}_inlined"), y.type)],
                             name=self.names().fresh(f"{node.name or 'If'}_output{k}"))
                c.insert_before(node, ident)
                src = ident.outputs[0]
            taken.add(id(src))
            if not replace_value(y, src):
                raise IfInlineError(f"{c.path()}: output {y.name!r} of {node!r} cannot be forwarded "
                                    f"to {src.name!r} of the inlined branch (rule L13)")
        branch.outputs.clear()
        for old in list(branch.all_initializers()):
            if not old.num_uses():
                branch.remove_initializer(old)
        erase_node(node)
        self.inlined += 1
        return True


def inline_constant_ifs(model: Model, *, effects: Effects | None = None) -> int:
    """Inline every ``If`` with a constant condition (see the module docstring);
    returns how many were inlined.
    ``effects``: the model's current :class:`~onnxforge.passes.analyses.effects.Effects`
    when the caller has it (default: computed here)."""
    inliner = _IfInliner(model, effect_analysis(model) if effects is None else effects)
    inliner.run(model.graph)
    for fn in model.functions.values():
        inliner.run(fn)
    return inliner.inlined


@register_pass
class IfInlinePass(Pass):
    """Replace each ``If`` with a constant condition by its taken branch.

    Before / after: ``y = If(True) then {t = Neg(x) -> t} else {-> x}`` becomes
    ``y = Neg(x)``.
    """

    name = "if_inlining"
    invalidates = ALL
    preserves = ()
    declares_storage = False
    runs_after = ("inline",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, inline_constant_ifs(model, effects=self.analyses.get("effects", model)) > 0)

