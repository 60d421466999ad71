"""CPU backend (Cython kernels). Kernels are added as ``.pyx`` files beside this one."""

if __name__ != "onnxforge.kernels_cy":  # the folder imported under its bare name
    raise ImportError(
        f"the layer folder kernels_cy/ was imported as {__name__!r}: import onnxforge.kernels_cy "
        "instead, after `pip install -e .` at the repository root"
    )

from onnxforge.kernels_cy.runtime.decoder_fn import install as _install_decoder_runner  # noqa: E402

_install_decoder_runner()
