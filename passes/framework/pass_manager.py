"""The pass contract, the pass registry and the pass manager.

A pass is a small class with a registered ``name``; ``call(model)`` rewrites
the model in place and returns :class:`PassResult` saying whether anything
changed. Ordering constraints are data and are checked when a pipeline is
built, never kept in comments:

* ``requires``: passes that must have run earlier in the pipeline, with no pass
  in between that lists them in its ``invalidates``;
* ``runs_after``: if the other pass is in the pipeline, the last run of this
  one comes after every run of the other (clean-up passes go last);
* ``runs_before``: if the other pass is in the pipeline, the first run of this
  one comes before every run of the other (set-up passes go first).

Analyses (:mod:`.analysis_manager`) are typed results the manager caches. A pass reads
them through its ``analyses`` attribute (``self.analyses.get("liveness")``),
which the manager sets before ``call``; a pass run alone gets a fresh
:class:`~onnxforge.passes.framework.analysis_manager.AnalysisManager` for the duration of its call.
Every concrete pass declares, in its class body (its own or a base's other than
:class:`Pass`), what a change by it breaks and what it leaves valid: ``invalidates``
(:data:`~onnxforge.passes.framework.analysis_manager.ALL`, or the analyses it breaks) and
``preserves`` (the analyses that stay valid, ``()`` for none; :data:`ALL` for a pass that
never changes the model). A class that leaves either to :class:`Pass` is refused when
it is defined. After a pass reports ``modified=True`` the manager drops every cached
analysis the pass ``invalidates`` except those it ``preserves``, so a stale result is
never read. ``invalidates`` may also name passes: a pass that ``requires`` one of them
must not come after it with nothing in between (checked when the pipeline is built;
:data:`ALL` names analyses only, never breaks a ``requires``).

::

    @register_pass
    class MyPass(Pass):
        name = "my_pass"
        invalidates = ALL   # it moves nodes: every analysis changes...
        preserves = ()      # ...and none stays valid
        runs_after = ("topological_sort",)

        def call(self, model):
            ...
            return PassResult(model, modified)

    pm = PassManager(["topological_sort", "cse", "dce"], debug=True)
    result = pm(model)              # PassResult(model, modified)
    print(pm.report())              # per-pass timings and node counts (all graphs)
    live = pm.analyses.get("liveness")   # results still valid for the rewritten model

With ``debug=True`` the manager checks the model's invariants (the static rules
of ``proto_ext.verify.check`` plus the IR's SSA, def-use and topological order)
before the first pass and after every pass, and raises
:class:`~onnxforge.passes.framework.invariants.InvariantError` naming the pass that broke
them and the passes that ran before it. It also checks the declarations: every
analysis result still cached after a pass (what the pass ``preserves``, or everything
when it reports no change) is computed again on the rewritten model and compared by
its analysis's :meth:`~onnxforge.passes.framework.analysis_manager.Analysis.fingerprint`;
one that differs raises :class:`StaleAnalysisError` naming the pass and the analyses.
"""
from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from onnxforge.proto_ext.errors import OnnxforgeError, Violation
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.passes.framework.analysis_manager import ALL, AllAnalyses, AnalysisManager
from onnxforge.passes.framework.invariants import InvariantError, check_invariants, containers

__all__ = [
    "ALL",
    "Pass",
    "PassError",
    "PassManager",
    "PassOrderError",
    "PassRecord",
    "PassResult",
    "StaleAnalysisError",
    "check_int_option",
    "check_order",
    "collector_paused",
    "get_pass",
    "list_passes",
    "register_pass",
]


class PassError(OnnxforgeError, ValueError):
    """A pass cannot run (unknown name, bad arguments, broken contract)."""


class PassOrderError(PassError):
    """A pipeline violates a pass's ``requires`` / ``runs_after`` / ``runs_before``."""


class StaleAnalysisError(InvariantError, PassError):
    """Debug mode: an analysis result kept across a pass differs from a fresh computation
    on the model the pass left. The pass declared valid what it changed (``preserves``,
    ``invalidates`` or ``declares_storage = False``), or changed the model and reported
    ``modified=False``.

    ``pass_name`` and ``previous`` as for :class:`InvariantError`; ``analyses``: the names
    of the stale results, each also one violation (rule ``IR-ANALYSIS``)."""

    RULE = "IR-ANALYSIS"

    def __init__(self, pass_name: str, previous: list[str], analyses: Sequence[str], declared: str):
        self.analyses = sorted(analyses)
        super().__init__(pass_name, previous, [
            Violation(self.RULE, f"analyses[{a!r}]", f"the result kept across pass {pass_name!r} "
                      "differs from a fresh computation on the rewritten model")
            for a in self.analyses])
        before = ", ".join(self.previous) if self.previous else "none"
        self.args = (f"pass {pass_name!r} left stale analyses {self.analyses} (passes run before "
                     f"it: [{before}]): each differs from a fresh computation on the rewritten "
                     f"model, but the pass {declared}",)


@dataclass(frozen=True, slots=True)
class PassResult:
    """What a pass returns: the (same, rewritten in place) model and whether it changed."""

    model: Model
    modified: bool


@dataclass(frozen=True, slots=True)
class PassRecord:
    """One pass execution, for reports and progress callbacks."""

    name: str
    iteration: int
    seconds: float
    modified: bool
    nodes_before: int
    nodes_after: int


_DECLARATIONS = ("invalidates", "preserves")
"""What every concrete pass declares in a class body (:meth:`Pass.__init_subclass__`)."""


class Pass:
    """Base class of passes. Subclasses set ``name`` and implement :meth:`call`.

    ``invalidates``: the analyses (and passes, for ``requires``) a change by this
    pass breaks, :data:`ALL` for every analysis; ``preserves``: analyses that stay
    valid whatever ``invalidates`` says (``()`` for none). A concrete subclass (one
    that defines :meth:`call`) must declare both in a class body of its own or of a
    base other than this one: :class:`PassError` when it is defined otherwise, since
    a claim is the pass's to make (debug mode checks it). ``analyses``: the analysis
    manager to read from during :meth:`call` (set by the pass manager, or fresh for a
    lone run).

    ``declares_storage``: the pass may give a model storage it did not declare before
    (an ``alias_of``, an ``output_alias``, a READ_WRITE input or a persistent binding).
    A pass that never does (False) leaves a model that declares no storage without any,
    so the ``effects`` analysis of such a model (every value owns its storage, no node
    has effects) stays valid across it, whatever else it changes. True by default; the
    pass manager's debug mode checks the claim (a kept result must match a fresh one).
    """

    name: str = ""
    requires: tuple[str, ...] = ()
    invalidates: tuple[str, ...] | AllAnalyses = ALL
    preserves: tuple[str, ...] | AllAnalyses = ()
    runs_after: tuple[str, ...] = ()
    runs_before: tuple[str, ...] = ()
    analyses: AnalysisManager | None = None
    declares_storage: bool = True

    @classmethod
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.call is Pass.call:
            return  # no call(): a base of other passes, which declare for themselves
        missing = [a for a in _DECLARATIONS if not any(a in vars(k) for k in cls.__mro__ if k is not Pass)]
        if missing:
            raise PassError(
                f"pass class {cls.__qualname__} must declare {' and '.join(missing)} in its class "
                f"body: `invalidates` is what a change by the pass breaks (ALL, or the analyses "
                f"it breaks), `preserves` what stays valid (() for nothing, ALL for a pass that "
                f"never changes the model); see docs/passes.rst")

    def call(self, model: Model) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, model: Model) -> PassResult:
        if not isinstance(model, Model):
            raise PassError(f"pass {self.name!r} expects an onnxforge IR Model, got {type(model).__name__}")
        given = self.analyses
        if given is None or given.model is not model:
            self.analyses = AnalysisManager(model)  # a lone run: fresh results
        try:
            result = self.call(model)
        finally:
            self.analyses = given
        if not isinstance(result, PassResult):
            raise PassError(f"pass {self.name!r} returned {type(result).__name__}, not a PassResult")
        if result.model is not model:
            raise PassError(f"pass {self.name!r} must rewrite the model in place and return it")
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


P = TypeVar("P", bound=type[Pass])
_REGISTRY: dict[str, type[Pass]] = {}


def register_pass(cls: P) -> P:
    """Class decorator: register a pass class under its ``name``."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise PassError(f"{cls.__name__} needs a non-empty `name` to be registered")
    other = _REGISTRY.get(name)
    if other is not None and other is not cls and other.__qualname__ != cls.__qualname__:
        raise PassError(f"pass name {name!r} is already registered by {other.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def get_pass(name: str, **options: Any) -> Pass:
    """A new instance of the registered pass ``name`` (``options`` go to its constructor)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        known = ", ".join(sorted(_REGISTRY))
        raise PassError(f"no pass named {name!r}; registered passes: {known}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise PassError(f"pass {name!r}: bad options {sorted(options)}: {exc}") from None


def check_int_option(owner: str, option: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``; else :class:`PassError` naming ``owner``'s
    ``option`` (for pass constructors, whose options users give)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PassError(f"{owner}: {option} must be an int >= {minimum}, got {value!r}")
    return value


def list_passes() -> list[str]:
    """Names of every registered pass, sorted."""
    return sorted(_REGISTRY)


def _node_count(model: Model) -> int:
    """Nodes in every graph of ``model``: the main graph, control-flow bodies, local
    functions and their bodies."""
    return sum(len(c) for c in containers(model))


def _named(declared: tuple[str, ...] | AllAnalyses) -> tuple[str, ...]:
    """The names an ``invalidates`` lists explicitly (:data:`ALL` names only analyses)."""
    return () if isinstance(declared, AllAnalyses) else tuple(declared)


def check_order(passes: Sequence[Pass]) -> None:
    """Raise :class:`PassOrderError` if ``passes`` violates an ordering constraint."""
    names = [p.name for p in passes]
    for i, p in enumerate(passes):
        for req in p.requires:
            ok = False
            for j in range(i - 1, -1, -1):
                if names[j] == req:
                    ok = True
                    break
                if req in _named(passes[j].invalidates):
                    raise PassOrderError(
                        f"pass {p.name!r} (position {i}) requires {req!r}, but {names[j]!r} "
                        f"(position {j}) invalidates it in between; pipeline: {names}")
            if not ok:
                raise PassOrderError(f"pass {p.name!r} (position {i}) requires {req!r} to run "
                                     f"before it; pipeline: {names}")
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, name in enumerate(names):
        first.setdefault(name, i)
        last[name] = i
    for i, p in enumerate(passes):
        if first[p.name] != i:
            continue
        for other in p.runs_after:
            if other in last and last[other] > last[p.name]:
                raise PassOrderError(f"pass {p.name!r} must run after {other!r}: its last run "
                                     f"(position {last[p.name]}) precedes {other!r} at position "
                                     f"{last[other]}; pipeline: {names}")
        for other in p.runs_before:
            if other in first and first[other] < first[p.name]:
                raise PassOrderError(f"pass {p.name!r} must run before {other!r}: its first run "
                                     f"(position {first[p.name]}) follows {other!r} at position "
                                     f"{first[other]}; pipeline: {names}")


@contextlib.contextmanager
def collector_paused():
    """Pause the cyclic garbage collector while passes run.

    Nodes and values reference each other, so a large model is a large object
    graph; the collections that allocations would trigger during a pass scan it
    again and again and find little to free. Garbage made by the passes is
    collected once the collector runs again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class PassManager:
    """Runs a pipeline of passes; checks their order when built.

    ``passes``: pass instances or registered names. ``debug``: check invariants
    before the first pass and after each one. ``progress``: called with a
    :class:`PassRecord` after each pass. ``fixed_point``: repeat the whole
    pipeline until no pass changes the model (at most ``max_iterations`` rounds;
    :class:`PassError` if it still changes then). ``analyses`` caches analysis
    results for the passes (:class:`~onnxforge.passes.framework.analysis_manager.AnalysisManager`);
    each run starts from an empty cache, since the model may have changed outside
    the manager since the previous run; after a run it holds the results still
    valid for the rewritten model.
    """

    def __init__(self, passes: Iterable[Pass | str], *, debug: bool = False,
                 progress: Callable[[PassRecord], None] | None = None,
                 fixed_point: bool = False, max_iterations: int = 8):
        if isinstance(passes, str):
            raise PassError(f"passes must be a sequence of pass names or Pass objects, not the "
                            f"string {passes!r} (write [{passes!r}] for one pass)")
        self.passes: list[Pass] = [get_pass(p) if isinstance(p, str) else p for p in passes]
        for p in self.passes:
            if not isinstance(p, Pass):
                raise PassError(f"{p!r} is not a Pass or a registered pass name")
        check_int_option("PassManager", "max_iterations", max_iterations, 1)
        check_order(self.passes)
        self.debug = debug
        self.progress = progress
        self.fixed_point = fixed_point
        self.max_iterations = max_iterations
        self.records: list[PassRecord] = []
        # in debug mode kept analyses are compared with fresh ones: nothing is reused there
        self.analyses = AnalysisManager(keep_dropped=not debug)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    @staticmethod
    def _check(model: Model, pass_name: str, previous: list[str]) -> None:
        violations = check_invariants(model)
        if violations:
            raise InvariantError(pass_name, previous, violations)

    def _preserved(self, p: Pass, model: Model) -> tuple[str, ...] | AllAnalyses:
        """What ``p``'s change leaves valid: its ``preserves``, and the ``effects`` of a model
        that declares no storage when ``p`` never declares any."""
        kept = p.preserves
        if p.declares_storage or isinstance(kept, AllAnalyses) or "effects" in kept:
            return kept
        fx = self.analyses.cached("effects", model)
        return (*kept, "effects") if fx is not None and fx.stateless else kept

    def _check_analyses(self, model: Model, p: Pass, modified: bool, previous: list[str]) -> None:
        """Every result still cached after ``p`` against a fresh one (debug mode)."""
        stale = self.analyses.stale(model)
        if stale:
            raise StaleAnalysisError(
                p.name, previous, stale,
                f"reported modified={modified} with invalidates={p.invalidates!r}, "
                f"preserves={p.preserves!r}, declares_storage={p.declares_storage!r}")

    def __call__(self, model: Model) -> PassResult:
        with collector_paused():
            return self._run(model)

    def _run(self, model: Model) -> PassResult:
        self.records = []
        self.analyses.clear()  # earlier results (and models) are not kept past a new run
        self.analyses.bind(model)
        if self.debug:
            self._check(model, InvariantError.INPUT_MODEL, [])
        ran: list[str] = []
        any_change = False
        rounds = self.max_iterations if self.fixed_point else 1
        count = _node_count(model)  # only passes change the model: one pass's after is the next's before
        for iteration in range(rounds):
            changed = False
            for p in self.passes:
                before = count
                t0 = time.perf_counter()
                own = p.analyses
                p.analyses = self.analyses
                try:
                    result = p(model)
                finally:
                    p.analyses = own
                seconds = time.perf_counter() - t0
                if result.modified:
                    self.analyses.invalidate(p.invalidates, preserves=self._preserved(p, model), model=model)
                if result.modified:
                    count = _node_count(model)
                record = PassRecord(p.name, iteration, seconds, result.modified, before, count)
                self.records.append(record)
                if self.debug:
                    self._check(model, p.name, ran)
                    self._check_analyses(model, p, result.modified, ran)
                ran.append(p.name)
                changed = changed or result.modified
                if self.progress is not None:
                    self.progress(record)
            any_change = any_change or changed
            if not changed:
                break
        else:  # every round changed the model
            if self.fixed_point:
                raise PassError(f"pipeline {self.names} still changes the model after "
                                f"{self.max_iterations} rounds (no fixed point)")
        return PassResult(model, any_change)

    def timings(self) -> dict[str, float]:
        """Total seconds per pass name over the last run."""
        out: dict[str, float] = {}
        for r in self.records:
            out[r.name] = out.get(r.name, 0.0) + r.seconds
        return out

    def report(self) -> str:
        """A text table of the last run: pass, round, seconds, nodes before -> after."""
        lines = [f"{'pass':<24} {'round':>5} {'seconds':>9} {'nodes':>17} changed"]
        for r in self.records:
            lines.append(f"{r.name:<24} {r.iteration:>5} {r.seconds:>9.4f} "
                         f"{r.nodes_before:>8}->{r.nodes_after:<8} {'yes' if r.modified else 'no'}")
        total = sum(r.seconds for r in self.records)
        lines.append(f"{'total':<24} {'':>5} {total:>9.4f}")
        return "\n".join(lines)
