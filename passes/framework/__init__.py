"""What every pass is built on: the pass contract, registry and manager
(:mod:`.pass_manager`), the analysis contract and its caching manager
(:mod:`.analysis_manager`), the invariants checked between passes in debug mode
(:mod:`.invariants`), the default pipeline behind ``optimize`` (:mod:`.pipeline`),
and the vocabulary the passes and the standard export share: the default domain's
two spellings and the opsets in force where a node sits (:mod:`.domains`), and the
IR records a pass builds (:mod:`.records`). Import each name from its module.
"""
