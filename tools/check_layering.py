#!/usr/bin/env python3
"""Fails when a C++ layer includes a layer above it (docs/DESIGN.md, Folders).

    ir/       includes only ir/
    abi/      ir/ and abi/: the launch record, the contract between codegen/ and runtime/
    codegen/  ir/, abi/ and codegen/ (never jit/ or runtime/)
    runtime/  ir/, abi/ and runtime/ (never jit/ or codegen/)
    jit/      anything but python/
Run by tools/dev.sh test; prints each offending #include with its file and line.
"""
import pathlib
import re
import sys

ALLOWED = {
    "ir": {"ir"},
    "abi": {"ir", "abi"},
    "codegen": {"ir", "abi", "codegen"},
    "runtime": {"ir", "abi", "runtime"},
    "jit": {"ir", "abi", "codegen", "runtime", "jit"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


def main(root):
    bad = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".def", ".in"):
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                    bad.append(f"{path.relative_to(root)}:{n}: {layer}/ must not include {m.group(1)}/: "
                               f"{line.strip()}")
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)" if bad else "layering: ok (ir < abi < codegen, runtime < jit)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(__file__).resolve().parent.parent))
