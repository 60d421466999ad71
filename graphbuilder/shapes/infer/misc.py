"""Quantization, Einsum, linear algebra, spectral, random, loss, string and training
operators, plus the operators whose output has a data-dependent length.

A length that depends on the data (``Compress``, ``Unique``, ``StringSplit``...)
is a fresh symbol when the same count is shared by several outputs (so that
they compare equal) and unknown otherwise::

    Unique(X[6]) -> Y[_u0], indices[_u0], inverse_indices[6], counts[_u0]
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, broadcast_shapes, register
from onnxforge.graphbuilder.shapes.infer.nn import matmul_shape
from onnxforge.graphbuilder.shapes.symbolic import Dim, as_dim, floordiv, product

__all__: list[str] = []

INT64 = TensorProto.INT64
FLOAT = TensorProto.FLOAT
STRING = TensorProto.STRING
PREVIEW_TRAINING = "ai.onnx.preview.training"


def _text(v: object, default: str = "") -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


# ----------------------------------------------------------------------------- quantization


@register("QuantizeLinear")
def _quantize(op: NodeInference) -> None:
    elem = op.elem(2) if op.has(2) else 0
    elem = elem or op.int_attr("output_dtype", 0) or (0 if op.has(2) else TensorProto.UINT8)
    op.same_as_input(elem=elem)


@register("DequantizeLinear")
def _dequantize(op: NodeInference) -> None:
    elem = op.int_attr("output_dtype", 0) or (op.elem(1) if op.version >= 19 else FLOAT)
    op.same_as_input(elem=elem)


@register("DynamicQuantizeLinear")
def _dynamic_quantize(op: NodeInference) -> None:
    op.same_as_input(elem=TensorProto.UINT8)
    op.set(1, FLOAT, [])
    op.set(2, TensorProto.UINT8, [])


@register("MatMulInteger")
def _matmul_integer(op: NodeInference) -> None:
    op.set(0, TensorProto.INT32, matmul_shape(op, op.shape(0), op.shape(1)))


@register("QLinearMatMul")
def _qlinear_matmul(op: NodeInference) -> None:
    op.set(0, op.elem(7), matmul_shape(op, op.shape(0), op.shape(3)))


# ----------------------------------------------------------------------------- Einsum


def _einsum_terms(op: NodeInference, equation: str, n: int) -> tuple[list[str], str | None]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n:
        op.fail(f"equation {equation!r} has {len(terms)} operands for {n} inputs")
    return terms, (rhs if arrow else None)


@register("Einsum")
def _einsum(op: NodeInference) -> None:
    n = op.n_inputs
    elem = op.elem(0)
    terms, rhs = _einsum_terms(op, _text(op.attr("equation")), n)
    sizes: dict[str, Dim] = {}
    counts: dict[str, int] = {}
    ellipsis: list[Dim] | None = []
    ell_rank = 0
    for i, term in enumerate(terms):
        s = op.shape(i)
        letters = term.replace("...", "")
        has_ell = "..." in term
        if s is None:
            if has_ell and rhs is not None and "..." in rhs:
                op.set(0, elem, None)
                return
            for c in letters:
                counts[c] = counts.get(c, 0) + 1
                sizes.setdefault(c, None)
            continue
        k = len(s) - len(letters)
        if k < 0 or (k and not has_ell):
            op.fail(f"operand {i} of rank {len(s)} does not fit term {term!r}")
        head = term.index("...") if has_ell else len(term)
        dims = list(s)
        ell = dims[head:head + k]
        rest = dims[:head] + dims[head + k:]
        if has_ell:
            if k > ell_rank:
                ellipsis = [None] * (k - ell_rank) + (ellipsis or [])
                ell_rank = k
            if ellipsis is not None:
                pad = [1] * (ell_rank - k) + ell
                ellipsis = [e if e is not None and e != 1 else p for e, p in zip(ellipsis, pad)]
        for c, d in zip(letters, rest):
            counts[c] = counts.get(c, 0) + 1
            old = sizes.get(c)
            if old is None or (old == 1 and isinstance(old, int)):
                sizes[c] = d
    if rhs is None:
        out_letters = "".join(sorted(c for c, k in counts.items() if k == 1))
        out = list(ellipsis or []) + [sizes[c] for c in out_letters]
    else:
        head = rhs.index("...") if "..." in rhs else None
        letters = rhs.replace("...", "")
        out = [sizes.get(c) for c in letters]
        if head is not None:
            out[head:head] = list(ellipsis or [])
    op.set(0, elem, out)


# ----------------------------------------------------------------------------- linear algebra


@register("Det")
def _det(op: NodeInference) -> None:
    s = op.shape(0)
    op.set(0, op.elem(0), None if s is None else list(s[:-2]))


@register("SwiGLU", "ReverseSequence", "CumProd")
@register("Binarizer", domain="ai.onnx.ml")
def _same(op: NodeInference) -> None:
    op.same_as_input()


@register("BitCast")
def _bitcast(op: NodeInference) -> None:
    op.same_as_input(elem=op.int_attr("to", 0) or 0)


# ----------------------------------------------------------------------------- data-dependent lengths


def _selected(op: NodeInference, length: Dim) -> Dim:
    """How many entries a known condition keeps of an axis of ``length`` (a condition
    longer than a numeric axis is cut; a symbolic axis is assumed long enough)."""
    v = op.value(1)
    if v is None or len(v.shape) != 1 or any(not isinstance(c, (bool, int)) for c in v.flat()):
        return None
    cond = v.flat()
    if isinstance(length, int):
        cond = cond[:length]
    elif length is None:
        return None
    return sum(1 for c in cond if c)


@register("Compress")
def _compress(op: NodeInference) -> None:
    s = op.shape(0)
    axis = op.int_attr("axis")
    if axis is None:
        op.set(0, op.elem(0), [_selected(op, None if s is None else product(s))])
        return
    if s is None:
        op.set(0, op.elem(0), None)
        return
    a = op.norm_axis(axis, len(s))
    op.set(0, op.elem(0), [_selected(op, d) if i == a else d for i, d in enumerate(s)])


@register("Unique")
def _unique(op: NodeInference) -> None:
    s = op.shape(0)
    axis = op.int_attr("axis")
    u = op.fresh("u")
    if axis is None:
        op.set(0, op.elem(0), [u])
        inverse = [product(s)] if s is not None else [None]
    elif s is None:
        op.set(0, op.elem(0), None)
        inverse = [None]
    else:
        a = op.norm_axis(axis, len(s))
        op.set(0, op.elem(0), [u if i == a else d for i, d in enumerate(s)])
        inverse = [s[a]]
    for i in (1, 3):
        if op.has_output(i):
            op.set(i, INT64, [u])
    if op.has_output(2):
        op.set(2, INT64, inverse)


# ----------------------------------------------------------------------------- random


def _dtype(op: NodeInference, default: int) -> int:
    return op.int_attr("dtype", 0) or default


@register("RandomUniform", "RandomNormal")
def _random(op: NodeInference) -> None:
    op.set(0, _dtype(op, FLOAT), op.ints_attr("shape"))


@register("RandomUniformLike", "RandomNormalLike", "Bernoulli")
def _random_like(op: NodeInference) -> None:
    op.same_as_input(elem=_dtype(op, op.elem(0)))


@register("Multinomial")
def _multinomial(op: NodeInference) -> None:
    s = op.shape(0)
    op.set(0, _dtype(op, TensorProto.INT32), None if s is None else [s[0], op.int_attr("sample_size", 1)])


# ----------------------------------------------------------------------------- spectral


@register("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(op: NodeInference) -> None:
    size = op.ints(0)
    op.set(0, op.int_attr("output_datatype", FLOAT) or FLOAT,
           [size[0] if size is not None and len(size) == 1 else None])


@register("MelWeightMatrix")
def _mel(op: NodeInference) -> None:
    bins, length = op.ints(0), op.ints(1)
    n = length[0] if length is not None and len(length) == 1 else None
    op.set(0, op.int_attr("output_datatype", FLOAT) or FLOAT,
           [None if n is None else as_dim(floordiv(n, 2) + 1),
            bins[0] if bins is not None and len(bins) == 1 else None])


def _scalar(op: NodeInference, i: int) -> Dim:
    v = op.ints(i) if op.has(i) else None
    return v[0] if v is not None and len(v) == 1 else None


@register("DFT")
def _dft(op: NodeInference) -> None:
    s = op.shape(0)
    elem = op.elem(0)
    if s is None:
        op.set(0, elem, None)
        return
    r = len(s)
    if op.version >= 20:
        axis = _scalar(op, 2) if op.has(2) else -2
        if axis is None and not op.has(1) and not op.int_attr("onesided", 0):
            op.set(0, elem, list(s[:-1]) + [2])  # every axis keeps its length
            return
        if not isinstance(axis, int):  # unknown, or a symbolic scalar
            last = 1 if op.int_attr("inverse", 0) and op.int_attr("onesided", 0) else 2
            op.set(0, elem, [s[0]] + [None] * (r - 2) + [last])  # the axis is neither the batch nor the last
            return
    else:
        axis = op.int_attr("axis", 1)
    a = op.norm_axis(axis, r)
    onesided = op.int_attr("onesided", 0)
    inverse = op.int_attr("inverse", 0)
    out = list(s)
    n = _scalar(op, 1) if op.has(1) else s[a]
    if op.has(1) and n is None:
        out[a] = None
    elif onesided and not inverse:
        out[a] = None if n is None else as_dim(floordiv(n, 2) + 1)
    elif onesided and inverse:  # irfft: the full length, 2*(bins - 1) unless given
        out[a] = n if op.has(1) else (None if n is None else as_dim(2 * (n - 1)))
    else:
        out[a] = n
    out[-1] = 1 if onesided and inverse else 2
    op.set(0, elem, out)


@register("STFT")
def _stft(op: NodeInference) -> None:
    s = op.shape(0)
    step = _scalar(op, 1)
    length = _scalar(op, 3) if op.has(3) else None
    if length is None and op.has(2):
        w = op.shape(2)
        length = w[0] if w is not None and len(w) == 1 else None
    frames: Dim = None
    if s is not None and len(s) == 3 and s[1] is not None and length is not None and step:
        frames = as_dim(floordiv(s[1] - length, step) + 1)
    bins: Dim = None
    if length is not None:
        bins = as_dim(floordiv(length, 2) + 1) if op.int_attr("onesided", 1) else length
    op.set(0, op.elem(0), [s[0] if s is not None else None, frames, bins, 2])


# ----------------------------------------------------------------------------- losses


@register("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")
def _loss(op: NodeInference) -> None:
    reduction = _text(op.attr("reduction"), "mean")
    elem = op.elem(0)
    if reduction == "none":
        s = op.shape(0)
        t = op.shape(1)
        op.set(0, elem, list(t) if t is not None else (None if s is None else [s[0], *s[2:]]))
    else:
        op.set(0, elem, [])
    if op.has_output(1):
        op.same_as_input(1, 0)


# ----------------------------------------------------------------------------- strings


@register("StringConcat")
def _string_concat(op: NodeInference) -> None:
    op.set(0, STRING, broadcast_shapes(op, op.shape(0), op.shape(1)))


@register("RegexFullMatch")
def _regex(op: NodeInference) -> None:
    op.same_as_input(elem=TensorProto.BOOL)


@register("StringNormalizer")
def _string_normalizer(op: NodeInference) -> None:
    s = op.shape(0)
    if s is None:
        op.set(0, STRING, None)
    elif len(s) == 2:
        op.set(0, STRING, [1, None])
    else:
        op.set(0, STRING, [None])


@register("StringSplit")
def _string_split(op: NodeInference) -> None:
    s = op.shape(0)
    op.set(0, STRING, None if s is None else [*s, None])
    op.set(1, INT64, s)


@register("TfIdfVectorizer")
def _tfidf(op: NodeInference) -> None:
    s = op.shape(0)
    idx = op.ints_attr("ngram_indexes") or []
    width = max(idx) + 1 if idx else 0
    if s is None:
        op.set(0, FLOAT, None)
    elif len(s) == 2:
        op.set(0, FLOAT, [s[0], width])
    else:
        op.set(0, FLOAT, [width])


# ----------------------------------------------------------------------------- training (preview)


def _optimizer_outputs(op: NodeInference, groups: tuple[int, ...]) -> None:
    """Outputs group ``g`` (``n`` each) take the types of input group ``groups[g]`` (after R, T)."""
    n_in = op.n_inputs - 2
    per = len(groups) + 1
    if n_in <= 0 or n_in % per:
        return
    n = n_in // per
    for k in range(op.n_outputs):
        g, j = divmod(k, n)
        if g < len(groups):
            op.same_as_input(k, 2 + groups[g] * n + j)


@register("Adagrad", domain=PREVIEW_TRAINING)
def _adagrad(op: NodeInference) -> None:
    _optimizer_outputs(op, (0, 2))


@register("Momentum", domain=PREVIEW_TRAINING)
def _momentum(op: NodeInference) -> None:
    _optimizer_outputs(op, (0, 2))


@register("Adam", domain=PREVIEW_TRAINING)
def _adam(op: NodeInference) -> None:
    _optimizer_outputs(op, (0, 2, 3))
