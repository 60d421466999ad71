"""Authoring models in Python: the ``GraphBuilder`` API (:mod:`.graph_builder`) and
the operator schemas it checks every node against, with the ``ai.onnxforge`` domain
registered in onnx's schema registry (:mod:`.opschemas`). Import each name from its
module.
"""
