"""Builds flowjit: the C++ core with CMake into the extension flowjit._C."""
import os
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
    """Configures and builds the CMake project, placing _C next to the package."""

    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        editable = getattr(self, "editable_mode", False) or self.inplace
        # Editable installs build straight into the source package, so that
        # rebuilding the CMake tree (ninja _C) updates the installed module.
        out_dir = ROOT / "python" / "flowjit" if editable else target.parent
        build_dir = Path(os.environ.get("FLOWJIT_BUILD_DIR", ROOT / "build" / "dev"))
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = os.environ.get("FLOWJIT_BUILD_TYPE", "Release")
        configure = [
            "cmake", str(ROOT), "-G", "Ninja",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DFLOWJIT_PY_OUTPUT_DIR={out_dir}",
            f"-DFLOWJIT_BUILD_TESTS={'ON' if os.environ.get('FLOWJIT_BUILD_TESTS') == '1' else 'OFF'}",
        ]
        try:
            import pybind11
            configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        subprocess.check_call(configure, cwd=build_dir)
        jobs = os.environ.get("FLOWJIT_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", ".", "--target", "_C", "-j", jobs], cwd=build_dir)
        built = out_dir / target.name
        if built.resolve() != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, target)


setup(
    packages=["flowjit", "flowjit_cache"],
    package_dir={"flowjit": "python/flowjit", "flowjit_cache": "tools/flowjit_cache"},
    ext_modules=[CMakeExtension("flowjit._C")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
