"""What passes declare they invalidate and preserve, and the debug mode that checks it.

Every concrete pass declares ``invalidates`` and ``preserves`` in its class body (a class
that leaves them to ``Pass`` is refused when defined); ``PassManager(debug=True)``
computes every analysis kept across a pass again on the rewritten model and raises
``StaleAnalysisError`` naming the pass and the analysis when the two differ.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import onnxforge as of
from onnxforge.graphbuilder.ir.core import READ_WRITE, Model, Node, Value
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.passes import (
    ALL,
    DEFAULT_PIPELINE,
    Analysis,
    AnalysisManager,
    InvariantError,
    Pass,
    PassError,
    PassManager,
    PassResult,
    RenamePass,
    ShapeInferencePass,
    StaleAnalysisError,
    get_pass,
    list_analyses,
    list_passes,
)
from onnxforge.passes.framework.analysis_manager import AllAnalyses, get_analysis
from onnxforge.passes.framework.pass_manager import _REGISTRY
from onnxforge.passes.rewrites.rename import erase_node, replace_value
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType

from tests.passes.framework.test_manager import _Probe, _small
from tests.passes.helpers import stateful_model

ANALYSES = ("aliases", "effects", "liveness", "memory_plan", "shapes")


def _pass_classes(root: type[Pass] = Pass) -> Iterator[type[Pass]]:
    for sub in root.__subclasses__():
        yield sub
        yield from _pass_classes(sub)


# ----------------------------------------------------------------------------- declarations


def test_the_registered_analyses_are_those_the_declarations_name():
    assert tuple(list_analyses()) == ANALYSES


def test_every_pass_of_the_package_declares_both_in_its_class_body():
    package = [c for c in _pass_classes() if c.__module__.startswith("onnxforge.passes.")]
    assert {c.name for c in package} >= set(DEFAULT_PIPELINE) | {"rename", "shape_inference",
                                                                "alias_analysis", "lift_constants"}
    assert {_REGISTRY[n] for n in list_passes() if _REGISTRY[n].__module__.startswith("onnxforge.")} \
        <= set(package)
    for cls in package:
        for attr in ("invalidates", "preserves"):
            assert attr in vars(cls), (cls.__qualname__, attr)
            assert isinstance(vars(cls)[attr], (tuple, AllAnalyses)), (cls.__qualname__, attr)
        if not isinstance(cls.preserves, AllAnalyses):
            assert set(cls.preserves) <= set(ANALYSES), cls.__qualname__


def test_the_passes_that_preserve_something_and_why():
    # everything else keeps nothing across a change (the effects of a model without
    # storage aside: declares_storage = False)
    kept = {name: _REGISTRY[name].preserves for name in list_passes()
            if _REGISTRY[name].__module__.startswith("onnxforge.") and _REGISTRY[name].preserves != ()}
    assert kept == {
        "alias_analysis": ALL,  # never changes the model
        "shape_inference": ("aliases", "effects", "liveness"),  # writes types only
        "rename": ("aliases", "liveness", "memory_plan"),  # keyed by value objects
    }
    for name in DEFAULT_PIPELINE:
        assert _REGISTRY[name].invalidates is ALL and _REGISTRY[name].preserves == ()


def test_a_pass_without_declarations_is_refused_when_defined():
    with pytest.raises(PassError, match=r"pass class .*Undeclared must declare invalidates and "
                                        r"preserves in its class body") as info:
        class Undeclared(Pass):
            name = "undeclared_for_test"

            def call(self, model: Model) -> PassResult:
                return PassResult(model, False)
    assert "docs/passes.rst" in str(info.value)

    with pytest.raises(PassError, match=r"HalfDeclared must declare preserves in"):
        class HalfDeclared(Pass):
            name = "half_declared_for_test"
            invalidates = ALL

            def call(self, model: Model) -> PassResult:
                return PassResult(model, False)


def test_bases_without_call_and_subclasses_of_declared_passes_are_accepted():
    class Base(Pass):  # no call(): declares nothing, yet
        name = "base_for_test"

    class Concrete(Base):
        name = "concrete_for_test"
        invalidates = ALL
        preserves = ("liveness",)

        def call(self, model: Model) -> PassResult:
            return PassResult(model, False)

    class Derived(Concrete):  # inherits Concrete's declarations
        name = "derived_for_test"

    class Declares:  # a mixin that declares counts too
        invalidates = ()
        preserves = ALL

    class Mixed(Declares, Base):
        name = "mixed_for_test"

        def call(self, model: Model) -> PassResult:
            return PassResult(model, False)

    assert Derived.preserves == ("liveness",) and Mixed.preserves is ALL
    with pytest.raises(PassError, match="must declare invalidates and preserves"):
        class Undeclared(Base):
            name = "undeclared_base_for_test"

            def call(self, model: Model) -> PassResult:
                return PassResult(model, False)


def test_every_analysis_has_a_fingerprint_equal_for_equal_results():
    m = stateful_model()
    for name in ANALYSES:
        analysis = get_analysis(name)
        assert type(analysis).fingerprint is not Analysis.fingerprint, name
        first = analysis.fingerprint(AnalysisManager(m).get(name))
        assert first is not None and first == analysis.fingerprint(AnalysisManager(m).get(name)), name


# ----------------------------------------------------------------------------- false claims


def _retype(model: Model) -> None:
    """Every FLOAT[4] of ``_small`` becomes FLOAT[5] (declared types stay consistent)."""
    for c in [model.graph]:
        for v in [*c.inputs, *(o for n in c for o in n.outputs)]:
            v.type = TensorType(v.type.elem_type, (5,))


def _drop_dead(model: Model) -> None:
    erase_node(next(n for n in model.graph if n.op_type == "Neg"))


def _add_state(model: Model) -> None:
    model.graph.inputs[0].access = READ_WRITE


def _rebuild_write(model: Model) -> None:
    """The in-place CacheUpdate of ``stateful_model`` rebuilt: same inputs, a new output
    value that takes the old one's name and binding."""
    g = model.graph
    old = next(n for n in g if n.op_type == "CacheUpdate")
    new = Node(old.domain, old.op_type, list(old.inputs), [Value("rebuilt", old.outputs[0].type)],
               name="rebuilt", output_alias=list(old.output_alias))
    g.insert_before(old, new)
    assert replace_value(old.outputs[0], new.outputs[0])
    erase_node(old)


class _FalseClaim(Pass):
    """Makes a change that keeps every invariant and claims ``preserves`` for it."""

    name = "false_claim_for_test"
    invalidates = ALL
    preserves = ()

    def __init__(self, change: Callable[[Model], None], preserves: tuple[str, ...]):
        self.change = change
        self.preserves = preserves

    def call(self, model: Model) -> PassResult:
        self.change(model)
        return PassResult(model, True)


# analysis -> (model, a change of what it describes)
FALSE_CLAIMS: dict[str, tuple[Callable[[], Model], Callable[[Model], None]]] = {
    "shapes": (_small, _retype),
    "memory_plan": (_small, _retype),  # same schedule, 20 bytes a value instead of 16
    "liveness": (_small, _drop_dead),
    "aliases": (stateful_model, _rebuild_write),
    "effects": (_small, _add_state),
}


@pytest.mark.parametrize("analysis", ANALYSES)
def test_debug_mode_names_a_pass_that_falsely_preserves_each_analysis(analysis):
    make, change = FALSE_CLAIMS[analysis]
    liar = _FalseClaim(change, preserves=(analysis,))
    pm = PassManager(["topological_sort", _Probe("reads", analysis), liar, "dce"], debug=True)
    with pytest.raises(StaleAnalysisError) as info:
        pm(make())
    err = info.value
    assert isinstance(err, InvariantError) and isinstance(err, PassError)
    assert err.pass_name == "false_claim_for_test" and err.analyses == [analysis]
    assert err.previous == ["topological_sort", "reads"]
    assert [(v.rule, v.path) for v in err.violations] == [("IR-ANALYSIS", f"analyses[{analysis!r}]")]
    assert f"pass 'false_claim_for_test' left stale analyses [{analysis!r}]" in str(err)
    assert f"preserves=({analysis!r},)" in str(err)
    # declared honestly, the same change runs, and the analysis is computed again after it
    after = _Probe("after", analysis)
    PassManager(["topological_sort", _Probe("reads", analysis), _FalseClaim(change, ()), after],
                debug=True)(make())
    # without debug, the claim is trusted: the kept result is served
    before, after = _Probe("before", analysis), _Probe("after", analysis)
    PassManager([before, _FalseClaim(change, (analysis,)), after])(make())
    assert after.seen[0] is before.seen[0]


# ----------------------------------------------------------------------------- true claims


class _ComputeAll(Pass):
    """Computes every registered analysis that the model allows, so that the next pass's
    declarations are checked for all of them."""

    name = "compute_all_analyses_for_test"
    invalidates = ()
    preserves = ALL  # changes nothing

    def call(self, model: Model) -> PassResult:
        for name in list_analyses():
            try:
                self.analyses.get(name, model)
            except (ShapeError, OnnxforgeError):
                pass  # e.g. types an alias class cannot merge: nothing cached to check
        return PassResult(model, False)


def _warmed(passes: list[Pass | str]) -> list[Pass | str]:
    out: list[Pass | str] = []
    for p in passes:
        out += [_ComputeAll(), p]
    return out


def test_rename_keeps_the_results_keyed_by_value_objects():
    m = stateful_model()
    pm = PassManager(_warmed([RenamePass(values={"dead_out": "gone", "Add_out": "sum"},
                                         io={"y": "logits", "cache_out": "next_cache"})]), debug=True)
    pm(m)
    assert pm.records[-1].modified and m.graph.bindings[0][1].name == "next_cache"
    kept = {name for name in ANALYSES if pm.analyses.is_cached(name, m)}
    assert kept == {"aliases", "liveness", "memory_plan"}


def test_shape_inference_keeps_what_reads_no_type():
    m = stateful_model()
    for n in m.graph:
        for o in n.outputs:
            if not o.is_graph_output():
                o.type = None  # value_info dropped
    pm = PassManager(_warmed([ShapeInferencePass()]), debug=True)
    pm(m)
    assert pm.records[-1].modified
    assert {name for name in ANALYSES if pm.analyses.is_cached(name, m)} == {"aliases", "effects",
                                                                            "liveness"}


def test_a_pass_that_reports_no_change_keeps_everything_and_is_checked():
    class Quiet(Pass):
        name = "quiet_for_test"
        invalidates = ()
        preserves = ALL  # claims to change nothing

        def call(self, model: Model) -> PassResult:
            _drop_dead(model)
            return PassResult(model, False)

    # the schedule changed; the types of the values left did not (shapes stay right)
    with pytest.raises(StaleAnalysisError, match=r"left stale analyses \['liveness', 'memory_plan'\]"
                                                 r".*modified=False") as info:
        PassManager([_ComputeAll(), Quiet()], debug=True)(_small())
    assert info.value.pass_name == "quiet_for_test"


# ----------------------------------------------------------------------------- the corpus


def _corpus(wild_models: dict[str, Path], decoder_models: dict[str, Path]) -> Iterator[tuple[str, Model]]:
    """Every corpus model and decoder, and the stateful forms of a decoder (contiguous and
    paged caches), whose effects and aliases are not trivial."""
    for name, path in [*sorted(wild_models.items()),
                       *((k, v) for k, v in sorted(decoder_models.items()) if k != "hf")]:
        yield name, of.load(str(path))
    torch23 = str(decoder_models["torch23"])
    yield "torch23 stateful", of.make_stateful(torch23, max_length=16)
    yield "torch23 paged", of.make_stateful(torch23, max_length=64, cache="paged", page_size=16)


def _run(name: str, pm: PassManager, model: Model) -> None:
    try:
        pm(model)
    except InvariantError as exc:
        pytest.fail(f"{name}: {exc}")


@pytest.mark.slow
def test_the_default_pipeline_keeps_its_declarations_on_the_corpus(wild_models, decoder_models):
    """Every pass of the default pipeline, in debug mode, with every analysis computed before
    it: what it keeps equals a fresh computation, on every model of the corpus."""
    for name, model in _corpus(wild_models, decoder_models):
        pm = PassManager(_warmed([get_pass(n) for n in DEFAULT_PIPELINE]), debug=True)
        _run(name, pm, model)
        assert [r.name for r in pm.records][1::2] == list(DEFAULT_PIPELINE), name


@pytest.mark.slow
def test_the_passes_that_preserve_analyses_keep_them_on_the_corpus(wild_models, decoder_models):
    """``shape_inference`` (types dropped first, so that it writes them all) and ``rename``
    (internal values and outputs), each with every analysis computed before it."""
    for name, model in _corpus(wild_models, decoder_models):
        for v in (o for n in model.graph for o in n.outputs if not o.is_graph_output()):
            v.type = None
        inner = [o.name for n in model.graph for o in n.outputs if o.name and not o.is_graph_output()]
        renames = RenamePass(values={k: f"{k}.renamed" for k in inner[:50]},
                             io={v.name: f"{v.name}.renamed" for v in model.graph.outputs})
        pm = PassManager(_warmed([ShapeInferencePass(), renames]), debug=True)
        _run(name, pm, model)
        assert [r.modified for r in pm.records] == [False, True, False, True], name
