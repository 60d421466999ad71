"""Small tensors whose elements are known, symbolic or unknown: the contents the
``shapes`` analysis tracks (shape vectors, axes, scalars).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto  # noqa: F401  (the doctest below names it)
from onnxforge.graphbuilder.shapes.symbolic import SymExpr, as_dim, symbol  # noqa: F401
from onnxforge.graphbuilder.ir.tensors import Tensor, np_dtype
from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.proto_ext.types import TensorType

__all__ = ["ShapeError", "SymTensor"]


class ShapeError(OnnxforgeError, ValueError):
    """Contradictory type or shape knowledge, or an operator applied to inputs it cannot take."""


def _element(x: Any) -> Any:
    """Normalise one element of a :class:`SymTensor`."""
    if x is None:
        return None
    if isinstance(x, SymExpr):
        return as_dim(x)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    raise TypeError(f"a SymTensor element is an int, float, bool, SymExpr or None, got {type(x).__name__}")


class SymTensor:
    """A small tensor whose elements are known, symbolic or unknown.

    ``data`` is a numpy array of dtype ``object`` holding ``int``/``float``/``bool``,
    :class:`SymExpr` (symbolic integers such as ``batch`` or ``past + seq``) or
    ``None`` (an unknown element). ``elem_type`` is the ONNX element type.

    >>> [str(x) for x in SymTensor.of(TensorProto.INT64, [symbol("batch"), 4, -1]).flat()]
    ['batch', '4', '-1']
    """

    __slots__ = ("elem_type", "data")

    def __init__(self, elem_type: int, data: np.ndarray | Any):
        if not isinstance(data, np.ndarray):  # numpy returns a bare element for 0-d results
            box = np.empty((), dtype=object)
            box[()] = data
            data = box
        self.elem_type = elem_type
        self.data = data

    @classmethod
    def of(cls, elem_type: int, values: Any, shape: Sequence[int] | None = None) -> SymTensor:
        """From a scalar, a (nested) list or an array; ``shape`` reshapes a flat list."""
        if isinstance(values, np.ndarray) and values.dtype != object and shape is None:
            if values.dtype.kind in _NUMERIC_KINDS:
                return _Numbers(elem_type, values)
            data = np.empty(values.size, dtype=object)
            data[:] = values.reshape(-1).tolist()  # plain Python numbers
            return cls(elem_type, data.reshape(values.shape))
        if isinstance(values, np.ndarray) and values.dtype != object:
            flat = values.reshape(-1).tolist()
            dims = values.shape
        elif isinstance(values, np.ndarray):
            flat = list(values.reshape(-1))
            dims = values.shape
        elif isinstance(values, (list, tuple)):
            flat, dims = _flatten_nested(values)
        else:
            flat, dims = [values], ()
        if shape is not None:
            dims = tuple(shape)
        data = np.empty(len(flat), dtype=object)
        for i, x in enumerate(flat):
            data[i] = _element(x)
        return cls(elem_type, data.reshape(dims))

    @classmethod
    def from_tensor(cls, t: Tensor) -> SymTensor:
        return cls.of(t.dtype, np.asarray(t.numpy()))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        return int(self.data.size)

    def flat(self) -> list[Any]:
        return list(self.data.reshape(-1))

    def integers(self) -> list[Any] | None:
        """The elements of a scalar or 1-D content when none is a bool or a float (each an
        ``int``, ``SymExpr`` or ``None``), else None."""
        if self.data.ndim > 1:
            return None
        out = []
        for x in self.flat():
            if isinstance(x, bool) or isinstance(x, float):
                return None
            out.append(x)
        return out

    def is_concrete(self) -> bool:
        """True when every element is a plain number."""
        return all(x is not None and not isinstance(x, SymExpr) for x in self.data.reshape(-1))

    def to_numpy(self) -> np.ndarray:
        """The value as a numpy array of its element type (requires :meth:`is_concrete`)."""
        if not self.is_concrete():
            raise ShapeError(f"{self} is not fully known")
        return np.array(self.data.tolist(), dtype=np_dtype(self.elem_type)).reshape(self.shape)

    def __repr__(self) -> str:
        return f"SymTensor({TensorType(self.elem_type, self.shape)}, {self.data.tolist()})"


_NUMERIC_KINDS = frozenset("biuf")


class _Numbers(SymTensor):
    """A :class:`SymTensor` every element of which is a number, kept as the numeric array
    it was made from. Most contents the analysis seeds (initializers, folded constants) are
    never read element by element; ``data``, the object array, is built on first use, and
    ``shape``, ``size``, ``flat``, ``is_concrete`` and ``to_numpy`` read the numbers
    directly. The elements are the same either way: ``tolist`` gives plain Python numbers.
    """

    __slots__ = ("_array",)

    def __init__(self, elem_type: int, array: np.ndarray):
        self.elem_type = elem_type
        # a read-only array is never written (payload views, parsed tensors); a caller's
        # writable one is copied, as the object array would be
        self._array = array if not array.flags.writeable else array.copy()

    def __getattr__(self, name: str) -> Any:
        if name != "data":  # only the ``data`` slot is left unset
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        array = self._array
        data = np.empty(array.size, dtype=object)
        data[:] = array.reshape(-1).tolist()
        data = data.reshape(array.shape)
        self.data = data
        return data

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def size(self) -> int:
        return int(self._array.size)

    def flat(self) -> list[Any]:
        return self._array.reshape(-1).tolist()

    def integers(self) -> list[Any] | None:
        array = self._array
        if array.ndim > 1 or (array.dtype.kind not in "iu" and array.size):
            return None  # (bools and floats: no integers)
        return array.reshape(-1).tolist()

    def is_concrete(self) -> bool:
        return True

    def to_numpy(self) -> np.ndarray:
        return np.array(self._array, dtype=np_dtype(self.elem_type))


def _flatten_nested(values: Any) -> tuple[list[Any], tuple[int, ...]]:
    """Row-major elements and shape of a nested list of scalars."""
    if isinstance(values, (list, tuple)):
        if not values:
            return [], (0,)
        parts = [_flatten_nested(v) for v in values]
        shape = parts[0][1]
        if any(p[1] != shape for p in parts):
            raise ShapeError("a ragged nested list cannot form a tensor")
        return [x for p in parts for x in p[0]], (len(parts), *shape)
    return [values], ()
