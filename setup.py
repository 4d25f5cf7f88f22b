"""The build of dgc._C for `pip install --no-build-isolation .` (pyproject.toml): setuptools runs
this repository's CMake with the options of the package build and copies the module it makes.

What CMake is given:
  DGC_PYTHON          the Python that runs pip (the module is checked against its torch);
  CMAKE_PREFIX_PATH   torch.utils.cmake_prefix_path (libtorch's TorchConfig.cmake) and, when the
                      pybind11 Python package is installed, pybind11.get_cmake_dir();
  no tests, no dgc program, no MPI or Gloo backend (the hook exchanges over the user's process
  group), no precompiled header: only the target dgc_python_ext and what it links (dgc::core,
  dgc::exchange, dgc::comm, dgc::comm_torch, dgc::train_step).
Environment: DGC_BUILD_DIR (the CMake build folder; default under setuptools' build_temp),
CMAKE_BUILD_PARALLEL_LEVEL (jobs; default all cores), DGC_CMAKE_ARGS (more -D options).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch
            import torch.utils
        except ImportError as error:
            raise RuntimeError(
                f"dgc is built against the installed torch, and {sys.executable} cannot import "
                f"one ({error}): install torch first, then `pip install --no-build-isolation .` "
                f"(build isolation would build against a second, downloaded torch)"
            ) from error
        if shutil.which("cmake") is None:
            raise RuntimeError("building dgc needs CMake 3.22 or later on PATH (apt install cmake)")
        build = Path(os.environ.get("DGC_BUILD_DIR") or Path(self.build_temp) / "cmake").resolve()
        prefix = [torch.utils.cmake_prefix_path]
        try:
            import pybind11

            prefix.append(pybind11.get_cmake_dir())
        except ImportError:
            pass  # pybind11-dev's config, found by CMake itself
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DDGC_PYTHON={sys.executable}",
            "-DCMAKE_PREFIX_PATH=" + ";".join(prefix),
            "-DDGC_BUILD_TESTS=OFF",
            "-DDGC_BUILD_CLI=OFF",
            "-DDGC_BUILD_BENCHMARKS=OFF",
            "-DDGC_WITH_MPI=OFF",
            "-DDGC_WITH_GLOO=OFF",
            "-DDGC_PRECOMPILE_TORCH=OFF",
        ]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("DGC_CMAKE_ARGS", ""))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *args], check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(
            ["cmake", "--build", str(build), "--target", "dgc_python_ext", "-j", jobs], check=True
        )
        built = sorted((build / "python" / "dgc").glob("_C*.so"))
        if not built:
            raise RuntimeError(f"the CMake build made no dgc/_C*.so under {build / 'python'}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(ext_modules=[CMakeExtension("dgc._C")], cmdclass={"build_ext": CMakeBuild})
