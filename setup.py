"""Build script: maps the top-level layer folders into the ``onnxforge`` namespace
and compiles the Cython kernels found in ``kernels_cy/``."""
from __future__ import annotations

import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

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


def _extensions() -> list[Extension]:
    exts = []
    for pyx in sorted(glob.glob(os.path.join("kernels_cy", "**", "*.pyx"), recursive=True)):
        rel = os.path.splitext(os.path.relpath(pyx, "kernels_cy"))[0]
        module = "onnxforge.kernels_cy." + rel.replace(os.sep, ".")
        exts.append(
            Extension(
                module,
                [pyx],
                include_dirs=[numpy.get_include(), "kernels_cy"],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                # no -march: kernels_cy/_simd.h selects AVX2+FMA code paths at run time
                extra_compile_args=["-O3", "-fopenmp"],
                extra_link_args=["-fopenmp"],
                depends=sorted(glob.glob(os.path.join("kernels_cy", "*.h"))
                               + glob.glob(os.path.join("kernels_cy", "*.pxi"))),
            )
        )
    return cythonize(exts, language_level=3, quiet=True)


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"onnxforge": ["py.typed"], "onnxforge.kernels_cy": ["*.h", "*.pxi", "*.pyx"]},
    ext_modules=_extensions(),
)
