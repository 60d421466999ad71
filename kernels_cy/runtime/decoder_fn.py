"""Decoder functions on the CPU backend.

A struct type's ``decoder`` FunctionProto (DESIGN.md, *Decoder functions*) reaches
the backend as the serialized one-graph model that ``proto_ext`` wraps it in
(inputs named by dotted leaf path, one output); it is compiled into a plan once
per distinct function and run like any model. Importing ``onnxforge.kernels_cy``
registers :func:`run_decoder_function` with
``proto_ext.codecs.registry.register_function_runner``; ``proto_ext`` never
imports the backend and runs decoder functions with ``onnx.reference`` when no
runner is registered.

    import onnxforge.kernels_cy
    from onnxforge.proto_ext.codecs.registry import function_runner
    assert function_runner() is onnxforge.kernels_cy.runtime.decoder_fn.run_decoder_function
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from onnxforge.proto_ext.codecs.registry import register_function_runner
from onnxforge.proto_ext.errors import CodecError, OnnxforgeError

__all__ = ["run_decoder_function", "install"]

_CACHE_SIZE = 32
_SESSIONS: OrderedDict[bytes, Any] = OrderedDict()


def _session(model_bytes: bytes, path: str) -> Any:
    sess = _SESSIONS.get(model_bytes)
    if sess is not None:
        _SESSIONS.move_to_end(model_bytes)
        return sess
    from onnxforge.graphbuilder import serde
    from onnxforge.kernels_cy.runtime.session import InferenceSession

    try:
        sess = InferenceSession(serde.from_bytes(model_bytes), threads=1, verify=False)  # built here from the checked decoder
    except OnnxforgeError as exc:
        raise CodecError(f"{path}.decoder cannot run on the CPU backend: {exc}") from exc
    _SESSIONS[model_bytes] = sess
    if len(_SESSIONS) > _CACHE_SIZE:
        _SESSIONS.popitem(last=False)
    return sess


def run_decoder_function(model_bytes: bytes, inputs: list[str], fields: dict[str, np.ndarray],
                         path: str) -> np.ndarray:
    """Run a wrapped decoder function on the backend (compiled plans are kept per function)."""
    missing = [i for i in inputs if i not in fields]
    if missing:
        raise CodecError(f"{path}.decoder: inputs {missing} are not leaves of the struct "
                         f"(leaves: {list(fields)}) (rule T7)")
    sess = _session(bytes(model_bytes), path)
    try:
        out = sess.run(None, {i: np.ascontiguousarray(fields[i]) for i in inputs})[0]
    except (OnnxforgeError, ValueError, TypeError, IndexError) as exc:  # numpy's errors for a bad body
        raise CodecError(f"{path}.decoder failed on the CPU backend: {exc}") from exc
    return np.asarray(out)


def install() -> None:
    """Make the backend the decoder-function runner (done on importing the backend)."""
    register_function_runner(run_decoder_function)
