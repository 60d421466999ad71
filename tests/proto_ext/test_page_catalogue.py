"""The page format catalogue (proto_ext.codecs.kvpages) and the backend's compiled page
kernels (kernels_cy.paged._paged) agree: same names in the same code order, same page sizes,
and each code decodes the layout its catalogue name encodes."""
from __future__ import annotations

import numpy as np
import pytest

from onnxforge.kernels_cy.paged import _paged
from onnxforge.kernels_cy.paged import pages as backend
from onnxforge.kernels_cy.errors import PageFormatError as BackendPageFormatError
from onnxforge.passes.stateful.convert import StatefulError
from onnxforge.passes.stateful.paged import parse_page_formats
from onnxforge.proto_ext.codecs import kvpages as kp

SHAPES = [(1, 4, 32), (2, 8, 64), (3, 12, 96), (4, 16, 128), (8, 32, 32)]  # (H, P, D)


def test_kernel_format_names_are_the_catalogue_in_code_order():
    assert tuple(_paged.FORMAT_NAMES) == kp.FORMATS
    assert kp.FORMAT_CODES == {name: i for i, name in enumerate(kp.FORMATS)}
    assert set(kp.FORMATS) == set(kp.STRUCT_NAMES)
    assert backend.PAGE_FORMATS is kp.FORMATS


@pytest.mark.parametrize("fmt", kp.FORMATS)
@pytest.mark.parametrize("H, P, D", SHAPES)
def test_kernel_page_bytes_equal_the_catalogue(fmt, H, P, D):
    want = kp.page_nbytes(fmt, H, P, D)
    assert _paged.page_bytes(kp.format_code(fmt), H, P, D) == want
    assert backend.page_nbytes(fmt, H, P, D) == want


def test_kernel_knows_no_code_past_the_catalogue():
    assert _paged.page_bytes(len(kp.FORMATS), 1, 4, 32) == -1
    assert _paged.page_bytes(-1, 1, 4, 32) == -1


@pytest.mark.parametrize("fmt", kp.FORMATS)
def test_each_code_decodes_the_layout_of_its_name(fmt):
    # int8 and fp8 pages have the same size: only decoding tells their codes apart
    H, P, D = 2, 8, 64
    x = np.random.default_rng(kp.format_code(fmt)).standard_normal((2, H, P, D)).astype(np.float32)
    payload = np.frombuffer(kp.encode_page(fmt, x), dtype=np.uint8).copy()
    out = np.empty((2, H, P, D), dtype=np.float32)
    _paged.decode_page(kp.format_code(fmt), payload, out)
    np.testing.assert_array_equal(out, kp.decode_page(fmt, payload, H, P, D))  # decoding is exact


def test_one_policy_parser_behind_the_backend_and_the_pass():
    assert kp.parse_policy("float32, int8,int4") == ("float32", "int8", "int4")
    assert backend.parse_formats(["int2", " codebook "]) == ("int2", "codebook")
    assert parse_page_formats("Float32,INT4") == ("float32", "int4")
    for bad in ("float32,int3", [], "float32,,int8", ["FP8"]):
        with pytest.raises(kp.PageFormatError):
            kp.parse_policy(bad)
        with pytest.raises(BackendPageFormatError):
            backend.parse_formats(bad)
    for bad in ("float32,int3", [], "float32,,int8"):
        with pytest.raises(StatefulError, match="formats"):
            parse_page_formats(bad)


def test_one_geometry_rule_behind_the_backend():
    for H, P, D, what in ((1, 4, 48, "multiple of 32"), (1, 6, 32, "multiple of 4"),
                          (0, 4, 32, "positive integer"), (True, 4, 32, "positive integer")):
        with pytest.raises(kp.PageFormatError, match=what):
            kp.check_geometry(H, P, D)
        with pytest.raises(backend.PagedCacheError, match=what):
            backend.page_nbytes("float32", H, P, D)
