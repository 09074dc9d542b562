#!/usr/bin/env bash
# flowjit developer entry points (the README's two commands use these):
#   tools/dev.sh train   set up everything, then train the seed MLP (3 epochs)
#   tools/dev.sh test    set up everything, then run all tests (ctest + pytest)
#   tools/dev.sh setup   install system and Python packages, build flowjit
#   tools/dev.sh bench   run the benchmarks (installs torch and jax first)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export FLOWJIT_BUILD_DIR="${FLOWJIT_BUILD_DIR:-$ROOT/build/dev}"
# ccache hits across clones in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
PY="${PYTHON:-python3}"

APT_PACKAGES="llvm-19-dev libtbb-dev libgloo-dev dataset-fashion-mnist libgtest-dev cmake ninja-build ccache g++ python3-dev"

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*"; }

install_apt() {
  local missing=()
  for p in $APT_PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
}

install_pip() {
  log "installing Python build and test requirements"
  "$PY" -m pip install -q --disable-pip-version-check "numpy>=1.22" "pybind11>=2.12" pytest setuptools wheel
}

build() {
  log "building flowjit (CMake build dir: $FLOWJIT_BUILD_DIR)"
  FLOWJIT_BUILD_TESTS=1 "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation -e .
}

setup() { install_apt; install_pip; build; }

run_tests() {
  log "layering of the C++ folders"
  "$PY" tools/check_layering.py
  log "building the C++ tests"
  cmake --build "$FLOWJIT_BUILD_DIR" --target flowjit_tests -j "$(nproc)"
  log "ctest"
  (cd "$FLOWJIT_BUILD_DIR" && ctest --output-on-failure -j "$(nproc)")
  log "pytest"
  "$PY" -m pytest -q -rs tests/python
  # The same numerics for code generated for a smaller x86-64 than this host
  # (FLOWJIT_CPU): AVX2+FMA on AVX-512 hosts, the SSE4.2 baseline without FMA
  # on others, so both kinds of CI host check both vector widths.
  local other=x86-64-v3
  grep -qw avx512f /proc/cpuinfo || other=x86-64-v2
  log "pytest (code generated for FLOWJIT_CPU=$other)"
  FLOWJIT_CPU=$other "$PY" -m pytest -q tests/python/test_ops.py tests/python/test_ops_extra.py \
    tests/python/test_conv.py tests/python/test_autodiff.py tests/python/test_fusion.py
  log "pytest (slow: end-to-end training to accuracy)"
  "$PY" -m pytest -q -m slow tests/python
}

case "${1:-}" in
  setup) setup ;;
  train) setup; shift; exec "$PY" examples/train_mnist.py "$@" ;;
  test) setup; run_tests ;;
  bench)
    setup
    "$PY" -m pip install -q --disable-pip-version-check torch jax jaxlib threadpoolctl || log "torch/jax not installable: their columns are skipped"
    exec "$PY" benchmarks/run_all.py ;;
  *) echo "usage: tools/dev.sh {setup|train|test|bench}" >&2; exit 2 ;;
esac
