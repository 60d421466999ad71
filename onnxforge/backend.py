"""onnx's backend interface over the CPU backend, as ``onnxruntime.backend`` offers it.

``prepare`` compiles a model once (an :class:`~onnxforge.InferenceSession`) and returns a
representation whose ``run`` takes the inputs in the graph's input order (a list or
tuple) or by name (a dict); ``run_model`` prepares and runs once; ``run_node`` runs one
node on the given inputs (its model typed from the inputs' dtypes and shapes, at the
default domain's latest opset onnx knows); ``supports_device`` answers ``"CPU"`` only::

    import onnxforge.backend as backend
    rep = backend.prepare(model, threads=2)
    outputs = rep.run([x])

This is the interface onnx's own conformance suite drives (``onnx.backend.test``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

__all__ = ["OnnxforgeBackend", "OnnxforgeBackendRep", "prepare", "run_model", "run_node", "supports_device"]


class OnnxforgeBackendRep(BackendRep):
    """A compiled model: ``run(inputs)`` returns its outputs in the graph's order."""

    def __init__(self, session: Any):
        self.session = session
        self._inputs = [i.name for i in session.get_inputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            values = list(inputs)
            if len(values) > len(self._inputs):
                raise ValueError(f"{len(values)} inputs given, the model takes {len(self._inputs)}: "
                                 f"{self._inputs}")
            feeds = dict(zip(self._inputs, values))
        return tuple(self.session.run(None, feeds))


class OnnxforgeBackend(Backend):
    """onnx's :class:`~onnx.backend.base.Backend` over :class:`~onnxforge.InferenceSession`."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", *, threads: int | None = None,
                fallback: str | None = None, **kwargs: Any) -> OnnxforgeBackendRep:
        """Compile ``model`` (a ModelProto, bytes, a path or an IR model) for ``device``.
        ``threads`` and ``fallback`` are :class:`~onnxforge.InferenceSession`'s."""
        if not cls.supports_device(device):
            raise ValueError(f"onnxforge runs on the CPU only, not on {device!r}")
        from onnxforge import InferenceSession

        return OnnxforgeBackendRep(InferenceSession(model, threads=threads, fallback=fallback))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: its inputs are typed from the arrays given (in the node's input
        order, or by name), its outputs typed by onnx's shape inference unless
        ``outputs_info`` gives ``(numpy dtype, shape)`` per output."""
        if isinstance(inputs, Mapping):
            values = [inputs[name] for name in node.input if name]
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        names = [name for name in node.input if name]
        graph_inputs = [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.asarray(v).shape)
            for name, v in zip(names, values)]
        if outputs_info is not None:
            graph_outputs = [onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
                for name, (dtype, shape) in zip(node.output, outputs_info)]
        else:
            graph_outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name]
        domain = node.domain or ""
        opsets = [onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version())]
        if domain not in ("", "ai.onnx"):
            opsets.append(onnx.helper.make_opsetid(domain, 1))
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
            opset_imports=opsets)
        if outputs_info is None:  # the graph's outputs must be typed (rule N5): onnx infers them
            model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, dict(zip(names, values)), device, **kwargs)


prepare = OnnxforgeBackend.prepare
run_model = OnnxforgeBackend.run_model
run_node = OnnxforgeBackend.run_node
supports_device = OnnxforgeBackend.supports_device
