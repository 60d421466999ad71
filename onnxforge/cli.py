"""onnxforge command line.

    onnxforge inspect MODEL [--json] [--values]   opsets, ops, inputs/outputs with symbolic shapes,
                                                  initializer bytes, catalogue, encoded values,
                                                  bindings and aliases (--values: every value's type)
    onnxforge verify MODEL [--json]               static rules; exit 1 on any violation
    onnxforge optimize MODEL -o OUT [--passes a,b] [--debug]
                                                  default pipeline (or the named passes), with a
                                                  report: nodes, initializers, bytes, time per pass
    onnxforge export MODEL -o DIR                 standard ONNX + feedback.json (+ genai_config.json)
    onnxforge demo [-o DIR]                       the built-in stateful decoder through the toolchain

MODEL may be ``builtin:decoder`` to use the decoder the package builds itself.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from onnxforge.errors import OnnxforgeError

__all__ = ["main", "build_parser"]


_BUILTIN = "builtin:"


def _read_model(source: str) -> tuple[Any, str | None]:
    """Extended ModelProto message and its folder (for external data)."""
    from onnxforge.proto_ext import schema

    if source.startswith(_BUILTIN):
        from onnxforge.samples import builtin_model

        return schema.from_onnx(builtin_model(source[len(_BUILTIN):])), None
    return schema.read_model(source)


def _load_ir(source: str):
    from onnxforge.api import load

    if source.startswith(_BUILTIN):
        from onnxforge.samples import build_builtin

        return build_builtin(source[len(_BUILTIN):])
    return load(source)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from onnxforge.graphbuilder.shapes import ShapesContext
    from onnxforge.graphbuilder.view import model_view
    from onnxforge.report import format_type, render_text, summarize

    model = _load_ir(args.model)
    ctx = ShapesContext(model, strict=False)
    ctx.infer_graph(model.graph)
    sizes = {v.name: v.const.nbytes for g in model.all_graphs() for v in g.all_initializers()}
    summary = summarize(model_view(model), sizes)
    if args.values:
        summary["values"] = {v.name: format_type(v.type) for v in model.graph.values() if v.name}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render_text(summary))
        if args.values:
            print("values:")
            for name, t in summary["values"].items():
                print(f"  {name}: {t}")
    return 0


def _model_stats(model) -> dict[str, int]:
    inits = [v for g in model.all_graphs() for v in g.all_initializers()]
    return {"nodes": sum(len(g) for g in model.all_graphs())
            + sum(len(f) for f in model.functions.values()),
            "initializers": len(inits),
            "initializer_bytes": sum(v.const.nbytes for v in inits)}


PROGRESS_MIN_NODES = 5_000


def _cmd_optimize(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from onnxforge.api import save
    from onnxforge.passes.pipeline import DEFAULT_PIPELINE, default_pass_manager

    t0 = time.perf_counter()
    model = _load_ir(args.model)
    load_s = time.perf_counter() - t0
    before = _model_stats(model)
    names = [p.strip() for p in args.passes.split(",")] if args.passes else list(DEFAULT_PIPELINE)
    bar = tqdm(total=len(names), desc="optimize", unit="pass", file=sys.stderr,
               disable=args.quiet or before["nodes"] < PROGRESS_MIN_NODES)

    def progress(record) -> None:
        bar.set_postfix_str(f"{record.name}: {record.nodes_after} nodes")
        bar.update(1)

    pm = default_pass_manager(names, debug=args.debug, progress=progress)
    pm(model)
    bar.close()
    after = _model_stats(model)
    t1 = time.perf_counter()
    save(model, args.output)
    save_s = time.perf_counter() - t1
    report = {"load_seconds": round(load_s, 4), "save_seconds": round(save_s, 4),
              "before": before, "after": after,
              "passes": [{"name": r.name, "seconds": round(r.seconds, 4), "modified": r.modified,
                          "nodes_before": r.nodes_before, "nodes_after": r.nodes_after}
                         for r in pm.records]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{'':<20} {'before':>14} {'after':>14}")
    for key in ("nodes", "initializers", "initializer_bytes"):
        print(f"{key:<20} {before[key]:>14,} {after[key]:>14,}")
    print()
    print(pm.report())
    print(f"\nload {load_s:.3f} s, save {save_s:.3f} s -> {args.output}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from onnxforge.passes.export import export_to_dir

    model = _load_ir(args.model)
    written = export_to_dir(model, args.output, target_opset=args.target_opset,
                            keep_domains=tuple(args.keep_domain or ()))
    for path in (written.values() if isinstance(written, dict) else [written]):
        print(f"wrote {path}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from onnxforge.proto_ext.verify import check

    model, folder = _read_model(args.model)
    violations = check(model, folder)
    if args.json:
        print(json.dumps([{"rule": v.rule, "path": v.path, "message": v.message} for v in violations],
                         indent=2))
    else:
        for v in violations:
            print(str(v))
        if not violations:
            print(f"{args.model}: OK")
        else:
            print(f"{args.model}: {len(violations)} violation(s)", file=sys.stderr)
    return 1 if violations else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from onnxforge.samples import run_demo

    return run_demo(args.output)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onnxforge",
        description="Graph-rewriting toolkit for stateful ONNX models.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    insp = sub.add_parser("inspect", help="summarize a model")
    insp.add_argument("model", help="model path or builtin:decoder")
    insp.add_argument("--json", action="store_true", help="print JSON instead of text")
    insp.add_argument("--values", action="store_true",
                      help="also list every value's inferred (symbolic) type")
    insp.set_defaults(func=_cmd_inspect)

    opt = sub.add_parser("optimize", help="run the optimization pipeline and save the result")
    opt.add_argument("model", help="model path or builtin:decoder")
    opt.add_argument("-o", "--output", required=True, help="output model path")
    opt.add_argument("--passes", help="comma-separated pass names (default: the default pipeline)")
    opt.add_argument("--debug", action="store_true", help="check invariants after every pass")
    opt.add_argument("--json", action="store_true", help="print the report as JSON")
    opt.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    opt.set_defaults(func=_cmd_optimize)

    exp = sub.add_parser("export", help="lower to standard ONNX and write a folder")
    exp.add_argument("model", help="model path or builtin:decoder")
    exp.add_argument("-o", "--output", required=True, help="output folder")
    exp.add_argument("--target-opset", type=int, default=None, help="default opset to target")
    exp.add_argument("--keep-domain", action="append",
                     help="keep operators of this domain (e.g. com.microsoft for onnxruntime)")
    exp.set_defaults(func=_cmd_export)

    ver = sub.add_parser("verify", help="check the static rules (exit 1 on violations)")
    ver.add_argument("model", help="model path or builtin:decoder")
    ver.add_argument("--json", action="store_true", help="print violations as JSON")
    ver.set_defaults(func=_cmd_verify)

    demo = sub.add_parser("demo", help="build the built-in stateful decoder and run the toolchain")
    demo.add_argument("-o", "--output", default="onnxforge-demo", help="output folder")
    demo.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OnnxforgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
