"""Mutation campaign: seeded random corruptions of small valid models must fail only with
typed errors (``onnxforge.OnnxforgeError`` subclasses) in ``verify``, in
``InferenceSession`` (construction and one run on zeros), in ``make_state`` (and
one run) and, for the decoder's mutants, in ``onnxforge generate`` (an exit status,
never "unexpected"), never with a raw KeyError, IndexError, AttributeError,
TypeError, ValueError or numpy error.

``python -m tests.test_mutation_campaign`` prints the untyped errors grouped by where
they were raised.
"""
from __future__ import annotations

import os
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import onnxforge as of
from onnxforge.errors import OnnxforgeError
from onnxforge.proto_ext import schema

MUTANTS = int(__import__("os").environ.get("MUTANTS", 3000))
SEED = 20240601
_MAX_FEED = 1 << 20  # elements of one zero feed; larger (mutated) inputs are not run


# ------------------------------------------------------------------ base models


def _vi(name: str, dtype: int, shape: Any) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, dtype, shape)


def _one_op_models() -> list[onnx.ModelProto]:
    def model(nodes, inputs, outputs, inits=(), opset=20):
        g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
        return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    idx = numpy_helper.from_array(np.array([0, 2], np.int64), "idx")
    shape = numpy_helper.from_array(np.array([4, 3], np.int64), "shape")
    return [
        model([h.make_node("MatMul", ["a", "w"], ["y"], name="mm")], [_vi("a", T.FLOAT, [2, 3])],
              [_vi("y", T.FLOAT, [2, 4])], [w]),
        model([h.make_node("Gather", ["w", "idx"], ["y"], name="g", axis=1)], [],
              [_vi("y", T.FLOAT, [3, 2])], [w, idx]),
        model([h.make_node("Add", ["a", "b"], ["t"], name="add"), h.make_node("Relu", ["t"], ["y"], name="r")],
              [_vi("a", T.FLOAT, [2, 3]), _vi("b", T.FLOAT, [3])], [_vi("y", T.FLOAT, [2, 3])]),
        model([h.make_node("Reshape", ["w", "shape"], ["t"], name="rs"),
               h.make_node("Softmax", ["t"], ["y"], name="sm", axis=-1)],
              [], [_vi("y", T.FLOAT, [4, 3])], [w, shape]),
        model([h.make_node("Concat", ["a", "a"], ["t"], name="cat", axis=0),
               h.make_node("Transpose", ["t"], ["y"], name="tr", perm=[1, 0])],
              [_vi("a", T.FLOAT, [2, 3])], [_vi("y", T.FLOAT, [3, 4])]),
    ]


def base_models() -> list[bytes]:
    from onnxforge.graphbuilder import serde
    from onnxforge.samples import build_rnn, builtin_model

    out = [builtin_model("decoder").SerializeToString(), serde.to_bytes(build_rnn())]
    out.extend(m.SerializeToString() for m in _one_op_models())
    return out


# ------------------------------------------------------------------ mutations

_NAMES = ("", "missing", "a", "w", "y", "t", "input_ids", "cache.0.key", "position", "x.y")
_OPS = ("Add", "MatMul", "Gather", "Reshape", "Concat", "Identity", "Where", "Softmax", "Transpose",
        "CacheUpdate", "Foo", "Shape", "Cast", "If", "Slice", "Constant")
_DOMAINS = ("", "ai.onnxforge", "com.microsoft", "bogus.domain")
_INTS = (-(1 << 40), -7, -1, 0, 1, 2, 3, 17, 1 << 31, 1 << 62)
_DIMS = (0, 1, 5, -3, 1 << 40, 1 << 62)


def _pick(rng: random.Random, seq: Any) -> Any:
    return seq[rng.randrange(len(seq))] if len(seq) else None


def _graphs(m: Any) -> list[Any]:
    out, pending = [], [m.graph]
    while pending:
        g = pending.pop()
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    pending.append(a.g)
                pending.extend(a.graphs)
    return out


def _node(rng: random.Random, m: Any) -> Any:
    nodes = [n for g in _graphs(m) for n in g.node]
    return _pick(rng, nodes)


def _value_infos(m: Any) -> list[Any]:
    return [v for g in _graphs(m) for v in (*g.input, *g.output, *g.value_info)]


def m_input_empty(rng, m):
    n = _node(rng, m)
    if n is not None and n.input:
        n.input[rng.randrange(len(n.input))] = rng.choice(("", "", "missing"))


def m_input_rename(rng, m):
    n = _node(rng, m)
    if n is not None and n.input:
        n.input[rng.randrange(len(n.input))] = rng.choice(_NAMES)


def m_input_add_remove(rng, m):
    n = _node(rng, m)
    if n is None:
        return
    if n.input and rng.random() < 0.5:
        del n.input[-1]
    else:
        n.input.append(rng.choice(_NAMES))


def m_output(rng, m):
    n = _node(rng, m)
    if n is not None and n.output:
        n.output[rng.randrange(len(n.output))] = rng.choice(_NAMES)


def m_node_drop(rng, m):
    g = _pick(rng, _graphs(m))
    if len(g.node):
        del g.node[rng.randrange(len(g.node))]


def m_node_swap(rng, m):
    g = _pick(rng, _graphs(m))
    if len(g.node) >= 2:
        i, j = rng.randrange(len(g.node)), rng.randrange(len(g.node))
        a, b = type(g.node[i])(), type(g.node[j])()
        a.CopyFrom(g.node[i])
        b.CopyFrom(g.node[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)


def m_op_type(rng, m):
    n = _node(rng, m)
    if n is not None:
        n.op_type = rng.choice(_OPS)


def m_domain(rng, m):
    n = _node(rng, m)
    if n is not None:
        n.domain = rng.choice(_DOMAINS)


def m_attr(rng, m):
    n = _node(rng, m)
    if n is None:
        return
    if not n.attribute or rng.random() < 0.25:
        a = n.attribute.add()
        a.name = rng.choice(("axis", "perm", "to", "value", "k", ""))
        a.type = rng.choice((1, 2, 3, 4, 7))
        a.i = rng.choice(_INTS)
        a.ints.extend(rng.choice(((), (0,), (1, 0), (5, -9))))
        return
    a = n.attribute[rng.randrange(len(n.attribute))]
    what = rng.randrange(6)
    if what == 0:
        a.type = rng.randrange(0, 15)
    elif what == 1:
        a.i = rng.choice(_INTS)
    elif what == 2:
        a.f = rng.choice((float("nan"), float("inf"), -1.0, 1e30))
    elif what == 3:
        del a.ints[:]
        a.ints.extend(rng.choice(((), (0,), (2, 0), (1, 1), (9, -9, 3))))
    elif what == 4:
        a.s = rng.choice((b"", b"\xff\xfe", b"NOTSET", b"x"))
    else:
        del n.attribute[rng.randrange(len(n.attribute))]


def m_elem_type(rng, m):
    v = _pick(rng, _value_infos(m))
    if v is not None and v.type.HasField("tensor_type"):
        v.type.tensor_type.elem_type = rng.choice((0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 16, 22, 26, 40))


def m_dims(rng, m):
    v = _pick(rng, _value_infos(m))
    if v is None or not v.type.HasField("tensor_type"):
        return
    shape = v.type.tensor_type.shape
    if len(shape.dim) and rng.random() < 0.7:
        shape.dim[rng.randrange(len(shape.dim))].dim_value = rng.choice(_DIMS)
    elif len(shape.dim) and rng.random() < 0.5:
        del shape.dim[-1]
    else:
        shape.dim.add().dim_value = rng.choice(_DIMS)


def m_value_drop(rng, m):
    g = _pick(rng, _graphs(m))
    field = rng.choice((g.input, g.output, g.value_info))
    if len(field):
        del field[rng.randrange(len(field))]


def m_value_name(rng, m):
    v = _pick(rng, _value_infos(m))
    if v is not None:
        v.name = rng.choice(_NAMES)


def m_initializer(rng, m):
    g = _pick(rng, _graphs(m))
    if not len(g.initializer):
        return
    k = rng.randrange(len(g.initializer))
    t = g.initializer[k]
    what = rng.randrange(6)
    if what == 0:
        del g.initializer[k]
    elif what == 1:
        t.data_type = rng.choice((0, 1, 6, 7, 8, 10, 16, 22, 26, 99))
    elif what == 2:
        if t.raw_data:
            t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
        else:
            del t.float_data[len(t.float_data) // 2:]
            del t.int64_data[len(t.int64_data) // 2:]
    elif what == 3:
        if len(t.dims):
            t.dims[rng.randrange(len(t.dims))] = rng.choice(_DIMS)
        else:
            t.dims.append(rng.choice(_DIMS))
    elif what == 4:
        t.name = rng.choice(_NAMES)
    else:
        g.initializer.add().CopyFrom(t)


def m_encoded(rng, m):
    g = m.graph
    if not len(g.encoded_initializer):
        return m_initializer(rng, m)
    e = g.encoded_initializer[rng.randrange(len(g.encoded_initializer))]
    what = rng.randrange(5)
    if what == 0:
        e.raw_data = e.raw_data[: rng.randrange(len(e.raw_data) + 1)]
    elif what == 1 and e.HasField("struct_type"):
        e.struct_type.type_ref = rng.choice((0, 1, 2, 999))
    elif what == 2 and e.HasField("affine"):
        e.affine.storage_type = rng.choice((0, 1, 3, 6, 22))
    elif what == 3:
        e.name = rng.choice(_NAMES)
    else:
        del g.encoded_initializer[rng.randrange(len(g.encoded_initializer))]


def m_struct(rng, m):
    if not len(m.struct_types):
        return m_encoded(rng, m)
    s = m.struct_types[rng.randrange(len(m.struct_types))]
    if rng.random() < 0.5:
        s.type_id = rng.choice((0, 1, 2, 1 << 40))
    else:
        s.name = rng.choice(("", "Int4Block", "other"))


def m_alias(rng, m):
    nodes = [n for n in (n for g in _graphs(m) for n in g.node) if len(n.output_alias)] or \
        [n for g in _graphs(m) for n in g.node]
    n = _pick(rng, nodes)
    if n is None:
        return
    if len(n.output_alias) and rng.random() < 0.7:
        a = n.output_alias[rng.randrange(len(n.output_alias))]
        field = rng.choice(("output_index", "input_index"))
        setattr(a, field, rng.choice((-1, 0, 1, 2, 9)))
    else:
        a = n.output_alias.add()
        a.output_index, a.input_index, a.kind = rng.choice((0, 1, 5)), rng.choice((0, 1, 5)), 1


def m_alias_of(rng, m):
    v = _pick(rng, _value_infos(m))
    if v is None:
        return
    if rng.random() < 0.5:
        v.alias_of = rng.choice(_NAMES)
    else:
        v.access = rng.choice((0, 1))


def m_binding(rng, m):
    g = m.graph
    if len(g.persistent_bindings) and rng.random() < 0.7:
        b = g.persistent_bindings[rng.randrange(len(g.persistent_bindings))]
        setattr(b, rng.choice(("input_name", "output_name")), rng.choice(_NAMES))
    else:
        b = g.persistent_bindings.add()
        b.input_name, b.output_name = rng.choice(_NAMES), rng.choice(_NAMES)


def m_opset(rng, m):
    if len(m.opset_import):
        m.opset_import[rng.randrange(len(m.opset_import))].version = rng.choice((1, 7, 11, 13, 18, 23, 99))


MUTATIONS: tuple[Callable[[random.Random, Any], None], ...] = (
    m_input_empty, m_input_rename, m_input_add_remove, m_output, m_node_drop, m_node_swap, m_op_type,
    m_domain, m_attr, m_elem_type, m_dims, m_value_drop, m_value_name, m_initializer, m_encoded,
    m_struct, m_alias, m_alias_of, m_binding, m_opset)


# ------------------------------------------------------------------ the campaign


def _zero_feeds(graph_inputs: list[Any], skip: set[str] = frozenset()) -> dict[str, np.ndarray] | None:
    """Zeros for the model's inputs (symbolic dims 1); None when one cannot be made."""
    from onnxforge.proto_ext.dtypes import np_dtype
    from onnxforge.proto_ext.types import TensorType

    feeds = {}
    for v in graph_inputs:
        if v.name in skip or v.const is not None:
            continue
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None:
            return None
        try:
            dtype = np_dtype(t.elem_type)
        except OnnxforgeError:
            return None
        shape = [d if isinstance(d, int) else 1 for d in t.shape]
        if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.float64)) > _MAX_FEED:
            return None
        feeds[v.name] = np.zeros(shape, dtype)
    return feeds


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/onnxforge/" in f.filename or "/work/" in f.filename]
    f = (ours or frames)[-1] if (ours or frames) else None
    return "?" if f is None else f"{f.filename.split('/main/')[-1]}:{f.lineno} ({f.name})"


def _attempt(stage: str, fn: Callable[[], Any], label: str, findings: list[tuple[str, str, str, str]]) -> Any:
    try:
        return fn()
    except OnnxforgeError:
        return None
    except Exception as exc:  # the campaign's subject: anything untyped is recorded
        findings.append((stage, type(exc).__name__, _where(exc), f"{label}: {str(exc)[:160]}"))
        return None


def _generate(data: bytes, label: str, findings: list[tuple[str, str, str, str]]) -> None:
    """``onnxforge generate`` on the mutant: an exit status, never an untyped error (the
    command line reports one as "unexpected")."""
    import contextlib
    import io
    import tempfile

    from onnxforge.cli import main

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as fh:
            fh.write(data)
        err = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                main(["generate", path, "--prompt-ids", "5,17", "--new", "2", "--json"])
        except Exception as exc:  # noqa: BLE001 - the boundary must not let one out
            findings.append(("generate", type(exc).__name__, _where(exc), f"{label}: {str(exc)[:160]}"))
            return
    if "unexpected" in err.getvalue():
        findings.append(("generate", "unexpected", "cli", f"{label}: {err.getvalue().strip()[:160]}"))


def run_campaign(n: int = MUTANTS, seed: int = SEED, *, check_first: bool = False
                 ) -> tuple[list[tuple[str, str, str, str]], Counter]:
    """Mutate, then verify / construct / run; returns the untyped errors and stage counts.
    ``check_first`` runs ``check_runnable`` before constructing (what the backend will do)."""
    from onnxforge.kernels_cy.runtime.session import InferenceSession
    from onnxforge.kernels_cy.runtime.state import make_state
    from onnxforge.proto_ext.verify import check_runnable

    rng = random.Random(seed)
    bases = base_models()
    weights = [3, 2, 1, 1, 1, 1, 1]  # the decoder and the RNN carry the extensions
    findings: list[tuple[str, str, str, str]] = []
    stats: Counter = Counter()
    for k in range(n):
        b = rng.choices(range(len(bases)), weights)[0]
        m = schema.parse_model(bases[b])
        names = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            mutate = rng.choice(MUTATIONS)
            names.append(mutate.__name__)
            mutate(rng, m)
        label = f"#{k} base{b} {'+'.join(names)}"
        try:
            data = m.SerializeToString()
        except Exception:  # noqa: BLE001 - protobuf refuses the mutant: not a model
            stats["unserializable"] += 1
            continue
        if _attempt("verify", lambda: of.verify(data) or True, label, findings) is None:
            stats["rejected"] += 1
            if check_first:
                continue
        if check_first and _attempt("check_runnable", lambda: check_runnable(data) or True, label,
                                    findings) is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if b == 0 and k % 4 == 0:  # the decoder's mutants through the command line too
                _generate(data, label, findings)
                stats["generates"] += 1
            sess = _attempt("InferenceSession", lambda: InferenceSession(data), label, findings)
            if sess is not None:
                stats["sessions"] += 1
                feeds = _zero_feeds(list(sess.model.graph.inputs))
                if feeds is not None:
                    if _attempt("session.run", lambda: sess.run(None, feeds), label, findings) is not None:
                        stats["runs"] += 1
                state = _attempt("make_state", lambda: make_state(sess), label, findings)
                if state is not None:
                    bound = {bb.input for bb in state.bindings}
                    feeds = _zero_feeds(list(sess.model.graph.inputs), bound)
                    if feeds is not None:
                        if _attempt("state.run", lambda: state.run(feeds), label, findings) is not None:
                            stats["state_runs"] += 1
    return findings, stats


def _summary(findings: list[tuple[str, str, str, str]]) -> str:
    groups = Counter((stage, kind, where) for stage, kind, where, _ in findings)
    first = {}
    for stage, kind, where, msg in findings:
        first.setdefault((stage, kind, where), msg)
    return "\n".join(f"{c:5d}  {stage:16s} {kind:18s} {where}\n       e.g. {first[(stage, kind, where)]}"
                     for (stage, kind, where), c in groups.most_common())


def test_mutants_fail_with_typed_errors() -> None:
    findings, stats = run_campaign()
    assert stats["rejected"] > MUTANTS // 3  # the mutations do break models
    assert not findings, f"{len(findings)} untyped error(s):\n{_summary(findings)}"


if __name__ == "__main__":
    t0 = time.perf_counter()
    first = "--check-first" in sys.argv
    found, counts = run_campaign(check_first=first)
    print(f"{MUTANTS} mutants in {time.perf_counter() - t0:.1f} s; {dict(counts)}; "
          f"{len(found)} untyped error(s)")
    print(_summary(found))
