"""A ``torch.save`` file's tensors as metadata, without torch: its zip directory (at the end of the file), the pickle
of the saved object read by an unpickler that knows only tensors, storages and plain containers, and one tensor's
bytes on request. What an adoption probes 20,000 files with (``torch.load(mmap=True)`` cost 2.6 ms a file here,
this a fraction of it: docs/performance.md, "Adopting a dump").

Format (PyTorch's zip serialisation, written uncompressed): members ``<archive>/data.pkl`` (the object; every
tensor a ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` call whose storage is a persistent
id ``("storage", <dtype>Storage, key, location, numel)``) and ``<archive>/data/<key>`` (the storage's bytes).
"""

from __future__ import annotations

import os
import pickle
import struct
from collections import OrderedDict
from dataclasses import dataclass

ITEMSIZE = {
    "BFloat16Storage": ("bfloat16", 2),
    "HalfStorage": ("float16", 2),
    "FloatStorage": ("float32", 4),
    "DoubleStorage": ("float64", 8),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "Float8_e4m3fnStorage": ("float8_e4m3fn", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
}
SMALL = 1 << 20  # a file up to this size is read whole (one read instead of several)


@dataclass(frozen=True)
class Storage:
    key: str
    dtype: str
    itemsize: int
    numel: int


@dataclass(frozen=True)
class TensorMeta:
    storage: Storage
    offset: int
    shape: tuple
    stride: tuple

    @property
    def dtype(self) -> str:
        return self.storage.dtype

    def contiguous(self) -> bool:
        want, acc = [], 1
        for n in reversed(self.shape):
            want.append(acc)
            acc *= n
        return tuple(reversed(want)) == tuple(self.stride) or acc <= 1


def _rebuild_tensor(storage, offset, size, stride, *_rest):
    return TensorMeta(storage, int(offset), tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in ITEMSIZE:
            return name
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor or a plain container")

    def persistent_load(self, pid):
        kind, stype, key, _loc, numel = pid
        if kind != "storage" or stype not in ITEMSIZE:
            raise pickle.UnpicklingError(f"storage of type {stype!r}")
        dtype, size = ITEMSIZE[stype]
        return Storage(str(key), dtype, size, int(numel))


class TorchFile:
    """One ``torch.save`` zip: :attr:`obj` (tensors as :class:`TensorMeta`), :meth:`data_range` and :meth:`read`."""

    def __init__(self, path: str, data: bytes | None = None):
        """``data``: the file's bytes, already read (nothing is read again)."""
        self.path = path
        self.size = os.path.getsize(path) if data is None else len(data)
        with open(path, "rb") if data is None else _NoFile() as f:
            self._whole = data if data is not None else f.read() if self.size <= SMALL else None
            tail = self._whole[-65536 - 22 :] if self._whole is not None else _tail(f, self.size)
            self.members = self._directory(tail)  # name -> (local header offset, size, crc32)
            self._starts: dict[str, int] = {}
            pkl = next((n for n in self.members if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                raise ValueError("no data.pkl: not a torch.save zip")
            self.prefix = pkl[: -len("data.pkl")]
            self.obj = _Unpickler(_BytesReader(self._member(f, pkl))).load()

    def _directory(self, tail: bytes) -> dict[str, tuple[int, int, int]]:
        at = tail.rfind(b"PK\x05\x06")
        if at < 0:
            raise ValueError("no zip directory at the end of the file (truncated?)")
        n, dsize, doff = struct.unpack("<HII", tail[at + 10 : at + 20])
        if doff == 0xFFFFFFFF or n == 0xFFFF:  # zip64: the end-of-directory record before it says where
            z = tail.rfind(b"PK\x06\x06", 0, at)
            if z < 0:
                raise ValueError("zip64 directory record missing")
            n, dsize, doff = struct.unpack("<QQQ", tail[z + 32 : z + 56])
        if doff + dsize > self.size:
            raise ValueError(f"zip directory at {doff}+{dsize} beyond the {self.size}-byte file (truncated?)")
        if self._whole is not None:
            d = self._whole[doff : doff + dsize]
        else:
            with open(self.path, "rb") as f:
                f.seek(doff)
                d = f.read(dsize)
        out, pos = {}, 0
        for _ in range(n):
            if d[pos : pos + 4] != b"PK\x01\x02":
                raise ValueError("zip directory entry damaged")
            crc, csize, usize, nlen, xlen, clen = struct.unpack("<IIIHHH", d[pos + 16 : pos + 34])
            off = struct.unpack("<I", d[pos + 42 : pos + 46])[0]
            name = d[pos + 46 : pos + 46 + nlen].decode()
            extra = d[pos + 46 + nlen : pos + 46 + nlen + xlen]
            if 0xFFFFFFFF in (usize, csize, off):
                csize, off = _zip64(extra, usize, csize, off)
            out[name] = (off, csize, crc)
            pos += 46 + nlen + xlen + clen
        return out

    def data_range(self, name: str, f=None) -> tuple[int, int]:
        """(first byte, end) of a member's data in the file."""
        if name not in self._starts:
            off = self.members[name][0]
            if self._whole is not None:
                local = self._whole[off : off + 30]
            else:
                f.seek(off)
                local = f.read(30)
            if local[:4] != b"PK\x03\x04":
                raise ValueError(f"member {name}: no local header at byte {off}")
            nlen, xlen = struct.unpack("<HH", local[26:30])
            self._starts[name] = off + 30 + nlen + xlen
        start = self._starts[name]
        end = start + self.members[name][1]
        if end > self.size:
            raise ValueError(f"member {name} ends at byte {end}, the file has {self.size} (truncated)")
        return start, end

    def _member(self, f, name: str) -> bytes:
        start, end = self.data_range(name, f)
        if self._whole is not None:
            return self._whole[start:end]
        f.seek(start)
        return f.read(end - start)

    def storage_name(self, t: TensorMeta) -> str:
        return f"{self.prefix}data/{t.storage.key}"

    def check_tensor(self, t: TensorMeta) -> str | None:
        """Why ``t`` cannot be read from this file (its storage member missing or too short), else None."""
        name = self.storage_name(t)
        if name not in self.members:
            return f"storage {t.storage.key} missing"
        need = t.offset + (
            1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride, strict=True)) if all(t.shape) else 0
        )
        have = self.members[name][1] // t.storage.itemsize
        return (
            None
            if need <= have
            else f"storage {t.storage.key} holds {have} elements, the tensor needs {need}"
        )

    def read(self, t: TensorMeta) -> bytes:
        """The bytes of a contiguous tensor ``t``."""
        if not t.contiguous():
            raise ValueError("a non-contiguous tensor")
        n = 1
        for s in t.shape:
            n *= s
        with open(self.path, "rb") as f:
            raw = self._member(f, self.storage_name(t)) if self._whole is not None else None
            if raw is None:
                start, _ = self.data_range(self.storage_name(t), f)
                f.seek(start + t.offset * t.storage.itemsize)
                return f.read(n * t.storage.itemsize)
        a = t.offset * t.storage.itemsize
        return raw[a : a + n * t.storage.itemsize]


class _NoFile:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _BytesReader:
    def __init__(self, data: bytes):
        import io

        self._b = io.BytesIO(data)
        self.read, self.readline = self._b.read, self._b.readline


def _tail(f, size: int) -> bytes:
    f.seek(max(0, size - 65536 - 22))
    return f.read()


def _zip64(extra: bytes, usize: int, csize: int, off: int) -> tuple[int, int]:
    """(compressed size, local header offset) from a zip64 extra field: it holds, in this order, the uncompressed
    size, the compressed size and the offset, each only where the directory entry's own field is 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack("<HH", extra[pos : pos + 4])
        if tag == 1:
            vals = iter(struct.unpack(f"<{n // 8}Q", extra[pos + 4 : pos + 4 + n // 8 * 8]))
            if usize == 0xFFFFFFFF:
                next(vals)
            if csize == 0xFFFFFFFF:
                csize = next(vals)
            if off == 0xFFFFFFFF:
                off = next(vals)
            return csize, off
        pos += 4 + n
    raise ValueError("zip64 extra field missing")
