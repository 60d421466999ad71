"""Progress bars of the command line: a bar over the named stages of a long command.

A command that can take more than a second on a large model (load, inspect, export,
save) reports its stages on stderr::

    with stages("export", ["load", "verify", "lower", "write"], enabled=large) as step:
        step("load");  model = load(path)
        step("verify"); verify(model)
        ...

``step(name)`` finishes the previous stage and shows ``name`` as the current one; the
bar completes when the block ends, and shows nothing when ``enabled`` is false (small
models, ``--quiet``). :func:`is_large` is the default test: the model file and its
external data together hold at least :data:`PROGRESS_MIN_BYTES`.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

__all__ = ["PROGRESS_MIN_BYTES", "is_large", "stages"]

#: Models at least this large (file plus external data) get progress bars (~1 s of work).
PROGRESS_MIN_BYTES = 64 << 20


def _data_files(path: str) -> list[str]:
    """The external data files that sit beside ``path`` with its name as their stem."""
    folder, base = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(base)[0]
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names
            if n != base and n.startswith((base + ".", stem + ".")) and n.endswith(".data")]


def is_large(source: object, min_bytes: int | None = None) -> bool:
    """Whether the model file ``source`` (and its ``.data`` files) holds at least ``min_bytes``."""
    threshold = PROGRESS_MIN_BYTES if min_bytes is None else min_bytes
    if not isinstance(source, (str, os.PathLike)) or not os.path.isfile(source):
        return False
    total = os.path.getsize(source)
    for f in _data_files(os.fspath(source)):
        try:
            total += os.path.getsize(f)
        except OSError:
            pass
    return total >= threshold


@contextmanager
def stages(desc: str, names: Sequence[str], *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``names``; yields ``step(name)`` (see the module docstring)."""
    from tqdm import tqdm

    bar = tqdm(total=len(names), desc=desc, unit="step", file=sys.stderr, disable=not enabled,
               bar_format="{desc}: {n_fmt}/{total_fmt} {postfix} [{elapsed}]")
    started = False

    def step(name: str) -> None:
        nonlocal started
        if started:
            bar.update(1)
        started = True
        bar.set_postfix_str(name)

    try:
        yield step
        if started:
            bar.update(1)
    finally:
        bar.close()
