"""The ``shapes`` analysis reuses the inference of unchanged nodes from the result an
invalidation dropped, and gives the types a fresh inference gives."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

import onnxforge as of
from onnxforge.graphbuilder.ir.core import READ_WRITE, Attr, AttrType, Model, Node, Value
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.passes import AnalysisManager, PassManager
from onnxforge.proto_ext.types import TensorType

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _chain() -> Model:
    """x[n, 8] -> Relu -> Reshape([n, 2, 4]) -> Transpose(perm) -> Softmax -> y."""
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    x = g.input("x", FLOAT, ["n", 8])
    r = g.op.Relu(x)
    n = g.op.Gather(g.op.Shape(x), g.initializer("zero", np.array([0], np.int64)), axis=0)
    shape = g.op.Concat(n, g.initializer("tail", np.array([2, 4], np.int64)), axis=0)
    t = g.op.Transpose(g.op.Reshape(r, shape), perm=[0, 2, 1])
    g.output(g.op.Softmax(t, axis=-1), "y")
    return g.to_model()


def _manager(m: Model) -> AnalysisManager:
    """A manager that has inferred ``m`` once: the first inference of a model without
    storage records nothing to replay (its passes ask shapes on demand), the later ones do."""
    am = AnalysisManager(m)
    am.get("shapes")
    am.invalidate()
    return am


def test_the_first_inference_records_for_replay_only_in_a_model_with_storage():
    for stateful in (False, True):
        g = of.GraphBuilder(opset=18, infer_shapes=False)
        x = g.input("x", FLOAT, ["n", 8], access=READ_WRITE if stateful else 0)
        g.output(g.op.Relu(g.op.Neg(x)), "y")
        m = g.to_model()
        am = AnalysisManager(m)
        am.get("shapes")
        am.invalidate()
        assert am.get("shapes").replayed == (2 if stateful else 0), stateful
        am.invalidate()
        assert am.get("shapes").replayed == 2  # the second inference recorded


def _types(ctx: ShapesContext, m: Model) -> dict[str, str]:
    return {v.name: str(ctx.type_of(v)) for g in m.all_graphs() for v in g.values()}


def _fresh(m: Model) -> dict[str, str]:
    return _types(ShapesContext(m, write_back=False, strict=False).infer_graph(), m)


def _node(m: Model, op: str):
    return next(n for n in m.graph if n.op_type == op)


def test_unchanged_model_replays_every_node_and_gives_the_fresh_types():
    m = _chain()
    am = _manager(m)
    first = am.get("shapes")
    am.invalidate()
    second = am.get("shapes")
    assert second is not first and second.replayed == len(m.graph)
    assert _types(second, m) == _types(first, m) == _fresh(m)
    assert str(second.type_of(m.graph.outputs[0])) == "FLOAT[n, 4, 2]"


def test_a_changed_attribute_is_inferred_again():
    m = _chain()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    _node(m, "Transpose").attributes["perm"].value = [1, 0, 2]  # edited in place
    ctx = am.get("shapes")
    assert str(ctx.type_of(m.graph.outputs[0])) == "FLOAT[2, n, 4]"
    assert _types(ctx, m) == _fresh(m)
    assert ctx.replayed == len(m.graph) - 2  # Transpose and the Softmax reading it ran again


def test_a_list_attribute_changed_in_place_is_inferred_again():
    m = _chain()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    perm = _node(m, "Transpose").attributes["perm"].value
    perm[:] = [1, 0, 2]  # the very list edited
    ctx = am.get("shapes")
    assert str(ctx.type_of(m.graph.outputs[0])) == "FLOAT[2, n, 4]"
    assert ctx.replayed == len(m.graph) - 2


def test_a_replay_of_the_same_objects_builds_no_key(monkeypatch):
    """Nodes that read the very objects they read last time replay without a key; a node
    reading a new value, or a type made again (a graph input's is seeded in each context,
    a rule that ran made a new one), builds one."""
    import onnxforge.graphbuilder.shapes.replay as replay

    m = _chain()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    keyed = []
    record_key = replay.record_key
    monkeypatch.setattr(replay, "record_key", lambda ctx, node: keyed.append(node.op_type) or record_key(ctx, node))
    ctx = am.get("shapes")
    assert keyed == ["Relu", "Shape"] and ctx.replayed == len(m.graph)  # the readers of x
    am.invalidate()
    keyed.clear()
    relu = _node(m, "Relu")
    fresh = Value("x2", TensorType(FLOAT, ("n", 8)))
    m.graph.inputs.append(fresh)
    relu.set_input(0, fresh)
    ctx = am.get("shapes")
    # Relu reads a new value of the same type: its key finds its record, whose results
    # are the objects the Reshape read, so the Reshape replays without a key
    assert keyed == ["Relu", "Shape"] and ctx.replayed == len(m.graph)
    assert _types(ctx, m) == _fresh(m)


def test_a_new_input_value_is_inferred_again_and_so_is_what_reads_it():
    m = _chain()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    # the Reshape target becomes the constant [-1, 4, 2]
    reshape = _node(m, "Reshape")
    c = Value("target", TensorType(INT64, (3,)))
    m.graph.add_initializer(c, Tensor.from_numpy(np.array([-1, 4, 2], np.int64)))
    reshape.set_input(1, c)
    ctx = am.get("shapes")
    assert str(ctx.type_of(m.graph.outputs[0])) == "FLOAT[n, 2, 4]"
    assert _types(ctx, m) == _fresh(m)


def test_a_changed_declared_output_type_is_read_again():
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    x = g.input("x", FLOAT, [None, 8])
    y = g.output(g.op.Relu(x), "y")
    m = g.to_model()
    am = _manager(m)
    assert str(am.get("shapes").type_of(y)) == "FLOAT[?, 8]"
    am.invalidate()
    y.type = TensorType(FLOAT, (3, 8))  # a declared (value_info) type learned meanwhile
    ctx = am.get("shapes")
    assert str(ctx.type_of(y)) == "FLOAT[3, 8]" and ctx.replayed == 0


def test_control_flow_runs_again_but_its_bodies_replay():
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    x = g.input("x", FLOAT, ["n", 3])
    c = g.input("c", TensorProto.BOOL, [])
    then_b = g.subgraph("then")
    then_b.output(then_b.op.Relu(x), "t")
    else_b = g.subgraph("else")
    else_b.output(else_b.op.Neg(x), "e")
    out = g.op.If(c, then_branch=then_b.graph, else_branch=else_b.graph)
    g.output(out, "y")
    m = g.to_model()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    ctx = am.get("shapes")
    assert ctx.replayed == 2  # Relu and Neg; the If itself ran
    assert _types(ctx, m) == _fresh(m)
    assert str(ctx.type_of(m.graph.outputs[0])) == "FLOAT[n, 3]"


def test_fresh_symbols_after_a_replay_are_new():
    # Expand to a shape read from a tensor: an unknown but fixed dimension gets a fresh symbol
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    x = g.input("x", FLOAT, ["n", 1])
    s = g.input("s", INT64, [2])
    y = g.output(g.op.Expand(x, s), "y")
    z = g.output(g.op.Expand(x, s), "z")
    m = g.to_model()
    am = _manager(m)
    first = am.get("shapes")
    am.invalidate()
    second = am.get("shapes")
    assert second.replayed == 2 and str(second.type_of(y)) == str(first.type_of(y))
    made = second.fresh_symbol()
    assert all(str(made) not in str(first.type_of(v)) for v in (y, z))


def test_a_debug_pipeline_keeps_no_dropped_result():
    for debug in (True, False):
        m = _chain()
        m.graph.outputs[0].type = TensorType(FLOAT, ("n", 4, 2))
        pm = PassManager(["shape_folding", "dce"], debug=debug)
        assert pm(m).modified  # the shape arithmetic is rewritten
        assert (pm.analyses.dropped("shapes", m) is None) is debug


def _rebuild(m: Model, op: str) -> None:
    """Replace the ``op`` node by a new node object reading the same (as rewrites do)."""
    old = _node(m, op)
    name, old.outputs[0].name = old.outputs[0].name, ""
    new = Node(old.domain, old.op_type, list(old.inputs), [name], name=old.name,
               attributes=dict(old.attributes))
    m.graph.insert_before(old, new)
    old.outputs[0].replace_all_uses_with(new.outputs[0], outputs=True)
    m.graph.remove(old)


def test_a_rebuilt_node_that_reads_the_same_replays_the_record_of_the_old_one():
    m = _chain()
    am = _manager(m)
    am.get("shapes")
    am.invalidate()
    _rebuild(m, "Transpose")
    ctx = am.get("shapes")
    assert ctx.replayed == len(m.graph)
    assert _types(ctx, m) == _fresh(m)


def test_a_record_that_made_fresh_symbols_serves_only_its_own_node():
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    x = g.input("x", FLOAT, [6])
    y = g.output(g.op.NonZero(x, _name="nz"), "y")  # [1, _nz0]: a count known at run time only
    m = g.to_model()
    am = _manager(m)
    before = str(am.get("shapes").type_of(y))
    am.invalidate()
    assert am.get("shapes").replayed == 1  # the same node: its dimension stays its own
    am.invalidate()
    _rebuild(m, "NonZero")
    ctx = am.get("shapes")
    after = str(ctx.type_of(m.graph.outputs[0]))
    assert ctx.replayed == 0 and after != before and after.startswith("INT64[1, _")


def test_a_constant_whose_float_value_changes_sign_is_inferred_again():
    g = of.GraphBuilder(opset=18, infer_shapes=False)
    c = g.constant(np.array(0.0, np.float32))
    node = c.producer()
    y = g.output(g.op.Div(g.initializer("one", np.array(1.0, np.float32)), c), "y")
    m = g.to_model()
    node.attributes.clear()
    node.attributes["value_float"] = Attr("value_float", AttrType.FLOAT, 0.0)
    am = _manager(m)
    assert am.get("shapes").value_of(c).flat() == [0.0]
    am.invalidate()
    node.attributes["value_float"].value = -0.0  # equal to 0.0, but another constant
    ctx = am.get("shapes")
    assert str(ctx.value_of(c).flat()[0]) == "-0.0" and ctx.replayed < len(m.graph)
    assert str(ctx.type_of(y)) == "FLOAT[]"
