"""The default optimization pipeline: ``optimize(model)``.

:data:`DEFAULT_PIPELINE` lists registered pass names, in an order that
satisfies every pass's ordering constraints and loses nothing:

1. ``topological_sort``  — later passes walk nodes in dependency order;
2. ``inline``            — local functions become plain nodes;
3. ``opset23_fusion``    — decomposed attention and RMS norms -> ``Attention`` /
   ``RMSNormalization`` in models that import opset 23 (``optimize(model, opset=23)``
   raises an older model's opset for them); first, while the exporters' chains are whole;
4. ``constant_folding``  — Constant nodes become initializers, constant nodes are evaluated;
5. ``shape_folding``     — shape computations the ``shapes`` analysis knows become constants
   (and those that hold on every run that returns: ``failing_branches``);
6. ``if_inlining``       — ``If`` nodes whose condition became constant give way to their branch;
7. ``slice_split``       — Slices of one value that cover one axis in pieces -> one Split
   (before folding: Slices of one weight fold one by one only if they grow the model, one
   Split of it folds without growth);
8. ``constant_folding``  — the shape arithmetic left on the new constants, inlined branches,
   and Splits of weights;
9. ``identity_elimination``;
10. ``fusion``           — Conv + BatchNormalization / Mul / Add, MatMul + Add -> Gemm,
    Attention over repeated KV heads;
11. ``dedup_initializers`` — equal initializers merge (inlined branches' ones too), so that
12. ``cse``              — nodes reading them merge too;
13. ``rewrite``          — algebraic and no-op rules (``Max(x, x) -> x``, full-range Slice...);
14. ``dce``              — what became unused goes.

Before / after (the chain of ``benchmarks/chain.py``)::

    t0 = Identity(x); t1 = Add(t0, C1); D2 = Constant(v); t2 = Mul(t1, D2); t3 = Identity(t2) ...
    ->  t1 = Add(x, V1); t2 = Mul(t1, V7) ...   (one initializer per distinct value)

``optimize(model, debug=True)`` checks every invariant between passes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onnxforge.graphbuilder.ir.core import Model
from onnxforge.passes.framework.pass_manager import Pass, PassManager, PassRecord, PassResult

__all__ = ["DEFAULT_PIPELINE", "default_pass_manager", "optimize", "pass_manager", "pipeline_for_opset"]

DEFAULT_PIPELINE: tuple[str, ...] = (
    "topological_sort",
    "inline",
    "opset23_fusion",
    "constant_folding",
    "shape_folding",
    "if_inlining",
    "slice_split",
    "constant_folding",
    "identity_elimination",
    "fusion",
    "dedup_initializers",
    "cse",
    "rewrite",
    "dce",
)


def default_pass_manager(passes: Sequence[Pass | str] | None = None, *, debug: bool = False,
                         progress: Callable[[PassRecord], None] | None = None,
                         fixed_point: bool = False, max_iterations: int = 8) -> PassManager:
    """A :class:`PassManager` over ``passes`` (default :data:`DEFAULT_PIPELINE`).

    Every pass of the package is registered by then: importing this module imports the
    ``onnxforge.passes`` package, which imports every pass module."""
    return PassManager(DEFAULT_PIPELINE if passes is None else passes, debug=debug,
                       progress=progress, fixed_point=fixed_point, max_iterations=max_iterations)


def pipeline_for_opset(opset: int | None) -> list[Pass | str]:
    """:data:`DEFAULT_PIPELINE` with ``opset23_fusion`` allowed to raise the model's
    default-domain opset when ``opset`` is 23 or newer."""
    from onnxforge.passes.rewrites.opset23 import Opset23FusionPass

    if opset is None or opset < 23:
        return list(DEFAULT_PIPELINE)
    return [Opset23FusionPass(raise_opset=True) if n == "opset23_fusion" else n for n in DEFAULT_PIPELINE]


def pass_manager(passes: Sequence[Pass | str] | None = None, *, debug: bool = False,
                 opset: int | None = None, progress: Callable[[PassRecord], None] | None = None,
                 fixed_point: bool = False, max_iterations: int = 8) -> PassManager:
    """The manager that :func:`optimize` runs: over ``passes``, else the default pipeline
    for ``opset`` (:func:`pipeline_for_opset`). Unknown pass names and a pipeline out of
    order raise :class:`~onnxforge.passes.framework.pass_manager.PassError` here, before
    any model is read; ``onnxforge.optimize`` and ``onnxforge optimize`` build theirs here."""
    if passes is None and opset is not None:
        passes = pipeline_for_opset(opset)
    return default_pass_manager(passes, debug=debug, progress=progress, fixed_point=fixed_point,
                                max_iterations=max_iterations)


def optimize(model: Any, passes: Sequence[Pass | str] | None = None, debug: bool = False, *,
             progress: Callable[[PassRecord], None] | None = None, fixed_point: bool = False,
             max_iterations: int = 8, opset: int | None = None) -> Model:
    """Run ``passes`` (default :data:`DEFAULT_PIPELINE`) over ``model`` and return it.

    ``opset``: the newest default-domain opset the result may import. With 23 or more,
    the default pipeline fuses decomposed attention and RMS norms of an older model into
    ``Attention`` / ``RMSNormalization`` and raises its import to 23
    (:mod:`onnxforge.passes.rewrites.opset23`); None keeps the model's opset.

    ``model`` is an IR :class:`Model` (rewritten in place) or anything
    ``graphbuilder.serde.load`` accepts (a path, bytes, an ``onnx.ModelProto``), loaded
    without verification (``onnxforge.optimize`` verifies it).
    ``debug`` checks invariants before and after every pass and raises
    :class:`~onnxforge.passes.framework.invariants.InvariantError` naming the pass at fault.
    """
    if not isinstance(model, Model):
        from onnxforge.graphbuilder.serde import load

        model = load(model)
    pm = pass_manager(passes, debug=debug, opset=opset, progress=progress, fixed_point=fixed_point,
                      max_iterations=max_iterations)
    result: PassResult = pm(model)
    return result.model
