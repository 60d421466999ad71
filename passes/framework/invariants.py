"""Invariants every pass keeps, and the side-effect analysis passes consult.

Two families of checks run between passes in debug mode
(:class:`~onnxforge.passes.framework.pass_manager.PassManager` with ``debug=True``):

* the static rules of ``RULES.md`` (catalogue, bindings, aliases...), through
  ``proto_ext.verify.check`` on the IR's verification view;
* the IR's own structure, checked here in one O(N) walk: SSA (every value has
  one definition), def-use (every use is recorded, every recorded use is real),
  topological order with lexical scoping (a subgraph sees outer values defined
  before its owner node), bindings and aliases that name live values.

Side effects ("may this node be removed, merged or moved?") are answered by
:func:`onnxforge.passes.analyses.effects.effect_analysis`, from the one alias
resolution. The walks the passes share live here: :func:`containers` (every
graph and function body), :func:`owner_in`, :func:`called_functions` (the local
functions some code calls), and :func:`is_nondeterministic`.

Example::

    violations = check_invariants(model)      # [] when the model is sound
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from onnxforge.proto_ext.errors import VerificationError, Violation
from onnxforge.graphbuilder.ir.core import (
    Function,
    Graph,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.tensors import EncodedTensor

__all__ = [
    "NONDETERMINISTIC_OPS",
    "InvariantError",
    "called_functions",
    "check_invariants",
    "containers",
    "ir_violations",
    "is_nondeterministic",
    "owner_in",
]

Container = Graph | Function

# Operators whose result is not a function of their inputs (never merged, never folded).
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Multinomial", "Bernoulli",
})


class InvariantError(VerificationError):
    """A pass left the model in a state that breaks an invariant.

    ``pass_name`` is the pass that ran last, ``previous`` the passes that ran
    before it (in order) and ``violations`` what is broken.
    """

    INPUT_MODEL = "<input model>"
    """``pass_name`` when the model breaks the invariants before any pass ran."""

    def __init__(self, pass_name: str, previous: list[str], violations: list[Violation]):
        super().__init__(violations)
        self.pass_name = pass_name
        self.previous = list(previous)
        body = "\n  ".join(str(v) for v in self.violations[:20])
        more = "" if len(self.violations) <= 20 else f"\n  ... {len(self.violations) - 20} more"
        if pass_name == self.INPUT_MODEL:
            where = "the input model breaks invariants before any pass ran"
        else:
            before = ", ".join(self.previous) if self.previous else "none"
            where = (f"invariants broken after running pass {pass_name!r} "
                     f"(passes run before it: [{before}])")
        self.args = (f"{where}:\n  {body}{more}",)

    def __str__(self) -> str:
        return str(self.args[0])


def is_nondeterministic(node: Node) -> bool:
    """True for random operators and for Dropout in training mode."""
    op = node.op_type
    if op in NONDETERMINISTIC_OPS or op.startswith("Random"):
        return True
    if op == "Dropout":
        ins = node.inputs
        if len(ins) > 2 and ins[2] is not None:
            mode = ins[2].const
            if mode is None or isinstance(mode, EncodedTensor):
                return True
            try:
                return bool(mode.numpy().reshape(-1)[0])
            except (ValueError, IndexError, TypeError):
                return True
        return node.attr("is_test", 1) == 0
    return False


def containers(model: Model) -> Iterator[Container]:
    """The main graph, every subgraph and every local function body (with subgraphs),
    depth first, as they are when asked (a snapshot)."""
    out: list[Container] = list(model.graph.all_graphs())
    for fn in model.functions.values():
        out.append(fn)
        out.extend(fn.all_graphs())
    return iter(out)


def called_functions(model: Model, roots: Iterable[Container]) -> set[tuple[str, str, str]]:
    """Ids of the local functions that ``roots`` call, directly or through the functions
    they call (subgraphs included)."""
    reached: set[tuple[str, str, str]] = set()
    work = list(roots)
    while work:
        c = work.pop()
        graphs = [c, *c.all_graphs()] if isinstance(c, Function) else list(c.all_graphs())
        for g in graphs:
            for n in g:
                key = (n.domain, n.op_type, n.overload)
                fn = model.functions.get(key)
                if fn is not None and key not in reached:
                    reached.add(key)
                    work.append(fn)
    return reached


def owner_in(node: Node, container: Container) -> Node | None:
    """The node of ``container`` that is ``node`` or owns (transitively) the subgraph holding it."""
    n: Node | None = node
    while n is not None:
        g = n.graph
        if g is container:
            return n
        if not isinstance(g, Graph) or g.parent is None:
            return None
        n = g.parent
    return None


# ----------------------------------------------------------------------------- IR checks


class _Checker:
    def __init__(self, model: Model, topological: bool):
        self.model = model
        self.topological = topological
        self.out: list[Violation] = []
        self.defined: dict[int, Value] = {}  # every value defined anywhere, by id
        self.live: set[int] = set()  # id of every container in the model
        self.nodes: set[int] = set()

    def add(self, rule: str, path: str, message: str) -> None:
        self.out.append(Violation(rule, path, message))

    # pass 1: definitions (SSA) ----------------------------------------------------
    def define(self, v: Value, path: str, what: str) -> None:
        if id(v) in self.defined:
            self.add("IR-SSA", path, f"value {v.name!r} is defined twice ({what})")
        self.defined[id(v)] = v

    def collect(self, c: Container) -> None:
        self.live.add(id(c))
        path = c.path()
        for v in c.inputs:
            if v.producer() is not None:
                self.add("IR-SSA", path, f"input {v.name!r} has a producer")
            self.define(v, path, "input")
        if isinstance(c, Graph):
            inputs = {id(v) for v in c.inputs}
            for table, encoded in ((c.initializers, False), (c.encoded_initializers, True)):
                for name, v in table.items():
                    p = f"{path}.initializer[{name!r}]"
                    if v.name != name:
                        self.add("IR-INIT", p, f"initializer table key {name!r} names value {v.name!r}")
                    if v.const is None or isinstance(v.const, EncodedTensor) != encoded:
                        self.add("IR-INIT", p, "initializer value holds no matching payload")
                    if v.producer() is not None:
                        self.add("IR-SSA", p, "initializer has a producer")
                    if id(v) not in inputs:
                        self.define(v, p, "initializer")
        count = 0
        for n in c:
            count += 1
            self.nodes.add(id(n))
            if n.graph is not c:
                self.add("IR-SSA", path, f"{n!r} is listed in a graph it does not belong to")
            for i, o in enumerate(n.outputs):
                if o.producer() is not n or o.index != i:
                    self.add("IR-SSA", f"{path}.node({n.name!r})",
                             f"output {i} {o.name!r} does not record this node as its producer")
                self.define(o, f"{path}.node({n.name!r})", "node output")
            for sg in n.subgraphs():
                if sg.parent is not n:
                    self.add("IR-SSA", sg.path(), f"subgraph parent is not {n!r}")
        if count != len(c):
            self.add("IR-SSA", path, f"node list holds {count} nodes but counts {len(c)}")

    # pass 2: uses, order and references ---------------------------------------------
    def check_uses(self) -> None:
        for v in self.defined.values():
            for n, i in v._uses:
                if id(n) not in self.nodes:
                    self.add("IR-DEFUSE", f"value {v.name!r}",
                             f"recorded use by {n!r} (input {i}), a node no longer in the model")
                elif i >= len(n.inputs) or n.inputs[i] is not v:
                    self.add("IR-DEFUSE", f"value {v.name!r}",
                             f"recorded use by {n!r} input {i}, which holds another value")

    def walk(self, c: Container, visible: set[int]) -> None:
        path = c.path()
        added: list[int] = []

        def see(v: Value) -> None:
            visible.add(id(v))
            added.append(id(v))

        for v in c.inputs:
            see(v)
        if isinstance(c, Graph):
            for v in c.all_initializers():
                see(v)
        for n in c:
            npath = f"{path}.node({n.name!r})"
            for i, v in enumerate(n.inputs):
                if v is None:
                    continue
                if (n, i) not in v._uses:
                    self.add("IR-DEFUSE", npath, f"input {i} {v.name!r}: use not recorded by the value")
                if id(v) not in self.defined:
                    self.add("IR-DEFUSE", npath, f"input {i} {v.name!r} is not defined in the model")
                elif self.topological and id(v) not in visible:
                    self.add("IR-ORDER", npath, f"input {i} {v.name!r} is used before its definition "
                                                "or outside its scope")
            for a in n.output_alias:
                if not (0 <= a.output_index < len(n.outputs) and 0 <= a.input_index < len(n.inputs)
                        and n.inputs[a.input_index] is not None):
                    self.add("IR-ALIAS", npath, f"output_alias {a} names a missing port")
            for sg in n.subgraphs():
                self.walk(sg, visible)
            for o in n.outputs:
                see(o)
                self.check_alias_of(o, npath)
        for k, o in enumerate(c.outputs):
            if id(o) not in self.defined:
                self.add("IR-DEFUSE", f"{path}.output[{k}]", f"output {o.name!r} is not defined")
            elif self.topological and id(o) not in visible:
                self.add("IR-ORDER", f"{path}.output[{k}]", f"output {o.name!r} is not in scope")
            self.check_alias_of(o, f"{path}.output[{k}]")
        if isinstance(c, Graph):
            ins = {id(v) for v in c.inputs}
            outs = {id(v) for v in c.outputs}
            for k, (bound, o) in enumerate(c.bindings):
                if id(bound) not in ins:
                    self.add("IR-BIND", f"{path}.persistent_bindings[{k}]",
                             f"input end {bound.name!r} is not a graph input")
                if id(o) not in outs:
                    self.add("IR-BIND", f"{path}.persistent_bindings[{k}]",
                             f"output end {o.name!r} is not a graph output")
        for key in added:
            visible.discard(key)

    def check_alias_of(self, v: Value, path: str) -> None:
        a = v.alias_of
        if isinstance(a, Value) and id(a) not in self.defined:
            self.add("IR-ALIAS", path, f"{v.name!r}.alias_of names {a.name!r}, which is not in the model")

    def run(self) -> list[Violation]:
        all_c = list(containers(self.model))
        for c in all_c:
            self.collect(c)
        self.check_uses()
        self.walk(self.model.graph, set())
        for fn in self.model.functions.values():
            self.walk(fn, set())
        return self.out


def ir_violations(model: Model, *, topological: bool = True) -> list[Violation]:
    """SSA, def-use, order, binding and alias-reference violations of the IR itself."""
    return _Checker(model, topological).run()


def check_invariants(model: Model, *, rules: bool = True, topological: bool = True) -> list[Violation]:
    """IR invariants plus (with ``rules``) the static rules of ``proto_ext.verify.check``."""
    out = ir_violations(model, topological=topological)
    if rules:
        from onnxforge.proto_ext.verify import check

        out.extend(check(model))
    return out
