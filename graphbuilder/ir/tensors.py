"""Tensor payloads held by the IR: dense tensors and encoded values, lazily read.

A :class:`Tensor` knows its element type and dims without reading bytes. Its
payload is one of: a read-only buffer (inline bytes or a memory-mapped range of
a file), a numpy array given by the author, or a serialized ``TensorProto`` for
the rare tensors stored in typed fields (``float_data``...). ``numpy()`` gives a
read-only, zero-copy view whenever the bytes are raw.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.dtypes import np_dtype, onnx_dtype
from onnxforge.proto_ext.external import ExternalRef
from onnxforge.proto_ext.types import BITS, EncodedValue

__all__ = ["Tensor", "EncodedTensor", "np_dtype", "onnx_dtype"]

class Tensor:
    """A dense tensor value (initializer, Constant attribute, struct constant).

    Exactly one payload source is set: ``raw`` (bytes-like, row-major and packed
    like ``TensorProto.raw_data``), ``array`` or ``proto`` (serialized TensorProto
    using typed fields). ``external`` records where ``raw`` came from, so saving
    can keep the data external.
    """

    __slots__ = ("dtype", "dims", "name", "doc_string", "raw", "array", "proto", "external",
                 "metadata", "extra", "_decoded")

    def __init__(self, dtype: int, dims: tuple[int, ...], *, name: str = "", raw: Any = None,
                 array: np.ndarray | None = None, proto: bytes | None = None,
                 external: ExternalRef | None = None, doc_string: str = "",
                 metadata: dict[str, str] | None = None, extra: bytes = b""):
        self.dtype = dtype
        self.dims = tuple(dims)
        self.name = name
        self.doc_string = doc_string
        self.raw = raw
        self.array = array
        self.proto = proto
        self.external = external
        self.metadata = metadata or {}
        self.extra = extra
        # (proto or raw, its array, dtype): a payload is read once
        self._decoded: tuple[Any, ...] | None = None

    @classmethod
    def from_numpy(cls, array: np.ndarray, name: str = "") -> "Tensor":
        arr = np.asarray(array)
        return cls(onnx_dtype(arr.dtype), arr.shape, name=name, array=arr)

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed row-major payload (without reading it)."""
        if self.raw is not None:
            return len(self.raw)
        bits = BITS.get(self.dtype)
        if bits is None:
            return 0 if self.array is None else int(self.array.nbytes)
        return -(-self.size * bits // 8)

    def numpy(self) -> np.ndarray:
        """The value as a numpy array; read-only and zero-copy for raw payloads, read-only
        and parsed once for serialized ones.

        A payload that does not hold ``dims`` elements of ``dtype`` (or a string
        element that is not UTF-8) raises :class:`~onnxforge.errors.CodecError`.
        """
        if self.array is not None:
            return self.array
        raw = self.raw
        if raw is not None:
            hit = self._decoded
            if hit is not None and hit[0] is raw and hit[2] == self.dtype and hit[1].shape == self.dims:
                return hit[1]  # the same payload object, viewed already
            bits = BITS.get(self.dtype)
            if bits is not None and bits < 8:
                from onnxforge.proto_ext.codecs.bits import unpack_codes

                signed = self.dtype in (TensorProto.INT4, TensorProto.INT2)
                codes = unpack_codes(self.raw, bits, self.size, signed)
                return codes.view(np_dtype(self.dtype)).reshape(self.dims)
            dtype = np_dtype(self.dtype)
            n = memoryview(self.raw).nbytes
            if n != self.size * dtype.itemsize:
                raise CodecError(f"tensor {self.name!r}: raw payload holds {n} bytes, dims {list(self.dims)} "
                                 f"of {dtype} need {self.size * dtype.itemsize}")
            arr = np.frombuffer(self.raw, dtype=dtype).reshape(self.dims)
            if arr.flags.writeable:
                arr = arr.view()
                arr.flags.writeable = False
            self._decoded = (raw, arr, self.dtype)
            return arr
        if self.proto is not None:
            from onnxforge.proto_ext.convert import tensor_proto_to_numpy

            hit = self._decoded
            if hit is not None and hit[0] is self.proto:
                return hit[1]
            try:
                arr = tensor_proto_to_numpy(self.proto)
                arr.flags.writeable = False  # shared by every later call, like a raw payload's view
                self._decoded = (self.proto, arr, self.dtype)
                return arr
            except UnicodeDecodeError as exc:
                raise CodecError(f"string tensor {self.name!r}: element bytes are not UTF-8 text "
                                 f"({exc.reason} at byte {exc.start})") from None
            except ValueError as exc:  # element count does not match dims, bad field for dtype...
                raise CodecError(f"tensor {self.name!r}: cannot read its typed data: {exc}") from None
        raise CodecError(f"tensor {self.name!r} has no payload")

    def tobytes(self) -> bytes | memoryview:
        """Packed raw bytes (TensorProto.raw_data layout); zero-copy when already raw."""
        if self.raw is not None:
            return self.raw
        if self.dtype == TensorProto.STRING:
            raise CodecError(f"string tensor {self.name!r} has no raw byte form")
        arr = self.numpy()
        bits = BITS.get(self.dtype)
        if bits is not None and bits < 8:
            from onnxforge.proto_ext.codecs.bits import pack_codes

            return pack_codes(arr.astype(np.int8 if arr.dtype.kind != "u" else np.uint8)
                              if arr.dtype.kind in "iu" else arr.view(np.uint8), bits)
        return np.ascontiguousarray(arr).tobytes()

    def content_key(self) -> tuple:
        """Key for deduplication: dtype, dims and the payload bytes."""
        data = self.tobytes() if self.dtype != TensorProto.STRING else repr(self.numpy().tolist()).encode()
        return (self.dtype, self.dims, bytes(data))

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, dtype={self.dtype}, dims={self.dims})"


class EncodedTensor:
    """An encoded initializer: header record plus payload (inline or mapped).

    ``header`` is the :class:`~onnxforge.proto_ext.types.EncodedValue` record; its
    ``raw_data`` is the payload handle (a memoryview into a mapped file for
    external or large inline payloads). Decoding is explicit: loading never runs
    codec code.
    """

    __slots__ = ("header", "external")

    def __init__(self, header: EncodedValue, external: ExternalRef | None = None):
        self.header = header
        self.external = external

    @property
    def name(self) -> str:
        return self.header.name

    @name.setter
    def name(self, value: str) -> None:
        self.header.name = value

    @property
    def payload(self) -> Any:
        return self.header.raw_data

    @property
    def nbytes(self) -> int:
        if self.external is not None and self.external.length is not None and not len(self.header.raw_data):
            return self.external.length
        return len(self.header.raw_data)

    def content_key(self) -> tuple:
        """Dedup key: equal bytes with a different layout or logical type differ."""
        from onnxforge.proto_ext.convert import encoded_layout_key

        return (encoded_layout_key(self.header), bytes(self.payload))

    def __repr__(self) -> str:
        return f"EncodedTensor({self.name!r}, {self.nbytes} bytes)"
