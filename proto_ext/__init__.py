"""Wire layer: the extended ONNX schema, static verification, codecs and external data."""

if __name__ != "onnxforge.proto_ext":  # the folder imported under its bare name
    raise ImportError(
        f"the layer folder proto_ext/ was imported as {__name__!r}: import onnxforge.proto_ext "
        "instead, after `pip install -e .` at the repository root"
    )
