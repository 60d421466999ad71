"""Build script: maps the top-level layer folders into the ``onnxforge`` namespace,
compiles the Cython kernels found in ``kernels_cy/`` and, with Cython too, the
pure-Python modules of ``onnxforge/_compiled.py``'s list (recording their sources'
digests in ``onnxforge/_compiled.json``)."""
from __future__ import annotations

import glob
import json
import os
import runpy

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

LAYERS = {
    "onnxforge": "onnxforge",
    "onnxforge.proto_ext": "proto_ext",
    "onnxforge.graphbuilder": "graphbuilder",
    "onnxforge.passes": "passes",
    "onnxforge.kernels_cy": "kernels_cy",
}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for name, folder in LAYERS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(folder):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = os.path.join(folder, *sub.split("."))
    return packages, package_dir


# headers and Cython includes shared by the kernel families (each family's own headers
# sit beside its .pyx)
INCLUDE = os.path.join("kernels_cy", "include")


def _extensions() -> list[Extension]:
    exts = []
    for pyx in sorted(glob.glob(os.path.join("kernels_cy", "**", "*.pyx"), recursive=True)):
        rel = os.path.splitext(os.path.relpath(pyx, "kernels_cy"))[0]
        module = "onnxforge.kernels_cy." + rel.replace(os.sep, ".")
        exts.append(
            Extension(
                module,
                [pyx],
                include_dirs=[numpy.get_include(), INCLUDE, os.path.dirname(pyx)],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                # no -march: kernels_cy/include/_simd.h selects AVX2+FMA code paths at run time;
                # no OpenMP: the kernels run in parallel on the backend's own pool (runtime/_pool.h)
                extra_compile_args=["-O3"],
                depends=sorted(glob.glob(os.path.join(INCLUDE, "*"))
                               + glob.glob(os.path.join(os.path.dirname(pyx), "*.h"))),
            )
        )
    return cythonize(exts, language_level=3, quiet=True, include_path=[INCLUDE])


def _module_source(module: str) -> str:
    """The ``.py`` file of a dotted module name under the layer folders."""
    for package in sorted(LAYERS, key=len, reverse=True):
        if module.startswith(package + "."):
            rest = module[len(package) + 1:].split(".")
            return os.path.join(LAYERS[package], *rest) + ".py"
    raise SystemExit(f"setup.py: {module} is in no layer folder")


_LISTING = runpy.run_path(os.path.join("onnxforge", "_compiled.py"))


def _compiled_python() -> list[Extension]:
    """The listed pure-Python modules as extensions, compiled unchanged: Python semantics
    kept (annotations are not read as C types), the generated C under build/."""
    exts = [Extension(module, [_module_source(module)], extra_compile_args=["-O2"])
            for module in _LISTING["MODULES"]]
    return cythonize(exts, quiet=True, build_dir=os.path.join("build", "cython"),
                     nthreads=os.cpu_count() or 1,
                     compiler_directives={"language_level": 3, "annotation_typing": False})


class _BuildExt(build_ext):
    """build_ext that compiles on every core unless told otherwise (``-j``) and, once every
    extension is built, records the digest of each compiled module's source beside
    ``onnxforge/_compiled.py`` (a failed build records nothing, so no extension older than
    its source is ever taken for current)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        digests = {m: _LISTING["source_digest"](_module_source(m)) for m in _LISTING["MODULES"]}
        super().run()
        # in place (and in an editable install, whose extensions are copied beside their
        # sources) the record goes to the source folder; in a wheel, to the built package
        beside_source = self.inplace or getattr(self, "editable_mode", False)
        folder = LAYERS["onnxforge"] if beside_source else os.path.join(self.build_lib, "onnxforge")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, _LISTING["MANIFEST"]), "w", encoding="utf-8") as fh:
            json.dump({"modules": digests}, fh, indent=1, sort_keys=True)
            fh.write("\n")


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"onnxforge": ["py.typed"],
                  **{name: ["*.h", "*.pxi", "*.pyx"] for name in packages if name.startswith("onnxforge.kernels_cy")}},
    ext_modules=_extensions() + _compiled_python(),
    cmdclass={"build_ext": _BuildExt},
)
