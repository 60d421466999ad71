"""onnxforge: graph-rewriting compiler toolkit for stateful ONNX models.

The facade loads nothing up front: each public name is imported from its home
module on first access (``of.load`` loads the IR and the passes, ``of.WireError``
only the wire layer), so that ``import onnxforge.proto_ext.types`` loads the
wire layer alone.

Adding a public name is one line in ``_EXPORTS`` below (name -> home module),
plus the matching import under ``TYPE_CHECKING`` for type checkers and editors;
``tests/test_imports.py`` checks that the two agree.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The layer folders (proto_ext/, graphbuilder/, ...) become onnxforge.* only
# through an install; a bare clone finds this folder but none of the layers.
if importlib.util.find_spec("onnxforge.proto_ext") is None:
    raise ImportError(
        f"onnxforge was imported from {__path__[0]!r} without its layers "
        "(onnxforge.proto_ext is not importable): this checkout is not installed. "
        "Run `pip install -e .` at the repository root (or `pip install -e \".[test]\"` "
        "for the test suite)."
    )

# Before any layer module is imported: the compiled modules run only while they are as
# new as their source (onnxforge/_compiled.py).
from onnxforge import _compiled  # noqa: E402

_compiled.install()

_EXPORTS: dict[str, str] = {
    # errors
    "CodecError": "onnxforge.proto_ext.errors",
    "ExportError": "onnxforge.proto_ext.errors",
    "ExternalDataError": "onnxforge.proto_ext.errors",
    "ModelFileError": "onnxforge.proto_ext.errors",
    "OnnxforgeError": "onnxforge.proto_ext.errors",
    "StateFileError": "onnxforge.kernels_cy.errors",
    "VerificationError": "onnxforge.proto_ext.errors",
    "WireError": "onnxforge.proto_ext.errors",
    # models: load, check, transform, save
    "check": "onnxforge.api",
    "decode_value": "onnxforge.api",
    "infer_shapes": "onnxforge.api",
    "load": "onnxforge.api",
    "optimize": "onnxforge.api",
    "save": "onnxforge.api",
    "to_standard_onnx": "onnxforge.api",
    "verify": "onnxforge.api",
    # authoring
    "GraphBuilder": "onnxforge.graphbuilder.builder.graph_builder",
    "MUST_ALIAS": "onnxforge.graphbuilder.ir.core",
    "READ_ONLY": "onnxforge.graphbuilder.ir.core",
    "READ_WRITE": "onnxforge.graphbuilder.ir.core",
    # running on the CPU backend
    "InferenceSession": "onnxforge.kernels_cy.runtime.session",
    "backend_ops": "onnxforge.kernels_cy.runtime.session",
    "make_state": "onnxforge.kernels_cy.runtime.state",
    "make_stateful": "onnxforge.passes.stateful.convert",
    # many sequences at once
    "Engine": "onnxforge.engine",
    "EngineError": "onnxforge.engine.errors",
    "EngineCapacityError": "onnxforge.engine.errors",
    "RequestError": "onnxforge.engine.errors",
    # text in, text out
    "Generator": "onnxforge.text.generator",
    "Sampling": "onnxforge.text.sampling",
    "SamplingError": "onnxforge.text.errors",
    "TextError": "onnxforge.text.errors",
    "TokenizerFileError": "onnxforge.text.errors",
}

# Subpackages reachable as attributes (``of.passes.optimize``) once asked for.
_SUBMODULES = frozenset({"api", "cli", "engine", "errors", "graphbuilder", "kernels_cy", "passes", "proto_ext",
                         "text"})

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from onnxforge.api import check as check
    from onnxforge.api import decode_value as decode_value
    from onnxforge.api import infer_shapes as infer_shapes
    from onnxforge.api import load as load
    from onnxforge.api import optimize as optimize
    from onnxforge.api import save as save
    from onnxforge.api import to_standard_onnx as to_standard_onnx
    from onnxforge.api import verify as verify
    from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder as GraphBuilder
    from onnxforge.graphbuilder.ir.core import MUST_ALIAS as MUST_ALIAS
    from onnxforge.graphbuilder.ir.core import READ_ONLY as READ_ONLY
    from onnxforge.graphbuilder.ir.core import READ_WRITE as READ_WRITE
    from onnxforge.kernels_cy.errors import StateFileError as StateFileError
    from onnxforge.kernels_cy.runtime.session import InferenceSession as InferenceSession
    from onnxforge.kernels_cy.runtime.session import backend_ops as backend_ops
    from onnxforge.kernels_cy.runtime.state import make_state as make_state
    from onnxforge.passes.stateful.convert import make_stateful as make_stateful
    from onnxforge.proto_ext.errors import CodecError as CodecError
    from onnxforge.proto_ext.errors import ExportError as ExportError
    from onnxforge.proto_ext.errors import ExternalDataError as ExternalDataError
    from onnxforge.proto_ext.errors import ModelFileError as ModelFileError
    from onnxforge.proto_ext.errors import OnnxforgeError as OnnxforgeError
    from onnxforge.proto_ext.errors import VerificationError as VerificationError
    from onnxforge.proto_ext.errors import WireError as WireError
    from onnxforge.engine import Engine as Engine
    from onnxforge.engine.errors import EngineCapacityError as EngineCapacityError
    from onnxforge.engine.errors import EngineError as EngineError
    from onnxforge.engine.errors import RequestError as RequestError
    from onnxforge.text.errors import SamplingError as SamplingError
    from onnxforge.text.errors import TextError as TextError
    from onnxforge.text.errors import TokenizerFileError as TokenizerFileError
    from onnxforge.text.generator import Generator as Generator
    from onnxforge.text.sampling import Sampling as Sampling


def __getattr__(name: str) -> Any:
    """Import a public name from its home module on first access, then keep it."""
    home = _EXPORTS.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
