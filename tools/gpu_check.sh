#!/usr/bin/env bash
# The GPU check, one command for a machine with an NVIDIA GPU and driver:
#   1. builds flowjit's C++ tests and the GPU benchmark (CMake + Ninja)
#   2. numerics: every GPU test kernel against the CPU backend on the GPU
#      (the Nvptx* gtests with FLOWJIT_REQUIRE_GPU=1: NvptxDevice.* runs the
#      whole suite of graphs, the seed's train step and the float16/bfloat16
#      matmuls on mma.m16n8k16 included, on the GPU and compares with the
#      CPU; skips become failures), plus the GPU-less ones
#      (ptxas for sm_80/sm_90, golden PTX, runtime, emulator)
#   3. the Python suite's GPU-placed jobs against the same jobs on the CPU:
#      tests/python/test_gpu.py with FLOWJIT_REQUIRE_GPU=1 (predict, train,
#      async, variables shared with CPU jobs and checkpoints, the disk cache;
#      skips become failures), with the extension built here and staged in
#      $FLOWJIT_GPU_BUILD_DIR/py, so the tree's own build is left alone
#   4. benchmarks: matmul TFLOP/s against cuBLAS (same process, same
#      buffers), a fused elementwise chain against copy bandwidth, the seed's
#      train step; then the same workloads in PyTorch when torch has CUDA
#   5. NCCL: flowjit_tests --gtest_filter='Nccl*' with FLOWJIT_REQUIRE_GPU=1
#      (NcclGpu.*: the NCCL communicator's collectives on device buffers, one
#      rank, two where there are two GPUs; a missing NCCL library is a visible
#      skip, a failure with FLOWJIT_REQUIRE_NCCL=1)
#   6. several GPUs, where nvidia-smi lists two or more: a data-parallel
#      train step on GPUs 0 and 1 against the same steps on GPU 0
#      (test_gpu.py::test_two_gpus_train_like_one_gpu with
#      FLOWJIT_REQUIRE_GPUS=2: the one-process path, NCCL between the GPUs;
#      skips become failures); needs the Python step (not --no-python)
# Exits 2 at once when there is no GPU, 1 when a step fails.
#
#   tools/gpu_check.sh [--quick] [--no-bench] [--no-python]
# Environment: FLOWJIT_GPU_BUILD_DIR (default build/gpu-check), JOBS, PYTHON
# (the interpreter for step 3: needs numpy, pytest and pybind11).
# Figures go to $FLOWJIT_GPU_BUILD_DIR/gpu_bench.json and torch_bench.json.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD="${FLOWJIT_GPU_BUILD_DIR:-$ROOT/build/gpu-check}"
JOBS="${JOBS:-$(nproc)}"
QUICK=""
BENCH=1
PYTESTS=1
PY="${PYTHON:-python3}"
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    --no-bench) BENCH=0 ;;
    --no-python) PYTESTS=0 ;;
    *) echo "usage: $0 [--quick] [--no-bench] [--no-python]" >&2; exit 64 ;;
  esac
done

log() { printf '\033[1m[gpu_check]\033[0m %s\n' "$*"; }
fail() { printf '\033[1;31m[gpu_check] FAILED:\033[0m %s\n' "$*" >&2; exit 1; }

# ---- 0. a GPU, or a clear failure
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ] \
   && [ -z "${FLOWJIT_LIBCUDA:-}" ]; then
  echo "[gpu_check] no GPU: no CUDA driver (libcuda.so.1 not found); this check needs an NVIDIA GPU and driver" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    | sed 's/^/[gpu_check] GPU: /' || true
fi
START=$(date +%s)

# ---- 1. build
LLVM_CONFIG=$(command -v llvm-config-19 || command -v llvm-config || echo /usr/lib/llvm-19/bin/llvm-config)
PYPKG="$BUILD/py"  # flowjit's Python files and the extension built here
PYOPTS="-DFLOWJIT_BUILD_PYTHON=OFF"
TARGETS="flowjit_tests"
if [ "$PYTESTS" = 1 ]; then
  if ! "$PY" -c 'import numpy, pytest, pybind11' 2>/dev/null; then
    fail "the Python GPU tests need numpy, pytest and pybind11 for $PY (pip install numpy pytest pybind11; or --no-python)"
  fi
  mkdir -p "$PYPKG/flowjit"
  PYOPTS="-DFLOWJIT_BUILD_PYTHON=ON -DFLOWJIT_PY_OUTPUT_DIR=$PYPKG/flowjit -DPython_EXECUTABLE=$(command -v "$PY")"
  TARGETS="flowjit_tests _C"
fi
log "configuring in $BUILD"
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release $PYOPTS >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; fail "cmake configure"; }
log "building $TARGETS with $JOBS jobs"
# shellcheck disable=SC2086
ninja -C "$BUILD" -j "$JOBS" $TARGETS || fail "build"
log "building gpu_bench"
# The runtime's own link dependencies, as CMake found them: Gloo (the
# multi-process communicator) and libjpeg-turbo when it was found.
EXTRA_LIBS="$(sed -n 's/^GLOO_LIBRARY:FILEPATH=//p' "$BUILD/CMakeCache.txt") $(sed -n 's/^TURBOJPEG_LIBRARY:FILEPATH=\(\/.*\)/\1/p' "$BUILD/CMakeCache.txt")"
"${CXX:-g++}" -std=c++17 -O2 -I"$ROOT" -I"$BUILD/generated" -isystem "$("$LLVM_CONFIG" --includedir)" \
  "$ROOT/benchmarks/gpu_bench.cpp" \
  "$BUILD/libflowjit_jit.a" "$BUILD/libflowjit_codegen.a" "$BUILD/libflowjit_runtime.a" "$BUILD/libflowjit_ir.a" \
  -L"$("$LLVM_CONFIG" --libdir)" -lLLVM -Wl,-rpath,"$("$LLVM_CONFIG" --libdir)" $EXTRA_LIBS -ltbb -ldl -lpthread \
  -o "$BUILD/gpu_bench" || fail "building gpu_bench"
log "build done in $(( $(date +%s) - START ))s"

# ---- 2. numerics on the GPU against the CPU
STATUS=0
log "GPU numerics: flowjit_tests --gtest_filter='Nvptx*' with FLOWJIT_REQUIRE_GPU=1"
if ! FLOWJIT_REQUIRE_GPU=1 "$BUILD/flowjit_tests" --gtest_filter='Nvptx*' 2>&1 | tee "$BUILD/nvptx_tests.log" \
     | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|^\[nvptx\]|^\[emu\]|Failure|differ|no GPU'; then
  :
fi
if grep -q '^\[  FAILED  \]' "$BUILD/nvptx_tests.log" || ! grep -q '^\[  PASSED  \]' "$BUILD/nvptx_tests.log"; then
  STATUS=1
  log "GPU numerics FAILED (full log: $BUILD/nvptx_tests.log)"
fi

# ---- 3. the Python suite's GPU-placed jobs against the CPU
if [ "$PYTESTS" = 1 ]; then
  (cd "$ROOT/python" && find flowjit -name '*.py' -exec cp --parents {} "$PYPKG" \;)
  log "Python GPU jobs against the CPU: tests/python/test_gpu.py with FLOWJIT_REQUIRE_GPU=1"
  if ! (cd "$ROOT" && FLOWJIT_REQUIRE_GPU=1 PYTHONPATH="$PYPKG:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" \
        "$PY" -m pytest -q -rs -p no:cacheprovider tests/python/test_gpu.py 2>&1 | tee "$BUILD/python_gpu_tests.log"); then
    :
  fi
  if ! grep -qE '^[0-9]+ passed' "$BUILD/python_gpu_tests.log" \
     || grep -qE '[0-9]+ (failed|error)' "$BUILD/python_gpu_tests.log"; then
    STATUS=1
    log "Python GPU tests FAILED (full log: $BUILD/python_gpu_tests.log)"
  elif ! (cd "$ROOT" && PYTHONPATH="$PYPKG" "$PY" -c 'import flowjit, sys; sys.exit(0 if flowjit.__file__.startswith(sys.argv[1]) else 1)' "$PYPKG"); then
    STATUS=1
    log "Python GPU tests did not import the flowjit built here"
  fi
fi

# ---- 4. benchmarks
if [ "$BENCH" = 1 ]; then
  log "benchmarks: gpu_bench $QUICK"
  "$BUILD/gpu_bench" $QUICK --json "$BUILD/gpu_bench.json" || { STATUS=1; log "gpu_bench FAILED"; }
  log "benchmarks: PyTorch on the GPU"
  PY="${PYTHON:-python3}"
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PY" "$ROOT/benchmarks/gpu_torch_bench.py" $QUICK --json "$BUILD/torch_bench.json" || { STATUS=1; log "torch bench FAILED"; }
  else
    log "PyTorch with CUDA is not available here: no torch figures"
  fi
fi

# ---- 5. NCCL collectives on device buffers
log "NCCL: flowjit_tests --gtest_filter='Nccl*' with FLOWJIT_REQUIRE_GPU=1"
FLOWJIT_REQUIRE_GPU=1 "$BUILD/flowjit_tests" --gtest_filter='Nccl*' >"$BUILD/nccl_tests.log" 2>&1
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|^\[nccl\]|Failure|^(no GPU|a GPU but no NCCL)' \
  "$BUILD/nccl_tests.log" || true
if grep -q '^\[  FAILED  \]' "$BUILD/nccl_tests.log" || ! grep -q '^\[  PASSED  \]' "$BUILD/nccl_tests.log"; then
  STATUS=1
  log "NCCL FAILED (full log: $BUILD/nccl_tests.log)"
fi

# ---- 6. two GPUs: data parallel against one GPU
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ' || true)
if [ "${GPUS:-0}" -ge 2 ] && [ "$PYTESTS" = 1 ]; then
  log "two GPUs: a data-parallel train step on GPUs 0 and 1 against GPU 0 (FLOWJIT_REQUIRE_GPUS=2)"
  if ! (cd "$ROOT" && FLOWJIT_REQUIRE_GPU=1 FLOWJIT_REQUIRE_GPUS=2 FLOWJIT_REQUIRE_NCCL=1 \
        PYTHONPATH="$PYPKG:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}" \
        "$PY" -m pytest -q -rs -p no:cacheprovider tests/python/test_gpu.py -k two_gpus 2>&1 \
        | tee "$BUILD/two_gpu_tests.log"); then
    :
  fi
  if ! grep -qE '^[0-9]+ passed' "$BUILD/two_gpu_tests.log" \
     || grep -qE '[0-9]+ (failed|error|skipped)' "$BUILD/two_gpu_tests.log"; then
    STATUS=1
    log "two-GPU check FAILED (full log: $BUILD/two_gpu_tests.log)"
  fi
else
  log "two GPUs: skipped (${GPUS:-0} GPU(s) listed by nvidia-smi, or --no-python)"
fi

log "done in $(( $(date +%s) - START ))s"
if [ "$STATUS" != 0 ]; then fail "see above"; fi
log "all GPU checks passed"
