"""How the package imports: lazy facade, layers that load only what lies below them,
and loud failures for a checkout that is used the wrong way (bare layer folders,
a clone that was never installed, another checkout installed in the venv)."""
from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import onnxforge
from tests.conftest import PACKAGES, REPO_ROOT, foreign_packages

LAYERS = ["proto_ext", "graphbuilder", "passes", "kernels_cy"]


def _python(code: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; ``-I`` (the default) keeps the working folder off sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *(args or ("-I",)), "-c", code], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


ROOT = {"onnxforge", "onnxforge._compiled"}
"""What ``import onnxforge`` itself loads: the package and its import hook, which must run
before any layer module (onnxforge/_compiled.py)."""


def _loaded_after(code: str) -> set[str]:
    """The ``onnxforge`` modules present in ``sys.modules`` after running ``code`` fresh."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'onnxforge')))"
    done = _python(probe)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_loads_only_itself_and_the_layers_below(layer):
    # import the layer and every module in it, as a user of that layer could
    code = (
        "import importlib, pkgutil\n"
        f"import onnxforge.{layer} as layer\n"
        f"for info in pkgutil.walk_packages(layer.__path__, 'onnxforge.{layer}.'):\n"
        "    importlib.import_module(info.name)\n"
    )
    loaded = _loaded_after(code)
    below = LAYERS[: LAYERS.index(layer) + 1]
    outside = sorted(m for m in loaded - ROOT if m.split(".")[1] not in below)
    assert outside == [], f"importing onnxforge.{layer} also loaded {outside}"
    assert f"onnxforge.{layer}" in loaded


def test_the_wire_types_load_the_wire_layer_only():
    loaded = _loaded_after("import onnxforge.proto_ext.types")
    assert {m.split(".")[1] for m in loaded - ROOT} == {"proto_ext"}


def test_importing_the_facade_loads_nothing_else():
    assert _loaded_after("import onnxforge") == ROOT


def test_a_facade_name_loads_only_its_home():
    loaded = _loaded_after("import onnxforge as of\nof.WireError")
    assert {m.split(".")[1] for m in loaded - ROOT} == {"proto_ext"}
    loaded = _loaded_after("import onnxforge as of\nof.load")
    assert "onnxforge.api" in loaded and "onnxforge.cli" not in loaded


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(Path(onnxforge.__file__).read_text())
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.dump(imp)
                for alias in imp.names:
                    # "X as X" marks an explicit re-export for type checkers
                    assert alias.asname == alias.name, f"write `{alias.name} as {alias.name}`"
                    out[alias.name] = imp.module
    return out


def test_lazy_table_and_type_checking_imports_agree():
    table = onnxforge._EXPORTS
    assert _type_checking_imports() == table
    assert sorted(onnxforge.__all__) == sorted(["__version__", *table])
    assert set(table) <= set(dir(onnxforge))


@pytest.mark.parametrize("name", sorted(onnxforge._EXPORTS))
def test_every_facade_name_is_its_home_object(name):
    home = importlib.import_module(onnxforge._EXPORTS[name])
    assert getattr(onnxforge, name) is getattr(home, name)


def test_unknown_facade_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        onnxforge.nope  # noqa: B018
    assert not hasattr(onnxforge, "nope")


def test_errors_have_one_definition_in_the_lowest_layer():
    import onnxforge.errors as public
    import onnxforge.proto_ext.errors as lowest

    assert public.__all__ == lowest.__all__
    for name in lowest.__all__:
        assert getattr(public, name) is getattr(lowest, name)
    assert onnxforge.CodecError is lowest.CodecError
    assert issubclass(onnxforge.VerificationError, onnxforge.OnnxforgeError)


def test_layer_folders_cannot_be_imported_under_their_bare_names():
    # the repository root on sys.path would make a second copy of each module
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "for name in ['proto_ext.types', 'graphbuilder.ir.core', 'passes.rewrites.engine', 'kernels_cy']:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
        "    else:\n"
        "        print('imported', name)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    for layer, line in zip(LAYERS, lines, strict=True):
        assert f"the layer folder {layer}/ was imported as '{layer}'" in line
        assert f"import onnxforge.{layer} instead" in line and "pip install -e ." in line


def test_a_clone_without_install_says_how_to_install():
    # -S: no site-packages, so nothing is installed; the repo root is the working folder
    done = _python("import onnxforge", "-S", cwd=REPO_ROOT)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "not installed" in done.stderr and "pip install -e ." in done.stderr
    assert "ModuleNotFoundError" not in done.stderr


def test_this_checkout_is_the_one_under_test():
    assert foreign_packages(REPO_ROOT) == []


def test_another_checkout_is_named(tmp_path):
    problems = foreign_packages(tmp_path)
    assert len(problems) == len(PACKAGES)
    assert problems[0].startswith("onnxforge is loaded from ")
    assert str(REPO_ROOT / "passes") in problems[3]


def test_the_suite_refuses_to_run_against_another_checkout(tmp_path):
    # a checkout at tmp_path whose tests would run against the onnxforge installed here
    (tmp_path / "tests").mkdir()
    for name in ("__init__.py", "conftest.py"):
        shutil.copy(REPO_ROOT / "tests" / name, tmp_path / "tests" / name)
    (tmp_path / "tests" / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert f"belong to the checkout at {tmp_path}" in out
    assert f"onnxforge.passes is loaded from {REPO_ROOT / 'passes'}" in out
    assert "pip install -e ." in out
    assert "1 passed" not in out
