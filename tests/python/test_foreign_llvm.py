"""Another LLVM in the process (issue [fuzz]): `import tensorflow` before
flowjit crashed the first compile of a development build, because TensorFlow's
bundled LLVM symbols, loaded first and global, won over libLLVM's for _C.
flowjit loads _C with RTLD_DEEPBIND. The test plays TensorFlow's part with a
library that defines one LLVM symbol (versioned as libLLVM's) and exits."""
import os
import shutil
import subprocess
import sys

import pytest

SHIM = r"""
#include <unistd.h>
void _ZN4llvm10DataLayoutD1Ev(void* p) { (void)p; write(2, "interposed\n", 11); _exit(42); }
void _ZN4llvm10DataLayoutD2Ev(void* p) { (void)p; write(2, "interposed\n", 11); _exit(42); }
"""

SCRIPT = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
import numpy as np, flowjit as flow, flowjit.typing as tp
@flow.global_function(type="predict")
def twice(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
    return x * 2.0
print(twice(np.ones(4, np.float32)).tolist())
"""


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""), reason="AddressSanitizer refuses RTLD_DEEPBIND")
def test_a_foreign_llvm_loaded_first_does_not_take_over_flowjits(tmp_path):
    (tmp_path / "shim.c").write_text(SHIM)
    (tmp_path / "v.map").write_text("LLVM_19.1 { global: *; };\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,--version-script=v.map", "-o", "libshim.so", "shim.c"],
                   cwd=tmp_path, check=True)
    (tmp_path / "t.py").write_text(SCRIPT)
    env = dict(os.environ, FLOWJIT_DISABLE_CACHE="1")
    p = subprocess.run([sys.executable, str(tmp_path / "t.py"), str(tmp_path / "libshim.so")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[2.0, 2.0, 2.0, 2.0]"
