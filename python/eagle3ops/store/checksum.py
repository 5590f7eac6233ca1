"""Content checksums of sample files: xxh3-64 (``h`` in a manifest line) where the ``xxhash`` package is
installed, crc32 (``c``) otherwise; over the bytes a writer holds, or re-read from disk."""

from __future__ import annotations

import os
import zlib


def crc32(payload) -> int:
    crc = 0
    for part in payload if isinstance(payload, (list, tuple)) else [payload]:
        crc = zlib.crc32(part, crc)
    return crc


def xxh3():
    """A new xxh3-64 hasher, or None where the ``xxhash`` package (a dependency of ``datasets``) is missing."""
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_64()


def content_hash(payload) -> tuple[str, int]:
    """``("h", xxh3-64)`` of ``payload`` (bytes or a list of buffers, hashed back to back without joining), or
    ``("c", crc32)`` without xxhash. xxh3 releases the GIL and is the faster of the two (figures:
    docs/performance.md, "Issue 16: the content checksum costs"): the writer threads compute it over the bytes
    they already hold."""
    h = xxh3()
    if h is None:
        return "c", crc32(payload)
    for part in payload if isinstance(payload, (list, tuple)) else [payload]:
        h.update(part)
    return "h", h.intdigest()


def file_hashes(path: str | os.PathLike, kinds: set[str], on_bytes=None, chunk: int = 8 << 20) -> dict:
    """Re-read ``path`` once and return ``{kind: value}`` for ``kinds`` (``"h"`` xxh3-64, ``"c"`` crc32);
    ``on_bytes(n)`` is called per chunk read (progress)."""
    h = xxh3() if "h" in kinds else None
    crc = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            part = view[:n]
            if h is not None:
                h.update(part)
            if "c" in kinds:
                crc = zlib.crc32(part, crc)
            if on_bytes is not None:
                on_bytes(n)
    out = {}
    if h is not None:
        out["h"] = h.intdigest()
    if "c" in kinds:
        out["c"] = crc
    return out
