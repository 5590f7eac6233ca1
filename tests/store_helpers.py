"""What tests read back from a data directory's hidden-state store, through the store's own reader.

:func:`manifest_rows` parses the manifests with :meth:`eagle3ops.store.HiddenStateStore.scan_manifest` (the
parser resume and ``eagle3ops extract-status`` use) but keeps one entry per manifest *line*, so that "every row in
exactly one manifest line" is ``manifest_rows(d) == list(range(n))`` (a row recorded twice shows twice).
:func:`hs_files` is the samples' bytes by file name, for byte-identity checks between runs.
"""

from __future__ import annotations

from pathlib import Path

from eagle3ops.store import HiddenStateStore


def manifest_rows(data: Path, *, torn_ok: bool = False) -> list[int]:
    """The row index of every valid line of ``data``'s ``manifest-rank*.jsonl`` files, sorted, a row once per
    line that records it. A torn line (a run killed mid-append) fails the caller unless ``torn_ok``: pass it
    where a run was killed and its manifest has not been repaired by a re-run yet (or is read while a run
    writes it)."""
    scan = HiddenStateStore(data).scan_manifest()
    assert torn_ok or not scan.torn_lines, f"torn manifest lines: {scan.torn_lines}"
    twice = scan.duplicates()  # index -> number of lines, for the rows recorded more than once
    rows = sorted(i for i in scan.indices() for _ in range(twice.get(i, 1)))
    assert len(rows) == scan.lines, (rows, scan.lines)
    return rows


def hs_files(data: Path) -> dict[str, bytes]:
    """``hs_*.safetensors`` of ``data``'s store: file name -> bytes."""
    d = Path(data) / "hidden_states"
    return {p.name: p.read_bytes() for p in sorted(d.glob("hs_*.safetensors"))}
