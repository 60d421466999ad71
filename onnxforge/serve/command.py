"""``onnxforge serve MODEL [--host H] [--port P] [--model-name NAME] [--max-sequences N] ...``.

MODEL is a folder holding the decoder and its tokenizer files, or a ``.onnx`` whose folder
holds them. The engine is built once, then uvicorn serves the app on ``--host`` and
``--port`` (``--port 0``: a free port); the line ``serving NAME on http://HOST:PORT``
says where. Ctrl-C stops accepting connections and lets the requests in flight finish
for at most 30 s; a second Ctrl-C stops at once.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from onnxforge.errors import OnnxforgeError

__all__ = ["SUMMARY", "add_serve_parser", "serve_command"]

SUMMARY = "serve a decoder over HTTP with the OpenAI API (completions, chat completions, streaming)"
DRAIN_SECONDS = 30


class ServeError(OnnxforgeError):
    """The server cannot start (missing packages, a port in use, no tokenizer)."""


def add_serve_parser(subparsers: Any, **parser_kwargs: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` command to ``subparsers`` (``parser_kwargs`` go to ``add_parser``)."""
    p = subparsers.add_parser("serve", **parser_kwargs)
    p.add_argument("model", help="a model folder with tokenizer.json, or a .onnx whose folder has one")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: a free port)")
    p.add_argument("--model-name", metavar="NAME", default=None,
                   help="the model's name in the API (default: the model folder's name)")
    p.add_argument("--max-sequences", type=int, default=8, metavar="N",
                   help="sequences decoded together (default 8); 4 x N more may wait, then 429")
    p.add_argument("--page-size", type=int, default=16, metavar="P", help="tokens per KV page (default 16)")
    p.add_argument("--formats", default="float32", metavar="F,F,...",
                   help="page formats from the newest page to older ones (default float32)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="backend threads")
    return p


class _OneLine(logging.Filter):
    """The server's errors as one line (the command line shows tracebacks only with
    ``--traceback``); the cancellations of a forced stop (a second Ctrl-C) are not errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        e = record.exc_info[1] if record.exc_info else None
        if isinstance(e, asyncio.CancelledError):
            return False
        if e is not None:
            record.msg, record.args = f"{record.getMessage()}: {type(e).__name__}: {e}", ()
            record.exc_info, record.exc_text = None, None
        return True


def _imports() -> Any:
    try:
        import uvicorn

        from onnxforge.serve.app import create_app
    except ImportError as e:
        raise ServeError(f"onnxforge serve needs the 'serve' extra ({e.name} is missing): "
                         f"pip install 'onnxforge[serve]'") from None
    return uvicorn, create_app


def serve_command(args: argparse.Namespace) -> int:
    """Build the engine, serve until interrupted; returns the exit status."""
    uvicorn, create_app = _imports()
    from onnxforge.engine.engine import Engine
    from onnxforge.text.generator import model_file
    from onnxforge.text.tokenizer import TextTokenizer

    given = Path(args.model)
    if not given.exists():
        raise ServeError(f"{given}: no such file or folder")
    path = model_file(given)
    folder = given if given.is_dir() else given.parent
    tokenizer = TextTokenizer(folder)
    name = args.model_name or folder.resolve().name
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    with Engine(str(path), max_sequences=args.max_sequences, page_size=args.page_size, formats=args.formats,
                threads=args.threads) as engine:
        app = create_app(engine, tokenizer, model_name=name, max_inflight=5 * args.max_sequences)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=DRAIN_SECONDS, lifespan="off")
        server = uvicorn.Server(config)
        if not getattr(args, "traceback", False):
            logging.getLogger("uvicorn.error").addFilter(_OneLine())
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"serving {name} on http://{shown}:{port}", flush=True)
        try:
            server.run(sockets=[sock])
        finally:
            app.state.server.loop.close(timeout=5)
            sock.close()
    print("stopped", file=sys.stderr)
    return 0
