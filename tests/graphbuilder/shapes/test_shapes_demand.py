"""``ShapesContext.infer_for``: inferring only what the asked values depend on.

Oracle: the context's own whole-graph inference (``infer_graph``), which the corpus
tests check against ``onnx.shape_inference``. Asked value by value in a random order,
every value of every graph (control-flow bodies included) gets the type the whole
inference gives it, up to a renaming of the fresh symbols each context makes; on
onnx's backend node-test corpus and on the real-model corpus.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.ir.core import Graph, Model, Node, Value
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symtensor import ShapeError
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.proto_ext.types import OptionalType, SequenceType, SparseTensorType, TensorType, Type
from tests.fixtures.wild import NAMES

F = TP.FLOAT


def _context(m: Model) -> ShapesContext:
    return ShapesContext(m, write_back=False, strict=False)


def _values(g: Graph) -> Iterator[Value]:
    """Every value of ``g`` and of its bodies: inputs, initializers, node outputs, outputs."""
    for sub in g.all_graphs():
        yield from sub.inputs
        yield from sub.initializers.values()
        for n in sub:
            yield from (o for o in n.outputs if o is not None)
        yield from sub.outputs


class _Renaming:
    """Canonical forms of types in which each symbolic dimension (its printed expression)
    is numbered by first appearance: two contexts whose fresh symbols differ only in name
    give equal forms when their types are read in the same order."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def form(self, t: Type) -> object:
        if isinstance(t, (TensorType, SparseTensorType)):
            dims = None if t.shape is None else tuple(
                d if type(d) is int else ("?",) if d is None else ("s", self.numbers.setdefault(str(d), len(self.numbers)))
                for d in t.shape)
            return (type(t).__name__, t.elem_type, dims)
        if isinstance(t, (SequenceType, OptionalType)):
            return (type(t).__name__, self.form(t.elem))
        return t


def _compare(m: Model, seed: int) -> int:
    """Ask every value of ``m`` in a random order; return how many were compared."""
    try:
        whole = _context(m).infer_graph()
    except ShapeError:
        return 0
    values = list(dict.fromkeys(_values(m.graph)))
    random.Random(seed).shuffle(values)
    demand = _context(m)
    for v in values:
        demand.infer_for([v])
    a, b = _Renaming(), _Renaming()
    for v in values:  # one order for both forms
        want, got = a.form(whole.type_of(v)), b.form(demand.type_of(v))
        assert got == want, f"{v.name!r}: {demand.type_of(v)} on demand, {whole.type_of(v)} inferred whole"
        assert (demand.value_of(v) is None) == (whole.value_of(v) is None), v.name
    return len(values)


def test_node_corpus_on_demand_equals_whole_inference(node_models) -> None:
    compared = models = 0
    for k, (name, proto) in enumerate(node_models):
        try:
            m = serde.load(proto)
        except Exception:  # noqa: BLE001  # a case the loader rejects is the serde tests' business
            continue
        if not Storage(m).stateless:
            continue
        n = _compare(m, seed=k)
        compared += n
        models += n > 0
    assert models >= 1700 and compared >= 8000, (models, compared)


@pytest.mark.parametrize("name", NAMES)
def test_real_models_on_demand_equal_whole_inference(name, wild_models) -> None:
    m = serde.load(str(wild_models[name]))
    assert _compare(m, seed=7) > 50


# ----------------------------------------------------------------------------- what is inferred


@pytest.fixture
def inferred(monkeypatch) -> list[str]:
    """The names of the nodes any context infers."""
    names: list[str] = []
    real = ShapesContext.infer_node

    def counted(self, node):
        names.append(node.name)
        return real(self, node)

    monkeypatch.setattr(ShapesContext, "infer_node", counted)
    return names


def _load(nodes, inputs, outputs, initializers=(), functions=()) -> Model:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return serde.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                          helper.make_opsetid("local", 1)],
                                        functions=list(functions)))


def _value(m: Model, name: str) -> Value:
    for v in _values(m.graph):
        if v.name == name:
            return v
    for f in m.functions.values():
        for n in f:
            for o in n.outputs:
                if o.name == name:
                    return o
    raise KeyError(name)


def _tensor(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, shape)


def test_only_the_ancestors_are_inferred(inferred) -> None:
    m = _load([helper.make_node("Relu", ["x"], ["a1"], name="A1"),
               helper.make_node("Abs", ["a1"], ["a2"], name="A2"),
               helper.make_node("Neg", ["y"], ["b1"], name="B1"),
               helper.make_node("Add", ["a2", "b1"], ["z"], name="Z")],
              [_tensor("x", [2, 3]), _tensor("y", [2, 3])], [_tensor("z", None)])
    ctx = _context(m)
    ctx.infer_for([_value(m, "a2")])
    assert inferred == ["A1", "A2"]
    assert ctx.shape_of(_value(m, "a2")) == (2, 3)
    assert ctx.type_of(_value(m, "b1")) is None  # never asked, never inferred
    ctx.infer_for([_value(m, "z")])  # what was inferred is not inferred again
    assert inferred == ["A1", "A2", "B1", "Z"]
    assert ctx.shape_of(_value(m, "z")) == (2, 3)


def test_a_later_question_infers_only_new_nodes(inferred) -> None:
    m = _load([helper.make_node("Relu", ["x"], ["a"], name="A"),
               helper.make_node("Identity", ["a"], ["z"], name="Z")],
              [_tensor("x", [4, "n"])], [_tensor("z", None)])
    ctx = _context(m)
    a = _value(m, "a")
    ctx.infer_for([a])
    new = Node("", "Transpose", [a], [Value("t")], name="T")
    m.graph.insert_before(a.consumers()[0], new)
    ctx.infer_for(new.outputs)
    assert inferred == ["A", "T"]
    assert ctx.shape_of(new.outputs[0]) == ctx.shape_of(a)[::-1]


def test_an_if_branch_node_is_inferred_without_its_if(inferred) -> None:
    then_g = helper.make_graph([helper.make_node("Abs", ["x"], ["t1"], name="T1"),
                                helper.make_node("Unsqueeze", ["t1", "ax"], ["t2"], name="T2")],
                               "then", [], [_tensor("t2", None)],
                               [helper.make_tensor("ax", TP.INT64, [1], [0])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e1"], name="E1")], "else", [],
                               [_tensor("e1", None)])
    m = _load([helper.make_node("Relu", ["x0"], ["x"], name="X"),
               helper.make_node("If", ["c"], ["y"], name="IF", then_branch=then_g, else_branch=else_g)],
              [_tensor("x0", [3]), helper.make_tensor_value_info("c", TP.BOOL, [])], [_tensor("y", None)])
    ctx = _context(m)
    ctx.infer_for([_value(m, "t2")])
    assert inferred == ["X", "T1", "T2"]
    assert ctx.shape_of(_value(m, "t2")) == (1, 3)
    ctx.infer_for([_value(m, "y")])  # the If infers both branches (the then branch again)
    assert inferred[3] == "IF" and set(inferred[4:]) == {"T1", "T2", "E1"}
    y = _value(m, "y")
    assert ctx.type_of(y) == _context(m).infer_graph().type_of(y) == TensorType(F, None)  # ranks 2 and 1 join


def test_a_loop_body_value_infers_its_loop(inferred) -> None:
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"], name="C"),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"], name="ADD")],
                             "body", [helper.make_tensor_value_info("i", TP.INT64, []),
                                      helper.make_tensor_value_info("cond_in", TP.BOOL, []),
                                      _tensor("v_in", None)],
                             [helper.make_tensor_value_info("cond_out", TP.BOOL, []), _tensor("v_out", None)],
                             [helper.make_tensor("one", F, [], [1.0])])
    m = _load([helper.make_node("Relu", ["x"], ["r"], name="R"),
               helper.make_node("Loop", ["n", "", "r"], ["y"], name="LOOP", body=body)],
              [_tensor("x", [2, 5]), helper.make_tensor_value_info("n", TP.INT64, [])], [_tensor("y", None)])
    ctx = _context(m)
    ctx.infer_for([_value(m, "v_in")])  # a body input: its owner binds it
    assert inferred[:2] == ["R", "LOOP"] and set(inferred[2:]) == {"C", "ADD"}
    whole = _context(m).infer_graph()
    for name in ("v_in", "v_out", "y"):
        assert ctx.type_of(_value(m, name)) == whole.type_of(_value(m, name)), name
    del inferred[:]
    ctx.infer_for([_value(m, "v_out")])  # inferred with the Loop's body
    assert inferred == []


def test_an_outer_value_a_body_reads_is_inferred_before_its_owner(inferred) -> None:
    then_g = helper.make_graph([helper.make_node("Abs", ["w"], ["t"], name="T")], "then", [], [_tensor("t", None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["w"], ["e"], name="E")], "else", [], [_tensor("e", None)])
    m = _load([helper.make_node("Relu", ["x"], ["w"], name="W"),
               helper.make_node("If", ["c"], ["y"], name="IF", then_branch=then_g, else_branch=else_g)],
              [_tensor("x", [6]), helper.make_tensor_value_info("c", TP.BOOL, [])], [_tensor("y", None)])
    ctx = _context(m)
    ctx.infer_for([_value(m, "y")])  # the If reads nothing but c; its branches read w
    assert inferred[:2] == ["W", "IF"]
    assert ctx.shape_of(_value(m, "y")) == (6,)


def test_a_function_body_stays_unknown_as_in_a_whole_inference(inferred) -> None:
    fn = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"], name="FR")],
                              opset_imports=[helper.make_opsetid("", 21)])
    m = _load([helper.make_node("F", ["x"], ["y"], domain="local", name="CALL")],
              [_tensor("x", [2])], [_tensor("y", None)], functions=[fn])
    ctx = _context(m)
    b = _value(m, "b")
    ctx.infer_for([b])
    assert inferred == [] and ctx.type_of(b) == _context(m).infer_graph().type_of(b)
    ctx.infer_for([_value(m, "y")])
    assert inferred[0] == "CALL" and ctx.shape_of(_value(m, "y")) == (2,)


def test_a_cycle_is_a_shape_error() -> None:
    m = _load([helper.make_node("Relu", ["x"], ["a"], name="A")], [_tensor("x", [2])], [_tensor("a", None)])
    a_node = next(iter(m.graph))
    b = Value("b")
    m.graph.append(Node("", "Abs", [a_node.outputs[0]], [b], name="B"))
    a_node.set_input(0, b)  # A reads B, B reads A
    with pytest.raises(ShapeError, match="depends on its own outputs"):
        _context(m).infer_for([b])


def test_seeded_values_need_no_node(inferred) -> None:
    m = _load([helper.make_node("Add", ["x", "w"], ["y"], name="Y")], [_tensor("x", [2])], [_tensor("y", None)],
              [helper.make_tensor("w", F, [2], [1.0, 2.0])])
    ctx = _context(m)
    ctx.infer_for([_value(m, "x"), _value(m, "w"), None])
    assert inferred == []
    assert ctx.shape_of(_value(m, "x")) == (2,) and ctx.shape_of(_value(m, "w")) == (2,)
    np.testing.assert_array_equal(ctx.value_of(_value(m, "w")).to_numpy(), [1.0, 2.0])
