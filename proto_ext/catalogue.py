"""The model's struct-type catalogue: resolution of ``type_ref`` by ``type_id`` alone."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from onnxforge.proto_ext.types import StructType

__all__ = ["Catalogue"]


class Catalogue:
    """Lookup of ``ModelProto.struct_types`` by type_id (rule C8: order never matters).

    Entries without a type_id, or whose id repeats, stay visible through
    ``entries`` (the verifier reports them) but only the first declaration of an
    id resolves.
    """

    __slots__ = ("entries", "_by_id")

    def __init__(self, entries: Iterable[StructType]):
        self.entries: list[StructType] = list(entries)
        self._by_id: dict[int, StructType] = {}
        for e in self.entries:
            if e.type_id:
                self._by_id.setdefault(e.type_id, e)

    def __contains__(self, type_id: int) -> bool:
        return type_id in self._by_id

    def get(self, type_id: int) -> StructType | None:
        return self._by_id.get(type_id)

    def resolve(self, st: StructType) -> StructType | None:
        """Follow references until a non-reference; None if unresolved or cyclic."""
        seen: set[int] = set()
        while st.kind == "type_ref":
            if st.type_ref in seen or st.type_ref not in self._by_id:
                return None
            seen.add(st.type_ref)
            st = self._by_id[st.type_ref]
        return st

    def ids(self) -> Iterator[int]:
        return iter(self._by_id)

