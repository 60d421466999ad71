"""Run one case through the backend and its oracle(s) and judge the outcome.

Outcomes: ``ok`` (equal, or both refused), ``out-of-spec`` (a typed rejection of an input
listed in ``known.OUT_OF_SPEC``), ``oracle-disagreement`` (onnx.reference and
onnxruntime differ and the backend matches the one ``known.ORACLE_DISAGREEMENTS``
follows), ``skipped`` (no oracle can run the model), ``untyped`` (an error that is not an
``OnnxforgeError`` naming the node) and ``mismatch``. Crashes are counted by the parent.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.fuzz import known
from tests.fuzz.case import BF16, F16, F64, Case

__all__ = ["Outcome", "judge", "make_case", "op_table", "ops_for", "run_ours", "run_ort", "run_reference"]

TOL = {F16: (1e-3, 1e-3), BF16: (1e-2, 1e-2), F64: (1e-7, 1e-9)}
DEFAULT_TOL = (1e-5, 1e-6)


@dataclass(slots=True)
class Outcome:
    status: str
    reason: str = ""
    detail: str = ""


class OracleCannotRun(Exception):
    """The oracle has no implementation for this model (a skip, not a refusal)."""


def op_table() -> dict[tuple[str, str], Any]:
    """(domain, op) -> generator for every operator of ``onnxforge.backend_ops()``."""
    from tests.fuzz import gen_conv, gen_elementwise, gen_misc, gen_nn, gen_pool, gen_resize, gen_shape, gen_special

    table: dict[tuple[str, str], Any] = {}
    for mod in (gen_elementwise, gen_shape, gen_nn, gen_conv, gen_pool, gen_resize, gen_misc, gen_special):
        table.update(mod.GENERATORS)
    return table


def make_case(seed: int, index: int, ops: list[tuple[str, str]], table: dict) -> Case:
    from tests.fuzz.case import Draw

    key = ops[index % len(ops)]
    return table[key](Draw(np.random.default_rng([seed, index])))


# -- running ---------------------------------------------------------------------------------
def run_ours(case: Case, model: Any) -> list[np.ndarray]:
    import onnxforge as of

    feeds = {k: np.array(v, copy=True) for k, v in case.feeds.items()}  # in-place kernels write feeds
    return [np.asarray(o) for o in of.InferenceSession(model).run(None, feeds)]


def run_reference(case: Case, model: Any) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    try:
        ev = ReferenceEvaluator(model)
    except NotImplementedError as e:
        raise OracleCannotRun(f"onnx.reference: {str(e)[:80]}") from None
    try:
        return [np.asarray(o) for o in ev.run(None, case.feeds)]
    except NotImplementedError as e:
        raise OracleCannotRun(f"onnx.reference: {str(e)[:80]}") from None


_ORT_OPTIONS: Any = None


def run_ort(case: Case, model: Any) -> list[np.ndarray]:
    global _ORT_OPTIONS
    import onnxruntime as rt

    if _ORT_OPTIONS is None:
        so = rt.SessionOptions()
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.log_severity_level = 4
        _ORT_OPTIONS = so
    try:
        sess = rt.InferenceSession(model.SerializeToString(), _ORT_OPTIONS, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        text = str(e)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            raise OracleCannotRun("onnxruntime: no kernel for these types") from None
        raise
    try:
        return [np.asarray(o) for o in sess.run(None, case.feeds)]
    except RuntimeError as e:
        if "No corresponding Numpy type" in str(e) or "can't be converted to MLDataType" in str(e):
            raise OracleCannotRun("onnxruntime: its Python binding returns no bfloat16 arrays") from None
        raise


def run_oracle(case: Case, model: Any, which: Any) -> list[np.ndarray]:
    if callable(which):
        full = {n: a for n, a in case.inputs if a is not None}
        return [np.asarray(o) for o in which(full)]
    if which == "ort":
        return run_ort(case, model)
    if which == "spec":
        from tests.fuzz.gen_shape import spec_slice

        return spec_slice({n: a for n, a in case.inputs if a is not None})
    return run_reference(case, model)


# -- comparing ---------------------------------------------------------------------------------
def differ(case: Case, got: list[np.ndarray], want: list[np.ndarray]) -> str:
    """'' when equal within the tolerances, else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, oracle {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            return f"output {i}: shape {list(g.shape)}, oracle {list(w.shape)}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, oracle {w.dtype}"
        if g.dtype.kind in "f" or g.dtype in (BF16,) or g.dtype.name.startswith("float"):
            rtol, atol = TOL.get(g.dtype, DEFAULT_TOL)
            rtol, atol = max(rtol, case.rtol or 0), max(atol, case.atol or 0)
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            gn, wn = np.isnan(g64), np.isnan(w64)
            if (gn != wn).any():
                at = tuple(int(v) for v in np.argwhere(gn != wn)[0])
                return f"output {i}: NaN positions differ at {list(at)} ({g64[at]} vs {w64[at]})"
            with np.errstate(all="ignore"):
                close = np.isclose(g64, w64, rtol=rtol, atol=atol) | gn
            if not close.all():
                at = tuple(int(v) for v in np.argwhere(~close)[0])
                return f"output {i}: {g64[at]!r} vs oracle {w64[at]!r} at {list(at)} ({int((~close).sum())} differ)"
        elif g.dtype == object or g.dtype.kind in "US":
            if not np.array_equal(g, w):
                return f"output {i}: strings differ"
        elif not np.array_equal(g, w):
            at = tuple(int(v) for v in np.argwhere(g != w)[0]) if g.shape else ()
            return f"output {i}: {g[at]!r} vs oracle {w[at]!r} at {list(at)}"
    return ""


def _names_node(e: BaseException, name: str) -> bool:
    text = str(e) + " ".join(getattr(e, "__notes__", []))
    return name in text


def _attempt(fn: Any, *args: Any) -> tuple[list[np.ndarray] | None, BaseException | None]:
    try:
        return fn(*args), None
    except OracleCannotRun:
        raise
    except Exception as e:  # noqa: BLE001 - an oracle's refusal, whatever its type
        return None, e


def judge(case: Case) -> Outcome:
    """Run ``case`` and classify it."""
    import onnxforge as of

    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    model = case.model()
    ours: list[np.ndarray] | None = None
    err: BaseException | None = None
    try:
        ours = run_ours(case, model)
    except of.OnnxforgeError as e:
        err = e
        if not _names_node(e, case.node_name):
            return Outcome("untyped", "typed error without the node's name", f"{type(e).__name__}: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001 - exactly what the harness looks for
        return Outcome("untyped", type(e).__name__, str(e)[:300])
    primary = case.oracle
    try:
        want, oerr = _attempt(run_oracle, case, model, primary)
    except OracleCannotRun as e:
        other = {"reference": "ort", "ort": "reference"}.get(primary) if not case.domain else None
        if other is None:
            return Outcome("skipped", str(e))
        try:
            want, oerr = _attempt(run_oracle, case, model, other)
            primary = other
        except OracleCannotRun:
            return Outcome("skipped", str(e))
    verdict = _compare(case, ours, err, want, oerr)
    if verdict is None:
        return Outcome("ok")
    if case.out_of_spec and ours is None and want is not None:
        return Outcome("out-of-spec", case.out_of_spec)
    if ours is None and "onnx.checker" in str(err):
        return Outcome("out-of-spec", "onnx.checker refuses the model (the session verifies it first)")
    # a second opinion where the two oracles may differ on a standard operator
    if primary == "reference" and not case.domain:
        try:
            want2, oerr2 = _attempt(run_ort, case, model)
        except OracleCannotRun:
            return Outcome("mismatch", verdict, case.describe())
        if _compare(case, ours, err, want2, oerr2) is None:
            _, why = known.ORACLE_DISAGREEMENTS.get(case.op, ("", "unlisted"))
            return Outcome("oracle-disagreement", f"{case.op}: {why}", case.describe())
    if case.out_of_spec and ours is None:
        return Outcome("out-of-spec", case.out_of_spec)
    return Outcome("mismatch", verdict, case.describe())


def _compare(case: Case, ours: list[np.ndarray] | None, err: BaseException | None,
             want: list[np.ndarray] | None, oerr: BaseException | None) -> str | None:
    """None when the backend agrees with this oracle's outcome, else the difference."""
    if ours is None and want is None:
        return None  # both refuse (ours typed, naming the node)
    if ours is None:
        return f"the backend refuses ({type(err).__name__}: {str(err)[:200]}) but the oracle computes"
    if want is None:
        return f"the oracle refuses ({type(oerr).__name__}: {str(oerr)[:200]}) but the backend computes"
    d = differ(case, ours, want)
    return d or None



def ops_for(table: dict[tuple[str, str], Any], op: str | None = None) -> list[tuple[str, str]]:
    """The operators the cases cycle through: every backend operator (one without a
    generator is an error), or those named ``op`` (``Name`` or ``domain/Name``)."""
    import onnxforge as of

    ops = sorted(of.backend_ops())
    missing = [k for k in ops if k not in table]
    if missing:
        raise LookupError(f"no fuzz generator for {missing}")
    if op:
        ops = [k for k in ops if op in (k[1], "/".join(k))]
        if not ops:
            raise LookupError(f"no backend operator named {op!r}")
    return ops
