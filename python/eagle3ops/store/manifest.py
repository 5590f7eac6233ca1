"""The manifests: ``hidden_states/manifest-rank{r}.jsonl``, one JSON line per finished sample, appended only after
its file is renamed into place (so a line always names a complete file); a torn last line is ignored."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.store.checksum import content_hash
from eagle3ops.store.errors import StoreError


@dataclass(frozen=True)
class ManifestEntry:
    """One finished sample: ``i`` index, ``n`` seq_len, ``b`` file size in bytes, ``r`` rank, and the content
    checksum of the whole file when the writer computed one: ``h`` xxh3-64 (new lines) or ``c`` crc32 (older)."""

    index: int
    seq_len: int
    nbytes: int
    crc32: int | None = None
    rank: int = 0
    xxh3: int | None = None
    ctime_ns: int | None = None  # the file's st_ctime_ns right after its rename (``t``)

    def to_line(self) -> str:
        d = {"i": self.index, "n": self.seq_len, "b": self.nbytes, "r": self.rank}
        if self.crc32 is not None:
            d["c"] = self.crc32
        if self.xxh3 is not None:
            d["h"] = self.xxh3
        if self.ctime_ns is not None:
            d["t"] = self.ctime_ns
        return json.dumps(d, separators=(",", ":")) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> ManifestEntry:
        return cls(
            int(d["i"]), int(d["n"]), int(d["b"]), d.get("c"), int(d.get("r", 0)), d.get("h"), d.get("t")
        )

    @property
    def checksums(self) -> dict:
        out = {}
        if self.xxh3 is not None:
            out["h"] = self.xxh3
        if self.crc32 is not None:
            out["c"] = self.crc32
        return out


def _ctime_ns(path) -> int | None:
    try:
        return os.stat(path).st_ctime_ns
    except OSError:
        return None


def written_entry(
    index: int, seq_len: int, nbytes: int, payload, checksum: bool, rank: int, path
) -> ManifestEntry:
    """The manifest entry of a file just renamed into place: size, content checksum, inode change time."""
    t = _ctime_ns(path)
    if not checksum:
        return ManifestEntry(index, seq_len, nbytes, None, rank, None, t)
    kind, value = content_hash(payload)
    if kind == "h":
        return ManifestEntry(index, seq_len, nbytes, None, rank, value, t)
    return ManifestEntry(index, seq_len, nbytes, value, rank, None, t)


@dataclass
class ManifestScan:
    """Finished samples recorded in the manifests. ``entries`` (index -> ManifestEntry) is built on first use:
    resume planning needs only :meth:`indices`, and building 100k entry objects was half its time."""

    torn_lines: list[str] = field(default_factory=list)  # "file:line" of ignored partial lines
    lines: int = 0  # valid lines read (duplicates included)
    _parsed: dict[int, ManifestEntry] = field(default_factory=dict, repr=False)
    _pending: list[list[dict]] = field(default_factory=list, repr=False)  # validated rows, file order
    _all_indices: list[list[int]] = field(default_factory=list, repr=False)  # every line's index, file order

    def duplicates(self) -> dict[int, int]:
        """Index -> number of lines, for every index recorded more than once (older runs that wrote a row
        twice, e.g. two runs on one directory). The last line wins everywhere; a rewrite keeps only it."""
        if self.lines == len(self.indices()):
            return {}
        from collections import Counter

        c = Counter(i for chunk in self._all_indices for i in chunk)
        return {i: n for i, n in sorted(c.items()) if n > 1}

    @property
    def entries(self) -> dict[int, ManifestEntry]:
        self._materialise()
        return self._parsed

    def rows(self) -> dict[int, dict]:
        """Index -> the winning manifest line as a dict (``i``, ``n``, ``b``, ``r``, optional ``h``/``c``), without
        building entry objects (what the disk check reads: 10x cheaper than :attr:`entries` at 100k lines)."""
        out: dict[int, dict] = {}
        for e in self._parsed.values():
            out[e.index] = {
                "i": e.index,
                "n": e.seq_len,
                "b": e.nbytes,
                "r": e.rank,
                "h": e.xxh3,
                "c": e.crc32,
                "t": e.ctime_ns,
            }
        for rows in self._pending:  # later files win, as in _materialise (pending rows come after _parsed)
            for d in rows:
                out[d["i"]] = d
        return out

    def indices(self) -> set[int]:
        """Indices of every finished sample (no entry objects built)."""
        out = set(self._parsed)
        for rows in self._pending:
            out.update(d["i"] for d in rows)
        return out

    def _materialise(self) -> None:
        for rows in self._pending:
            for d in rows:
                self._parsed[d["i"]] = ManifestEntry(
                    d["i"], d["n"], d["b"], d.get("c"), d.get("r", 0), d.get("h"), d.get("t")
                )
        self._pending.clear()


def parse_manifest_file(path: Path, scan: ManifestScan) -> None:
    with open(path, "rb") as f:
        data = f.read()
    # Fast path (one C-level json parse of the whole file instead of one json.loads per line; the gain:
    # docs/performance.md, "Resume planning"); any torn or odd line falls back to the line-by-line path.
    body = data.rstrip(b"\n")
    if body and data.endswith(b"\n") and b"\n\n" not in body:
        try:
            rows = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
            ok = all(
                type(d["i"]) is int
                and type(d["n"]) is int
                and type(d["b"]) is int
                and type(d.get("r", 0)) is int
                for d in rows
            )
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            scan._pending.append(rows)
            scan.lines += len(rows)
            scan._all_indices.append([d["i"] for d in rows])
            return
    scan._materialise()  # keep file order: a later file's line wins
    lines = data.split(b"\n")
    # the last element is b"" when the file ends in a newline; anything else is a torn tail
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        complete = lineno < len(lines)  # followed by a newline
        try:
            d = json.loads(raw)
            entry = ManifestEntry.from_dict(d)
        except (ValueError, KeyError, TypeError) as e:
            if complete and lineno < len(lines) - 1:
                raise StoreError(
                    f"{path}:{lineno}: corrupt manifest line in the middle of the file ({e}). "
                    "Move the file aside and re-run: files not in a manifest are re-validated by header."
                ) from e
            scan.torn_lines.append(f"{path}:{lineno}")
            continue
        scan._parsed[entry.index] = entry
        scan.lines += 1
        scan._all_indices.append([entry.index])
