"""Architecture lint: import direction between layers, protobuf kept in the wire layer,
and size budgets (module length, lines per layer, no copied code).

DESIGN.md: proto_ext <- graphbuilder <- passes <- kernels_cy (arrows from importer
to imported), and only proto_ext, the IR's serde and the standard export touch
protobuf classes.

Every import counts, wherever it stands (module level, function bodies, class
bodies, ``if TYPE_CHECKING:`` blocks), in every spelling: ``import a.b``,
``from a import b`` (which may name the module ``a.b``), relative imports
resolved against the importing module, ``importlib.import_module("a.b")`` and
``__import__("a.b")`` with a literal name, and the import lines of Cython files
(``.pyx``, ``.pxd``, ``.pxi``).

STYLE.md: a module over ~800 lines is a design smell, and a line budget keeps the
code honest. No source module of the layers or of the top package may pass 800
lines, each layer folder has a budget of lines (``LAYER_LINE_BUDGET``), and no
12 lines are copied from one place to another (``copied_runs`` says what counts as
the same line).

The checkers work on source text so that the tests below can plant violations.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import re
from collections import defaultdict
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ["proto_ext", "graphbuilder", "passes", "kernels_cy"]

# Upward imports that DESIGN.md allows, as (importing file, imported module prefix).
# Empty today: the decoder runner registry lets the backend register itself with
# proto_ext, so nothing below kernels_cy imports it. Add an entry only with the
# DESIGN.md passage that allows it, in a comment on the same line.
UPWARD_ALLOWED: set[tuple[str, str]] = set()

# Files allowed to touch protobuf outside proto_ext (a folder covers its files).
PROTOBUF_ALLOWED = {
    "graphbuilder/serde",  # the IR's serde: IR <-> protobuf
    "passes/export",  # the standard export emits stock protobuf
}
# Individual imports from the onnx package allowed elsewhere, as (file, module).
ONNX_IMPORT_ALLOWED = {
    # the one node evaluator (constant folding, the backend's reference fallback) runs a
    # node with onnx's reference runtime, on a model the IR's serde writes; it never
    # builds or reads a message itself
    ("passes/rewrites/fold_eval.py", "onnx.reference"),
}
# Names from onnx that carry no protobuf use: operator schemas, and the data-type
# enum of TensorProto (TensorProto.FLOAT...). Calling TensorProto or its message
# methods is still flagged (PROTOBUF_CALLS).
ONNX_NEUTRAL_MODULES = {"onnx.defs"}
ONNX_NEUTRAL_NAMES = {"TensorProto"}
PROTOBUF_MODULE_MARKERS = ("google.protobuf", "onnx_ml_pb2", "onnx_pb", "onnx.onnx_ml_pb2",
                           "onnxforge.proto_ext.schema")
PROTOBUF_CALLS = ("ParseFromString", "SerializeToString", "FromString", "MergeFromString",
                  "CopyFrom", "MergeFrom", "HasField", "WhichOneof", "ClearField")
PROTO_CLASS = re.compile(r"[A-Z]\w*Proto$")


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute module name
    binds_root: bool = False  # ``import a.b`` binds the top package ``a``
    names: tuple[str, ...] = ()  # for ``from module import names``


def module_name(rel: str) -> str:
    """``passes/export/standard.py`` -> ``onnxforge.passes.export.standard``."""
    parts = pathlib.PurePosixPath(rel).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("onnxforge", *parts))


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


_PYX_IMPORT = re.compile(r"^\s*(?:cimport|import)\s+([\w.]+)|^\s*from\s+(\.*[\w.]*)\s+c?import\s+(.+)")


@functools.lru_cache(maxsize=None)
def _nodes(source: str, rel: str) -> tuple[ast.AST, ...]:
    """Every node of a module, parsed and walked once for the import and protobuf checks."""
    return tuple(ast.walk(ast.parse(source, rel)))


def imports_of(source: str, rel: str) -> list[Import]:
    """Every import in a module's source, resolved to absolute module names."""
    return list(_imports(source, rel))


@functools.lru_cache(maxsize=None)
def _imports(source: str, rel: str) -> tuple[Import, ...]:
    importer = module_name(rel)
    is_package = rel.endswith("__init__.py")
    if rel.endswith((".pyx", ".pxd", ".pxi")):
        out = []
        for number, line in enumerate(source.splitlines(), 1):
            m = _PYX_IMPORT.match(line)
            if m and m.group(1):
                out.append(Import(number, m.group(1), binds_root=True))
            elif m:
                dots = len(m.group(2)) - len(m.group(2).lstrip("."))
                mod = _resolve(m.group(2).lstrip(".") or None, dots, importer, is_package)
                names = tuple(n.strip().split()[0] for n in m.group(3).strip("()").split(",") if n.strip())
                out.append(Import(number, mod, names=names))
        return tuple(out)
    out = []
    for node in _nodes(source, rel):
        if isinstance(node, ast.Import):
            out.extend(Import(node.lineno, a.name, binds_root=a.asname is None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(node.module, node.level, importer, is_package)
            out.append(Import(node.lineno, mod, names=tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append(Import(node.lineno, node.args[0].value))
    return tuple(out)


def _targets(imp: Import) -> list[str]:
    """Modules an import may load: ``from a import b`` may name the module ``a.b``."""
    return [imp.module] + [f"{imp.module}.{n}" for n in imp.names if n != "*"]


def upward_imports(source: str, rel: str) -> list[str]:
    """The imports of higher layers or of the facade package in one layer file."""
    layer = rel.split("/")[0]
    above = LAYERS[LAYERS.index(layer) + 1:]
    bad = []
    for imp in imports_of(source, rel):
        if imp.module.split(".")[0] != "onnxforge":
            continue
        if imp.module == "onnxforge":
            # ``import onnxforge`` / ``from onnxforge import X``: the facade, unless
            # every X is a layer (checked as a target below)
            if not imp.names or any(n not in LAYERS for n in imp.names):
                bad.append(f"{rel}:{imp.line} imports the facade package onnxforge")
                continue
        elif imp.module.split(".")[1] not in LAYERS:
            bad.append(f"{rel}:{imp.line} imports the facade module {imp.module}")
            continue
        for target in _targets(imp):
            parts = target.split(".")
            if len(parts) > 1 and parts[1] in above and not any(
                    rel == f and target.startswith(m) for f, m in UPWARD_ALLOWED):
                bad.append(f"{rel}:{imp.line} imports {target} from a higher layer")
                break
    return bad


def _allowed_protobuf(rel: str) -> bool:
    return rel.startswith("proto_ext/") or any(
        rel == a or rel.startswith(a + "/") for a in PROTOBUF_ALLOWED)


def protobuf_uses(source: str, rel: str) -> list[str]:
    """Uses of protobuf (onnx's message classes and helpers) in a file that must not touch it."""
    if _allowed_protobuf(rel):
        return []
    bad = []
    for imp in imports_of(source, rel):
        mod = imp.module
        hit = [t for t in _targets(imp) if any(t == m or t.startswith(m + ".") for m in PROTOBUF_MODULE_MARKERS)]
        if hit:
            bad.append(f"{rel}:{imp.line} imports {hit[0]}")
        elif mod == "onnx" or mod.startswith("onnx."):
            if (rel, mod) in ONNX_IMPORT_ALLOWED:
                continue
            if imp.binds_root:
                bad.append(f"{rel}:{imp.line} imports the onnx package (`import {mod}`)")
            elif mod in ONNX_NEUTRAL_MODULES and not imp.names:
                continue
            elif mod == "onnx" and imp.names and set(imp.names) <= ONNX_NEUTRAL_NAMES:
                continue
            elif mod not in ONNX_NEUTRAL_MODULES:
                shown = f"{', '.join(imp.names)} from {mod}" if imp.names else mod
                bad.append(f"{rel}:{imp.line} imports {shown}")
    if rel.endswith(".py"):
        for node in _nodes(source, rel):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "onnx" and (PROTO_CLASS.match(node.attr) or node.attr.endswith("helper")):
                    bad.append(f"{rel}:{node.lineno} uses onnx.{node.attr}")
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in PROTOBUF_CALLS:
                    bad.append(f"{rel}:{node.lineno} calls .{func.attr}()")
                elif isinstance(func, ast.Name) and PROTO_CLASS.match(func.id):
                    bad.append(f"{rel}:{node.lineno} builds a {func.id}")
    else:
        for number, line in enumerate(source.splitlines(), 1):
            for call in PROTOBUF_CALLS:
                if f".{call}(" in line:
                    bad.append(f"{rel}:{number} calls .{call}()")
    return sorted(set(bad))


def _sources(layer: str) -> list[str]:
    files = [p for ext in ("*.py", "*.pyx", "*.pxd", "*.pxi") for p in (ROOT / layer).rglob(ext)]
    return sorted(str(p.relative_to(ROOT).as_posix()) for p in files if "__pycache__" not in p.parts)


@pytest.fixture(autouse=True, scope="module")
def _free_the_parsed_sources():
    """The parsed modules are cached for the tests of this file only: freed after
    them here (in 0.05 s), not at interpreter exit (where it takes over a second)."""
    yield
    _nodes.cache_clear()
    _imports.cache_clear()
    _tree_sources.cache_clear()


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_layers_below(layer):
    bad = [b for rel in _sources(layer) for b in upward_imports((ROOT / rel).read_text(), rel)]
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("layer", ["graphbuilder", "passes", "kernels_cy"])
def test_protobuf_stays_in_the_wire_layer(layer):
    bad = [b for rel in _sources(layer) for b in protobuf_uses((ROOT / rel).read_text(), rel)]
    assert bad == [], "\n".join(bad)


def test_the_allow_lists_name_existing_files():
    for rel, _ in UPWARD_ALLOWED | ONNX_IMPORT_ALLOWED:
        assert (ROOT / rel).is_file(), rel
    for rel in PROTOBUF_ALLOWED:
        assert (ROOT / rel).exists(), rel


# --- the lint catches planted violations ------------------------------------


@pytest.mark.parametrize("source", [
    "from onnxforge.passes.framework.pass_manager import Pass\n",
    "import onnxforge.passes.rewrites.engine\n",
    "import onnxforge.kernels_cy as backend\n",
    "from onnxforge import passes\n",
    "from ...passes.framework import pass_manager\n",
    "from ...kernels_cy.plan import Program\n",
    "def f():\n    from onnxforge.passes import optimize\n    return optimize\n",
    "class C:\n    def m(self):\n        import onnxforge.passes.rewrites.fold\n",
    "if True:\n    try:\n        from onnxforge.kernels_cy import plan\n    except ImportError:\n        pass\n",
    "import importlib\nmod = importlib.import_module('onnxforge.passes.rewrites.engine')\n",
    "mod = __import__('onnxforge.kernels_cy')\n",
])
def test_upward_import_is_caught_anywhere(source):
    assert upward_imports(source, "graphbuilder/serde/_decode.py") != []


@pytest.mark.parametrize("source", [
    "import onnxforge\n",
    "from onnxforge import load\n",
    "from onnxforge.api import load\n",
    "def f():\n    from onnxforge.errors import CodecError\n",
    "from onnxforge.cli import main\n",
])
def test_facade_import_is_caught(source):
    assert upward_imports(source, "proto_ext/types.py") != []


@pytest.mark.parametrize("source", [
    "from onnxforge.proto_ext.errors import CodecError\n",
    "from onnxforge.graphbuilder.ir.core import Model\n",
    "from onnxforge.graphbuilder.ir import core\n",
    "from ..framework import pass_manager\n",
    "from ..export import standard\n",
    "from ...graphbuilder.ir.core import Model\n",
    "def f():\n    from onnxforge.passes.rewrites.rename import erase_node\n",
])
def test_imports_of_own_and_lower_layers_pass(source):
    assert upward_imports(source, "passes/rewrites/inline.py") == []


def test_relative_imports_resolve_against_the_importer():
    found = imports_of("from ..ir.core import Model\nfrom . import _decode\n", "graphbuilder/serde/__init__.py")
    assert [i.module for i in found] == ["onnxforge.graphbuilder.ir.core", "onnxforge.graphbuilder.serde"]
    assert _targets(found[1]) == ["onnxforge.graphbuilder.serde", "onnxforge.graphbuilder.serde._decode"]


def test_pyx_import_lines_are_checked_at_any_indent():
    source = "cimport numpy as cnp\ndef run():\n    from onnxforge.passes.rewrites.fold import fold_constants\n"
    assert upward_imports(source, "kernels_cy/ops/_matmul.pyx") == []  # passes is below kernels_cy
    source = "def run():\n    from onnxforge.kernels_cy.runtime.plan import Program\n"
    assert upward_imports(source, "passes/_fast.pyx") == ["passes/_fast.pyx:2 imports onnxforge.kernels_cy.runtime.plan "
                                                         "from a higher layer"]


@pytest.mark.parametrize("source", [
    "import onnx\n",
    "import onnx as ox\n",
    "import onnx.helper\n",
    "def f():\n    import onnx\n    return onnx.load('m.onnx')\n",
    "from onnx import ModelProto\n",
    "from onnx import helper\n",
    "from onnx import numpy_helper\n",
    "from onnx import TensorProto, GraphProto\n",
    "from onnx.onnx_ml_pb2 import NodeProto\n",
    "from google.protobuf import message\n",
    "from onnxforge.proto_ext.schema import ModelProto\n",
    "from onnxforge.proto_ext import schema\n",
    "def f(m: 'onnx.ModelProto'):\n    return onnx.ModelProto()\n",
    "from onnx import TensorProto\nt = TensorProto(name='x')\n",
    "def f(blob):\n    m = make()\n    m.ParseFromString(blob)\n",
    "x = importlib.import_module('onnx.numpy_helper')\n",
])
def test_protobuf_use_in_a_pass_is_caught(source):
    assert protobuf_uses(source, "passes/rewrites/cse.py") != []


@pytest.mark.parametrize("source", [
    "from onnx import TensorProto\nFLOAT = TensorProto.FLOAT\n",
    "import onnx.defs as defs\n",
    "from onnx.defs import get_schema\n",
    "from onnxforge.graphbuilder.ir.tensors import onnx_dtype\n",
])
def test_data_type_constants_and_schemas_are_not_protobuf_use(source):
    assert protobuf_uses(source, "passes/rewrites/cse.py") == []


def test_the_serde_and_the_export_may_touch_protobuf():
    source = "import onnx\nm = onnx.ModelProto()\nm.ParseFromString(b'')\n"
    assert protobuf_uses(source, "graphbuilder/serde/_decode.py") == []
    assert protobuf_uses(source, "passes/export/standard.py") == []
    assert protobuf_uses(source, "proto_ext/schema.py") == []
    assert protobuf_uses(source, "graphbuilder/ir/core.py") != []


# --- budgets: module size, layer size, copied code ---------------------------
#
# The budgets count the source files of the layer folders and of the top package:
# ``.py``, ``.pyx``, ``.pxd``, ``.pxi``, ``.h`` and hand-written ``.c`` (the ``.c``
# files Cython generates are not source), outside ``__pycache__`` and ``tests``
# folders. A line is a newline-terminated line, as ``wc -l`` counts (plus an
# unterminated last line).

BUDGET_ROOTS = [*LAYERS, "onnxforge"]
BUDGET_SUFFIXES = (".py", ".pyx", ".pxd", ".pxi", ".h", ".c")
MAX_MODULE_LINES = 800
# Lines per layer folder: the count of the tree when the budget was written, plus
# 10%, rounded up. The numbers are raised deliberately, in the change that lands a
# capability and says why; never to make room for a copy or a split that grew.
LAYER_LINE_BUDGET = {
    "proto_ext": 9910,  # 9009 lines when written
    "graphbuilder": 11708,  # 10643
    "passes": 11786,  # 10714
    "kernels_cy": 16300,  # 11288; +993 for the pooling family and BatchNormalization / InstanceNormalization;
    # +993 for the generic operator kernels of ops/ (activations, TopK, Einsum, NonMaxSuppression,
    # cumulative, scatter, rearrange, windows, compiled Erf); the conv and resize families; +373 for
    # the engine's ragged batch kernels and the few-row products; the rnn family (LSTM)
    "onnxforge": 5000,  # 2141; 3860 with the engine (many sequences at once, continuous batching); 4700 with
    # the server (onnxforge serve: the OpenAI-compatible HTTP API on the engine)
}
MIN_COPY_LINES = 12


def line_count(text: str) -> int:
    return text.count("\n") + (not text.endswith("\n") and text != "")


def _generated(path: pathlib.Path) -> bool:
    """A ``.c`` file Cython wrote (its first line says so)."""
    if path.suffix != ".c":
        return False
    with path.open("rb") as f:
        return f.read(64).startswith(b"/* Generated by Cython")


def budget_sources(root: pathlib.Path) -> dict[str, str]:
    """Path relative to ``root`` -> text, for every file the budgets count."""
    out = {}
    for top in BUDGET_ROOTS:
        for path in sorted((root / top).rglob("*")):
            parts = path.relative_to(root).parts
            if (path.suffix in BUDGET_SUFFIXES and "__pycache__" not in parts and "tests" not in parts
                    and path.is_file() and not _generated(path)):
                out[path.relative_to(root).as_posix()] = path.read_text()
    return out


@functools.lru_cache(maxsize=None)
def _tree_sources() -> dict[str, str]:
    return budget_sources(ROOT)


def oversized_modules(sources: dict[str, str], limit: int = MAX_MODULE_LINES) -> list[str]:
    """``rel: N lines`` for every file over ``limit`` lines, longest first."""
    counts = {rel: line_count(text) for rel, text in sources.items()}
    return [f"{rel}: {n} lines" for rel, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            if n > limit]


def layer_line_counts(sources: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for rel, text in sources.items():
        counts[rel.split("/")[0]] += line_count(text)
    return dict(counts)


def layers_over_budget(sources: dict[str, str], budget: dict[str, int]) -> list[str]:
    """Layers whose files hold more lines than their budget (or that have none)."""
    bad = []
    for layer, n in sorted(layer_line_counts(sources).items()):
        if layer not in budget:
            bad.append(f"{layer}: {n} lines and no budget in LAYER_LINE_BUDGET")
        elif n > budget[layer]:
            bad.append(f"{layer}: {n} lines, over its budget of {budget[layer]} by {n - budget[layer]}")
    return bad


# Comments, to strip before comparing lines. String literals are matched first so
# that a ``#`` or ``//`` inside one is not taken for a comment (C inside a Cython
# verbatim string stays as it is); a stripped comment keeps its newlines, so line
# numbers stay true. In C headers ``#`` starts a preprocessor line, not a comment.
_PY_TEXT = re.compile(r'"""(?:\\.|[^\\])*?"""' r"|'''(?:\\.|[^\\])*?'''"
                      r'|"(?:\\.|[^"\\\n])*"' r"|'(?:\\.|[^'\\\n])*'" r"|(#[^\n]*)", re.S)
_C_TEXT = re.compile(r'"(?:\\.|[^"\\\n])*"' r"|'(?:\\.|[^'\\\n])*'" r"|(//[^\n]*|/\*.*?\*/)", re.S)
# Layout: a line of brackets and separators alone (``)``, ``],``, ``});``) or a
# docstring delimiter (``"""``, ``r"""``). Dropped before windowing, like blank lines.
_LAYOUT = re.compile(r"[()\[\]{},;:\\]*|[rRbBuU]?(?:\"{3}|'{3})[)\],;:]*")
# Boilerplate: lines any two modules share without one being a copy of the other.
# Imports (``from __future__ import annotations``...) and lines naming imported
# names, a keyword alone (``else:``, ``try:``, ``pass``, ``break``, ``} else {``),
# ``return x``, a bare decorator, ``with nogil:``, include guards and preprocessor
# closers. They stay in the windows (a copied function keeps its shape), but a run of
# identical lines is reported only if at least half of its lines are not boilerplate.
_BOILERPLATE = re.compile(
    r"(?:from [\w.]+ )?c?import .*|[A-Za-z_][\w.]*(?: as \w+)?(?:, ?[A-Za-z_][\w.]*(?: as \w+)?)*,?"
    r"|\}? ?(?:else|try|finally|except|do|cdef|with (?:no)?gil)(?: \{)?:?|except [\w., ()]+:"
    r"|(?:pass|break|continue|raise|return(?: -?[\w.]+)?);?|@[\w.]+"
    r"|# ?(?:include .*|endif|else|pragma once|ifn?def \w+|define \w+)")


def normalized_lines(text: str, rel: str) -> list[tuple[int, str, bool]]:
    """(line number, line without comments nor any whitespace, whether it is
    boilerplate) for each line that holds something besides layout."""
    strip = _C_TEXT if rel.endswith((".h", ".c")) else _PY_TEXT
    text = strip.sub(lambda m: "\n" * m.group(1).count("\n") if m.group(1) else m.group(0), text)
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        words = line.split()
        key = "".join(words)
        if not _LAYOUT.fullmatch(key):
            out.append((number, key, bool(_BOILERPLATE.fullmatch(" ".join(words)))))
    return out


_HASH_BASE = 1_000_003
_HASH_MOD = (1 << 61) - 1


def copied_runs(sources: dict[str, str], min_lines: int = MIN_COPY_LINES) -> list[str]:
    """``fileA:lineA and fileB:lineB share N lines`` for each maximal run of at least
    ``min_lines`` identical normalized lines found in two places (two files, or two
    non-overlapping places of one file).

    Normalized: comments (``#`` in Python and Cython, ``//`` and ``/* */`` in C) and
    all whitespace removed; layout lines dropped (see ``_LAYOUT``); runs made mostly
    of boilerplate not reported (see ``_BOILERPLATE``). A rolling hash over every
    window of ``min_lines`` normalized lines finds the candidates; equal hashes are
    confirmed on the lines themselves; matching windows that follow each other in
    both places merge into one run, reported once with its full length.
    """
    files = [(rel, normalized_lines(text, rel)) for rel, text in sorted(sources.items())]
    drop = pow(_HASH_BASE, min_lines, _HASH_MOD)
    buckets: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for f, (_, lines) in enumerate(files):
        h = 0
        for k, (_, key, _) in enumerate(lines):
            h = (h * _HASH_BASE + hash(key)) % _HASH_MOD
            if k >= min_lines:
                h = (h - hash(lines[k - min_lines][1]) * drop) % _HASH_MOD
            if k >= min_lines - 1:
                buckets[h].append((f, k - min_lines + 1))

    def window(f: int, i: int) -> list[str]:
        return [key for _, key, _ in files[f][1][i:i + min_lines]]

    matches = set()
    for places in buckets.values():
        for n, (fa, ia) in enumerate(places):
            for fb, ib in places[n + 1:]:
                if (fa != fb or ib - ia >= min_lines) and window(fa, ia) == window(fb, ib):
                    matches.add((fa, ia, fb, ib))
    runs = []
    for fa, ia, fb, ib in sorted(matches):
        if (fa, ia - 1, fb, ib - 1) in matches:
            continue  # inside a run that starts earlier
        n = 1
        while (fa, ia + n, fb, ib + n) in matches:
            n += 1
        length = n + min_lines - 1
        (rel_a, lines_a), (rel_b, lines_b) = files[fa], files[fb]
        if 2 * sum(not boilerplate for _, _, boilerplate in lines_a[ia:ia + length]) < length:
            continue
        runs.append(f"{rel_a}:{lines_a[ia][0]} and {rel_b}:{lines_b[ib][0]} share {length} lines")
    return runs


def test_no_module_over_the_line_limit():
    bad = oversized_modules(_tree_sources())
    assert bad == [], f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + "\n".join(bad)


def test_layers_stay_within_their_line_budget():
    assert sorted(LAYER_LINE_BUDGET) == sorted(BUDGET_ROOTS)
    bad = layers_over_budget(_tree_sources(), LAYER_LINE_BUDGET)
    assert bad == [], "\n".join(bad)


def test_no_code_is_copied():
    bad = copied_runs(_tree_sources())
    assert bad == [], f"runs of {MIN_COPY_LINES}+ identical lines (share the code instead):\n" + "\n".join(bad)


# --- the budget checks catch planted violations -------------------------------


def test_a_module_over_800_lines_is_caught():
    sources = {"passes/big.py": "x = 1\n" * 801, "passes/full.py": "x = 1\n" * 800,
               "kernels_cy/_k.h": "int x;\n" * 800 + "int y;"}  # an unterminated last line counts
    assert oversized_modules(sources) == ["kernels_cy/_k.h: 801 lines", "passes/big.py: 801 lines"]
    assert oversized_modules({"passes/full.py": "x = 1\n" * 800}) == []


def test_a_layer_over_its_budget_is_caught():
    sources = {"passes/a.py": "x = 1\n" * 60, "passes/export/b.py": "x = 1\n" * 40,
               "kernels_cy/_k.pyx": "x = 1\n" * 11, "graphbuilder/ir/core.py": "x = 1\n" * 10}
    assert layer_line_counts(sources) == {"passes": 100, "kernels_cy": 11, "graphbuilder": 10}
    budget = {"passes": 100, "kernels_cy": 10, "graphbuilder": 10}
    assert layers_over_budget(sources, budget) == ["kernels_cy: 11 lines, over its budget of 10 by 1"]
    budget["kernels_cy"] = 11
    assert layers_over_budget(sources, budget) == []
    del budget["graphbuilder"]
    assert layers_over_budget(sources, budget) == ["graphbuilder: 10 lines and no budget in LAYER_LINE_BUDGET"]


def test_the_budgets_count_source_files_only(tmp_path):
    files = {
        "passes/a.py": "x = 1\n",
        "passes/export/b.py": "x = 1\n",
        "kernels_cy/_k.pyx": "x = 1\n",
        "kernels_cy/_k.pxi": "x = 1\n",
        "kernels_cy/_k.h": "int x;\n",
        "kernels_cy/hand.c": "int x;\n",
        "onnxforge/cli.py": "x = 1\n",
        "kernels_cy/_k.c": "/* Generated by Cython 3.3.1 */\n" + "int x;\n" * 900,
        "passes/__pycache__/a.py": "x = 1\n",
        "passes/tests/test_a.py": "x = 1\n",
        "passes/README.md": "x\n",
        "benchmarks/run.py": "x = 1\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sorted(budget_sources(tmp_path)) == [
        "kernels_cy/_k.h", "kernels_cy/_k.pxi", "kernels_cy/_k.pyx", "kernels_cy/hand.c",
        "onnxforge/cli.py", "passes/a.py", "passes/export/b.py"]


SCALE = """\
def scale(values, factor):
    out = []
    for v in values:
        if v is None:
            out.append(0)
            continue
        w = v * factor
        if w > LIMIT:
            w = LIMIT
        out.append(w)
    total = sum(out)
    return out, total
"""
# the same function as a method: other indentation and spacing, comments, blank lines
SCALE_COPIED = """\
class Scaler:
    def scale(values, factor):  # copied
        out = [ ]
        for v in values:
            # skip holes
            if v is None:
                out.append( 0 )

                continue
            w = v*factor   # 'w' for weighted
            if w > LIMIT:
                w = LIMIT
            out.append(w)
        total = sum(out)
        return out, total
"""


def test_a_copied_function_body_is_caught():
    sources = {"passes/a.py": "import x\n\n\n" + SCALE, "kernels_cy/_b.pyx": "y = 2\n" + SCALE_COPIED}
    assert copied_runs(sources) == ["kernels_cy/_b.pyx:3 and passes/a.py:4 share 12 lines"]


def test_an_11_line_copy_is_not_caught():
    lines = SCALE.splitlines(keepends=True)
    assert copied_runs({"passes/a.py": SCALE, "passes/b.py": "".join(lines[:11])}) == []
    assert copied_runs({"passes/a.py": SCALE, "passes/b.py": "".join(lines[1:])}) == []
    # a line that differs breaks the run: 6 + 5 identical lines are no copy
    changed = "".join(lines[:6]) + "        w = v * factor + 1\n" + "".join(lines[7:])
    assert copied_runs({"passes/a.py": SCALE, "passes/b.py": changed}) == []


def test_overlapping_windows_merge_into_one_run():
    body = SCALE + "".join(f"x{i} = total + {i}\n" for i in range(8))
    sources = {"passes/a.py": body, "passes/b.py": "z = 0\n" + body + "tail = 1\n"}
    assert copied_runs(sources) == ["passes/a.py:1 and passes/b.py:2 share 20 lines"]


def test_a_copy_inside_one_file_is_caught():
    source = SCALE + "\n\n" + SCALE.replace("def scale", "def scale_again")
    assert copied_runs({"passes/a.py": source}) == []  # the def lines differ: 11 lines in common
    source = SCALE + "\n\nx = 1\n" + SCALE
    assert copied_runs({"passes/a.py": source}) == ["passes/a.py:1 and passes/a.py:16 share 12 lines"]


DOT_C = """\
static float dot(const float* a, const float* b, int n) {
    float s = 0.0f, t = 0.0f;
    int i;
    for (i = 0; i + 1 < n; i += 2) {
        s += a[i] * b[i];
        t += a[i + 1] * b[i + 1];
    }
    if (i < n)
        s += a[i] * b[i];
    s += t;
    if (s != s)
        s = 0.0f;
    return s;
}
"""


def test_a_copied_c_function_is_caught_across_comment_styles():
    copied = (DOT_C.replace("float s = 0.0f, t = 0.0f;", "float s=0.0f, t=0.0f;  /* two sums */")
              .replace("    int i;\n", "    /* the index,\n       shared by both loops */\n    int i;  // here\n")
              .replace("s += t;", "s  +=  t;  // fold"))
    assert copied != DOT_C
    sources = {"kernels_cy/_a.h": "#include <x.h>\n" + DOT_C, "kernels_cy/_b.h": copied}
    assert copied_runs(sources) == ["kernels_cy/_a.h:2 and kernels_cy/_b.h:1 share 12 lines"]
    # in a C header ``#`` is the preprocessor, not a comment
    assert [key for _, key, _ in normalized_lines("#define N 4 // four\n", "kernels_cy/_a.h")] == ["#defineN4"]


def test_comment_markers_inside_strings_are_kept():
    source = 's = "a # b"  # note\nt = \'//\'\ndoc = """x\n# not a comment\n"""\n'
    assert [(n, key) for n, key, _ in normalized_lines(source, "passes/a.py")] == [
        (1, 's="a#b"'), (2, "t='//'"), (3, 'doc="""x'), (4, "#notacomment")]


def test_shared_import_blocks_and_closing_lines_are_not_copies():
    imports = ("from __future__ import annotations\n\nimport math\nfrom onnxforge.graphbuilder.ir.core import (\n"
               + "".join(f"    Name{i},\n" for i in range(12))
               + ")\nfrom onnxforge.passes.framework.pass_manager import Pass\n")
    closers = "".join(f"{' ' * (4 * (12 - i))}{')]}'[i % 3]}\n" for i in range(14)) + '    """\n'
    tail = "        else:\n            return x\n" * 3
    sources = {"passes/a.py": imports + "A = 1\n" + closers + tail, "passes/b.py": imports + "B = 2\n" + closers + tail}
    assert copied_runs(sources) == []
