"""Hostile and careless use (issue #16): planted, foreign and odd cache files,
symlinked dumps, sessions cleared under running jobs, out-of-range labels,
overflowing shapes, empty inputs, re-entrant tracing, exit with daemon
threads, stale checkpoint staging and the rendezvous store."""
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit import _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(**extra):
    env = dict(os.environ)
    # The flowjit this run imported (the checkout's, or the sanitized
    # build's package under tools/dev.sh sanitize), not always the checkout's.
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(flow.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg, os.path.join(ROOT, "tools")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for var in ("FLOWJIT_DEBUG", "FLOWJIT_DISABLE_CACHE", "FLOWJIT_DUMP_DIR"):
        env.pop(var, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _affine(name="affine", n=64):
    def affine(x: tp.Numpy.Placeholder((n,))) -> tp.Numpy:
        return x * 2.0 + 1.0
    affine.__name__ = name
    return flow.global_function(type="predict")(affine)


def _call_affine(name="affine"):
    """A fresh job called once (its in-memory cache is empty: only the disk can help)."""
    job = _affine(name)
    x = np.arange(64, dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = job(x)
    np.testing.assert_array_equal(out, x * 2 + 1)
    return job.compiled_jobs()[0], [str(w.message) for w in caught
                                     if issubclass(w.category, _C.CacheWarning)]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(d))
    for var in ("FLOWJIT_DISABLE_CACHE", "FLOWJIT_CACHE_MAX_BYTES", "FLOWJIT_DEBUG", "FLOWJIT_DUMP_DIR"):
        monkeypatch.delenv(var, raising=False)
    return d


def _entry_dir(cache, key):
    return os.path.join(str(cache), key[:2], key)


# ---------------------------------------------------------------- disk-cache trust

def test_cache_directories_and_files_are_private_whatever_the_umask(cache_dir):
    old = os.umask(0)
    try:
        first, _ = _call_affine()
    finally:
        os.umask(old)
    entry = _entry_dir(cache_dir, first.cache_key)
    for d in (cache_dir, cache_dir / "tmp", os.path.dirname(entry), entry):
        assert os.stat(d).st_mode & 0o777 == 0o700, d
    for name in os.listdir(entry):
        assert os.stat(os.path.join(entry, name)).st_mode & 0o777 == 0o600, name
    assert os.stat(cache_dir / "hmac.key").st_mode & 0o777 == 0o600


def test_entry_copied_from_another_cache_is_recompiled_not_loaded(tmp_path, cache_dir, monkeypatch):
    theirs = tmp_path / "theirs"
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(theirs))
    planted, _ = _call_affine()
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(cache_dir))
    mine, _ = _call_affine("other")  # makes our cache and its key
    assert planted.cache_key != mine.cache_key
    dst = _entry_dir(cache_dir, planted.cache_key)
    os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
    shutil.copytree(_entry_dir(theirs, planted.cache_key), dst)
    again, msgs = _call_affine()
    assert not again.from_disk_cache
    assert len(msgs) == 1 and "not authenticated by this cache's key" in msgs[0], msgs
    # Recompiled and stored under our key: the next job loads it silently.
    third, msgs = _call_affine()
    assert third.from_disk_cache and msgs == []
    from flowjit.cache.store import Cache
    assert Cache(str(cache_dir)).find(planted.cache_key).problems() == []


def test_group_writable_cache_root_is_refused_with_one_warning(cache_dir):
    cache_dir.mkdir(mode=0o700)
    os.chmod(cache_dir, 0o770)
    first, msgs = _call_affine()
    assert not first.from_disk_cache
    assert len(msgs) == 1 and "is not used because" in msgs[0] and "writable by its group" in msgs[0]
    second, msgs = _call_affine("affine2")
    assert msgs == []  # once per directory
    assert os.listdir(cache_dir) == []  # nothing written into it


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_entry_owned_by_another_user_is_not_loaded(cache_dir):
    first, _ = _call_affine()
    entry = _entry_dir(cache_dir, first.cache_key)
    os.chown(os.path.join(entry, "object.o"), 12345, 12345)
    again, msgs = _call_affine()
    assert not again.from_disk_cache
    assert len(msgs) == 1 and "owned by uid 12345" in msgs[0] and "compiled in memory" in msgs[0]
    assert os.path.exists(entry)  # not ours to remove
    again, msgs = _call_affine()
    assert msgs == []  # warned once


FIFO_WORKER = textwrap.dedent('''
    import sys, warnings, numpy as np
    import flowjit as flow, flowjit.typing as tp
    @flow.global_function(type="predict")
    def affine(x: tp.Numpy.Placeholder((64,))) -> tp.Numpy:
        return x * 2.0 + 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = affine(np.ones(64, np.float32))
    assert (out == 3).all()
    print("|".join(str(w.message) for w in caught))
''')


@pytest.mark.parametrize("odd", ["fifo", "link to a device", "link to a file"])
def test_fifo_or_link_in_an_entry_neither_hangs_the_job_nor_the_tool(tmp_path, cache_dir, odd):
    first, _ = _call_affine()
    entry = _entry_dir(cache_dir, first.cache_key)
    target = os.path.join(entry, "object.o")
    os.unlink(target)
    if odd == "fifo":
        os.mkfifo(target, 0o600)
    elif odd == "link to a device":
        os.symlink("/dev/zero", target)
    else:
        os.symlink(os.path.join(entry, "plan.txt"), target)
    script = tmp_path / "w.py"
    script.write_text(FIFO_WORKER)
    p = subprocess.run([sys.executable, str(script)], env=_env(FLOWJIT_CACHE_DIR=cache_dir),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "is not loaded because" in p.stdout, p.stdout
    for cmd in (["verify"], ["list"], ["stats"]):
        q = subprocess.run([sys.executable, "-m", "flowjit.cache", "--dir", str(cache_dir)] + cmd,
                           env=_env(), capture_output=True, text=True, timeout=60)
        assert q.returncode in (0, 1), (cmd, q.stderr)
        if cmd == ["verify"]:
            assert "BAD" in q.stdout and ("not a regular file" in q.stdout or "symbolic link" in q.stdout), q.stdout


def test_non_utf8_cache_path_and_entry_text_warn_never_raise(tmp_path, monkeypatch):
    odd = os.fsencode(str(tmp_path)) + b"/cache-\xff\xfe"
    os.mkdir(odd, 0o700)
    os.chmod(odd, 0o777)  # so that a warning quotes the path
    monkeypatch.setitem(os.environb, b"FLOWJIT_CACHE_DIR", odd)
    first, msgs = _call_affine()
    assert len(msgs) == 1 and "\\xff\\xfe" in msgs[0], msgs
    assert "\\xff" in first.warnings[0]
    # A (self-made, authentic) entry whose text is not UTF-8 is damage.
    os.chmod(odd, 0o700)
    second, _ = _call_affine("nonutf8")
    entry = os.path.join(odd, os.fsencode(second.cache_key[:2]), os.fsencode(second.cache_key))
    from flowjit.cache.store import Cache
    e = Cache(os.fsdecode(odd)).find(second.cache_key)
    assert e.problems() == []
    plan = os.path.join(entry, b"plan.txt")
    with open(plan, "rb") as f:
        data = f.read()
    data = data.replace(b"job nonutf8", b"job \xff\xfeutf8")
    import hashlib, hmac, json
    meta_path = os.path.join(entry, b"meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["files"]["plan.txt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # the MAC's message (jit/cache.cpp mac_message): the entry re-signed as a writer with the key would
    message = f"flowjit-cache-mac 1\n{second.cache_key}\n" + "".join(
        f"{name} {info['bytes']} {info['sha256']}\n" for name, info in sorted(meta["files"].items()))
    with open(os.path.join(odd, b"hmac.key"), "rb") as f:
        secret = f.read()
    meta["mac"] = hmac.new(secret, message.encode(), "sha256").hexdigest()
    with open(plan, "wb") as f:
        f.write(data)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    again, msgs = _call_affine("nonutf8")
    assert not again.from_disk_cache
    assert len(msgs) == 1 and "not UTF-8" in msgs[0], msgs


# ---------------------------------------------------------------- FLOWJIT_DUMP_DIR

def test_dump_dir_never_follows_a_planted_link(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWJIT_DISABLE_CACHE", "1")
    first = tmp_path / "first"
    monkeypatch.setenv("FLOWJIT_DUMP_DIR", str(first))
    _affine("dumped")(np.zeros(64, np.float32))
    names = sorted(os.listdir(first))
    assert names and all(n.startswith("dumped.") for n in names)
    # Someone plants links under the predictable names of the next dump.
    planted = tmp_path / "planted"
    planted.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for n in names:
        os.symlink(victim, planted / n)
    monkeypatch.setenv("FLOWJIT_DUMP_DIR", str(planted))
    flow.clear_default_session()
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent('''
            import numpy as np, flowjit as flow, flowjit.typing as tp
            @flow.global_function(type="predict")
            def dumped(x: tp.Numpy.Placeholder((64,))) -> tp.Numpy:
                return x * 2.0 + 1.0
            dumped(np.zeros(64, np.float32))
        ''')], env=_env(FLOWJIT_DUMP_DIR=planted, FLOWJIT_DISABLE_CACHE=1), capture_output=True,
        text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "precious\n"
    assert "FLOWJIT_DUMP_DIR: cannot write" in p.stderr and "link" in p.stderr
    # A dump of our own from an earlier compile is replaced, not refused.
    monkeypatch.setenv("FLOWJIT_DUMP_DIR", str(first))
    _affine("dumped")(np.zeros(64, np.float32))
    assert sorted(os.listdir(first)) == names


# ---------------------------------------------------------------- clear_default_session vs running jobs

CLEAR_RACE = textwrap.dedent('''
    import sys, threading, numpy as np
    import flowjit as flow, flowjit.typing as tp

    @flow.global_function(type="predict")
    def scaled(x: tp.Numpy.Placeholder((256, 256))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(256, 256), initializer=flow.constant_initializer(1.0))
        return flow.matmul(x, w) + flow.math.reduce_sum(w) * 0.0

    x = np.ones((256, 256), np.float32)
    stop = threading.Event()
    counts = {"ok": 0, "refused": 0}
    failures = []

    def runner():
        for _ in range(150):
            if stop.is_set():
                break
            try:
                out = scaled(x)
            except RuntimeError as e:
                if "clear_default_session" not in str(e):
                    failures.append(repr(e))
                counts["refused"] += 1
                continue
            if not np.array_equal(out, np.full((256, 256), 256.0, np.float32)):
                failures.append("wrong result %r" % out[0, :4])
            counts["ok"] += 1

    threads = [threading.Thread(target=runner) for _ in range(3)]
    for t in threads:
        t.start()
    import time
    for _ in range(150):  # bounded: clears while the runners call
        if not any(t.is_alive() for t in threads):
            break
        flow.clear_default_session()
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a runner hangs"
    assert not failures, failures[:3]
    print("ok", counts)
''')


def test_clear_default_session_while_other_threads_run_jobs(tmp_path):
    # In a subprocess: a use-after-free shows as a signal, not as a test that
    # takes the whole run down.
    script = tmp_path / "race.py"
    script.write_text(CLEAR_RACE)
    for _ in range(3):
        p = subprocess.run([sys.executable, str(script)], env=_env(FLOWJIT_DISABLE_CACHE=1),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
        assert p.stdout.startswith("ok"), p.stdout


# ---------------------------------------------------------------- sizes that overflow int64

def _predict(f):
    return flow.global_function(type="predict")(f)


@pytest.mark.parametrize("case", ["fill bytes", "fill elements", "zero extent", "variable", "broadcast"])
def test_shapes_that_overflow_int64_are_a_clear_error_while_tracing(case):
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        if case == "fill bytes":
            return flow.math.reduce_sum(flow.constant(1.0, shape=(1, 2**62))) + x
        if case == "fill elements":
            return flow.math.reduce_sum(flow.constant(1.0, shape=(2**32, 2**32))) + x
        if case == "zero extent":  # 0 elements, but the strides reach 2^124
            return flow.math.reduce_sum(flow.constant(1.0, shape=(0, 2**62, 2**62))) + x
        if case == "variable":
            w = flow.get_variable("w", shape=(2**40, 2**40), initializer=flow.zeros_initializer())
            return x + flow.math.reduce_sum(w)
        big = flow.constant(1.0, shape=(2**31, 1))
        return flow.math.reduce_sum(big * flow.constant(1.0, shape=(1, 2**31))) + x
    with pytest.raises(ValueError) as e:
        _predict(job)(np.zeros(4, np.float32))
    msg = str(e.value)
    assert "is too large" in msg and "overflow" in msg, msg
    op = {"variable": "variable", "broadcast": "mul"}.get(case, "fill")
    assert f"{op}: the result" in msg, msg
    assert {"fill bytes": "4611686018427387904", "fill elements": "4294967296,4294967296",
            "zero extent": "0,4611686018427387904", "variable": "1099511627776",
            "broadcast": "2147483648,2147483648"}[case] in msg, msg


# ---------------------------------------------------------------- empty inputs

def test_reduce_mean_of_an_empty_list_numpy_is_nan_like_numpy():
    @flow.global_function(type="predict")
    def mean(x: tp.ListNumpy.Placeholder((8, 3))) -> tp.Numpy:
        return flow.math.reduce_mean(x)

    @flow.global_function(type="predict")
    def total(x: tp.ListNumpy.Placeholder((8, 3))) -> tp.Numpy:
        return flow.math.reduce_sum(x)

    empty = [np.zeros((0, 3), np.float32)]
    assert np.isnan(mean(empty))
    assert total(empty) == 0
    assert mean([np.ones((2, 3), np.float32)]) == 1


# ---------------------------------------------------------------- re-entry, exit, stale staging

def test_a_job_that_calls_itself_while_traced_raises_instead_of_deadlocking():
    @flow.global_function(type="predict")
    def rec(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        rec(np.zeros(4, np.float32))
        return x + 1.0

    result = {}

    def call():
        try:
            rec(np.zeros(4, np.float32))
        except RuntimeError as e:
            result["error"] = str(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the recursive trace deadlocked"
    assert "called itself while it was being traced" in result.get("error", ""), result


DAEMON_EXIT = textwrap.dedent('''
    import threading, time, numpy as np
    import flowjit as flow, flowjit.typing as tp
    @flow.global_function(type="predict")
    def f(x: tp.Numpy.Placeholder((256, 256))) -> tp.Numpy:
        return flow.matmul(x, x) + 1.0
    x = np.ones((256, 256), np.float32)
    f(x)
    def loop():
        while True:
            f(x)
    for _ in range(4):
        threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.2)
    print("exiting")
''')


def test_daemon_threads_calling_a_job_at_interpreter_exit_exit_cleanly(tmp_path):
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON_EXIT)
    for _ in range(3):
        p = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0 and "terminate called" not in p.stderr, (p.returncode, p.stderr[-2000:])
        assert p.stdout.strip() == "exiting"


def test_a_save_cleans_staging_directories_that_killed_saves_left(tmp_path):
    parent = tmp_path / "ckpts"
    parent.mkdir()
    # A killed save of an older flowjit (no pid, old), one of a dead process,
    # and one of a live process (this test's parent: still saving).
    old = parent / ".model.0123456789ab.saving"
    dead = parent / ".model.999999999-0123456789ab.saving"
    live = parent / f".model.{os.getppid()}-0123456789ab.saving"
    for d in (old, dead, live):
        (d / "w").mkdir(parents=True)
        (d / "w" / "out").write_bytes(b"\0" * 1024)
    os.utime(old, (1, 1))
    other = parent / "keep.saving"  # not a staging name
    other.mkdir()
    flow.checkpoint.save(str(parent / "model2"), {"w": np.ones(3, np.float32)})
    assert not old.exists() and not dead.exists()
    assert live.exists() and other.exists()
    assert sorted(os.listdir(parent)) == sorted([live.name, other.name, "model2"])
