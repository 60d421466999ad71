"""The modules compiled by the build (onnxforge/_compiled.py): they run compiled after an
install, run from source whenever their extension must not run, and optimize exactly as
their source does."""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import onnxforge as of
from onnxforge import _compiled
from onnxforge._compiled import COMPILED, MODULES, PURE_ENV, SourceFinder, source_digest

REPO = Path(__file__).resolve().parents[1]


def test_every_listed_module_runs_compiled_after_the_install():
    # the install the suite runs on compiled every listed module from its current source
    st = _compiled.status()
    assert sorted(st) == sorted(MODULES)
    assert {name: why for name, why in st.items() if why != COMPILED} == {}
    for name in MODULES:
        origin = sys.modules[name].__spec__.origin
        assert any(origin.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES), origin
    assert _compiled.summary() == f"{len(MODULES)} of {len(MODULES)} optimizer modules compiled"


def _source_of(name: str) -> Path:
    """The ``.py`` beside the file a listed module was imported from."""
    origin = Path(importlib.import_module(name).__spec__.origin)
    return origin.with_name(name.rpartition(".")[2] + ".py")


def test_the_listing_names_distinct_source_modules():
    assert len(set(MODULES)) == len(MODULES)
    for name in MODULES:
        assert _source_of(name).is_file(), name


@pytest.fixture
def fake_package(tmp_path):
    """A folder holding ``leaf.py`` and a file named like its extension module."""
    folder = tmp_path / "pkg"
    folder.mkdir()
    source = folder / "leaf.py"
    source.write_text("VALUE = 1\n")
    (folder / ("leaf" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not loaded")
    return folder, source


def _finder(digests, pure=False):
    return SourceFinder(digests, pure=pure, modules=frozenset({"pkg.leaf"}))


def test_a_current_extension_is_left_to_the_path_finder(fake_package):
    folder, source = fake_package
    f = _finder({"pkg.leaf": source_digest(source)})
    assert f.find_spec("pkg.leaf", [str(folder)]) is None
    assert f.reasons == {"pkg.leaf": COMPILED}


def test_an_edited_source_is_imported_as_source(fake_package):
    folder, source = fake_package
    f = _finder({"pkg.leaf": hashlib.sha256(b"VALUE = 0\n").hexdigest()})
    spec = f.find_spec("pkg.leaf", [str(folder)])
    assert spec is not None and spec.origin == str(source)
    assert "changed since the build" in f.reasons["pkg.leaf"]
    assert "pip install -e ." in f.reasons["pkg.leaf"]


def test_missing_extension_digest_or_pure_request_imports_source(fake_package):
    folder, source = fake_package
    digest = source_digest(source)
    f = _finder({})
    assert f.find_spec("pkg.leaf", [str(folder)]).origin == str(source)
    assert "no digest" in f.reasons["pkg.leaf"]
    f = _finder({"pkg.leaf": digest}, pure=True)
    assert f.find_spec("pkg.leaf", [str(folder)]).origin == str(source)
    assert PURE_ENV in f.reasons["pkg.leaf"]
    (folder / ("leaf" + importlib.machinery.EXTENSION_SUFFIXES[0])).unlink()
    f = _finder({"pkg.leaf": digest})
    assert f.find_spec("pkg.leaf", [str(folder)]).origin == str(source)
    assert "no extension" in f.reasons["pkg.leaf"]


def test_unlisted_modules_and_sourceless_folders_are_not_found(fake_package, tmp_path):
    folder, source = fake_package
    f = _finder({"pkg.leaf": "0" * 64})
    assert f.find_spec("pkg.other", [str(folder)]) is None
    assert f.find_spec("pkg.leaf", [str(tmp_path)]) is None  # no leaf.py there
    assert f.find_spec("pkg.leaf", None) is None
    assert f.reasons == {}


def test_the_finder_runs_first_and_once():
    first = _compiled.install()
    assert _compiled.install() is first
    assert [type(f) for f in sys.meta_path].count(SourceFinder) == 1
    assert sys.meta_path.index(first) < sys.meta_path.index(importlib.machinery.PathFinder)


def test_the_build_record_matches_the_sources():
    with open(Path(_compiled.__file__).with_name(_compiled.MANIFEST), encoding="utf-8") as fh:
        recorded = json.load(fh)["modules"]
    assert sorted(recorded) == sorted(MODULES)
    assert {name: recorded[name] for name in MODULES} == {name: source_digest(_source_of(name)) for name in MODULES}


_OPTIMIZE_ALL = """
import hashlib, json, sys, tempfile, os
import onnxforge as of
from onnxforge import _compiled
paths = json.loads(sys.argv[1])
out = {"status": _compiled.status(), "digests": {}}
folder = tempfile.mkdtemp()
for name, path in sorted(paths.items()):
    target = os.path.join(folder, name + ".onnx")
    of.save(of.optimize(of.load(path)), target)
    out["digests"][name] = hashlib.sha256(open(target, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def _optimize_all(paths: dict[str, Path], pure: bool) -> dict:
    env = dict(os.environ)
    env.pop(PURE_ENV, None)
    if pure:
        env[PURE_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", _OPTIMIZE_ALL, json.dumps({k: str(v) for k, v in paths.items()})],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_compiled_and_source_modules_optimize_the_corpus_alike(wild_models, tmp_path):
    # the same files, byte for byte, from the extensions and from their sources
    pure = _optimize_all(wild_models, pure=True)
    compiled = _optimize_all(wild_models, pure=False)
    assert all(why.startswith("source:") and PURE_ENV in why for why in pure["status"].values())
    assert set(compiled["status"].values()) == {COMPILED}
    assert len(pure["digests"]) == len(wild_models) >= 10
    assert compiled["digests"] == pure["digests"]
    # and the in-process run (this suite's modules) writes them too
    one = sorted(wild_models)[0]
    model = of.optimize(of.load(str(wild_models[one])))
    of.save(model, tmp_path / "one.onnx")
    assert hashlib.sha256((tmp_path / "one.onnx").read_bytes()).hexdigest() == pure["digests"][one]
