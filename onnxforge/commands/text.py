"""Text in, text out for ``onnxforge generate``: ``--prompt TEXT`` and ``--chat``.

The text streams to stdout as tokens arrive (never a partial UTF-8 character, never any
part of a ``--stop`` string); the stats of each call go to stderr::

    $ onnxforge generate qwen3-genai/ --prompt "Once upon a time" --new 32 --temperature 0.7 --seed 1
    , there was a ...
    prompt 5 tok (prefilled 5) | first token 3.1 ms | 32 tok at 180.2 tok/s | cache 65536 B
    | allocated 2048 B | copied 0 B | length        (one line)

``--chat`` renders the model's chat template and keeps the conversation in the state: each
turn prefills only what follows the longest common token prefix with what the state holds.
On a terminal it prompts for each turn; on a pipe each line of stdin is one user turn.
``--json`` streams nothing and prints one JSON object at the end (with ``--chat``: one per turn).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from onnxforge.kernels_cy.errors import FeedError
from onnxforge.text.errors import TokenizerFileError
from onnxforge.text.sampling import Sampling

__all__ = ["add_text_options", "no_text_options", "text_command"]

_SAMPLING = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")


def add_text_options(p: argparse.ArgumentParser) -> None:
    """``--chat``, the sampling options and ``--stop`` (they apply to text prompts)."""
    p.add_argument("--chat", action="store_true",
                   help="a conversation through the model's chat template (--prompt is the first turn; "
                        "else one user turn per line of stdin)")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="keep the K likeliest tokens (0: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling mass in (0, 1]")
    p.add_argument("--repetition-penalty", type=float, default=None, metavar="R",
                   help="divide the logits of tokens seen by R (1: off)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the sampler's generator")
    p.add_argument("--stop", action="append", default=None, metavar="STRING",
                   help="stop before this string (repeatable); it is never printed")


def no_text_options(args: argparse.Namespace) -> None:
    """Token-id prompts decode greedily: the text options are an error there."""
    given = [f"--{k.replace('_', '-')}" for k in (*_SAMPLING, "stop") if getattr(args, k, None) is not None]
    if given:
        raise FeedError(f"{', '.join(given)} apply to text prompts (--prompt or --chat), not to token ids")


def _sampling(args: argparse.Namespace) -> Sampling:
    values = {k: getattr(args, k) for k in _SAMPLING if getattr(args, k, None) is not None}
    return Sampling(**values)


def _stats(report: dict[str, Any]) -> str:
    cache = report["cache_bytes"][-1] if report["cache_bytes"] else 0
    return (f"prompt {report['prompt_tokens']} tok (prefilled {report['prefilled_tokens']}) | first token "
            f"{report.get('time_to_first_token_ms', 0.0):.1f} ms | {report['new_tokens']} tok at "
            f"{report['tokens_per_s']:.1f} tok/s | cache {cache} B | allocated {sum(report['allocated_bytes'])} B"
            f" | copied {sum(report['copied_bytes'])} B | {report['finish_reason']}")


def _turn(gen: Any, ids: list[int], args: argparse.Namespace, sampling: Sampling) -> dict[str, Any]:
    pieces = gen.stream_ids(ids, max_new_tokens=args.new, stop=args.stop, sampling=sampling)
    for piece in pieces:
        if not args.json:
            sys.stdout.write(piece)
            sys.stdout.flush()
    report = gen.last_report
    if not args.json:
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(_stats(report), file=sys.stderr, flush=True)
    return report


def _lines() -> Any:
    """User turns: prompted for on a terminal, one per line on a pipe (blank lines skipped)."""
    tty = sys.stdin.isatty()
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")


def text_command(args: argparse.Namespace) -> int:
    """``generate`` with ``--prompt`` or ``--chat``; returns the exit status."""
    from onnxforge.commands.cache import cache_options
    from onnxforge.graphbuilder.ir.core import Model
    from onnxforge.text.generator import Generator

    sampling = _sampling(args)
    if args.new is not None and args.new < 1:
        raise FeedError(f"--new must be a positive int, got {args.new!r}")
    path = getattr(args, "config_from", None)
    if path is None and not isinstance(args.model, Model):
        path = args.model
    if path is None:
        raise TokenizerFileError("builtin:decoder", "a built-in model has no tokenizer: give token ids "
                                                    "(--prompt-ids) or a model folder with tokenizer.json")
    model = args.model
    if not isinstance(model, Model):
        from onnxforge.graphbuilder import serde
        from onnxforge.text.generator import model_file

        path = model_file(path)
        model = serde.load(path, verify=True)
    with Generator.from_model(model, Path(path), threads=args.threads, cache=cache_options(args)) as gen:
        if not args.chat:
            report = _turn(gen, gen.tokenizer.encode(args.prompt), args, sampling)
            if args.json:
                print(json.dumps(report))
            return 0
        gen.tokenizer.apply_chat_template([])  # no template: fail before reading a turn
        messages: list[dict[str, str]] = []
        reports = []
        for line in ([args.prompt] if args.prompt is not None else _lines()):
            messages.append({"role": "user", "content": line})
            report = _turn(gen, gen.tokenizer.encode_chat(messages), args, sampling)
            messages.append({"role": "assistant", "content": report["text"]})
            reports.append(report)
        if args.json:
            print(json.dumps({"turns": reports}))
    return 0
