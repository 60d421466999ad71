"""Rules N1-N5: initializer names, SSA and scoping, types of graph values."""
from __future__ import annotations

from typing import Any

import pytest
from onnx import AttributeProto, TensorProto, helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check
from tests.proto_ext.helpers import (
    affine_layout,
    category_type,
    constant,
    encoded,
    ext,
    model_with,
    ref_type,
    struct_decl,
    tensor_type,
    value_info,
)

FLOAT, BOOL = TensorProto.FLOAT, TensorProto.BOOL
VEC4 = struct_decl(1, "Vec4", [("v", tensor_type(FLOAT, [4]))])      # 16 bytes per record
PAIR = struct_decl(2, "Pair", [("a", tensor_type(FLOAT, [2]))])       # 8 bytes per record


def node(op: str, inputs: list[str], outputs: list[str], name: str = "", **attrs: Any) -> Any:
    return ext(helper.make_node(op, inputs, outputs, name=name or None, **attrs), "NodeProto")


def graph(name: str, nodes: list[Any], outputs: list[Any], inputs: list[Any] = ()) -> Any:
    g = schema.GraphProto(name=name)
    g.node.extend(nodes)
    g.input.extend(value_info(*i) if isinstance(i, tuple) else i for i in inputs)
    g.output.extend(value_info(*o) if isinstance(o, tuple) else o for o in outputs)
    return g


def if_node(cond: str, outputs: list[str], then_g: Any, else_g: Any, name: str = "if") -> Any:
    n = schema.NodeProto(op_type="If", name=name)
    n.input.append(cond)
    n.output.extend(outputs)
    for attr, g in (("then_branch", then_g), ("else_branch", else_g)):
        a = n.attribute.add(name=attr, type=AttributeProto.GRAPH)
        a.g.CopyFrom(g)
    return n


def f2(dims=(2,)) -> Any:
    return tensor_type(FLOAT, list(dims))


def scalar_init(name: str, value: float = 1.0) -> Any:
    return helper.make_tensor(name, FLOAT, [2], [value, value])


def the_violations(model: Any, rule: str) -> list:
    found = check(model)
    assert {v.rule for v in found} == {rule}, [str(v) for v in found]
    return found


# ----------------------------------------------------------------------------- valid


def test_names_of_a_valid_model_pass():
    then_g = graph("then", [node("Add", ["x", "w"], ["t"])], [("t", f2())])
    else_g = graph("else", [node("Identity", ["x"], ["e"])], [("e", f2())])
    m = model_with(
        struct_types=[VEC4],
        encoded=[encoded("q", type_ref=1, raw_data=bytes(32))],
        inputs=[("x", f2()), ("w", f2()), ("c", tensor_type(BOOL, [])), ("q", ref_type(1))],
        outputs=[("y", f2()), ("z", f2()), ("q_out", ref_type(1))],
        initializers=[scalar_init("w")],                 # an initializer may share an input's name
        nodes=[node("Mul", ["x", "w"], ["y"]),
               if_node("c", ["z"], then_g, else_g),       # branches read outer-scope names
               node("Identity", ["q"], ["q_out"])],
    )
    assert check(m) == []


def test_encoded_initializer_defines_its_name():
    m = model_with(struct_types=[VEC4], encoded=[encoded("q", type_ref=1, raw_data=bytes(16))],
                   outputs=[("q_out", category_type())], nodes=[node("Identity", ["q"], ["q_out"])])
    assert check(m) == []


def test_struct_type_only_values_are_valid_graph_values():
    m = model_with(struct_types=[VEC4],
                   inputs=[("a", ref_type(1)), ("b", category_type())],
                   outputs=[("a2", ref_type(1))],
                   value_infos=[("b2", category_type())],
                   nodes=[node("Identity", ["a"], ["a2"]), node("Identity", ["b"], ["b2"])])
    assert check(m) == []


# -------------------------------------------------------------------------------- N1


def test_n1_encoded_initializer_without_name():
    m = model_with(struct_types=[VEC4], encoded=[encoded("", type_ref=1, raw_data=bytes(16))])
    (v,) = the_violations(m, "N1")
    assert v.path == "graph.encoded_initializer[0]"


# -------------------------------------------------------------------------------- N2


@pytest.mark.parametrize("dense, sparse, enc", [
    (["w"], [], ["w"]),
    (["w", "w"], [], []),
    ([], ["w"], ["w"]),
    ([], [], ["w", "w"]),
])
def test_n2_initializer_names_repeat(dense, sparse, enc):
    m = model_with(struct_types=[VEC4],
                   initializers=[scalar_init(n) for n in dense],
                   encoded=[encoded(n, type_ref=1, raw_data=bytes(16)) for n in enc])
    for n in sparse:
        sp = m.graph.sparse_initializer.add()
        sp.values.CopyFrom(ext(helper.make_tensor(n, FLOAT, [1], [1.0]), "TensorProto"))
        sp.indices.CopyFrom(ext(helper.make_tensor("", TensorProto.INT64, [1], [0]), "TensorProto"))
        sp.dims.extend([2])
    (v,) = the_violations(m, "N2")
    assert "'w'" in v.path and "already used" in v.message


# -------------------------------------------------------------------------------- N3


def test_n3_undefined_node_input():
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())],
                   nodes=[node("Add", ["x", "nowhere"], ["y"], name="add")])
    (v,) = the_violations(m, "N3")
    assert v.path == "graph.node[0]('add').input[1]" and "not defined" in v.message


def test_n3_use_before_definition():
    m = model_with(inputs=[("x", f2())], outputs=[("z", f2())],
                   nodes=[node("Relu", ["y"], ["z"]), node("Relu", ["x"], ["y"])])
    (v,) = the_violations(m, "N3")
    assert v.path == "graph.node[0].input[0]" and "before its definition" in v.message


@pytest.mark.parametrize("second_output", ["y", "x", "w"])
def test_n3_second_definition(second_output):
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())], initializers=[scalar_init("w")],
                   nodes=[node("Relu", ["x"], ["y"]), node("Relu", ["x"], [second_output])])
    (v,) = the_violations(m, "N3")
    assert v.path == "graph.node[1].output[0]" and "already defined" in v.message


def test_n3_duplicate_graph_input():
    m = model_with(inputs=[("x", f2()), ("x", f2())], outputs=[("y", f2())],
                   nodes=[node("Relu", ["x"], ["y"])])
    assert {v.rule for v in check(m)} == {"N3"}


def test_n3_subgraph_shadows_outer_name():
    then_g = graph("then", [node("Relu", ["x"], ["y"])], [("y", f2())])
    else_g = graph("else", [node("Relu", ["x"], ["e"])], [("e", f2())])
    m = model_with(inputs=[("x", f2()), ("c", tensor_type(BOOL, []))], outputs=[("z", f2())],
                   nodes=[node("Relu", ["x"], ["y"]), if_node("c", ["z"], then_g, else_g)])
    (v,) = the_violations(m, "N3")
    assert v.path == "graph.node[1]('if').attribute['then_branch'].g.node[0].output[0]"
    assert "shadows" in v.message


def test_n3_subgraph_sees_only_names_defined_before_its_node():
    then_g = graph("then", [node("Relu", ["late"], ["t"])], [("t", f2())])
    else_g = graph("else", [node("Relu", ["x"], ["e"])], [("e", f2())])
    m = model_with(inputs=[("x", f2()), ("c", tensor_type(BOOL, []))], outputs=[("z", f2())],
                   nodes=[if_node("c", ["z"], then_g, else_g), node("Relu", ["x"], ["late"])])
    (v,) = the_violations(m, "N3")
    assert "then_branch" in v.path and "before its definition" in v.message


def test_n3_graph_output_names_no_value():
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2()), ("ghost", f2())],
                   nodes=[node("Relu", ["x"], ["y"])])
    (v,) = the_violations(m, "N3")
    assert v.path == "graph.output['ghost']"


def test_n3_local_function_body():
    f = schema.FunctionProto(name="f", domain="local")
    f.input.extend(["a"])
    f.output.extend(["b", "missing"])
    f.node.append(node("Relu", ["a"], ["b"]))
    f.node.append(node("Relu", ["zz"], ["c"]))
    f.opset_import.add(domain="", version=23)
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())], functions=[f],
                   nodes=[node("Relu", ["x"], ["y"])])
    found = the_violations(m, "N3")
    assert sorted(v.path for v in found) == ["functions['local::f'].node[1].input[0]",
                                             "functions['local::f'].output[1]"]


# -------------------------------------------------------------------------------- N4


def _n4_model(input_type: Any, enc: Any) -> Any:
    return model_with(struct_types=[VEC4, PAIR], encoded=[enc], inputs=[("w", input_type)],
                      outputs=[("y", category_type())], nodes=[node("Identity", ["w"], ["y"])])


REF_W = encoded("w", type_ref=1, raw_data=bytes(16))
AFFINE_W = encoded("w", affine=affine_layout(TensorProto.INT8, constant(FLOAT, [], [0.5])),
                   logical=tensor_type(FLOAT, [4]), raw_data=bytes(4))


@pytest.mark.parametrize("input_type, enc", [(ref_type(1), REF_W), (category_type(), REF_W),
                                             (category_type(), AFFINE_W),
                                             (tensor_type(FLOAT, [4]), AFFINE_W)])
def test_n4_accepted_types(input_type, enc):
    assert check(_n4_model(input_type, enc)) == []


@pytest.mark.parametrize("input_type, enc, words", [
    (tensor_type(FLOAT, [4]), REF_W, "neither TypeProto.struct_type"),
    (tensor_type(FLOAT, [5]), AFFINE_W, "logical type FLOAT[4]"),
    (ref_type(2), REF_W, "type_ref 1"),
    (ref_type(1), AFFINE_W, "affine layout"),
])
def test_n4_value_named_like_encoded_initializer(input_type, enc, words):
    (v,) = the_violations(_n4_model(input_type, enc), "N4")
    assert v.path == "graph.input['w'].type" and words in v.message


def test_n4_inline_layout_admits_only_a_category():
    inline = struct_decl(None, "", [("v", tensor_type(FLOAT, [4]))])
    enc = encoded("w", struct=inline, raw_data=bytes(16))
    assert check(_n4_model(category_type(), enc)) == []
    (v,) = the_violations(_n4_model(ref_type(1), enc), "N4")
    assert "inline layout" in v.message


# -------------------------------------------------------------------------------- N5


def test_n5_type_with_no_case():
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())], nodes=[node("Relu", ["x"], ["y"])])
    m.graph.input[0].type.Clear()
    m.graph.input[0].type.SetInParent()
    (v,) = the_violations(m, "N5")
    assert v.path == "graph.input['x'].type" and "no recognized case" in v.message


def test_n5_main_graph_output_without_type():
    m = model_with(inputs=[("x", f2())], outputs=[value_info("y")], nodes=[node("Relu", ["x"], ["y"])])
    (v,) = the_violations(m, "N5")
    assert v.path == "graph.output['y'].type"


def test_n5_undefined_element_type():
    m = model_with(inputs=[("x", tensor_type(TensorProto.UNDEFINED, [2]))], outputs=[("y", f2())],
                   nodes=[node("Relu", ["x"], ["y"])])
    (v,) = the_violations(m, "N5")
    assert "UNDEFINED" in v.message


def test_n5_subgraph_outputs_may_be_untyped():
    then_g = graph("then", [node("Relu", ["x"], ["t"])], [value_info("t")])
    else_g = graph("else", [node("Relu", ["x"], ["e"])], [value_info("e")])
    m = model_with(inputs=[("x", f2()), ("c", tensor_type(BOOL, []))], outputs=[("z", f2())],
                   nodes=[if_node("c", ["z"], then_g, else_g)])
    assert check(m) == []


def _if_with_empty_branch_types() -> Any:
    """z = If(c, then: Relu(x), else: Neg(x)) with c a Constant True; both branch
    outputs are declared ``type {}`` (a TypeProto with no value case)."""
    import onnx

    def untyped(name: str) -> Any:
        vi = onnx.ValueInfoProto(name=name)
        vi.type.SetInParent()
        return vi

    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [untyped("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [untyped("e")])
    nodes = [helper.make_node("Constant", [], ["c"],
                              value=helper.make_tensor("cv", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)]
    graph_ = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [3])],
                               [helper.make_tensor_value_info("z", FLOAT, [3])])
    return helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 21)])


def test_n5_if_branch_outputs_with_an_empty_type_are_valid(tmp_path) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    import onnxforge as of

    m = _if_with_empty_branch_types()
    assert m.graph.node[1].attribute[0].g.output[0].HasField("type")
    onnx.checker.check_model(m, full_check=True)
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    of.verify(m)
    of.verify(of.load(m))
    optimized = of.optimize(of.load(m), debug=True)
    of.verify(optimized)
    path = tmp_path / "m.onnx"
    of.save(optimized, path)
    of.verify(str(path))
    of.verify(of.load(str(path)))
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_n5_an_empty_value_info_type_is_valid() -> None:
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())],
                   nodes=[node("Relu", ["x"], ["t"]), node("Relu", ["t"], ["y"])])
    vi = m.graph.value_info.add(name="t")
    vi.type.SetInParent()
    assert check(m) == []


def test_n5_main_graph_output_with_an_empty_type_is_rejected() -> None:
    m = model_with(inputs=[("x", f2())], outputs=[("y", f2())], nodes=[node("Relu", ["x"], ["y"])])
    m.graph.output[0].type.Clear()
    m.graph.output[0].type.SetInParent()
    (v,) = the_violations(m, "N5")
    assert v.path == "graph.output['y'].type" and "no recognized case" in v.message
