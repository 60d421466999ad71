"""``python -m onnxforge``: the command line (see :mod:`onnxforge.cli`)."""
from __future__ import annotations

import sys

from onnxforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
