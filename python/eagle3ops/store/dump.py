"""A hidden-state dump made by another tool, read where it lies: what it declares, its files, one file's facts from
its metadata, its content against its own checksums, and one sample converted on read to the store's shape.

A dump is a folder of per-sample files: ``rows_{g}-{g+2000}/*.pt|*.ckpt`` (``torch.save`` dicts, the SpecForge
offline layout and the original run's patched SGLang), or ``*.safetensors`` samples in our own format
(:mod:`eagle3ops.store.sample`), directly in it or in ``rows_*`` folders. What the states are is declared, never
guessed (:func:`read_spec`): the dict's key names, the aux layer ids and their convention, and whether the last
state is the last decoder layer's output before the final norm (``pre-norm``, what speculators trains on) or after
it (``post-norm``, SpecForge's ``hidden_state``). A ``torch.save`` file is a zip archive whose members carry a
crc32 each: the content check compares them (a flipped bit in any tensor is found), in the same read that
computes the file's xxh3-64 for the store's record.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import layers
from eagle3ops.store.checksum import xxh3
from eagle3ops.store.errors import StoreError
from eagle3ops.store.sample import ST_DTYPES, read_safetensors_header

SIDECAR = "eagle3ops-dump.json"  # the dump's declaration, next to its rows_* folders
TORCH_SUFFIXES = (".pt", ".ckpt")
ST_SUFFIX = ".safetensors"
# SpecForge 0.2.0's offline keys (shared/notes formats.md): aux [1, T, K*H], last [1, T, H]
DEFAULT_KEYS = {"input_ids": "input_ids", "aux": "aux_hidden_state", "last": "hidden_state"}
LAST_STATES = ("pre-norm", "post-norm")
ZIP_MAGIC = b"PK\x03\x04"  # a torch.save zip's first bytes (a legacy-format file begins with a pickle: 0x80)
try:  # ISA-L's crc32: twice zlib's speed (docs/performance.md, "Adopting a dump"); the same values
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    _crc32 = zlib.crc32


class AdoptError(StoreError):
    """Bad input to an adoption: refused before any work, nothing written."""


@dataclass(frozen=True)
class DumpSpec:
    """What a dump holds, as declared (options or the sidecar): ``layer_ids`` in the input convention."""

    path: str
    layer_ids: list[int]
    last_state: str
    keys: dict = field(default_factory=lambda: dict(DEFAULT_KEYS))
    declared_by: str = "options"
    declared_ids: list[int] = field(default_factory=list)
    convention: str = "input"

    def record(self) -> dict:
        return {
            "path": self.path,
            "layer_ids": self.layer_ids,
            "declared_layer_ids": self.declared_ids,
            "layer_convention": self.convention,
            "last_state": self.last_state,
            "keys": self.keys,
            "declared_by": self.declared_by,
        }


def read_spec(
    dump: str | os.PathLike, *, layer_ids=None, convention=None, last_state=None, keys=None
) -> DumpSpec:
    """The dump's declaration: the options given, else its sidecar (``eagle3ops-dump.json``), else (our own
    safetensors samples) its ``extract_meta.json``. A value given both ways must agree; a missing one is refused
    (layer ids and the last state's norm position are never guessed: a wrong guess silently costs acceptance)."""
    d = Path(dump)
    side: dict = {}
    source = "options"
    for name in (SIDECAR, "extract_meta.json"):
        p = d / name
        if p.is_file():
            try:
                side = json.loads(p.read_text())
            except ValueError as e:
                raise AdoptError(f"{p}: not valid JSON ({e})") from None
            if name == "extract_meta.json":  # our own samples: inputs of layers, last state pre-norm
                side = {
                    "layer_ids": side.get("layer_ids"),
                    "layer_convention": "input",
                    "last_state": "pre-norm",
                }
            source = str(p)
            break
    given = {"layer_ids": layer_ids, "layer_convention": convention, "last_state": last_state, "keys": keys}
    given = {k: v or None for k, v in given.items()}  # an empty list or dict is "not given"
    merged = {}
    for k, v in given.items():
        s = side.get(k)
        if v is not None and s is not None and _norm(v) != _norm(s):
            raise AdoptError(f"the dump's {k} is given as {v!r} but {source} declares {s!r}; make them agree")
        merged[k] = v if v is not None else s
    ids, conv, last = merged["layer_ids"], merged["layer_convention"] or "input", merged["last_state"]
    where = f"(options adopt_layer_ids / adopt_last_state, or {d / SIDECAR})"
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise AdoptError(f"{d}: the dump's aux layer ids are not declared {where}; they are never guessed")
    if last not in LAST_STATES:
        raise AdoptError(
            f"{d}: the dump's last state is declared {last!r}, not one of {', '.join(LAST_STATES)} {where}"
        )
    try:
        inputs = layers.to_input(ids, conv)
    except layers.LayerIdError as e:
        raise AdoptError(f"{d}: {e}") from None
    key_map = {**DEFAULT_KEYS, **(merged["keys"] or {})}
    return DumpSpec(str(d.resolve()), inputs, last, key_map, source if side else "options", list(ids), conv)


def _norm(v):
    return json.dumps(v, sort_keys=True)


def list_files(dump: str | os.PathLike) -> list[str]:
    """The dump's sample files: ``*.pt``/``*.ckpt``/``*.safetensors`` in ``rows_*`` folders and directly in it."""
    out: list[str] = []
    dirs = [str(dump)]
    with os.scandir(dump) as it:
        dirs += sorted(e.path for e in it if e.is_dir() and e.name.startswith("rows_"))
    suffixes = (*TORCH_SUFFIXES, ST_SUFFIX)
    for folder in dirs:
        with os.scandir(folder) as it:
            out.extend(
                e.path for e in it if e.name.endswith(suffixes) and not e.name.startswith(".") and e.is_file()
            )
    return sorted(out)


@dataclass
class Probe:
    """One file's facts from its metadata (no tensor bytes read but the token ids)."""

    path: str
    size: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    seq_len: int = 0
    num_states: int = 0
    hidden_size: int = 0
    dtype: str = ""
    tokens: int | None = None  # xxh3-64 of the token ids as int64 bytes: what a row is matched by
    error: str | None = None  # unreadable / truncated
    shape_error: str | None = None  # readable, but not a sample of the declared shape
    legacy: bool = False  # a torch.save file of the legacy (non-zip) format: refused (:func:`refuse_legacy`)
    other_keys: list[str] | None = (
        None  # what a file without the declared keys holds: refused (:func:`refuse_keys`)
    )


def token_hash(ids_int64_bytes) -> int:
    h = xxh3()
    if h is None:
        return zlib.crc32(ids_int64_bytes)
    h.update(ids_int64_bytes)
    return h.intdigest()


def probe(path: str, spec: DumpSpec) -> Probe:
    p = Probe(path)
    try:
        st = os.stat(path)
        p.size, p.mtime_ns, p.ctime_ns = st.st_size, st.st_mtime_ns, st.st_ctime_ns
        if p.size == 0:
            p.error = "zero-length file"
        elif path.endswith(ST_SUFFIX):
            _probe_st(p)
        else:
            _probe_torch(p, spec)
    except Exception as e:
        p.error = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
    return p


def _probe_torch(p: Probe, spec: DumpSpec) -> None:
    from eagle3ops.store.torchfile import TensorMeta, TorchFile

    with open(p.path, "rb") as f:
        head = f.read(4)
    if head != ZIP_MAGIC and head[:1] == b"\x80":  # torch.save's legacy format: a pickle stream, no zip
        p.legacy = True
        return
    tf = TorchFile(p.path)
    d, k = tf.obj, spec.keys
    if not isinstance(d, dict) or any(
        not isinstance(d.get(k[n]), TensorMeta) for n in ("input_ids", "aux", "last")
    ):
        items = sorted(d.items()) if isinstance(d, dict) else [("", d)]
        p.other_keys = [
            f"{n}: {'tensor' if isinstance(v, TensorMeta) else type(v).__name__}" for n, v in items
        ]
        return
    ids, aux, last = d[k["input_ids"]], d[k["aux"]], d[k["last"]]
    for t in (ids, aux, last):
        why = tf.check_tensor(t)
        if why:
            p.error = f"truncated or damaged: {why}"
            return
    n_aux = len(spec.layer_ids)
    ishape = [x for x in ids.shape if x != 1] or [1]
    ashape = list(aux.shape[1:]) if len(aux.shape) == 3 and aux.shape[0] == 1 else list(aux.shape)
    lshape = list(last.shape[1:]) if len(last.shape) == 3 and last.shape[0] == 1 else list(last.shape)
    p.seq_len = ishape[0]
    p.hidden_size = lshape[-1] if lshape else 0
    p.dtype, p.num_states = last.dtype, n_aux + 1
    h, width = p.hidden_size, ashape[-1] if len(ashape) == 2 else 0
    if len(ishape) == 1 and lshape == [p.seq_len, h] and ashape[:1] == [p.seq_len] and h and width % h == 0:
        # a whole sample of another number of aux layers: another extraction's layer ids, not damage
        # (refused by the survey, naming the file and the run's layout), as a sample of another hidden size is
        p.num_states = width // h + 1
        if p.num_states != n_aux + 1:
            return
    if (
        len(ishape) != 1
        or ashape != [p.seq_len, n_aux * p.hidden_size]
        or lshape != [p.seq_len, p.hidden_size]
    ):
        p.shape_error = (
            f"{k['input_ids']} {list(ids.shape)}, {k['aux']} {list(aux.shape)}, {k['last']} {list(last.shape)}: "
            f"not [T], [T, {n_aux}*H], [T, H] for {n_aux} aux layers"
        )
        return
    if aux.dtype != last.dtype or ids.dtype not in ("int64", "int32"):
        p.shape_error = f"{k['input_ids']} {ids.dtype}, {k['aux']} {aux.dtype}, {k['last']} {last.dtype}"
        return
    raw = tf.read(ids)
    if ids.dtype == "int32":
        import numpy as np

        raw = np.frombuffer(raw, dtype=np.int32).astype(np.int64).tobytes()
    p.tokens = token_hash(raw)


def _probe_st(p: Probe) -> None:
    h = read_safetensors_header(p.path)
    hs, tok = h.get("hidden_states"), h.get("token_ids")
    if not hs or not tok or len(hs["shape"]) != 3 or tok["dtype"] != "I64" or tok["shape"] != hs["shape"][:1]:
        p.shape_error = "not a sample (token_ids I64 [T], hidden_states [T, K+1, H])"
        return
    p.seq_len, p.num_states, p.hidden_size = hs["shape"]
    p.dtype = ST_DTYPES.get(hs["dtype"], hs["dtype"])
    with open(p.path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        a, b = tok["data_offsets"]
        f.seek(8 + n + a)
        p.tokens = token_hash(f.read(b - a))


def refuse_legacy(probes: list[Probe]) -> None:
    """Files of ``torch.save``'s legacy format are refused, naming the first: they carry no checksum (nothing to
    check them by on read, unlike a zip's crc32s) and their tensors cannot be located without unpickling the
    whole file (no memory map: every read of a sample would load all of it). Converting costs one read and one
    write of each file; docs/data-format.md says how."""
    old = [p.path for p in probes if p.legacy]
    if old:
        raise AdoptError(
            f"adopt: {old[0]} is a torch.save file of the legacy format (_use_new_zipfile_serialization=False), "
            f"as are {len(old) - 1} more of the dump's {len(probes)} files; only the zip format (torch.save's "
            "default since PyTorch 1.6) is adopted: it carries the crc32s that check it on read and lets a "
            "sample be read without loading the whole file. Convert them in place first, e.g. "
            "`python -c 'import sys, torch; [torch.save(torch.load(f, weights_only=True), f) for f in "
            "sys.argv[1:]]' FILES` (one read and one write of each; a file pickled with protocol 4 or more "
            "needs weights_only=False, for files you trust; docs/data-format.md), then adopt again"
        )


def refuse_keys(probes: list[Probe], spec: DumpSpec) -> None:
    """Files without a tensor under each of the dump's key names (SpecForge's unless declared) are refused, naming
    the first and what it holds: another tool's keys are a declaration to make (``adopt_keys`` or the sidecar's
    ``keys``), not damage to redo silently (a damaged file does not parse at all)."""
    odd = [p for p in probes if p.other_keys is not None]
    if odd:
        k = spec.keys
        raise AdoptError(
            f"adopt: {odd[0].path} holds {{{', '.join(odd[0].other_keys)}}}, not a tensor under each of the "
            f"dump's key names input_ids={k['input_ids']!r}, aux={k['aux']!r}, last={k['last']!r} (as {len(odd) - 1} "
            f"more of its {len(probes)} files); declare the dump's key names (adopt_keys input_ids=.. aux=.. "
            f'last=.., or "keys" in {SIDECAR}), then adopt again'
        )


def content_check(path: str, data: bytes | None = None, chunk: int = 8 << 20) -> tuple[dict, str | None]:
    """(what the record keeps, None) or ({}, what is wrong), in one read (``data``: the bytes, already read).

    A ``torch.save`` file checks itself: every zip member's bytes against the crc32 its writer recorded in the
    zip directory (``{"z": 1}``: the file is its own checksum, no second hash of every byte is needed; a flipped
    bit in any tensor is found). A safetensors sample has no checksum of its own: its xxh3-64 is recorded
    (``{"h": value}``) for the later checks."""
    if path.endswith(ST_SUFFIX):
        h = xxh3()
        if h is None:
            return {}, None
        if data is not None:
            h.update(data)
        else:
            with open(path, "rb", buffering=0) as f:
                while buf := f.read(chunk):
                    h.update(buf)
        return {"h": h.intdigest()}, None
    try:
        members = _zip_members(path, data)
    except (OSError, ValueError, KeyError, TypeError, EOFError, pickle.UnpicklingError) as e:
        return {}, f"not a readable torch.save zip ({e})"
    crcs = [0] * len(members)
    pos = 0
    with open(path, "rb", buffering=0) if data is None else _Bytes(data) as f:
        if data is None:  # the kernel reads the whole file ahead while the crc32s run
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        while True:
            buf = f.read(chunk)
            if not buf:
                break
            end = pos + len(buf)
            view = memoryview(buf)
            for j, (start, stop, _crc, _name) in enumerate(members):
                if start < end and stop > pos:
                    crcs[j] = _crc32(view[max(start, pos) - pos : min(stop, end) - pos], crcs[j])
            pos = end
    for (_start, stop, crc, name), got in zip(members, crcs, strict=True):
        if stop > pos:
            return {}, f"truncated: member {name} ends at byte {stop}, the file has {pos}"
        if got != crc:
            return {}, f"member {name}: crc32 {got:08x} != {crc:08x} recorded (bytes changed on disk)"
    return {"z": 1}, None


class _Bytes:
    """``data`` read like a file, in chunks (without copying)."""

    def __init__(self, data: bytes):
        self.view, self.pos = memoryview(data), 0

    def read(self, n: int):
        out = self.view[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _zip_members(path: str, data: bytes | None = None) -> list[tuple[int, int, int, str]]:
    """(data start, data end, crc32, name) of every member of a stored (uncompressed) zip, from its directory and
    each member's local header (only metadata is read)."""
    from eagle3ops.store.torchfile import TorchFile

    tf = TorchFile(path, data)
    with open(path, "rb") if data is None else contextlib.nullcontext() as f:
        return [(*tf.data_range(name, f), crc, name) for name, (_off, _size, crc) in tf.members.items()]


def load_sample(path: str, keys: dict, num_aux: int, data: bytes | None = None) -> dict:
    """One dump file as the store's sample, converted in memory (never on disk): ``token_ids`` [T] int64 and
    ``hidden_states`` [T, K+1, H] (the K aux states, then the last). ``data``: the file's bytes, already read."""
    import io

    import torch

    if path.endswith(ST_SUFFIX):
        from safetensors.torch import load, load_file

        return load_file(path) if data is None else load(data)
    d = _tensors_on(path, data, keys) if data is not None else None
    if d is None:
        d = torch.load(path if data is None else io.BytesIO(data), map_location="cpu", weights_only=True)
    ids = d[keys["input_ids"]].reshape(-1).to(torch.int64).clone()  # not a view keeping the file's bytes
    aux, last = d[keys["aux"]], d[keys["last"]]
    t = ids.shape[0]
    aux = aux.reshape(t, num_aux, -1)
    return {"token_ids": ids, "hidden_states": torch.cat([aux, last.reshape(t, 1, -1)], dim=1)}


def _tensors_on(path: str, data, keys: dict) -> dict | None:
    """The sample's three tensors made on ``data`` (a zip's bytes, already read and checked: no copy, no second
    parse by ``torch.load``); None where that is not possible (a non-contiguous tensor), for ``torch.load``."""
    import torch

    from eagle3ops.store.torchfile import TorchFile

    try:
        tf = TorchFile(path, data)
        metas = [tf.obj[name] for name in (keys["input_ids"], keys["aux"], keys["last"])]
    except (ValueError, KeyError, TypeError, EOFError, pickle.UnpicklingError):
        return None  # not a zip (a legacy torch.save file): torch.load reads it
    out = {}
    for name, t in zip((keys["input_ids"], keys["aux"], keys["last"]), metas, strict=True):
        if not t.contiguous() or 0 in t.shape:
            return None
        start, _ = tf.data_range(tf.storage_name(t))
        n = 1
        for x in t.shape:
            n *= x
        dtype = getattr(torch, t.dtype)
        out[name] = torch.frombuffer(data, dtype=dtype, count=n, offset=start + t.offset * t.storage.itemsize)
        out[name] = out[name].view(t.shape)
    return out
