"""Wire layer: the extended ONNX schema, static verification, codecs and external data."""
