"""Analyses as typed, cached results: the :class:`Analysis` contract and the
:class:`AnalysisManager` that caches and invalidates them.

An analysis is a small class with a registered ``name`` whose
``compute(model, analyses)`` returns a typed result (a frozen dataclass, a
:class:`~onnxforge.graphbuilder.shapes.context.ShapesContext`...) and never changes the
model. An :class:`AnalysisManager` computes each analysis at most once per
model and returns the same object until it is invalidated::

    am = AnalysisManager(model)
    live = am.get("liveness")            # or am.get(LivenessAnalysis)
    assert am.get("liveness") is live    # cached
    am.invalidate()                      # the model changed: drop every result
    assert am.get("liveness") is not live

An analysis may read others through the manager it is given
(``analyses.get("effects")``); the manager records that dependency, and dropping
a result drops every result computed from it.

The :class:`~onnxforge.passes.framework.pass_manager.PassManager` owns one manager. Before a
pass runs it sets the pass's ``analyses`` attribute to it (a pass run alone gets
a fresh manager for the duration of its call), and after a pass that reports
``modified=True`` it drops what the pass ``invalidates`` (:data:`ALL` by
default) except what it ``preserves``. Cached results are valid as long as the
model changes only through passes run by that manager; a manager bound to a
model that was edited some other way must be invalidated by whoever edited it.
A pass that reads an analysis and then changes the model must not read the
same result again in that call (or invalidate it first). In debug mode the pass
manager checks every result it keeps against a fresh computation
(:meth:`AnalysisManager.stale`, comparing each analysis's :meth:`Analysis.fingerprint`)
and raises :class:`~onnxforge.passes.framework.pass_manager.StaleAnalysisError` naming a
pass that left one stale and the analysis.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from onnxforge.graphbuilder.ir.core import Model
from onnxforge.proto_ext.errors import OnnxforgeError

__all__ = [
    "ALL",
    "AllAnalyses",
    "Analysis",
    "AnalysisError",
    "AnalysisManager",
    "analysis_name",
    "get_analysis",
    "list_analyses",
    "register_analysis",
]

R = TypeVar("R")


class AnalysisError(OnnxforgeError, ValueError):
    """An analysis cannot be found, registered or computed as asked."""


class AllAnalyses:
    """The type of :data:`ALL`: "every analysis", in ``invalidates`` / ``preserves``
    (tested with ``isinstance``; :data:`ALL` is its one instance)."""

    __slots__ = ()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __repr__(self) -> str:
        return "ALL"


ALL = AllAnalyses()
"""Every analysis: the default ``invalidates`` of a pass."""


class Analysis(Generic[R]):
    """Base class of analyses. Subclasses set ``name`` and implement :meth:`compute`.

    ``compute`` reads the model (and other analyses through ``analyses``) and
    returns a typed result; it must not change the model.
    """

    name: str = ""

    def compute(self, model: Model, analyses: AnalysisManager) -> R:  # pragma: no cover - abstract
        raise NotImplementedError

    def fingerprint(self, result: R) -> Hashable | None:
        """A value equal for equal results, IR objects compared by identity (``id``):
        debug mode compares the fingerprint of a result kept across a pass with that of
        a fresh computation on the rewritten model (:meth:`AnalysisManager.stale`). Each
        analysis defines its own, over everything its result answers; every analysis of
        the package does. None (this default): a kept result cannot be checked."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


A = TypeVar("A", bound=type[Analysis])
_REGISTRY: dict[str, type[Analysis]] = {}


def register_analysis(cls: A) -> A:
    """Class decorator: register an analysis class under its ``name``."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise AnalysisError(f"{cls.__name__} needs a non-empty `name` to be registered")
    other = _REGISTRY.get(name)
    if other is not None and other is not cls and other.__qualname__ != cls.__qualname__:
        raise AnalysisError(f"analysis name {name!r} is already registered by {other.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def get_analysis(name: str) -> Analysis[Any]:
    """A new instance of the registered analysis ``name``."""
    cls = _REGISTRY.get(name)
    if cls is None:
        known = ", ".join(sorted(_REGISTRY))
        raise AnalysisError(f"no analysis named {name!r}; registered analyses: {known}")
    return cls()


def list_analyses() -> list[str]:
    """Names of every registered analysis, sorted."""
    return sorted(_REGISTRY)


def analysis_name(key: str | type[Analysis] | Analysis[Any]) -> str:
    """The registered name of an analysis given by name, class or instance."""
    if isinstance(key, str):
        name = key
    elif isinstance(key, Analysis) or (isinstance(key, type) and issubclass(key, Analysis)):
        name = key.name
    else:
        raise AnalysisError(f"an analysis is named by a string or an Analysis class, got {key!r}")
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise AnalysisError(f"no analysis named {name!r}; registered analyses: {known}")
    return name


_NONE = object()


@dataclass(slots=True, eq=False)
class _Entry:
    """The cached results of one model and who computed what from what."""

    model: Model
    results: dict[str, Any] = field(default_factory=dict)
    dependents: dict[str, set[str]] = field(default_factory=dict)  # name -> results read from it
    computed: dict[str, int] = field(default_factory=dict)  # name -> times computed
    dropped: dict[str, Any] = field(default_factory=dict)  # name -> last result invalidated


class AnalysisManager:
    """Caches analysis results per model; see the module docstring.

    ``model`` binds the manager to a model, the default of every ``model=``
    argument below (:meth:`bind` changes it).
    """

    def __init__(self, model: Model | None = None, *, keep_dropped: bool = True):
        self._entries: dict[int, _Entry] = {}
        self.keep_dropped = keep_dropped
        """Keep the last invalidated result of each analysis for :meth:`dropped` (an
        analysis may reuse the parts of it that it checks are still valid)."""
        self._active: list[tuple[int, str]] = []  # results being computed (dependency edges)
        self.model: Model | None = None
        if model is not None:
            self.bind(model)

    def bind(self, model: Model) -> None:
        """Make ``model`` the default model of this manager."""
        if not isinstance(model, Model):
            raise AnalysisError(f"analyses run on an onnxforge IR Model, got {type(model).__name__}")
        self.model = model

    def _entry(self, model: Model | None) -> _Entry:
        m = self.model if model is None else model
        if m is None:
            raise AnalysisError("this AnalysisManager is bound to no model: pass model= or bind() one")
        e = self._entries.get(id(m))
        if e is None or e.model is not m:
            e = _Entry(m)
            self._entries[id(m)] = e
        return e

    @overload
    def get(self, key: type[Analysis[R]] | Analysis[R], model: Model | None = None) -> R: ...

    @overload
    def get(self, key: str, model: Model | None = None) -> Any: ...

    def get(self, key: str | type[Analysis[Any]] | Analysis[Any], model: Model | None = None) -> Any:
        """The result of analysis ``key`` (name, class or instance) on ``model``: cached, or
        computed now and cached."""
        name = analysis_name(key)
        e = self._entry(model)
        if self._active:  # a result being computed reads this one: record the edge
            owner_model, owner = self._active[-1]
            if owner_model == id(e.model):
                e.dependents.setdefault(name, set()).add(owner)
        if name in e.results:
            return e.results[name]
        if any(m == id(e.model) and n == name for m, n in self._active):
            chain = " -> ".join(n for _, n in self._active)
            raise AnalysisError(f"analysis {name!r} depends on itself: {chain} -> {name}")
        analysis = key if isinstance(key, Analysis) else get_analysis(name)
        self._active.append((id(e.model), name))
        try:
            result = analysis.compute(e.model, self)
        finally:
            self._active.pop()
        e.results[name] = result
        e.computed[name] = e.computed.get(name, 0) + 1
        return result

    def cached(self, key: str | type[Analysis[Any]] | Analysis[Any], model: Model | None = None) -> Any:
        """The cached result of ``key`` on ``model``, or None (never computes)."""
        return self._entry(model).results.get(analysis_name(key))

    def is_cached(self, key: str | type[Analysis[Any]] | Analysis[Any], model: Model | None = None) -> bool:
        return analysis_name(key) in self._entry(model).results

    def times_computed(self, key: str | type[Analysis[Any]] | Analysis[Any],
                       model: Model | None = None) -> int:
        """How many times ``key`` was computed for ``model`` by this manager."""
        return self._entry(model).computed.get(analysis_name(key), 0)

    def invalidate(self, names: Iterable[str] | AllAnalyses = ALL, *,
                   preserves: Iterable[str] | AllAnalyses = (), model: Model | None = None) -> list[str]:
        """Drop the results named by ``names`` (default: all) except ``preserves``, and every
        result computed from a dropped one (unless preserved). Returns the dropped names."""
        e = self._entry(model)
        if isinstance(preserves, AllAnalyses):
            return []
        keep = set(preserves)
        work = list(e.results) if isinstance(names, AllAnalyses) else list(names)
        dropped: list[str] = []
        seen: set[str] = set()
        while work:
            name = work.pop()
            if name in seen or name in keep:
                continue
            seen.add(name)
            result = e.results.pop(name, _NONE)
            if result is not _NONE:
                dropped.append(name)
                if self.keep_dropped:
                    e.dropped[name] = result
            work.extend(e.dependents.pop(name, ()))
        return dropped

    def dropped(self, key: str | type[Analysis[Any]] | Analysis[Any], model: Model | None = None) -> Any:
        """The result of ``key`` on ``model`` that the last invalidation dropped, or None.

        It describes the model as it was: an analysis may reuse only what it checks
        still holds (the ``shapes`` analysis replays the inference of nodes whose
        inputs and attributes are unchanged)."""
        return self._entry(model).dropped.get(analysis_name(key))

    def stale(self, model: Model | None = None) -> list[str]:
        """Cached results of ``model`` that differ from a fresh computation (by their
        analysis's :meth:`~Analysis.fingerprint`; results without one are not checked)."""
        e = self._entry(model)
        fresh = AnalysisManager(e.model, keep_dropped=False)
        out: list[str] = []
        for name, result in list(e.results.items()):
            analysis = get_analysis(name)
            kept = analysis.fingerprint(result)
            if kept is not None and kept != analysis.fingerprint(fresh.get(name)):
                out.append(name)
        return sorted(out)

    def clear(self) -> None:
        """Forget every model and result."""
        self._entries.clear()

    def __repr__(self) -> str:
        e = self._entries.get(id(self.model)) if self.model is not None else None
        names = sorted(e.results) if e is not None else []
        return f"AnalysisManager(cached={names})"
