"""Decoding encoded values to their logical value.

``decode_encoded(header, catalogue)`` validates the payload extent and layout
first (rules P, S, A) and only then runs codec code:

* affine layouts decode like ``DequantizeLinear`` (``codecs.affine``);
* struct layouts read every leaf of every record (``codecs.records``) and hand
  them to the native decoder registered under the struct type's name, or else
  to the type's ``decoder`` FunctionProto (run with ``onnx.reference``, inputs
  named by dotted leaf path as DESIGN.md fixes); a struct without a logical type
  decodes to a dict of field arrays; a struct with a logical type and neither a
  native nor a function decoder fails with :class:`CodecError`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxforge.proto_ext.errors import CodecError, VerificationError
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.codecs.affine import affine_decode
from onnxforge.proto_ext.codecs.records import read_fields
from onnxforge.proto_ext.codecs.registry import function_runner, get_decoder
from onnxforge.proto_ext.dtypes import NUMPY_DTYPES
from onnxforge.proto_ext.sizes import record_layout
from onnxforge.proto_ext.types import EncodedValue, TensorType

__all__ = ["decode_encoded", "payload_of", "run_decoder_function"]


def payload_of(header: EncodedValue, model_dir: str | None, path: str) -> Any:
    """The payload bytes (inline, or memory-mapped external data after safety checks)."""
    if header.is_external:
        from onnxforge.proto_ext.external import map_external, parse_external_entries

        if len(header.raw_data):
            raise CodecError(f"{path}: raw_data and external_data are both set (rule P3)")
        if model_dir is None:
            raise CodecError(f"{path}: external payload but the model's folder is unknown")
        ref = parse_external_entries(header.external_data, path=f"{path}.external_data",
                                     require_length=True)
        return map_external(model_dir, ref, path=f"{path}.external_data")
    return header.raw_data


def _logical_shape(header: EncodedValue, path: str) -> tuple[int, ...] | None:
    lt = header.logical_type
    if lt is None:
        return None
    if not isinstance(lt, TensorType) or lt.shape is None or any(
            not isinstance(d, int) or d < 0 for d in lt.shape):
        raise CodecError(f"{path}.logical_type: a decodable logical type is a tensor with concrete "
                         f"dims, got {lt} (rule P6)")
    return tuple(lt.shape)


def run_decoder_function(decoder_proto: bytes, fields: dict[str, np.ndarray], path: str) -> np.ndarray:
    """Run a decoder FunctionProto (inputs named by leaf path) with the registered runner
    (``registry.register_function_runner``), else with ``onnx.reference``."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    fn = onnx.FunctionProto()
    fn.ParseFromString(decoder_proto)
    missing = [i for i in fn.input if i not in fields]
    if missing:
        raise CodecError(f"{path}.decoder: inputs {missing} are not leaves of the struct "
                         f"(leaves: {list(fields)}) (rule T7)")
    if len(fn.output) != 1:
        raise CodecError(f"{path}.decoder: a decoder has exactly one output (rule T7)")
    graph = onnx.helper.make_graph(
        list(fn.node), fn.name or "decoder",
        [onnx.helper.make_empty_tensor_value_info(i) for i in fn.input],
        [onnx.helper.make_empty_tensor_value_info(o) for o in fn.output])
    wrapper = onnx.helper.make_model(graph, opset_imports=list(fn.opset_import))
    runner = function_runner()
    if runner is not None:  # a backend registered itself (it receives the wrapper model's bytes)
        return np.asarray(runner(wrapper.SerializeToString(), list(fn.input), fields, path))
    try:
        result = ReferenceEvaluator(wrapper).run(None, {i: np.ascontiguousarray(fields[i]) for i in fn.input})
    except Exception as exc:  # the evaluator raises many kinds for a bad function body
        raise CodecError(f"{path}.decoder {fn.name!r} failed: {exc}") from exc
    return np.asarray(result[0])  # type: ignore[index]  # run() gives a list unless intermediate=True


def decode_encoded(header: EncodedValue, catalogue: Catalogue, *, model_dir: str | None = None,
                   path: str | None = None) -> np.ndarray | dict[str, np.ndarray]:
    """The logical value of one encoded value (see module docstring)."""
    path = path or f"encoded_initializer[{header.name!r}]"
    if (header.affine is None) == (header.struct_type is None):
        raise CodecError(f"{path}: exactly one layout (affine or struct_type) must be set (rule P1)")
    payload = payload_of(header, model_dir, path)
    if header.affine is not None:
        a = header.affine
        shape = _logical_shape(header, path)
        if shape is None:
            raise CodecError(f"{path}: an affine value needs a logical_type (rule A2)")
        if a.scale is None:
            raise CodecError(f"{path}.affine.scale: missing (rule A3)")
        zp = a.zero_point.array(f"{path}.affine.zero_point") if a.zero_point is not None else None
        if zp is not None and zp.dtype.kind not in "iu":
            zp = zp.astype(np.int8 if zp.dtype.name.startswith("int") else np.uint8)
        return affine_decode(payload, a.storage_type, shape, a.scale.array(f"{path}.affine.scale"), zp,
                             a.axis, a.block_size, out_dtype=_out_dtype(header))
    st = header.struct_type
    decl = catalogue.resolve(st) if st.kind == "type_ref" else st
    if decl is None:
        raise CodecError(f"{path}.struct_type.type_ref={st.type_ref}: no declaration with this "
                         "type_id in model.struct_types (rule C3)")
    try:
        layout = record_layout(st, catalogue, f"{path}.struct_type")
        fields = read_fields(payload, layout, path)
    except VerificationError as exc:
        raise CodecError(f"{path}: not byte-decodable: {exc}") from exc
    n = len(payload) // layout.bytes  # record_layout makes layout.bytes positive (S4)
    shape = _logical_shape(header, path)
    if shape is None:
        return fields
    native = get_decoder(decl.name) if decl.name else None
    if native is not None:
        native.check(layout, path)
        out = native.fn(fields, n, layout)
    elif decl.decoder is not None:
        out = run_decoder_function(decl.decoder.proto, fields, path)
    else:
        raise CodecError(f"{path}: struct type {decl.name or decl.type_id!r} has no registered "
                         "decoder and no decoder function; register one with "
                         "onnxforge.proto_ext.codecs.registry.register_decoder")
    out = np.asarray(out)
    if out.size != math.prod(shape):
        raise CodecError(f"{path}: decoder produced {out.size} elements, logical type needs "
                         f"{math.prod(shape)} {shape} (rule R8)")
    want = _out_dtype(header)
    return out.reshape(shape).astype(want, copy=False) if want is not None else out.reshape(shape)


def _out_dtype(header: EncodedValue) -> np.dtype | None:
    """numpy dtype of a tensor logical type; None when there is none."""
    lt = header.logical_type
    return NUMPY_DTYPES.get(lt.elem_type) if isinstance(lt, TensorType) else None
