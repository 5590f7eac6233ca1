"""The names in a data directory: one place for every file and folder a phase reads or writes there.

Layout (the speculators 0.9.0 offline contract, plus eagle3ops' bookkeeping)::

    DATA/                                      Arrow dataset (input_ids, loss_mask, seq_len), from `prepare`:
    DATA/state.json, DATA/dataset_info.json,   datasets' save_to_disk files
      DATA/data-*.arrow
    DATA/prepare_meta.json                     what prepare made it from (sources, tokenizer, fingerprint)
    DATA/token_freq.pt                         token frequencies of the assistant tokens (train's draft vocab)
    DATA/hidden_states/hs_{i}.safetensors      one per Arrow row i (the sample format: eagle3ops.store.sample)
    DATA/hidden_states/extract_meta.json       what the files are (model, layer ids, H, dtype)
    DATA/hidden_states/manifest-rank{r}.jsonl  append-only, one line per finished sample (eagle3ops.store.manifest)
    DATA/hidden_states/shard.json              the global ranks this host's store covers (several hosts), and the lost
                                               ranks whose rows it took over on request (``reassigned``)
    DATA/hidden_states/damaged/                files the checks found damaged, moved aside (never deleted)
    DATA/hidden_states/sglang_hook_errors.jsonl  rows the SGLang server's writer failed
    DATA/hidden_states/verified.jsonl          files whose content matched their checksum, by inode, size,
                                               mtime, ctime (eagle3ops.store.verified: train's check)
    DATA/hidden_states/adopted.jsonl           rows an adopted dump holds, where its files lie, and
    DATA/hidden_states/adopted_dump.json       what the dump declared (eagle3ops.store.adopt, .adopted)
    DATA/hidden_states/requeue.jsonl           rows the training loader found damaged, for the next extract plan
    PARENT/.DATA.lock                          one run per data directory (eagle3ops.runlock)

Standard library only.
"""

from __future__ import annotations

import re

# the prepared dataset (DATA/)
PREPARE_META = "prepare_meta.json"
TOKEN_FREQ = "token_freq.pt"
DATASET_FILES = (
    "state.json",
    "dataset_info.json",
)  # what datasets.save_to_disk writes beside the Arrow shards

# the hidden states (DATA/hidden_states/)
HS_DIR = "hidden_states"
META_NAME = "extract_meta.json"
SHARD_FILE = "shard.json"
DAMAGED_DIR = "damaged"  # files the checks found damaged, moved aside (never deleted)
SGLANG_ERRORS = "sglang_hook_errors.jsonl"
VERIFIED_NAME = "verified.jsonl"  # the verified-once record (eagle3ops.store.verified)
MANIFEST_PREFIX, MANIFEST_SUFFIX = "manifest-rank", ".jsonl"
# temp files of the atomic writes in hidden_states/: ".{final name}.{pid}.{thread}.tmp"
TEMP_RE = re.compile(
    r"^\.(?:hs_\d+\.safetensors|extract_meta\.json|manifest-rank\d+\.jsonl)\.(?:(\d+)\.)?.*\.tmp$"
)


def sample_name(index: int) -> str:
    """The file of row ``index``."""
    return f"hs_{index}.safetensors"


def manifest_name(rank: int) -> str:
    """The manifest rank ``rank`` appends to."""
    return f"{MANIFEST_PREFIX}{rank}{MANIFEST_SUFFIX}"


def is_manifest(name: str) -> bool:
    return name.startswith(MANIFEST_PREFIX) and name.endswith(MANIFEST_SUFFIX)
