"""Analyses: results computed from a model without changing it. The registered
ones are cached by the pass manager (``self.analyses.get(name)`` inside a pass):
``shapes`` (:mod:`.shapes`), ``aliases`` (:mod:`.aliases`), ``effects``
(:mod:`.effects`), ``liveness`` (:mod:`.liveness`) and ``memory_plan``
(:mod:`.memplan`); beside them, the questions rules ask directly: the element types
and static shapes a graph states without inference (:mod:`.stated_types`) and the
constants that hold on every run because the other ``If`` branch fails
(:mod:`.failing_branches`). Import each name from its module.
"""
