"""Rule P7: every external reference of the model obeys P4 and P5.

Encoded values are checked with their payload rules (``catalogue_rules``); this
check covers every other tensor whose payload lives outside the model file: dense
initializers, sparse initializers (values and indices), and the tensor attributes
of nodes (``Constant``'s ``value`` and ``sparse_value`` among them), in the main
graph, every subgraph and every local function.

The checks are the loader's own (:mod:`onnxforge.proto_ext.external`), run without
reading a payload byte:

* P4: the ``external_data`` entries parse (known keys, each once, a non-empty
  ``location``, base-10 non-negative ``offset`` and ``length``);
* P5: ``location`` is relative, has no ``..`` component and, when the model
  directory is known, resolves (symlinks included) to a regular file inside it
  that holds ``offset + length`` bytes.

A violation is reported under the sub-rule that fails (P4 or P5), at the path of the
reference, e.g. ``[P5] graph.initializer['w'].external_data: location '/etc/passwd'
is absolute; ...``.
"""
from __future__ import annotations

from collections.abc import Iterator

from onnxforge.proto_ext.errors import ExternalDataError
from onnxforge.proto_ext.external import check_extent, check_location, parse_external_entries
from onnxforge.proto_ext.verify.core import Report, iter_graphs, register
from onnxforge.proto_ext.view import ExternalSpec, ModelView

__all__ = ["check_external_refs", "external_refs"]


def external_refs(view: ModelView) -> Iterator[ExternalSpec]:
    """Every non-encoded external reference of the model: graphs (main graph and subgraphs,
    those of function bodies included), then the bodies of local functions."""
    for g in iter_graphs(view):
        yield from g.external_refs
    for f in view.functions:
        yield from f.external_refs


def _check_one(path: str, entries: tuple[tuple[str, str], ...], model_dir: str | None) -> None:
    """Raise :class:`ExternalDataError` (rule P4 or P5) unless the reference is safe."""
    ref = parse_external_entries(entries, path=path)
    if model_dir is None:
        check_location(ref.location, path=path)
    else:
        check_extent(model_dir, ref, path=path)


@register("P7")
def check_external_refs(view: ModelView, report: Report) -> None:
    """P7: P4 and P5 for dense, sparse and attribute tensors stored externally."""
    for path, entries in external_refs(view):
        try:
            _check_one(path, entries, view.model_dir)
        except ExternalDataError as exc:
            report.add(exc.rule or "P5", exc.path or path, exc.detail)
