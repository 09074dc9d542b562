"""The flowjit version, the one place it is written (pyproject.toml and CMake read it)."""
__version__ = "0.1.0"
