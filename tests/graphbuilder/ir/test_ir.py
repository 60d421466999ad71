"""The IR core: def-use, node lists, SSA, initializers, scopes, aliases, functions.

Def-use is checked against an independent oracle: ``_check_def_use`` rescans
every node of the model and compares the uses it finds with what each Value
reports, so a mutator that forgets to update one side fails the test.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.ir.core import (
    READ_WRITE,
    Attr,
    AttrType,
    Function,
    Graph,
    IRError,
    Model,
    Node,
    Value,
)
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor
from onnxforge.proto_ext.convert import constant_from_numpy
from onnxforge.proto_ext.types import AffineLayout, EncodedValue, TensorType

FLOAT = TensorProto.FLOAT


def _f(*dims: int) -> TensorType:
    return TensorType(FLOAT, tuple(dims))


def _nodes(container: Any) -> Iterator[Node]:
    """Every node of a graph or function, subgraphs included (independent walk)."""
    for n in container:
        yield n
        for a in n.attributes.values():
            subs = [a.value] if a.type == AttrType.GRAPH else list(a.value or []) \
                if a.type == AttrType.GRAPHS else []
            for sg in subs:
                yield from _nodes(sg)


def _check_def_use(containers: Iterable[Any], extra: Iterable[Value] = ()) -> None:
    """Rescan ``containers`` and compare with every value's producer and uses."""
    expected: dict[int, set] = defaultdict(set)
    values: dict[int, Value] = {}
    for c in containers:
        for v in c.inputs:
            values[id(v)] = v
        for n in _nodes(c):
            for i, v in enumerate(n.inputs):
                if v is not None:
                    expected[id(v)].add((n, i))
                    values[id(v)] = v
            for i, o in enumerate(n.outputs):
                assert o.producer() is n and o.index == i
                values[id(o)] = o
    for v in extra:
        values[id(v)] = v
    for key, v in values.items():
        assert set(v.uses()) == expected[key], f"uses of {v.name!r}"
        assert v.num_uses() == len(expected[key])


def _check_links(c: Any) -> list[Node]:
    """Forward and backward traversals agree, ends are terminated, len is right."""
    fwd = list(c)
    bwd = list(reversed(c))
    assert fwd == bwd[::-1]
    assert len(c) == len(fwd)
    for a, b in pairwise(fwd):
        assert a._next is b and b._prev is a
    if fwd:
        assert fwd[0]._prev is None and fwd[-1]._next is None
    assert all(n.graph is c for n in fwd)
    return fwd


def _chain(n: int = 3) -> tuple[Graph, Value, list[Node]]:
    """x -> Relu -> Relu -> ... (n nodes); the last output is the graph output."""
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    nodes: list[Node] = []
    cur = x
    for k in range(n):
        nodes.append(g.append(Node("", "Relu", [cur], [f"r{k}"])))
        cur = nodes[-1].outputs[0]
    g.outputs.append(cur)
    return g, x, nodes


def _encoded(name: str = "", n: int = 4) -> EncodedTensor:
    return EncodedTensor(EncodedValue(
        name=name, affine=AffineLayout(TensorProto.INT8, constant_from_numpy(np.float32(0.5))),
        logical_type=_f(n), has_logical_type=True, raw_data=bytes(range(n))))


def _run(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = serde.to_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# -- def-use ------------------------------------------------------------------------


def test_node_construction_records_producer_and_uses() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    n = Node("", "Add", [x, x], ["y"])
    assert x.uses() == [(n, 0), (n, 1)] and x.consumers() == [n]
    y = n.outputs[0]
    assert y.producer() is n and y.index == 0 and y.name == "y"
    assert y.graph is None  # not adopted yet
    g.append(n)
    assert y.graph is g and n.graph is g
    two = g.append(Node("", "Split", [y], 2))
    assert [o.index for o in two.outputs] == [0, 1]
    assert all(o.producer() is two for o in two.outputs)
    _check_def_use([g])


def test_set_input_moves_the_use() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    z = g.add_input(Value("z", _f(4)))
    n = g.append(Node("", "Add", [x, x], ["y"]))
    n.set_input(1, z)
    assert n.inputs == (x, z)
    assert x.uses() == [(n, 0)] and z.uses() == [(n, 1)]
    n.set_input(1, z)  # same value: no change
    assert z.uses() == [(n, 1)]
    n.set_input(0, None)
    assert n.inputs == (None, z) and x.uses() == []
    _check_def_use([g], [x])


def test_append_and_resize_inputs() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    z = g.add_input(Value("z", _f(4)))
    n = g.append(Node("", "Concat", [x], ["y"]))
    n.append_input(z)
    n.append_input(None)
    n.append_input(x)
    assert n.inputs == (x, z, None, x)
    assert set(x.uses()) == {(n, 0), (n, 3)} and z.uses() == [(n, 1)]
    _check_def_use([g])
    n.resize_inputs(2)
    assert n.inputs == (x, z) and x.uses() == [(n, 0)]
    n.resize_inputs(4)
    assert n.inputs == (x, z, None, None)
    n.resize_inputs(1)
    assert n.inputs == (x,) and z.uses() == []
    _check_def_use([g], [z])


def test_replace_input_with_and_detach_inputs() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    z = g.add_input(Value("z", _f(4)))
    n = g.append(Node("", "Sum", [x, z, x], ["y"]))
    n.replace_input_with(x, z)
    assert n.inputs == (z, z, z)
    assert x.uses() == [] and set(z.uses()) == {(n, 0), (n, 1), (n, 2)}
    n.replace_input_with(z, None)
    assert n.inputs == (None, None, None) and z.uses() == []
    n.set_input(0, x)
    n.set_input(2, z)
    n.detach_inputs()
    assert n.inputs == (None, None, None)
    assert x.uses() == [] and z.uses() == []
    _check_def_use([g], [x, z])


def test_replace_all_uses_with_follows_outputs_bindings_and_aliases() -> None:
    g = Graph("g")
    cache = g.add_input(Value("cache", _f(4), access=READ_WRITE))
    old = g.append(Node("", "Identity", [cache], ["old"])).outputs[0]
    c1 = g.append(Node("", "Relu", [old], ["c1"]))
    c2 = g.append(Node("", "Identity", [old], ["c2"]))
    c2.outputs[0].alias_of = old  # value-level alias naming the replaced value
    g.outputs.extend([old, c2.outputs[0]])
    g.bindings.append((cache, old))
    new = g.append(Node("", "Neg", [cache], ["new"])).outputs[0]
    old.replace_all_uses_with(new)
    assert c1.inputs == (new,) and c2.inputs == (new,)
    assert old.uses() == [] and set(new.uses()) == {(c1, 0), (c2, 0)}
    assert g.outputs == [new, c2.outputs[0]]
    assert g.bindings == [(cache, new)]  # the binding's input side is not touched
    assert c2.outputs[0].alias_of is new  # alias_of stays equal to the port's input (L3)
    _check_def_use([g], [old])


def test_replace_all_uses_with_outputs_false_leaves_graph_outputs() -> None:
    g, x, nodes = _chain(2)
    last = nodes[-1].outputs[0]
    other = g.append(Node("", "Neg", [x], ["n"])).outputs[0]
    first = nodes[0].outputs[0]
    first.replace_all_uses_with(other, outputs=False)
    assert nodes[1].inputs == (other,)
    last.replace_all_uses_with(other, outputs=False)
    assert g.outputs == [last]
    _check_def_use([g], [first])


def test_replace_all_uses_with_in_a_function_updates_its_outputs() -> None:
    fn = Function("local", "F")
    a = fn.add_input(Value("a"))
    r = fn.append(Node("", "Relu", [a], ["r"])).outputs[0]
    fn.outputs.append(r)
    s = fn.append(Node("", "Neg", [a], ["s"])).outputs[0]
    r.replace_all_uses_with(s)
    assert fn.outputs == [s]
    assert r.is_graph_output() is False and s.is_graph_output() is True
    _check_def_use([fn], [r])


# -- removal --------------------------------------------------------------------------


def test_remove_refuses_used_or_output_nodes() -> None:
    g, _x, nodes = _chain(3)
    with pytest.raises(IRError, match="still used"):
        g.remove(nodes[0])
    with pytest.raises(IRError, match="graph output"):
        g.remove(nodes[2])
    other = Graph("other")
    with pytest.raises(IRError, match="not in this graph"):
        other.remove(nodes[1])
    assert _check_links(g) == nodes  # refused removals changed nothing
    _check_def_use([g])


def test_remove_releases_the_inputs_uses() -> None:
    g, x, nodes = _chain(3)
    extra = g.append(Node("", "Neg", [x], ["dead"]))
    assert len(x.uses()) == 2
    g.remove(extra)
    assert x.uses() == [(nodes[0], 0)]
    assert extra.graph is None and extra.inputs == (None,)
    assert _check_links(g) == nodes
    # unsafe removal of the middle node: its consumer keeps reading the orphaned value
    mid_out = nodes[1].outputs[0]
    g.remove(nodes[1], safe=False)
    assert _check_links(g) == [nodes[0], nodes[2]]
    assert nodes[0].outputs[0].uses() == [] and mid_out.uses() == [(nodes[2], 0)]
    _check_def_use([g], [x, mid_out])


def test_iteration_tolerates_removal_of_the_current_node() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    nodes = [g.append(Node("", "Neg", [x], [f"n{k}"])) for k in range(5)]
    seen = []
    for n in g:
        seen.append(n)
        if n.op_type == "Neg":
            g.remove(n)
    assert seen == nodes
    assert len(g) == 0 and list(g) == [] and list(reversed(g)) == []
    assert x.uses() == []
    g.append(nodes[0])  # a removed node can be adopted again
    assert _check_links(g) == [nodes[0]]


def test_iteration_tolerates_removal_in_reverse() -> None:
    g, x, nodes = _chain(4)
    g.outputs.clear()
    order = []
    for n in reversed(g):  # consumers first, so every safe removal succeeds
        order.append(n)
        g.remove(n)
    assert order == nodes[::-1] and len(g) == 0
    _check_def_use([g], [x])


# -- linked list ------------------------------------------------------------------------


def test_insert_before_and_after_keep_the_list_consistent() -> None:
    g, x, (a, b, c) = _chain(3)
    head = g.insert_before(a, Node("", "Neg", [x], ["h"]))
    tail = g.insert_after(c, Node("", "Neg", [x], ["t"]))
    mid1 = g.insert_after(a, Node("", "Neg", [x], ["m1"]))
    mid2 = g.insert_before(c, Node("", "Neg", [x], ["m2"]))
    assert _check_links(g) == [head, a, mid1, b, mid2, c, tail]
    _check_def_use([g])
    with pytest.raises(IRError, match="already belongs"):
        g.insert_after(a, mid1)
    with pytest.raises(IRError, match="not in this graph"):
        Graph("other").insert_before(a, Node("", "Neg", [x], ["q"]))
    assert _check_links(g) == [head, a, mid1, b, mid2, c, tail]


def test_reorder_and_move_to_end() -> None:
    g, _x, (a, b, c) = _chain(3)
    g.reorder([c, a, b])
    assert _check_links(g) == [c, a, b]
    g.move_to_end(c)
    assert _check_links(g) == [a, b, c]
    g.move_to_end(a)
    g.move_to_end(b)
    assert _check_links(g) == [c, a, b]
    g.move_to_end(b)  # already last
    assert _check_links(g) == [c, a, b]
    _check_def_use([g])  # def-use is untouched by relinking


def test_reorder_refuses_non_permutations_without_changing_the_list() -> None:
    g, _x, (a, b, c) = _chain(3)
    with pytest.raises(IRError, match="permutation"):
        g.reorder([a, b])
    with pytest.raises(IRError, match="permutation"):
        g.reorder([a, a, b])
    g2, _, (d, *_rest) = _chain(3)
    with pytest.raises(IRError, match="not in this graph"):
        g.reorder([a, b, d])
    with pytest.raises(IRError, match="not in this graph"):
        g.move_to_end(d)
    assert _check_links(g) == [a, b, c]
    assert _check_links(g2)[0] is d


# -- strict SSA -------------------------------------------------------------------------


def test_a_value_cannot_get_two_producers() -> None:
    g, x, (a, _b, _c) = _chain(3)
    y = a.outputs[0]
    before = x.uses()
    with pytest.raises(IRError, match="producer"):
        Node("", "Neg", [x], [y])
    assert x.uses() == before  # the refused node left no use behind
    fresh = Value("fresh")
    with pytest.raises(IRError, match="producer"):
        Node("", "Split", [x], [fresh, fresh])
    assert fresh.producer() is None and x.uses() == before
    with pytest.raises(IRError, match="graph input"):
        Node("", "Neg", [y], [x])
    w = g.add_initializer(Value("w", _f(4)), Tensor.from_numpy(np.ones(4, np.float32)))
    with pytest.raises(IRError, match="initializer"):
        Node("", "Neg", [x], [w])
    with pytest.raises(IRError, match="producer"):
        g.add_input(y)
    with pytest.raises(IRError, match="producer"):
        g.add_initializer(y, Tensor.from_numpy(np.ones(4, np.float32)))
    with pytest.raises(IRError, match="producer"):
        Function("local", "F").add_input(y)
    assert y.producer() is a
    _check_def_use([g])


# -- initializers ------------------------------------------------------------------------


def test_dense_and_encoded_initializers_share_one_namespace() -> None:
    g = Graph("g")
    w = g.add_initializer(Value("w", _f(4)), Tensor.from_numpy(np.arange(4, dtype=np.float32)))
    e = g.add_initializer(Value("e", _f(4)), _encoded())
    assert g.initializers == {"w": w} and g.encoded_initializers == {"e": e}
    assert w.is_initializer() and not w.is_encoded()
    assert e.is_initializer() and e.is_encoded()
    assert e.const.name == "e" and w.const.name == "w"  # the payload carries the name
    assert list(g.all_initializers()) == [w, e]
    with pytest.raises(IRError, match="N2"):
        g.add_initializer(Value("w", _f(4)), _encoded())
    with pytest.raises(IRError, match="N2"):
        g.add_initializer(Value("e", _f(4)), Tensor.from_numpy(np.zeros(4, np.float32)))
    g.sparse_initializers["s"] = b""
    with pytest.raises(IRError, match="N2"):
        g.add_initializer(Value("s", _f(4)), Tensor.from_numpy(np.zeros(4, np.float32)))
    assert g.initializers == {"w": w} and g.encoded_initializers == {"e": e}


def test_rename_initializer() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    w = g.add_initializer(Value("w", _f(4)), Tensor.from_numpy(np.arange(4, dtype=np.float32)))
    e = g.add_initializer(Value("e", _f(4)), _encoded())
    n = g.append(Node("", "Add", [x, w], ["y"]))
    g.rename_initializer(w, "weight")
    assert g.initializers == {"weight": w} and w.name == "weight" and w.const.name == "weight"
    assert n.inputs == (x, w)  # consumers hold the Value: nothing else to update
    g.rename_initializer(e, "enc")
    assert g.encoded_initializers == {"enc": e} and e.const.header.name == "enc"
    with pytest.raises(IRError, match="already used"):
        g.rename_initializer(w, "enc")
    with pytest.raises(IRError, match="already used"):
        g.rename_initializer(e, "weight")
    g.rename_initializer(w, "weight")  # its own name: a no-op
    assert g.initializers == {"weight": w}
    with pytest.raises(IRError, match="not an initializer"):
        g.rename_initializer(x, "other")
    with pytest.raises(IRError, match="still used"):
        g.remove_initializer(w)
    n.set_input(1, None)
    g.remove_initializer(w)
    assert g.initializers == {} and not w.is_initializer()


def test_an_ir_built_model_with_an_encoded_initializer_verifies_and_decodes() -> None:
    g = Graph("main")
    x = g.add_input(Value("x", _f(4)))
    e = g.add_initializer(Value("e", _f(4)), _encoded())
    y = g.append(Node("", "Add", [x, e], ["y"])).outputs[0]
    y.type = _f(4)
    g.outputs.append(y)
    m = Model(g, opset_imports={"": 23})
    assert of.check(m) == []
    # int8 codes 0..3 at scale 0.5, no zero point (DequantizeLinear semantics)
    np.testing.assert_array_equal(of.decode_value(m, "e"), np.arange(4, dtype=np.float32) * 0.5)


def test_remove_input_refuses_bound_inputs() -> None:
    g = Graph("g")
    s = g.add_input(Value("s", _f(4)))
    x = g.add_input(Value("x", _f(4)))
    out = g.append(Node("", "Add", [x, x], ["next"])).outputs[0]
    g.outputs.append(out)
    g.bindings.append((s, out))
    with pytest.raises(IRError, match="binding"):
        g.remove_input(s)
    with pytest.raises(IRError, match="still used"):
        g.remove_input(x)
    with pytest.raises(IRError, match="not an input"):
        g.remove_input(out)
    assert g.inputs == [s, x]


# -- subgraphs -----------------------------------------------------------------------------


def _if_model() -> tuple[Model, Value, Value, Node, Node]:
    """y = If(c, then: x + w, else: -x) where the branches read outer x and w."""
    g = Graph("main")
    c = g.add_input(Value("c", TensorType(TensorProto.BOOL, ())))
    x = g.add_input(Value("x", _f(3)))
    w = g.add_initializer(Value("w", _f(3)), Tensor.from_numpy(np.array([1, 2, 3], np.float32)))
    then_g, else_g = Graph("then"), Graph("else")
    t = then_g.append(Node("", "Add", [x, w], ["t"]))
    then_g.outputs.append(t.outputs[0])
    e = else_g.append(Node("", "Neg", [x], ["e"]))
    else_g.outputs.append(e.outputs[0])
    node = g.append(Node("", "If", [c], ["y"], name="if0", attributes=[
        Attr("then_branch", AttrType.GRAPH, then_g), Attr("else_branch", AttrType.GRAPH, else_g)]))
    y = node.outputs[0]
    y.type = _f(3)
    g.outputs.append(y)
    return Model(g, opset_imports={"": 23}), x, w, t, e


def test_outer_scope_references_are_uses_of_the_outer_value() -> None:
    m, x, w, t, e = _if_model()
    if_node = next(iter(m.graph))
    assert set(x.uses()) == {(t, 0), (e, 0)} and w.uses() == [(t, 1)]
    then_g, else_g = if_node.subgraphs()
    assert then_g.parent is if_node and else_g.parent is if_node
    assert then_g.path() == "graph.node('if0').attribute['then_branch'].g"
    assert t.graph is then_g and t.outputs[0].graph is then_g
    # replacing the outer value rewrites the branch nodes through def-use alone
    abs_node = m.graph.insert_before(if_node, Node("", "Abs", [None], ["ax"]))
    x2 = abs_node.outputs[0]
    x.replace_all_uses_with(x2)
    abs_node.set_input(0, x)
    assert t.inputs[0] is x2 and e.inputs[0] is x2 and x.uses() == [(abs_node, 0)]
    _check_def_use([m.graph])
    assert of.check(m) == []
    xv = np.array([-1.0, 2.0, -3.0], np.float32)
    w_np = np.array([1, 2, 3], np.float32)
    (yt,) = _run(m, {"c": np.array(True), "x": xv})
    (ye,) = _run(m, {"c": np.array(False), "x": xv})
    np.testing.assert_allclose(yt, np.abs(xv) + w_np)
    np.testing.assert_allclose(ye, -np.abs(xv))


def test_model_all_graphs_includes_subgraphs_of_functions() -> None:
    m, *_ = _if_model()
    fn = Function("local", "F")
    a = fn.add_input(Value("a"))
    body = Graph("loop_body")
    fn.append(Node("", "Loop", [None, None, a], ["out"], attributes=[
        Attr("body", AttrType.GRAPH, body)]))
    m.add_function(fn)
    names = [g.name for g in m.all_graphs()]
    assert names == ["main", "then", "else", "loop_body"]
    assert all(isinstance(g, Graph) for g in m.all_graphs())
    assert m.function("local", "F") is fn and m.function("local", "G") is None
    with pytest.raises(IRError, match="duplicate local function"):
        m.add_function(Function("local", "F"))


# -- aliases and effects ----------------------------------------------------------------------


# -- functions ---------------------------------------------------------------------------------


def test_function_inputs_outputs_and_a_call() -> None:
    fn = Function("local", "AddMul", overload="")
    fn.opset_imports = {"": 23}
    a, b = fn.add_input(Value("a")), fn.add_input(Value("b"))
    s = fn.append(Node("", "Add", [a, b], ["s"])).outputs[0]
    r = fn.append(Node("", "Mul", [s, a], ["r"])).outputs[0]
    fn.outputs.append(r)
    assert fn.id == ("local", "AddMul", "")
    assert a.is_graph_input() and a.graph is fn and not s.is_graph_input()
    assert r.is_graph_output() and not s.is_graph_output()
    assert set(a.uses()) == {(s.producer(), 0), (r.producer(), 1)}
    assert fn.path() == "functions['local::AddMul']"
    _check_def_use([fn])

    g = Graph("main")
    x = g.add_input(Value("x", _f(3)))
    y = g.add_input(Value("y", _f(3)))
    out = g.append(Node("local", "AddMul", [x, y], ["out"])).outputs[0]
    out.type = _f(3)
    g.outputs.append(out)
    m = Model(g, opset_imports={"": 23, "local": 1})
    m.add_function(fn)
    assert of.check(m) == []
    xv = np.array([1.0, -2.0, 3.0], np.float32)
    yv = np.array([4.0, 5.0, -6.0], np.float32)
    (res,) = _run(m, {"x": xv, "y": yv})
    np.testing.assert_allclose(res, (xv + yv) * xv)


def test_mutated_model_still_runs() -> None:
    """Remove and rewire nodes through the IR, then compare with numpy in onnxruntime."""
    g = Graph("main")
    x = g.add_input(Value("x", _f(4)))
    w = g.add_initializer(Value("w", _f(4)), Tensor.from_numpy(np.array([1, 2, 3, 4], np.float32)))
    neg = g.append(Node("", "Neg", [x], ["n"]))
    add = g.append(Node("", "Add", [neg.outputs[0], w], ["y"]))
    add.outputs[0].type = _f(4)
    g.outputs.append(add.outputs[0])
    m = Model(g, opset_imports={"": 23})
    # y = Relu(x) + w: put a Relu in front, move Neg's uses onto it, drop the Neg
    relu = g.insert_after(neg, Node("", "Relu", [x], ["r"]))
    neg.outputs[0].replace_all_uses_with(relu.outputs[0])
    g.remove(neg)
    assert _check_links(g) == [relu, add]
    _check_def_use([g])
    assert of.check(m) == []
    xv = np.array([-1.0, 0.5, -2.0, 3.0], np.float32)
    (res,) = _run(m, {"x": xv})
    np.testing.assert_allclose(res, np.maximum(xv, 0) + np.array([1, 2, 3, 4], np.float32))


def test_a_serialized_tensor_is_parsed_once_and_read_only():
    import numpy as np
    from onnx import numpy_helper

    from onnxforge.graphbuilder.ir.tensors import Tensor
    from onnxforge.proto_ext import convert

    want = np.arange(6, dtype=np.float32).reshape(2, 3)
    proto = numpy_helper.from_array(want, "w")
    proto.ClearField("raw_data")
    proto.float_data.extend(want.reshape(-1).tolist())  # typed fields, as some exporters write
    t = Tensor(proto.data_type, tuple(proto.dims), proto=proto.SerializeToString())
    calls = []
    real = convert.tensor_proto_to_numpy

    def counting(data, *args, **kwargs):
        calls.append(1)
        return real(data, *args, **kwargs)

    convert.tensor_proto_to_numpy = counting
    try:
        first, second = t.numpy(), t.numpy()
    finally:
        convert.tensor_proto_to_numpy = real
    np.testing.assert_array_equal(first, want)
    assert second is first and len(calls) == 1 and not first.flags.writeable
    t.proto = numpy_helper.from_array(want + 1, "w").SerializeToString()  # a new payload is read anew
    np.testing.assert_array_equal(t.numpy(), want + 1)


def test_a_raw_payload_is_viewed_once_and_again_when_it_changes() -> None:
    t = Tensor(TensorProto.INT32, [2], raw=np.array([1, 2], dtype=np.int32).tobytes())
    first = t.numpy()
    assert first.tolist() == [1, 2] and not first.flags.writeable and t.numpy() is first
    t.raw = np.array([5, 6], dtype=np.int32).tobytes()  # a new payload object
    assert t.numpy().tolist() == [5, 6]
    t.dims = (1, 2)  # the same payload, other dims
    assert t.numpy().shape == (1, 2)
    t.dtype = TensorProto.UINT32
    assert t.numpy().dtype == np.uint32


def test_replace_all_uses_without_the_alias_search_rewires_uses_and_outputs() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", TensorType(TensorProto.FLOAT, (2,))))
    a = g.append(Node("", "Neg", [x], [Value("a")])).outputs[0]
    b = g.append(Node("", "Abs", [x], [Value("b")])).outputs[0]
    use = g.append(Node("", "Relu", [a], [Value("c")]))
    g.outputs.extend([a, use.outputs[0]])
    a.replace_all_uses_with(b, aliases=False)
    assert use.inputs[0] is b and g.outputs[0] is b and not a.num_uses()
