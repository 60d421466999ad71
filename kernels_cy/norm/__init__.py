"""Normalization family: RMS, simplified and full layer normalization with their
com.microsoft skip variants (:mod:`.kernels`), over the compiled ``_norm`` rows."""
