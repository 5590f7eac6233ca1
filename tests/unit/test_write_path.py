"""The extraction writer's directory-fsync schemes (bench/write_path.py times them): per file (the default) and
one per batch (opt-in), both leaving only complete files under final names and manifest lines for every file.
The directory fsyncs are counted by wrapping the real ``fsync_dir`` (it still runs)."""

from __future__ import annotations

import pytest
import torch
from eagle3ops import extract, store
from eagle3ops.extract import SampleWriter, _Job
from eagle3ops.store import HiddenStateStore, load_sample


@pytest.mark.parametrize(("batch_dir_sync", "expected"), [(False, 6), (True, 2)])
def test_directory_fsyncs_per_file_or_per_batch(tmp_path, monkeypatch, batch_dir_sync, expected):
    calls = []
    real = store.fsync_dir

    def counting(path):
        calls.append(str(path))
        real(path)

    monkeypatch.setattr(store, "fsync_dir", counting)
    monkeypatch.setattr(extract, "fsync_dir", counting)
    s = HiddenStateStore(tmp_path)
    s.dir.mkdir(parents=True)
    w = SampleWriter(s, fsync=True, threads=1, batch_dir_sync=batch_dir_sync)
    w.start()
    states = torch.randn(6, 5, 4, 8).to(torch.bfloat16)
    for b in (0, 3):  # two batches of three samples
        idx = [b, b + 1, b + 2]
        w.submit(_Job(idx, [torch.arange(5)] * 3, [states[i] for i in idx], None))
    w.finish()
    s.close()
    assert len(calls) == expected and set(calls) == {str(s.dir)}
    assert sorted(s.scan_manifest().indices()) == list(range(6))
    for i in range(6):
        assert torch.equal(load_sample(s.path(i))["hidden_states"], states[i])
    assert not [p for p in s.dir.iterdir() if p.name.endswith(".tmp")]
