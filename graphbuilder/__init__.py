"""graphbuilder layer (see DESIGN.md)."""

if __name__ != "onnxforge.graphbuilder":  # the folder imported under its bare name
    raise ImportError(
        f"the layer folder graphbuilder/ was imported as {__name__!r}: import onnxforge.graphbuilder "
        "instead, after `pip install -e .` at the repository root"
    )
