"""Which modules run compiled, and the import hook that keeps them no older than their source.

The build (``setup.py``) compiles the modules of :data:`MODULES` with Cython: the IR,
shape inference and the passes, where ``optimize`` spends its time walking Python
objects. Their ``.py`` files stay the source: Cython compiles each one unchanged, and
the extension module sits beside it, where Python's import finds it first. The build
also records each source's SHA-256 in ``_compiled.json`` beside this file.

:func:`install` (run by ``import onnxforge``) puts :class:`SourceFinder` first on
``sys.meta_path``. It imports a listed module from its ``.py`` instead of its extension
when the source differs from the one compiled (a checkout edited since its last
``pip install -e .``), when there is no extension (a build without a compiler), or when
``ONNXFORGE_PURE_PYTHON=1`` asks for every module as source (to profile or debug them
line by line). Compiled or not, a module behaves the same; only its speed differs.
:func:`status` says which modules run compiled, and why the others do not.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["COMPILED", "MANIFEST", "MODULES", "PURE_ENV", "SourceFinder", "install",
           "source_digest", "status", "summary"]

MODULES: tuple[str, ...] = (
    # the IR and what every pass reads of it
    "onnxforge.graphbuilder.ir.core",
    "onnxforge.graphbuilder.ir.names",
    "onnxforge.graphbuilder.ir.scope_order",
    "onnxforge.graphbuilder.ir.storage",
    "onnxforge.graphbuilder.ir.tensors",
    "onnxforge.graphbuilder.ir.view",
    # shape inference
    "onnxforge.graphbuilder.shapes.context",
    "onnxforge.graphbuilder.shapes.replay",
    "onnxforge.graphbuilder.shapes.speculation",
    "onnxforge.graphbuilder.shapes.type_merge",
    "onnxforge.graphbuilder.shapes.symbolic",
    "onnxforge.graphbuilder.shapes.symexpr",
    "onnxforge.graphbuilder.shapes.symterms",
    "onnxforge.graphbuilder.shapes.symtensor",
    "onnxforge.graphbuilder.shapes.infer._base",
    "onnxforge.graphbuilder.shapes.infer.control_flow",
    "onnxforge.graphbuilder.shapes.infer.elementwise",
    "onnxforge.graphbuilder.shapes.infer.shape_ops",
    "onnxforge.graphbuilder.shapes.infer.vision",
    # the passes of the default pipeline, their framework and the analyses they read
    "onnxforge.passes.framework.analysis_manager",
    "onnxforge.passes.framework.invariants",
    "onnxforge.passes.framework.pass_manager",
    "onnxforge.passes.framework.records",
    "onnxforge.passes.analyses.failing_branches",
    "onnxforge.passes.analyses.stated_types",
    "onnxforge.passes.rewrites.cse",
    "onnxforge.passes.rewrites.dce",
    "onnxforge.passes.rewrites.dedup",
    "onnxforge.passes.rewrites.default_rules",
    "onnxforge.passes.rewrites.engine",
    "onnxforge.passes.rewrites.fold",
    "onnxforge.passes.rewrites.fold_eval",
    "onnxforge.passes.rewrites.fusion",
    "onnxforge.passes.rewrites.if_inline",
    "onnxforge.passes.rewrites.patterns",
    "onnxforge.passes.rewrites.rename",
    "onnxforge.passes.rewrites.shape_fold",
    "onnxforge.passes.rewrites.slice_split",
    # the static rules ``optimize`` checks its input against, their view and the type records
    "onnxforge.proto_ext.aliasing",
    "onnxforge.proto_ext.typed_data",
    "onnxforge.proto_ext.types",
    "onnxforge.proto_ext.view",
    "onnxforge.proto_ext.verify.catalogue_rules",
    "onnxforge.proto_ext.verify.core",
    "onnxforge.proto_ext.verify.graph_rules",
)
"""The modules the build compiles (dotted names; each is one ``.py`` file)."""

MANIFEST = "_compiled.json"
"""The build's record, beside this file: ``{"modules": {name: sha256 of the source}}``."""

PURE_ENV = "ONNXFORGE_PURE_PYTHON"
"""Set to ``1`` to import every module of :data:`MODULES` from its source."""

COMPILED = "compiled"
"""The :func:`status` of a module that runs as its extension."""

_LISTED = frozenset(MODULES)


def source_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a source file's bytes, as the build records it."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _read_manifest(folder: str) -> dict[str, str]:
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as fh:
            modules = json.load(fh).get("modules", {})
    except (OSError, ValueError, AttributeError):  # no build record, or not one we wrote
        return {}
    return {k: v for k, v in modules.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(modules, dict) else {}


class SourceFinder(importlib.abc.MetaPathFinder):
    """Finds a module of ``modules`` as its ``.py`` whenever its extension must not run;
    leaves every other import (and a current extension) to the finders after it.

    ``digests``: the SHA-256 of each source as compiled; ``pure``: import every listed
    module from source. :attr:`reasons` records, per module found, why it runs as it
    does (:data:`COMPILED` or the reason it runs from source)."""

    def __init__(self, digests: Mapping[str, str], *, pure: bool = False,
                 modules: frozenset[str] = _LISTED):
        self.digests = dict(digests)
        self.pure = pure
        self.modules = modules
        self.reasons: dict[str, str] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + ".py")
            if os.path.isfile(source):
                break
        else:
            return None  # no source to fall back on: whatever the other finders find
        reason = self._reason(fullname, folder, leaf, source)
        self.reasons[fullname] = reason
        if reason == COMPILED:
            return None  # the path finder takes the extension, which comes before the .py
        return importlib.util.spec_from_file_location(fullname, source)

    def _reason(self, fullname: str, folder: str, leaf: str, source: str) -> str:
        if self.pure:
            return f"source: {PURE_ENV} is set"
        if not any(os.path.isfile(os.path.join(folder, leaf + s))
                   for s in importlib.machinery.EXTENSION_SUFFIXES):
            return "source: the build compiled no extension for it"
        want = self.digests.get(fullname)
        if want is None:
            return f"source: the build recorded no digest for it in {MANIFEST}"
        if source_digest(source) != want:
            return "source: it changed since the build (run `pip install -e .` to compile it again)"
        return COMPILED


def install() -> SourceFinder:
    """Put the :class:`SourceFinder` first on ``sys.meta_path`` (once) and return it."""
    for f in sys.meta_path:
        if isinstance(f, SourceFinder):
            return f
    pure = os.environ.get(PURE_ENV, "").strip() not in ("", "0")
    finder = SourceFinder(_read_manifest(os.path.dirname(os.path.abspath(__file__))), pure=pure)
    sys.meta_path.insert(0, finder)
    return finder


def _runs_compiled(module: object) -> bool:
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    return any(origin.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def summary() -> str:
    """``"N of M optimizer modules compiled"``, from :func:`status`."""
    modules = status()
    compiled = sum(1 for how in modules.values() if how == COMPILED)
    return f"{compiled} of {len(modules)} optimizer modules compiled"


def status() -> dict[str, str]:
    """Each module of :data:`MODULES` (imported if it is not yet): :data:`COMPILED`, or
    why it runs from its source."""
    finder = install()
    out: dict[str, str] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        if _runs_compiled(module):
            out[name] = COMPILED
        else:
            out[name] = finder.reasons.get(name, "source: imported before the finder was installed")
    return out
