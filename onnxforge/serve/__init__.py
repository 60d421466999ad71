"""``onnxforge serve``: an OpenAI-compatible HTTP server on :class:`onnxforge.Engine`.

``app`` builds the Starlette application (:func:`~onnxforge.serve.app.create_app`),
``loop`` runs the engine's thread, ``openai_shapes`` validates requests and shapes
responses, ``command`` is the command line's entry. Needs the ``serve`` extra
(``starlette``, ``uvicorn``, ``prometheus_client``).
"""
from __future__ import annotations

__all__: list[str] = []
