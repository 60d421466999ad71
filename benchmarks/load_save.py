"""Load and save times of onnxforge next to onnx and onnx_ir, measured in the same run.

Models: the 20,000-node synthetic chain (``/work/shared/bench/chain_model.py``,
override with ``--chain-script``) and, when they have been built, the exported
tiny decoders of the test fixture cache (``$ONNXFORGE_FIXTURE_DIR`` or
``<repo>/.fixture-cache``).

Each (model, tool) pair runs in its own subprocess, so that imports and peak
memory do not leak between tools. A child loads the model ``--repeat`` times and
saves it as many times (to a fresh folder each time) and reports the best time
of each, the time a full ``gc.collect()`` takes right after a load (object-heavy
IRs pay it sooner or later), and the growth of its peak resident memory
(``VmHWM``, reset after the imports) over the size after the imports.

Tools and their defaults:

* ``onnx``: ``onnx.load`` (reads external data into the message) / ``onnx.save``;
* ``onnx_ir``: ``onnx_ir.load`` / ``onnx_ir.save``;
* ``onnxforge``: ``serde.load`` (memory-mapped, external data mapped) /
  ``serde.save`` (payloads keep their storage).

Saves go to a fresh folder. For models with external data (the genai
decoders) onnxforge copies the data file there; ``onnx_ir.save`` writes
references to a data file that the new folder does not have, and ``onnx.save``
writes the payloads inline, so the three save columns do different amounts of work.

    python benchmarks/load_save.py [--nodes 20000] [--repeat 3] [--tools onnx onnx_ir onnxforge]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CHAIN = Path("/work/shared/bench/chain_model.py")
TOOLS = ("onnx", "onnx_ir", "onnxforge")
DECODER_DIRS = {"torch20": "torch_opset20", "torch23": "torch_opset23",
                "genai_fp32": "genai_fp32", "genai_int4": "genai_int4"}

_CHILD = textwrap.dedent(r"""
    import gc, json, os, resource, shutil, sys, tempfile, time
    tool, path, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if tool == "onnx":
        import onnx
        load = lambda p: onnx.load(p)
        save = lambda m, p: onnx.save(m, p)
    elif tool == "onnx_ir":
        import onnx_ir
        load = lambda p: onnx_ir.load(p)
        save = lambda m, p: onnx_ir.save(m, p)
    else:
        from onnxforge.graphbuilder import serde
        load = lambda p: serde.load(p)
        save = lambda m, p: serde.save(m, p)

    def status(key):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    try:  # reset the peak to the current size, so that imports do not count
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    base = status("VmRSS")
    loads, saves, collects = [], [], []
    model = None
    for _ in range(repeat):
        model = None
        gc.collect()
        t = time.perf_counter()
        model = load(path)
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        gc.collect()
        collects.append(time.perf_counter() - t)
    for _ in range(repeat):
        out = tempfile.mkdtemp(prefix="bench-")
        try:
            t = time.perf_counter()
            save(model, os.path.join(out, "model.onnx"))
            saves.append(time.perf_counter() - t)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"load": min(loads), "save": min(saves), "gc": min(collects),
                      "peak": status("VmHWM") - base}))
""")


def _chain_model(nodes: int, script: Path, folder: Path) -> Path:
    spec = importlib.util.spec_from_file_location("chain_model", script)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import onnx

    path = folder / f"chain_{nodes}.onnx"
    onnx.save(module.build(nodes), str(path))
    return path


def _decoders() -> dict[str, Path]:
    root = Path(os.environ.get("ONNXFORGE_FIXTURE_DIR", REPO / ".fixture-cache"))
    found = {}
    for name, sub in DECODER_DIRS.items():
        path = root / sub / "model.onnx"
        if path.exists():
            found[name] = path
    return found


def _run(tool: str, path: Path, repeat: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, tool, str(path), str(repeat)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} on {path} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt_ratio(a: float, b: float) -> str:
    return f"{a / b:5.2f}x" if b > 0 else "   - "


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chain-script", type=Path, default=DEFAULT_CHAIN)
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--no-decoders", action="store_true")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="onnxforge-bench-") as tmp:
        models = {f"chain{args.nodes}": _chain_model(args.nodes, args.chain_script, Path(tmp))}
        if not args.no_decoders:
            models.update(_decoders())
        results: dict[tuple[str, str], dict[str, float]] = {}
        for name, path in models.items():
            for tool in args.tools:
                results[(name, tool)] = _run(tool, path, args.repeat)

    head = (f"{'model':<12} {'tool':<10} {'load s':>8} {'save s':>8} {'gc s':>7} {'peak MB':>8}"
            f" {'load/onnx_ir':>13} {'save/onnx_ir':>13} {'load/onnx':>10} {'save/onnx':>10}")
    print(head)
    print("-" * len(head))
    for name in models:
        ref_ir = results.get((name, "onnx_ir"))
        ref_onnx = results.get((name, "onnx"))
        for tool in args.tools:
            r = results[(name, tool)]
            cols = [f"{name:<12} {tool:<10} {r['load']:8.3f} {r['save']:8.3f} {r['gc']:7.3f}"
                    f" {r['peak'] / 2**20:8.1f}"]
            for ref in (ref_ir, ref_onnx):
                width = 13 if ref is ref_ir else 10
                for key in ("load", "save"):
                    cell = _fmt_ratio(r[key], ref[key]) if ref else "-"
                    cols.append(f"{cell:>{width}}")
            print(" ".join(cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
