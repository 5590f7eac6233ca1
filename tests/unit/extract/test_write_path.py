"""The extraction writer's sync schemes (bench/write_path.py times them): a directory fsync per file, one per
batch, and batch sync (the default: all of a batch's files written, their writeback started, then fsynced and
renamed in order, one directory fsync): all leave only complete files under final names and manifest lines for every file.
The fsyncs are counted by wrapping the real calls (they still run); the disk-full case is a real OSError(ENOSPC)
raised by a wrapped ``os.write`` on the second file, as a full disk would."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from eagle3ops import durable, store
from eagle3ops.extract import writer as extract_writer
from eagle3ops.extract.writer import SampleWriter, WriterJob
from eagle3ops.store import HiddenStateStore, load_sample
from eagle3ops.store import hidden_states as store_hidden_states
from eagle3ops.store import write as store_write


@pytest.mark.parametrize(
    ("batch_dir_sync", "batch_sync", "expected"), [(False, False, 6), (True, False, 2), (False, True, 2)]
)
def test_directory_fsyncs_per_file_or_per_batch(tmp_path, monkeypatch, batch_dir_sync, batch_sync, expected):
    calls = []
    real = durable.fsync_dir

    def counting(path):
        calls.append(str(path))
        real(path)

    for mod in (store_write, store_hidden_states, extract_writer):  # every module of the write path
        monkeypatch.setattr(mod, "fsync_dir", counting)
    s = HiddenStateStore(tmp_path)
    s.dir.mkdir(parents=True)
    w = SampleWriter(s, fsync=True, threads=1, batch_dir_sync=batch_dir_sync, batch_sync=batch_sync)
    w.start()
    states = torch.randn(6, 5, 4, 8).to(torch.bfloat16)
    for b in (0, 3):  # two batches of three samples
        idx = [b, b + 1, b + 2]
        w.submit(WriterJob(idx, [torch.arange(5)] * 3, [states[i] for i in idx], None))
    w.finish()
    s.close()
    assert len(calls) == expected and set(calls) == {str(s.dir)}
    assert sorted(s.scan_manifest().indices()) == list(range(6))
    for i in range(6):
        assert torch.equal(load_sample(s.path(i))["hidden_states"], states[i])
    assert not [p for p in s.dir.iterdir() if p.name.endswith(".tmp")]


def test_batch_sync_fsyncs_every_file_before_its_rename(tmp_path, monkeypatch):
    """atomic_write_many: every temp file is written before the first fsync (the whole batch in flight), and each
    file's fsync comes before its own rename; the directory is fsynced once, after the last rename."""
    events = []
    real_fsync, real_replace, real_open = os.fsync, os.replace, os.open
    fds = {}

    def opening(path, *a, **k):
        fd = real_open(path, *a, **k)
        fds[fd] = os.path.basename(path)
        events.append(("open", fds[fd]))
        return fd

    def syncing(fd):
        events.append(("fsync", fds[fd]))
        real_fsync(fd)

    def replacing(src, dst):
        events.append(("rename", os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "fsync", syncing)
    monkeypatch.setattr(os, "replace", replacing)
    sizes = store.atomic_write_many([(tmp_path / f"f{i}", [b"a" * 10, b"b" * i]) for i in range(3)])
    assert sizes == [10, 11, 12]
    tmps = [e[1] for e in events if e[0] == "rename"]
    assert len(tmps) == 3 and all(t.endswith(".tmp") for t in tmps)
    assert events == (
        [("open", t) for t in tmps]
        + [x for t in tmps for x in (("fsync", t), ("rename", t))]
        + [("open", tmp_path.name), ("fsync", tmp_path.name)]
    )
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(3)] == [b"a" * 10 + b"b" * i for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2"]


def test_batch_sync_disk_full_leaves_no_temp_file_and_names_the_file(tmp_path, monkeypatch):
    """ENOSPC on the batch's second file: no temp file is left, no final name exists for any file of the batch
    (none was renamed: renames come only after every file is written), no manifest line; the error the
    extraction raises names the file and says what to do; the writer's earlier batch is intact."""
    s = HiddenStateStore(tmp_path)
    s.dir.mkdir(parents=True)
    states = torch.randn(4, 5, 4, 8).to(torch.bfloat16)
    w = SampleWriter(s, fsync=True, threads=1, batch_sync=True)
    w.start()
    w.submit(WriterJob([0], [torch.arange(5)], [states[0]], None))
    w.finish()
    real_write, opened = os.write, []
    real_open = os.open

    def opening(path, *a, **k):
        fd = real_open(path, *a, **k)
        opened.append(fd)
        return fd

    def full(fd, data):
        if len(opened) >= 2 and fd == opened[1]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "write", full)
    w = SampleWriter(s, fsync=True, threads=1, batch_sync=True)
    w.start()
    w.submit(WriterJob([1, 2, 3], [torch.arange(5)] * 3, [states[i] for i in (1, 2, 3)], None))
    with pytest.raises(
        store.DiskSpaceError, match=r"disk full while writing .*hs_2\.safetensors.*re-run"
    ) as ei:
        w.finish()
    monkeypatch.undo()
    # the failing file's own size (all samples here have the same shape as hs_0, which is on disk)
    assert f"({store.human_bytes(s.path(0).stat().st_size)} sample)" in str(ei.value)
    s.close()
    assert sorted(p.name for p in s.dir.iterdir() if not p.name.startswith("manifest")) == [
        "hs_0.safetensors"
    ]
    assert sorted(s.scan_manifest().indices()) == [0]
    assert torch.equal(load_sample(s.path(0))["hidden_states"], states[0])
