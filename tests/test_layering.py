"""Architecture lint: import direction between layers, and protobuf kept in the wire layer.

DESIGN.md: proto_ext <- graphbuilder <- passes <- kernels_cy (arrows from importer
to imported), and only proto_ext plus the IR's serde module touch protobuf classes.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ["proto_ext", "graphbuilder", "passes", "kernels_cy"]
# modules allowed to touch protobuf messages outside proto_ext
PROTOBUF_ALLOWED = {"graphbuilder/serde", "graphbuilder/canonical.py", "passes/export"}
PROTOBUF_MARKERS = ("google.protobuf", "onnx_ml_pb2", "onnx_pb", "proto_ext.schema")


def _sources(layer: str) -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts) + sorted(
        (ROOT / layer).rglob("*.pyx"))


def _imports(path: pathlib.Path) -> list[str]:
    if path.suffix == ".pyx":
        return [line.split()[1] for line in path.read_text().splitlines()
                if line.startswith(("import ", "from ")) and len(line.split()) > 1]
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_only_layers_below(layer):
    above = LAYERS[LAYERS.index(layer) + 1:]
    bad = []
    for path in _sources(layer):
        for mod in _imports(path):
            for higher in above:
                if mod == f"onnxforge.{higher}" or mod.startswith(f"onnxforge.{higher}."):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
            if mod.startswith("onnxforge.") and mod.split(".")[1] not in LAYERS + ["errors"]:
                bad.append(f"{path.relative_to(ROOT)} imports the facade module {mod}")
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("layer", ["graphbuilder", "passes", "kernels_cy"])
def test_protobuf_stays_in_the_wire_layer(layer):
    bad = []
    for path in _sources(layer):
        rel = str(path.relative_to(ROOT))
        if any(rel == allowed or rel.startswith(allowed + "/") for allowed in PROTOBUF_ALLOWED):
            continue
        for mod in _imports(path):
            if any(marker in mod for marker in PROTOBUF_MARKERS):
                bad.append(f"{rel} imports {mod}")
        text = path.read_text()
        for call in ("ParseFromString(", "SerializeToString(", "numpy_helper."):
            if call in text:
                bad.append(f"{rel} calls {call}")
    assert bad == [], "\n".join(bad)
