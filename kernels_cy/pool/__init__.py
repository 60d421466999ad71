"""Pooling family: ONNX MaxPool, AveragePool, LpPool and their global forms
(:mod:`.kernels`), over the window geometry of :mod:`.geometry`, the compiled float32
windows of ``_pool`` and the any-dtype numpy windows of :mod:`.windows`."""
