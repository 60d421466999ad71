"""The package type-checks with mypy (configured in pyproject.toml).

The layer folders install as ``onnxforge.*`` through the build's package mapping,
which mypy cannot read; so the check runs over a tree of links that lays the
folders out as the installed package: ``<tree>/onnxforge/`` holds the facade's
files and one link per layer (``proto_ext -> ../../proto_ext``...). The tree and
mypy's cache live in ``.mypy_cache/`` (ignored by git).

Run ``python tests/test_typecheck.py`` to see mypy's report directly.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".mypy_cache"
TREE = CACHE / "package-tree"


def package_mapping() -> dict[str, str]:
    """``{"onnxforge": "onnxforge", "onnxforge.proto_ext": "proto_ext", ...}`` from setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError("setup.py defines no LAYERS mapping")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _link(link: Path, source: Path) -> None:
    if link.is_symlink() and link.resolve() == source.resolve():
        return
    _remove(link)
    link.symlink_to(source, target_is_directory=source.is_dir())


def build_tree() -> Path:
    """Lay the source folders out as the installed package under ``TREE``; return TREE.

    Kept between runs (so that mypy's cache stays valid) and brought up to date:
    a link per file of the facade folder and per layer folder, nothing else.
    """
    mapping = package_mapping()
    package = TREE / "onnxforge"
    package.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, Path] = {}
    for entry in (ROOT / mapping["onnxforge"]).iterdir():
        if entry.name != "__pycache__":
            wanted[entry.name] = entry
    for name, folder in mapping.items():
        if name != "onnxforge":
            wanted[name.split(".", 1)[1]] = ROOT / folder
    for stale in package.iterdir():
        if stale.name not in wanted:
            _remove(stale)
    for name, source in wanted.items():
        _link(package / name, source)
    return TREE


def run_mypy() -> subprocess.CompletedProcess[str]:
    tree = build_tree()
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(CACHE), "-p", "onnxforge"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600,
    )


def test_the_package_type_checks():
    assert importlib.util.find_spec("mypy") is not None, (
        "mypy is not installed: run `pip install -e \".[test]\"` at the repository root")
    done = run_mypy()
    # a path onnxforge/passes/rewrites/fold.py in the report is the folder passes/rewrites/fold.py
    assert done.returncode == 0, f"mypy reports:\n{done.stdout}{done.stderr}"


def test_the_tree_maps_every_layer_folder():
    tree = build_tree()
    for name, folder in package_mapping().items():
        path = tree.joinpath(*name.split("."))
        assert (path / "__init__.py").resolve() == (ROOT / folder / "__init__.py").resolve()


if __name__ == "__main__":
    result = run_mypy()
    sys.stdout.write(result.stdout + result.stderr)
    sys.exit(result.returncode)
