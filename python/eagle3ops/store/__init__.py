"""The data-directory contract: what a data directory holds and how it is written, for every phase that reads
or writes one (prepare, extract and its SGLang hook, train, the train fixtures).

- :mod:`.layout`: the names (files, folders, temp and manifest patterns);
- :mod:`.sample`: the sample format (safetensors, header and sizes without torch, fp8 with per-row scales);
- :mod:`.write`: the hot-path atomic writes (:mod:`eagle3ops.durable`'s guarantee, tuned for many files);
- :mod:`.checksum`: content checksums (xxh3-64, crc32);
- :mod:`.manifest`: the append-only manifests;
- :mod:`.meta`: ``extract_meta.json`` and whether a run may resume into a store;
- :mod:`.hidden_states`: :class:`HiddenStateStore`, the resume plan, the disk checks and the disk preflight;
- :mod:`.pool`: the disk preflight's second half, the PVE storage underneath the data directory;
- :mod:`.verified`: content verification against the manifests' checksums, once per file (a record by inode,
  size, mtime, ctime).
- :mod:`.dump`, :mod:`.torchfile`: another tool's dump read where it lies (its declaration, its files' metadata
  without torch, their content against a zip's own crc32s, a sample converted on read);
- :mod:`.adopt`, :mod:`.adopted`: a dump adopted in place (matched to rows by token ids) and its record; the
  re-extraction queue;
- :mod:`.reader`: what training reads for a row, native or adopted, optionally checked on first read.

The names below are the package's API (``from eagle3ops.store import HiddenStateStore``); the modules' other
names are theirs.
"""

from __future__ import annotations

from eagle3ops.store.checksum import content_hash, file_hashes, xxh3
from eagle3ops.store.errors import DiskSpaceError, ModelChangedError, StoreError
from eagle3ops.store.hidden_states import (
    VERIFY_LEVELS,
    HiddenStateStore,
    ResumePlan,
    human_bytes,
    preflight_disk,
)
from eagle3ops.store.layout import DAMAGED_DIR, HS_DIR, META_NAME, PREPARE_META, SHARD_FILE, TOKEN_FREQ
from eagle3ops.store.manifest import ManifestEntry, ManifestScan, parse_manifest_file
from eagle3ops.store.meta import MODEL_CHANGE_ACTIONS, meta_decision, weight_changes
from eagle3ops.store.sample import (
    DTYPE_SIZES,
    FP8_DTYPE,
    FP8_SCALES_KEY,
    header_overhead,
    load_sample,
    quantize_fp8,
    read_safetensors_header,
    sample_header,
    sample_nbytes,
    sample_parts,
    serialize_sample,
)
from eagle3ops.store.verified import verify_content
from eagle3ops.store.write import atomic_write_bytes, atomic_write_many

__all__ = [
    "DAMAGED_DIR",
    "DTYPE_SIZES",
    "FP8_DTYPE",
    "FP8_SCALES_KEY",
    "HS_DIR",
    "META_NAME",
    "MODEL_CHANGE_ACTIONS",
    "PREPARE_META",
    "SHARD_FILE",
    "TOKEN_FREQ",
    "VERIFY_LEVELS",
    "DiskSpaceError",
    "HiddenStateStore",
    "ManifestEntry",
    "ManifestScan",
    "ModelChangedError",
    "ResumePlan",
    "StoreError",
    "atomic_write_bytes",
    "atomic_write_many",
    "content_hash",
    "file_hashes",
    "header_overhead",
    "human_bytes",
    "load_sample",
    "meta_decision",
    "parse_manifest_file",
    "preflight_disk",
    "quantize_fp8",
    "read_safetensors_header",
    "sample_header",
    "sample_nbytes",
    "sample_parts",
    "serialize_sample",
    "verify_content",
    "weight_changes",
    "xxh3",
]
