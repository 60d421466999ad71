"""Session-wide fixtures: the real exported tiny Qwen3 decoders, the real-world corpus
and onnx's backend node-test cases.

Before anything else, the suite refuses to run unless ``onnxforge`` and each of
its layers are loaded from this checkout (see :func:`foreign_packages`).

The decoders are built once into a cache folder and reused by later runs (see
``tests/fixtures/decoders.py``).  The folder is ``$ONNXFORGE_FIXTURE_DIR`` when
that variable is set, else ``<repo>/.fixture-cache/``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("onnxforge", "onnxforge.proto_ext", "onnxforge.graphbuilder", "onnxforge.passes",
            "onnxforge.kernels_cy")


def foreign_packages(root: Path) -> list[str]:
    """Describe each onnxforge package that would not be loaded from the checkout at ``root``.

    An editable install of another checkout (or a regular install) would otherwise
    run that code under these tests. Returns ``[]`` when every package resolves
    under ``root``.
    """
    problems = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except ImportError as exc:  # e.g. the facade's own "not installed" error
            return [f"{name} cannot be imported: {exc}"]
        origin = spec.origin if spec is not None else None
        if origin is None:
            problems.append(f"{name} is not importable")
        elif not Path(origin).resolve().is_relative_to(root):
            problems.append(f"{name} is loaded from {origin}")
    return problems


_FOREIGN = foreign_packages(REPO_ROOT)
if _FOREIGN:
    pytest.exit(
        f"these tests belong to the checkout at {REPO_ROOT}, but the onnxforge importable "
        "here is not this checkout's:\n  " + "\n  ".join(_FOREIGN)
        + f"\nRun `pip install -e .` (or `pip install -e \".[test]\"`) in {REPO_ROOT} to test this checkout.",
        returncode=4,
    )

from tests.fixtures.decoders import build_all, load_io_info, random_decoder_feeds  # noqa: E402
from tests.fixtures.wild import fetch_all  # noqa: E402

__all__ = ["decoder_fixture_dir", "foreign_packages", "load_io_info", "random_decoder_feeds"]

# Property tests explore new examples on every local run; under CI they replay a fixed
# derandomized sequence so that a run's verdict does not depend on chance.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

FIXTURE_DIR_ENV = "ONNXFORGE_FIXTURE_DIR"


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


@pytest.fixture(scope="session")
def wild_models() -> dict[str, Path]:
    """Download (or reuse) the real-world corpus of ``tests/fixtures/wild.py``.

    Returns ``{name: <cache>/wild/<name>.onnx}``, cached in the same folder as the decoders.
    """
    return fetch_all(decoder_fixture_dir())


@pytest.fixture(scope="session")
def node_models() -> list:
    """onnx's backend node-test cases as ``(name, ModelProto)`` pairs (every standard
    operator at the versions onnx tests)."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [(c.name, c.model) for c in cases]
