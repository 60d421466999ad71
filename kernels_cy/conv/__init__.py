"""Convolution family: ONNX Conv and ConvTranspose (:mod:`.kernels`) over the compiled
im2col, col2im and depthwise loops of ``_conv``."""
