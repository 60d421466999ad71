"""The default operator domain and the opset imports in force where a node sits.

The default domain has two spellings, ``""`` and ``"ai.onnx"``. Passes and the
standard export compare domains and look up imported versions through these
helpers, so that either spelling means the same thing::

    canonical_domain("ai.onnx")                  # ""
    imported_version({"ai.onnx": 21}, "")        # 21
    imported_version({"": 21}, "ai.onnx.ml")     # None (not imported)
    opsets_in_scope(model, body_of_f)            # f.opset_imports for a subgraph inside f
"""
from __future__ import annotations

from collections.abc import Mapping

from onnxforge.graphbuilder.ir.core import Function, Graph, Model

__all__ = [
    "DEFAULT_DOMAINS",
    "canonical_domain",
    "default_domain_key",
    "imported_version",
    "is_default_domain",
    "opsets_in_scope",
]

DEFAULT_DOMAINS = ("", "ai.onnx")
"""The two spellings of the default ONNX domain."""


def canonical_domain(domain: str) -> str:
    """``domain`` with the default domain spelled ``""``."""
    return "" if domain == "ai.onnx" else domain


def is_default_domain(domain: str) -> bool:
    return domain == "" or domain == "ai.onnx"


def default_domain_key(opsets: Mapping[str, int]) -> str:
    """The spelling under which ``opsets`` imports the default domain: ``"ai.onnx"`` when
    only that one is there, else ``""`` (also the key to add it under)."""
    return "ai.onnx" if "ai.onnx" in opsets and "" not in opsets else ""


def imported_version(opsets: Mapping[str, int], domain: str) -> int | None:
    """The version of ``domain`` that ``opsets`` imports, under either spelling of the
    default domain (None when the domain is not imported)."""
    version = opsets.get(domain)
    if version is None and is_default_domain(domain):
        version = opsets.get("ai.onnx" if domain == "" else "")
    return None if version is None else int(version)


def opsets_in_scope(model: Model, container: Graph | Function) -> dict[str, int]:
    """The opset imports that hold in ``container``: those of the local function whose body
    holds it (directly or through subgraphs), else the model's. A function without opset
    imports of its own uses the model's. Returns the live mapping, not a copy."""
    root: Graph | Function | None = container
    while isinstance(root, Graph) and root.parent is not None and root.parent.graph is not None:
        root = root.parent.graph
    if isinstance(root, Function) and root.opset_imports:
        return root.opset_imports
    return model.opset_imports
