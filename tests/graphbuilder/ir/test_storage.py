"""Storage facts of the IR (roots, versions, writers, effects) from the one alias resolution."""
from __future__ import annotations

from onnx import TensorProto

from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder
from onnxforge.graphbuilder.ir.core import MUST_ALIAS, READ_WRITE, Alias, Graph, Model, Node, Value
from onnxforge.graphbuilder.ir.storage import Storage
from onnxforge.proto_ext.types import TensorType
from onnxforge.proto_ext.verify import check

FLOAT = TensorProto.FLOAT


def _f(*dims: int) -> TensorType:
    return TensorType(FLOAT, dims)


def _cache_graph() -> tuple[Graph, Value, Value, Value, Value]:
    g = Graph("g")
    cache = g.add_input(Value("cache", _f(1, 8, 4), access=READ_WRITE))
    vals = g.add_input(Value("vals", _f(1, 2, 4)))
    pos = g.add_input(Value("pos", TensorType(TensorProto.INT64, ())))
    u1 = g.append(Node("ai.onnxforge", "CacheUpdate", [cache, vals, pos], ["u1"],
                       output_alias=[Alias(0, 0, MUST_ALIAS)])).outputs[0]
    u2 = g.append(Node("ai.onnxforge", "CacheUpdate", [u1, vals, pos], ["u2"],
                       output_alias=[Alias(0, 0, MUST_ALIAS)])).outputs[0]
    return g, cache, vals, u1, u2


def test_roots_versions_and_writers_of_a_cache_chain() -> None:
    g, cache, vals, u1, u2 = _cache_graph()
    ident = g.append(Node("", "Identity", [u2], ["view"])).outputs[0]
    g.outputs.append(u2)
    st = Storage(Model(g))
    assert st.root(u1) is cache and st.root(u2) is cache and st.root(cache) is cache
    assert (st.version(cache), st.version(u1), st.version(u2)) == (0, 1, 2)
    assert st.root(ident) is ident  # a plain node output owns its storage
    assert st.writer(cache) is u1.producer() and st.writer(u1) is u2.producer()
    assert st.writer(u2) is None and st.writer(vals) is None
    assert st.writes(u2.producer()) == [u1]


def test_alias_of_is_an_alias_but_not_a_write() -> None:
    g, cache, _vals, _u1, u2 = _cache_graph()
    ident = g.append(Node("", "Identity", [u2], ["view"])).outputs[0]
    ident.alias_of = u2
    st = Storage(Model(g))
    assert st.root(ident) is cache and st.version(ident) == 2
    assert st.has_side_effects(ident.producer())  # produces an aliased output


def test_undefined_alias_kind_is_no_alias() -> None:
    g = Graph("g")
    vals = g.add_input(Value("vals", _f(1, 2, 4)))
    n = g.append(Node("", "Identity", [vals], ["u"], output_alias=[Alias(0, 0, 0)]))
    st = Storage(Model(g))
    assert st.root(n.outputs[0]) is n.outputs[0] and not st.has_side_effects(n)


def test_alias_cycles_resolve_to_nothing_and_verify_names_them() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", _f(4)))
    a = g.append(Node("", "Identity", [x], ["a"])).outputs[0]
    b = g.append(Node("", "Identity", [x], ["b"])).outputs[0]
    a.alias_of, b.alias_of = b, a
    g.outputs.extend([a, b])
    m = Model(g)
    st = Storage(m)
    assert st.root(a) is a and st.root(b) is b
    assert "L5" in {v.rule for v in check(m)}


def test_side_effects_of_writes_bindings_and_aliases() -> None:
    g = Graph("g")
    cache = g.add_input(Value("cache", _f(1, 8, 4), access=READ_WRITE))
    vals = g.add_input(Value("vals", _f(1, 2, 4)))
    pos = g.add_input(Value("pos", TensorType(TensorProto.INT64, ())))
    state = g.add_input(Value("state", _f(4)))
    upd = g.append(Node("ai.onnxforge", "CacheUpdate", [cache, vals, pos], ["u"],
                        output_alias=[Alias(0, 0, MUST_ALIAS)]))
    plain = g.append(Node("", "Neg", [vals], ["n"]))
    nxt = g.append(Node("", "Add", [state, state], ["next"]))
    g.outputs.extend([upd.outputs[0], nxt.outputs[0]])
    m = Model(g)
    st = Storage(m)
    assert st.has_side_effects(upd) and not st.has_side_effects(plain)
    assert not st.has_side_effects(nxt)  # a graph output, but not bound
    g.bindings.append((state, nxt.outputs[0]))
    assert Storage(m).has_side_effects(nxt)


def test_a_node_added_after_the_snapshot_is_answered() -> None:
    g, cache, vals, u1, _u2 = _cache_graph()
    st = Storage(Model(g))
    late = g.append(Node("", "Relu", [vals], ["late"]))
    assert not st.has_side_effects(late)


def test_writes_through_a_local_function_and_a_subgraph() -> None:
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, [1, 8, 4], access=READ_WRITE)
    vals = g.input("vals", FLOAT, [1, 1, 4])
    pos = g.input("pos", TensorProto.INT64, [])
    fb = g.function("local", "append", ["c", "v", "p"])
    fn = fb.graph
    fn.inputs[0].access = READ_WRITE
    fn.outputs.append(fb.op.CacheUpdate(*fn.inputs))
    call = g.make_node("append", [cache, vals, pos], 1, domain="local")
    m = g.to_model()
    st = Storage(m)
    assert st.has_side_effects(call)
    assert st.writes(call) == [cache]
    assert st.function_has_side_effects(m.functions[("local", "append", "")])


def test_a_shapes_context_reads_the_storage_it_is_given():
    from onnxforge.graphbuilder.shapes.context import ShapesContext
    from tests.passes.helpers import stateful_model

    m = stateful_model()
    cache = m.graph.inputs[0]
    written = next(n for n in m.graph if n.op_type == "CacheUpdate").outputs[0]
    given = Storage(m)
    ctx = ShapesContext(m, write_back=False, storage=given).infer_graph()
    assert ctx.alias_root(written) is cache is ShapesContext(m, write_back=False).alias_root(written)

    class Recorder(Storage):
        def __init__(self, model):
            self.asked = []
            super().__init__(model)

        def root(self, v):
            self.asked.append(v)
            return super().root(v)

    rec = Recorder(m)
    assert ShapesContext(m, write_back=False, storage=rec).alias_root(written) is cache
    assert rec.asked == [written]
