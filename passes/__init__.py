"""passes layer: analyses and rewrites over the IR (see DESIGN.md).

Four sub-packages, each a subject: :mod:`.framework` (the pass contract and
manager, the analysis contract and its caching manager, the invariants checked
between passes, the default pipeline, and the helpers the passes and the export
share: domains and IR records), :mod:`.analyses` (shapes, aliases, effects,
liveness, the memory plan, the types a graph states, the constants failing
branches imply), :mod:`.rewrites` (the passes that lose nothing: dead-code
elimination, common-subexpression elimination, initializer deduplication,
identity elimination, topological sort, constant and shape folding, inlining,
value renaming, fusions and the declarative rewrite engine with its rule tables)
and :mod:`.stateful` (``make_stateful``); :mod:`.export` lowers to standard ONNX.
``optimize(model)`` runs the default pipeline. This package re-exports the
names below; everything else is imported from its module.
"""
from __future__ import annotations

if __name__ != "onnxforge.passes":  # the folder imported under its bare name
    raise ImportError(
        f"the layer folder passes/ was imported as {__name__!r}: import onnxforge.passes "
        "instead, after `pip install -e .` at the repository root"
    )

from onnxforge.passes.analyses.aliases import AliasAnalysis, AliasAnalysisPass, AliasRoots, alias_roots
from onnxforge.passes.analyses.effects import EffectsAnalysis
from onnxforge.passes.analyses.shapes import ShapeInferencePass, ShapesAnalysis
from onnxforge.passes.framework.analysis_manager import (
    ALL,
    Analysis,
    AnalysisError,
    AnalysisManager,
    get_analysis,
    list_analyses,
    register_analysis,
)
from onnxforge.passes.analyses.liveness import Liveness, LivenessAnalysis, ModelLiveness, liveness
from onnxforge.passes.analyses.memplan import MemoryPlan, MemoryPlanAnalysis, memory_plan
from onnxforge.passes.rewrites.cse import (
    CommonSubexpressionEliminationPass,
    eliminate_common_subexpressions,
)
from onnxforge.passes.rewrites.dce import DeadCodeEliminationPass, eliminate_dead_code
from onnxforge.passes.rewrites.dedup import DeduplicateInitializersPass, deduplicate_initializers
from onnxforge.passes.rewrites.fold import (
    ConstantFoldingPass,
    LiftConstantsPass,
    fold_constants,
    lift_constants,
)
from onnxforge.passes.rewrites.identity import IdentityEliminationPass, eliminate_identities
from onnxforge.passes.rewrites.inline import InlineError, InlinePass, inline_functions
from onnxforge.passes.analyses.effects import Effects, effect_analysis
from onnxforge.passes.framework.invariants import (
    InvariantError,
    check_invariants,
    ir_violations,
)
from onnxforge.passes.framework.pass_manager import (
    Pass,
    PassError,
    PassManager,
    PassOrderError,
    PassRecord,
    PassResult,
    StaleAnalysisError,
    check_order,
    get_pass,
    list_passes,
    register_pass,
)
from onnxforge.passes.framework.pipeline import DEFAULT_PIPELINE, default_pass_manager, optimize
from onnxforge.passes.rewrites.rename import (
    NameScope,
    RenameError,
    RenamePass,
    rename_value,
    replace_value,
)
from onnxforge.passes.rewrites.default_rules import DEFAULT_RULES
from onnxforge.passes.rewrites.engine import RewritePass, apply_rules
from onnxforge.passes.rewrites.patterns import Capture, Const, Match, Pattern, RewriteError, Rule, RuleTable
from onnxforge.passes.rewrites.topo import CycleError, TopologicalSortPass, topological_sort
from onnxforge.passes.rewrites.shape_fold import ShapeFoldPass, fold_shapes
from onnxforge.passes.rewrites.if_inline import IfInlineError, IfInlinePass, inline_constant_ifs
from onnxforge.passes.rewrites.fusion import FUSION_RULES, FusionPass, fuse
from onnxforge.passes.rewrites.slice_split import SliceSplitPass, merge_complementary_slices
from onnxforge.passes.rewrites.opset23 import OPSET23_RULES, Opset23FusionPass, fuse_to_opset23

__all__ = [
    "ALL",
    "OPSET23_RULES",
    "Opset23FusionPass",
    "fuse_to_opset23",
    "AliasAnalysis",
    "AliasAnalysisPass",
    "AliasRoots",
    "Analysis",
    "AnalysisError",
    "AnalysisManager",
    "EffectsAnalysis",
    "Liveness",
    "LivenessAnalysis",
    "MemoryPlan",
    "MemoryPlanAnalysis",
    "ModelLiveness",
    "ShapeInferencePass",
    "ShapesAnalysis",
    "alias_roots",
    "get_analysis",
    "list_analyses",
    "liveness",
    "memory_plan",
    "register_analysis",
    "DEFAULT_PIPELINE",
    "DEFAULT_RULES",
    "Capture",
    "CommonSubexpressionEliminationPass",
    "Const",
    "ConstantFoldingPass",
    "CycleError",
    "DeadCodeEliminationPass",
    "DeduplicateInitializersPass",
    "Effects",
    "effect_analysis",
    "IdentityEliminationPass",
    "InlineError",
    "InlinePass",
    "InvariantError",
    "LiftConstantsPass",
    "Match",
    "NameScope",
    "Pass",
    "PassError",
    "PassManager",
    "PassOrderError",
    "PassRecord",
    "PassResult",
    "Pattern",
    "RenameError",
    "RenamePass",
    "RewriteError",
    "RewritePass",
    "Rule",
    "RuleTable",
    "StaleAnalysisError",
    "TopologicalSortPass",
    "apply_rules",
    "check_invariants",
    "check_order",
    "deduplicate_initializers",
    "default_pass_manager",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "eliminate_identities",
    "fold_constants",
    "get_pass",
    "inline_functions",
    "ir_violations",
    "lift_constants",
    "list_passes",
    "optimize",
    "register_pass",
    "rename_value",
    "replace_value",
    "topological_sort",
    "FUSION_RULES",
    "FusionPass",
    "IfInlineError",
    "IfInlinePass",
    "ShapeFoldPass",
    "SliceSplitPass",
    "fold_shapes",
    "merge_complementary_slices",
    "fuse",
    "inline_constant_ifs",
]
