"""Resampling family: ONNX ``Resize`` / ``Upsample`` (:mod:`.kernels`, over the per-axis tap
tables of :mod:`.taps` and the compiled float32 plane resize ``_resize``) and
``GridSample`` (:mod:`.grid`)."""
