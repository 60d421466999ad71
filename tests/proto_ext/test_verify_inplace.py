"""Rule L13: in-place semantics (a reader of a written version runs before its writer;
the written version is no graph output; views are distinct values)."""
from __future__ import annotations

from typing import Any

import pytest
from onnx import TensorProto, helper

from onnxforge.proto_ext import schema
from onnxforge.proto_ext.verify import check
from tests.proto_ext.test_verify_aliases import (
    CACHE,
    MUST,
    RW,
    cache_update,
    control,
    model,
    node,
    subgraph,
    t,
    vi,
)

INT64, BOOL = TensorProto.INT64, TensorProto.BOOL
SCALAR = t(1, 1, 1)


def _inputs() -> list[Any]:
    return [vi("cache", t(*CACHE), access=RW), vi("values", t(2, 1, 8)), vi("position", t(elem=INT64))]


def _model(nodes: list[Any], outputs: list[Any], **kw: Any) -> Any:
    kw.setdefault("inputs", _inputs())
    return model(nodes=nodes, outputs=outputs, **kw)


def _l13(m: Any) -> list[str]:
    return [str(v) for v in check(m) if v.rule == "L13"]


def _rules(m: Any) -> set[str]:
    return {v.rule for v in check(m)}


UPDATED = vi("updated_cache", t(*CACHE), alias_of="cache")


def test_readers_before_the_write_and_snapshots_after_it_are_valid() -> None:
    # s1 reads version 0 before the write; y is a distinct value read after it (L13 c)
    m = _model([node("ReduceSum", ["cache"], ["s1"]),
                node("Identity", ["cache"], ["y"]),
                cache_update(),
                node("ReduceSum", ["updated_cache"], ["s2"]),
                node("Add", ["y", "s2"], ["z"]),
                node("Add", ["s1", "s2"], ["w"])],
               [UPDATED, vi("z", t(*CACHE)), vi("w", SCALAR)])
    assert check(m) == []


@pytest.mark.parametrize("view", [
    ("Identity", ["cache"], {}),
    ("Flatten", ["cache"], {"axis": 1}),
    ("Unsqueeze", ["cache", "axes"], {}),
    ("Reshape", ["cache", "shape"], {}),
])
def test_every_view_kind_is_a_distinct_value(view: tuple[str, list[str], dict[str, Any]]) -> None:
    op, ins, attrs = view
    consts = [node("Constant", [], ["axes"], value=helper.make_tensor("a", INT64, [1], [0])),
              node("Constant", [], ["shape"], value=helper.make_tensor("s", INT64, [1], [-1]))]
    m = _model(consts + [node(op, ins, ["y"], **attrs), cache_update(),
                         node("ReduceSum", ["updated_cache"], ["s"]),
                         node("Mul", ["y", "s"], ["z"])],
               [UPDATED, vi("z", None)])
    assert _l13(m) == []


def test_a_reader_that_depends_on_the_write_is_rejected() -> None:
    m = _model([cache_update(),
                node("ReduceSum", ["updated_cache"], ["s"]),
                node("Add", ["cache", "s"], ["z"], name="late")],
               [UPDATED, vi("z", t(*CACHE))])
    (msg,) = _l13(m)
    assert "late" in msg and "'cache'" in msg and "upd" in msg


def test_a_reader_that_depends_on_the_write_through_a_chain_is_rejected() -> None:
    m = _model([cache_update(),
                node("Relu", ["updated_cache"], ["a"]),
                node("Neg", ["a"], ["b"]),
                node("Concat", ["cache", "b"], ["z"], name="late", axis=0)],
               [UPDATED, vi("z", None)])
    assert any("late" in msg for msg in _l13(m))


def test_the_written_version_as_a_graph_output_is_rejected() -> None:
    m = _model([cache_update()], [UPDATED, vi("cache", t(*CACHE))])
    (msg,) = _l13(m)
    assert "graph.output['cache']" in msg


def test_a_subgraph_capturing_the_written_value_after_the_write_is_rejected() -> None:
    then_b = subgraph("then", [node("Relu", ["cache"], ["t_out"])], [vi("t_out", t(*CACHE))])
    else_b = subgraph("else", [node("Neg", ["cache"], ["e_out"])], [vi("e_out", t(*CACHE))])
    m = _model([cache_update(),
                node("ReduceSum", ["updated_cache"], ["s"]),
                node("Cast", ["s"], ["cond"], to=BOOL),
                node("Reshape", ["cond", "scalar"], ["c0"]),
                control("If", ["c0"], ["z"], {"then_branch": then_b, "else_branch": else_b},
                        name="reads_cache")],
               [UPDATED, vi("z", t(*CACHE))],
               initializers=[helper.make_tensor("scalar", INT64, [0], [])])
    assert any("reads_cache" in msg for msg in _l13(m))


def test_a_subgraph_capturing_the_value_before_the_write_is_valid() -> None:
    then_b = subgraph("then", [node("Relu", ["cache"], ["t_out"])], [vi("t_out", t(*CACHE))])
    else_b = subgraph("else", [node("Neg", ["cache"], ["e_out"])], [vi("e_out", t(*CACHE))])
    m = _model([control("If", ["cond"], ["z"], {"then_branch": then_b, "else_branch": else_b}),
                cache_update()],
               [UPDATED, vi("z", t(*CACHE))],
               inputs=_inputs() + [vi("cond", t(elem=BOOL))])
    assert _l13(m) == []


def test_a_write_inside_a_branch_orders_the_outer_readers() -> None:
    # the If writes `cache` through its branches; an outer reader of `cache` that needs
    # the If's result cannot run before that write
    def writing_branch(name: str) -> Any:
        return subgraph(name, [cache_update(out=f"{name}_u", name=f"{name}_upd")],
                        [vi(f"{name}_u", t(*CACHE), alias_of="cache")])

    m = _model([control("If", ["cond"], ["updated_cache"],
                        {"then_branch": writing_branch("then"), "else_branch": writing_branch("else")},
                        name="branchy"),
                node("ReduceSum", ["updated_cache"], ["s"]),
                node("Add", ["cache", "s"], ["z"], name="late")],
               [UPDATED, vi("z", t(*CACHE))],
               inputs=_inputs() + [vi("cond", t(elem=BOOL))])
    assert any("late" in msg and "branchy" in msg for msg in _l13(m))


def _call_model(gate: str) -> Any:
    """``c = local.total(cache, gate)`` beside the write; ``gate`` is ``values`` (independent
    of the write) or ``s`` (computed from the written version)."""
    fn = helper.make_function("local", "total", ["x", "g"], ["y"],
                              [helper.make_node("ReduceSum", ["x"], ["r"]),
                               helper.make_node("Add", ["r", "g"], ["y"])],
                              [helper.make_opsetid("", 23)])
    return _model([cache_update(),
                   node("ReduceSum", ["updated_cache"], ["s"]),
                   node("total", ["cache", gate], ["c"], domain="local", name="call")],
                  [UPDATED, vi("c", None)], functions=[fn])


def test_a_call_passing_the_value_is_a_reader() -> None:
    assert _l13(_call_model("values")) == []
    assert any("call" in msg for msg in _l13(_call_model("s")))


def test_a_second_version_orders_the_readers_of_the_first() -> None:
    # u1 = write(cache); u2 = write(u1): readers of u1 run before the second write
    nodes = [cache_update(out="u1", name="w1"),
             cache_update(cache="u1", out="updated_cache", name="w2"),
             node("ReduceSum", ["updated_cache"], ["s"]),
             node("Add", ["u1", "s"], ["z"], name="late")]
    m = _model(nodes, [UPDATED, vi("z", t(*CACHE))], value_infos=[vi("u1", t(*CACHE), alias_of="cache")])
    assert any("late" in msg and "w2" in msg for msg in _l13(m))


def test_readers_that_each_wait_for_the_other_write_are_rejected() -> None:
    # a reads cache_a and needs the write of cache_b; b reads cache_b and needs the write
    # of cache_a: neither order runs both in place
    ins = [vi("ka", t(*CACHE), access=RW), vi("kb", t(*CACHE), access=RW),
           vi("values", t(2, 1, 8)), vi("position", t(elem=INT64))]
    m = model(inputs=ins,
              nodes=[cache_update("ka", "ua", name="wa"), cache_update("kb", "ub", name="wb"),
                     node("ReduceSum", ["ub"], ["sb"]), node("ReduceSum", ["ua"], ["sa"]),
                     node("Add", ["ka", "sb"], ["ra"], name="read_a"),
                     node("Add", ["kb", "sa"], ["rb"], name="read_b")],
              outputs=[vi("ua", t(*CACHE), alias_of="ka"), vi("ub", t(*CACHE), alias_of="kb"),
                       vi("ra", t(*CACHE)), vi("rb", t(*CACHE))])
    assert _l13(m)


def test_two_writers_of_one_version_are_l9_not_l13() -> None:
    ins = [vi("x", t(4), access=RW)]
    m = model(inputs=ins,
              nodes=[node("Inplace", ["x"], ["a"], domain="test", name="a", alias=[(0, 0, MUST)]),
                     node("Inplace", ["x"], ["b"], domain="test", name="b", alias=[(0, 0, MUST)])],
              outputs=[vi("a", t(4), alias_of="x"), vi("b", t(4), alias_of="x")])
    rules = _rules(m)
    assert "L9" in rules and "L13" not in rules


def test_inside_a_local_function_body() -> None:
    body = [helper.make_node("CacheUpdate", ["c", "v", "p"], ["u"], domain="ai.onnxforge"),
            helper.make_node("ReduceSum", ["u"], ["s"]),
            helper.make_node("Add", ["c", "s"], ["r"], name="late_in_body")]
    fn = schema.FunctionProto(name="step", domain="local", input=["c", "v", "p"], output=["u", "r"])
    fn.opset_import.add(domain="", version=23)
    fn.opset_import.add(domain="ai.onnxforge", version=1)
    for n in body:
        fn.node.add().ParseFromString(n.SerializeToString())
    fn.node[0].output_alias.add(output_index=0, input_index=0, kind=MUST)
    fn.value_info.add(name="c").access = RW
    fn.value_info.add(name="u").alias_of = "c"
    m = _model([node("step", ["cache", "values", "position"], ["updated_cache", "r"], domain="local",
                     alias=[(0, 0, MUST)])],
               [UPDATED, vi("r", None)], functions=[fn])
    assert any("late_in_body" in msg for msg in _l13(m))
