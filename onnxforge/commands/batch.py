"""``onnxforge generate MODEL --prompt-ids IDS --new N --sequences K`` and
``onnxforge generate MODEL --prompts-file F --new N``: many requests at once on
:class:`~onnxforge.engine.Engine` (one batched run per step over one page pool).

``--sequences K`` decodes K copies of one prompt (the copies share its full pages);
``--prompts-file F`` one request per line of comma-separated token ids. Per request it
prints the tokens, then the aggregate tokens per second, the time to first token, the
pool's bytes and the pages shared::

    $ onnxforge generate model.onnx --prompt-ids 5,17,42 --new 8 --sequences 4
    request 0: 23 61 23 9 ...
    ...
    4 requests, 32 tokens in 0.051 s: 627.5 tokens/s; time to first token 12.1 ms (mean)
    pool 1835008 B, 131072 B used, 24 pages shared, 12 prefix hits, 9 steps

``--json`` prints one object instead. The engine's pages follow ``--page-size`` and
``--formats``; ``--cache contiguous`` has no batched form and is a usage error here.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from onnxforge.commands.cache import cache_options
from onnxforge.kernels_cy.errors import FeedError

__all__ = ["add_batch_options", "batch_command", "wants_batch"]


def add_batch_options(p: argparse.ArgumentParser, prompts: Any) -> None:
    """``--sequences K`` (on ``p``) and ``--prompts-file F`` (in the ``prompts`` group)."""
    prompts.add_argument("--prompts-file", metavar="F",
                         help="one request per line of comma-separated token ids, decoded together on the engine")
    p.add_argument("--sequences", type=int, default=None, metavar="K",
                   help="decode K copies of the prompt together on the engine (continuous batching)")
    p.add_argument("--max-step-tokens", type=int, default=256, metavar="N",
                   help="with --sequences or --prompts-file: rows of one batched step (default 256)")
    p.set_defaults(cache=None)  # an explicit --cache contiguous is refused with the engine


def wants_batch(args: argparse.Namespace) -> bool:
    return getattr(args, "sequences", None) is not None or getattr(args, "prompts_file", None) is not None


def _ids(text: str, where: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise FeedError(f"{where}: expected comma-separated token ids, got {text.strip()!r}") from None
    if not ids:
        raise FeedError(f"{where}: no token ids")
    return ids


def _requests(args: argparse.Namespace, prompt: list[int] | None) -> list[list[int]]:
    if args.prompts_file is not None:
        if args.sequences is not None:
            raise FeedError("--sequences copies one prompt; with --prompts-file each line is a request")
        lines = Path(args.prompts_file).read_text(encoding="utf-8").splitlines()
        out = [_ids(line, f"{args.prompts_file}:{k + 1}") for k, line in enumerate(lines) if line.strip()]
        if not out:
            raise FeedError(f"{args.prompts_file}: no prompt in the file")
        return out
    if args.sequences < 1:
        raise FeedError(f"--sequences must be >= 1, got {args.sequences}")
    assert prompt is not None
    return [list(prompt) for _ in range(args.sequences)]


def batch_command(args: argparse.Namespace, prompt: list[int] | None) -> int:
    """Decode the requests of ``args`` on one engine; returns the exit status."""
    from onnxforge.engine import Engine

    if args.cache == "contiguous":
        raise FeedError("--cache contiguous has no batched form: --sequences and --prompts-file decode "
                        "on a paged pool (--cache paged, the default here)")
    if args.new is None:
        raise FeedError("--new N is required with --sequences and --prompts-file")
    args.cache = "paged"
    layout = cache_options(args)
    requests = _requests(args, prompt)
    from onnxforge.passes.stateful.convert import read_genai_config

    source = getattr(args, "config_from", None) or (args.model if isinstance(args.model, str) else None)
    config = read_genai_config(source) if source is not None else None
    longest = max(len(q) for q in requests) + int(args.new)
    max_length = None if config and (config.get("model") or {}).get("context_length") else longest
    with Engine(args.model, genai_config=config, max_sequences=min(len(requests), 64), max_length=max_length,
                page_size=layout["page_size"], formats=layout["formats"], threads=args.threads,
                max_step_tokens=args.max_step_tokens) as engine:
        t0 = time.perf_counter()
        rids = [engine.add(q, int(args.new)) for q in requests]
        engine.run()
        seconds = time.perf_counter() - t0
        tokens = {rid: engine.result(rid) for rid in rids}
        stats = engine.stats
    count = sum(len(t) for t in tokens.values())
    ttft = [stats["ttft_ms"][rid] for rid in rids if rid in stats["ttft_ms"]]
    report = {
        "requests": [{"id": rid, "prompt_tokens": len(q), "tokens": tokens[rid],
                      "ttft_ms": stats["ttft_ms"].get(rid)} for rid, q in zip(rids, requests)],
        "tokens": count, "seconds": seconds, "tokens_per_second": count / seconds if seconds else None,
        "ttft_ms_mean": sum(ttft) / len(ttft) if ttft else None,
        "pool_bytes": stats["pool_bytes"], "used_bytes": stats["used_bytes"],
        "pages_shared": stats["pages_shared"], "prefix_hits": stats["prefix_hits"], "steps": stats["steps"],
        "preemptions": stats["preemptions"],
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for r in report["requests"]:
        print(f"request {r['id']}: " + " ".join(str(t) for t in r["tokens"]))
    rate = report["tokens_per_second"]
    mean = report["ttft_ms_mean"]
    print(f"{len(rids)} requests, {count} tokens in {seconds:.3f} s: "
          f"{rate:.1f} tokens/s; time to first token {mean:.1f} ms (mean)" if rate and mean is not None
          else f"{len(rids)} requests, {count} tokens in {seconds:.3f} s")
    print(f"pool {report['pool_bytes']} B, {report['used_bytes']} B used, {report['pages_shared']} pages shared, "
          f"{report['prefix_hits']} prefix hits, {report['steps']} steps")
    return 0
