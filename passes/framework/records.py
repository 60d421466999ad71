"""IR records that passes build: attributes from Python values, and fresh tensor records
around an existing payload.

::

    make_attrs({"perm": [1, 0], "to": TensorProto.INT8, "axis": None}, RewriteError, "Transpose")
    # [Attr("perm", INTS, [1, 0]), Attr("to", INT, 3)]   (None leaves the attribute out)
    copy_tensor(t)   # a new record sharing t's payload (no bytes copied)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, overload


from onnxforge.proto_ext.errors import OnnxforgeError
from onnxforge.graphbuilder.builder.graph_builder import BuildError, attr_from_value
from onnxforge.graphbuilder.ir.core import Attr
from onnxforge.graphbuilder.ir.tensors import EncodedTensor, Tensor

__all__ = ["copy_tensor", "make_attrs"]


def make_attrs(values: Mapping[str, Any], error: type[OnnxforgeError], where: str) -> list[Attr]:
    """Attributes from ``{name: value}``, each typed by its value: an int, float, str /
    bytes, numpy array or Tensor, a list of ints or of numbers, or an :class:`Attr` (copied
    under the name). A None value leaves the attribute out; any other value raises
    ``error`` naming ``where`` (the node being built)."""
    out: list[Attr] = []
    for name, value in values.items():
        if value is None:
            continue
        a = _attr(name, value)
        if a is None:
            raise error(f"{where}: attribute {name!r} cannot hold a value of type "
                        f"{type(value).__name__} ({value!r:.60})")
        out.append(a)
    return out


def _attr(name: str, value: Any) -> Attr | None:
    if isinstance(value, Attr):
        return Attr(name, value.type, value.value, value.doc_string, value.ref_attr_name, value.extra)
    try:
        return attr_from_value(name, value)
    except BuildError:
        return None


@overload
def copy_tensor(t: Tensor) -> Tensor: ...
@overload
def copy_tensor(t: EncodedTensor) -> EncodedTensor: ...
@overload
def copy_tensor(t: Tensor | EncodedTensor) -> Tensor | EncodedTensor: ...
def copy_tensor(t: Tensor | EncodedTensor) -> Tensor | EncodedTensor:
    """A new record around ``t``'s payload. Registering an initializer renames its record,
    so a record that may be shared (a copied function body, a Constant attribute) is
    copied before it is registered; the payload itself is not copied."""
    if isinstance(t, EncodedTensor):
        return EncodedTensor(replace(t.header), t.external)
    out = Tensor(t.dtype, t.dims, name=t.name, raw=t.raw, array=t.array, proto=t.proto,
                 external=t.external, doc_string=t.doc_string, metadata=dict(t.metadata),
                 extra=t.extra)
    out._decoded = t._decoded  # the same serialized payload, already parsed (read-only)
    return out
