#!/usr/bin/env bash
# The GPU check, one command for a machine with an NVIDIA GPU and driver:
#   1. builds flowjit's C++ tests and the GPU benchmark (CMake + Ninja)
#   2. numerics: every GPU test kernel against the CPU backend on the GPU
#      (the Nvptx* gtests with FLOWJIT_REQUIRE_GPU=1: NvptxDevice.* runs the
#      whole suite of graphs, the seed's train step included, on the GPU and
#      compares with the CPU; skips become failures), plus the GPU-less ones
#      (ptxas for sm_80/sm_90, golden PTX, runtime, emulator)
#   3. benchmarks: matmul TFLOP/s against cuBLAS (same process, same
#      buffers), a fused elementwise chain against copy bandwidth, the seed's
#      train step; then the same workloads in PyTorch when torch has CUDA
# Exits 2 at once when there is no GPU, 1 when a step fails.
#
#   tools/gpu_check.sh [--quick] [--no-bench]
# Environment: FLOWJIT_GPU_BUILD_DIR (default build/gpu-check), JOBS.
# Figures go to $FLOWJIT_GPU_BUILD_DIR/gpu_bench.json and torch_bench.json.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD="${FLOWJIT_GPU_BUILD_DIR:-$ROOT/build/gpu-check}"
JOBS="${JOBS:-$(nproc)}"
QUICK=""
BENCH=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    --no-bench) BENCH=0 ;;
    *) echo "usage: $0 [--quick] [--no-bench]" >&2; exit 64 ;;
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
log "configuring in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWJIT_BUILD_PYTHON=OFF >"$BUILD.configure.log" 2>&1 \
  || { cat "$BUILD.configure.log"; fail "cmake configure"; }
log "building flowjit_tests with $JOBS jobs"
ninja -C "$BUILD" -j "$JOBS" flowjit_tests || fail "build"
log "building gpu_bench"
"${CXX:-g++}" -std=c++17 -O2 -I"$ROOT" -I"$BUILD/generated" -isystem "$("$LLVM_CONFIG" --includedir)" \
  "$ROOT/benchmarks/gpu_bench.cpp" \
  "$BUILD/libflowjit_jit.a" "$BUILD/libflowjit_codegen.a" "$BUILD/libflowjit_runtime.a" "$BUILD/libflowjit_ir.a" \
  -L"$("$LLVM_CONFIG" --libdir)" -lLLVM -Wl,-rpath,"$("$LLVM_CONFIG" --libdir)" -ltbb -ldl -lpthread \
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

# ---- 3. benchmarks
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

log "done in $(( $(date +%s) - START ))s"
if [ "$STATUS" != 0 ]; then fail "see above"; fi
log "all GPU checks passed"
