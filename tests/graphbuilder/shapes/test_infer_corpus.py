"""ShapesContext against ``onnx.shape_inference`` on onnx's backend node-test corpus.

For every generated node test case (1,884 models, every standard operator at the
versions onnx tests), the declared types of the main graph's outputs are
removed, then both onnx (``strict_mode=False, data_prop=True``) and
:class:`ShapesContext` infer the model. In every graph (control-flow bodies
included), every value that onnx gives a rank must get one from onnxforge too,
and the two never contradict each other: same rank, same element type, equal
dimensions where both are numbers. A symbolic or unknown dimension of
onnxforge facing a number of onnx is counted as a loss of precision.

The same comparison runs with every input dimension made symbolic (onnxforge's
symbolic output dimensions must then evaluate, at the test's real sizes, to the
sizes of the expected outputs), on a sample of the cases taken down to older
opsets by onnx's version converter, and on the real exported decoders.

The cases that cannot meet this are listed in :data:`EXPECTED_GAPS`, each with
its reason.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import onnx
import pytest
from onnxforge.graphbuilder import serde
from onnxforge.graphbuilder.ir.core import Graph, Model
from onnxforge.graphbuilder.shapes.context import ShapesContext
from onnxforge.graphbuilder.shapes.symbolic import SymExpr
from onnxforge.proto_ext.types import (
    OptionalType,
    SequenceType,
    SparseTensorType,
    TensorType,
    Type,
)

CHUNKS = 4
OLD_OPSETS = (9, 13)
OLD_OPSET_SAMPLE = 3

EXPECTED_GAPS: dict[str, str] = {
    "test_loop13_seq": "the body declares its sequence of rank-0 tensors but inserts rank-1 slices; "
                       "onnx keeps the (wrong) declaration, onnxforge the rank it computes",
}
"""Case name -> why onnxforge cannot type a value that onnx types (or disagrees with it)."""


# ----------------------------------------------------------------------------- comparison


def _onnx_tensor(tp: onnx.TypeProto) -> tuple[str, int, list[int | None] | None] | None:
    """(kind path, element type, dims) of the innermost tensor of a TypeProto, or None."""
    kinds = []
    while True:
        case = tp.WhichOneof("value")
        if case in ("tensor_type", "sparse_tensor_type"):
            t = getattr(tp, case)
            dims = None
            if t.HasField("shape"):
                dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in t.shape.dim]
            kinds.append(case)
            return "/".join(kinds), t.elem_type, dims
        if case == "sequence_type":
            kinds.append(case)
            tp = tp.sequence_type.elem_type
        elif case == "optional_type":
            kinds.append(case)
            tp = tp.optional_type.elem_type
        else:
            return None


def _ours_tensor(t: Type) -> tuple[str, int, list[Any] | None] | None:
    kinds = []
    while True:
        if isinstance(t, (TensorType, SparseTensorType)):
            kinds.append("tensor_type" if isinstance(t, TensorType) else "sparse_tensor_type")
            return "/".join(kinds), t.elem_type, None if t.shape is None else list(t.shape)
        if isinstance(t, SequenceType):
            kinds.append("sequence_type")
            t = t.elem
        elif isinstance(t, OptionalType):
            kinds.append("optional_type")
            t = t.elem
        else:
            return None


def _onnx_graphs(g: onnx.GraphProto, path: str) -> Iterator[tuple[str, onnx.GraphProto]]:
    yield path, g
    for i, n in enumerate(g.node):
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _onnx_graphs(a.g, f"{path}/{i}:{n.op_type}.{a.name}")
            elif a.type == onnx.AttributeProto.GRAPHS:
                for k, sg in enumerate(a.graphs):
                    yield from _onnx_graphs(sg, f"{path}/{i}:{n.op_type}.{a.name}[{k}]")


def _ir_graphs(g: Graph, path: str) -> Iterator[tuple[str, Graph]]:
    yield path, g
    for i, n in enumerate(g):
        for name, a in n.attributes.items():
            v = a.value
            if isinstance(v, Graph):
                yield from _ir_graphs(v, f"{path}/{i}:{n.op_type}.{name}")
            elif isinstance(v, list):
                for k, sg in enumerate(x for x in v if isinstance(x, Graph)):
                    yield from _ir_graphs(sg, f"{path}/{i}:{n.op_type}.{name}[{k}]")


def _onnx_typed(g: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    out: dict[str, onnx.TypeProto] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.name and vi.HasField("type"):
            out[vi.name] = vi.type
    return out


def strip_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without the declared types of the main graph's outputs and any value_info."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.graph.output:
        o.ClearField("type")
    del m.graph.value_info[:]
    return m


def symbolic_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every dimension of the main graph's inputs made symbolic
    (``x_0``, ``x_1``... for input ``x``); initializers keep their shapes."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        if vi.name in inits or vi.type.WhichOneof("value") != "tensor_type":
            continue
        for k, d in enumerate(vi.type.tensor_type.shape.dim):
            d.dim_param = f"{vi.name}_{k}"
    return m


def compare_case(name: str, model: onnx.ModelProto, symbolic: bool = False) -> tuple[int, list[str], list[str]]:
    """(values onnx ranks, problems, precision losses) of one model."""
    stripped = strip_outputs(model)
    if symbolic:
        stripped = symbolic_inputs(stripped)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inferred = onnx.shape_inference.infer_shapes(stripped, strict_mode=False, data_prop=True)
        except Exception as e:  # noqa: BLE001  (onnx's own failure: nothing to compare against)
            return 0, [], [f"{name}: onnx fails: {type(e).__name__}"]
    ours: Model = serde.load(stripped.SerializeToString())
    problems: list[str] = []
    losses: list[str] = []
    try:
        ctx = ShapesContext(ours, strict=False)
        ctx.infer_graph()
    except Exception as e:  # noqa: BLE001  (reported as the case's failure)
        return 1, [f"{name}: ShapesContext raises {type(e).__name__}: {e}"[:300]], []
    ir_graphs = dict(_ir_graphs(ours.graph, "main"))
    counted = 0
    for path, og in _onnx_graphs(inferred.graph, "main"):
        ig = ir_graphs.get(path)
        if ig is None:
            problems.append(f"{name}: graph {path} not found")
            continue
        by_name = {v.name: v for v in ig.values()}
        for vname, tp in _onnx_typed(og).items():
            theirs = _onnx_tensor(tp)
            if theirs is None or theirs[2] is None:
                continue
            counted += 1
            v = by_name.get(vname)
            mine = _ours_tensor(ctx.type_of(v)) if v is not None else None
            where = f"{name}: {path} value {vname!r}"
            if mine is None or mine[2] is None:
                problems.append(f"{where}: onnx has {theirs[0]} {theirs[1]} {theirs[2]}, onnxforge "
                                f"{ctx.type_of(v) if v is not None else 'no such value'}")
                continue
            if mine[0] != theirs[0] or len(mine[2]) != len(theirs[2]) or \
                    (theirs[1] and mine[1] != theirs[1]):
                problems.append(f"{where}: onnx has {theirs}, onnxforge {ctx.type_of(v)}")
                continue
            for k, (a, b) in enumerate(zip(mine[2], theirs[2])):
                if b is None:
                    continue
                if isinstance(a, int):
                    if a != b:
                        problems.append(f"{where}: dimension {k} is {a}, onnx says {b}")
                else:
                    losses.append(f"{where}: dimension {k} is {a}, onnx says {b}")
    return counted, problems, losses


# ----------------------------------------------------------------------------- tests


def test_node_corpus_is_large(node_models: list[tuple[str, onnx.ModelProto]]) -> None:
    assert len(node_models) >= 1800


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_node_corpus_matches_onnx(node_models: list[tuple[str, onnx.ModelProto]], chunk: int) -> None:
    """Concrete inputs: every value onnx ranks is ranked, with the same dimensions."""
    failures: list[str] = []
    counted = 0
    for name, model in node_models[chunk::CHUNKS]:
        n, problems, losses = compare_case(name, model)
        counted += n
        if name not in EXPECTED_GAPS:
            failures.extend((problems + losses)[:3])
    assert counted > 1000
    assert failures == [], f"{len(failures)} values differ from onnx:\n" + "\n".join(failures[:60])


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_node_corpus_with_symbolic_inputs(node_models: list[tuple[str, onnx.ModelProto]], chunk: int) -> None:
    """Every input dimension symbolic: still every value onnx ranks is ranked and no number
    contradicts onnx's. (Here onnx writes 0 for some dimensions it cannot compute, such
    as Attention's with symbolic heads, so a symbol facing an onnx number is allowed.)"""
    failures: list[str] = []
    for name, model in node_models[chunk::CHUNKS]:
        _, problems, _ = compare_case(name, model, symbolic=True)
        if name not in EXPECTED_GAPS:
            failures.extend(problems[:3])
    assert failures == [], f"{len(failures)} values differ from onnx:\n" + "\n".join(failures[:60])


def _input_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """The real sizes behind the symbols of :func:`symbolic_inputs`."""
    inits = {t.name for t in model.graph.initializer}
    env: dict[str, int] = {}
    for vi in model.graph.input:
        if vi.name not in inits and vi.type.WhichOneof("value") == "tensor_type":
            for k, d in enumerate(vi.type.tensor_type.shape.dim):
                env[f"{vi.name}_{k}"] = d.dim_value
    return env


def test_symbolic_outputs_evaluate_to_the_real_sizes(node_models: list[tuple[str, onnx.ModelProto]]) -> None:
    """With every input dimension symbolic, each output dimension onnxforge infers,
    evaluated at the test's real input sizes, equals the size of the test's expected
    output (as the case declares it). Fresh symbols (data-dependent sizes) are skipped."""
    failures: list[str] = []
    checked = 0
    for name, model in node_models:
        env = _input_sizes(model)
        declared = {o.name: _onnx_tensor(o.type) for o in model.graph.output}
        ours = serde.load(strip_outputs(symbolic_inputs(model)).SerializeToString())
        ctx = ShapesContext(ours, strict=False).infer_graph()
        for out in ours.graph.outputs:
            want, mine = declared.get(out.name), _ours_tensor(ctx.type_of(out))
            if want is None or want[2] is None or mine is None or mine[2] is None or name in EXPECTED_GAPS:
                continue
            if len(mine[2]) != len(want[2]):
                failures.append(f"{name}: output {out.name!r} has rank {len(mine[2])}, expected {len(want[2])}")
                continue
            for k, (d, real) in enumerate(zip(mine[2], want[2])):
                if d is None or real is None or (isinstance(d, SymExpr) and not d.free_symbols <= env.keys()):
                    continue
                checked += 1
                value = d.evaluate(env) if isinstance(d, SymExpr) else d
                if value != real:
                    failures.append(f"{name}: output {out.name!r} dimension {k} is {d} = {value}, expected {real}")
    assert checked > 4000
    assert failures == [], "\n".join(failures[:60])


def test_expected_gaps_are_still_gaps(node_models: list[tuple[str, onnx.ModelProto]]) -> None:
    """Every listed gap is real (so the list shrinks as rules improve)."""
    names = dict(node_models)
    for case in EXPECTED_GAPS:
        assert case in names, f"{case} is no longer in the corpus"
        _, problems, losses = compare_case(case, names[case])
        assert problems or losses, f"{case} now matches onnx: remove it from EXPECTED_GAPS"


@pytest.mark.parametrize("target", OLD_OPSETS)
def test_node_corpus_converted_to_older_opsets(node_models: list[tuple[str, onnx.ModelProto]],
                                               target: int) -> None:
    """The same comparison on a sample of the cases that onnx's version converter takes
    down to an older opset (older attribute / input forms of the operators)."""
    from onnx import version_converter

    failures: list[str] = []
    converted = 0
    for name, model in node_models[::OLD_OPSET_SAMPLE]:
        if name.endswith("_expanded") or any(o.domain not in ("", "ai.onnx") for o in model.opset_import):
            continue
        version = next(o.version for o in model.opset_import)
        if version <= target:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                old = version_converter.convert_version(model, target)
            onnx.checker.check_model(old)
        except Exception:  # noqa: BLE001, S112  (no older form of this operator: nothing to compare)
            continue
        converted += 1
        _, problems, losses = compare_case(f"{name}@{target}", old)
        failures.extend((problems + losses)[:3])
    assert converted > 20
    assert failures == [], f"{len(failures)} values differ from onnx:\n" + "\n".join(failures[:60])


DECODERS = ("torch20", "torch23", "genai_fp32", "genai_int4")


@pytest.mark.parametrize("variant", DECODERS)
def test_real_decoders_match_onnx(decoder_models: dict[str, Any], variant: str) -> None:
    model = onnx.load(str(decoder_models[variant]))
    counted, problems, losses = compare_case(variant, model)
    assert counted > 10
    assert problems == [] and losses == []


def test_negative_dim_value_in_a_file_is_an_unknown_dimension() -> None:
    """Exporters write ``dim_value: -1`` for a dynamic size: it reads as unknown (and the
    file still round-trips byte for byte)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], [0.5] * 6)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    data = helper.make_model(graph).SerializeToString()
    model = serde.load(data)
    assert model.graph.inputs[0].type.shape == (None, 3)
    ctx = ShapesContext(model).infer_graph()
    assert ctx.shape_of(model.graph.outputs[0]) == (None, 2)
    assert serde.to_bytes(serde.load(data)) == data
