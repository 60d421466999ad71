"""Topological sort: stable, scope-aware, readers of a version before its in-place writer."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import READ_WRITE, Alias, Attr, AttrType, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.scope_order import in_order_throughout, topological_order
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import (
    CycleError,
    TopologicalSortPass,
    check_invariants,
    ir_violations,
)
from onnxforge.proto_ext.types import TensorType

from tests.passes.helpers import FLOAT, assert_same_outputs, stateful_model

T4 = TensorType(FLOAT, (4,))
X = {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)}


def _shuffled() -> tuple[Model, list[Node]]:
    g = Graph("g")
    x = g.add_input(Value("x", T4))
    a = Node("", "Relu", [x], [Value("a", T4)], name="a")
    b = Node("", "Neg", [a.outputs[0]], [Value("b", T4)], name="b")
    u = Node("", "Exp", [x], [Value("u", T4)], name="u")  # independent of a and b
    c = Node("", "Add", [b.outputs[0], u.outputs[0]], [Value("y", T4)], name="c")
    for n in (c, u, b, a):
        g.append(n)
    g.outputs.append(c.outputs[0])
    return Model(g, opset_imports={"": 21}), [a, b, u, c]


def _names(m: Model) -> list[str]:
    return [n.name for n in m.graph]


def test_sorts_and_keeps_original_order_where_free():
    m, _ = _shuffled()
    before = to_onnx(m)
    assert ir_violations(m)
    assert TopologicalSortPass()(m).modified
    assert _names(m) == ["u", "a", "b", "c"]  # u came first in the input, and still does
    assert check_invariants(m) == []
    assert_same_outputs(before, m, X)
    assert not TopologicalSortPass()(m).modified


def test_already_sorted_graph_is_left_alone():
    m = stateful_model()
    order = list(m.graph)
    assert not TopologicalSortPass()(m).modified
    assert list(m.graph) == order


def test_cycle_is_reported():
    g = Graph("g")
    x = g.add_input(Value("x", T4))
    a = Node("", "Add", [x, None], [Value("a", T4)], name="a")
    b = Node("", "Neg", [a.outputs[0]], [Value("b", T4)], name="b")
    a.set_input(1, b.outputs[0])
    g.append(a)
    g.append(b)
    g.outputs.append(b.outputs[0])
    with pytest.raises(CycleError, match="cycle"):
        TopologicalSortPass()(Model(g, opset_imports={"": 21}))


def _cache_graph(order: str) -> tuple[Model, dict[str, Node]]:
    g = Graph("g")
    cache = g.add_input(Value("cache", TensorType(FLOAT, (1, 8, 4)), access=READ_WRITE))
    vals = g.add_input(Value("vals", TensorType(FLOAT, (1, 1, 4))))
    pos = g.add_input(Value("pos", TensorType(TensorProto.INT64, ())))
    w = Node("ai.onnxforge", "CacheUpdate", [cache, vals, pos], [Value("upd", cache.type)],
             name="W", output_alias=[Alias(0, 0)])
    r = Node("", "ReduceSum", [cache], [Value("r", TensorType(FLOAT, (1, 1, 1)))], name="R")
    use_r = Node("", "Neg", [r.outputs[0]], [Value("nr", TensorType(FLOAT, (1, 1, 1)))], name="use_r")
    use_w = Node("", "Abs", [w.outputs[0]], [Value("aw", cache.type)], name="use_w")
    nodes = {"W": w, "R": r, "use_r": use_r, "use_w": use_w}
    for name in order.split():
        g.append(nodes[name])
    g.outputs.extend([use_r.outputs[0], use_w.outputs[0]])
    return Model(g, opset_imports={"": 21, "ai.onnxforge": 1}), nodes


def test_a_reader_listed_after_the_write_is_scheduled_before_it():
    # R reads `cache`, the version W consumes (rule L13): wherever it is listed, it runs
    # before W, so in-place execution equals functional execution
    m, _ = _cache_graph("use_r W R use_w")
    assert TopologicalSortPass()(m).modified
    got = _names(m)
    assert got.index("R") < got.index("use_r") and got.index("R") < got.index("W") < got.index("use_w")
    assert check_invariants(m) == []


def test_a_reader_that_depends_on_its_writer_has_no_order():
    g = Graph("g")
    cache = g.add_input(Value("cache", TensorType(FLOAT, (1, 8, 4)), access=READ_WRITE))
    vals = g.add_input(Value("vals", TensorType(FLOAT, (1, 1, 4))))
    pos = g.add_input(Value("pos", TensorType(TensorProto.INT64, ())))
    w = g.append(Node("ai.onnxforge", "CacheUpdate", [cache, vals, pos], [Value("upd", cache.type)],
                      name="W", output_alias=[Alias(0, 0)]))
    g.append(Node("", "Add", [cache, w.outputs[0]], [Value("z", cache.type)], name="R"))
    g.outputs.append(g.nodes[-1].outputs[0])
    with pytest.raises(CycleError, match="L13"):
        TopologicalSortPass()(Model(g, opset_imports={"": 21, "ai.onnxforge": 1}))


def test_a_reader_before_the_write_stays_before_it():
    # use_w, listed first, needs W; R was listed before W and must stay before it
    m, _ = _cache_graph("use_w R W use_r")
    TopologicalSortPass()(m)
    got = _names(m)
    assert got.index("R") < got.index("W") < got.index("use_w")
    assert check_invariants(m) == []


def test_outer_values_read_by_a_branch_are_placed_before_the_branching_node():
    g = GraphBuilder(opset=21)
    x = g.input("x", FLOAT, [4])
    cond = g.input("c", TensorProto.BOOL, [])
    late = Value("late", T4)
    then_b, else_b = g.subgraph("then"), g.subgraph("else")
    t = then_b.op.Neg(late)
    t.type = T4
    then_b.graph.outputs.append(t)
    e = else_b.op.Relu(x)
    e.type = T4
    else_b.graph.outputs.append(e)
    g.output(g.op.If(cond, then_branch=then_b, else_branch=else_b), "y", type=T4)
    g.graph.append(Node("", "Exp", [x], [late], name="producer"))
    m = g.to_model()
    assert any(v.rule == "IR-ORDER" for v in ir_violations(m))
    assert TopologicalSortPass()(m).modified
    assert [n.op_type for n in m.graph] == ["Exp", "If"]
    assert check_invariants(m) == []
    for flag in (True, False):
        assert_same_outputs(to_onnx(m), m, {**X, "c": np.array(flag)})


def _random_scoped(seed: int) -> Graph:
    """A random DAG whose If bodies (two levels deep) read values of the enclosing
    graphs, its nodes listed in a random order in each graph."""
    rng = np.random.default_rng(seed)

    def fill(g: Graph, outer: list[Value], depth: int) -> Graph:
        made: list[Value] = []
        nodes: list[Node] = []
        for k in range(int(rng.integers(1, 5))):
            pool = outer + made
            name = f"{g.name}_{k}"
            if depth < 2 and rng.random() < 0.3:
                branches = [Attr(a, AttrType.GRAPH, fill(Graph(f"{name}{a[0]}"), pool, depth + 1))
                            for a in ("then_branch", "else_branch")]
                n = Node("", "If", [outer[0]], [Value(name, T4)], name=name, attributes=branches)
            else:
                n = Node("", "Neg", [pool[int(rng.integers(len(pool)))]], [Value(name, T4)], name=name)
            made.append(n.outputs[0])
            nodes.append(n)
        for i in rng.permutation(len(nodes)) if rng.random() < 0.5 else range(len(nodes)):
            g.append(nodes[int(i)])
        g.outputs.append(made[-1])
        return g

    top = Graph("g")
    return fill(top, [top.add_input(Value("x", T4))], 0)


@pytest.mark.parametrize("seed", range(60))
def test_one_walk_order_check_agrees_with_sorting_each_graph(seed):
    g = _random_scoped(seed)
    each = all(topological_order(c) == list(c) for c in g.all_graphs())
    assert in_order_throughout(g) == each
