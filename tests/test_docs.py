"""The documentation: the Sphinx build succeeds with warnings as errors, the generated
pages hold what they promise (API names, every command's ``--help``, every rule ID the
verifier reports), and the examples the pages include run and check their results."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import onnxforge
import onnxforge.proto_ext

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"
EXAMPLES = DOCS / "examples"

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ left in docs/_ext
    env.pop("COLUMNS", None)
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML build of docs/, made once for this module with warnings as errors."""
    out = tmp_path_factory.mktemp("docs-html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"sphinx failed:\n{proc.stdout}\n{proc.stderr}"
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    return out


def _text(page: Path) -> str:
    """A page's text: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_build_writes_every_page(built: Path) -> None:
    for name in ("index", "architecture", "wire", "state", "paged_cache", "passes", "backend",
                 "api", "cli", "rules"):
        assert (built / f"{name}.html").is_file(), name
    assert (built / "_static" / "dataflow.svg").is_file()


def test_api_page_documents_the_public_names(built: Path) -> None:
    raw = (built / "api.html").read_text(encoding="utf-8")
    # autodoc gives every documented object an anchor named by its full path
    for anchor in ("onnxforge.load", "onnxforge.verify", "onnxforge.optimize", "onnxforge.to_standard_onnx",
                   "onnxforge.make_stateful", "onnxforge.make_state", "onnxforge.InferenceSession",
                   "onnxforge.InferenceSession.run", "onnxforge.GraphBuilder",
                   "onnxforge.VerificationError", "onnxforge.OnnxforgeError",
                   "onnxforge.passes.framework.pass_manager.PassManager",
                   "onnxforge.passes.framework.pass_manager.Pass",
                   "onnxforge.passes.rewrites.patterns.Rule", "onnxforge.passes.rewrites.patterns.Pattern",
                   "onnxforge.kernels_cy.ops.base.Kernel", "onnxforge.kernels_cy.ops.base.NodeSpec",
                   "onnxforge.kernels_cy.runtime.state.State"):
        assert f'id="{anchor}"' in raw, anchor
    text = _text(built / "api.html")
    # docstring text made it through, not only the names
    assert "Base class of every error onnxforge raises on purpose." in text
    assert "Apply a RuleTable (default DEFAULT_RULES) to a fixed point." in text


def test_cli_page_is_every_commands_help(built: Path) -> None:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from onnxforge_cli import WIDTH, _columns, subcommands
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    from onnxforge.cli import build_parser

    text = _text(built / "cli.html")
    with _columns(WIDTH):
        parser = build_parser()
        commands = subcommands(parser)
        helps = {name: sub.format_help() for name, _, sub in commands}
        helps[""] = parser.format_help()
    names = {name for name, _, _ in commands}
    assert names, "no subcommands found in the parser"
    assert {"inspect", "verify", "optimize", "export", "run", "generate", "demo"} <= names
    for name, help_text in helps.items():
        assert f"onnxforge {name} --help".replace("  ", " ") in text
        for line in help_text.splitlines():  # the page holds the help verbatim, line by line
            assert line.rstrip() in text, (name, line)


def test_rules_page_lists_every_rule_the_verifier_reports(built: Path) -> None:
    raw = (built / "rules.html").read_text(encoding="utf-8")
    source = Path(onnxforge.proto_ext.__file__).parent
    reported: set[str] = set()
    for path in source.rglob("*.py"):
        reported |= set(re.findall(r'"([CTSAPNBLW]\d{1,2})"', path.read_text(encoding="utf-8")))
    assert {"C1", "L13", "P7", "W1"} <= reported
    runtime = {f"R{i}" for i in range(1, 10)}
    for rule in sorted(reported | runtime):
        assert f'id="rule-{rule.lower()}"' in raw, rule


def _run_example(name: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_pass_writing_example_runs() -> None:
    # in a fresh interpreter: the example registers a pass in the process-wide registry
    out = _run_example("write_a_pass.py").stdout
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:-1]}
    assert rows == {"topological_sort": "no", "example_dropout_elimination": "yes", "rewrite": "yes",
                    "dce": "no"}


def test_kernel_example_runs() -> None:
    out = _run_example("write_a_kernel.py").stdout
    assert "allocated_bytes=48" in out and "copied_bytes=0" in out


def test_examples_are_included_by_the_pages(built: Path) -> None:
    passes = _text(built / "passes.html")
    assert "class DropoutEliminationPass(Pass):" in passes
    assert 'abs_of_neg = Rule(Pattern("Abs", Pattern("Neg", "x")),' in passes
    backend = _text(built / "backend.html")
    assert '@register("example.docs", "ScaledTanh")' in backend
