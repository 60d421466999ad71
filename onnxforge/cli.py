"""onnxforge command line (``onnxforge ...`` or ``python -m onnxforge ...``).

    onnxforge inspect MODEL [--json] [--values]   opsets, ops, inputs/outputs with symbolic shapes,
                                                  initializer bytes, catalogue, encoded values,
                                                  bindings and aliases (--values: every value's type)
    onnxforge verify MODEL [--json]               static rules; exit 1 on any violation
    onnxforge optimize MODEL -o OUT [--passes a,b] [--opset 23] [--debug] [--json]
                                                  verify, then the default pipeline (or the named
                                                  passes), with a report: nodes, initializers,
                                                  bytes, time per pass (--opset 23: fuse into
                                                  the opset-23 Attention / RMSNormalization)
    onnxforge export MODEL -o DIR [--json]        verify, then standard ONNX + feedback.json
                                                  (+ genai_config.json)
    onnxforge run MODEL [--inputs FILE.npz] [-o OUT.npz] [--threads N] [--json]
                                                  run on the CPU backend: outputs, timing,
                                                  bytes allocated and copied
    onnxforge stateful MODEL -o OUT --max-length N [--bind IN=OUT ...] [--cache paged
                      [--page-size N] [--formats F,...]] [--json]
                                                  past/present decoder -> in-place stateful model
                                                  (persistent bindings, capacity-N caches)
    onnxforge generate MODEL (--prompt TEXT [--chat] | --chat | --prompt-ids 5,17,42 | --prompt-len P)
                      [--new N] [--temperature T --top-k K --top-p P --repetition-penalty R
                      --seed S] [--stop STRING ...] [--cache paged [--page-size N]
                      [--formats F,...]] [--json]
                                                  decode through the in-place state: streamed
                                                  text (with the model folder's tokenizer) or
                                                  tokens, per-token latency, cache bytes,
                                                  allocations, copies, cache addresses
    onnxforge serve MODEL [--host H] [--port P] [--model-name NAME] [--max-sequences N]
                      [--page-size P] [--formats F,...] [--threads N]
                                                  an OpenAI-compatible HTTP server on the engine
                                                  (/v1/completions, /v1/chat/completions,
                                                  /v1/models, /health, /metrics)
    onnxforge demo [-o DIR]                       the built-in stateful decoder through the toolchain

MODEL may be ``builtin:decoder`` to use the decoder the package builds itself (or
``builtin:rnn``, a stateless recurrent cell).

Exit status: 0 success; 1 the model breaks a static rule (the violations are
printed as ``[RULE] path: message``) or export rejected it; 2 a usage or file
error. Errors go to stderr, without a traceback unless ``--traceback`` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections import Counter
from typing import Any

from onnxforge.errors import ExportError, ExternalDataError, OnnxforgeError, VerificationError

__all__ = ["main", "build_parser", "CommandLineError"]


_BUILTIN = "builtin:"
EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class CommandLineError(OnnxforgeError):
    """A usage or file problem of a command (exit status 2)."""


# ------------------------------------------------------------------------------ inputs


def _wire_source(source: str) -> Any:
    """What the wire checks read: the path, or the ModelProto of a built-in model."""
    if source.startswith(_BUILTIN):
        from onnxforge.samples import builtin_model

        return builtin_model(source[len(_BUILTIN):])
    return source


def _builtin(source: str):
    """The IR model of ``builtin:NAME``."""
    from onnxforge.samples import build_builtin

    return build_builtin(source[len(_BUILTIN):])


def _load_ir(source: str, *, verified: bool = False):
    """The IR model of ``source``; ``verified`` checks the static rules first (on the
    wire for a file, so that nothing the IR cannot hold escapes the check; the file is
    read once, the IR decoded from the message the rules checked)."""
    from onnxforge.api import load, load_verified

    if source.startswith(_BUILTIN):
        model = _builtin(source)
        return load_verified(model) if verified else model
    return load_verified(source) if verified else load(source)


# ----------------------------------------------------------------------------- outputs


def _existing_ancestor(folder: str) -> str:
    while not os.path.lexists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def _check_writable_folder(folder: str, output: str) -> None:
    """``folder`` exists as a writable folder, or can be created inside one."""
    base = _existing_ancestor(folder)
    if not os.path.isdir(base):
        raise CommandLineError(f"cannot write {output}: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise CommandLineError(f"cannot write {output}: {base} is not writable")


def _output_file(path: str) -> str:
    """``path`` as the output model file; a folder there, or no way to create it, is an error."""
    if not path:
        raise CommandLineError("the output path is empty")
    if os.path.isdir(path):
        raise CommandLineError(f"output {path} is a folder; give the path of the model file to write")
    _check_writable_folder(os.path.dirname(os.path.abspath(path)), path)
    return path


def _output_dir(path: str) -> str:
    """``path`` as the output folder (created if missing); an existing file there is an error."""
    if not path:
        raise CommandLineError("the output folder is empty")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise CommandLineError(f"output {path} exists and is not a folder; give a folder path "
                               f"(it is created if missing)")
    _check_writable_folder(os.path.abspath(path), path)
    return path


def _refuse_clobbering(source: str, output_model: str, *others: str) -> None:
    """Refuse (exit 2, before anything is written) an output that is the input model or one
    of its data files, or a file another model in the output folder keeps its data in.
    ``output_model`` is written with its data in ``<output_model>.data``; ``others``: the
    command's other output files."""
    from onnxforge.proto_ext.outputs import check_targets, data_file_name

    data = os.path.join(os.path.dirname(os.path.abspath(output_model)), data_file_name(output_model))
    inputs = [] if source.startswith(_BUILTIN) else [source]
    check_targets([output_model, data, *others], inputs=inputs, replaces=output_model)


def _write_error(output: str, exc: OSError | ExternalDataError) -> CommandLineError:
    """The error for an output that could not be written (the input was valid)."""
    detail = (exc.strerror or str(exc)) if isinstance(exc, OSError) else exc.detail
    return CommandLineError(f"cannot write {output}: {detail}")


def _pass_names(spec: str | None) -> list[str] | None:
    """The ``--passes`` list (None: the default pipeline); an empty list or name is an error."""
    if spec is None:
        return None
    names = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not n for n in names):
        raise CommandLineError(f"--passes {spec!r} names an empty pass; give comma-separated pass "
                               f"names, or leave the option out for the default pipeline")
    return names


# ---------------------------------------------------------------------------- commands


def _cmd_inspect(args: argparse.Namespace) -> int:
    from onnxforge.graphbuilder.shapes.context import ShapesContext
    from onnxforge.graphbuilder.ir.view import model_view
    from onnxforge.report import format_type, render_text, summarize

    from onnxforge.progress import is_large, stages

    with stages("inspect", ["load", "infer shapes", "summarize"],
                enabled=not args.quiet and is_large(args.model)) as step:
        step("load")
        model = _load_ir(args.model)
        step("infer shapes")
        ctx = ShapesContext(model, strict=False)
        ctx.infer_graph(model.graph)
        step("summarize")
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
    return EXIT_OK


def _model_stats(model) -> dict[str, int]:
    inits = [v for g in model.all_graphs() for v in g.all_initializers()]
    return {"nodes": sum(len(g) for g in model.all_graphs())
            + sum(len(f) for f in model.functions.values()),
            "initializers": len(inits),
            "initializer_bytes": sum(v.const.nbytes for v in inits)}


PROGRESS_MIN_NODES = 5_000
PROGRESS_MIN_BYTES_SAVE = 64 << 20


def _copy_sidecars(source: str, output: str, model: Any, max_length: int | None = None) -> Any:
    """genai_config.json (updated, its changes recorded) and the other sidecar files of
    the source folder, next to ``output``; None when there is nothing to copy.
    ``max_length``: a stateful model's cache capacity (the config's ``search.max_length``)."""
    from onnxforge.passes.export.sidecar import GENAI_CONFIG, copy_sidecar_files

    if source.startswith(_BUILTIN):
        return None
    src_dir, out_dir = os.path.dirname(os.path.abspath(source)), os.path.dirname(os.path.abspath(output))
    if not os.path.isfile(os.path.join(src_dir, GENAI_CONFIG)) or os.path.samefile(src_dir, out_dir):
        return None
    try:
        return copy_sidecar_files(src_dir, out_dir, model_filename=os.path.basename(output), model=model,
                                  source_model=os.path.basename(source), max_length=max_length)
    except OSError as exc:
        raise _write_error(out_dir, exc) from exc


def _cmd_optimize(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from onnxforge.api import Optimization, save

    output = _output_file(args.output)
    _refuse_clobbering(args.model, output)
    given = _pass_names(args.passes)
    bar = None

    def progress(record) -> None:
        if bar is not None:
            bar.set_postfix_str(f"{record.name}: {record.nodes_after} nodes")
            bar.update(1)

    # the steps of onnxforge.optimize; unknown pass names fail here, before the model is loaded
    run = Optimization(given, debug=args.debug, opset=args.opset, progress=progress)
    from onnxforge.progress import is_large, stages

    t0 = time.perf_counter()
    with stages("load", ["verify and load"], enabled=not args.quiet and is_large(args.model)) as step:
        step("verify and load")
        model = _builtin(args.model) if args.model.startswith(_BUILTIN) else args.model
        model = run.load(model)
    load_s = time.perf_counter() - t0
    before = _model_stats(model)
    bar = tqdm(total=len(run.manager.passes), desc="optimize", unit="pass", file=sys.stderr,
               disable=args.quiet or before["nodes"] < PROGRESS_MIN_NODES)
    try:
        run(model)
    finally:
        bar.close()
    after = _model_stats(model)
    t1 = time.perf_counter()
    try:
        with stages("save", [output], enabled=not args.quiet and after["initializer_bytes"]
                    >= PROGRESS_MIN_BYTES_SAVE) as step:
            step(output)
            save(model, output)
    except (OSError, ExternalDataError) as exc:
        raise _write_error(output, exc) from exc
    save_s = time.perf_counter() - t1
    sidecar = _copy_sidecars(args.model, output, model)
    report = {"load_seconds": round(load_s, 4), "save_seconds": round(save_s, 4),
              "before": before, "after": after,
              "passes": [{"name": r.name, "seconds": round(r.seconds, 4), "modified": r.modified,
                          "nodes_before": r.nodes_before, "nodes_after": r.nodes_after}
                         for r in run.records],
              "output": output,
              "sidecar": sidecar.to_json() if sidecar is not None else None}
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(f"{'':<20} {'before':>14} {'after':>14}")
    for key in ("nodes", "initializers", "initializer_bytes"):
        print(f"{key:<20} {before[key]:>14,} {after[key]:>14,}")
    print()
    print(run.report())
    if sidecar is not None:
        for path in sidecar.copied.values():
            print(f"copied {path}")
        for change in sidecar.changes:
            print(change)
    print(f"\nload {load_s:.3f} s, save {save_s:.3f} s -> {output}")
    return EXIT_OK


def _op_key(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain not in ("", "ai.onnx") else op_type


def _ir_ops(model) -> Counter:
    ops: Counter = Counter()
    for g in model.all_graphs():
        ops.update(_op_key(n.domain, n.op_type) for n in g)
    for f in model.functions.values():
        ops.update(_op_key(n.domain, n.op_type) for n in f)
    return ops


def _proto_ops(graph: Any, ops: Counter) -> Counter:
    for n in graph.node:
        ops[_op_key(n.domain, n.op_type)] += 1
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _proto_ops(sub, ops)
    return ops


def _export_changes(model, written: dict[str, str]) -> dict[str, Any]:
    """What export changed: opsets, operators lowered or introduced, node count, feedback."""
    import onnx

    from onnxforge.passes.export import read_feedback
    from onnxforge.proto_ext.outputs import model_skeleton

    std = onnx.ModelProto.FromString(model_skeleton(written["model"]) or b"")  # payloads skipped, not copied
    before, after = _ir_ops(model), _proto_ops(std.graph, Counter())
    for f in std.functions:
        for n in f.node:
            after[_op_key(n.domain, n.op_type)] += 1
    opsets_after = {o.domain: o.version for o in std.opset_import}
    return {
        "opset_imports": {"before": dict(sorted(model.opset_imports.items())),
                          "after": dict(sorted(opsets_after.items()))},
        "nodes": {"before": sum(before.values()), "after": sum(after.values())},
        "ops_removed": sorted(set(before) - set(after)),
        "ops_added": sorted(set(after) - set(before)),
        "feedback": read_feedback(std),
        "genai_config_updated": "genai_config" in written,
        "genai_config_changes": _config_changes(written),
    }


def _config_changes(written: dict[str, str]) -> list[dict[str, Any]]:
    path = written.get("genai_config_changes")
    if not path:
        return []
    with open(path, encoding="utf-8") as fh:
        return list(json.load(fh))


def _cmd_export(args: argparse.Namespace) -> int:
    from onnxforge.passes.export import export_to_dir

    from onnxforge.progress import is_large, stages

    from onnxforge.passes.export.feedback import FEEDBACK_FILE
    from onnxforge.passes.export.sidecar import CHANGES_FILE, GENAI_CONFIG

    out_dir = _output_dir(args.output)
    _refuse_clobbering(args.model, os.path.join(out_dir, "model.onnx"),
                       *(os.path.join(out_dir, f) for f in (FEEDBACK_FILE, GENAI_CONFIG, CHANGES_FILE)))
    with stages("export", ["verify and load", "lower and write"],
                enabled=not args.quiet and is_large(args.model)) as step:
        step("verify and load")
        model = _load_ir(args.model, verified=True)
        # from a file, export loads its own copy from the file (mapped, not serialized again)
        source = model if args.model.startswith(_BUILTIN) else args.model
        step("lower and write")
        try:
            written = export_to_dir(source, out_dir, target_opset=args.target_opset,
                                    keep_domains=tuple(args.keep_domain or ()))
        except OSError as exc:
            raise _write_error(out_dir, exc) from exc
    if args.json:
        print(json.dumps({"output": out_dir, "written": written, **_export_changes(model, written)},
                         indent=2))
        return EXIT_OK
    for path in written.values():
        print(f"wrote {path}")
    for change in _config_changes(written):
        print(f"genai_config.json: {change['key']}: {json.dumps(change['before'])} -> "
              f"{json.dumps(change['after'])} ({change['reason']})")
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from onnxforge.api import check

    violations = check(_wire_source(args.model))
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
    return EXIT_INVALID if violations else EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    from onnxforge.commands.run import run_command

    label = args.model
    args.model = _load_ir(args.model, verified=True)
    return run_command(args, label=label)


def _cmd_generate(args: argparse.Namespace) -> int:
    from onnxforge.commands.generate import generate_command

    label = args.model
    if not str(args.model).startswith(_BUILTIN):  # genai_config.json sits beside the file
        from onnxforge.text.generator import model_file

        args.model = str(model_file(args.model))  # a folder: its decoder file
        args.config_from = args.model
    args.model = _load_ir(args.model, verified=True)
    return generate_command(args, label=label)


def _cmd_serve(args: argparse.Namespace) -> int:
    from onnxforge.serve.command import serve_command

    return serve_command(args)


def _bind_pairs(specs: list[str] | None) -> dict[str, str] | None:
    """``--bind IN=OUT`` options as ``{input: output}`` (None when none were given)."""
    if not specs:
        return None
    pairs: dict[str, str] = {}
    for spec in specs:
        inp, sep, out = spec.partition("=")
        if not sep or not inp.strip() or not out.strip():
            raise CommandLineError(f"--bind {spec!r}: expected INPUT=OUTPUT, e.g. --bind state=stateN")
        if inp.strip() in pairs:
            raise CommandLineError(f"--bind names input {inp.strip()!r} twice")
        pairs[inp.strip()] = out.strip()
    return pairs


def _cmd_stateful(args: argparse.Namespace) -> int:
    from onnxforge.api import save
    from onnxforge.passes.stateful.convert import make_stateful, read_genai_config

    output = _output_file(args.output)
    _refuse_clobbering(args.model, output)
    bindings = _bind_pairs(args.bind)
    if args.max_length < 1:
        raise CommandLineError(f"--max-length must be a positive int, got {args.max_length}")
    model = _load_ir(args.model, verified=True)
    config = None if args.model.startswith(_BUILTIN) else read_genai_config(args.model)
    from onnxforge.commands.cache import cache_options

    model = make_stateful(model, max_length=args.max_length, bindings=bindings, batch=args.batch,
                          genai_config=config, **cache_options(args))
    try:
        save(model, output)
    except (OSError, ExternalDataError) as exc:
        raise _write_error(output, exc) from exc
    # onnxruntime-genai cannot run paged caches: their model gets no genai_config.json
    sidecar = _copy_sidecars(args.model, output, model, args.max_length) if args.cache != "paged" else None
    pairs = [{"input": i.name, "output": o.name, "in_place": o.alias_of is i,
              "shape": list(i.type.shape) if getattr(i.type, "shape", None) is not None else None}
             for i, o in model.graph.bindings]
    report = {"output": output, "capacity": args.max_length, "bindings": pairs, "cache": args.cache,
              "page_size": args.page_size if args.cache == "paged" else None,
              "formats": args.formats.split(",") if args.cache == "paged" else None,
              "sidecar": sidecar.to_json() if sidecar is not None else None}
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    for p in pairs:
        how = f"in place, capacity {args.max_length}" if p["in_place"] else "persistent, not in place"
        print(f"bound {p['input']} <- {p['output']}  ({how})")
    if sidecar is not None:
        for path in sidecar.copied.values():
            print(f"copied {path}")
        for change in sidecar.changes:
            print(change)
    if args.cache == "paged":
        print(f"paged caches: {args.page_size} tokens per page, formats {args.formats} (newest page first)")
    print(f"{len(pairs)} binding(s), capacity {args.max_length} -> {output}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from onnxforge.samples import run_demo

    return run_demo(_output_dir(args.output), out=sys.stdout)


# ------------------------------------------------------------------------------ parser

_EXAMPLES = {
    "inspect": "onnxforge inspect builtin:decoder --values",
    "verify": "onnxforge verify builtin:decoder",
    "optimize": "onnxforge optimize builtin:decoder -o decoder.opt.onnx",
    "export": "onnxforge export builtin:decoder -o decoder-standard --json",
    "run": "onnxforge run builtin:decoder --threads 2 --json",
    "stateful": "onnxforge stateful builtin:rnn -o rnn.stateful.onnx --max-length 1 --bind state=stateN",
    "generate": "onnxforge generate builtin:decoder --prompt-ids 5,17,42 --new 8",
    "serve": "onnxforge serve qwen3-genai/ --port 8000 --max-sequences 8",
    "demo": "onnxforge demo -o onnxforge-demo",
}


def _version() -> str:
    """The version, and how many of the optimizer's compiled modules run compiled (one
    edited since the build, or all under ONNXFORGE_PURE_PYTHON=1, runs from its source)."""
    from onnxforge import __version__
    from onnxforge._compiled import summary

    return f"onnxforge {__version__} ({summary()})"


class _VersionAction(argparse.Action):
    """``--version``, worked out only when asked (it imports every compiled module)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(_version())  # to stdout, as argparse's own version action does
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="onnxforge",
        description="Graph-rewriting toolkit for stateful ONNX models.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--version", action=_VersionAction,
                   help="show the version and how many optimizer modules run compiled, and exit")
    p.add_argument("--traceback", action="store_true",
                   help="show the traceback of an error (errors are one line otherwise)")
    # also accepted after the command; SUPPRESS keeps a value given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=summary, parents=[common],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=f"example:\n  {_EXAMPLES[name]}")

    insp = command("inspect", "summarize a model")
    insp.add_argument("model", help="model path or builtin:decoder")
    insp.add_argument("--json", action="store_true", help="print JSON instead of text")
    insp.add_argument("--values", action="store_true",
                      help="also list every value's inferred (symbolic) type")
    insp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    insp.set_defaults(func=_cmd_inspect)

    ver = command("verify", "check the static rules (exit 1 on violations)")
    ver.add_argument("model", help="model path or builtin:decoder")
    ver.add_argument("--json", action="store_true", help="print violations as JSON")
    ver.set_defaults(func=_cmd_verify)

    opt = command("optimize", "verify the model, run the optimization pipeline and save the result")
    opt.add_argument("model", help="model path or builtin:decoder")
    opt.add_argument("-o", "--output", required=True, help="output model path")
    opt.add_argument("--passes", help="comma-separated pass names (default: the default pipeline)")
    opt.add_argument("--debug", action="store_true", help="check invariants after every pass")
    opt.add_argument("--opset", type=int, default=None,
                     help="newest default-domain opset the result may import: 23 fuses an older model's "
                          "decomposed attention and RMS norms into Attention / RMSNormalization")
    opt.add_argument("--json", action="store_true", help="print the report as JSON")
    opt.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    opt.set_defaults(func=_cmd_optimize)

    exp = command("export", "verify the model, lower it to standard ONNX and write a folder")
    exp.add_argument("model", help="model path or builtin:decoder")
    exp.add_argument("-o", "--output", required=True, help="output folder (created if missing)")
    exp.add_argument("--target-opset", type=int, default=None, help="default opset to target")
    exp.add_argument("--keep-domain", action="append",
                     help="keep operators of this domain (e.g. com.microsoft for onnxruntime)")
    exp.add_argument("--json", action="store_true",
                     help="print what was written and what export changed as JSON")
    exp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    exp.set_defaults(func=_cmd_export)

    from onnxforge.commands.run import SUMMARY as RUN_SUMMARY, add_run_parser

    run = add_run_parser(sub, help=RUN_SUMMARY, description=RUN_SUMMARY, parents=[common],
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=f"example:\n  {_EXAMPLES['run']}")
    run.set_defaults(func=_cmd_run)

    stf = command("stateful", "rewrite a past/present model into an in-place stateful one")
    stf.add_argument("model", help="model path or builtin:NAME")
    stf.add_argument("-o", "--output", required=True, help="output model path")
    stf.add_argument("--max-length", type=int, required=True, metavar="N",
                     help="cache capacity in tokens (prompt plus generated)")
    stf.add_argument("--bind", action="append", metavar="IN=OUT",
                     help="bind graph output OUT to input IN on the next call (repeatable); without "
                          "it, pairs come from genai_config.json or the names past_key_values.N.* / "
                          "present.N.*")
    stf.add_argument("--batch", type=int, default=None, help="fix a symbolic batch dimension")
    from onnxforge.commands.cache import add_cache_options

    add_cache_options(stf)
    stf.add_argument("--json", action="store_true", help="print the bindings as JSON")
    stf.set_defaults(func=_cmd_stateful)

    from onnxforge.commands.generate import SUMMARY as GEN_SUMMARY, add_generate_parser

    gen = add_generate_parser(sub, help=GEN_SUMMARY, description=GEN_SUMMARY, parents=[common],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=f"example:\n  {_EXAMPLES['generate']}")
    gen.set_defaults(func=_cmd_generate)

    from onnxforge.serve.command import SUMMARY as SERVE_SUMMARY, add_serve_parser

    srv = add_serve_parser(sub, help=SERVE_SUMMARY, description=SERVE_SUMMARY, parents=[common],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=f"example:\n  {_EXAMPLES['serve']}")
    srv.set_defaults(func=_cmd_serve)

    demo = command("demo", "build the built-in stateful decoder and run the toolchain")
    demo.add_argument("-o", "--output", default="onnxforge-demo", help="output folder")
    demo.set_defaults(func=_cmd_demo)
    return p


# -------------------------------------------------------------------------------- main


def _report_error(exc: BaseException, show_traceback: bool) -> int:
    """Print ``exc`` on stderr; return the exit status it stands for."""
    if show_traceback:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if isinstance(exc, VerificationError) and type(exc) is not VerificationError:
        print(f"error: {exc}", file=sys.stderr)  # e.g. a pass broke an invariant (--debug)
        return EXIT_INVALID
    if isinstance(exc, VerificationError):
        print(f"error: the model breaks {len(exc.violations)} static rule(s):", file=sys.stderr)
        for v in exc.violations:
            print(f"  {v}", file=sys.stderr)
        return EXIT_INVALID
    if isinstance(exc, ExportError) or (isinstance(exc, ExternalDataError) and exc.rule):
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if isinstance(exc, OnnxforgeError):
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"error: unexpected {type(exc).__name__}: {exc}"
          + ("" if show_traceback else " (run with --traceback to see where)"), file=sys.stderr)
    return EXIT_USAGE


def _silence_stdout() -> None:
    """After a reader closed the pipe: send further output (and the final flush) nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (tests capture it): nothing to flush
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show = bool(getattr(args, "traceback", False))
    try:
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        _silence_stdout()  # ``... | head``: the reader has what it wanted
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the command line's boundary: one line, or the traceback
        return _report_error(exc, show)


if __name__ == "__main__":
    sys.exit(main())
