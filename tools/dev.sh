#!/usr/bin/env bash
# flowjit developer entry points (the README's two commands use these):
#   tools/dev.sh train   set up everything, then train the seed MLP (3 epochs)
#   tools/dev.sh test    set up everything, then run all tests (ctest + pytest)
#   tools/dev.sh setup   install system and Python packages, build flowjit
#   tools/dev.sh bench   run the benchmarks (installs torch and jax first)
#   tools/dev.sh docs    build the documentation (Sphinx, warnings are errors)
#                        into build/docs/html
#   tools/dev.sh sanitize [pytest args]   ctest and pytest under ASan+UBSan (build/asan)
#   tools/dev.sh fuzz [targets]           build and run the libFuzzer targets (build/fuzz);
#                                         `fuzz programs`: the differential program fuzzer
# Python packages go into a virtual environment in the checkout
# ($FLOWJIT_VENV, default .venv), never into the system Python (PEP 668).
# Runs as root or as a user with sudo (for apt-get). openmpi-bin is for the
# launcher tests that start jobs with a real mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export FLOWJIT_BUILD_DIR="${FLOWJIT_BUILD_DIR:-$ROOT/build/dev}"
# ccache hits across clones in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
# The Python the virtual environment is made from (Debian's by default).
BASE_PY="${PYTHON:-python3}"
VENV="${FLOWJIT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
JOBS="${FLOWJIT_BUILD_JOBS:-$(nproc)}"

APT_PACKAGES="llvm-19-dev libtbb-dev libgloo-dev libturbojpeg0-dev libpng-dev dataset-fashion-mnist libgtest-dev cmake ninja-build ccache g++ python3-dev clang-format-19 openmpi-bin"

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[dev.sh]\033[0m error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "installing Debian packages needs root: run as root, install sudo, or install by hand: $*"
  fi
}

apt_install() {
  log "installing Debian packages: $*"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

install_apt() {
  local missing=()
  for p in $APT_PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

make_venv() {
  if [ -x "$PY" ] && "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    return 0
  fi
  command -v "$BASE_PY" >/dev/null 2>&1 || apt_install python3
  # Debian's python3 has venv without ensurepip until python3-venv is installed.
  if ! "$BASE_PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    local ver
    ver=$("$BASE_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    apt_install python3-venv "python$ver-venv"
  fi
  log "creating the virtual environment $VENV (from $("$BASE_PY" -c 'import sys; print(sys.executable)'))"
  rm -rf "$VENV"
  "$BASE_PY" -m venv "$VENV"
}

install_pip() {
  log "installing Python build and test requirements into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip
  "$PY" -m pip install -q --disable-pip-version-check "numpy>=1.22" "ml_dtypes>=0.2" "pybind11>=2.12" \
    "scikit-build-core>=0.10" pytest "ruff==0.17.*" hypothesis onnx onnxruntime pillow
}

build() {
  log "building flowjit (editable, CMake build dir: $FLOWJIT_BUILD_DIR)"
  # A build dir configured by another CMake or ninja (a deleted environment,
  # or a build from before scikit-build-core) is started afresh.
  local cache="$FLOWJIT_BUILD_DIR/CMakeCache.txt"
  if [ -f "$cache" ]; then
    local prog
    prog=$(sed -n 's/^CMAKE_MAKE_PROGRAM:[A-Z]*=//p' "$cache")
    if [ -n "$prog" ] && [ ! -x "$prog" ]; then
      log "dropping $FLOWJIT_BUILD_DIR: its ninja ($prog) is gone"
      rm -rf "$FLOWJIT_BUILD_DIR"
    fi
  fi
  FLOWJIT_BUILD_TESTS=ON CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation \
    -Cbuild-dir="$FLOWJIT_BUILD_DIR" -Ccmake.define.FLOWJIT_BUILD_TESTS=ON -e .
}

setup() { install_apt; make_venv; install_pip; build; }

# ---------------------------------------------------------------- tests

FAILED=()
SUMMARIES=()

# run_suite NAME CMD...: runs one suite, keeps going when it fails, and
# remembers the suite's own summary line (ctest's "N% tests passed", pytest's
# "== N passed in Ts ==").
run_suite() {
  local name=$1
  shift
  log "$name"
  local out rc=0
  out=$(mktemp)
  "$@" 2>&1 | tee "$out" || rc=$?
  local summary
  # pytest -q prints "N passed, M skipped in Ts" bare; without -q it is framed in "="s.
  summary=$(grep -E 'tests passed|tests failed|^=* ?[0-9]+ (passed|failed|error|skipped|deselected)|no tests ran' "$out" | tail -n 1 || true)
  [ -n "$summary" ] || summary="(no summary line; exit status $rc)"
  rm -f "$out"
  SUMMARIES+=("$(printf '%-44s %s %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" "$summary")")
  [ $rc -eq 0 ] || FAILED+=("$name")
}

# The developer habits CI holds: C++ formatted by the pinned clang-format,
# Python clean under ruff (pyproject.toml), the C++ layering. Also run by
# .pre-commit-config.yaml.
# Each check runs even when one before failed, and the function fails if any
# did (run_suite calls it on the left of `||`, where errexit is off).
lint() {
  log "lint: layering, clang-format-19, ruff"
  local rc=0
  "$PY" tools/check_layering.py || rc=1
  git ls-files '*.cpp' '*.h' '*.c' | xargs clang-format-19 --dry-run -Werror || rc=1
  "$VENV/bin/ruff" check python tests benchmarks examples tools || rc=1
  return $rc
}

# The API reference and guides (docs/), from the docstrings of the built
# package; any Sphinx or docutils warning fails the build, and so does a
# broken link. Each step runs even when one before failed, and the function
# fails if any did: run_suite calls it on the left of `||`, where bash's
# errexit (set -e) is off.
docs_build() {
  "$PY" -c 'import sphinx' 2>/dev/null ||
    "$PY" -m pip install -q --disable-pip-version-check "sphinx>=7,<10"
  local rc=0
  log "docs: sphinx -W into build/docs/html"
  # Into an empty folder: Sphinx leaves the pages of an earlier build there
  # (viewcode's source pages are not even rewritten), and the link check
  # would count them as the site.
  rm -rf build/docs/html
  "$PY" -m sphinx -E -W --keep-going -q -b html docs build/docs/html || rc=1
  # Every relative link, image and #anchor of the built pages and of the
  # Markdown pages users read leads somewhere; external URLs are checked for
  # their form only (no network here: the output counts them as not
  # fetched; tools/check_links.py --online fetches them).
  log "docs: link check (tools/check_links.py)"
  "$PY" tools/check_links.py build/docs/html README.md benchmarks/README.md docs/*.md || rc=1
  # The guides' testcode blocks and the >>> example of every public op's
  # docstring (each docstring in a fresh session, see docs/conf.py), run
  # and their printed output compared; a differing output fails the build.
  log "docs: sphinx -b doctest"
  "$PY" -m sphinx -E -W --keep-going -q -b doctest docs build/docs/doctest || rc=1
  [ $rc -eq 0 ] || { log "docs: failed (see above)"; return 1; }
  log "docs: open build/docs/html/index.html"
}

run_tests() {
  run_suite "lint" lint
  run_suite "docs (sphinx -W)" docs_build
  log "building the C++ tests"
  cmake --build "$FLOWJIT_BUILD_DIR" --target _C flowjit_tests -j "$JOBS"
  run_suite "ctest" bash -c "cd '$FLOWJIT_BUILD_DIR' && ctest --output-on-failure -j '$JOBS'"
  run_suite "pytest" "$PY" -m pytest -q -rs tests/python
  # The same numerics for code generated for a smaller x86-64 than this host
  # (FLOWJIT_CPU): AVX2+FMA on AVX-512 hosts, the SSE4.2 baseline without FMA
  # on others, so both kinds of CI host check both vector widths.
  local other=x86-64-v3
  grep -qw avx512f /proc/cpuinfo || other=x86-64-v2
  run_suite "pytest (FLOWJIT_CPU=$other)" env FLOWJIT_CPU=$other "$PY" -m pytest -q \
    tests/python/test_ops.py tests/python/test_ops_extra.py tests/python/test_conv.py \
    tests/python/test_autodiff.py tests/python/test_fusion.py tests/python/test_matmul_paths.py \
    tests/python/test_export.py
  run_suite "pytest (slow: end-to-end training)" "$PY" -m pytest -q -m slow tests/python
  log "summary"
  printf '  %s\n' "${SUMMARIES[@]}"
  if [ ${#FAILED[@]} -gt 0 ]; then
    die "failed: ${FAILED[*]}"
  fi
  log "all suites passed"
}

# ---------------------------------------------------------------- sanitizers

SAN_DIR="$ROOT/build/asan"
SAN_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined"
# vptr is off: LLVM is built without RTTI, so its classes have no type info to check.

# Tests that cannot run sanitized, with the reason (a ctest regex).
SAN_CTEST_SKIP='NvptxEmulated\.|NvptxMultiGpu\.'  # the SIMT emulator (both suites run kernels in it) switches stacks by hand; ASan cannot follow

# An ASan+UBSan build of the C++ tests and of the extension in build/asan;
# ctest under it, then pytest (arguments: what pytest runs, default
# tests/python) with the sanitizer runtimes preloaded into a Python of its
# own (build/asan/venv, where the editable install's import hook does not
# shadow the sanitized extension).
sanitize() {
  install_apt
  make_venv
  install_pip
  log "sanitize: building the C++ tests and the extension with ASan+UBSan in $SAN_DIR"
  local pkg="$SAN_DIR/pkg/flowjit"
  mkdir -p "$pkg"
  cmake -S "$ROOT" -B "$SAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_C_FLAGS="$SAN_FLAGS" -DCMAKE_CXX_FLAGS="$SAN_FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DFLOWJIT_BUILD_TESTS=ON -DFLOWJIT_PY_OUTPUT_DIR="$pkg" -DPython_EXECUTABLE="$PY" >/dev/null
  # (the build lists the tests by running them: no leak check there)
  ASAN_OPTIONS=detect_leaks=0 cmake --build "$SAN_DIR" --target _C flowjit_tests -j "$JOBS"
  # The package: the checkout's Python files next to the sanitized _C.
  local f
  for f in "$ROOT"/python/flowjit/*; do
    case "$(basename "$f")" in _C.*.so | __pycache__) continue ;; esac
    ln -sfn "$f" "$pkg/$(basename "$f")"
  done
  local sanpy="$SAN_DIR/venv/bin/python"
  if [ ! -x "$sanpy" ]; then
    "$BASE_PY" -m venv "$SAN_DIR/venv"
    "$sanpy" -m pip install -q --disable-pip-version-check "numpy>=1.22" "ml_dtypes>=0.2" pytest hypothesis
  fi
  local asan ubsan
  asan=$(g++ -print-file-name=libasan.so)
  ubsan=$(g++ -print-file-name=libubsan.so)
  local common="print_stacktrace=1:halt_on_error=1"
  export UBSAN_OPTIONS="$common"
  export FLOWJIT_CACHE_DIR="$SAN_DIR/cache"
  log "sanitize: skipped under the sanitizers: $SAN_CTEST_SKIP (the SIMT emulator's hand-made stack switches)"
  run_suite "ctest (ASan+UBSan)" bash -c "cd '$SAN_DIR' && ASAN_OPTIONS='$common:detect_leaks=1' ctest --output-on-failure -j '$JOBS' -E '$SAN_CTEST_SKIP'"
  # Python itself is not instrumented and keeps objects alive at exit: no
  # leak check there. PYTHONMALLOC=malloc lets ASan see every allocation.
  run_suite "pytest (ASan+UBSan)" env LD_PRELOAD="$asan:$ubsan" ASAN_OPTIONS="$common:detect_leaks=0" \
    PYTHONMALLOC=malloc PYTHONPATH="$SAN_DIR/pkg" "$sanpy" -m pytest -q -rs -p no:cacheprovider "${@:-tests/python}"
  log "summary"
  printf '  %s\n' "${SUMMARIES[@]}"
  [ ${#FAILED[@]} -eq 0 ] || die "failed: ${FAILED[*]}"
  log "clean under ASan+UBSan"
}

# ---------------------------------------------------------------- fuzzing

FUZZ_DIR="$ROOT/build/fuzz"
FUZZ_TARGETS="ir_parser cache_entry plan_text store_protocol"

# Builds the libFuzzer targets of tests/fuzz with clang-19 (ASan+UBSan) in
# build/fuzz and runs each for FLOWJIT_FUZZ_SECONDS (default 150) from the
# seed corpus kept in tests/fuzz/corpus/<target>; new inputs go to
# build/fuzz/corpus/<target>, crashes to build/fuzz/artifacts/. Arguments:
# the targets to run (default all). The checkpoint `meta` parser is Python:
# its fuzzer (tests/fuzz/checkpoint_meta.py) runs under atheris when it
# can be installed. `programs` is the differential program fuzzer
# (tests/fuzz/programs.py, Hypothesis): random jobs of the public API against
# a numpy reference, for FLOWJIT_FUZZ_SECONDS from seed FLOWJIT_FUZZ_SEED
# (default: random, printed); each finding is printed as a minimal pytest test.
fuzz() {
  local targets="${*:-$FUZZ_TARGETS checkpoint_meta programs}" t secs="${FLOWJIT_FUZZ_SECONDS:-150}"
  local native=()
  for t in $targets; do
    case "$t" in checkpoint_meta | programs) ;; *) native+=("$t") ;; esac
  done
  if [ ${#native[@]} -gt 0 ]; then
    command -v clang++-19 >/dev/null 2>&1 && [ -d /usr/lib/llvm-19/lib/clang/19/lib/linux ] ||
      apt_install clang-19 libclang-rt-19-dev
  fi
  install_apt
  make_venv
  install_pip
  if [ ${#native[@]} -gt 0 ]; then
    log "fuzz: building the targets with clang-19 in $FUZZ_DIR"
    cmake -S "$ROOT/tests/fuzz" -B "$FUZZ_DIR" -G Ninja -DCMAKE_CXX_COMPILER=clang++-19 \
      -DCMAKE_BUILD_TYPE=Fuzz >/dev/null
    cmake --build "$FUZZ_DIR" --target "${native[@]}" -j "$JOBS"
  fi
  mkdir -p "$FUZZ_DIR/artifacts"
  for t in $targets; do
    if [ "$t" = programs ]; then
      [ -f "$FLOWJIT_BUILD_DIR/CMakeCache.txt" ] || build
      # on the host's ISA and on the other vector width (as `dev.sh test` does)
      local seed="${FLOWJIT_FUZZ_SEED:-$RANDOM}" other=x86-64-v3
      grep -qw avx512f /proc/cpuinfo || other=x86-64-v2
      run_suite "fuzz programs (${secs} s, seed $seed)" "$PY" "$ROOT/tests/fuzz/programs.py" \
        --seconds "$secs" --seed "$seed"
      run_suite "fuzz programs (${secs} s, seed $((seed + 1)), FLOWJIT_CPU=$other)" "$PY" \
        "$ROOT/tests/fuzz/programs.py" --seconds "$secs" --seed "$((seed + 1))" --cpu "$other"
      continue
    fi
    mkdir -p "$FUZZ_DIR/corpus/$t"
    if [ "$t" = checkpoint_meta ]; then
      if ! "$PY" -c 'import atheris' 2>/dev/null; then
        "$PY" -m pip install -q --disable-pip-version-check atheris ||
          { log "fuzz: checkpoint_meta skipped: atheris (libFuzzer for Python) is not installable here"; continue; }
      fi
      run_suite "fuzz $t (${secs} s)" "$PY" "$ROOT/tests/fuzz/checkpoint_meta.py" \
        -max_total_time="$secs" -timeout=10 -artifact_prefix="$FUZZ_DIR/artifacts/$t-" \
        "$FUZZ_DIR/corpus/$t" "$ROOT/tests/fuzz/corpus/$t"
      continue
    fi
    run_suite "fuzz $t (${secs} s)" "$FUZZ_DIR/$t" -max_total_time="$secs" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/artifacts/$t-" \
      "$FUZZ_DIR/corpus/$t" "$ROOT/tests/fuzz/corpus/$t"
  done
  log "summary"
  printf '  %s\n' "${SUMMARIES[@]}"
  [ ${#FAILED[@]} -eq 0 ] || die "failed: ${FAILED[*]} (inputs in $FUZZ_DIR/artifacts)"
  log "no findings"
}

case "${1:-}" in
  setup) setup ;;
  lint) lint ;;
  docs) setup; docs_build ;;
  train) setup; shift; exec "$PY" examples/train_mnist.py "$@" ;;
  test) setup; run_tests ;;
  bench)
    setup
    "$PY" -m pip install -q --disable-pip-version-check torch jax jaxlib threadpoolctl || log "torch/jax not installable: their columns are skipped"
    exec "$PY" benchmarks/run_all.py ;;
  sanitize) shift; sanitize "$@" ;;
  fuzz) shift; fuzz "$@" ;;
  *) echo "usage: tools/dev.sh {setup|train|test|lint|bench|docs|sanitize [pytest args]|fuzz [targets]}" >&2; exit 2 ;;
esac
