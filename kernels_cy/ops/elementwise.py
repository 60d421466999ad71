"""Elementwise kernels: unary math, binary arithmetic with broadcasting, comparisons,
logic, Where, Cast and the variadic Max/Min/Sum/Mean (numpy ufuncs, one call each)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxforge.kernels_cy.ops import fast
from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register
from onnxforge.proto_ext.dtypes import np_dtype
from onnxforge.proto_ext.errors import CodecError

F32 = np.dtype(np.float32)

__all__: list[str] = []


_F64 = np.dtype(np.float64)


def _erf_like(flat_fn: Any, scalar_fn: Any, x: np.ndarray, threads: int | None) -> np.ndarray:
    """``flat_fn`` (a compiled loop over a flat float32/float64 array) applied to ``x``:
    float32 and float64 in their own type, the 2-byte floats through float32, other types
    through float64, each rounded once to ``x``'s type. Without the compiled module,
    ``scalar_fn`` (math.erf based) runs element by element."""
    ct = x.dtype if x.dtype in (F32, _F64) else (F32 if x.dtype.kind == "f" or x.dtype.kind == "V" else _F64)
    xc = np.ascontiguousarray(x, dtype=ct).reshape(-1)
    if flat_fn is None:  # the extension is not built: correct, but one Python call per element
        y = np.vectorize(scalar_fn, otypes=[np.float64])(xc.astype(np.float64)).astype(ct)
    else:
        y = np.empty(xc.shape, dtype=ct)
        flat_fn(xc, y, threads)
    return y.reshape(x.shape).astype(x.dtype, copy=False)


def _gelu_scalar(v: float) -> float:
    return 0.5 * v * math.erfc(-v / math.sqrt(2.0))


@register("", "Erf")
class Erf(Kernel):
    """The error function, compiled (``_erf.pyx``): C's ``erff`` for float32, ``erf`` for
    float64; parallel on the session's threads for large tensors."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.threads = spec.threads

    def run(self, x):
        return _erf_like(fast.erf_flat, math.erf, x, self.threads if x.size >= _PARALLEL_ELEMS else None)


_PARALLEL_ELEMS = 1 << 16


_UNARY: dict[str, Any] = {
    "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
    "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Tanh": np.tanh, "Floor": np.floor,
    "Ceil": np.ceil, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh,
    "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh,
    "Sign": np.sign, "Round": np.round,
}


class _Unary(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.fn = _UNARY[spec.op_type]

    def run(self, x):
        return np.asarray(self.fn(x))


for _name in _UNARY:
    register("", _name)(_Unary)


@register("", "Reciprocal")
class Reciprocal(Kernel):
    def run(self, x):
        return np.reciprocal(x)


@register("", "Not")
class Not(Kernel):
    def run(self, x):
        return np.logical_not(x)


@register("", "IsNaN")
class IsNaN(Kernel):
    def run(self, x):
        return np.isnan(x)


@register("", "IsInf")
class IsInf(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.neg = spec.int("detect_negative", 1)
        self.pos = spec.int("detect_positive", 1)

    def run(self, x):
        if self.neg and self.pos:
            return np.isinf(x)
        if self.pos:
            return np.isposinf(x)
        if self.neg:
            return np.isneginf(x)
        return np.zeros(x.shape, dtype=bool)


@register("", "Relu")
class Relu(Kernel):
    def run(self, x):
        return np.maximum(x, x.dtype.type(0))


@register("", "Sigmoid")
class Sigmoid(Kernel):
    def run(self, x):
        if fast.sigmoid is not None and x.dtype == F32 and x.flags.c_contiguous:
            out = np.empty(x.shape, dtype=F32)
            fast.sigmoid(x.reshape(-1), out.reshape(-1))
            return out
        # 1 / (1 + exp(-x)) without overflow warnings for large |x|
        with np.errstate(over="ignore"):
            out = np.asarray(np.exp(-x))
            out = out + out.dtype.type(1)
            return np.asarray(np.reciprocal(out))


@register("", "LeakyRelu")
class LeakyRelu(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.alpha = spec.float("alpha", 0.01)

    def run(self, x):
        return np.where(x >= 0, x, x * x.dtype.type(self.alpha)).astype(x.dtype)


@register("", "Softplus")
class Softplus(Kernel):
    def run(self, x):
        return np.logaddexp(x, x.dtype.type(0)).astype(x.dtype)


@register("", "Gelu")
class Gelu(Kernel):
    """``x / 2 * (1 + erf(x / sqrt(2)))`` (compiled, in double, rounded once) or, with
    ``approximate="tanh"``, its tanh approximation in float64."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.approx = spec.choice("approximate", "none", {"none", "tanh"})
        self.threads = spec.threads

    def run(self, x):
        if self.approx == "tanh":
            x64 = x.astype(np.float64)
            y = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
            return y.astype(x.dtype)
        return _erf_like(fast.gelu_flat, _gelu_scalar, x, self.threads if x.size >= _PARALLEL_ELEMS else None)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return (q + fix).astype(q.dtype)


class _Binary(Kernel):
    FN: Any = None

    def run(self, a, b):
        return self.FN(a, b)


@register("", "Add")
class Add(_Binary):
    FN = staticmethod(np.add)


@register("", "Sub")
class Sub(_Binary):
    FN = staticmethod(np.subtract)


@register("", "Mul")
class Mul(_Binary):
    FN = staticmethod(np.multiply)


@register("", "Div")
class Div(Kernel):
    def run(self, a, b):
        if a.dtype.kind in "iu":
            return _int_div(a, b)
        return np.divide(a, b)


@register("", "Mod")
class Mod(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.fmod = spec.int("fmod", 0)

    def run(self, a, b):
        if self.fmod:
            return np.fmod(a, b)
        return np.mod(a, b)


def _int_pow(kernel: Kernel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer ``a ** b`` as onnxruntime computes it (a double power truncated toward zero):
    a negative exponent gives 0, except for the bases 1 (1) and -1 (+-1 by the parity);
    ``0 ** negative`` has no value and raises."""
    neg = b < 0
    if not neg.any():
        return np.power(a, b.astype(a.dtype, copy=False)).astype(a.dtype, copy=False)
    a, b = np.broadcast_arrays(a, b)
    neg = b < 0
    if (neg & (a == 0)).any():
        raise kernel.error("integer Pow: 0 raised to a negative power has no value")
    out = np.power(a, np.where(neg, 0, b).astype(a.dtype, copy=False)).astype(a.dtype, copy=False)
    odd = (b % 2) != 0
    frac = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(a.dtype)
    return np.where(neg, frac, out)


@register("", "Pow")
class Pow(Kernel):
    def run(self, a, b):
        if b.ndim == 0 and a.dtype.kind == "f":
            e = float(b)
            if e == 2.0:
                return np.multiply(a, a)
            if e == 0.5:
                return np.sqrt(a)
            if e == 1.0:
                return np.array(a, copy=True)
            return np.power(a, a.dtype.type(e))
        if a.dtype.kind in "iu" and b.dtype.kind == "f":
            return np.power(a.astype(np.float64), b).astype(a.dtype)
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            return _int_pow(self, a, b)
        if b.dtype != a.dtype and a.dtype.kind == "f":  # in the wider type, rounded once to a's
            wide = np.result_type(a.dtype, b.dtype) if b.dtype.kind == "f" else a.dtype
            return np.power(a.astype(wide, copy=False), b.astype(wide, copy=False)).astype(a.dtype, copy=False)
        return np.power(a, b.astype(a.dtype) if b.dtype != a.dtype else b).astype(a.dtype, copy=False)


_COMPARE = {"Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal,
            "Greater": np.greater, "GreaterOrEqual": np.greater_equal,
            "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
            "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}


class _Compare(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.fn = _COMPARE[spec.op_type]

    def run(self, a, b):
        return np.asarray(self.fn(a, b))


for _name in _COMPARE:
    register("", _name)(_Compare)


@register("", "BitwiseNot")
class BitwiseNot(Kernel):
    def run(self, x):
        return np.invert(x)


@register("", "Where")
class Where(Kernel):
    def run(self, c, a, b):
        return np.where(c, a, b)


class _Variadic(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.op = spec.op_type

    def run(self, *xs):
        if self.op == "Max":
            out = xs[0]
            for x in xs[1:]:
                out = np.maximum(out, x)
        elif self.op == "Min":
            out = xs[0]
            for x in xs[1:]:
                out = np.minimum(out, x)
        else:
            out = xs[0]
            for x in xs[1:]:
                out = np.add(out, x)
            if self.op == "Mean":
                out = (out / len(xs)).astype(xs[0].dtype)
        if out is xs[0]:
            out = np.array(out, copy=True)
        return out


for _name in ("Max", "Min", "Sum", "Mean"):
    register("", _name)(_Variadic)


@register("", "Clip")
class Clip(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        # before opset 11 the bounds are attributes, defaulting to the float range
        f32max = float(np.finfo(np.float32).max)
        self.lo = spec.attrs.get("min", -f32max) if spec.opset < 11 else None
        self.hi = spec.attrs.get("max", f32max) if spec.opset < 11 else None

    def run(self, x, lo=None, hi=None):
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi
        out = np.array(x, copy=True)
        if lo is not None:
            np.maximum(out, np.asarray(lo, dtype=x.dtype), out=out)
        if hi is not None:
            np.minimum(out, np.asarray(hi, dtype=x.dtype), out=out)
        return out


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8_e8m0fnu codes of ``x`` (Cast-25): a code is a float32 biased exponent, so
    the code of ``|x|`` is its float32 exponent field, raised by one when ``round_mode``
    rounds the mantissa up ("up": any fraction; "nearest": more than half, or exactly
    half above the smallest exponent; "down": never). NaN and infinities give 0xFF (NaN);
    with ``saturate`` a value above the largest power of two stays at 0xFE instead of
    overflowing to NaN."""
    import ml_dtypes

    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    mantissa = bits & 0x7FFFFF
    if round_mode == "up":
        bump = mantissa > 0
    elif round_mode == "nearest":
        half = np.uint32(0x400000)
        bump = (mantissa > half) | ((mantissa == half) & (exponent > 0))
    else:
        bump = np.zeros(exponent.shape, dtype=bool)
    special = exponent == 0xFF
    bump &= ~special
    if saturate:
        bump &= exponent != 0xFE
    codes = np.where(special, 0xFF, exponent + bump).astype(np.uint8)
    return codes.view(ml_dtypes.float8_e8m0fnu)


def _cast_to(x: np.ndarray, dtype: np.dtype, saturate: bool, round_mode: str = "up") -> np.ndarray:
    if dtype == x.dtype:
        return np.array(x, copy=True)
    if dtype.kind == "U" or dtype == np.dtype(object):
        return x.astype(str).astype(object)
    if x.dtype == np.dtype(object) or x.dtype.kind == "U":
        return x.astype(np.float64 if dtype.kind == "f" or dtype.kind == "V" else dtype).astype(dtype)
    if dtype.name == "float8_e8m0fnu":  # every numeric source, through its float32 value
        return _to_e8m0(x, saturate, round_mode)
    name = dtype.name
    if saturate and name.startswith("float8"):
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        xf = x.astype(np.float32)
        xf = np.where(np.isinf(xf), np.sign(xf) * float(info.max), xf) if "fn" in name else xf
        xf = np.clip(xf, float(info.min), float(info.max)) if not np.all(np.isnan(xf)) else xf
        return xf.astype(dtype)
    if x.dtype.kind == "V" or x.dtype.name in ("bfloat16",) or name in ("bfloat16",):
        return x.astype(np.float32).astype(dtype)
    return x.astype(dtype)


@register("", "Cast")
class Cast(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        to = spec.int("to")
        if to == 8:  # STRING
            self.dtype = np.dtype(object)
        else:
            try:
                self.dtype = np_dtype(to)
            except CodecError:
                raise spec.fail(f"attribute to={to} names no supported element type") from None
        self.saturate = bool(spec.int("saturate", 1))
        self.round_mode = spec.choice("round_mode", "up", ("up", "down", "nearest"))
        self.plain = self.dtype in _PLAIN

    def run(self, x):
        if self.plain and x.dtype in _PLAIN and x.dtype != self.dtype:
            return x.astype(self.dtype)
        return _cast_to(x, self.dtype, self.saturate, self.round_mode)


_PLAIN = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                         np.uint32, np.uint64, np.float16, np.float32, np.float64))


@register("", "CastLike")
class CastLike(Kernel):
    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.saturate = bool(spec.int("saturate", 1))
        self.round_mode = spec.choice("round_mode", "up", ("up", "down", "nearest"))

    def run(self, x, like):
        return _cast_to(x, like.dtype, self.saturate, self.round_mode)
