"""Payload codecs: low-bit packing, bit fields and the affine (quantized tensor) codec."""
