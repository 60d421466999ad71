"""Checked sizes and bit layouts of byte-encodable struct types.

Implements the formulas of the values specification ("Byte-encoding rules and
validation", rules S1-S5 of RULES.md) in bits, with checked unsigned 64-bit
arithmetic: a result above ``2**64 - 1`` raises :class:`SizeError` (rule S2),
it never wraps::

    size(tensor(T, dims))      = product(dims) * bits(T)
    size(Array(T, n))          = n * size(T)
    size(BitPacking(c..., n))  = n * sum(c.bit_width)
    size(Field(constant))      = 0
    size(Structure(f...))      = sum(size(f))
    size(type_ref=id)          = size(resolve(id))

Fields are consecutive in declaration order without implicit padding; arrays
and bit packings are tight, so a field may start at any bit offset
(``{INT4[32], FLOAT}`` is 128 + 32 = 160 bits = 20 bytes). Bits run
least-significant first and multi-byte values are little-endian.

How the wire is read here:

* A scalar is a ``tensor_type`` whose shape has rank 0. ``array(INT4,
  dimension=128)`` is ``Array{element_type: tensor(INT4, []), dimension: 128}``.
* An Array element may also be a tensor with concrete dims: each element is then
  the whole tensor, so ``Array(tensor(T, [a, b]), n)`` holds ``n * a * b``
  values of T and yields one leaf of dims ``(n, a, b)``.
* A tensor without a shape, or with a symbolic / unknown dim, is not fixed-size
  (S1); so are STRING, sparse tensors, sequences, maps, optionals, opaque types
  and categories. UNDEFINED or unknown element types, fields with neither a type
  nor a constant, and malformed arrays and bit packings raise their structural
  rule (T2-T5); references raise C1/C2/C3/C7 when they cannot be resolved.
* A bit packing with components ``c0..ck`` and dimension ``n`` stores ``n``
  items of ``sum(width)`` bits each; inside an item the components follow in
  declaration order. Each component is one leaf of ``n`` values whose stride is
  the item width.

Leaves (:class:`LeafLayout`) are listed in declaration order and named by
dotted path, exactly the decoder inputs of DESIGN.md: nested structures and
references are flattened, a bit packing gives one leaf per component, and
constants are leaves of kind ``"constant"`` that occupy no bits. An array of
tensors, arrays or bit packings prepends its dimension to the element's dims
(the values stay contiguous); an array of *structures* adds a ``repeat`` axis
``(count, stride_bits)`` instead, since the element's leaves interleave. Either
way a decoder sees ``[R, *shape]``. A root that is itself an array of tensors
has the leaf path ``""``.

A declaration reached through ``type_ref`` is laid out once per
:class:`LayoutCache`; errors inside it are reported with the path
``struct_types(type_id=N)...`` of that declaration.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Iterator
from dataclasses import dataclass, replace
from typing import NoReturn

from onnx import TensorProto

from onnxforge.proto_ext.errors import VerificationError, Violation
from onnxforge.proto_ext.catalogue import Catalogue
from onnxforge.proto_ext.types import BITS, ELEM_TYPES, Constant, StructType, TensorType, Type, type_name

__all__ = [
    "UINT64_MAX",
    "SizeError",
    "LeafLayout",
    "RecordLayout",
    "LayoutCache",
    "struct_bits",
    "element_bytes",
    "record_layout",
    "record_count",
    "leaf_paths",
    "leaf_count",
    "declaration_path",
    "field_path",
]

UINT64_MAX = (1 << 64) - 1

_UNSIGNED_BY_WIDTH = ((8, TensorProto.UINT8), (16, TensorProto.UINT16),
                      (32, TensorProto.UINT32), (64, TensorProto.UINT64))


class SizeError(VerificationError):
    """A struct type has no valid byte layout; ``rule`` is the broken rule ID of RULES.md
    (S1, S2, S4, S5; C1, C2, C3, C7 or T2-T5 for defects found on the way)."""

    def __init__(self, rule: str, path: str, message: str):
        super().__init__(Violation(rule, path, message))
        self.rule = rule
        self.path = path
        self.detail = message


def _fail(rule: str, path: str, message: str) -> NoReturn:
    raise SizeError(rule, path, message)


def _mul(a: int, b: int, path: str, what: str) -> int:
    result = a * b
    if result > UINT64_MAX:
        _fail("S2", path, f"{what}: {a} * {b} = {result} overflows unsigned 64-bit arithmetic")
    return result


def _add(a: int, b: int, path: str, what: str) -> int:
    result = a + b
    if result > UINT64_MAX:
        _fail("S2", path, f"{what}: {a} + {b} = {result} overflows unsigned 64-bit arithmetic")
    return result


def declaration_path(type_id: int) -> str:
    """Object path used for catalogue declarations reached through ``type_ref``."""
    return f"struct_types(type_id={type_id})"


def _join(prefix: str, name: str) -> str:
    if not prefix:
        return name
    return f"{prefix}.{name}" if name else prefix


def field_path(path: str, name: str, index: int) -> str:
    """Object path of field ``index`` (named ``name``, if it has a name) of the structure at ``path``."""
    return f"{path}.structure.field[{name!r}]" if name else f"{path}.structure.field[{index}]"


def _type_path(path: str, t: Type) -> str:
    """Path of the content of a TypeProto found at ``path``."""
    if isinstance(t, StructType):
        return f"{path}.struct_type"
    return path


def _describe(t: Type) -> str:
    if isinstance(t, StructType):
        return "a category (struct without kind)" if t.is_category else str(t)
    return f"{type(t).__name__} {t}"


def _unsigned_for(width: int) -> int:
    for limit, code in _UNSIGNED_BY_WIDTH:
        if width <= limit:
            return code
    return TensorProto.UINT64


@dataclass(frozen=True, slots=True)
class LeafLayout:
    """Where one leaf of a record lives.

    ``path`` is the dotted decoder-input name (``quantized.codes.index``).
    ``kind`` is ``"tensor"``, ``"bitfield"`` (one bit-packing component) or
    ``"constant"``. ``bit_offset`` is the first element's offset from the start
    of the record. ``elem_type`` is the TensorProto code of a tensor or constant,
    and for a bitfield the smallest unsigned type holding ``bit_width``.
    ``dims`` is the shape of the leaf without ``repeat`` axes (array dimensions
    of arrays of tensors included). ``bit_width`` is the width of one element
    (one component for bitfields, 0 for constants) and ``stride_bits`` the
    distance between consecutive elements along the last dim (``bit_width`` for
    tensors, the item width of the bit packing for bitfields, 0 for constants).
    ``repeat`` lists ``(count, stride_bits)`` axes added by arrays of
    structures, outermost first. ``component`` is the index of a bitfield in its
    packing and ``components`` their number.
    """

    path: str
    kind: str
    bit_offset: int
    elem_type: int
    dims: tuple[int, ...]
    bit_width: int
    stride_bits: int
    repeat: tuple[tuple[int, int], ...] = ()
    constant: Constant | None = None
    component: int | None = None
    components: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-record shape: repeat counts followed by ``dims`` (a decoder sees ``[R, *shape]``)."""
        return tuple(n for n, _ in self.repeat) + self.dims

    @property
    def strides_bits(self) -> tuple[int, ...]:
        """Bit strides of :attr:`shape`; element ``idx`` sits at ``bit_offset + sum(i * s)``."""
        inner: list[int] = []
        step = self.stride_bits
        for d in reversed(self.dims):
            inner.append(step)
            step *= d
        return tuple(s for _, s in self.repeat) + tuple(reversed(inner))

    @property
    def count(self) -> int:
        """Elements of this leaf in one record (stored elements for a constant)."""
        return math.prod(self.shape)

    @property
    def is_physical(self) -> bool:
        """True for leaves that occupy bits of the record (tensors and bitfields)."""
        return self.kind != "constant"


@dataclass(frozen=True, slots=True)
class RecordLayout:
    """Layout of one byte-encoded record: ``bits`` in total, ``leaves`` in declaration order."""

    bits: int
    leaves: tuple[LeafLayout, ...]

    @property
    def bytes(self) -> int:
        """``element_bytes``: the record size in bytes (``bits / 8``)."""
        return self.bits // 8

    @property
    def element_bytes(self) -> int:
        return self.bits // 8

    @property
    def paths(self) -> list[str]:
        """Leaf paths in declaration order (the decoder's input names)."""
        return [leaf.path for leaf in self.leaves]

    def leaf(self, path: str) -> LeafLayout:
        """The leaf named ``path``; KeyError if there is none."""
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(path)


def _struct_refs(st: StructType, path: str) -> Iterator[tuple[int, str]]:
    """References laid out inside ``st``: through structure fields and array elements
    (inline declarations included), not through sequences, maps or optionals."""
    if st.kind == "type_ref":
        yield (st.type_ref or 0), path
    elif st.kind == "structure":
        for i, f in enumerate(st.fields):
            if isinstance(f.type, StructType) and f.constant is None:
                yield from _struct_refs(f.type, f"{field_path(path, f.name, i)}.type.struct_type")
    elif st.kind == "array" and st.array is not None and isinstance(st.array.element_type, StructType):
        yield from _struct_refs(st.array.element_type, f"{path}.array.element_type.struct_type")


class LayoutCache:
    """Sizes and layouts of struct types over one catalogue, memoized per type_id.

    Use one cache per model (the verifier does); the module functions
    :func:`struct_bits`, :func:`record_layout`... build a fresh one per call.
    Reference chains are followed iteratively, so long chains of declarations
    never exhaust the Python stack.
    """

    __slots__ = ("catalogue", "_dups", "_bits", "_leaves", "_counts", "_leaf_names")

    def __init__(self, catalogue: Catalogue):
        self.catalogue = catalogue
        counts = Counter(e.type_id for e in catalogue.entries if e.type_id)
        self._dups = frozenset(i for i, c in counts.items() if c > 1)
        self._bits: dict[int, int | SizeError] = {}
        self._leaves: dict[int, tuple[LeafLayout, ...]] = {}
        self._counts: dict[int, int] = {}
        self._leaf_names: dict[int, tuple[str, ...]] = {}

    # -- resolution -----------------------------------------------------------------------

    def _declaration(self, type_id: int, path: str) -> StructType:
        """The declaration of ``type_id`` referenced at ``path`` (C1/C2/C3 on failure)."""
        decl = self.catalogue.get(type_id) if type_id else None
        if decl is None:
            _fail("C3", f"{path}.type_ref",
                  f"type_ref={type_id}: no declaration with this type_id in model.struct_types")
        if type_id in self._dups:
            _fail("C2", f"{path}.type_ref",
                  f"type_ref={type_id}: several model.struct_types entries declare this type_id")
        if not decl.is_declaration:
            _fail("C1", f"{path}.type_ref",
                  f"type_ref={type_id}: the catalogue entry is not a declaration ({decl})")
        return decl

    def _post_order(self, type_id: int, path: str, done: Container[int]) -> list[int]:
        """Ids reachable from ``type_id`` through layout references, children first (C7 on a cycle)."""
        self._declaration(type_id, path)
        order: list[int] = []
        stack = [(type_id, _struct_refs(self.catalogue.get(type_id), declaration_path(type_id)))]
        active = [type_id]
        finished: set[int] = set()
        while stack:
            current, children = stack[-1]
            for child, child_path in children:
                if child in finished or child in done:
                    continue
                if child in active:
                    cycle = active[active.index(child):] + [child]
                    _fail("C7", f"{child_path}.type_ref",
                          "reference cycle " + " -> ".join(str(i) for i in cycle))
                self._declaration(child, child_path)
                stack.append((child, _struct_refs(self.catalogue.get(child), declaration_path(child))))
                active.append(child)
                break
            else:
                stack.pop()
                active.pop()
                finished.add(current)
                order.append(current)
        return order

    def declaration_bits(self, type_id: int, path: str = "struct_type") -> int:
        """Checked size in bits of the declaration ``type_id`` referenced at ``path``."""
        if type_id not in self._bits:
            for tid in self._post_order(type_id, path, self._bits):
                try:
                    self._bits[tid] = self._type_bits(self.catalogue.get(tid), declaration_path(tid))
                except SizeError as exc:
                    self._bits[tid] = exc
        result = self._bits[type_id]
        if isinstance(result, SizeError):
            raise result
        return result

    # -- sizes ----------------------------------------------------------------------------

    def _tensor_bits(self, t: TensorType, path: str) -> int:
        if t.elem_type not in ELEM_TYPES:
            _fail("T3", f"{path}.tensor_type.elem_type",
                  f"elem_type {type_name(t.elem_type)} is not a defined element type")
        width = BITS.get(t.elem_type)
        if width is None:
            _fail("S1", f"{path}.tensor_type.elem_type",
                  f"{type_name(t.elem_type)} has no fixed bit width; it cannot be byte-encoded")
        if t.shape is None:
            _fail("S1", f"{path}.tensor_type.shape",
                  "a byte-encoded tensor needs a shape (use [] for a scalar)")
        count = 1
        for i, d in enumerate(t.shape):
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                _fail("S1", f"{path}.tensor_type.shape.dim[{i}]",
                      f"dimension {d!r} is not a concrete dim_value >= 0")
            count = _mul(count, d, path, "element count")
        return _mul(count, width, path, "tensor size in bits")

    def _type_bits(self, t: Type, path: str) -> int:
        """Size in bits of a type record found at ``path`` (follows references via the memo)."""
        if isinstance(t, TensorType):
            return self._tensor_bits(t, path)
        if t is None:
            _fail("T3", path, "the type has no case set")
        if not isinstance(t, StructType):
            _fail("S1", path, f"{_describe(t)} is not fixed-size inline data")
        if t.kind == "type_ref":
            return self.declaration_bits(t.type_ref or 0, path)
        if t.kind == "structure":
            total = 0
            for i, f in enumerate(t.fields):
                fpath = field_path(path, f.name, i)
                has_type = f.type is not None or f.has_type
                if has_type and f.constant is not None:
                    _fail("T2", fpath, "the field sets both type and constant")
                if f.constant is not None:
                    continue
                if not has_type:
                    _fail("T2", fpath, "the field sets neither type nor constant")
                tpath = f"{fpath}.type"
                total = _add(total, self._type_bits(f.type, _type_path(tpath, f.type)), path,
                             "structure size in bits")
            return total
        if t.kind == "array":
            a = t.array
            if a is None or a.element_type is None:
                _fail("T4", f"{path}.array.element_type", "the array has no element_type")
            if a.dimension < 1:
                _fail("T4", f"{path}.array.dimension", f"dimension {a.dimension} is not >= 1")
            epath = f"{path}.array.element_type"
            return _mul(a.dimension, self._type_bits(a.element_type, _type_path(epath, a.element_type)),
                        path, "array size in bits")
        if t.kind == "bit_packing":
            b = t.bit_packing
            if b is None or not b.components:
                _fail("T5", f"{path}.bit_packing", "the bit packing has no component")
            width = 0
            for i, c in enumerate(b.components):
                if not 1 <= c.bit_width <= 64:
                    _fail("T5", f"{path}.bit_packing.component[{i}]",
                          f"bit_width {c.bit_width} is not in 1..64")
                width = _add(width, c.bit_width, path, "bit-packing item width")
            if b.dimension < 1:
                _fail("T5", f"{path}.bit_packing.dimension", f"dimension {b.dimension} is not >= 1")
            return _mul(b.dimension, width, path, "bit-packing size in bits")
        if t.kind is None:
            _fail("S1", path, "a category (struct without kind) has no byte layout")
        _fail("S1", path, f"unknown struct kind {t.kind!r}")

    def struct_bits(self, st: StructType, path: str = "struct_type") -> int:
        """Checked size in bits of ``st`` (a reference or declaration), found at ``path``."""
        return self._type_bits(st, path)

    def element_bytes(self, st: StructType, path: str = "struct_type") -> int:
        """Size in bytes of one record of the encoding root ``st`` (S4: > 0 and whole bytes)."""
        if st.kind is None:
            _fail("P2", path, "a category (struct without kind) is never a payload layout")
        bits = self._type_bits(st, path)
        if bits == 0:
            _fail("S4", path, "the root has size 0 (only constants or empty content); it cannot be "
                              "an encoding root")
        if bits % 8:
            _fail("S4", path, f"the root has {bits} bits, not a whole number of bytes "
                              f"({bits} % 8 = {bits % 8}); add explicit padding")
        return bits // 8

    # -- leaves ---------------------------------------------------------------------------

    def _declaration_leaves(self, type_id: int, path: str) -> tuple[LeafLayout, ...]:
        self.declaration_bits(type_id, path)  # validates the whole closure first
        if type_id not in self._leaves:
            for tid in self._post_order(type_id, path, self._leaves):
                out: list[LeafLayout] = []
                self._emit(self.catalogue.get(tid), "", 0, declaration_path(tid), out)
                self._leaves[tid] = tuple(out)
        return self._leaves[type_id]

    def _is_structure(self, t: Type) -> bool:
        if not isinstance(t, StructType):
            return False
        if t.kind == "type_ref":
            decl = self.catalogue.get(t.type_ref or 0)
            return decl is not None and decl.kind == "structure"
        return t.kind == "structure"

    def _emit(self, t: Type, prefix: str, offset: int, path: str, out: list[LeafLayout]) -> None:
        """Append the leaves of the (already size-checked) type ``t`` starting at ``offset``."""
        if isinstance(t, TensorType):
            width = BITS[t.elem_type]
            out.append(LeafLayout(prefix, "tensor", offset, t.elem_type, tuple(t.shape), width, width))
            return
        if not isinstance(t, StructType):  # excluded by the size check that runs first
            return
        if t.kind == "type_ref":
            for leaf in self._declaration_leaves(t.type_ref, path):
                out.append(replace(leaf, path=_join(prefix, leaf.path), bit_offset=offset + leaf.bit_offset))
        elif t.kind == "structure":
            at = offset
            for i, f in enumerate(t.fields):
                fpath = field_path(path, f.name, i)
                name = _join(prefix, f.name)
                if f.constant is not None:
                    c = f.constant
                    out.append(LeafLayout(name, "constant", at, c.data_type, tuple(c.dims), 0, 0,
                                          constant=c))
                    continue
                tpath = _type_path(f"{fpath}.type", f.type)
                self._emit(f.type, name, at, tpath, out)
                at += self._type_bits(f.type, tpath)
        elif t.kind == "array":
            n, elem = t.array.dimension, t.array.element_type
            epath = _type_path(f"{path}.array.element_type", elem)
            stride = self._type_bits(elem, epath)
            inner: list[LeafLayout] = []
            self._emit(elem, prefix, offset, epath, inner)
            structured = self._is_structure(elem)
            for leaf in inner:
                if leaf.kind == "constant":
                    out.append(leaf)
                elif structured or leaf.repeat:
                    out.append(replace(leaf, repeat=((n, stride),) + leaf.repeat))
                else:
                    out.append(replace(leaf, dims=(n,) + leaf.dims))
        elif t.kind == "bit_packing":
            b = t.bit_packing
            item = sum(c.bit_width for c in b.components)
            at = offset
            for j, comp in enumerate(b.components):
                out.append(LeafLayout(_join(prefix, comp.name), "bitfield", at, _unsigned_for(comp.bit_width),
                                      (b.dimension,), comp.bit_width, item, component=j,
                                      components=len(b.components)))
                at += comp.bit_width

    def record_layout(self, st: StructType, path: str = "struct_type") -> RecordLayout:
        """Size and leaves of one record of the encoding root ``st`` (raises :class:`SizeError`)."""
        nbytes = self.element_bytes(st, path)
        leaves: list[LeafLayout] = []
        self._emit(st, "", 0, path, leaves)
        return RecordLayout(nbytes * 8, tuple(leaves))

    # -- decoder signature (no byte-encodability required) ---------------------------------

    @staticmethod
    def _is_nested(t: Type) -> bool:
        return isinstance(t, StructType) and t.kind is not None

    def _count(self, t: Type, path: str) -> int:
        if not self._is_nested(t):
            return 1
        if t.kind == "type_ref":
            tid = t.type_ref or 0
            if tid not in self._counts:
                for cid in self._post_order(tid, path, self._counts):
                    self._counts[cid] = self._count(self.catalogue.get(cid), declaration_path(cid))
            return self._counts[tid]
        if t.kind == "structure":
            counts = (1 if f.constant is not None
                      else self._count(f.type, f"{field_path(path, f.name, i)}.type.struct_type")
                      for i, f in enumerate(t.fields))
            return sum(counts)
        if t.kind == "array":
            elem = t.array.element_type if t.array is not None else None
            return self._count(elem, f"{path}.array.element_type.struct_type")
        if t.kind == "bit_packing":
            return len(t.bit_packing.components) if t.bit_packing is not None else 0
        return 1

    def _names(self, t: Type, prefix: str, path: str, out: list[str]) -> None:
        if not self._is_nested(t):
            out.append(prefix)
        elif t.kind == "type_ref":
            tid = t.type_ref or 0
            if tid not in self._leaf_names:
                for cid in self._post_order(tid, path, self._leaf_names):
                    names: list[str] = []
                    self._names(self.catalogue.get(cid), "", declaration_path(cid), names)
                    self._leaf_names[cid] = tuple(names)
            out.extend(_join(prefix, n) for n in self._leaf_names[tid])
        elif t.kind == "structure":
            for i, f in enumerate(t.fields):
                name = _join(prefix, f.name)
                if f.constant is not None:
                    out.append(name)
                else:
                    self._names(f.type, name, f"{field_path(path, f.name, i)}.type.struct_type", out)
        elif t.kind == "array":
            elem = t.array.element_type if t.array is not None else None
            self._names(elem, prefix, f"{path}.array.element_type.struct_type", out)
        elif t.kind == "bit_packing" and t.bit_packing is not None:
            out.extend(_join(prefix, c.name) for c in t.bit_packing.components)

    def leaf_count(self, st: StructType, path: str = "struct_type") -> int:
        """Number of decoder inputs of ``st`` (see :meth:`leaf_paths`), without listing them."""
        return self._count(st, path)

    def leaf_paths(self, st: StructType, path: str = "struct_type") -> list[str]:
        """Decoder input names of ``st`` in declaration order (DESIGN.md "Decoder functions").

        Unlike :meth:`record_layout` this needs no fixed size: a field whose type is
        not a struct declaration or reference (a sequence, a category...) is one leaf.
        Raises :class:`SizeError` (C1/C2/C3/C7) when a reference cannot be resolved."""
        out: list[str] = []
        self._names(st, "", path, out)
        return out


def struct_bits(st: StructType, catalogue: Catalogue, path: str = "struct_type") -> int:
    """Checked size in bits of the struct type ``st`` (see :class:`LayoutCache`)."""
    return LayoutCache(catalogue).struct_bits(st, path)


def element_bytes(st: StructType, catalogue: Catalogue, path: str = "struct_type") -> int:
    """Bytes of one record of the encoding root ``st``; S4 when 0 or not whole bytes."""
    return LayoutCache(catalogue).element_bytes(st, path)


def record_layout(st: StructType, catalogue: Catalogue, path: str = "struct_type") -> RecordLayout:
    """Size and flattened leaves of one record of the encoding root ``st``.

    Raises :class:`SizeError` (a :class:`VerificationError`) naming the rule:
    S1 non-fixed-size or unsupported content, S2 overflow, S4 root size 0 or
    not a multiple of 8, C3 unresolved reference, C7 reference cycle (and C1,
    C2, T2-T5 for malformed declarations met on the way)."""
    return LayoutCache(catalogue).record_layout(st, path)


def record_count(payload_bytes: int, element_bytes: int, path: str = "payload") -> int:
    """Records in a payload of ``payload_bytes`` (S5): 0 bytes is 0 records, a partial
    record fails; ``element_bytes`` must be positive (S4)."""
    if isinstance(element_bytes, bool) or not isinstance(element_bytes, int) or element_bytes <= 0:
        _fail("S4", path, f"element size {element_bytes!r} bytes is not a positive integer")
    if isinstance(payload_bytes, bool) or not isinstance(payload_bytes, int) or payload_bytes < 0:
        _fail("S5", path, f"payload size {payload_bytes!r} bytes is not a non-negative integer")
    records, rest = divmod(payload_bytes, element_bytes)
    if rest:
        _fail("S5", path, f"{payload_bytes} payload bytes are {records} records of {element_bytes} bytes "
                          f"plus a partial record of {rest} bytes")
    return records


def leaf_paths(st: StructType, catalogue: Catalogue, path: str = "struct_type") -> list[str]:
    """Decoder input names of ``st`` in declaration order (see :meth:`LayoutCache.leaf_paths`)."""
    return LayoutCache(catalogue).leaf_paths(st, path)


def leaf_count(st: StructType, catalogue: Catalogue, path: str = "struct_type") -> int:
    """Number of decoder inputs of ``st``."""
    return LayoutCache(catalogue).leaf_count(st, path)
