"""Sphinx configuration of the onnxforge documentation.

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs /tmp/onnxforge-docs

Nothing here needs the network or a graphviz binary: the diagrams are text and a
hand-written SVG, and the command-line page is generated from the argparse
parsers at build time (``_ext/onnxforge_cli.py``).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ext"))

import onnxforge  # the installed package: the docs document what users import

project = "onnxforge"
author = "the onnxforge authors"
copyright = "the onnxforge authors"
release = onnxforge.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "onnxforge_cli",
]

root_doc = "index"
exclude_patterns = ["_build", "examples", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
html_static_path = ["_static"]
html_theme = "alabaster"
html_title = f"onnxforge {release}"
html_show_sourcelink = False

# autodoc: the public names, in source order, with the signature from the code
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True

# the docstrings are reStructuredText with the occasional Google-style section
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# cross-references to names outside the documented set stay plain text
nitpicky = False
