"""``onnxforge generate MODEL (--prompt TEXT [--chat] | --prompt-ids 5,17,42 | --prompt-len P) [--new N] [--json]``.

With ``--prompt`` (or ``--chat``) MODEL is a folder or a ``.onnx`` whose folder holds the
tokenizer: the text streams to stdout as tokens arrive and the stats go to stderr, through
:class:`~onnxforge.text.generator.Generator` (sampling: ``--temperature``, ``--top-k``,
``--top-p``, ``--repetition-penalty``, ``--seed``; ``--stop`` strings). With token ids:

Greedy decoding through :func:`~onnxforge.kernels_cy.runtime.state.make_state`: the caches
live in the state and are updated in place. A past/present decoder (the
onnxruntime-genai layout, or a ``torch.onnx`` export with Concat-based caches at
opset 20 or 23) is converted first (``make_stateful`` with a capacity of prompt +
new tokens). Per step it reports the latency, the bytes the state's
caches hold, the bytes allocated and copied by the run, and the address of every
cache buffer (constant when the caches are updated in place)::

    $ onnxforge generate builtin:decoder --prompt-ids 5,17,42 --new 4
    tokens 23 61 23 9
    step    ms  cache B  allocated B  copied B  addresses
       0 0.412    16384        14064         0  cache.0.key=0x55d0c1a3e0 ...

The per-call inputs are fed by the decoder's convention: ``input_ids`` always,
``position`` (tokens already in the cache, a scalar), ``attention_mask`` (ones of
the total length) and ``position_ids`` where the model has them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from onnxforge.commands.batch import add_batch_options, batch_command, wants_batch
from onnxforge.commands.cache import add_cache_options, cache_options
from onnxforge.commands.text import add_text_options, no_text_options, text_command
from onnxforge.graphbuilder.ir.core import Model
from onnxforge.kernels_cy.errors import FeedError, StateError
from onnxforge.text.generator import check_decoder, context_of, last_logits, step_feeds

__all__ = ["SUMMARY", "add_generate_parser", "generate", "generate_command"]

SUMMARY = "decode text or tokens through the persistent state (caches updated in place)"


def add_generate_parser(subparsers: Any, **parser_kwargs: Any) -> argparse.ArgumentParser:
    """Add the ``generate`` command to ``subparsers`` (``parser_kwargs`` go to ``add_parser``)."""
    parser_kwargs.setdefault("help", SUMMARY)
    parser_kwargs.setdefault("description", SUMMARY)
    p = subparsers.add_parser("generate", **parser_kwargs)
    p.add_argument("model", help="model path (.onnx), or its folder (with --prompt or --chat)")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt (the model's folder holds tokenizer.json)")
    prompt.add_argument("--prompt-ids", metavar="IDS", help="comma-separated prompt token ids, e.g. 5,17,42")
    prompt.add_argument("--prompt-len", type=int, metavar="P", help="a synthetic prompt of P tokens")
    p.add_argument("--new", "--max-new", dest="new", type=int, default=None, metavar="N",
                   help="tokens to generate (required with token ids; with text: until EOS or the context)")
    add_text_options(p)
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="bound the backend's threads and BLAS to N (default: every core)")
    add_cache_options(p)
    add_batch_options(p, prompt)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=generate_command)
    return p


def _prompt(args: argparse.Namespace) -> list[int]:
    if args.prompt_ids is None and args.prompt_len is None:
        raise FeedError("give a prompt: --prompt TEXT, --chat, --prompt-ids IDS or --prompt-len P")
    if args.prompt_ids is not None:
        try:
            ids = [int(t) for t in str(args.prompt_ids).split(",") if t.strip()]
        except ValueError:
            raise FeedError(f"--prompt-ids {args.prompt_ids!r}: expected comma-separated integers") from None
    else:
        if args.prompt_len is None or args.prompt_len < 1:
            raise FeedError(f"--prompt-len must be a positive int, got {args.prompt_len!r}")
        ids = [1 + (7 * i) % 31 for i in range(args.prompt_len)]
    if not ids:
        raise FeedError("the prompt is empty")
    return ids


def _stateful(model: Model, capacity: int, options: dict[str, Any] | None = None,
              genai_config: dict[str, Any] | None = None) -> Model:
    """``model`` itself when it declares bindings, else its stateful rewrite (with the
    ``genai_config.json`` of the model's folder, when it has one); ``options``: ``cache``,
    ``page_size`` and ``formats`` of ``make_stateful``."""
    from onnxforge.passes.stateful.convert import make_stateful

    options = dict(options or {})
    if model.graph.bindings:
        _no_layout_for_stateful(options)
        return model
    return make_stateful(model, max_length=capacity, batch=1, genai_config=genai_config, **options)


def _fit(prompt: list[int], new: int, limit: int, source: str) -> int:
    """``new``, clamped so that every fed position (prompt, then each generated token but
    the last) fits in ``limit``; a prompt longer than ``limit`` is an error."""
    if len(prompt) > limit:
        raise FeedError(f"the prompt has {len(prompt)} tokens, more than the {limit} the model can "
                        f"attend to ({source}); shorten the prompt")
    return min(new, limit - len(prompt) + 1)


def _no_layout_for_stateful(options: dict[str, Any]) -> None:
    if options:
        raise StateError("the model is stateful already (it declares persistent bindings): its cache "
                         "layout is fixed, so --cache, --page-size and --formats do not apply")


def _capacity(state: Any) -> int | None:
    caps = [b.shape[-2] for b in state.bindings
            if b.read_write and b.shape and len(b.shape) >= 2 and isinstance(b.shape[-2], int)]
    return min(caps) if caps else None


def generate(model: Model | str, prompt: list[int], new: int, *, threads: int | None = None,
             progress: bool = True, cache: dict[str, Any] | None = None,
             warn: Callable[[str], None] | None = None,
             config_from: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Decode ``new`` tokens after ``prompt`` greedily; returns the per-step report.

    ``config_from``: the model file whose folder's ``genai_config.json`` applies (default:
    ``model`` when it is a path; the command line loads the file verified and passes its
    IR with the path here, so the file is read once).

    ``cache``: ``make_stateful`` keywords for a model that is converted first
    (``{"cache": "paged", "page_size": 16, "formats": "float32,int8"}``); with a paged
    cache the report adds ``page_formats`` (per step, each cache's page formats from
    the oldest page, None for a page not allocated).

    ``new`` is clamped, before decoding, to the model's context: genai_config.json's
    ``context_length`` when the model's folder has one, else the rotary cache's rows,
    else the state's cache capacity. ``warn`` is then called with a message and the
    report adds ``clamped`` (``{"asked", "new", "context", "source"}``). A prompt
    longer than the context raises :class:`FeedError`."""
    from onnxforge.kernels_cy.runtime.state import make_state
    from onnxforge.passes.stateful.convert import read_genai_config

    if new < 1:
        raise FeedError(f"--new must be a positive int, got {new!r}")
    if config_from is None and not isinstance(model, Model):
        config_from = model
    config = read_genai_config(config_from) if config_from is not None else None
    if not isinstance(model, Model):
        from onnxforge.graphbuilder import serde

        model = serde.load(model)
    asked, clamped = new, None
    context = context_of(model, config)
    if context is not None:
        new = _fit(prompt, new, *context)
        clamped = context if new < asked else None
    model = _stateful(model, len(prompt) + new, cache, config)
    state = make_state(model, threads=threads, dims={"batch_size": 1, "batch": 1})
    try:
        free = check_decoder(model, state)
        cap = _capacity(state)
        if cap is not None and len(prompt) + new - 1 > cap:
            new = _fit(prompt, new, cap, "the capacity of the state's caches")
            clamped = (cap, "the capacity of the state's caches")
        report: dict[str, Any] = {"tokens": [], "step_ms": [], "cache_bytes": [], "allocated_bytes": [],
                                  "copied_bytes": [], "cache_addresses": []}
        if clamped is not None:
            report["clamped"] = {"asked": asked, "new": new, "context": clamped[0], "source": clamped[1]}
            if warn is not None:
                warn(f"--new {asked} clamped to {new}: the prompt ({len(prompt)} tokens) and the "
                     f"generated tokens fill the model's context of {clamped[0]} positions ({clamped[1]})")
        values = state.values  # a paged cache is updated in place: the same object every step
        paged = {b.input: values[b.input] for b in state.bindings
                 if b.structured and hasattr(values[b.input], "page_formats")}
        if paged:
            report["page_formats"] = []
        from tqdm import tqdm

        ids, done = list(prompt), 0
        for _ in tqdm(range(new), desc="generate", unit="tok", file=sys.stderr, disable=not progress):
            feeds = step_feeds(free, ids, done)
            t0 = time.perf_counter()
            out = state.run(feeds)
            ms = (time.perf_counter() - t0) * 1e3
            done += len(ids)
            token = int(last_logits(out).argmax())
            c = state.last_run
            report["tokens"].append(token)
            report["step_ms"].append(round(ms, 4))
            report["cache_bytes"].append(c.cache_bytes)
            report["allocated_bytes"].append(c.allocated_bytes)
            report["copied_bytes"].append(c.copied_bytes)
            report["cache_addresses"].append(state.addresses())
            if paged:
                report["page_formats"].append({k: c.page_formats() for k, c in paged.items()})
            ids = [token]
        return report
    finally:
        state.close()


def generate_command(args: argparse.Namespace, label: str | None = None) -> int:
    """Run ``generate`` for ``args.model`` (a path or an IR model); returns the exit status."""
    if args.prompt is not None or args.chat:
        return text_command(args)
    no_text_options(args)
    if wants_batch(args):
        return batch_command(args, None if args.prompts_file is not None else _prompt(args))
    prompt = _prompt(args)
    if args.new is None:
        raise FeedError("--new N is required with --prompt-ids and --prompt-len")
    report = generate(args.model, prompt, int(args.new), threads=args.threads,
                      progress=not getattr(args, "quiet", False), cache=cache_options(args),
                      warn=lambda message: print(f"warning: {message}", file=sys.stderr, flush=True),
                      config_from=getattr(args, "config_from", None))
    if args.json:
        print(json.dumps(report))
        return 0
    print("tokens " + " ".join(str(t) for t in report["tokens"]))
    print(f"{'step':>4} {'ms':>8} {'cache B':>10} {'allocated B':>12} {'copied B':>9}  addresses")
    for i, ms in enumerate(report["step_ms"]):
        addrs = " ".join(f"{k}=0x{a:x}" for k, a in report["cache_addresses"][i].items())
        print(f"{i:>4} {ms:>8.3f} {report['cache_bytes'][i]:>10} {report['allocated_bytes'][i]:>12} "
              f"{report['copied_bytes'][i]:>9}  {addrs}")
    return 0
