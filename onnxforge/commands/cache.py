"""The cache layout options that ``onnxforge stateful`` and ``onnxforge generate`` share:
``--cache contiguous|paged``, ``--page-size N`` and ``--formats F,F,...``.

:func:`add_cache_options` adds them to a command's parser; :func:`cache_options`
turns the parsed arguments into ``make_stateful`` keywords::

    $ onnxforge stateful model.onnx -o out.onnx --max-length 64 --cache paged --formats float32,int8
    # make_stateful(model, max_length=64, cache="paged", page_size=16, formats="float32,int8")
"""
from __future__ import annotations

import argparse

from onnxforge.kernels_cy.errors import FeedError

__all__ = ["CacheOptions", "add_cache_options", "cache_options"]


class CacheOptions(dict):
    """``make_stateful`` keywords from ``--cache``, ``--page-size`` and ``--formats``."""


def add_cache_options(p: argparse.ArgumentParser) -> None:
    """The cache layout options shared by ``stateful`` and ``generate``."""
    p.add_argument("--cache", choices=("contiguous", "paged"), default="contiguous",
                   help="contiguous capacity-sized caches (default), or one paged cache per layer")
    p.add_argument("--page-size", type=int, default=16, metavar="N",
                   help="tokens per page of a paged cache (a multiple of 4; default 16)")
    p.add_argument("--formats", default="float32", metavar="F,F,...",
                   help="page formats from the newest page to older ones, the last repeating, from "
                        "float32, float16, int8, int4, fp8, int2, codebook (default float32)")


def cache_options(args: argparse.Namespace) -> CacheOptions:
    """The ``make_stateful`` keywords the cache options of ``args`` ask for."""
    if getattr(args, "cache", "contiguous") != "paged":
        if getattr(args, "formats", "float32") != "float32" or getattr(args, "page_size", 16) != 16:
            raise FeedError("--page-size and --formats apply to --cache paged")
        return CacheOptions()
    return CacheOptions(cache="paged", page_size=int(args.page_size), formats=str(args.formats))
