"""tests/store_helpers.py: ``manifest_rows`` keeps a row once per manifest line (what "each row in exactly one
manifest line" asserts in the multi-host tests) and refuses a torn line unless told. Real stores, real files."""

from __future__ import annotations

import pytest
from eagle3ops.store import HiddenStateStore, ManifestEntry
from store_helpers import hs_files, manifest_rows


def _append(data, rank, rows):
    s = HiddenStateStore(data, rank=rank)
    s.append_manifest([ManifestEntry(i, 5, 10, rank=rank) for i in rows])
    s.close()


def test_a_row_in_two_manifest_lines_shows_twice(tmp_path):
    assert manifest_rows(tmp_path) == []  # no store yet
    _append(tmp_path, 0, [3, 0])
    _append(tmp_path, 1, [1, 2])
    assert manifest_rows(tmp_path) == [0, 1, 2, 3]
    _append(tmp_path, 1, [3])  # row 3 again, in another rank's manifest
    assert manifest_rows(tmp_path) == [0, 1, 2, 3, 3]


def test_a_torn_line_fails_unless_allowed(tmp_path):
    _append(tmp_path, 0, [0, 1])
    with open(HiddenStateStore(tmp_path).manifest_path(), "a") as f:
        f.write('{"i":2,"n":7,"b":1')  # kill -9 mid-append
    with pytest.raises(AssertionError, match="torn manifest lines"):
        manifest_rows(tmp_path)
    assert manifest_rows(tmp_path, torn_ok=True) == [0, 1]


def test_hs_files_reads_the_samples_only(tmp_path):
    d = tmp_path / "hidden_states"
    d.mkdir()
    (d / "hs_1.safetensors").write_bytes(b"one")
    (d / "hs_2.safetensors.tmp").write_bytes(b"partial")
    _append(tmp_path, 0, [1])
    assert hs_files(tmp_path) == {"hs_1.safetensors": b"one"}
