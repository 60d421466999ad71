"""Architecture lint: import direction between layers, and protobuf kept in the wire layer.

DESIGN.md: proto_ext <- graphbuilder <- passes <- kernels_cy (arrows from importer
to imported), and only proto_ext, the IR's serde and the standard export touch
protobuf classes.

Every import counts, wherever it stands (module level, function bodies, class
bodies, ``if TYPE_CHECKING:`` blocks), in every spelling: ``import a.b``,
``from a import b`` (which may name the module ``a.b``), relative imports
resolved against the importing module, ``importlib.import_module("a.b")`` and
``__import__("a.b")`` with a literal name, and the import lines of Cython files
(``.pyx``, ``.pxd``, ``.pxi``).
The checkers work on source text so that the tests below can plant violations.
"""
from __future__ import annotations

import ast
import pathlib
import re
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
    "graphbuilder/canonical.py",  # canonical bytes of protobuf payloads, used by serde
    "passes/export",  # the standard export emits stock protobuf
}
# Individual imports from the onnx package allowed elsewhere, as (file, module).
ONNX_IMPORT_ALLOWED = {
    # constant folding evaluates a node with onnx's reference runtime, on a model
    # the IR's serde writes; the pass itself never builds or reads a message
    ("passes/fold.py", "onnx.reference"),
    # the backend's fallback kernel runs a node it does not implement the same way
    ("kernels_cy/ops/fallback.py", "onnx.reference"),
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


def imports_of(source: str, rel: str) -> list[Import]:
    """Every import in a module's source, resolved to absolute module names."""
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
        return out
    out = []
    for node in ast.walk(ast.parse(source, rel)):
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
    return out


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
        for node in ast.walk(ast.parse(source, rel)):
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
    "from onnxforge.passes.manager import Pass\n",
    "import onnxforge.passes.rewrite\n",
    "import onnxforge.kernels_cy as backend\n",
    "from onnxforge import passes\n",
    "from ...passes import manager\n",
    "from ...kernels_cy.plan import Program\n",
    "def f():\n    from onnxforge.passes import optimize\n    return optimize\n",
    "class C:\n    def m(self):\n        import onnxforge.passes.fold\n",
    "if True:\n    try:\n        from onnxforge.kernels_cy import plan\n    except ImportError:\n        pass\n",
    "import importlib\nmod = importlib.import_module('onnxforge.passes.rewrite')\n",
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
    "from onnxforge.graphbuilder.ir import Model\n",
    "from onnxforge.graphbuilder import ir\n",
    "from . import manager\n",
    "from .export import standard\n",
    "from ..graphbuilder.ir import Model\n",
    "def f():\n    from onnxforge.passes.rename import erase_node\n",
])
def test_imports_of_own_and_lower_layers_pass(source):
    assert upward_imports(source, "passes/inline.py") == []


def test_relative_imports_resolve_against_the_importer():
    found = imports_of("from ..ir import Model\nfrom . import _decode\n", "graphbuilder/serde/__init__.py")
    assert [i.module for i in found] == ["onnxforge.graphbuilder.ir", "onnxforge.graphbuilder.serde"]
    assert _targets(found[1]) == ["onnxforge.graphbuilder.serde", "onnxforge.graphbuilder.serde._decode"]


def test_pyx_import_lines_are_checked_at_any_indent():
    source = "cimport numpy as cnp\ndef run():\n    from onnxforge.passes.fold import fold_constants\n"
    assert upward_imports(source, "kernels_cy/ops/_matmul.pyx") == []  # passes is below kernels_cy
    source = "def run():\n    from onnxforge.kernels_cy.plan import Program\n"
    assert upward_imports(source, "passes/_fast.pyx") == ["passes/_fast.pyx:2 imports onnxforge.kernels_cy.plan "
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
    assert protobuf_uses(source, "passes/cse.py") != []


@pytest.mark.parametrize("source", [
    "from onnx import TensorProto\nFLOAT = TensorProto.FLOAT\n",
    "import onnx.defs as defs\n",
    "from onnx.defs import get_schema\n",
    "from onnxforge.graphbuilder.tensors import onnx_dtype\n",
])
def test_data_type_constants_and_schemas_are_not_protobuf_use(source):
    assert protobuf_uses(source, "passes/cse.py") == []


def test_the_serde_and_the_export_may_touch_protobuf():
    source = "import onnx\nm = onnx.ModelProto()\nm.ParseFromString(b'')\n"
    assert protobuf_uses(source, "graphbuilder/serde/_decode.py") == []
    assert protobuf_uses(source, "passes/export/standard.py") == []
    assert protobuf_uses(source, "proto_ext/schema.py") == []
    assert protobuf_uses(source, "graphbuilder/ir.py") != []
