"""The Python package qkv (python/qkv) with the shared library inside it.

`pip install .` / `pip wheel .` at the repository root run this through
setuptools (pyproject.toml): build_py configures the C library with CMake in
a scratch folder, builds only the shared library (no CLI, tests or
benchmarks), and copies it into the package as qkv/libqkv.so, where
python/qkv finds it first. The library is built without libpng and MPI, so
that it needs only libc, libm and pthreads (the Python module uses neither
part); $QKV_CMAKE_ARGS adds CMake arguments (e.g. "-DQKV_USE_CBLAS=ON").
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def _version():
    """The project's version, from CMakeLists.txt's project(... VERSION x.y.z)."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*qkv\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        sys.exit("setup.py: no project(qkv VERSION ...) in CMakeLists.txt")
    return m.group(1)


def _build_library(dest):
    """Configure and build libqkv.so with CMake; copy it to dest/libqkv.so."""
    cmake = os.environ.get("CMAKE", "cmake")
    if shutil.which(cmake) is None:
        sys.exit("setup.py: cmake not found (Debian: apt-get install cmake); it builds libqkv.so")
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(min(os.cpu_count() or 1, 8))
    with tempfile.TemporaryDirectory(prefix="qkv-build-") as tmp:
        configure = [cmake, "-S", ROOT, "-B", tmp, "-DCMAKE_BUILD_TYPE=Release",
                     "-DQKV_BUILD_SHARED=ON", "-DQKV_BUILD_TESTS=OFF", "-DQKV_BUILD_BENCH=OFF",
                     "-DQKV_WITH_PNG=OFF", "-DQKV_WITH_MPI=OFF"]
        configure += shlex.split(os.environ.get("QKV_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        # Only the shared library's target: the CLI is configured but not built.
        subprocess.check_call([cmake, "--build", tmp, "--target", "qkv_shared", "-j", jobs])
        built = [p for p in glob.glob(os.path.join(tmp, "libqkv.so*"))
                 if os.path.isfile(p) and not os.path.islink(p)]
        if len(built) != 1:
            sys.exit("setup.py: expected one libqkv.so* file in the CMake build, found %r" % built)
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(built[0], os.path.join(dest, "libqkv.so"))


class BuildPyWithLibrary(build_py):
    """build_py, plus libqkv.so built by CMake into the package."""

    def run(self):
        super().run()
        _build_library(os.path.join(self.build_lib, "qkv"))


class BinaryDistribution(Distribution):
    """The package holds a compiled library: its wheel is for one platform."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPyWithLibrary}
try:
    from wheel.bdist_wheel import bdist_wheel

    class BdistWheelAnyPython(bdist_wheel):
        """The library is loaded with ctypes, not as a CPython extension: the
        wheel fits any Python 3 on this platform (py3-none-<platform>)."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheelAnyPython
except ImportError:   # no wheel package: pip's own fallback tags the wheel
    pass

# Keep setuptools' scratch files (build/, *.egg-info) out of the CMake
# build folders and of python/: in build-python/ of the current folder.
os.makedirs("build-python", exist_ok=True)
setup(
    version=_version(),
    cmdclass=cmdclass,
    distclass=BinaryDistribution,
    options={"build": {"build_base": "build-python"},
             "egg_info": {"egg_base": "build-python"}},
)
