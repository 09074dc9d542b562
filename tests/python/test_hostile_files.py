"""Files that someone else may have written, read as hostile (issue [fuzz]):
cache entries as the flowjit-cache tool reads them (wrong types, deep nesting,
terminal escapes, a job name that is a path, IR nothing authenticated) and
checkpoints (links into another owner's files, sizes that overflow)."""
import json
import os

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp
from flowjit.cache import cli
from flowjit.cache.store import Cache, clean


@pytest.fixture
def one_entry(tmp_path, monkeypatch):
    """A cache holding one authenticated entry; returns (cache dir, entry path, key)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FLOWJIT_CACHE_DIR", str(d))
    for var in ("FLOWJIT_DISABLE_CACHE", "FLOWJIT_CACHE_MAX_BYTES", "FLOWJIT_DEBUG"):
        monkeypatch.delenv(var, raising=False)

    @flow.global_function(type="predict")
    def hostile_probe(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x * 3.0

    np.testing.assert_array_equal(hostile_probe(np.ones(4, np.float32)), np.full(4, 3.0, np.float32))
    (entry,) = Cache(str(d)).entries()
    assert entry.meta is not None and entry.authenticated()
    return d, entry.path, entry.key


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _edit_meta(path, **fields):
    meta_path = os.path.join(path, "meta.json")
    meta = json.load(open(meta_path))
    meta.update(fields)
    with open(meta_path, "w") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("field,value", [("job", ["a", "list"]), ("hits", "many"), ("inputs", [1, 2]),
                                         ("files", []), ("created", -5), ("num_kernels", True)])
@pytest.mark.parametrize("command", [["list"], ["show", "{key}"], ["stats"], ["verify"], ["gc", "--dry-run"],
                                     ["list", "--json"], ["show", "{key}", "--all"], ["diff", "{key}", "{key}"]])
def test_wrong_types_in_meta_json_are_a_damaged_entry_not_a_traceback(one_entry, capsys, field, value, command):
    _, path, key = one_entry
    _edit_meta(path, **{field: value})
    rc, out, err = _cli(capsys, *[a.format(key=key[:12]) for a in command])
    assert "Traceback" not in out + err
    assert rc in (0, 1, 2)
    (entry,) = Cache(os.environ["FLOWJIT_CACHE_DIR"]).entries()
    assert entry.meta is None and field in entry.error


def test_deeply_nested_meta_json_is_a_damaged_entry(one_entry, capsys):
    _, path, key = one_entry
    with open(os.path.join(path, "meta.json"), "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    rc, out, err = _cli(capsys, "verify")
    assert rc == 1 and "nested too deeply" in out and "Traceback" not in out + err


def test_terminal_escapes_in_an_entry_are_printed_escaped(one_entry, capsys):
    _, path, key = one_entry
    _edit_meta(path, job="evil\x1b]0;pwned\x07\x1b[2J", source="x\x9by.py")
    for argv in (["list"], ["show", key[:12]], ["verify"], ["stats"]):
        rc, out, err = _cli(capsys, "--color", "never", *argv)
        assert "\x1b" not in out + err and "\x07" not in out + err and "\x9b" not in out + err, argv
    rc, out, _ = _cli(capsys, "--color", "never", "list", "--wide")
    assert "evil\\x1b]0;pwned\\x07" in out
    assert clean("a\tb\nc\x00") == "a\tb\nc\\x00"


@pytest.mark.parametrize("job", ["../../escaped", "/tmp/abs/escaped", ".hidden", "a/b\x1b"])
def test_show_dot_default_name_never_leaves_the_current_directory(one_entry, capsys, tmp_path, monkeypatch, job):
    _, path, key = one_entry
    _edit_meta(path, job=job)
    work = tmp_path / "work" / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("PATH", "")  # no `dot`: only the .dot file is written
    rc, out, err = _cli(capsys, "show", key[:12], "--dot")
    assert rc == 0, err
    written = os.listdir(work)
    assert len(written) == 1 and written[0].endswith(f"-{key[:12]}.dot") and not written[0].startswith(".")
    assert not (tmp_path / "work" / "escaped-" ).exists() and not os.path.exists("/tmp/abs")


def test_show_dot_does_not_write_through_a_link(one_entry, capsys, tmp_path, monkeypatch):
    _, path, key = one_entry
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "graph.dot")
    rc, _, err = _cli(capsys, "show", key[:12], "--dot", "graph.dot")
    assert rc == 2 and "symbolic link" in err
    assert victim.read_text() == "precious"


def test_asm_of_an_entry_whose_ir_nothing_authenticates_is_not_made(one_entry, capsys):
    _, path, key = one_entry
    # Replace the IR and fix its checksum, as someone who can write the entry could:
    # the MAC no longer matches, so the tool must not hand the IR to LLVM.
    import hashlib
    bad_ir = b"define void @f() {\n  ret i32 0\n}\n"
    with open(os.path.join(path, "llvm.ll"), "wb") as f:
        f.write(bad_ir)
    meta = json.load(open(os.path.join(path, "meta.json")))
    meta["files"]["llvm.ll"] = {"bytes": len(bad_ir), "sha256": hashlib.sha256(bad_ir).hexdigest()}
    json.dump(meta, open(os.path.join(path, "meta.json"), "w"))
    rc, out, err = _cli(capsys, "--color", "never", "show", key[:12], "--asm")
    assert rc == 1 and "not authenticated" in out


def test_cache_dir_that_is_a_file_and_odd_sizes_are_clear_errors(tmp_path, capsys, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, out, err = _cli(capsys, "--dir", str(f), "list")
    assert rc == 2 and "is not a directory" in err and "Traceback" not in err
    rc, out, err = _cli(capsys, "--dir", str(tmp_path / "c"), "gc", "--max-bytes", "9" * 400)
    assert rc == 2 and "too large" in err
    monkeypatch.setenv("FLOWJIT_CACHE_MAX_BYTES", "0")
    (tmp_path / "c").mkdir()
    rc, out, err = _cli(capsys, "--dir", str(tmp_path / "c"), "stats")
    assert rc == 0 and "total size" in out


# ---------------------------------------------------------------- checkpoints

@pytest.fixture
def saved(tmp_path):
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def holds_w(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(2.0))
        return x * w

    holds_w(np.ones(3, np.float32))
    path = tmp_path / "ck"
    flow.checkpoint.save(str(path))
    yield path
    flow.clear_default_session()


def test_checkpoint_data_file_that_is_a_link_is_refused(saved, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(np.arange(3, dtype=np.float32).tobytes())  # the reader's private file, same size
    os.remove(saved / "w" / "out")
    os.symlink(secret, saved / "w" / "out")
    with pytest.raises(flow.checkpoint.CheckpointError, match="'w'.*symbolic link"):
        flow.checkpoint.get(str(saved))


def test_checkpoint_variable_directory_that_is_a_link_is_refused(saved, tmp_path):
    other = tmp_path / "elsewhere"
    os.rename(saved / "w", other)
    os.symlink(other, saved / "w")
    with pytest.raises(flow.checkpoint.CheckpointError, match="symbolic link"):
        flow.checkpoint.get(str(saved))


def test_checkpoint_meta_with_overflowing_dims_names_the_variable(saved):
    (saved / "w" / "meta").write_text("shape { dim: 9223372036854775807 dim: 9223372036854775807 }\n"
                                      "data_type: kFloat\n")
    with pytest.raises(flow.checkpoint.CheckpointError, match="'w'.*too large"):
        flow.checkpoint.get(str(saved))


def test_assembly_of_ir_that_parses_but_is_invalid_is_an_error_not_a_crash():
    from flowjit import _C
    ir = ("define i32 @f(i32 %a) {\nentry:\n  br label %b\nb:\n  ret i32 %x\n"
          "c:\n  %x = add i32 %a, 1\n  br label %b\n}\n")
    with pytest.raises(ValueError, match="not valid"):
        _C.assembly_from_ir(ir)
