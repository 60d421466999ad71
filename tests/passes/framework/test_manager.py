"""Pass contract, registry, ordering constraints, debug-mode invariant checks, timings,
analysis caching and invalidation."""
from __future__ import annotations

import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Node
from onnxforge.passes import (
    ALL,
    AnalysisError,
    AnalysisManager,
    InvariantError,
    Pass,
    PassError,
    PassManager,
    PassOrderError,
    PassRecord,
    PassResult,
    get_pass,
    list_passes,
    register_pass,
)
from onnxforge.passes.rewrites.dce import DeadCodeEliminationPass
from onnxforge.passes.analyses.liveness import LivenessAnalysis
from onnxforge.passes.framework.pipeline import default_pass_manager

from tests.passes.helpers import FLOAT, stateful_model

BOOL = TensorProto.BOOL


def _small() -> Model:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.op.Neg(x)
    g.output(g.op.Relu(x), "y")
    return g.to_model()


class _BreakDefUse(Pass):
    """Leaves a node reading a value that no longer exists in the model."""

    name = "break_def_use"
    invalidates = ALL
    preserves = ()

    def call(self, model: Model) -> PassResult:
        g = model.graph
        relu = next(n for n in g if n.op_type == "Relu")
        orphan = Node("", "Abs", [g.inputs[0]], ["orphan"])  # never added to the graph
        relu.set_input(0, orphan.outputs[0])
        return PassResult(model, True)


class _Noop(Pass):
    name = "noop_for_test"
    invalidates = ()
    preserves = ALL  # changes nothing

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _NeedsSort(Pass):
    name = "needs_sort_for_test"
    invalidates = ()
    preserves = ALL  # changes nothing
    requires = ("topological_sort",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _BreaksSort(Pass):
    name = "breaks_sort_for_test"
    invalidates = ("topological_sort",)
    preserves = ()

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _ReturnsOther(Pass):
    name = "returns_other_for_test"
    invalidates = ()
    preserves = ALL  # changes nothing

    def call(self, model: Model) -> PassResult:
        return PassResult(_small(), False)


def test_registry_lists_and_instantiates_every_pass():
    names = list_passes()
    for expected in ("dce", "cse", "dedup_initializers", "identity_elimination", "topological_sort",
                     "constant_folding", "lift_constants", "inline", "rename", "rewrite"):
        assert expected in names
    assert isinstance(get_pass("dce"), DeadCodeEliminationPass)
    assert get_pass("dce", remove_functions=False).remove_functions is False
    with pytest.raises(PassError, match="no pass named 'nope'"):
        get_pass("nope")
    with pytest.raises(PassError, match="bad options"):
        get_pass("dce", unknown_option=1)


def test_register_pass_rejects_a_second_class_under_the_same_name():
    @register_pass
    class First(Pass):
        name = "dup_name_for_test"

    class Second(Pass):
        name = "dup_name_for_test"

    Second.__qualname__ = "Other.Second"
    with pytest.raises(PassError, match="already registered"):
        register_pass(Second)
    assert get_pass("dup_name_for_test").__class__ is First


def test_runs_after_violation_raises_at_construction():
    with pytest.raises(PassOrderError, match="'dce' must run after 'cse'"):
        PassManager(["dce", "cse"])
    # a clean-up pass may run more than once as long as its last run comes last
    assert PassManager(["dce", "cse", "dce"]).names == ["dce", "cse", "dce"]


def test_runs_before_violation_and_requires():
    with pytest.raises(PassOrderError, match="must run after 'topological_sort'"):
        PassManager(["cse", "topological_sort"])
    with pytest.raises(PassOrderError, match="requires 'topological_sort' to run before it"):
        PassManager([_NeedsSort()])
    with pytest.raises(PassOrderError, match="invalidates it in between"):
        PassManager(["topological_sort", _BreaksSort(), _NeedsSort()])
    assert PassManager(["topological_sort", _NeedsSort()]).names[-1] == "needs_sort_for_test"


def test_debug_mode_names_the_pass_that_broke_invariants_and_those_before():
    m = _small()
    pm = PassManager(["topological_sort", _Noop(), _BreakDefUse(), "dce"], debug=True)
    with pytest.raises(InvariantError) as info:
        pm(m)
    err = info.value
    assert err.pass_name == "break_def_use"
    assert err.previous == ["topological_sort", "noop_for_test"]
    assert "break_def_use" in str(err) and "topological_sort, noop_for_test" in str(err)
    assert any(v.rule == "IR-DEFUSE" and "orphan" in v.message for v in err.violations)


def test_debug_mode_rejects_a_broken_input_before_any_pass():
    m = _small()
    _BreakDefUse()(m)
    with pytest.raises(InvariantError) as info:
        PassManager(["dce"], debug=True)(m)
    assert info.value.pass_name == "<input model>" and info.value.previous == []


def test_debug_mode_catches_a_dropped_binding_target():
    class DropOutput(Pass):
        name = "drop_output_for_test"
        invalidates = ALL
        preserves = ()

        def call(self, model: Model) -> PassResult:
            model.graph.outputs.pop(0)  # the bound output disappears, the binding stays
            return PassResult(model, True)

    with pytest.raises(InvariantError) as info:
        PassManager([DropOutput()], debug=True)(stateful_model())
    assert {v.rule for v in info.value.violations} & {"IR-BIND", "B2"}


def test_pass_must_work_in_place_and_return_a_result():
    with pytest.raises(PassError, match="in place"):
        PassManager([_ReturnsOther()])(_small())
    with pytest.raises(PassError, match="expects an onnxforge IR Model"):
        get_pass("dce")("not a model")  # type: ignore[arg-type]


def test_timings_progress_and_report():
    seen: list[PassRecord] = []
    m = _small()
    pm = PassManager(["topological_sort", "cse", "dce"], progress=seen.append)
    result = pm(m)
    assert result.modified and result.model is m
    assert [r.name for r in seen] == ["topological_sort", "cse", "dce"]
    dce = seen[-1]
    assert dce.modified and dce.nodes_before == 2 and dce.nodes_after == 1
    assert all(r.seconds >= 0 for r in seen)
    assert set(pm.timings()) == {"topological_sort", "cse", "dce"}
    report = pm.report()
    assert "dce" in report and "2->1" in report and "total" in report


def test_fixed_point_repeats_until_nothing_changes():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    left = g.op.Relu(g.op.Max(x, x))
    right = g.op.Relu(x)
    g.output(g.op.Add(left, right), "y")
    m = g.to_model()
    # round 0: cse finds nothing, rewrite turns Max(x, x) into x; round 1: cse merges the
    # two Relu(x); round 2 changes nothing
    pm = PassManager(["topological_sort", "cse", "rewrite", "dce"], fixed_point=True)
    assert pm(m).modified
    assert {r.iteration for r in pm.records} == {0, 1, 2}
    assert not any(r.modified for r in pm.records if r.iteration == 2)
    assert [n.op_type for n in m.graph] == ["Relu", "Add"]


def test_fixed_point_gives_up_after_max_iterations():
    class Flip(Pass):
        name = "flip_for_test"
        invalidates = ALL
        preserves = ()

        def call(self, model: Model) -> PassResult:
            return PassResult(model, True)

    with pytest.raises(PassError, match="no fixed point"):
        PassManager([Flip()], fixed_point=True, max_iterations=3)(_small())


# ----------------------------------------------------------------------------- analyses


class _Probe(Pass):
    """Reads an analysis through ``self.analyses`` and keeps what it got."""

    invalidates = ()
    preserves = ALL  # changes nothing

    def __init__(self, name: str, analysis: str = "liveness"):
        self.name = name
        self.analysis = analysis
        self.seen: list[object] = []

    def call(self, model: Model) -> PassResult:
        assert self.analyses is not None and self.analyses.model is model
        self.seen.append(self.analyses.get(self.analysis))
        return PassResult(model, False)


class _Touch(Pass):
    """Reports a change without making one, declaring what it breaks."""

    name = "touch_for_test"
    invalidates = ALL
    preserves = ()

    def __init__(self, invalidates=ALL, preserves=()):
        self.invalidates = invalidates
        self.preserves = preserves

    def call(self, model: Model) -> PassResult:
        return PassResult(model, True)


def test_analysis_manager_caches_until_invalidated():
    m = _small()
    am = AnalysisManager(m)
    live = am.get("liveness")
    assert am.get(LivenessAnalysis) is live and am.times_computed("liveness") == 1
    assert am.get("effects") is am.get("effects")  # read by liveness: cached too
    assert sorted(am.invalidate()) == ["effects", "liveness"]
    again = am.get("liveness")
    assert again is not live and am.times_computed("liveness") == 2
    with pytest.raises(AnalysisError, match="no analysis named"):
        am.get("nope")
    with pytest.raises(AnalysisError, match="bound to no model"):
        AnalysisManager().get("liveness")


def test_results_are_cached_per_model():
    m1, m2 = _small(), _small()
    am = AnalysisManager(m1)
    a, b = am.get("liveness"), am.get("liveness", m2)
    assert a is not b and a.main.order[0].graph is m1.graph and b.main.order[0].graph is m2.graph
    am.invalidate(model=m2)
    assert am.get("liveness") is a and am.get("liveness", m2) is not b


def test_passes_read_cached_analyses_and_a_change_drops_them():
    m = _small()
    first, second, third = _Probe("probe_1"), _Probe("probe_2"), _Probe("probe_3")
    pm = PassManager([first, second, "dce", third])
    pm(m)
    (a,), (b,), (c,) = first.seen, second.seen, third.seen
    assert a is b  # nothing changed in between: the same object
    # dce removed the dead Neg (modified=True, invalidates ALL): recomputed, new content
    assert c is not a
    assert [n.op_type for n in a.main.order] == ["Neg", "Relu"]
    assert [n.op_type for n in c.main.order] == ["Relu"]
    assert pm.analyses.cached("liveness", m) is c  # still valid after the run
    assert first.analyses is None  # the manager's cache is lent only for the call


def test_invalidates_and_preserves_choose_what_is_dropped():
    m = _small()
    before = _Probe("p_before", "memory_plan")
    fx_before, fx_after = _Probe("fx_before", "effects"), _Probe("fx_after", "effects")
    after = _Probe("p_after", "memory_plan")
    live_after = _Probe("l_after", "liveness")
    pm = PassManager([before, fx_before, _Touch(invalidates=("shapes",)), after, fx_after, live_after])
    pm(m)
    # shapes dropped, and the memory plan computed from them; effects kept
    assert after.seen[0] is not before.seen[0] and fx_after.seen[0] is fx_before.seen[0]
    assert pm.analyses.times_computed("liveness", m) == 1

    m = _small()
    keep, check = _Probe("keep", "memory_plan"), _Probe("check", "memory_plan")
    fx1, fx2 = _Probe("fx1", "effects"), _Probe("fx2", "effects")
    PassManager([keep, fx1, _Touch(preserves=("memory_plan",)), check, fx2])(m)
    assert check.seen[0] is keep.seen[0] and fx2.seen[0] is not fx1.seen[0]

    m = _small()
    p1, p2 = _Probe("q1"), _Probe("q2")
    PassManager([p1, _Touch(preserves=ALL), p2])(m)
    assert p1.seen[0] is p2.seen[0]


def test_a_lone_pass_computes_fresh_results():
    m = _small()
    probe = _Probe("lone")
    probe(m)
    probe(m)
    assert probe.seen[0] is not probe.seen[1] and probe.analyses is None


def test_each_run_starts_from_an_empty_cache():
    m = _small()
    probe = _Probe("run_probe")
    pm = PassManager([probe])
    pm(m)
    g = GraphBuilder.from_model(m)
    g.op.Abs(m.graph.inputs[0])  # edited outside the manager
    pm(m)
    old, new = probe.seen
    assert new is not old and len(new.main.order) == len(old.main.order) + 1


def test_all_never_breaks_a_requires_but_a_named_pass_does():
    pm = PassManager(["topological_sort", _Touch(), _NeedsSort()])
    assert pm.names[-1] == "needs_sort_for_test"
    with pytest.raises(PassOrderError, match="invalidates it in between"):
        PassManager(["topological_sort", _Touch(invalidates=("topological_sort",)), _NeedsSort()])


def test_node_counts_cover_subgraphs_and_functions():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    c = g.input("c", BOOL, [])
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    then_b.output(then_b.op.Relu(then_b.op.Neg(x)), "t")
    else_b.output(else_b.op.Abs(x), "e")
    fb = g.function("test.local", "F", ["a"])
    fb.output(fb.op.Neg(fb.graph.inputs[0]), "r")
    y = g.op.If(c, then_branch=then_b, else_branch=else_b)
    g.output(g.op["test.local"].F(y), "y")
    g.op.Neg(x)  # dead
    m = g.to_model()
    pm = PassManager(["dce"])
    pm(m)
    (record,) = pm.records
    # main: If, F call, Neg; then: 2; else: 1; function body: 1
    assert (record.nodes_before, record.nodes_after) == (7, 6)


class _DropDead(Pass):
    """Removes the dead Neg; declares whatever it is told."""

    name = "drop_dead_for_test"
    invalidates = ALL
    preserves = ()

    def __init__(self, *, preserves=(), report: bool = True):
        self.preserves = preserves
        self.report = report

    def call(self, model: Model) -> PassResult:
        neg = next(n for n in model.graph if n.op_type == "Neg")
        model.graph.remove(neg)
        return PassResult(model, self.report)


def test_debug_mode_names_a_pass_that_leaves_a_stale_analysis():
    for bad in (_DropDead(preserves=("liveness",)), _DropDead(report=False)):
        pm = PassManager([_Probe("reads_liveness"), bad], debug=True)
        with pytest.raises(PassError, match=r"'drop_dead_for_test' left stale analyses \['liveness'\]"):
            pm(_small())
    # declared honestly, the same rewrite passes the check and the result is recomputed
    probe_after = _Probe("after")
    pm = PassManager([_Probe("reads_liveness"), _DropDead(), probe_after], debug=True)
    pm(_small())
    assert [n.op_type for n in probe_after.seen[0].main.order] == ["Relu"]
    # without debug a false declaration is trusted (the check costs a recomputation)
    keep = _Probe("keep")
    PassManager([keep, _DropDead(preserves=("liveness",)), later := _Probe("later")])(_small())
    assert later.seen[0] is keep.seen[0]


class _AddState(Pass):
    """Makes the model's input READ_WRITE: storage the model did not declare."""

    name = "add_state_for_test"
    invalidates = ALL
    preserves = ()

    def __init__(self, *, declares_storage: bool):
        self.declares_storage = declares_storage

    def call(self, model: Model) -> PassResult:
        model.graph.inputs[0].access = READ_WRITE
        return PassResult(model, True)


def test_effects_of_a_model_without_storage_outlive_passes_that_declare_none():
    m = _small()
    fx1, fx2 = _Probe("fx1", "effects"), _Probe("fx2", "effects")
    pm = PassManager([fx1, "cse", "dce", fx2])
    pm(m)
    assert [n.op_type for n in m.graph] == ["Relu"]  # dce changed the model
    assert fx2.seen[0] is fx1.seen[0] and pm.analyses.times_computed("effects", m) == 1
    # the default pipeline computes them once for such a model
    pm = default_pass_manager()
    pm(_small())
    assert pm.analyses.times_computed("effects", pm.analyses.model) == 1
    # a pass that may declare storage (the default) drops them
    p1, p2 = _Probe("p1", "effects"), _Probe("p2", "effects")
    PassManager([p1, _Touch(), p2])(_small())
    assert p2.seen[0] is not p1.seen[0]
    # a model that declares storage: computed again after every change
    s1, s2 = _Probe("s1", "effects"), _Probe("s2", "effects")
    PassManager([s1, "dce", s2])(stateful_model())
    assert s2.seen[0] is not s1.seen[0]


def test_debug_mode_catches_a_pass_that_declares_storage_it_claims_not_to():
    pm = PassManager([_Probe("fx", "effects"), _AddState(declares_storage=False)], debug=True)
    with pytest.raises(PassError, match=r"'add_state_for_test' left stale analyses \['effects'\]"):
        pm(_small())
    probe = _Probe("fx_after", "effects")
    PassManager([_Probe("fx", "effects"), _AddState(declares_storage=True), probe], debug=True)(_small())
    assert not probe.seen[0].stateless
