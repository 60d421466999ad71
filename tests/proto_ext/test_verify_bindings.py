"""Rules B1-B5: persistent bindings."""
from __future__ import annotations

from typing import Any

import pytest
from onnx import AttributeProto, TensorProto, helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check
from tests.proto_ext.helpers import (
    category_type,
    constant,
    ext,
    model_with,
    ref_type,
    struct_decl,
    tensor_type,
    value_info,
)

FLOAT, STRING = TensorProto.FLOAT, TensorProto.STRING
# struct Cache {keys: FLOAT[2, 8]; length: INT64[]}
CACHE = struct_decl(1, "Cache", [("keys", tensor_type(FLOAT, [2, 8])),
                                 ("length", tensor_type(TensorProto.INT64, []))])
OTHER = struct_decl(2, "Other", [("keys", tensor_type(FLOAT, [2, 8]))])
# struct Tagged {tag: STRING[]} and a struct that holds it through a reference
TAGGED = struct_decl(3, "Tagged", [("tag", tensor_type(STRING, []))])
HOLDER = struct_decl(4, "Holder", [("inner", ref_type(3))])
LABELLED = struct_decl(5, "Labelled", [("v", tensor_type(FLOAT, [2])),
                                       ("label", constant(STRING, [1], [b"k"]))])


def node(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> Any:
    return ext(helper.make_node(op, inputs, outputs, **attrs), "NodeProto")


def passthrough(pairs: list[tuple[str, str, Any]], bindings: list[tuple[str, str]],
                struct_types: list[Any] = (CACHE, OTHER)) -> Any:
    """A model whose inputs flow through Identity nodes to outputs: (input, output, type)."""
    return model_with(struct_types=list(struct_types),
                      inputs=[(i, t) for i, _o, t in pairs],
                      outputs=[(o, t) for _i, o, t in pairs],
                      nodes=[node("Identity", [i], [o]) for i, o, _t in pairs],
                      bindings=bindings)


def only(model: Any, rule: str) -> list:
    found = check(model)
    assert {v.rule for v in found} == {rule}, [str(v) for v in found]
    return found


# ----------------------------------------------------------------------------- valid


def test_two_values_of_one_struct_type_with_different_bindings():
    m = passthrough([("a", "a_next", ref_type(1)), ("b", "b_next", ref_type(1)),
                     ("tokens", "logits", tensor_type(FLOAT, [2]))],
                    [("a", "a_next"), ("b", "b_next")])
    assert check(m) == []


def test_concat_cache_symbolic_dims_may_differ():
    m = model_with(inputs=[("past", tensor_type(FLOAT, [1, "past", 4])),
                           ("new", tensor_type(FLOAT, [1, "seq", 4]))],
                   outputs=[("present", tensor_type(FLOAT, [1, "total", 4]))],
                   nodes=[node("Concat", ["past", "new"], ["present"], axis=1)],
                   bindings=[("past", "present")])
    assert check(m) == []


def test_dotted_and_backslash_names_are_literal():
    m = passthrough([("past.0.key", "present.0.key", tensor_type(FLOAT, [2])),
                     ("a\\b", "c\\d", tensor_type(FLOAT, [2]))],
                    [("past.0.key", "present.0.key"), ("a\\b", "c\\d")])
    assert check(m) == []


# -------------------------------------------------------------------------------- B1


def test_b1_binding_in_a_subgraph():
    branch = schema.GraphProto(name="then")
    branch.node.append(node("Identity", ["x"], ["t"]))
    branch.output.append(value_info("t", tensor_type(FLOAT, [2])))
    branch.persistent_bindings.add(input_name="x", output_name="t")
    other = schema.GraphProto(name="else")
    other.node.append(node("Identity", ["x"], ["e"]))
    other.output.append(value_info("e", tensor_type(FLOAT, [2])))
    n = schema.NodeProto(op_type="If", name="if", input=["c"], output=["y"])
    for attr, g in (("then_branch", branch), ("else_branch", other)):
        a = n.attribute.add(name=attr, type=AttributeProto.GRAPH)
        a.g.CopyFrom(g)
    m = model_with(inputs=[("x", tensor_type(FLOAT, [2])), ("c", tensor_type(TensorProto.BOOL, []))],
                   outputs=[("y", tensor_type(FLOAT, [2]))], nodes=[n])
    (v,) = only(m, "B1")
    assert v.path == "graph.node[0]('if').attribute['then_branch'].g.persistent_bindings[0]"


# -------------------------------------------------------------------------------- B2


@pytest.mark.parametrize("binding, path", [
    (("nope", "y"), "graph.persistent_bindings[0].input_name"),
    (("x", "nope"), "graph.persistent_bindings[0].output_name"),
    (("y", "x"), None),  # swapped: an output is not an input and vice versa
])
def test_b2_ends_must_be_main_graph_names(binding, path):
    m = passthrough([("x", "y", tensor_type(FLOAT, [2]))], [binding])
    found = only(m, "B2")
    if path is not None:
        assert [v.path for v in found] == [path]
    else:
        assert len(found) == 2


def test_b2_field_paths_are_not_names():
    m = passthrough([("cache", "next_cache", ref_type(1))], [("cache.keys", "next_cache")])
    (v,) = only(m, "B2")
    assert "field paths are not supported" in v.message


# -------------------------------------------------------------------------------- B3


@pytest.mark.parametrize("bindings, end", [
    ([("a", "a_next"), ("a", "b_next")], "input_name"),
    ([("a", "a_next"), ("b", "a_next")], "output_name"),
])
def test_b3_an_end_occurs_twice(bindings, end):
    m = passthrough([("a", "a_next", ref_type(1)), ("b", "b_next", ref_type(1))], bindings)
    (v,) = only(m, "B3")
    assert v.path == f"graph.persistent_bindings[1].{end}"


# -------------------------------------------------------------------------------- B4


@pytest.mark.parametrize("tin, tout, words", [
    (tensor_type(FLOAT, [2, 3]), tensor_type(FLOAT, [2, 4]), "dimension 1: 3 vs 4"),
    (tensor_type(FLOAT, [2]), tensor_type(TensorProto.FLOAT16, [2]), "element type"),
    (tensor_type(FLOAT, [2]), tensor_type(FLOAT, [2, 1]), "rank 1 vs 2"),
    (ref_type(1), ref_type(2), "type_ref 1 vs 2"),
    (ref_type(1), category_type(), "type_ref 1 vs a category"),
])
def test_b4_ends_must_be_compatible(tin, tout, words):
    m = model_with(struct_types=[CACHE, OTHER], inputs=[("x", tin)], outputs=[("y", tout)],
                   nodes=[node("Identity", ["x"], ["y"])], bindings=[("x", "y")])
    (v,) = only(m, "B4")
    assert v.path == "graph.persistent_bindings[0]" and words in v.message


# -------------------------------------------------------------------------------- B5


@pytest.mark.parametrize("ty, types", [
    (tensor_type(STRING, [2]), []),
    (ref_type(4), [TAGGED, HOLDER]),  # STRING two references deep
    (ref_type(5), [LABELLED]),        # a STRING constant field
])
def test_b5_no_string_at_any_depth(ty, types):
    m = passthrough([("s", "s_next", ty)], [("s", "s_next")], struct_types=types)
    found = only(m, "B5")
    assert sorted(v.path for v in found) == ["graph.persistent_bindings[0].input_name",
                                            "graph.persistent_bindings[0].output_name"]


def test_b5_unbound_string_values_are_fine():
    m = passthrough([("s", "s_next", tensor_type(STRING, [2])), ("x", "y", tensor_type(FLOAT, [2]))],
                    [("x", "y")])
    assert check(m) == []
