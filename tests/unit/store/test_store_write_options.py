"""The durable-write options of eagle3ops.store (streaming writeback, preallocation, fdatasync): same bytes, same
guarantee (temp file removed on any error, nothing under the final name), I/O errors never swallowed."""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys

import pytest
from eagle3ops.store import write as store

PAYLOAD = [os.urandom((1 << 20) + 3), b"", os.urandom(5), os.urandom((2 << 20) + 7)]


@pytest.fixture(autouse=True)
def _options_off(monkeypatch):
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 0)
    monkeypatch.setattr(store, "WRITEBACK_WAIT", False)
    monkeypatch.setattr(store, "PREALLOCATE", False)
    monkeypatch.setattr(store, "DATASYNC", False)


def _leftovers(d):
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("chunk", "wait", "prealloc", "datasync"),
    list(itertools.product([0, 1 << 20, 300_000], [False, True], [False, True], [False, True])),
)
def test_every_option_combination_writes_the_same_bytes(
    tmp_path, monkeypatch, chunk, wait, prealloc, datasync
):
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", chunk)
    monkeypatch.setattr(store, "WRITEBACK_WAIT", wait)
    monkeypatch.setattr(store, "PREALLOCATE", prealloc)
    monkeypatch.setattr(store, "DATASYNC", datasync)
    p = tmp_path / "hs_0.safetensors"
    n = store.atomic_write_bytes(p, PAYLOAD)
    assert n == sum(map(len, PAYLOAD)) == p.stat().st_size
    assert p.read_bytes() == b"".join(PAYLOAD)
    assert _leftovers(tmp_path) == []


def test_writeback_calls_cover_the_file_in_chunks(tmp_path, monkeypatch):
    calls = []
    real = store._sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range on this platform")

    def spy(fd, off, n, flags):
        calls.append((off, n, flags))
        real(fd, off, n, flags)

    monkeypatch.setattr(store, "_sync_file_range", lambda: spy)
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    monkeypatch.setattr(store, "WRITEBACK_WAIT", True)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    started = [(o, n) for o, n, f in calls if f == store._SYNC_FILE_RANGE_WRITE]
    waited = [(o, n) for o, n, f in calls if f == store._SYNC_FILE_RANGE_WAIT_ALL]
    assert started == [(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 1 << 20)]  # the tail is left to the fsync
    assert waited == started[:-1]


def test_writeback_io_error_is_raised_and_the_temp_removed(tmp_path, monkeypatch):
    def eio(fd, off, n, flags):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store, "_sync_file_range", lambda: eio)
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    with pytest.raises(OSError) as ei:
        store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert ei.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_writeback_unsupported_falls_back_to_plain_writes(tmp_path, monkeypatch):
    calls = []

    def einval(fd, off, n, flags):
        calls.append(off)
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(store, "_sync_file_range", lambda: einval)
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert calls == [0]  # tried once, then off for the rest of the file
    assert (tmp_path / "f").read_bytes() == b"".join(PAYLOAD)


def test_writeback_einval_after_the_first_call_is_raised(tmp_path, monkeypatch):
    real = store._sync_file_range()
    if real is None:
        pytest.skip("no sync_file_range on this platform")
    calls = []

    def second_fails(fd, off, n, flags):
        calls.append(flags)
        if len(calls) > 1:  # the first wait: an errno that would mean "unsupported" on a first call
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, off, n, flags)

    monkeypatch.setattr(store, "_sync_file_range", lambda: second_fails)
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    monkeypatch.setattr(store, "WRITEBACK_WAIT", True)
    with pytest.raises(OSError):
        store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert calls == [store._SYNC_FILE_RANGE_WRITE, store._SYNC_FILE_RANGE_WAIT_ALL]
    assert list(tmp_path.iterdir()) == []


def test_writeback_missing_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_sync_file_range", lambda: None)  # not Linux
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert (tmp_path / "f").read_bytes() == b"".join(PAYLOAD)


def test_preallocate_enospc_is_raised_before_any_write(tmp_path, monkeypatch):
    writes = []
    real_write = os.write

    def fallocate(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_libc_fn", lambda *a: fallocate)
    monkeypatch.setattr(store.os, "write", lambda fd, b: writes.append(len(b)) or real_write(fd, b))
    monkeypatch.setattr(store, "PREALLOCATE", True)
    with pytest.raises(OSError) as ei:
        store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert ei.value.errno == errno.ENOSPC
    assert writes == []
    assert list(tmp_path.iterdir()) == []


def test_preallocate_unsupported_is_skipped(tmp_path, monkeypatch):
    def fallocate(*args):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(store, "_libc_fn", lambda *a: fallocate)
    monkeypatch.setattr(store, "PREALLOCATE", True)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert (tmp_path / "f").read_bytes() == b"".join(PAYLOAD)


def test_datasync_syncs_the_data_file_with_fdatasync_and_the_directory_with_fsync(tmp_path, monkeypatch):
    if not hasattr(os, "fdatasync"):
        pytest.skip("no fdatasync on this platform")
    seen = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(store.os, "fsync", lambda fd: seen.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(store.os, "fdatasync", lambda fd: seen.append("fdatasync") or real_fdatasync(fd))
    monkeypatch.setattr(store, "DATASYNC", True)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD)
    assert seen == ["fdatasync", "fsync"]  # data file, then the directory after the rename


def test_no_fsync_ignores_the_options(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_sync_file_range", lambda: pytest.fail("writeback without fsync"))
    monkeypatch.setattr(store, "_libc_fn", lambda *a: pytest.fail("fallocate without fsync"))
    monkeypatch.setattr(store, "WRITEBACK_CHUNK", 1 << 20)
    monkeypatch.setattr(store, "PREALLOCATE", True)
    store.atomic_write_bytes(tmp_path / "f", PAYLOAD, fsync=False)
    assert (tmp_path / "f").read_bytes() == b"".join(PAYLOAD)


def test_env_vars_set_the_options():
    env = {
        **os.environ,
        "EAGLE3OPS_WRITEBACK_MIB": "8",
        "EAGLE3OPS_WRITEBACK_WAIT": "1",
        "EAGLE3OPS_PREALLOCATE": "1",
        "EAGLE3OPS_FDATASYNC": "1",
    }
    code = "from eagle3ops.store import write as s; print(s.WRITEBACK_CHUNK, s.WRITEBACK_WAIT, s.PREALLOCATE, s.DATASYNC)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(8 << 20), "True", "True", "True"]
    env = {k: v for k, v in env.items() if not k.startswith("EAGLE3OPS_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False", "False", "False"]  # all off by default
