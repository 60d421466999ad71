"""Conv and ConvTranspose (kernels_cy/conv) against onnxruntime, onnx.reference and a float64
definition written here: random configurations (ranks 1-3, groups, depthwise, strides,
dilations, every auto_pad, asymmetric pads, output_shape / output_padding), edge shapes,
other dtypes, one plan over several input sizes, and the typed errors."""
from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnxforge.kernels_cy.conv import _conv
from onnxforge.kernels_cy.errors import KernelError, UnsupportedAttributeError
from onnxforge.kernels_cy.runtime.session import InferenceSession

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
         np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}
_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _model(op: str, feeds: dict[str, np.ndarray], opset: int = 22, dynamic: bool = False,
           **attrs: object):
    names = list(feeds)
    node = helper.make_node(op, names, ["y"], **attrs)
    inputs = []
    for name, a in feeds.items():
        shape = list(a.shape)
        if dynamic and name == "x":
            shape = ["n", shape[1]] + [f"s{i}" for i in range(len(shape) - 2)]
        inputs.append(helper.make_tensor_value_info(name, _ELEM[a.dtype], shape))
    out = helper.make_tensor_value_info("y", _ELEM[feeds["x"].dtype], None)
    graph = helper.make_graph([node], "g", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ours(op: str, feeds: dict[str, np.ndarray], threads: int | None = None, **attrs: object) -> np.ndarray:
    return InferenceSession(_model(op, feeds, **attrs), threads=threads).run(None, feeds)[0]


def _ort(op: str, feeds: dict[str, np.ndarray], **attrs: object) -> np.ndarray | None:
    """onnxruntime's answer, or None when it refuses the configuration."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(_model(op, feeds, **attrs).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)[0]
    except Exception:  # noqa: BLE001 - an oracle that refuses is simply not consulted
        return None


def _reference(op: str, feeds: dict[str, np.ndarray], **attrs: object) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(ReferenceEvaluator(_model(op, feeds, **attrs)).run(None, feeds)[0])


def _close(got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale)


# -- float64 definitions (independent of the kernels' geometry code) -------------------------

def _definition_pads_conv(ins, kernel, strides, dilations, auto_pad, pads):
    nd = len(ins)
    begins, outs = [], []
    for i in range(nd):
        ek = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-ins[i] // strides[i])
            tot = max(0, (o - 1) * strides[i] + ek - ins[i])
            b = tot // 2 if auto_pad == "SAME_UPPER" else (tot + 1) // 2
        else:
            b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[nd + i])
            o = (ins[i] + b + e - ek) // strides[i] + 1
        begins.append(b)
        outs.append(o)
    return begins, outs


def _conv64(x, w, b, group, strides, dilations, begins, outs):
    """y[n, m, o] = b[m] + sum_{c, k} w[m, c, k] x[n, g(m) Cg + c, o s - pad + k d]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    mg = m // group
    y = np.zeros((n, m, *outs))
    for o in itertools.product(*(range(v) for v in outs)):
        for tap in itertools.product(*(range(v) for v in w.shape[2:])):
            pos = [oi * s - p + t * d for oi, s, p, t, d in zip(o, strides, begins, tap, dilations)]
            if any(q < 0 or q >= size for q, size in zip(pos, x.shape[2:])):
                continue
            for g in range(group):
                xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + tuple(pos)]  # [n, cg]
                ws = w[(slice(g * mg, (g + 1) * mg), slice(None)) + tap]  # [mg, cg]
                y[(slice(None), slice(g * mg, (g + 1) * mg)) + o] += xs @ ws.T
    if b is not None:
        y += b.astype(np.float64).reshape((1, m) + (1,) * len(outs))
    return y


def _convt64(x, w, b, group, strides, dilations, begins, outs):
    """y[n, g(c) Mg + m, i s - pad + k d] += w[c, m, k] x[n, c, i] (kept inside [0, outs))."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    y = np.zeros((n, mg * group, *outs))
    for i in itertools.product(*(range(v) for v in x.shape[2:])):
        for tap in itertools.product(*(range(v) for v in w.shape[2:])):
            pos = tuple(ii * s - p + t * d for ii, s, p, t, d in zip(i, strides, begins, tap, dilations))
            if any(q < 0 or q >= o for q, o in zip(pos, outs)):
                continue
            for g in range(group):
                xs = x[(slice(None), slice(g * cg, (g + 1) * cg)) + i]  # [n, cg]
                ws = w[(slice(g * cg, (g + 1) * cg), slice(None)) + tap]  # [cg, mg]
                y[(slice(None), slice(g * mg, (g + 1) * mg)) + pos] += xs @ ws
    if b is not None:
        y += b.astype(np.float64).reshape((1, mg * group) + (1,) * len(outs))
    return y


# -- Conv ------------------------------------------------------------------------------------

@st.composite
def _conv_cases(draw):
    nd = draw(st.integers(1, 3))
    small = 6 if nd < 3 else 4
    ins = [draw(st.integers(1, small)) for _ in range(nd)]
    kernel = [draw(st.integers(1, 4 if nd < 3 else 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilations = [draw(st.integers(1, 2)) for _ in range(nd)]
    kind = draw(st.sampled_from(["plain", "groups", "depthwise", "multiplier"]))
    group, cg = 1, draw(st.integers(1, 3))
    mg = draw(st.integers(1, 3))
    if kind == "groups":
        group = draw(st.integers(2, 3))
    elif kind in ("depthwise", "multiplier"):
        group, cg = draw(st.integers(2, 4)), 1
        mg = 1 if kind == "depthwise" else draw(st.integers(2, 3))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, 3)) for _ in range(2 * nd)]
    for i in range(nd):  # a pad never exceeds the dilated kernel (onnxruntime's limit)
        ek = (kernel[i] - 1) * dilations[i] + 1
        pads[i], pads[nd + i] = min(pads[i], ek - 1), min(pads[nd + i], ek - 1)
    begins, outs = _definition_pads_conv(ins, kernel, strides, dilations, auto_pad, pads)
    assume(min(outs) >= 1)
    n = draw(st.integers(1, 3))
    bias = draw(st.booleans())
    name_kernel = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return dict(nd=nd, ins=ins, kernel=kernel, strides=strides, dilations=dilations, group=group,
                cg=cg, mg=mg, auto_pad=auto_pad, pads=pads, begins=begins, outs=outs, n=n, bias=bias,
                name_kernel=name_kernel, seed=seed)


def _conv_feeds_attrs(case, dtype=np.float32):
    rng = np.random.default_rng(case["seed"])
    c, m = case["cg"] * case["group"], case["mg"] * case["group"]
    feeds = {"x": rng.standard_normal((case["n"], c, *case["ins"])).astype(dtype),
             "w": rng.standard_normal((m, case["cg"], *case["kernel"])).astype(dtype)}
    if case["bias"]:
        feeds["b"] = rng.standard_normal(m).astype(dtype)
    attrs = dict(strides=case["strides"], dilations=case["dilations"], group=case["group"])
    if case["auto_pad"] == "NOTSET":
        attrs["pads"] = case["pads"]
    else:
        attrs["auto_pad"] = case["auto_pad"]
    if case["name_kernel"]:
        attrs["kernel_shape"] = case["kernel"]
    return feeds, attrs


@_SETTINGS
@given(_conv_cases())
def test_conv_matches_onnxruntime_reference_and_definition(case):
    feeds, attrs = _conv_feeds_attrs(case)
    got = _ours("Conv", feeds, **attrs)
    want = _conv64(feeds["x"], feeds["w"], feeds.get("b"), case["group"], case["strides"],
                   case["dilations"], case["begins"], case["outs"])
    _close(got, want)
    _close(got, _reference("Conv", feeds, **attrs))
    ort = _ort("Conv", feeds, **attrs)
    if case["auto_pad"] in ("NOTSET", "VALID") or max(case["dilations"]) == 1:
        # onnxruntime refuses SAME_* padding with dilations
        assert ort is not None, "onnxruntime refused a valid configuration"
    if ort is not None:
        _close(got, ort)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,wshape,attrs", [
    ((1, 64, 70, 66), (32, 64, 3, 3), dict(pads=[1, 1, 1, 1])),               # several bands
    ((2, 8, 1, 1), (4, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                     # 1x1 input
    ((1, 3, 2, 2), (5, 3, 5, 5), dict(pads=[2, 2, 2, 2])),                     # kernel > input
    ((1, 3, 2, 2), (5, 3, 5, 5), dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    ((3, 16, 9, 7), (24, 16, 1, 1), {}),                                       # a plain product
    ((2, 16, 9, 7), (24, 8, 1, 1), dict(group=2, strides=[2, 1])),             # 1x1, strided
    ((2, 32, 60, 57), (32, 1, 3, 3), dict(group=32, pads=[1, 0, 2, 1])),       # depthwise, on the pool
    ((1, 16, 17, 17), (48, 1, 5, 5), dict(group=16, strides=[2, 2], auto_pad="SAME_UPPER")),  # multiplier 3
    ((1, 6, 9, 8), (6, 1, 3, 2), dict(group=6, strides=[1, 3], dilations=[2, 3], pads=[0, 2, 3, 1])),
    ((1, 4, 5, 6, 7), (6, 2, 3, 1, 2), dict(group=2, strides=[1, 2, 3], pads=[0, 1, 1, 2, 0, 1])),
    ((2, 5, 30), (7, 5, 4), dict(dilations=[3], pads=[0, 4])),
])
def test_conv_configurations_match_onnxruntime(threads, shape, wshape, attrs):
    rng = np.random.default_rng(len(shape) + wshape[0])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "w": rng.standard_normal(wshape).astype(np.float32),
             "b": rng.standard_normal(wshape[0]).astype(np.float32)}
    _close(_ours("Conv", feeds, threads=threads, **attrs), _ort("Conv", feeds, **attrs))


def test_conv_empty_batch_and_empty_channels():
    w = np.ones((4, 3, 3, 3), np.float32)
    b = np.arange(4, dtype=np.float32)
    y = _ours("Conv", {"x": np.zeros((0, 3, 5, 5), np.float32), "w": w, "b": b}, pads=[1, 1, 1, 1])
    assert y.shape == (0, 4, 5, 5)
    y = _ours("Conv", {"x": np.zeros((0, 4, 5, 5), np.float32), "w": np.ones((4, 1, 3, 3), np.float32)},
              group=4)
    assert y.shape == (0, 4, 3, 3)
    y = _ours("Conv", {"x": np.zeros((2, 0, 5, 5), np.float32), "w": np.ones((4, 0, 3, 3), np.float32),
                       "b": b})
    np.testing.assert_array_equal(y, np.broadcast_to(b.reshape(1, 4, 1, 1), (2, 4, 3, 3)))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 2e-2), (ml_dtypes.bfloat16, 5e-2)])
def test_conv_other_dtypes_match_the_float64_definition(dtype, tol):
    case = dict(nd=2, ins=[5, 6], kernel=[3, 2], strides=[2, 1], dilations=[1, 2], group=2, cg=2, mg=3,
                auto_pad="NOTSET", pads=[1, 0, 2, 1], n=2, bias=True, name_kernel=False, seed=3)
    case["begins"], case["outs"] = _definition_pads_conv(case["ins"], case["kernel"], case["strides"],
                                                         case["dilations"], "NOTSET", case["pads"])
    feeds, attrs = _conv_feeds_attrs(case, dtype)
    got = _ours("Conv", feeds, **attrs)
    assert got.dtype == np.dtype(dtype)
    want = _conv64(feeds["x"], feeds["w"], feeds["b"], 2, case["strides"], case["dilations"],
                   case["begins"], case["outs"])
    _close(got, want, tol)
    if dtype == np.float64:
        _close(got, _reference("Conv", feeds, **attrs), tol)
    # the depthwise loop in other dtypes too
    feeds = {"x": feeds["x"][:, :3], "w": feeds["w"][:3, :1]}
    got = _ours("Conv", feeds, group=3, pads=[1, 1, 1, 1])
    want = _conv64(feeds["x"], feeds["w"], None, 3, [1, 1], [1, 1], [1, 1], [5, 7])
    _close(got, want, tol)


def test_one_conv_plan_serves_every_input_size():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    feeds = {"x": np.zeros((1, 4, 8, 8), np.float32), "w": w}
    attrs = dict(group=2, strides=[2, 2], auto_pad="SAME_UPPER")
    sess = InferenceSession(_model("Conv", feeds, dynamic=True, **attrs))
    for shape in [(1, 4, 8, 8), (3, 4, 1, 13), (2, 4, 17, 5)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32), "w": w}
        _close(sess.run(None, feeds)[0], _ort("Conv", feeds, **attrs))


# -- ConvTranspose ---------------------------------------------------------------------------

def _definition_pads_convt(ins, kernel, strides, dilations, auto_pad, pads, out_pad, out_shape):
    nd = len(ins)
    begins, outs = [], []
    for i in range(nd):
        full = strides[i] * (ins[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
        target = out_shape[i] if out_shape is not None else (
            ins[i] * strides[i] if auto_pad in ("SAME_UPPER", "SAME_LOWER") else None)
        if target is not None:
            tot = max(0, full - target)  # an output past the full extent ends in zeros
            begins.append(tot // 2 if auto_pad == "SAME_UPPER" else tot - tot // 2)
            outs.append(target)
        else:
            b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[nd + i])
            begins.append(b)
            outs.append(full - b - e)
    return begins, outs


@st.composite
def _convt_cases(draw):
    nd = draw(st.integers(1, 3))
    ins = [draw(st.integers(1, 5 if nd < 3 else 3)) for _ in range(nd)]
    kernel = [draw(st.integers(1, 4 if nd < 3 else 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilations = [draw(st.integers(1, 2)) for _ in range(nd)]
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    mode = draw(st.sampled_from(["pads", "pads", "SAME_UPPER", "SAME_LOWER", "VALID", "output_shape"]))
    out_pad = [draw(st.integers(0, s - 1)) for s in strides]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    out_shape = None
    if mode == "output_shape":
        fulls = [s * (i - 1) + op + (k - 1) * d + 1
                 for s, i, op, k, d in zip(strides, ins, out_pad, kernel, dilations)]
        out_shape = [max(1, f - draw(st.integers(-2, 2))) for f in fulls]
    auto_pad = mode if mode in ("SAME_UPPER", "SAME_LOWER", "VALID") else "NOTSET"
    begins, outs = _definition_pads_convt(ins, kernel, strides, dilations, auto_pad, pads, out_pad,
                                          out_shape)
    assume(min(outs) >= 1)
    return dict(nd=nd, ins=ins, kernel=kernel, strides=strides, dilations=dilations, group=group,
                cg=cg, mg=mg, mode=mode, auto_pad=auto_pad, pads=pads, out_pad=out_pad,
                out_shape=out_shape, begins=begins, outs=outs, n=draw(st.integers(1, 2)),
                bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _convt_feeds_attrs(case, dtype=np.float32):
    rng = np.random.default_rng(case["seed"])
    c = case["cg"] * case["group"]
    feeds = {"x": rng.standard_normal((case["n"], c, *case["ins"])).astype(dtype),
             "w": rng.standard_normal((c, case["mg"], *case["kernel"])).astype(dtype)}
    if case["bias"]:
        feeds["b"] = rng.standard_normal(case["mg"] * case["group"]).astype(dtype)
    attrs = dict(strides=case["strides"], dilations=case["dilations"], group=case["group"])
    if any(case["out_pad"]):
        attrs["output_padding"] = case["out_pad"]
    if case["mode"] == "pads":
        attrs["pads"] = case["pads"]
    elif case["mode"] == "output_shape":
        attrs["output_shape"] = case["out_shape"]
    else:
        attrs["auto_pad"] = case["auto_pad"]
    return feeds, attrs


@_SETTINGS
@given(_convt_cases())
def test_conv_transpose_matches_onnxruntime_reference_and_definition(case):
    feeds, attrs = _convt_feeds_attrs(case)
    got = _ours("ConvTranspose", feeds, **attrs)
    want = _convt64(feeds["x"], feeds["w"], feeds.get("b"), case["group"], case["strides"],
                    case["dilations"], case["begins"], case["outs"])
    _close(got, want)
    # an output past the full extent (SAME_* with a stride larger than the kernel, or a large
    # output_shape): onnxruntime then gives SAME_* the full extent instead of in * stride,
    # and onnx.reference starts SAME_UPPER one position early
    fulls = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in
             zip(case["strides"], case["ins"], case["out_pad"], case["kernel"], case["dilations"])]
    long = any(f < o for f, o in zip(fulls, case["outs"]))
    same_long = long and case["mode"] in ("SAME_UPPER", "SAME_LOWER")
    ort = None if same_long else _ort("ConvTranspose", feeds, **attrs)
    if case["mode"] != "output_shape" and not same_long:  # it checks output_shape narrowly
        assert ort is not None, "onnxruntime refused a valid configuration"
    if ort is not None:
        _close(got, ort)
    # onnx.reference mixes up the channels of grouped ConvTranspose and takes explicit
    # output_shape only when it equals the full extent: consulted where it is right
    if case["group"] == 1 and not long and (case["mode"] != "output_shape" or case["outs"] == fulls):
        _close(got, _reference("ConvTranspose", feeds, **attrs))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,wshape,attrs", [
    ((1, 64, 66, 64), (64, 32, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ((2, 6, 1, 1), (6, 4, 3, 3), {}),
    ((1, 8, 5, 4), (8, 2, 2, 2), dict(group=4, strides=[2, 2])),
    ((1, 3, 4, 5, 3), (3, 2, 2, 3, 2), dict(strides=[2, 1, 2], dilations=[1, 2, 1], auto_pad="SAME_LOWER")),
    ((2, 4, 11), (4, 3, 5), dict(strides=[3], output_shape=[34])),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[3, 2], output_shape=[10, 8])),   # past the full extent
])
def test_conv_transpose_configurations_match_onnxruntime(threads, shape, wshape, attrs):
    rng = np.random.default_rng(len(shape) + wshape[1])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "w": rng.standard_normal(wshape).astype(np.float32),
             "b": rng.standard_normal(wshape[1] * attrs.get("group", 1)).astype(np.float32)}
    _close(_ours("ConvTranspose", feeds, threads=threads, **attrs), _ort("ConvTranspose", feeds, **attrs))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float16, 2e-2)])
def test_conv_transpose_other_dtypes_match_the_float64_definition(dtype, tol):
    case = dict(nd=2, ins=[3, 4], kernel=[3, 2], strides=[2, 3], dilations=[2, 1], group=2, cg=2, mg=2,
                mode="pads", auto_pad="NOTSET", pads=[1, 0, 0, 2], out_pad=[1, 2], out_shape=None,
                n=2, bias=True, seed=5)
    case["begins"], case["outs"] = _definition_pads_convt(case["ins"], case["kernel"], case["strides"],
                                                          case["dilations"], "NOTSET", case["pads"],
                                                          case["out_pad"], None)
    feeds, attrs = _convt_feeds_attrs(case, dtype)
    got = _ours("ConvTranspose", feeds, **attrs)
    assert got.dtype == np.dtype(dtype)
    _close(got, _convt64(feeds["x"], feeds["w"], feeds["b"], 2, case["strides"], case["dilations"],
                         case["begins"], case["outs"]), tol)


# -- errors ----------------------------------------------------------------------------------

def _shapeless(model):
    """The model without input shapes: the checks are then the kernel's own, not shape
    inference's."""
    for vi in model.graph.input:
        vi.type.tensor_type.ClearField("shape")
    return model


_X = np.zeros((1, 4, 5, 5), np.float32)
_W = np.zeros((6, 2, 3, 3), np.float32)


@pytest.mark.parametrize("op,attrs", [
    ("Conv", dict(auto_pad="SAME")),
    ("Conv", dict(group=0)),
    ("Conv", dict(pads=[1, -1, 0, 0])),
    ("Conv", dict(pads=[1, 1, 1])),
    ("Conv", dict(strides=[0, 1])),
    ("Conv", dict(dilations=[1, 1], strides=[1, 1, 1])),
    ("Conv", dict(kernel_shape=[1, 1, 1, 1])),
    ("Conv", dict(output_padding=[1, 1])),
    ("ConvTranspose", dict(output_padding=[-1, 0])),
    ("ConvTranspose", dict(output_shape=[4, 4], strides=[2])),
])
def test_unsupported_attributes_are_refused_at_plan_time(op, attrs):
    model = _shapeless(_model(op, {"x": _X, "w": _W}, **attrs))
    with pytest.raises(UnsupportedAttributeError, match=op):
        InferenceSession(model)


@pytest.mark.parametrize("op,feeds,attrs,match", [
    ("Conv", {"x": _X, "w": _W}, dict(group=3), "group=3 must divide"),
    ("Conv", {"x": _X, "w": np.zeros((6, 3, 3, 3), np.float32)}, {}, "input channels per group"),
    ("Conv", {"x": _X, "w": _W}, dict(group=2, kernel_shape=[2, 2]), "kernel_shape"),
    ("Conv", {"x": _X, "w": _W, "b": np.zeros(5, np.float32)}, dict(group=2), "B has shape"),
    ("Conv", {"x": _X, "w": _W.astype(np.float64)}, dict(group=2), "share one dtype"),
    ("Conv", {"x": _X, "w": _W[..., :1, :1]}, dict(group=2, strides=[1, 1, 1]), "strides"),
    ("Conv", {"x": _X[:, :, :2, :2], "w": _W}, dict(group=2), "larger than the padded input"),
    ("Conv", {"x": np.zeros((1, 4, 2, 2, 2, 2), np.float32), "w": np.zeros((4, 4, 1, 1, 1, 1), np.float32)},
     {}, "rank 3, 4 or 5"),
    ("ConvTranspose", {"x": _X, "w": _W}, dict(group=2), "first axis"),
    ("ConvTranspose", {"x": _X, "w": np.zeros((4, 2, 3, 3), np.float32)}, dict(group=3), "must divide"),
    ("ConvTranspose", {"x": _X, "w": np.zeros((4, 2, 3, 3), np.float32)}, dict(pads=[4, 0, 4, 0]),
     "leave no output"),
])
def test_inconsistent_shapes_raise_typed_errors(op, feeds, attrs, match):
    model = _shapeless(_model(op, feeds, **attrs))
    with pytest.raises(KernelError, match=match):
        InferenceSession(model).run(None, feeds)


def test_compiled_core_checks_its_buffers():
    x = np.zeros((2, 3, 4), np.float32)
    col = np.zeros((2 * 4, 3 * 4), np.float32)
    geo = ((2, 1, 3, 4), (1, 3, 4), (1, 2, 2), (1, 1, 1), (1, 1, 1), (0, 1, 1))
    _conv.im2col(x, col, *geo, 0, 3)
    with pytest.raises(KernelError, match="elements"):
        _conv.im2col(x, col[:-1], *geo, 0, 3)
    with pytest.raises(KernelError, match="rows"):
        _conv.im2col(x, col, *geo, 0, 4)
    with pytest.raises(KernelError, match="float32"):
        _conv.im2col(x.astype(np.float64), col, *geo, 0, 3)
    with pytest.raises(KernelError, match="C-contiguous"):
        _conv.im2col(x, np.zeros((3 * 4, 2 * 4), np.float32).T, *geo, 0, 3)


def test_without_the_extension_float32_takes_the_numpy_path(monkeypatch):
    from onnxforge.kernels_cy.conv import kernels

    monkeypatch.setattr(kernels, "COMPILED", False)
    rng = np.random.default_rng(11)
    for op, wshape, attrs in [("Conv", (6, 2, 3, 2), dict(group=2, strides=[2, 1], pads=[1, 0, 0, 1])),
                              ("Conv", (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
                              ("ConvTranspose", (4, 3, 3, 2), dict(group=2, strides=[2, 3], pads=[1, 0, 0, 1]))]:
        feeds = {"x": rng.standard_normal((2, 4, 5, 6)).astype(np.float32),
                 "w": rng.standard_normal(wshape).astype(np.float32)}
        got = _ours(op, feeds, **attrs)
        assert got.dtype == np.float32
        _close(got, _ort(op, feeds, **attrs))
