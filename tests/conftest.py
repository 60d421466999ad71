"""Session-wide fixtures: the real exported tiny Qwen3 decoders.

The decoders are built once into a cache folder and reused by later runs (see
``tests/fixtures/decoders.py``).  The folder is ``$ONNXFORGE_FIXTURE_DIR`` when
that variable is set, else ``<repo>/.fixture-cache/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.fixtures.decoders import build_all, load_io_info, random_decoder_feeds

__all__ = ["decoder_fixture_dir", "load_io_info", "random_decoder_feeds"]

# Property tests explore new examples on every local run; under CI they replay a fixed
# derandomized sequence so that a run's verdict does not depend on chance.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

FIXTURE_DIR_ENV = "ONNXFORGE_FIXTURE_DIR"
REPO_ROOT = Path(__file__).resolve().parent.parent


def decoder_fixture_dir() -> Path:
    """Return the folder where the decoder fixtures are cached."""
    configured = os.environ.get(FIXTURE_DIR_ENV)
    return Path(configured).expanduser().resolve() if configured else REPO_ROOT / ".fixture-cache"


@pytest.fixture(scope="session")
def decoder_models() -> dict[str, Path]:
    """Build (or reuse) all decoder variants.

    Returns ``{"torch20" | "torch23" | "genai_fp32" | "genai_int4": model.onnx path,
    "hf": Hugging Face model folder}``; each model's ``io.json`` sits next to it.
    """
    return build_all(decoder_fixture_dir())
