"""Plan builder: compiles an IR graph once into a flat :class:`~onnxforge.kernels_cy.runtime.plan.Program`.

The plan is the graph's schedule (producers first, and every reader of a written
version of storage before its in-place writer, rule L13), one kernel object per
node configured at plan time, integer value slots instead of names, a release
list per step and constants decoded once into read-only arrays. Constant
subexpressions (and ``Shape`` of statically shaped values) are evaluated here.

Before / after (a 3-node graph; slots 0 = x, 1 = w (constant), 2.. node outputs)::

    y = MatMul(x, w); z = Relu(y); out = Add(z, x)
    step 0: MatMul  in (0, 1) out (2,)  release ()
    step 1: Relu    in (2,)   out (3,)  release (2,)
    step 2: Add     in (3, 0) out (4,)  release (3,)

Subgraphs (If / Loop / Scan) compile to sub-plans whose extra inputs are the
outer values they capture; the owning step receives those values as inputs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from onnxforge.graphbuilder.ir.core import AttrType, Function, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.scope_order import CycleError, captured_values
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.kernels_cy.errors import BackendError, UnsupportedOperatorError
from onnxforge.kernels_cy.matmul.fused import Fused, SwiGLU, find_swiglu
from onnxforge.kernels_cy.ops.base import REGISTRY, Kernel, NodeSpec, norm_domain
from onnxforge.kernels_cy.runtime.plan import Program
from onnxforge.kernels_cy.runtime.runctx import RunContext
from onnxforge.kernels_cy.ops.shape_ops import FreshCopy
from onnxforge.passes.analyses.liveness import may_view
from onnxforge.passes.rewrites.topo import schedule as topo_schedule
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType

__all__ = ["CompiledGraph", "Compiler", "compile_model", "schedule"]

Body = Graph | Function
FOLD_LIMIT = 1 << 16  # elements: larger constant subexpressions are computed at run time


@dataclass(slots=True, eq=False)
class CompiledGraph:
    """A compiled body: feed it ``inputs + captured`` values in order."""

    program: Program
    inputs: list[Value]
    outputs: list[Value]
    captured: list[Value]
    fallback_nodes: list[str] = field(default_factory=list)
    num_nodes: int = 0
    steps: list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    constants: dict[str, int] = field(default_factory=dict)  # value name -> slot of a constant


def _reads(node: Node) -> list[Value]:
    """Values ``node`` reads: its inputs, then outer values its subgraphs capture."""
    out = [v for v in node.inputs if v is not None]
    for sg in node.subgraphs():
        out.extend(captured_values(sg))
    return out


def schedule(body: Body, storage: Storage | None = None) -> list[Node]:
    """Topological order of ``body``: data dependencies first, and every reader of a
    version of storage before the node writing that version in place (L13); stable.
    The order is the topological sort's (``passes.topo.schedule``), computed without
    reordering the model. ``storage`` (the model's ``Effects``) names the in-place
    writers; without it, a storage of ``body`` alone is built."""
    if storage is None:
        storage = _body_storage(body)
    try:
        return topo_schedule(body, storage)
    except CycleError as exc:
        raise BackendError(f"no schedule puts every reader of a version before its writer: {exc}") from None


def _body_storage(body: Body) -> Storage:
    """A :class:`Storage` of ``body`` alone (when the caller gives no model effects)."""
    if isinstance(body, Graph):
        return Storage(Model(body))
    return Storage(Model(Graph("g"), functions={body.id: body}))


def _shares_input0(node: Node, kern: Kernel) -> bool:
    """Whether ``node``'s outputs may share its first input's storage in this backend.

    Views are liveness's (:func:`~onnxforge.passes.analyses.liveness.may_view`, the one
    definition; a view kernel whose output it calls fresh copies, see :class:`FreshCopy`).
    On top of them the planner keeps in input 0's storage group the outputs of kernels
    that allocate nothing themselves and run no body: a local-function call (its
    sub-plan may hand back an argument's storage) and an in-place cache writer."""
    if not node.inputs or node.inputs[0] is None or node.subgraphs():
        return False
    return may_view(node) if kern.views_input else not kern.fresh


def _attr_values(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, a in node.attributes.items():
        v = a.value
        if a.type == AttrType.TENSOR and isinstance(v, Tensor):
            v = v.numpy()
        elif a.type == AttrType.TENSORS:
            v = [t.numpy() for t in v]
        elif a.type == AttrType.STRING and isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif a.type == AttrType.STRINGS:
            v = [s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in v]
        out[name] = v
    return out


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def _node_path(node: Node) -> str:
    g = node.graph
    base = g.path() if g is not None else "graph"
    return f"{base}.node({node.name!r})" if node.name else f"{base}.node[{node.op_type}]"


class Compiler:
    """Compiles the graphs of one model; shared by the sub-plans of its subgraphs."""

    def __init__(self, model: Model, *, fallback: str | None = None,
                 effects: Any = None, fold: bool = True, threads: int = 1, fuse: bool = True):
        if fallback not in (None, "reference"):
            raise BackendError(f"fallback must be None or 'reference', got {fallback!r}")
        self.model = model
        self.fallback = fallback
        self.fold = fold
        self.fuse = fuse  # plan-time fusions (kernels_cy.matmul.fused)
        self.threads = threads
        self.effects = effects
        self.fallback_nodes: list[str] = []
        self._decoded: dict[int, np.ndarray] = {}

    # -- checks ------------------------------------------------------------------
    def unclaimed(self) -> list[tuple[str, str]]:
        """Every node (also in subgraphs) whose operator no kernel claims."""
        from onnxforge.kernels_cy import ops  # noqa: F401  (registers the kernels)

        bad = []
        for g in self.model.graph.all_graphs():
            for n in g:
                if (norm_domain(n.domain), n.op_type) not in REGISTRY and self._function(n) is None:
                    dom = f"{n.domain}::" if n.domain else ""
                    bad.append((_node_path(n), f"{dom}{n.op_type}"))
        return bad

    def _function(self, n: Node) -> Function | None:
        return self.model.functions.get((n.domain, n.op_type, n.overload))

    def opset(self, domain: str) -> int:
        d = norm_domain(domain)
        for k, v in self.model.opset_imports.items():
            if norm_domain(k) == d:
                return v
        return 1 if d else 23

    # -- constants ---------------------------------------------------------------
    def constant(self, v: Value) -> np.ndarray:
        got = self._decoded.get(id(v))
        if got is not None:
            return got
        if isinstance(v.const, EncodedTensor):
            from onnxforge.proto_ext.catalogue import Catalogue
            from onnxforge.proto_ext.codecs.decode import decode_encoded

            header = v.const.header
            if v.const.external is not None and len(header.raw_data):
                header = replace(header, external_data=(), data_location=None)
            arr = decode_encoded(header, Catalogue(self.model.struct_types), model_dir=self.model.model_dir,
                                 path=f"{v.graph.path() if v.graph else 'graph'}.encoded_initializer[{v.name!r}]")
            if isinstance(arr, dict):
                raise BackendError(f"encoded initializer {v.name!r} decodes to a struct of fields; "
                                   "the backend needs a tensor")
        else:
            arr = v.const.numpy()
        if isinstance(arr, np.ndarray) and not arr.flags.aligned:
            # inline raw_data sits at any byte offset of the file; numpy's BLAS and take
            # paths need aligned elements (else they copy or loop per element): one copy here
            arr = np.array(arr, copy=True)
        arr = _readonly(arr)
        self._decoded[id(v)] = arr
        return arr

    # -- compile -----------------------------------------------------------------
    def compile(self, body: Body, captured: Sequence[Value] = ()) -> CompiledGraph:
        """Compile ``body`` into a program fed ``body.inputs + captured``."""
        slot: dict[int, int] = {}
        template: list[Any] = []
        owner: list[Value] = []  # slot -> the value it holds

        def new_slot(v: Value, value: Any = None) -> int:
            s = len(template)
            slot[id(v)] = s
            template.append(value)
            owner.append(v)
            return s

        input_slots = [new_slot(v) for v in list(body.inputs) + list(captured)]
        consts: dict[int, np.ndarray] = {}
        const_names: dict[str, int] = {}
        if isinstance(body, Graph):
            for v in body.all_initializers():
                if id(v) in slot:  # an initializer that is also an input: the feed overrides it
                    continue
                arr = self.constant(v)
                consts[id(v)] = arr
                new_slot(v, arr)
        order = schedule(body, self.effects)
        steps: list[tuple[Kernel, list[int], list[int], str, list[bool], Node]] = []
        group: dict[int, int] = {}
        view_src: dict[int, int] = {}  # output slot -> the input slot whose storage it may share
        fused = self._fusions(order, consts)
        for k, node in enumerate(order):
            f = fused.get(id(node))
            if f is not None:  # a fused group runs as one step where its first node was
                if f.nodes[0] is node:
                    ins = [slot[id(v)] for v in f.inputs]
                    outs = [new_slot(f.output)]
                    group[outs[0]] = outs[0]
                    steps.append((self._fused_kernel(f, consts), ins, outs,
                                  f"node {f.nodes[-1].name!r} (fused {f.kind})", [True], node))
                continue
            spec = self._spec(node, consts)
            kern = self._kernel(node, spec)
            if kern.views_input and not may_view(node):
                kern = FreshCopy(kern)  # liveness gives this output a buffer of its own
            if self._foldable(node, spec, kern, consts):
                vals = self._fold(node, kern, consts)
                if vals is not None:
                    for v, a in zip(node.outputs, vals):
                        arr = _readonly(a)
                        consts[id(v)] = arr
                        const_names[v.name] = new_slot(v, arr)
                    continue
            ins = [slot[id(v)] if v is not None else -1 for v in node.inputs]
            for sg_v in _reads(node)[len([v for v in node.inputs if v is not None]):]:
                ins.append(slot[id(sg_v)])
            outs = [new_slot(v) for v in node.outputs]
            for v, s in zip(node.outputs, outs):
                group[s] = s
            shares = _shares_input0(node, kern)
            if shares and not node.output_alias and node.outputs:
                src = slot[id(node.inputs[0])]
                if src in group:
                    for s in outs:
                        group[s] = group[src]
            if shares and not any(a.kind == 1 for a in node.output_alias) and ins[0] >= 0:
                for s in outs:
                    view_src[s] = ins[0]
            aliased = {a.output_index for a in node.output_alias if a.kind == 1}
            fresh = [bool(kern.fresh) and j not in aliased for j in range(len(outs))]
            steps.append((kern, ins, outs, _label(node), fresh, node))
        steps = self._materialize_views(body, steps, [slot[id(v)] for v in body.outputs], view_src, owner)
        # release lists and storage frees from last uses
        n_steps = len(steps)
        slot_last: dict[int, int] = {}
        for k, (_, ins, outs, _, _, _) in enumerate(steps):
            for s in ins:
                if s >= 0:
                    slot_last[s] = k
            for s in outs:
                slot_last.setdefault(s, k)
        out_slots = [slot[id(v)] for v in body.outputs]
        for s in out_slots:
            slot_last[s] = n_steps
        releases = self._shared_releases(body, order, steps, slot, group)
        if releases is None:  # local last uses (the schedule differs from the body's order)
            releases = [[] for _ in steps]
            for s, k in slot_last.items():
                if k < n_steps and s in group:
                    releases[k].append(s)
        group_end: dict[int, int] = {}
        for s, g in group.items():
            group_end[g] = max(group_end.get(g, -1), slot_last.get(s, n_steps))
        frees: list[list[int]] = [[] for _ in steps]
        for g, k in group_end.items():
            if k < n_steps:
                frees[k].append(g)
        n_slots = len(template)
        group_list = [group.get(s, s) for s in range(n_slots)]
        program = Program(n_slots, template, [st[0].run for st in steps], [st[3] for st in steps],
                          [st[1] for st in steps], [st[2] for st in steps], releases, frees,
                          [st[4] for st in steps], group_list, input_slots, out_slots,
                          [bool(getattr(st[0], "uses_context", False)) for st in steps],
                          [bool(getattr(st[0], "views_input", False)) and not any(st[4]) for st in steps])
        return CompiledGraph(program, list(body.inputs), list(body.outputs), list(captured),
                             num_nodes=len(order),
                             steps=[(st[3], tuple(st[1]), tuple(st[2]), tuple(r)) for st, r in zip(steps, releases)],
                             constants=const_names)

    def _shared_releases(self, body: Body, order: list[Node], steps: list, slot: dict[int, int],
                         group: dict[int, int]) -> list[list[int]] | None:
        """Release lists from ``passes.liveness`` when its schedule (the body's order) is
        the plan's; None otherwise. A folded node's releases move to the next step."""
        try:
            from onnxforge.passes.analyses.liveness import liveness
        except ImportError:
            return None
        if len(order) != len(body) or any(a is not b for a, b in zip(order, body)):
            return None
        try:
            live = liveness(body, self.effects)
        except (OnnxforgeError, ValueError):
            return None
        by_node = {id(n): rel for n, rel in zip(live.order, live.release_after)}
        step_of = {id(st[5]): k for k, st in enumerate(steps) if not isinstance(st[0], _MaterializeType())}
        out: list[list[int]] = [[] for _ in steps]
        carry: list[int] = []
        for n in order:
            rel = [slot[id(v)] for v in by_node.get(id(n), ()) if id(v) in slot and slot[id(v)] in group]
            k = step_of.get(id(n))
            if k is None:
                carry.extend(rel)
                continue
            out[k].extend(carry + rel)
            carry = []
        if carry and steps:
            out[-1].extend(carry)
        keep = {slot[id(v)] for v in body.outputs if id(v) in slot}
        return [sorted(set(r) - keep) for r in out]

    def _materialize_views(self, body: Body, steps: list, out_slots: list[int], view_src: dict[int, int],
                           owner: list[Value]) -> list:
        """Before each in-place write, copy the views of the written storage that are
        read after the write (L13: they name the version before it).

        Which storage a slot names is the one alias resolution
        (:class:`~onnxforge.graphbuilder.ir.storage.Storage`) with one relation of the
        backend on top: ``view_src``, the outputs that may share their first input's
        storage (liveness's views, and the outputs of kernels that allocate nothing)."""
        from onnxforge.kernels_cy.ops.shape_ops import Materialize

        writes: dict[int, list[int]] = {}
        for k, (kern, ins, outs, _, _, node) in enumerate(steps):
            for a in node.output_alias:
                if a.kind == 1 and a.output_index < len(outs) and a.input_index < len(ins) \
                        and ins[a.input_index] >= 0:
                    writes.setdefault(k, []).append(ins[a.input_index])
        if not writes:
            return steps
        storage = self.effects if self.effects is not None else _body_storage(body)
        slot_of = {id(v): s for s, v in enumerate(owner)}
        roots: dict[int, int | tuple[str, int]] = {}

        def root(s: int) -> int | tuple[str, int]:
            got = roots.get(s)
            if got is None:
                r = s
                seen = {s}
                while True:
                    while r in view_src:
                        r = view_src[r]
                    owned = storage.root(owner[r])
                    nxt = slot_of.get(id(owned))
                    if nxt is None:  # storage of a value this body does not hold
                        got = ("value", id(owned))
                        break
                    if nxt in seen or nxt == r:
                        got = r
                        break
                    seen.add(nxt)
                    r = nxt
                roots[s] = got
            return got

        last: dict[int, int] = {}
        born: dict[int, int] = {}
        for k, (_, ins, outs, _, _, _) in enumerate(steps):
            for s in ins:
                last[s] = k
            for s in outs:
                born[s] = k
        for s in out_slots:
            last[s] = len(steps)
        out: list = []
        for k, st in enumerate(steps):
            for w in writes.get(k, ()):
                r = root(w)
                for v in sorted(view_src):
                    if born[v] < k < last.get(v, -1) and root(v) == r:
                        kern = Materialize()
                        out.append((kern, [v, w if isinstance(r, tuple) else r], [v],
                                    f"materialize {v} before {st[3]}", [False], st[5]))
            out.append(st)
        return out

    def _fusions(self, order: list[Node], consts: dict[int, np.ndarray]) -> dict[int, Fused]:
        """Node id -> its fused group (:mod:`~onnxforge.kernels_cy.matmul.fused`), for every node of one."""
        if not self.fuse:
            return {}
        out: dict[int, Fused] = {}
        for f in find_swiglu(order, set(consts)):
            for n in f.nodes:
                out[id(n)] = f
        return out

    def _fused_kernel(self, f: Fused, consts: dict[int, np.ndarray]) -> Kernel:
        mg, mu, sig, ma, my = f.members  # the SwiGLU roles (kernels_cy.matmul.fused)
        calls = [self._kernel(n, self._spec(n, consts)).run for n in f.members]
        return SwiGLU(self._spec(my, consts), calls, a_first=my.inputs[0] is ma.outputs[0],
                      g_first=ma.inputs[0] is mg.outputs[0], threads=self.threads)

    def _spec(self, node: Node, consts: dict[int, np.ndarray]) -> NodeSpec:
        ins = node.inputs
        sub_cache: dict[str, CompiledGraph] = {}

        def subgraph(name: str) -> CompiledGraph:
            if name not in sub_cache:
                a = node.attributes.get(name)
                if a is None or a.type != AttrType.GRAPH:
                    raise BackendError(f"{_node_path(node)}: no graph attribute {name!r}")
                sub_cache[name] = self.compile(a.value, captured_values(a.value))
            return sub_cache[name]

        return NodeSpec(
            op_type=node.op_type, domain=norm_domain(node.domain), name=node.name, path=_node_path(node),
            opset=self.opset(node.domain), attrs=_attr_values(node), n_inputs=len(ins),
            n_outputs=len(node.outputs),
            consts={i: consts[id(v)] for i, v in enumerate(ins) if v is not None and id(v) in consts},
            input_types=[v.type if v is not None else None for v in ins],
            output_types=[v.type for v in node.outputs],
            present=tuple(v is not None and v.name != "" for v in ins),
            outputs_used=tuple(v.num_uses() > 0 or v.is_graph_output() for v in node.outputs),
            subgraph=subgraph,
            aliases=tuple((a.output_index, a.input_index) for a in node.output_alias if a.kind == 1),
            threads=self.threads)

    def _kernel(self, node: Node, spec: NodeSpec) -> Kernel:
        from onnxforge.kernels_cy import ops  # noqa: F401  (registers the kernels)

        factory = REGISTRY.get((spec.domain, node.op_type))
        if factory is not None:
            return factory(spec)
        fn = self._function(node)
        if fn is not None:
            from onnxforge.kernels_cy.ops.control import FunctionCall

            return FunctionCall(spec, self, node, fn)
        if self.fallback == "reference":
            from onnxforge.kernels_cy.ops.fallback import ReferenceKernel

            self.fallback_nodes.append(spec.path)
            return ReferenceKernel(spec, node, self.model)
        raise UnsupportedOperatorError([(spec.path, f"{node.domain + '::' if node.domain else ''}{node.op_type}")])

    # -- constant folding at plan time ----------------------------------------------
    def _side_effects(self, node: Node) -> bool:
        if self.effects is not None:
            return bool(self.effects.has_side_effects(node))
        return any(o.alias_of is not None for o in node.outputs)

    def _foldable(self, node: Node, spec: NodeSpec, kern: Kernel, consts: dict[int, np.ndarray]) -> bool:
        if not self.fold or node.subgraphs() or node.output_alias or self._side_effects(node):
            return False
        if getattr(kern, "nondeterministic", False) or getattr(kern, "is_fallback", False):
            return False
        if node.op_type == "Shape" and spec.domain == "" and node.inputs and node.inputs[0] is not None:
            return _static_shape(node.inputs[0]) is not None or id(node.inputs[0]) in consts
        present = [v for v in node.inputs if v is not None]
        if not all(id(v) in consts for v in present):
            return False
        return all(consts[id(v)].size <= FOLD_LIMIT for v in present)

    def _fold(self, node: Node, kern: Kernel, consts: dict[int, np.ndarray]) -> list[np.ndarray] | None:
        args: list[np.ndarray | None] = []
        for v in node.inputs:
            if v is None:
                args.append(None)
            elif id(v) in consts:
                args.append(consts[id(v)])
            else:  # Shape of a statically shaped value
                args.append(np.broadcast_to(np.zeros((), np.uint8), _static_shape(v)))  # no allocation
        try:
            res = kern.run(RunContext(), *args) if getattr(kern, "uses_context", False) else kern.run(*args)
        except (OnnxforgeError, ArithmeticError, LookupError, ValueError, TypeError, AttributeError):
            return None  # not folded: the run raises the kernel's error, naming the node
        vals = [np.asarray(a) for a in (list(res) if len(node.outputs) > 1 else [res])]
        if any(a.dtype == object or a.size > FOLD_LIMIT for a in vals):
            return None
        return [np.array(a, copy=True) for a in vals]


def _MaterializeType() -> type:
    from onnxforge.kernels_cy.ops.shape_ops import Materialize

    return Materialize


def _static_shape(v: Value) -> tuple[int, ...] | None:
    t = v.type
    if isinstance(t, TensorType) and t.shape is not None and all(isinstance(d, int) for d in t.shape):
        return tuple(t.shape)
    return None


def _label(node: Node) -> str:
    dom = f"{node.domain}::" if node.domain else ""
    return f"node {node.name!r} ({dom}{node.op_type})"


def compile_model(model: Model, *, fallback: str | None = None,
                  effects: Any = None, threads: int = 1) -> tuple[CompiledGraph, Compiler]:
    """Compile ``model``'s main graph; raises UnsupportedOperatorError listing every unclaimed node."""
    comp = Compiler(model, fallback=fallback, effects=effects, threads=threads)
    if fallback is None:
        bad = comp.unclaimed()
        if bad:
            raise UnsupportedOperatorError(bad)
    cg = comp.compile(model.graph)
    cg.fallback_nodes = list(comp.fallback_nodes)
    return cg, comp

