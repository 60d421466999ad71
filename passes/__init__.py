"""passes layer: analyses and rewrites over the IR (see DESIGN.md).

Pass framework (:mod:`.manager`), invariants and side-effect analysis
(:mod:`.invariants`), analyses as cached typed results (:mod:`.analysis`:
shapes, aliases and effects in :mod:`.analyses`, :mod:`.liveness`,
:mod:`.memplan`), and the passes that lose nothing: dead-code elimination,
common-subexpression elimination, initializer deduplication, identity
elimination, topological sort, constant folding, local-function inlining,
value renaming and declarative rewrite rules. ``optimize(model)`` runs the
default pipeline. Helpers the passes and the export share: :mod:`.domains`
(the default domain's two spellings, the opset imports in force in a graph) and
:mod:`.records` (attributes from Python values, tensor records).
"""
from __future__ import annotations

if __name__ != "onnxforge.passes":  # the folder imported under its bare name
    raise ImportError(
        f"the layer folder passes/ was imported as {__name__!r}: import onnxforge.passes "
        "instead, after `pip install -e .` at the repository root"
    )

from onnxforge.passes.analyses import (
    AliasAnalysis,
    AliasAnalysisPass,
    AliasRoots,
    EffectsAnalysis,
    ShapeInferencePass,
    ShapesAnalysis,
    alias_roots,
)
from onnxforge.passes.analysis import (
    ALL,
    Analysis,
    AnalysisError,
    AnalysisManager,
    get_analysis,
    list_analyses,
    register_analysis,
)
from onnxforge.passes.liveness import Liveness, LivenessAnalysis, ModelLiveness, liveness
from onnxforge.passes.memplan import MemoryPlan, MemoryPlanAnalysis, memory_plan
from onnxforge.passes.cse import (
    CommonSubexpressionEliminationPass,
    eliminate_common_subexpressions,
)
from onnxforge.passes.dce import DeadCodeEliminationPass, eliminate_dead_code
from onnxforge.passes.dedup import DeduplicateInitializersPass, deduplicate_initializers
from onnxforge.passes.fold import (
    ConstantFoldingPass,
    LiftConstantsPass,
    fold_constants,
    lift_constants,
)
from onnxforge.passes.identity import IdentityEliminationPass, eliminate_identities
from onnxforge.passes.inline import InlineError, InlinePass, inline_functions
from onnxforge.passes.effects import Effects, effect_analysis
from onnxforge.passes.invariants import (
    InvariantError,
    check_invariants,
    ir_violations,
)
from onnxforge.passes.manager import (
    Pass,
    PassError,
    PassManager,
    PassOrderError,
    PassRecord,
    PassResult,
    check_order,
    get_pass,
    list_passes,
    register_pass,
)
from onnxforge.passes.pipeline import DEFAULT_PIPELINE, default_pass_manager, optimize
from onnxforge.passes.rename import (
    NameScope,
    RenameError,
    RenamePass,
    rename_value,
    replace_value,
)
from onnxforge.passes.rewrite import (
    DEFAULT_RULES,
    Capture,
    Const,
    Match,
    Pattern,
    RewriteError,
    RewritePass,
    Rule,
    RuleTable,
    apply_rules,
)
from onnxforge.passes.topo import CycleError, TopologicalSortPass, topological_sort
from onnxforge.passes.shape_fold import ShapeFoldPass, fold_shapes
from onnxforge.passes.if_inline import IfInlineError, IfInlinePass, inline_constant_ifs
from onnxforge.passes.fusion import (
    FUSION_RULES,
    FusionPass,
    SliceSplitPass,
    fuse,
    merge_complementary_slices,
)
from onnxforge.passes.opset23 import OPSET23_RULES, Opset23FusionPass, fuse_to_opset23

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
