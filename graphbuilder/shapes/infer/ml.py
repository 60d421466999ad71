"""Operators of the ``ai.onnx.ml`` domain that onnx's shape inference types.

Classifiers give labels ``[N]`` (int64 or string, from which class label list is
set) and scores ``[N, classes]``; regressors and ``TreeEnsemble`` give
``[N, targets]``; element-wise ones (``LabelEncoder``, ``CategoryMapper``) keep
the input's shape with the element type of their values.
"""
from __future__ import annotations

from onnx import TensorProto
from onnxforge.graphbuilder.shapes.infer._base import NodeInference, register
from onnxforge.graphbuilder.shapes.symbolic import Dim, product
from onnxforge.graphbuilder.ir.tensors import Tensor
from onnxforge.proto_ext.types import MapType, SequenceType, TensorType

__all__: list[str] = []

ML = "ai.onnx.ml"
INT64, FLOAT, STRING = TensorProto.INT64, TensorProto.FLOAT, TensorProto.STRING


def _batch(op: NodeInference) -> Dim:
    s = op.shape(0)
    if s is None:
        return None
    return s[0] if len(s) == 2 else (1 if len(s) == 1 else None)


@register("ArrayFeatureExtractor", domain=ML)
def _array_feature_extractor(op: NodeInference) -> None:
    x, y = op.shape(0), op.shape(1)
    if x is None:
        op.set(0, op.elem(0), None)
        return
    n = product(y) if y is not None else None
    op.set(0, op.elem(0), [1, n] if len(x) == 1 else [*x[:-1], n])


@register("LabelEncoder", domain=ML)
def _label_encoder(op: NodeInference) -> None:
    elem = 0
    for name, code in (("values_tensor", 0), ("values_int64s", INT64), ("values_strings", STRING),
                       ("values_floats", FLOAT)):
        v = op.attr(name)
        if v is not None:
            elem = v.dtype if isinstance(v, Tensor) else code
            break
    op.same_as_input(elem=elem or None)


@register("CategoryMapper", domain=ML)
def _category_mapper(op: NodeInference) -> None:
    e = op.elem(0)
    op.same_as_input(elem=INT64 if e == STRING else (STRING if e == INT64 else None))


@register("TreeEnsemble", domain=ML)
def _tree_ensemble(op: NodeInference) -> None:
    op.set(0, op.elem(0), [_batch(op), op.int_attr("n_targets")])


@register("TreeEnsembleRegressor", domain=ML)
def _tree_regressor(op: NodeInference) -> None:
    op.set(0, FLOAT, [_batch(op), op.int_attr("n_targets")])


def _labels(op: NodeInference) -> tuple[int, list | None]:
    """Element type and list of the class labels (strings win over integers)."""
    strings = op.attr("classlabels_strings")
    if strings:
        return STRING, list(strings)
    name = "classlabels_int64s" if op.node.op_type == "TreeEnsembleClassifier" else "classlabels_ints"
    ints = op.attr(name)
    return INT64, (list(ints) if ints else None)


@register("TreeEnsembleClassifier", "SVMClassifier", "LinearClassifier", domain=ML)
def _classifier(op: NodeInference) -> None:
    """labels ``[N]``, scores ``[N, classes]``: one class per label (TreeEnsembleClassifier),
    one per intercept, or two for a binary LinearClassifier with one intercept; the
    score width of SVMClassifier depends on its probability settings (unknown)."""
    elem, labels = _labels(op)
    n = _batch(op)
    op.set(0, elem, [n])
    if not op.has_output(1):
        return
    classes: Dim = None
    kind = op.node.op_type
    if kind == "TreeEnsembleClassifier":
        classes = len(labels) if labels else None
    elif kind == "LinearClassifier":
        intercepts = op.floats_attr("intercepts") or []
        classes = len(intercepts) or None
        if len(intercepts) == 1 and labels is not None and len(labels) == 2:
            classes = 2
    op.set(1, FLOAT, [n, classes])


@register("OneHotEncoder", domain=ML)
def _one_hot_encoder(op: NodeInference) -> None:
    s = op.shape(0)
    cats = op.attr("cats_int64s") or op.attr("cats_strings") or []
    op.set(0, FLOAT, None if s is None else [*s, len(cats)])


@register("DictVectorizer", domain=ML)
def _dict_vectorizer(op: NodeInference) -> None:
    t = op.type(0)
    elem = t.value.elem_type if isinstance(t, MapType) and isinstance(t.value, TensorType) else 0
    vocab = op.attr("int64_vocabulary") or op.attr("string_vocabulary") or []
    op.set(0, elem, [None, len(vocab)])


@register("CastMap", domain=ML)
def _cast_map(op: NodeInference) -> None:
    to = op.attr("cast_to", b"TO_FLOAT")
    to = to.decode() if isinstance(to, bytes) else str(to)
    elem = {"TO_FLOAT": FLOAT, "TO_STRING": STRING, "TO_INT64": INT64}.get(to, 0)
    op.set(0, elem, [1, None])


@register("ZipMap", domain=ML)
def _zip_map(op: NodeInference) -> None:
    key = STRING if op.attr("classlabels_strings") else INT64
    op.set_type(0, SequenceType(MapType(key, TensorType(FLOAT, ()))))
