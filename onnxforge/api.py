"""The public facade's functions (re-exported by ``onnxforge``)."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxforge.errors import CodecError, OnnxforgeError, VerificationError, Violation

if TYPE_CHECKING:
    from onnxforge.graphbuilder.ir.core import Model
    from onnxforge.passes.framework.pass_manager import PassRecord

__all__ = ["decode_value", "verify", "check", "load", "load_verified", "save", "to_standard_onnx",
           "infer_shapes", "optimize", "Optimization"]

def _is_ir(model: Any) -> bool:
    from onnxforge.graphbuilder.ir.core import Model

    return isinstance(model, Model)


def load(source: Any, *, model_dir: str | None = None):
    """An IR :class:`~onnxforge.graphbuilder.ir.core.Model` from a path, bytes or ModelProto
    (an IR model is returned as it is).

    Payloads are memory-mapped, never copied; external data is resolved against the
    model's folder and unsafe locations raise :class:`onnxforge.ExternalDataError`.
    A path that is missing, a directory or unreadable raises
    :class:`onnxforge.ModelFileError`.
    """
    if _is_ir(source):
        return source
    return _serde_load(source, model_dir, verify=False)


def _serde_load(source: Any, model_dir: str | None, *, verify: bool):
    """``serde.load``, with a model file that cannot be read reported as ModelFileError."""
    from onnxforge.graphbuilder import serde
    from onnxforge.proto_ext.schema import model_file_error

    try:
        return serde.load(source, model_dir=model_dir, verify=verify)
    except OSError as exc:
        # only the model file itself: external data raises ExternalDataError
        if isinstance(exc, OnnxforgeError) or not isinstance(source, (str, os.PathLike)) \
                or exc.filename != os.fspath(source):
            raise
        raise model_file_error(os.fspath(source), exc) from None


def save(model: Any, path: str | os.PathLike, *, external_data: str | None = None,
         size_threshold: int = 1024) -> None:
    """Write ``model`` (IR or ModelProto) as extended ONNX, losslessly.

    Payloads that were external are written to ``<file name>.data`` beside ``path``
    (``out.onnx`` -> ``out.onnx.data``), so models saved into one folder never share
    a data file; ``external_data`` names another file and makes every payload of at
    least ``size_threshold`` bytes external. The files are written to temporary
    names and renamed, so a failed save leaves the previous files intact."""
    from onnxforge.graphbuilder import serde

    serde.save(load(model), path, external_data=external_data, size_threshold=size_threshold)


def _input_violations(model: Any, model_dir: str | None) -> list[Violation]:
    """Every static-rule violation of an input model (:func:`source_violations`)."""
    from onnxforge.proto_ext.verify.source import source_violations

    return source_violations(model, model_dir)


def load_verified(source: Any, *, model_dir: str | None = None):
    """:func:`load`, after checking that ``source`` breaks no static rule.

    Raises :class:`onnxforge.VerificationError` listing every violation (the model
    is not loaded then); an IR model is checked and returned as it is. A path, bytes
    or a ModelProto is mapped, scanned and parsed once: the rules (external
    references, rule P7, among them) run on that parse before any payload is mapped
    and any IR is built, which is then decoded from the same message
    (``serde.load(verify=True)``).
    """
    folder = None if model_dir is None else os.fspath(model_dir)
    if _is_ir(source):
        violations = _input_violations(source, folder)
        if violations:
            raise VerificationError(violations)
        return source
    return _serde_load(source, folder, verify=True)


def to_standard_onnx(model: Any, *, target_opset: int | None = None, keep_domains: Any = (),
                     lower: bool = True):
    """A standard ``onnx.ModelProto``; :class:`onnxforge.ExportError` lists what cannot be lowered.

    ``model`` is verified first: one that breaks a static rule raises
    :class:`onnxforge.VerificationError` and is not exported."""
    from onnxforge.passes.export import to_standard_onnx as _export

    violations = _input_violations(model, None)
    if violations:
        raise VerificationError(violations)
    return _export(model, target_opset=target_opset, keep_domains=keep_domains, lower=lower)


class Optimization:
    """:func:`optimize` in its steps, for a caller that reports on each (``onnxforge
    optimize`` times the load and shows a bar over the passes)::

        run = Optimization(["cse", "dce"], progress=print)  # pass names checked: nothing read yet
        model = run.load("model.onnx")                      # load_verified: one map, scan, parse
        run(model)                                          # the passes, in place
        run.records, run.report()                           # a PassRecord per pass run; their table

    ``passes``, ``debug`` and ``opset`` are :func:`optimize`'s; ``progress`` is called
    with each :class:`~onnxforge.passes.framework.pass_manager.PassRecord` as its pass
    ends.
    """

    def __init__(self, passes: Any = None, *, debug: bool = False, opset: int | None = None,
                 progress: Callable[[PassRecord], None] | None = None) -> None:
        from onnxforge.passes.framework.pipeline import pass_manager

        self.manager = pass_manager(passes, debug=debug, opset=opset, progress=progress)

    def load(self, source: Any) -> Model:
        """The verified IR model of ``source`` (:func:`load_verified`)."""
        from onnxforge.passes.framework.pass_manager import collector_paused

        with collector_paused():  # verification builds many small objects too (see the passes')
            return load_verified(source)

    def __call__(self, model: Model) -> Model:
        """Run the passes over the IR ``model`` (rewritten in place) and return it."""
        return self.manager(model).model

    @property
    def records(self) -> list[PassRecord]:
        """One record per pass of the last run, in order."""
        return self.manager.records

    def report(self) -> str:
        """The last run as a text table: pass, round, seconds, nodes before -> after."""
        return self.manager.report()


def optimize(model: Any, passes: Any = None, *, debug: bool = False, opset: int | None = None,
             progress: Callable[[PassRecord], None] | None = None):
    """Run the default pass pipeline (or ``passes``: names or Pass objects) and return the
    IR model; nothing the model declares (struct types, encoded initializers, bindings,
    aliases) is dropped. ``debug`` checks every invariant between passes. ``opset=23``
    lets the pipeline raise an older model's default-domain opset to 23 to fuse
    decomposed attention and RMS norms into ``Attention`` / ``RMSNormalization``.
    ``progress`` is called with each pass's record as it ends.

    Pass names are checked first; then ``model`` is verified (a path, bytes or
    ModelProto on the message it is loaded from, read once): one that breaks a
    static rule raises :class:`onnxforge.VerificationError` and is never rewritten.
    The steps are :class:`Optimization`'s."""
    from onnxforge.passes.framework.pass_manager import collector_paused

    with collector_paused():  # also while the passes are built: a collection then would scan the model
        run = Optimization(passes, debug=debug, opset=opset, progress=progress)
        return run(run.load(model))


def infer_shapes(model: Any, *, strict: bool = False):
    """Run ShapesContext over the whole model; returns the context (types written to the IR)."""
    from onnxforge.graphbuilder.shapes.context import ShapesContext

    m = load(model)
    ctx = ShapesContext(m, strict=strict)
    ctx.infer_graph(m.graph)
    return ctx


def _find_encoded_proto(graph: Any, name: str) -> Any | None:
    for e in graph.encoded_initializer:
        if e.name == name:
            return e
    for n in graph.node:
        for a in n.attribute:
            subs = [a.g] if a.HasField("g") else list(a.graphs)
            for sg in subs:
                found = _find_encoded_proto(sg, name)
                if found is not None:
                    return found
    return None


def _decode_ir(model: Any, name: str) -> np.ndarray | dict[str, np.ndarray]:
    from onnxforge.graphbuilder.ir.tensors import EncodedTensor
    from onnxforge.proto_ext.catalogue import Catalogue
    from onnxforge.proto_ext.codecs.decode import decode_encoded

    for g in model.all_graphs():
        v = g.encoded_initializers.get(name) or g.initializers.get(name)
        if v is None:
            continue
        if isinstance(v.const, EncodedTensor):
            header = v.const.header
            if v.const.external is not None and len(header.raw_data):
                # the loader already mapped the external payload (safely, bounds-checked)
                header = replace(header, external_data=(), data_location=None)
            return decode_encoded(header, Catalogue(model.struct_types), model_dir=model.model_dir,
                                  path=f"{g.path()}.encoded_initializer[{name!r}]")
        return v.const.numpy()
    raise CodecError(f"no initializer named {name!r} in the model")


def decode_value(model: Any, name: str) -> np.ndarray | dict[str, np.ndarray]:
    """The logical value of initializer ``name`` (encoded or dense) as numpy.

    ``model`` is an IR ``Model``, an extended or stock ``ModelProto``, bytes or a
    path. Encoded values are decoded by their layout (affine, or a struct type's
    registered/function decoder); a struct without a logical type gives a dict of
    field arrays; a value without a decoder raises :class:`CodecError`. External
    payloads are read only after the checks of rules P4 and P5, from the model's
    folder (a path's folder, or the IR model's ``model_dir``).
    """
    from onnxforge.proto_ext.catalogue import Catalogue
    from onnxforge.proto_ext.codecs.decode import decode_encoded
    from onnxforge.proto_ext.convert import dense_to_numpy, encoded_from_proto, struct_from_proto
    from onnxforge.proto_ext.schema import read_model

    if _is_ir(model):
        return _decode_ir(model, name)
    message, model_dir = read_model(model)
    enc = _find_encoded_proto(message.graph, name)
    if enc is not None:
        catalogue = Catalogue([struct_from_proto(s) for s in message.struct_types])
        return decode_encoded(encoded_from_proto(enc), catalogue, model_dir=model_dir,
                              path=f"graph.encoded_initializer[{name!r}]")
    for t in message.graph.initializer:
        if t.name == name:
            return dense_to_numpy(t, model_dir, f"graph.initializer[{name!r}]")
    raise CodecError(f"no initializer named {name!r} in the model")


def check(model: Any, model_dir: str | None = None) -> list[Violation]:
    """Every static-rule violation of ``model`` (empty list: valid). A path or bytes is
    checked on its wire view, without copying its large payloads."""
    return _input_violations(model, None if model_dir is None else os.fspath(model_dir))


def verify(model: Any, model_dir: str | None = None) -> None:
    """Raise :class:`onnxforge.VerificationError` if ``model`` breaks a static rule."""
    violations = check(model, model_dir)
    if violations:
        raise VerificationError(violations)
