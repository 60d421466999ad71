"""The default optimization pipeline: ``optimize(model)``.

:data:`DEFAULT_PIPELINE` lists registered pass names, in an order that
satisfies every pass's ordering constraints and loses nothing:

1. ``topological_sort``  — later passes walk nodes in dependency order;
2. ``inline``            — local functions become plain nodes;
3. ``constant_folding``  — Constant nodes become initializers, constant nodes are evaluated;
4. ``shape_folding``     — shape computations the ``shapes`` analysis knows become constants;
5. ``if_inlining``       — ``If`` nodes whose condition became constant give way to their branch;
6. ``slice_split``       — Slices of one value that cover one axis in pieces -> one Split
   (before folding: Slices of one weight fold one by one only if they grow the model, one
   Split of it folds without growth);
7. ``constant_folding``  — the shape arithmetic left on the new constants, inlined branches,
   and Splits of weights;
8. ``identity_elimination``;
9. ``fusion``            — Conv + BatchNormalization / Mul / Add, MatMul + Add -> Gemm;
10. ``dedup_initializers`` — equal initializers merge (inlined branches' ones too), so that
11. ``cse``              — nodes reading them merge too;
12. ``rewrite``          — algebraic and no-op rules (``Max(x, x) -> x``, full-range Slice...);
13. ``dce``              — what became unused goes.

Before / after (the chain of ``benchmarks/chain.py``)::

    t0 = Identity(x); t1 = Add(t0, C1); D2 = Constant(v); t2 = Mul(t1, D2); t3 = Identity(t2) ...
    ->  t1 = Add(x, V1); t2 = Mul(t1, V7) ...   (one initializer per distinct value)

``optimize(model, debug=True)`` checks every invariant between passes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onnxforge.graphbuilder.ir import Model
from onnxforge.passes.manager import Pass, PassManager, PassRecord, PassResult

__all__ = ["DEFAULT_PIPELINE", "default_pass_manager", "optimize"]

DEFAULT_PIPELINE: tuple[str, ...] = (
    "topological_sort",
    "inline",
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


def optimize(model: Any, passes: Sequence[Pass | str] | None = None, debug: bool = False, *,
             progress: Callable[[PassRecord], None] | None = None, fixed_point: bool = False,
             max_iterations: int = 8) -> Model:
    """Run ``passes`` (default :data:`DEFAULT_PIPELINE`) over ``model`` and return it.

    ``model`` is an IR :class:`Model` (rewritten in place) or anything
    ``graphbuilder.serde.load`` accepts (a path, bytes, an ``onnx.ModelProto``).
    ``debug`` checks invariants before and after every pass and raises
    :class:`~onnxforge.passes.invariants.InvariantError` naming the pass at fault.
    """
    if not isinstance(model, Model):
        from onnxforge.graphbuilder.serde import load

        model = load(model)
    pm = default_pass_manager(passes, debug=debug, progress=progress, fixed_point=fixed_point,
                              max_iterations=max_iterations)
    result: PassResult = pm(model)
    return result.model
