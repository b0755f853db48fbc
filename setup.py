"""pip's build of the parm package (pyproject.toml): the pure-Python files from python/parm
and the extension parm._core built by CMake (target parm_python) in ./build or
$PARM_BUILD_DIR, with the interpreter that runs pip."""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.abspath(os.environ.get("PARM_BUILD_DIR", os.path.join(ROOT, "build")))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DPARM_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}"]
        configure += os.environ.get("PARM_CMAKE_ARGS", "").split()
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", build_dir, "--target", "parm_python", "-j", jobs],
                       check=True)
        built = os.path.join(build_dir, "python", "parm")
        core = [f for f in os.listdir(built) if f.startswith("_core") and f.endswith(".so")]
        if len(core) != 1:
            raise RuntimeError(f"parm: expected one _core*.so in {built}, found {core}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(built, core[0]), target)


setup(ext_modules=[CMakeExtension("parm._core")], cmdclass={"build_ext": CMakeBuild})
