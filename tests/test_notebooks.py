"""The notebooks of ``notebooks/`` run from top to bottom and compute what their prose claims.

Each notebook is executed with nbclient in a fresh ``python3`` kernel whose working
folder is ``notebooks/`` (the executed copy stays in memory: the stored files keep no
outputs), with ``MPLBACKEND=Agg`` and ``ONNXFORGE_FIXTURE_DIR`` naming the fixture
cache that the session fixtures filled. A cell that raises fails the test. The last
cell of every notebook prints a JSON summary of its results, which the checks below
read.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, decoder_fixture_dir

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120


def _summary(nb: Any) -> dict[str, Any]:
    """The JSON object printed by the notebook's last code cell."""
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream" and o.name == "stdout")
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"the last cell printed no JSON summary; it printed {text!r}"
    return json.loads(lines[-1])


def _run(name: str, allow_errors: bool = False) -> tuple[Any, list[Any]]:
    """Execute notebook ``name``; returns the executed copy and its error outputs."""
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, startup_timeout=CELL_TIMEOUT_S,
                                     kernel_name="python3", allow_errors=allow_errors,
                                     resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute()
    return nb, [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


def _execute(name: str) -> dict[str, Any]:
    nb, errors = _run(name)
    assert not errors, f"{name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    return _summary(nb)


@pytest.fixture()
def notebook_env(monkeypatch: pytest.MonkeyPatch, decoder_models: dict[str, Path],
                 wild_models: dict[str, Path]) -> Path:
    """Environment of the notebook kernels: the fixture cache (filled by the session
    fixtures) and a non-interactive matplotlib backend."""
    folder = decoder_fixture_dir()
    monkeypatch.setenv("ONNXFORGE_FIXTURE_DIR", str(folder))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return folder


def _check_authoring(s: dict[str, Any]) -> None:
    assert s["verified"] and s["decode_within_quantization_error"]
    assert s["roundtrip_same_bytes"] and s["roundtrip_same_weights"]
    assert s["cache_address_constant"] and s["copied_bytes_max"] == 0
    assert s["cache_bytes"] == [1 * 1 * 16 * 32 * 4]  # one capacity-sized float cache, every step
    assert s["logits_max_error"] < 1e-4
    assert s["rows_written"] == s["steps"]


def _check_optimizing(s: dict[str, Any]) -> None:
    models = s["models"]
    assert {"torch20", "torch23", "genai_fp32", "genai_int4", "silero_vad", "ppocr_det"} <= set(models)
    for name, row in models.items():
        assert row["onnxforge_outputs_unchanged"], name
        assert row["onnxforge"] <= row["before"], name
    assert s["peer"] == "onnxscript"  # installed with the test extra
    assert sum("onnxscript" in row for row in models.values()) >= 10
    st = s["stateful"]
    assert st["bindings"] == 8
    assert st["cache_address_constant"] and st["copied_bytes_max"] == 0
    # 8 caches of [1, 2, STEPS, 32] float32, allocated once at capacity
    assert st["cache_bytes"] == [8 * 2 * st["steps"] * 32 * 4]
    assert st["allocated_bytes_constant"] and st["concat_allocated_grows"]
    assert st["concat_cache_bytes_last"] == st["cache_bytes"][0]
    assert st["logits_max_diff_vs_onnxruntime"] < 1e-4


def _check_exporting(s: dict[str, Any]) -> None:
    b = s["builtin"]
    assert b["all_lowerable"] and b["non_standard_nodes"] == 0 and b["opset"] >= 24
    assert b["has"] == ["Attention", "DequantizeLinear", "TensorScatter"]
    assert b["feedback"] == {f"cache.{n}.{k}": f"present.{n}.{k}" for n in range(2) for k in ("key", "value")}
    g = s["genai_int4"]
    assert g["non_standard_nodes"] == 0 and g["has"] == ["Attention", "DequantizeLinear", "RotaryEmbedding"]
    assert all(d < 1e-4 for d in g["logits_max_diff"].values())
    r = s["rejected"]
    struct, custom, int4 = ("graph.encoded_initializer['w'].struct_type", "graph.node[2]('FancyActivation')",
                            "graph.encoded_initializer['q'].affine")
    assert r["default target"] == [struct, custom]
    assert r["target_opset=19"] == [struct, int4, custom]
    assert r["keep_domains=['example.custom']"] == [struct]
    assert s["lower_false_refused"] == b["constructs"]
    f = s["feedback_loop"]
    assert f["same_tokens"] and f["logits_max_diff"] < 1e-4
    assert f["onnxforge_copied_bytes_max"] == 0 and f["onnxforge_cache_address_constant"]


CHECKS = {
    "01_authoring_stateful_models.ipynb": _check_authoring,
    "02_optimizing_and_stateful_decoding.ipynb": _check_optimizing,
    "03_exporting_to_standard_onnx.ipynb": _check_exporting,
}


def test_every_notebook_is_checked() -> None:
    assert NOTEBOOKS == sorted(CHECKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_stored_without_outputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 4  # prose a new user can follow


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_computes_what_it_claims(name: str, notebook_env: Path) -> None:
    CHECKS[name](_execute(name))


def test_a_missing_fixture_folder_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ONNXFORGE_FIXTURE_DIR", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    _, errors = _run("02_optimizing_and_stateful_decoding.ipynb", allow_errors=True)
    first = errors[0]
    assert first["ename"] == "FileNotFoundError"
    assert str(tmp_path) in first["evalue"] and "ONNXFORGE_FIXTURE_DIR" in first["evalue"]
    assert "python -m tests.fixtures.decoders" in first["evalue"]
