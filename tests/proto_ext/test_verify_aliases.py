"""Rules L1-L12: output_alias, alias_of, access, control flow, local functions, CacheUpdate."""
from __future__ import annotations

from typing import Any

import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check
from tests.proto_ext.helpers import ext, model_with, tensor_type, value_info

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RW, MUST = schema.READ_WRITE, schema.MUST_ALIAS
CACHE = [2, 16, 8]


def node(op: str, inputs: list[str], outputs: list[str], *, name: str = "", domain: str = "",
         alias: list[tuple[int, int, int]] = (), **attrs: Any) -> Any:
    n = ext(helper.make_node(op, inputs, outputs, name=name or None, domain=domain or None, **attrs),
            "NodeProto")
    for o, i, kind in alias:
        n.output_alias.add(output_index=o, input_index=i, kind=kind)
    return n


vi = value_info  # name, type, and the alias fields


def t(*dims: Any, elem: int = FLOAT) -> Any:
    return tensor_type(elem, list(dims))


def inplace(x: str, y: str, **kw: Any) -> Any:
    """A custom in-place node ``y = test.Inplace(x)`` with output_alias {0, 0, MUST_ALIAS}."""
    kw.setdefault("alias", [(0, 0, MUST)])
    return node("Inplace", [x], [y], domain="test", **kw)


def model(**kw: Any) -> Any:
    m = model_with(**kw)
    for domain in ("ai.onnxforge", "test"):
        m.opset_import.add(domain=domain, version=1)
    return m


def cache_update(cache: str = "cache", out: str = "updated_cache", *, name: str = "upd",
                 values: str = "values", position: str = "position", **kw: Any) -> Any:
    kw.setdefault("alias", [(0, 0, MUST)])
    return node("CacheUpdate", [cache, values, position], [out], name=name, domain="ai.onnxforge", **kw)


def stateful_model() -> Any:
    """cache (READ_WRITE) -> CacheUpdate -> updated_cache (alias_of cache), bound back to cache."""
    return model(
        inputs=[vi("cache", t(*CACHE), access=RW), vi("values", t(2, "n", 8)), vi("position", t(elem=INT64))],
        outputs=[vi("updated_cache", t(*CACHE), alias_of="cache")],
        nodes=[cache_update()],
        bindings=[("cache", "updated_cache")],
    )


def inplace_model(**over: Any) -> Any:
    """x (READ_WRITE) -> test.Inplace -> y (alias_of x)."""
    kw = dict(inputs=[vi("x", t(4), access=RW)], outputs=[vi("y", t(4), alias_of="x")],
              nodes=[inplace("x", "y", name="ip")])
    kw.update(over)
    return model(**kw)


def subgraph(name: str, nodes: list[Any], outputs: list[Any], inputs: list[Any] = ()) -> Any:
    g = schema.GraphProto(name=name)
    g.node.extend(nodes)
    g.input.extend(inputs)
    g.output.extend(outputs)
    return g


def control(op: str, inputs: list[str], outputs: list[str], branches: dict[str, Any], *,
            name: str = "cf", alias: list[tuple[int, int, int]] = ()) -> Any:
    n = schema.NodeProto(op_type=op, name=name, input=inputs, output=outputs)
    for attr, g in branches.items():
        a = n.attribute.add(name=attr, type=AttributeProto.GRAPH)
        a.g.CopyFrom(g)
    for o, i, kind in alias:
        n.output_alias.add(output_index=o, input_index=i, kind=kind)
    return n


def branch(name: str, root: str | None, out: str) -> Any:
    """An If branch updating ``root`` in place (alias_of root), or computing afresh (None)."""
    if root is None:
        return subgraph(name, [node("Relu", ["values"], [out])], [vi(out, t(*CACHE))])
    return subgraph(name, [cache_update(root, out, name=f"{name}_upd")],
                    [vi(out, t(*CACHE), alias_of=root)])


def if_model(then_root: str | None, else_root: str | None, *, y_alias: str = "cache") -> Any:
    return model(
        inputs=[vi("c", t(elem=BOOL)), vi("cache", t(*CACHE), access=RW), vi("other", t(*CACHE), access=RW),
                vi("values", t(*CACHE)), vi("position", t(elem=INT64))],
        outputs=[vi("y", t(*CACHE), alias_of=y_alias)],
        nodes=[control("If", ["c"], ["y"], {"then_branch": branch("then", then_root, "t_out"),
                                            "else_branch": branch("else", else_root, "e_out")},
                       name="if")],
    )


def function(*, formal_access: int = RW, out_alias: bool = True, port: bool = True,
             name: str = "step") -> Any:
    """local.step(c, v, p) -> o: a CacheUpdate of its formal input c (``port=False``: a Relu)."""
    f = schema.FunctionProto(name=name, domain="local")
    f.input.extend(["c", "v", "p"])
    f.output.append("o")
    if port:
        f.node.append(cache_update("c", "o", name="body", values="v", position="p"))
    else:
        f.node.append(node("Relu", ["c"], ["o"], name="body"))
    f.value_info.append(vi("c", t(*CACHE), access=formal_access))
    f.value_info.append(vi("o", t(*CACHE), alias_of="c" if out_alias else ""))
    f.opset_import.add(domain="ai.onnxforge", version=1)
    return f


def call_model(f: Any = None, *, alias: list[tuple[int, int, int]] = ((0, 0, MUST),),
               cache_access: int = RW, y_alias: str = "cache", args: tuple[str, ...] = ("cache",)) -> Any:
    m = model(
        inputs=[vi("cache", t(*CACHE), access=cache_access), vi("cache2", t(*CACHE), access=RW),
                vi("values", t(2, 3, 8)), vi("position", t(elem=INT64))],
        outputs=[vi("y", t(*CACHE), alias_of=y_alias)],
        nodes=[node("step", [*args, "values", "position"], ["y"], name="call", domain="local",
                    alias=list(alias))],
        functions=[f if f is not None else function()],
    )
    m.opset_import.add(domain="local", version=1)
    return m


def only(m: Any, rule: str) -> list:
    found = check(m)
    assert {v.rule for v in found} == {rule}, [str(v) for v in found]
    return found


# ----------------------------------------------------------------------------- valid


def test_stateful_cache_model_is_valid():
    assert check(stateful_model()) == []


def test_stateful_model_survives_stock_onnx_save_and_load(tmp_path):
    m = stateful_model()
    data = m.SerializeToString()
    path = tmp_path / "stateful.onnx"
    onnx.save(schema.to_onnx(m), str(path))
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == data
    back = schema.from_onnx(loaded)
    assert back.graph.output[0].alias_of == "cache" and back.graph.input[0].access == RW
    assert list(back.graph.node[0].output_alias) == list(m.graph.node[0].output_alias)
    assert check(back) == []


def test_model_without_struct_values_passes_the_stock_checker():
    stock = schema.to_onnx(stateful_model())
    onnx.checker.check_model(stock, full_check=True)
    assert {o.domain: o.version for o in stock.opset_import}["ai.onnxforge"] == 1


def test_local_function_with_read_write_formal_input_is_valid():
    assert check(call_model()) == []


def test_if_whose_branches_alias_the_same_root_is_valid():
    m = if_model("cache", "cache")
    m.graph.persistent_bindings.add(input_name="cache", output_name="y")
    assert check(m) == []


def test_loop_carried_cache_resolves_through_the_body():
    body = subgraph(
        "body",
        [node("Identity", ["cond_in"], ["cond_out"]),
         cache_update("cache_in", "cache_out", name="body_upd")],
        [vi("cond_out", t(elem=BOOL)), vi("cache_out", t(*CACHE), alias_of="cache_in")],
        [vi("i", t(elem=INT64)), vi("cond_in", t(elem=BOOL)), vi("cache_in", t(*CACHE))],
    )
    m = model(
        inputs=[vi("n", t(elem=INT64)), vi("cache", t(*CACHE), access=RW),
                vi("values", t(2, 1, 8)), vi("position", t(elem=INT64))],
        outputs=[vi("y", t(*CACHE), alias_of="cache")],
        nodes=[control("Loop", ["n", "", "cache"], ["y"], {"body": body}, name="loop",
                       alias=[(0, 2, MUST)])],
    )
    assert check(m) == []


def scan_model(*, body_aliases: bool) -> Any:
    """Scan over xs with the cache as its state variable, updated in place by the body."""
    update = (cache_update("c_in", "c_out", name="body_upd") if body_aliases
              else node("Relu", ["c_in"], ["c_out"]))
    body = subgraph(
        "body", [update, node("Identity", ["x"], ["x_out"])],
        [vi("c_out", t(*CACHE), alias_of="c_in" if body_aliases else ""), vi("x_out", t(2))],
        [vi("c_in", t(*CACHE)), vi("x", t(2))],
    )
    cf = control("Scan", ["cache", "xs"], ["y", "ys"], {"body": body}, name="scan", alias=[(0, 0, MUST)])
    cf.attribute.append(ext(helper.make_attribute("num_scan_inputs", 1), "AttributeProto"))
    return model(
        inputs=[vi("cache", t(*CACHE), access=RW), vi("xs", t(3, 2)),
                vi("values", t(2, 1, 8)), vi("position", t(elem=INT64))],
        outputs=[vi("y", t(*CACHE), alias_of="cache"), vi("ys", t(3, 2))],
        nodes=[cf],
    )


def test_scan_state_cache_resolves_through_the_body():
    assert check(scan_model(body_aliases=True)) == []


def test_l10_scan_body_must_alias_the_state_it_returns():
    (v,) = only(scan_model(body_aliases=False), "L10")
    assert v.path == "graph.node[0]('scan').output[0]" and "aliases nothing" in v.message


def test_alias_chain_through_two_nodes_is_valid():
    m = model(inputs=[vi("x", t(4), access=RW)],
              outputs=[vi("z", t(4), alias_of="y")],
              nodes=[inplace("x", "y"), inplace("y", "z")])
    assert check(m) == []


# -------------------------------------------------------------------------------- L1


@pytest.mark.parametrize("alias, words", [
    ([(5, 0, MUST)], "output_index 5 is out of range"),
    ([(0, -1, MUST)], "input_index -1 is out of range"),
    ([(0, 0, 0)], "not MUST_ALIAS"),
    ([(0, 0, MUST), (0, 0, MUST)], "output_index 0 repeats"),
])
def test_l1_malformed_output_alias(alias, words):
    m = inplace_model(nodes=[inplace("x", "y", name="ip", alias=alias)])
    found = only(m, "L1")
    assert any(words in v.message for v in found)
    assert found[-1].path.startswith("graph.node[0]('ip').output_alias[")


def test_l1_aliased_port_must_not_be_empty():
    m = inplace_model(nodes=[node("Inplace2", ["x", ""], ["y"], name="ip", domain="test",
                                  alias=[(0, 1, MUST)])])
    (v,) = only(m, "L1")
    assert "input 1 is empty" in v.message


# -------------------------------------------------------------------------------- L2


def test_l2_alias_of_on_a_graph_input():
    m = inplace_model(inputs=[vi("x", t(4), access=RW), vi("x2", t(4), alias_of="x")])
    (v,) = only(m, "L2")
    assert v.path == "graph.input['x2'].alias_of"


@pytest.mark.parametrize("target, words", [("ghost", "names no value"), ("r", "names itself")])
def test_l2_alias_of_names_another_visible_value(target, words):
    m = model(inputs=[vi("x", t(4), access=RW)], outputs=[vi("r", t(4), alias_of=target)],
              nodes=[node("Relu", ["x"], ["r"])])
    (v,) = only(m, "L2")
    assert v.path == "graph.output['r'].alias_of" and words in v.message


def test_l2_alias_of_on_an_initializer():
    m = inplace_model(initializers=[helper.make_tensor("w", FLOAT, [4], [0.0] * 4)],
                      value_infos=[vi("w", t(4), alias_of="x")])
    (v,) = only(m, "L2")
    assert v.path == "graph.value_info['w'].alias_of"


def test_l2_sibling_branch_value_is_not_visible():
    m = if_model("cache", "cache")
    else_g = m.graph.node[0].attribute[1].g
    else_g.node.append(node("Relu", ["values"], ["r"]))
    else_g.value_info.append(vi("r", t(*CACHE), alias_of="t_out"))  # a then-branch name
    (v,) = only(m, "L2")
    assert "else_branch" in v.path and "'t_out' names no value visible" in v.message


# -------------------------------------------------------------------------------- L3


def test_l3_output_alias_and_alias_of_disagree():
    m = inplace_model(inputs=[vi("x", t(4), access=RW), vi("x2", t(4), access=RW)],
                      outputs=[vi("y", t(4), alias_of="x2")])
    (v,) = only(m, "L3")
    assert v.path == "graph.output['y'].alias_of" and "output_alias[0]" in v.message


# -------------------------------------------------------------------------------- L4


def test_l4_graph_output_from_must_alias_port_without_alias_of():
    m = inplace_model(outputs=[vi("y", t(4))])
    (v,) = only(m, "L4")
    assert v.path == "graph.output['y']"


def test_l4_function_output_from_must_alias_port_without_alias_of():
    (v,) = only(call_model(function(out_alias=False)), "L4")
    assert v.path == "functions['local::step'].output['o']"


# -------------------------------------------------------------------------------- L5


def test_l5_alias_cycle():
    m = model(inputs=[vi("x", t(4), access=RW)], outputs=[vi("b", t(4))],
              value_infos=[vi("a", t(4), alias_of="b"), vi("b", t(4), alias_of="a")],
              nodes=[node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"])])
    (v,) = only(m, "L5")
    assert "'a' -> 'b' -> 'a'" in v.message or "'b' -> 'a' -> 'b'" in v.message


# -------------------------------------------------------------------------------- L6


@pytest.mark.parametrize("y_type", [t(5), t(4, elem=TensorProto.FLOAT16), t(4, 1)])
def test_l6_aliased_output_incompatible_with_its_input(y_type):
    (v,) = only(inplace_model(outputs=[vi("y", y_type, alias_of="x")]), "L6")
    assert v.path == "graph.node[0]('ip').output_alias[0]"


def test_l6_symbolic_dims_may_differ():
    m = inplace_model(inputs=[vi("x", t("a"), access=RW)], outputs=[vi("y", t("b"), alias_of="x")])
    assert check(m) == []


# -------------------------------------------------------------------------------- L7


def test_l7_chain_ends_at_an_initializer():
    m = inplace_model(inputs=[], initializers=[helper.make_tensor("x", FLOAT, [4], [0.0] * 4)],
                      value_infos=[vi("x", t(4))])
    (v,) = only(m, "L7")
    assert v.path == "graph.node[0]('ip').output_alias[0]" and "initializer 'x'" in v.message


def test_l7_chain_ends_at_a_constant():
    m = inplace_model(inputs=[], value_infos=[vi("x", t(4))],
                      nodes=[node("Constant", [], ["x"], value_floats=[0.0] * 4),
                             inplace("x", "y", name="ip")])
    (v,) = only(m, "L7")
    assert "Constant node" in v.message


def test_l7_chain_ends_at_a_plain_node_output():
    m = model(inputs=[vi("a", t(4))], outputs=[vi("z", t(4), alias_of="y")],
              value_infos=[vi("x", t(4)), vi("y", t(4), alias_of="x")],
              nodes=[node("Relu", ["a"], ["x"]), inplace("x", "y"), inplace("y", "z")])
    (v,) = only(m, "L7")  # one report for the root, not one per link
    assert "plain output" in v.message


def test_l7_chain_ends_at_a_read_only_input():
    (v,) = only(inplace_model(inputs=[vi("x", t(4))]), "L7")
    assert "READ_ONLY main-graph input 'x'" in v.message


def test_l7_function_output_aliases_a_read_only_formal():
    found = only(call_model(function(formal_access=0)), "L7")
    assert [v.path for v in found] == ["functions['local::step'].node[0]('body').output_alias[0]"]


# -------------------------------------------------------------------------------- L8


def test_l8_read_write_on_a_graph_output():
    (v,) = only(inplace_model(outputs=[vi("y", t(4), alias_of="x", access=RW)]), "L8")
    assert v.path == "graph.output['y'].access"


def test_l8_read_write_input_named_like_an_initializer():
    m = model(inputs=[vi("w", t(4), access=RW)], outputs=[vi("y", t(4))],
              initializers=[helper.make_tensor("w", FLOAT, [4], [0.0] * 4)],
              nodes=[node("Relu", ["w"], ["y"])])
    (v,) = only(m, "L8")
    assert v.path == "graph.input['w'].access" and "initializer" in v.message


def test_l8_read_write_on_a_subgraph_input():
    body = subgraph("body", [node("Identity", ["cond_in"], ["cond_out"]), node("Relu", ["s_in"], ["s_out"])],
                    [vi("cond_out", t(elem=BOOL)), vi("s_out", t(4))],
                    [vi("i", t(elem=INT64)), vi("cond_in", t(elem=BOOL)), vi("s_in", t(4), access=RW)])
    m = model(inputs=[vi("n", t(elem=INT64)), vi("s", t(4))], outputs=[vi("y", t(4))],
              nodes=[control("Loop", ["n", "", "s"], ["y"], {"body": body}, name="loop")])
    (v,) = only(m, "L8")
    assert v.path == "graph.node[0]('loop').attribute['body'].g.input['s_in'].access"


def test_l8_read_write_on_a_function_value_that_is_not_a_formal_input():
    f = function()
    f.value_info.append(vi("tmp", t(*CACHE), access=RW))
    (v,) = only(call_model(f), "L8")
    assert v.path == "functions['local::step'].value_info['tmp'].access"


# -------------------------------------------------------------------------------- L9


def test_l9_two_must_alias_ports_on_one_value():
    m = inplace_model(nodes=[inplace("x", "y", name="a"), inplace("x", "y2", name="b")])
    (v,) = only(m, "L9")
    assert v.path == "graph.node[1]('b').output_alias[0]" and "graph.node[0]('a')" in v.message


def test_l9_branches_are_separate_graphs():
    assert check(if_model("cache", "cache")) == []


# ------------------------------------------------------------------------------- L10


@pytest.mark.parametrize("then_root, else_root, y_alias", [
    ("cache", "other", "cache"),    # branches disagree
    ("cache", None, "cache"),       # one branch computes afresh
    ("other", "other", "cache"),    # branches agree, the If output claims another root
])
def test_l10_control_flow_output_resolves_to_one_root(then_root, else_root, y_alias):
    (v,) = only(if_model(then_root, else_root, y_alias=y_alias), "L10")
    assert v.path == "graph.node[0]('if').output[0]"


def test_l10_no_branch_aliases_is_an_ordinary_output():
    m = if_model(None, None)
    m.graph.output[0].alias_of = ""
    assert check(m) == []


# ------------------------------------------------------------------------------- L11


def test_l11_call_misses_the_function_alias():
    (v,) = only(call_model(alias=[]), "L11")
    assert v.path == "graph.node[0]('call').output_alias" and "output 0 aliases its input 0" in v.message


def test_l11_call_aliases_another_input_than_the_function():
    m = call_model(alias=[(0, 1, MUST)], y_alias="values", args=("cache",))
    m.graph.input[2].type.CopyFrom(t(*CACHE))            # values: same type as the cache
    m.graph.input[2].access = RW
    found = only(m, "L11")
    assert [v.path for v in found] == ["graph.node[0]('call').output_alias[0]"]


def test_l11_call_claims_an_alias_the_function_does_not_have():
    f = function(out_alias=False, port=False)
    (v,) = only(call_model(f, y_alias="cache"), "L11")
    assert "aliases no input" in v.message


def test_l11_read_write_formal_needs_a_read_write_argument():
    f = function(out_alias=False, port=False)
    m = call_model(f, alias=[], cache_access=0)
    m.graph.output[0].alias_of = ""
    (v,) = only(m, "L11")
    assert v.path == "graph.node[0]('call').input[0]" and "READ_ONLY main-graph input" in v.message


# ------------------------------------------------------------------------------- L12


def _with_types(cache: Any = None, values: Any = None, position: Any = None) -> Any:
    m = stateful_model()
    for i, tp in enumerate((cache, values, position)):
        if tp is not None:
            m.graph.input[i].type.CopyFrom(tp)
    if cache is not None:
        m.graph.output[0].type.CopyFrom(cache)
    return m


@pytest.mark.parametrize("cache, values, position, words", [
    (t(2, 16, 8, elem=TensorProto.INT32), t(2, 1, 8, elem=TensorProto.INT32), None, "T must be"),
    (None, t(2, 1, 8, elem=TensorProto.FLOAT16), None, "element type"),
    (None, t(2, 8), None, "differ in rank"),
    (None, t(2, 1, 4), None, "values dimension 2 is 4"),
    (None, None, t(elem=TensorProto.INT32), "position"),
    (None, None, t(2, 1, elem=INT64), "position"),
])
def test_l12_cache_update_types(cache, values, position, words):
    found = only(_with_types(cache, values, position), "L12")
    assert any(words in v.message for v in found)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8,
                                  TensorProto.UINT8])
def test_l12_allowed_element_types(elem):
    assert check(_with_types(t(*CACHE, elem=elem), t(2, 3, 8, elem=elem))) == []


def test_l12_position_may_be_per_batch():
    assert check(_with_types(position=t("batch", elem=INT64))) == []


def test_l12_output_alias_must_be_present():
    m = stateful_model()
    m.graph.node[0].ClearField("output_alias")
    (v,) = only(m, "L12")
    assert v.path == "graph.node[0]('upd').output_alias"


def test_l12_axis_out_of_range():
    m = stateful_model()
    m.graph.node[0].attribute.append(ext(helper.make_attribute("axis", 3), "AttributeProto"))
    (v,) = only(m, "L12")
    assert "axis 3" in v.message


def test_l12_dims_off_a_chosen_axis():
    m = _with_types(values=t(2, 16, 3))
    m.graph.node[0].attribute.append(ext(helper.make_attribute("axis", -1), "AttributeProto"))
    assert check(m) == []


def test_l12_arity():
    m = stateful_model()
    del m.graph.node[0].input[2]
    (v,) = only(m, "L12")
    assert "takes inputs (cache, values, position)" in v.message


def _constant_position(value: int, *, as_initializer: bool) -> Any:
    m = _with_types(values=t(2, 2, 8))
    del m.graph.input[2]
    if as_initializer:
        m.graph.initializer.append(ext(helper.make_tensor("position", INT64, [], [value]), "TensorProto"))
    else:
        const = ext(helper.make_node("Constant", [], ["position"], value=helper.make_tensor(
            "p", INT64, [], [value])), "NodeProto")
        m.graph.node.insert(0, const)
    return m


@pytest.mark.parametrize("as_initializer", [True, False])
def test_l12_constant_position_within_capacity(as_initializer):
    assert check(_constant_position(14, as_initializer=as_initializer)) == []
    (v,) = only(_constant_position(15, as_initializer=as_initializer), "L12")
    assert "position 15 + 2 values does not fit capacity 16" in v.message


def test_l12_constant_position_from_value_int():
    m = _with_types(values=t(2, 4, 8))
    del m.graph.input[2]
    m.graph.node.insert(0, ext(helper.make_node("Constant", [], ["position"], value_int=13), "NodeProto"))
    (v,) = only(m, "L12")
    assert v.path == "graph.node[1]('upd').input[2]"


def test_alias_rules_run_only_on_models_that_declare_something_they_read():
    from onnxforge.proto_ext.verify import as_view
    from onnxforge.proto_ext.verify.alias_rules import declares_aliases

    plain = model(inputs=[vi("x", t(2))], outputs=[vi("y", t(2))], nodes=[node("Relu", ["x"], ["y"])])
    assert not declares_aliases(as_view(plain)[0]) and check(plain) == []
    # each annotation alone turns the rules on, and each one's violation is found
    cases = {
        "L2": model(inputs=[vi("x", t(2))], outputs=[vi("y", t(2), alias_of="nowhere")],
                    nodes=[node("Relu", ["x"], ["y"])]),
        "L8": model(inputs=[vi("x", t(2))], outputs=[vi("y", t(2))],
                    nodes=[node("Relu", ["x"], ["y"])], value_infos=[vi("y", t(2), access=RW)]),
        "L1": model(inputs=[vi("x", t(2))], outputs=[vi("y", t(2))],
                    nodes=[node("Inplace", ["x"], ["y"], domain="test", alias=[(0, 3, MUST)])]),
        "L12": model(inputs=[vi("cache", t(*CACHE), access=RW), vi("values", t(2, 1, 8)),
                             vi("position", t(elem=INT64))],
                     outputs=[vi("updated_cache", t(*CACHE), alias_of="cache")],
                     nodes=[cache_update(alias=[])]),
    }
    for rule, m in cases.items():
        assert declares_aliases(as_view(m)[0])
        assert rule in {v.rule for v in check(m)}, rule
