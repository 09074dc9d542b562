#!/usr/bin/env python3
"""Builds flowjit through pyproject.toml, for those who type `python setup.py`.

flowjit is built by scikit-build-core (PEP 517, CMake), configured once in
pyproject.toml: pip and `python -m build` never run this file. It is a thin
front door that hands each classic command to that same build, so there is
one configuration and nothing here to keep in step with it:

    python setup.py install        ->  pip install .
    python setup.py develop        ->  pip install -e .   (tools/dev.sh setup does this with tests on)
    python setup.py bdist_wheel    ->  pip wheel --no-deps -w dist .
    python setup.py sdist          ->  python -m build --sdist   (needs `pip install build`)
    python setup.py build          ->  the same as bdist_wheel
    python setup.py --version      ->  the version in python/flowjit/_version.py
    python setup.py --help         ->  this text

Add --dry-run (or -n) to print the command without running it. Building
needs LLVM 19 (llvm-19-dev), TBB, Gloo, CMake >= 3.18, Ninja and a C++17
compiler: see docs/getting-started.rst. setuptools is not used.
"""
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    """__version__ from python/flowjit/_version.py, the one place it is written."""
    with open(os.path.join(ROOT, "python", "flowjit", "_version.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def command_for(cmd):
    """The PEP 517 command that does what `setup.py cmd` did, or None."""
    pip = [sys.executable, "-m", "pip"]
    return {
        "install": pip + ["install", ROOT],
        "develop": pip + ["install", "-e", ROOT],
        "bdist_wheel": pip + ["wheel", "--no-deps", "-w", os.path.join(ROOT, "dist"), ROOT],
        "build": pip + ["wheel", "--no-deps", "-w", os.path.join(ROOT, "dist"), ROOT],
        "sdist": [sys.executable, "-m", "build", "--sdist", "--outdir", os.path.join(ROOT, "dist"), ROOT],
    }.get(cmd)


def main(argv):
    dry = any(a in ("--dry-run", "-n") for a in argv)
    args = [a for a in argv if a not in ("--dry-run", "-n")]
    if not args or args[0] in ("--help", "-h", "help", "--help-commands"):
        print(__doc__.strip())
        return 0
    if args[0] == "--version":
        print(version())
        return 0
    if args[0] == "--name":
        print("flowjit")
        return 0
    cmd = command_for(args[0])
    if cmd is None:
        print(f"setup.py: '{args[0]}' is not a command here; flowjit builds through pyproject.toml "
              "(scikit-build-core). Run `python setup.py --help`, or use pip directly: pip install .",
              file=sys.stderr)
        return 2
    if args[1:]:
        print(f"setup.py: options of '{args[0]}' are not passed on: {' '.join(args[1:])} (give them to "
              "pip, e.g. pip install . -Ccmake.define.FLOWJIT_BUILD_TESTS=ON)", file=sys.stderr)
        return 2
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if dry:
        return 0
    if args[0] == "sdist":
        try:
            import build  # noqa: F401 - only to say what is missing
        except ImportError:
            print("setup.py sdist: needs the 'build' package: python -m pip install build", file=sys.stderr)
            return 1
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
