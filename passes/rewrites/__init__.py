"""The rewriting passes: each changes the model and loses nothing. The declarative
rewrite engine is in three modules: the rule language (:mod:`.patterns`), the one
fixed-point driver and the ``rewrite`` pass (:mod:`.engine`) and the default
algebraic rules as data (:mod:`.default_rules`); the fusions keep their rule tables
beside their passes (:mod:`.fusion`, :mod:`.attention_fusion`, :mod:`.opset23`).
The other passes: folding (:mod:`.fold`, :mod:`.fold_eval`, :mod:`.shape_fold`),
CSE, DCE, deduplication and identity elimination (:mod:`.cse`, :mod:`.dce`,
:mod:`.dedup`, :mod:`.identity`), inlining (:mod:`.inline`, :mod:`.if_inline`),
Slice merging (:mod:`.slice_split`), the topological sort (:mod:`.topo`) and value
renaming with the value surgery every rewrite shares (:mod:`.rename`). Import each
name from its module.
"""
