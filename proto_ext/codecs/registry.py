"""Native decoders for struct-encoded values, registered under a format name.

A decoder is keyed by the struct type's ``name`` (its format identity), never by
``type_id`` (ids are model-scoped). Before decoding it checks that the model's
declaration has the structure it expects (field paths, element types, sizes),
so a same-named type with another layout is refused instead of misread.

    @register_decoder("Int4Block", expects={"codes": (INT4, (32,)), "scale": (FLOAT, ())})
    def _int4_block(fields, n_records, decl): ...

Built-in decoders cover the formats of the values specification's worked
examples. Users register their own with :func:`register_decoder`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from onnxforge.proto_ext.errors import CodecError
from onnxforge.proto_ext.sizes import RecordLayout
from onnxforge.proto_ext.types import type_name

__all__ = ["NativeDecoder", "register_decoder", "get_decoder", "registered_formats", "unregister_decoder",
           "FunctionRunner", "register_function_runner", "function_runner"]

# leaf path -> (elem_type or None for "any", shape per record or None for "any")
Expectation = dict[str, tuple[int | None, tuple[int, ...] | None]]
DecodeFn = Callable[[dict[str, np.ndarray], int, RecordLayout], np.ndarray]
# (serialized one-graph ModelProto wrapping the decoder FunctionProto, its input names,
#  leaf arrays by dotted path, path for errors) -> the decoder's one output
FunctionRunner = Callable[[bytes, list[str], dict[str, np.ndarray], str], np.ndarray]


@dataclass(frozen=True, slots=True)
class NativeDecoder:
    name: str
    fn: DecodeFn
    expects: Expectation

    def check(self, layout: RecordLayout, where: str) -> None:
        """Refuse a declaration whose leaves differ from what the decoder reads."""
        leaves = {leaf.path: leaf for leaf in layout.leaves}
        for path, (elem, shape) in self.expects.items():
            leaf = leaves.get(path)
            if leaf is None:
                raise CodecError(f"{where}: decoder {self.name!r} expects a field {path!r}; the "
                                 f"declaration has {sorted(leaves)}")
            if elem is not None and leaf.elem_type != elem:
                raise CodecError(f"{where}: decoder {self.name!r} expects {path!r} of element type "
                                 f"{type_name(elem)}, the declaration has {type_name(leaf.elem_type)}")
            if shape is not None and leaf.shape != shape:
                raise CodecError(f"{where}: decoder {self.name!r} expects {path!r} of shape {shape}, "
                                 f"the declaration has {leaf.shape}")


_REGISTRY: dict[str, NativeDecoder] = {}


def register_decoder(name: str, expects: Expectation, *, replace: bool = False) -> Callable[[DecodeFn], DecodeFn]:
    """Decorator registering ``fn(fields, n_records, layout) -> np.ndarray`` for format ``name``.

    ``fields`` maps leaf paths to arrays (record axis first for non-constant leaves);
    the result's elements in row-major order are the logical value's elements.
    """

    def deco(fn: DecodeFn) -> DecodeFn:
        if name in _REGISTRY and not replace:
            raise CodecError(f"a decoder for format {name!r} is already registered")
        _REGISTRY[name] = NativeDecoder(name, fn, dict(expects))
        return fn

    return deco


def unregister_decoder(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_decoder(name: str) -> NativeDecoder | None:
    return _REGISTRY.get(name)


def registered_formats() -> list[str]:
    return sorted(_REGISTRY)


# -- built-in formats (values specification, worked examples) ---------------------------

def _scalar(fields: dict[str, np.ndarray], path: str, n: int) -> np.ndarray:
    """A per-record scalar field ``[R]`` or a constant broadcast to ``[R]``."""
    arr = np.asarray(fields[path])
    if arr.ndim == 0:
        return np.broadcast_to(arr, (n,))
    return arr.reshape(n)


@register_decoder("Int4Block", {"codes": (TensorProto.INT4, (32,)), "scale": (TensorProto.FLOAT, ())})
def _int4_block(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value = signed code * block scale
    codes = fields["codes"].astype(np.float32)
    return (codes * _scalar(fields, "scale", n)[:, None].astype(np.float32)).reshape(-1)


def _linear(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value = (code - zero_point) * scale, scale and zero_point per record or constant
    codes = fields["values"].astype(np.float64)
    zp = _scalar(fields, "zero_point", n).astype(np.float64)[:, None]
    scale = _scalar(fields, "scale", n)
    out = (codes - zp) * scale.astype(np.float64)[:, None]
    return out.astype(np.asarray(fields["scale"]).dtype).reshape(-1)


register_decoder("LINEAR_INT4_128_FIXED_PARAMETERS",
                 {"values": (TensorProto.INT4, (128,)), "scale": (None, ()), "zero_point": (None, ())})(_linear)
register_decoder("LINEAR_INT4_128_WITH_PARAMETERS",
                 {"values": (TensorProto.INT4, (128,)), "scale": (TensorProto.FLOAT, ()),
                  "zero_point": (TensorProto.INT64, ())})(_linear)


@register_decoder("SCALED_CODEBOOK2_BLOCK_32",
                  {"quantized.codes.index": (None, (32,)), "quantized.codebook": (TensorProto.FLOAT, (4,)),
                   "scale": (TensorProto.FLOAT, ())})
def _scaled_codebook(fields: dict[str, np.ndarray], n: int, layout: RecordLayout) -> np.ndarray:
    # value[block * 32 + i] = scale[block] * codebook[index[block, i]]
    table = np.asarray(fields["quantized.codebook"], dtype=np.float32)
    idx = fields["quantized.codes.index"].astype(np.intp)
    if idx.size and idx.max() >= table.size:
        raise CodecError(f"codebook index {int(idx.max())} outside a {table.size}-entry codebook")
    return (table[idx] * _scalar(fields, "scale", n)[:, None]).astype(np.float32).reshape(-1)



_RUNNER: list[FunctionRunner | None] = [None]


def register_function_runner(runner: FunctionRunner | None) -> FunctionRunner | None:
    """Run decoder FunctionProtos with ``runner`` (None: back to ``onnx.reference``);
    returns the previous runner. A backend registers itself when it is imported, so
    this layer never imports a backend."""
    previous = _RUNNER[0]
    _RUNNER[0] = runner
    return previous


def function_runner() -> FunctionRunner | None:
    """The registered decoder-function runner, or None (``onnx.reference`` runs them)."""
    return _RUNNER[0]


# The paged KV cache's page formats (codecs.kvpages) register their decoders on import.
from onnxforge.proto_ext.codecs import kvpages as _kvpages  # noqa: E402,F401  (registers)
