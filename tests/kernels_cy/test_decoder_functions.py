"""Decoder functions run on the CPU backend through the registry's function runner.

The values specification's scaled-codebook example (SCALED_CODEBOOK2_BLOCK_32: a
2-bit index per element into a 4-entry codebook, times a per-block scale) has a
native decoder; its decoder FunctionProto, authored with onnxscript, must give the
same values on the backend and on onnx.reference.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from onnxscript import FLOAT, INT64, UINT8, script
from onnxscript import opset21 as op

import onnxforge as of
import onnxforge.kernels_cy  # noqa: F401  (importing the backend registers its runner)
from onnxforge.errors import CodecError
from onnxforge.kernels_cy.runtime import decoder_fn
from onnxforge.proto_ext import schema
from onnxforge.proto_ext.codecs.registry import (function_runner, get_decoder, register_decoder,
                                                 register_function_runner, unregister_decoder)
from tests.proto_ext.test_struct_codec import _encoded, _model, codebook_decls

FORMAT = "SCALED_CODEBOOK2_BLOCK_32"
LEAVES = {"index": "quantized.codes.index", "codebook": "quantized.codebook", "scale": "scale"}


@script(default_opset=op)
def decode_scaled_codebook(index: UINT8, codebook: FLOAT, scale: FLOAT) -> FLOAT:
    values = op.Gather(codebook, op.Cast(index, to=INT64.dtype), axis=0)  # [R, 32]
    return values * op.Unsqueeze(scale, op.Constant(value_ints=[1]))


def _decoder_proto(body=decode_scaled_codebook):
    """The function with its inputs renamed to the dotted leaf paths (DESIGN.md)."""
    fn = body.to_function_proto()
    for i, name in enumerate(fn.input):
        fn.input[i] = LEAVES[name]
    for node in fn.node:
        for j, name in enumerate(node.input):
            if name in LEAVES:
                node.input[j] = LEAVES[name]
    return fn


def _codebook_model(rng, n_records, fn):
    sub, parent = codebook_decls()
    parent.decoder.CopyFrom(schema.from_onnx(fn))
    m = _model(sub, parent)
    idx = rng.integers(0, 4, size=(n_records, 32))
    scales = rng.uniform(0.5, 2.0, n_records).astype(np.float32)
    payload = b""
    for r in range(n_records):
        payload += bytes(int(sum(int(idx[r, 4 * b + k]) << (2 * k) for k in range(4))) for b in range(8))
        payload += struct.pack("<f", scales[r])
    _encoded(m, "cb", 1102, payload, 32 * n_records)
    table = np.array([-1.0, -0.25, 0.25, 1.0])
    return m, (table[idx] * scales.astype(np.float64)[:, None]).reshape(-1)


class _NativeRemoved:
    """Unregisters the native decoder of ``FORMAT`` inside the block."""

    def __enter__(self):
        self.native = get_decoder(FORMAT)
        unregister_decoder(FORMAT)

    def __exit__(self, *exc):
        register_decoder(FORMAT, self.native.expects, replace=True)(self.native.fn)


def test_importing_the_backend_registers_its_runner():
    assert function_runner() is decoder_fn.run_decoder_function


@pytest.mark.parametrize("n_records", [1, 7])
def test_scaled_codebook_decodes_equally_natively_and_through_the_backend(n_records):
    m, expected = _codebook_model(np.random.default_rng(n_records), n_records, _decoder_proto())
    of.verify(m)
    native = of.decode_value(m, "cb")
    calls = []

    def counting(*args):
        calls.append(args[1])
        return decoder_fn.run_decoder_function(*args)

    previous = register_function_runner(counting)
    try:
        with _NativeRemoved():
            backend = of.decode_value(m, "cb")
            register_function_runner(None)
            reference = of.decode_value(m, "cb")
    finally:
        register_function_runner(previous)
    assert calls == [["quantized.codes.index", "quantized.codebook", "scale"]]
    np.testing.assert_allclose(native, expected, rtol=1e-6)
    assert backend.dtype == native.dtype == np.float32 and backend.shape == native.shape
    np.testing.assert_array_equal(backend, native)
    np.testing.assert_array_equal(reference, native)


def test_a_decoder_that_fails_on_the_backend_raises_a_codec_error():
    @script(default_opset=op)
    def bad(index: UINT8, codebook: FLOAT, scale: FLOAT) -> FLOAT:
        return op.Gather(codebook, op.Cast(index, to=INT64.dtype), axis=0) * scale  # [R, 32] * [R]

    m, _ = _codebook_model(np.random.default_rng(0), 2, _decoder_proto(bad))
    with _NativeRemoved():
        with pytest.raises(CodecError, match=r"encoded_initializer\['cb'\].*decoder"):
            of.decode_value(m, "cb")
