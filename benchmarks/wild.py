"""onnxforge against its peers on the real-world corpus.

    python benchmarks/wild.py                 # every corpus model (+ cached decoders)
    python benchmarks/wild.py --only silero_vad ppocr_cls --repeat 3
    python benchmarks/wild.py --no-decoders --json results.json

One row per model of ``tests/fixtures/wild.py`` (downloaded on first use into the
fixture cache, ``$ONNXFORGE_FIXTURE_DIR`` or ``<repo>/.fixture-cache``), plus the
decoders of ``tests/fixtures/decoders.py`` that are already built in that cache.
For each tool: nodes after (all graphs, If/Loop bodies and functions included)
and optimize time in milliseconds. Tools: onnxforge (``of.optimize``, verify
included), onnxslim (``slim``), onnx-simplifier (``onnxsim.simplify``, no
self-check), onnxoptimizer (its default passes) and the onnxscript optimizer
(``onnxscript.optimizer.optimize`` on an onnx_ir model). Every tool starts from
the model already loaded in its own in-memory form; loading and saving are not
timed. Before each timed block the machine is left idle briefly (thread pools of
the previous block otherwise steal a core); the best of ``--repeat`` runs is kept.

Each tool's result is saved and run in onnxruntime on the corpus inputs; its
outputs must equal the original's within ``1e-5 * max(1, largest magnitude)``.
A cell is marked ``!diff`` when an output changed, ``!fail`` when the tool raised
or its model does not load, and ``!size`` when the file grew beyond 1.01x; the
reasons are listed under the table. The last column is onnxforge's node count
divided by the fewest nodes of a peer whose output is correct. A line above the table
says how many of onnxforge's optimizer modules ran compiled (one edited since the
build runs from its source, slower).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import onnxforge as of  # noqa: E402
from tests.fixtures.wild import NAMES, fetch_all, proto_nodes, random_feeds  # noqa: E402

RTOL = 1e-5
SIZE_RATIO_MAX = 1.01
IDLE_S = 0.3
TOOLS = ("onnxforge", "onnxslim", "onnxsim", "onnxoptimizer", "onnxscript")
DECODERS = ("torch20", "torch23", "genai_fp32", "genai_int4")


@dataclass
class Cell:
    nodes: int | None = None
    ms: float | None = None
    status: str = "ok"
    """``ok``, ``diff``, ``fail`` or ``size``."""
    detail: str = ""


@dataclass
class Row:
    model: str
    nodes_before: int
    cells: dict[str, Cell] = field(default_factory=dict)

    def _correct_peers(self) -> list[Cell]:
        # a peer whose file grew is still correct: only its outputs decide
        return [c for t, c in self.cells.items() if t != "onnxforge" and c.status in ("ok", "size")]

    def best_peer(self) -> int | None:
        """Fewest nodes among the peers whose outputs are correct."""
        counts = [c.nodes for c in self._correct_peers()]
        return min(counts) if counts else None

    def fastest_peer(self) -> float | None:
        """Shortest optimize time (ms) among the peers whose outputs are correct."""
        times = [c.ms for c in self._correct_peers()]
        return min(times) if times else None


model_nodes = proto_nodes


def file_bytes(path: Path) -> int:
    """Size of a model file plus the external data files it names."""
    proto = onnx.load_model(str(path), load_external_data=False)
    total = path.stat().st_size
    names: set[str] = set()
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return total + sum((path.parent / n).stat().st_size for n in names)


def _idle() -> None:
    gc.collect()
    time.sleep(IDLE_S)


# --------------------------------------------------------------------- the tools
# Each returns (prepare, run, to_proto): prepare makes a fresh in-memory input
# (not timed), run optimizes it (timed), to_proto gives a ModelProto to save.

def _forge(path: Path) -> tuple[Callable[[], Any], Callable[[Any], Any], Callable[[Any, Path], None]]:
    return (lambda: of.load(str(path)), lambda m: of.optimize(m),
            lambda m, out: of.save(m, out))


def _proto_tool(path: Path, run: Callable[[onnx.ModelProto], onnx.ModelProto]):
    proto = onnx.load_model(str(path))
    data = proto.SerializeToString()
    return (lambda: onnx.load_model_from_string(data), run,
            lambda m, out: onnx.save_model(m, str(out)))


def _slim(path: Path):
    import onnxslim

    return _proto_tool(path, lambda m: onnxslim.slim(m))


def _onnxsim(path: Path):
    import onnxsim

    def run(m: onnx.ModelProto) -> onnx.ModelProto:
        simplified, _ = onnxsim.simplify(m, check_n=0)
        return simplified

    return _proto_tool(path, run)


def _onnxoptimizer(path: Path):
    import onnxoptimizer

    return _proto_tool(path, lambda m: onnxoptimizer.optimize(m))


def _onnxscript(path: Path):
    import onnx_ir as ir
    import onnxscript.optimizer

    proto = onnx.load_model(str(path))
    data = proto.SerializeToString()

    def run(m: Any) -> Any:
        onnxscript.optimizer.optimize(m)
        return m

    return (lambda: ir.serde.deserialize_model(onnx.load_model_from_string(data)), run,
            lambda m, out: onnx.save_model(ir.serde.serialize_model(m), str(out)))


_FACTORIES = {"onnxforge": _forge, "onnxslim": _slim, "onnxsim": _onnxsim,
              "onnxoptimizer": _onnxoptimizer, "onnxscript": _onnxscript}


# --------------------------------------------------------------------- checking

def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run_all(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    return [[np.asarray(x) for x in session.run(names, f)] for f in feeds]


def _compare(expected: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> str:
    """``""`` when every output matches, else what differs."""
    for case, (want_all, have_all) in enumerate(zip(expected, got)):
        for k, (want, have) in enumerate(zip(want_all, have_all)):
            if want.shape != have.shape or want.dtype != have.dtype:
                return f"case {case} output {k}: {have.dtype}{list(have.shape)} vs {want.dtype}{list(want.shape)}"
            a, b = want.astype(np.float64), have.astype(np.float64)
            scale = max(1.0, float(np.abs(a).max(initial=0.0)))
            diff = float(np.abs(a - b).max(initial=0.0))
            if not diff <= RTOL * scale:
                return f"case {case} output {k}: max abs difference {diff:.3g} (scale {scale:.3g})"
    return ""


def measure(name: str, path: Path, feeds: list[dict[str, np.ndarray]], tools: tuple[str, ...],
            repeat: int, workdir: Path) -> Row:
    expected = _run_all(path, feeds)
    size_before = file_bytes(path)
    row = Row(name, model_nodes(onnx.load_model(str(path), load_external_data=False)))
    for tool in tools:
        cell = Cell()
        row.cells[tool] = cell
        out = workdir / f"{name}.{tool}.onnx"
        try:
            prepare, run, save = _FACTORIES[tool](path)
            with contextlib.redirect_stdout(sys.stderr):  # peers' chatter stays out of the table
                seconds, result = _best_fresh(prepare, run, repeat)
            cell.ms = seconds * 1e3
            save(result, out)
            cell.nodes = model_nodes(onnx.load_model(str(out), load_external_data=False))
        except Exception as exc:  # a peer's failure is a result to report, whatever it is
            cell.status, cell.detail = "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            continue
        try:
            mismatch = _compare(expected, _run_all(out, feeds))
        except Exception as exc:  # onnxruntime rejects the tool's model
            cell.status, cell.detail = "fail", f"onnxruntime: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        if mismatch:
            cell.status, cell.detail = "diff", mismatch
        elif file_bytes(out) > SIZE_RATIO_MAX * size_before:
            cell.status, cell.detail = "size", f"{file_bytes(out) / size_before:.2f}x the original's bytes"
    return row


def _best_fresh(prepare: Callable[[], Any], run: Callable[[Any], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        fresh = prepare()
        _idle()
        t0 = time.perf_counter()
        result = run(fresh)
        best = min(best, time.perf_counter() - t0)
    return best, result


def warm_up(tools: tuple[str, ...], path: Path) -> None:
    """Run every tool once, untimed, so that no row pays for first imports and caches."""
    for tool in tools:
        prepare, run, _ = _FACTORIES[tool](path)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                run(prepare())
        except Exception:  # a tool that fails here is measured (and reported) on its row
            pass


# --------------------------------------------------------------------- output

def _fmt(cell: Cell) -> str:
    if cell.status == "fail":
        return "!fail"
    mark = "" if cell.status == "ok" else f" !{cell.status}"
    return f"{cell.nodes}/{cell.ms:.0f}{mark}"


def render(rows: list[Row], tools: tuple[str, ...]) -> str:
    width = max(len(r.model) for r in rows) + 1
    head = (f"{'model':<{width}} {'before':>6} " + " ".join(f"{t:>16}" for t in tools)
            + f" {'nodes/best':>10} {'ms/fastest':>10}")
    lines = ["cells: nodes after / optimize ms; the last two columns divide onnxforge's by the best"
             " correct peer's", head, "-" * len(head)]
    notes = []
    for r in rows:
        best, fastest = r.best_peer(), r.fastest_peer()
        forge = r.cells.get("onnxforge")
        usable = forge is not None and forge.status == "ok"
        ratio = f"{forge.nodes / best:.2f}" if best and usable else "-"
        speed = f"{forge.ms / fastest:.2f}" if fastest and usable else "-"
        lines.append(f"{r.model:<{width}} {r.nodes_before:>6} "
                     + " ".join(f"{_fmt(r.cells[t]):>16}" for t in tools) + f" {ratio:>10} {speed:>10}")
        notes += [f"  {r.model} / {t}: {c.status}: {c.detail}" for t, c in r.cells.items() if c.status != "ok"]
    if notes:
        lines += ["", "marked cells:"] + notes
    return "\n".join(lines)


def _corpus(cache: Path, only: list[str] | None, decoders: bool) -> list[tuple[str, Path, list]]:
    models = fetch_all(cache)
    chosen = [(n, models[n], random_feeds(n, models[n], seed=17)) for n in NAMES if not only or n in only]
    if decoders:
        from tests.fixtures.decoders import VARIANT_DIRS, random_decoder_feeds

        for variant in DECODERS:
            path = cache / VARIANT_DIRS[variant] / "model.onnx"
            if path.is_file() and (not only or variant in only):
                chosen.append((variant, path, [random_decoder_feeds(path, seq=4, past=3, seed=17)]))
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", help="model names to measure")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--repeat", type=int, default=1, help="keep the best of N timed runs")
    parser.add_argument("--no-decoders", action="store_true", help="skip the cached decoder models")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    configured = os.environ.get("ONNXFORGE_FIXTURE_DIR")
    cache = Path(configured).expanduser().resolve() if configured else HERE.parent / ".fixture-cache"
    tools = tuple(args.tools)
    warnings.filterwarnings("ignore")
    rows = []
    corpus = _corpus(cache, args.only, not args.no_decoders)
    warm_up(tools, min((p for _, p, _ in corpus), key=lambda p: p.stat().st_size))
    with tempfile.TemporaryDirectory(prefix="wild-bench-") as tmp:
        for name, path, feeds in corpus:
            print(f"[wild] {name} ...", file=sys.stderr, flush=True)
            rows.append(measure(name, path, feeds, tools, max(1, args.repeat), Path(tmp)))
    if "onnxforge" in tools:  # a module running from its source is slower: say which build ran
        from onnxforge._compiled import summary

        print(f"onnxforge {of.__version__}: {summary()}")
    print(render(rows, tools))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
