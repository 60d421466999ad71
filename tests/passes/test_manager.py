"""Pass contract, registry, ordering constraints, debug-mode invariant checks, timings."""
from __future__ import annotations

import pytest

from onnxforge.graphbuilder.builder import GraphBuilder
from onnxforge.graphbuilder.ir import Model, Node
from onnxforge.passes import (
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
from onnxforge.passes.dce import DeadCodeEliminationPass

from tests.passes.helpers import FLOAT, stateful_model


def _small() -> Model:
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    g.op.Neg(x)
    g.output(g.op.Relu(x), "y")
    return g.to_model()


class _BreakDefUse(Pass):
    """Leaves a node reading a value that no longer exists in the model."""

    name = "break_def_use"

    def call(self, model: Model) -> PassResult:
        g = model.graph
        relu = next(n for n in g if n.op_type == "Relu")
        orphan = Node("", "Abs", [g.inputs[0]], ["orphan"])  # never added to the graph
        relu.set_input(0, orphan.outputs[0])
        return PassResult(model, True)


class _Noop(Pass):
    name = "noop_for_test"

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _NeedsSort(Pass):
    name = "needs_sort_for_test"
    requires = ("topological_sort",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _BreaksSort(Pass):
    name = "breaks_sort_for_test"
    invalidates = ("topological_sort",)

    def call(self, model: Model) -> PassResult:
        return PassResult(model, False)


class _ReturnsOther(Pass):
    name = "returns_other_for_test"

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

        def call(self, model: Model) -> PassResult:
            return PassResult(model, True)

    with pytest.raises(PassError, match="no fixed point"):
        PassManager([Flip()], fixed_point=True, max_iterations=3)(_small())
