"""``.. onnxforge-cli::``: the command-line reference, generated from the argparse parsers.

The directive calls :func:`onnxforge.cli.build_parser` at build time and renders,
for the top-level parser and for every subcommand it finds, a section holding the
command's one-line summary and the exact text ``onnxforge CMD --help`` prints (at
a fixed width of 88 columns, so the page does not depend on the terminal of the
machine that builds it). A subcommand added to the parser appears on the page
without any edit here.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

WIDTH = "88"


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    """argparse sizes its help from ``COLUMNS``; pin it while the help is formatted."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, summary, parser)`` of every subcommand, in the order ``--help`` lists them."""
    out: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse keeps no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            summaries = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, summaries.get(name, sub.description or ""), sub))
    return out


def _escape(text: str) -> str:
    """``text`` as plain reStructuredText (no markup from a help string's ``*`` or ``|``)."""
    text = text.replace("\\", "\\\\")
    for ch in "*`|_":
        text = text.replace(ch, "\\" + ch)
    return text


def _sentence(text: str) -> str:
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) or not text else text + "."


def _literal(text: str) -> list[str]:
    return ["", ".. code-block:: text", ""] + [f"   {line}" if line else "" for line in text.splitlines()] + [""]


def cli_rst() -> list[str]:
    """The reStructuredText of the command-line reference."""
    from onnxforge.cli import build_parser

    with _columns(WIDTH):
        parser = build_parser()
        top = parser.format_help()
        commands = [(name, summary, sub.format_help()) for name, summary, sub in subcommands(parser)]
    lines = ["Commands at a glance", "--------------------", "",
             ".. list-table::", "   :header-rows: 1", "   :widths: 25 75", "",
             "   * - command", "     - what it does"]
    for name, summary, _ in commands:
        lines += [f"   * - :ref:`onnxforge {name} <cli-{name}>`", f"     - {_escape(summary)}"]
    lines += ["", "onnxforge", "---------", "", "``onnxforge --help``:"] + _literal(top)
    for name, summary, text in commands:
        title = f"onnxforge {name}"
        lines += [f".. _cli-{name}:", "", title, "-" * len(title), "", _escape(_sentence(summary)),
                  "", f"``onnxforge {name} --help``:"] + _literal(text)
    return lines


class OnnxforgeCli(SphinxDirective):
    """Insert the generated command-line reference (sections included)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        lines = cli_rst()
        # an incremental build redoes the page when a module that defines a parser changes
        self.env.note_dependency(__file__)
        for name, module in list(sys.modules.items()):
            if name.startswith("onnxforge.") and "cli" in name.rsplit(".", 1)[-1]:
                path = getattr(module, "__file__", None)
                if path:
                    self.env.note_dependency(path)
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="<onnxforge-cli>"), container)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("onnxforge-cli", OnnxforgeCli)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
