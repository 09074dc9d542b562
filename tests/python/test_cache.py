"""The disk kernel cache: reuse across processes, concurrent writers, damage,
read-only directories, eviction, the off switch, and the flowjit-cache tool."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import _C
from flowjit.cache import cli
from flowjit.cache.store import Cache

# A small MLP train job run in fresh processes: prints what it compiled.
WORKER = textwrap.dedent('''
    import json, os, sys, time, warnings
    t_import = time.perf_counter()
    import numpy as np
    import flowjit as flow
    import flowjit.typing as tp

    barrier = os.environ.get("BARRIER")
    if barrier:  # wait (bounded) until every process of the group is ready
        os.makedirs(barrier, exist_ok=True)
        open(os.path.join(barrier, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(barrier)) < int(os.environ["BARRIER_N"]) and time.monotonic() < deadline:
            time.sleep(0.005)

    @flow.global_function(type="train")
    def mlp_train(x: tp.Numpy.Placeholder((32, 64)),
                  y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 128, activation=flow.nn.relu, name="h",
                              kernel_initializer=flow.truncated_normal(0.1))
        logits = flow.layers.dense(h, 10, name="o", kernel_initializer=flow.truncated_normal(0.1))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        first = mlp_train(x, y)
        t1 = time.perf_counter()
        second = mlp_train(x, y)
    job = mlp_train.compiled_jobs()[0]
    print(json.dumps({
        "first_call": t1 - t0, "codegen": job.seconds_codegen, "from_disk": job.from_disk_cache,
        "key": job.cache_key, "loss": [float(first.mean()), float(second.mean())],
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
''')


def _env(cache_dir, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLOWJIT_DEBUG", "FLOWJIT_DISABLE_CACHE", "FLOWJIT_CACHE_MAX_BYTES", "NO_COLOR")}
    env["FLOWJIT_CACHE_DIR"] = str(cache_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _worker(tmp_path):
    path = tmp_path / "worker.py"
    if not path.exists():
        path.write_text(WORKER)
    return path


def _run_worker(tmp_path, cache_dir, prefix=(), **extra):
    p = subprocess.run([*prefix, sys.executable, str(_worker(tmp_path))], env=_env(cache_dir, **extra),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def _entries(cache_dir):
    return {e.job: e for e in Cache(str(cache_dir)).entries()}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private cache directory for this test, in-process (compile_job reads
    the environment on every compile) and for subprocesses."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(d))
    for var in ("FLOWJIT_DISABLE_CACHE", "FLOWJIT_CACHE_MAX_BYTES", "FLOWJIT_DEBUG", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    return d


def _affine(shape, name="affine"):
    """A fresh predict job (a new JobFunction: its in-memory cache is empty)."""
    def affine(x: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        return x * 2.0 + 1.0
    affine.__name__ = name
    return flow.global_function(type="predict")(affine)


def _call_affine(shape, name="affine"):
    job = _affine(shape, name)
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    out = job(x)
    np.testing.assert_array_equal(out, x * 2 + 1)
    return job.compiled_jobs()[0]


def _cache_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, _C.CacheWarning)]


# ---------------------------------------------------------------- across processes

def test_second_process_loads_from_disk_and_compiles_nothing(tmp_path, cache_dir):
    cold, _ = _run_worker(tmp_path, cache_dir)
    warm, log = _run_worker(tmp_path, cache_dir, FLOWJIT_DEBUG=1)
    assert not cold["from_disk"] and warm["from_disk"]
    assert warm["key"] == cold["key"] and len(cold["key"]) == 64
    assert warm["loss"] == cold["loss"]  # the same code on the same initial variables
    assert warm["warnings"] == cold["warnings"] == []
    # Both the train job and the init job that fills its variables came from disk.
    assert re.search(r"\[flowjit\] mlp_train: disk cache hit .*" + cold["key"][:12], log), log
    assert re.search(r"\[flowjit\] mlp_train\.init: disk cache hit", log), log
    assert "llvm optimize" not in log and "llvm codegen" not in log
    # Loading is far cheaper than compiling (the hit path skips LLVM).
    assert warm["codegen"] < cold["codegen"] / 4, (cold, warm)
    assert warm["first_call"] < cold["first_call"], (cold, warm)
    entries = _entries(cache_dir)
    assert set(entries) == {"mlp_train", "mlp_train.init"}
    assert entries["mlp_train"].get("hits") == 1
    assert entries["mlp_train"].get("source") == "worker.py:16"


def test_four_processes_compiling_at_once_leave_one_good_entry(tmp_path, cache_dir):
    procs = [subprocess.Popen([sys.executable, str(_worker(tmp_path))],
                              env=_env(cache_dir, BARRIER=tmp_path / "barrier", BARRIER_N=4, FLOWJIT_DEBUG=1),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results, logs = [], ""
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
        logs += err
    # Per job: exactly one process published; each other one either lost the
    # race (kept the published entry) or arrived late enough to hit it.
    for job in ("mlp_train", "mlp_train.init"):
        tag = re.escape(f"[flowjit] {job}: disk cache ")
        published = len(re.findall(tag + r"store .* published in ", logs))
        lost = len(re.findall(tag + r"store .* already present", logs))
        hit = len(re.findall(tag + r"hit ", logs))
        assert published == 1 and published + lost + hit == 4, (job, published, lost, hit)
    assert len({r["key"] for r in results}) == 1
    assert all(r["loss"] == results[0]["loss"] for r in results)
    assert all(r["warnings"] == [] for r in results)
    entries = Cache(str(cache_dir)).entries()
    assert sorted(e.job for e in entries) == ["mlp_train", "mlp_train.init"]
    assert all(e.problems() == [] for e in entries)
    assert Cache(str(cache_dir)).staging() == []  # every losing writer cleaned up
    # The entry left behind is good for a fifth process.
    fifth, _ = _run_worker(tmp_path, cache_dir)
    assert fifth["from_disk"] and fifth["loss"] == results[0]["loss"]


# ---------------------------------------------------------------- damage

@pytest.mark.parametrize("damage", ["flip object bytes", "truncate plan", "garbage metadata"])
def test_damaged_entry_warns_drops_and_recompiles(cache_dir, damage):
    first = _call_affine((64,))
    assert not first.from_disk_cache
    entry = Cache(str(cache_dir)).find(first.cache_key)
    if damage == "flip object bytes":
        with open(os.path.join(entry.path, "object.o"), "rb") as f:
            data = bytearray(f.read())
        for i in range(200, 216):
            data[i] ^= 0xFF
        expected = "object.o fails its SHA-256 checksum"
        name, content = "object.o", bytes(data)
    elif damage == "truncate plan":
        with open(os.path.join(entry.path, "plan.txt"), "rb") as f:
            plan = f.read()
        expected = "plan.txt has"
        name, content = "plan.txt", plan[: len(plan) // 2]
    else:
        expected = "meta.json does not parse"
        name, content = "meta.json", b'{"format": 1, "key": '
    with open(os.path.join(entry.path, name), "wb") as f:
        f.write(content)
    with pytest.warns(_C.CacheWarning) as record:
        again = _call_affine((64,))  # a new JobFunction: only the disk could help
    (msg,) = _cache_warnings(record)
    assert f"disk-cache entry {first.cache_key[:12]} of job 'affine'" in msg
    assert expected in msg and "removed and the job is recompiled" in msg
    assert not again.from_disk_cache and again.warnings == [msg]
    assert again.cache_key == first.cache_key
    # Recompiled and stored anew: the next process-or-job loads it.
    third = _call_affine((64,))
    assert third.from_disk_cache and third.warnings == []
    assert Cache(str(cache_dir)).find(first.cache_key).problems() == []


# ---------------------------------------------------------------- unwritable

def _drop_root_override():
    """Root ignores permission bits; setpriv drops the override so that a
    read-only directory is read-only for the worker too."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("running as root without setpriv: cannot make a directory read-only for the test")
    return (setpriv, "--bounding-set", "-dac_override,-dac_read_search")


def _make_read_only(path):
    for root, dirs, files in os.walk(path):
        for n in files:
            os.chmod(os.path.join(root, n), 0o444)
        os.chmod(root, 0o555)


def _make_writable(path):
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)


def test_read_only_cache_degrades_to_memory_with_one_warning(tmp_path, cache_dir):
    prefix = _drop_root_override()
    cache_dir.mkdir()
    _make_read_only(cache_dir)
    try:
        r, _ = _run_worker(tmp_path, cache_dir, prefix)
        # Two compiles (the init job and the train job), one warning.
        assert len(r["warnings"]) == 1, r["warnings"]
        (w,) = r["warnings"]
        assert w.startswith("CacheWarning: flowjit: the kernel cache in ")
        assert "cannot be written" in w and "kept in memory only" in w
        assert not r["from_disk"] and r["loss"][0] > 0
        assert os.listdir(cache_dir) == []
    finally:
        _make_writable(cache_dir)


def test_read_only_populated_cache_still_hits(tmp_path, cache_dir):
    prefix = _drop_root_override()
    cold, _ = _run_worker(tmp_path, cache_dir)
    _make_read_only(cache_dir)
    try:
        warm, _ = _run_worker(tmp_path, cache_dir, prefix)
        assert warm["from_disk"] and warm["warnings"] == [] and warm["loss"] == cold["loss"]
    finally:
        _make_writable(cache_dir)


def test_cache_path_that_cannot_be_a_directory_degrades(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(_C.CacheWarning, match="cannot be written") as record:
        job = _call_affine((8,))
        other = _call_affine((9,))  # warned once per directory, not per compile
    assert len(_cache_warnings(record)) == 1
    assert not job.from_disk_cache and not other.from_disk_cache


# ---------------------------------------------------------------- bound, off switch

def test_eviction_keeps_the_cache_under_its_bound_least_recently_used_first(cache_dir, monkeypatch):
    a = _call_affine((256,))
    size = Cache(str(cache_dir)).find(a.cache_key).bytes
    monkeypatch.setenv("FLOWJIT_CACHE_MAX_BYTES", str(int(size * 2.5)))  # room for two
    b = _call_affine((512,))
    time.sleep(0.01)  # distinct last_used stamps (ordering only; nothing waits on it)
    assert _call_affine((256,)).from_disk_cache  # a hit: `a` is now the most recently used
    c = _call_affine((1024,))
    keys = {e.key for e in Cache(str(cache_dir)).entries()}
    assert keys == {a.cache_key, c.cache_key}, (a.cache_key[:8], b.cache_key[:8], c.cache_key[:8])
    assert sum(e.bytes for e in Cache(str(cache_dir)).entries()) <= size * 2.5

    monkeypatch.setenv("FLOWJIT_CACHE_MAX_BYTES", "1")  # smaller than any entry: keeps the newest
    d = _call_affine((2048,))
    assert {e.key for e in Cache(str(cache_dir)).entries()} == {d.cache_key}


def test_unparsable_max_bytes_warns_and_uses_default(cache_dir, monkeypatch):
    monkeypatch.setenv("FLOWJIT_CACHE_MAX_BYTES", "plenty")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _call_affine((12,))
    # Warned once per process (no other test sets a bad bound).
    (msg,) = _cache_warnings(record)
    assert "FLOWJIT_CACHE_MAX_BYTES is not a byte size (e.g. 1073741824, 512M, 2G)" in msg
    assert len(Cache(str(cache_dir)).entries()) == 1
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _call_affine((13,))
    assert _cache_warnings(record) == []


def test_disable_cache_bypasses_the_disk(cache_dir, monkeypatch):
    monkeypatch.setenv("FLOWJIT_DISABLE_CACHE", "1")
    job = _call_affine((16,))
    assert job.cache_key == "" and not job.from_disk_cache
    assert not cache_dir.exists()
    monkeypatch.setenv("FLOWJIT_DISABLE_CACHE", "0")
    assert _call_affine((16,)).cache_key != ""
    assert cache_dir.exists()


# ---------------------------------------------------------------- flowjit-cache

@pytest.fixture
def populated(cache_dir):
    """Three entries: one job at two signatures, and a train job with its init job."""
    small = _call_affine((4, 3), "scale")
    big = _call_affine((8, 3), "scale")

    @flow.global_function(type="train")
    def fit(x: tp.Numpy.Placeholder((8, 3))) -> tp.Numpy:
        w = flow.get_variable("fit-w", shape=(3,), initializer=flow.constant_initializer(0.5))
        loss = flow.math.reduce_mean(flow.math.square(x * w - 1.0), axis=1)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    fit(np.ones((8, 3), np.float32))
    return {"small": small, "big": big, "fit": fit.compiled_jobs()[0], "dir": cache_dir}


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_list(populated, capsys):
    rc, out, _ = _cli(capsys, "list")
    assert rc == 0
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["KEY", "JOB", "SIGNATURE", "TARGET"] and header[-3:] == ["LAST", "USED", "COMPILE"]
    assert sorted(ln.split()[1] for ln in lines[1:-1]) == ["fit", "fit.init", "scale", "scale"]
    scale_rows = [ln for ln in lines[1:-1] if " scale " in ln]
    assert len(scale_rows) == 2
    assert any("f32[4,3]" in ln for ln in scale_rows) and any("f32[8,3]" in ln for ln in scale_rows)
    assert all(re.search(r"\d+(\.\d)? KiB", ln) for ln in lines[1:-1])
    assert all(re.search(r"\d+ s ago", ln) for ln in lines[1:-1])
    assert populated["small"].cache_key[:12] in out
    # Aligned: the JOB column starts at the same offset on every row.
    starts = {ln.index(ln.split()[1]) for ln in lines[1:-1]}
    assert len(starts) == 1
    assert lines[-1].startswith("4 entries, ") and str(populated["dir"]) in lines[-1]
    assert "\x1b[" not in out  # not a terminal: no color

    rc, out, _ = _cli(capsys, "list", "--job", "scale")
    assert rc == 0 and len(out.splitlines()) == 4
    rc, out, _ = _cli(capsys, "list", "--job", "fit*", "--target", "x86_64")
    assert rc == 0 and out.splitlines()[-1].startswith("2 entries")
    rc, out, _ = _cli(capsys, "list", "--target", "no-such-cpu")
    assert rc == 0 and out.startswith("no cache entries matching the filters")


def test_cli_list_json(populated, capsys):
    rc, out, _ = _cli(capsys, "list", "--json")
    assert rc == 0
    data = json.loads(out)
    assert len(data) == 4
    by_key = {d["key"]: d for d in data}
    small = by_key[populated["small"].cache_key]
    assert small["job"] == "scale" and small["inputs"] == ["f32[4,3]"]
    assert small["signature"] == "Numpy:float32(4, 3)"
    assert small["source"].startswith("test_cache.py:")
    assert small["target"] == _C.build_info()["target"]
    info = _C.build_info()
    assert small["build_id"] == f"{info['build_id']}+{info['binary_id']}"
    assert small["hits"] == 0 and small["compile_seconds"] > 0 and small["bytes"] > small["object_bytes"] > 0
    assert set(small["files"]) == {"object.o", "plan.txt", "ir_traced.txt", "ir_optimized.txt",
                                   "fusion.txt", "kernels.txt", "llvm.ll"}
    assert "created_iso" in small and small["arena_bytes"] >= 0


def test_cli_show(populated, capsys):
    key = populated["fit"].cache_key
    rc, out, _ = _cli(capsys, "show", key[:8])
    assert rc == 0
    assert re.search(r"^job\s+fit$", out, re.M) and re.search(r"^source\s+test_cache\.py:\d+$", out, re.M)
    assert re.search(r"^signature\s+Numpy:float32\(8, 3\)$", out, re.M)
    assert re.search(r"^arena\s+", out, re.M) and re.search(r"^kernels\s+\d+$", out, re.M)
    for title in ("IR before optimization", "IR after optimization", "fusion plan", "kernels"):
        assert f"---- {title}" in out
    assert "graph fit {" in out and 'variable() {dtype=f32, name="fit-w"' in out
    assert "---- LLVM IR" not in out  # big: only on request
    assert re.search(r"^k\d+_\w+: .*-> var:fit-w", out, re.M)  # which values in which kernel

    rc, out, _ = _cli(capsys, "show", key[:8], "--llvm", "--no-header")
    assert rc == 0 and out.startswith("---- LLVM IR") and "define " in out and "---- IR" not in out


def test_cli_show_asm(populated, capsys):
    rc, out, _ = _cli(capsys, "show", populated["small"].cache_key[:10], "--asm", "--no-header")
    assert rc == 0 and out.startswith("---- assembly")
    assert re.search(r"^\s+\.text", out, re.M) and re.search(r"^\s+ret", out, re.M)


def test_cli_show_bad_keys(populated, capsys):
    rc, _, err = _cli(capsys, "show", "zz")
    assert rc == 2 and "not a key or key prefix" in err
    rc, _, err = _cli(capsys, "show", "")
    assert rc == 2
    missing = next(c for c in "0123456789abcdef"
                   if not any(e.key.startswith(c) for e in Cache(str(populated["dir"])).entries()))
    rc, _, err = _cli(capsys, "show", missing)
    assert rc == 2 and f"no cache entry has a key starting with '{missing}'" in err


def _reseal(cache_dir, entry, name, data):
    """Replaces one file of an entry and signs it again with the cache's key,
    as a writer would (jit/cache.cpp mac_message): only the code checks can
    tell."""
    import hashlib
    import hmac
    with open(os.path.join(entry.path, name), "wb") as f:
        f.write(data)
    meta_path = os.path.join(entry.path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    message = f"flowjit-cache-mac 1\n{entry.key}\n" + "".join(
        f"{n} {i['bytes']} {i['sha256']}\n" for n, i in sorted(meta["files"].items()))
    with open(os.path.join(cache_dir, "hmac.key"), "rb") as f:
        meta["mac"] = hmac.new(f.read(), message.encode(), "sha256").hexdigest()
    with open(meta_path, "w") as f:
        json.dump(meta, f)


def test_cli_verify_checks_the_code_as_the_compiler_would(populated, capsys):
    """Checksums and MAC intact, code broken: the plan that the compiler's
    deserializer refuses, a kernel count meta.json does not hold, an object
    that is neither ELF nor a container (jit::inspect_cache_entry)."""
    root = str(populated["dir"])
    cache = Cache(root)
    small, big = cache.find(populated["small"].cache_key), cache.find(populated["big"].cache_key)
    plan = small.read("plan.txt")
    _reseal(root, small, "plan.txt", plan.replace(b"flowjit-plan 2", b"flowjit-plan 9"))
    _reseal(root, big, "object.o", b"\0" * 64)
    problems = {e.key: e.problems() for e in Cache(root).entries()}
    assert len(problems[small.key]) == 1 and "plan" in problems[small.key][0], problems[small.key]
    assert problems[big.key] == ["its object.o is not an ELF object or an object container"]
    rc, out, _ = _cli(capsys, "verify")
    assert rc == 1 and out.splitlines()[-1] == "verified 4 entries: 2 ok, 2 bad"
    # what the compiler does with them: damaged, recompiled
    with pytest.warns(_C.CacheWarning, match="damaged"):
        _call_affine((8, 3), "scale")


def test_cli_stats(populated, capsys):
    _call_affine((4, 3), "scale")  # one hit
    rc, out, _ = _cli(capsys, "stats")
    assert rc == 0
    assert re.search(r"^entries\s+4$", out, re.M)
    assert re.search(r"^hits\s+1$", out, re.M)
    assert re.search(r"^total size\s+[\d.]+ KiB of 1\.0 GiB", out, re.M)
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if re.match(r"^(scale|fit|fit\.init)\s", ln)}
    assert rows["scale"][1] == "2" and rows["scale"][-3] == "1"  # entries, hits
    assert rows["fit"][1] == "1"
    rc, out, _ = _cli(capsys, "stats", "--json")
    d = json.loads(out)
    assert d["entries"] == 4 and d["hits"] == 1 and d["jobs"]["scale"]["entries"] == 2


def test_cli_verify(populated, capsys):
    rc, out, _ = _cli(capsys, "verify")
    assert rc == 0 and out.strip() == "verified 4 entries: 4 ok, 0 bad"
    entry = Cache(str(populated["dir"])).find(populated["big"].cache_key)
    with open(os.path.join(entry.path, "kernels.txt"), "ab") as f:
        f.write(b"tampered\n")
    rc, out, _ = _cli(capsys, "verify")
    assert rc == 1
    assert f"BAD  {entry.key[:12]}  scale: kernels.txt has" in out
    assert out.splitlines()[-1] == "verified 4 entries: 3 ok, 1 bad"
    rc, out, _ = _cli(capsys, "verify", "--remove")
    assert rc == 0 and "(removed)" in out
    assert not os.path.exists(entry.path)
    rc, out, _ = _cli(capsys, "verify")
    assert rc == 0 and out.strip() == "verified 3 entries: 3 ok, 0 bad"


def test_cli_gc(populated, capsys):
    cache = Cache(str(populated["dir"]))
    newest = max(cache.entries(), key=lambda e: e.get("last_used", 0))
    rc, out, _ = _cli(capsys, "gc", "--max-bytes", str(newest.bytes), "--dry-run")
    assert rc == 0 and out.count("would remove ") == 4 and len(cache.entries()) == 4
    rc, out, _ = _cli(capsys, "gc", "--max-bytes", str(newest.bytes))
    assert rc == 0 and out.splitlines()[-1].startswith("removed 3 entries")
    assert [e.key for e in cache.entries()] == [newest.key]
    rc, _, err = _cli(capsys, "gc", "--max-bytes", "a lot")
    assert rc == 2 and "not a byte size" in err


def test_cli_clear(populated, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    rc, _, err = _cli(capsys, "clear")
    assert rc == 2 and "pass --yes" in err
    assert len(Cache(str(populated["dir"])).entries()) == 4
    rc, out, _ = _cli(capsys, "clear", "--yes")
    assert rc == 0 and out.startswith("removed 4 entries (")
    assert Cache(str(populated["dir"])).entries() == []
    rc, out, _ = _cli(capsys, "list")
    assert out.startswith("no cache entries in ")


def test_cli_diff_explains_a_recompile(populated, capsys):
    a, b = populated["small"].cache_key, populated["big"].cache_key
    rc, out, _ = _cli(capsys, "diff", a[:10], b[:10])
    assert rc == 0
    assert "differs in: signature, traced IR, optimized IR, kernels\n" in out
    assert "  outputs: f32[4,3] vs f32[8,3]" in out
    assert "---- traced IR diff" in out and "---- optimized IR diff" not in out
    assert "signature: Numpy:float32(4, 3) vs Numpy:float32(8, 3)" in out
    assert re.search(r"^-  %x = parameter\(\) .*shape=\[4,3\]", out, re.M)
    assert re.search(r"^\+  %x = parameter\(\) .*shape=\[8,3\]", out, re.M)
    assert "why a recompile: the placeholder shapes or dtypes changed" in out
    assert "target" not in out.split("differs in:")[1].splitlines()[0]
    rc, out, _ = _cli(capsys, "diff", a[:10], b[:10], "--full")
    assert "---- optimized IR diff" in out and "---- kernels diff" in out
    rc, out, _ = _cli(capsys, "diff", a[:10], populated["fit"].cache_key[:10])
    assert rc == 0 and "job name: 'scale' vs 'fit'" in out and "these are different jobs" in out


def test_cli_color_only_when_asked_and_never_with_no_color(populated, capsys, monkeypatch):
    rc, out, _ = _cli(capsys, "--color", "always", "list")
    assert "\x1b[1m" in out
    monkeypatch.setenv("NO_COLOR", "1")
    rc, out, _ = _cli(capsys, "--color", "always", "list")
    assert "\x1b[" not in out


def test_cli_as_module_and_console_script(populated):
    env = _env(populated["dir"])
    p = subprocess.run([sys.executable, "-m", "flowjit.cache", "stats"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and re.search(r"^entries\s+4$", p.stdout, re.M), p.stderr
    # The script of this interpreter's installation (a venv's bin is not on
    # PATH when its python is run directly), else whatever PATH has.
    exe = shutil.which("flowjit-cache", path=os.path.dirname(sys.executable)) or shutil.which("flowjit-cache")
    if exe is None:
        pytest.skip("the flowjit-cache console script is not installed next to python or on PATH")
    p = subprocess.run([exe, "list", "--job", "fit"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.splitlines()[-1].startswith("1 entry, "), p.stderr
