"""``prepare``: conversations -> the offline training rows of speculators 0.9.0.

Output (``DATA_DIR``), exactly what ``speculators train --data-path DATA_DIR`` reads::

    DATA_DIR/data-*.arrow, dataset_info.json, state.json   datasets.save_to_disk: input_ids (int64),
                                                          loss_mask (int64, 0/1), seq_len (int64)
    DATA_DIR/token_freq.pt                                {token_id: count} over supervised tokens
    DATA_DIR/prepare_meta.json                            fingerprint, counts, skipped rows (ours)

How rows are made (speculators' own code, pinned to 0.9.0):

- every input row is checked first; a problem is reported as ``file:line: what is wrong``;
- turns are normalised with speculators' ``_normalize_conversation`` (ShareGPT from/value and OpenAI
  role/content; ``thinking``/``reasoning_content`` kept);
- speculators 0.9.0 renders conversations only through a vLLM ``/render`` endpoint. We run its own
  ``_render_boundary_rows`` (one row per assistant turn; the loss mask starts where the full render
  extends the generation-prompt render; common-prefix fallback for templates that pre-fill ``<think>``;
  ``BoundaryUnstableError`` when history itself diverges) with its ``_encode_render`` pointed at the
  local tokenizer: ``apply_chat_template(..., tokenize=False)`` then ``encode(add_special_tokens=False)``
  and right truncation to ``max_length``, which is what the endpoint does;
- the pretokenized rows go through ``build_speculator_training_dataset`` (its pass-through path:
  truncation, rows without a supervised token dropped, torch format) and the token counts through
  ``save_token_frequency_distribution``.

Conversations are shuffled with the seed (the rows of one conversation stay together, in turn order), so
speculators' contiguous 90/10 train/validation split is a random split by conversation: a validation
row never shares its history with a training row.

The dataset is built in a temporary directory beside ``DATA_DIR`` and renamed into place: a killed run
leaves the old dataset (or nothing). A second run with the same inputs, tokenizer and parameters does
nothing. A run that would change the rows refuses while ``DATA_DIR/hidden_states`` holds extracted
states (they belong to the old rows) unless ``force`` is given; then they are removed and reported.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import remote_code, target_model
from eagle3ops.conversations import InputError, load_tokenizer, resolve_sources
from eagle3ops.durable import fsync_dir, fsync_tree, sha256_file, swap_dir_into_place
from eagle3ops.prepare import tokcheck
from eagle3ops.prepare.errors import PrepareError
from eagle3ops.prepare.fingerprint import (
    PREPARE_FORMAT,
    dataset_fingerprint,
    fast_tokenizer_fingerprint,
    tokenizer_fingerprint,
)
from eagle3ops.prepare.options import PREPARE
from eagle3ops.prepare.render import ROWS_CHOICES, SPECULATORS_VERSION, collect, speculators_preprocessing
from eagle3ops.store.layout import DATASET_FILES, HS_DIR, PREPARE_META, TOKEN_FREQ

META_NAME = PREPARE_META
# what a prepared DATA_DIR may hold besides the arrow shards (anything else: we refuse to replace it)
_KNOWN = {META_NAME, TOKEN_FREQ, HS_DIR, *DATASET_FILES}
MAX_ERRORS_SHOWN = 10


def read_meta(data_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(data_dir) / META_NAME).read_text())
    except (OSError, ValueError):
        return None


def _file_checksum(path: Path) -> str:
    """xxh3-64 (hex) of a file's content (``sha256:`` + hex without xxhash)."""
    from eagle3ops.store import file_hashes, xxh3

    if xxh3() is not None:
        return format(file_hashes(path, {"h"})["h"], "016x")
    return "sha256:" + sha256_file(path)


def _damaged_files(data_dir: Path, meta: dict) -> list[str]:
    """The files the meta lists that are missing, of another size or (when the meta records checksums, i.e.
    written since issue 16) of other content. The shards are re-read: xxh3 runs at memory speed, so a prepared
    dataset of a few GB costs about a second when cached."""
    bad = []
    sums = meta.get("checksums") or {}
    for name, size in (meta.get("files") or {}).items():
        try:
            if (data_dir / name).stat().st_size != size:
                bad.append(name)
                continue
            if name in sums and _file_checksum(data_dir / name) != sums[name]:
                bad.append(name)
        except OSError:
            bad.append(name)
    return bad


def _is_complete(data_dir: Path, meta: dict) -> bool:
    """Every file the meta lists is there with its size and (when recorded) its checksum."""
    return bool(meta.get("files")) and not _damaged_files(data_dir, meta)


def _hidden_state_files(data_dir: Path) -> int:
    d = data_dir / HS_DIR
    if not d.is_dir():
        return 0
    return sum(1 for _ in d.iterdir())


def _foreign_entries(data_dir: Path) -> list[str]:
    out = []
    for name in sorted(os.listdir(data_dir)):
        if name in _KNOWN or name.endswith(".arrow"):
            continue
        if name.startswith(("d2t-", "t2d-")) and name.endswith(".npy"):
            continue  # speculators' vocab-map cache, derived from token_freq.pt: stale with new rows
        out.append(name)
    return out


def _clean_stale(data_dir: Path) -> None:
    """Remove temp dirs of killed runs; put back a DATA_DIR left moved aside by a kill mid-swap."""
    parent = data_dir.parent
    if not parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(data_dir.name)}\.prepare-(new|old)-(\d+)$")
    for p in sorted(parent.iterdir()):
        m = pattern.match(p.name)
        if not m or int(m.group(2)) == os.getpid() or Path(f"/proc/{m.group(2)}").exists():
            continue
        if m.group(1) == "old" and not data_dir.exists():
            os.replace(p, data_dir)
        else:
            shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------------
def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _input_errors_as_prepare_errors(fn):
    """An input's own problem (an :class:`InputError` of :mod:`eagle3ops.conversations`) reaches ``fn``'s caller
    as a :class:`PrepareError`, with its message and problems."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PrepareError:
            raise
        except InputError as e:
            raise PrepareError(str(e), problems=e.problems) from None

    return wrapper


# prepare()'s defaults are the definition's (python/eagle3ops/prepare/options.py), written there once
_D = PREPARE.defaults()


@_input_errors_as_prepare_errors
def prepare(
    model: str | os.PathLike,
    inputs: list[str | os.PathLike],
    out: str | os.PathLike,
    *,
    max_length: int = _D["max_length"],
    on_error: str = _D["on_error"],
    max_samples: int | None = _D["max_samples"],
    seed: int = _D["seed"],
    force: bool = _D["force"],
    check: bool = False,
    trust_remote_code: bool = _D["trust_remote_code"],
    rows: str = _D["rows"],
    workers: int = _D["workers"],
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> dict:
    """Build (or confirm) the prepared dataset at ``out``; see the module docstring.

    Returns changed, out, num_rows, num_tokens, num_supervised_tokens, skipped (``file:line: what``),
    dropped (turns that did not fit), rows (the row layout and, for ``conversation``, how many conversations
    were merged into one row or kept one row per turn), fingerprint, seconds. ``check=True`` writes nothing
    and predicts ``changed``.

    ``rows="conversation"`` writes one row per conversation with all its assistant turns supervised instead of
    speculators' one row per turn (whose rows repeat the history: extraction stores, and training reads, it
    again for every turn); a conversation whose template re-renders history differently keeps its per-turn
    rows. ``workers`` renders in that many processes; it does not change the rows.
    """
    t0 = time.monotonic()
    log = log or _log_default
    _check_args(on_error, max_length, max_samples, rows, workers)
    check_model(model, trust_remote_code)
    data_dir = Path(out).absolute()
    sources = resolve_sources(inputs)
    params = {"max_length": max_length, "max_samples": max_samples, "seed": seed}
    # rows is not in the default's params: datasets prepared before the option keep their fingerprint
    if rows != "turn":
        params["rows"] = rows
    # 0. already done? (cheap: no tokenizer, no speculators import)
    meta = read_meta(data_dir)
    fast_fp = fast_tokenizer_fingerprint(model) if meta else None
    done = _done_result(
        data_dir, meta, dataset_fingerprint(sources, fast_fp, params) if fast_fp else None, on_error, t0
    )
    if done is not None:
        return done
    pp = speculators_preprocessing()
    tokenizer = load_tokenizer(model, trust_remote_code=trust_remote_code)
    fingerprint = dataset_fingerprint(sources, tokenizer_fingerprint(model, tokenizer), params)

    # 1. already done?
    meta = read_meta(data_dir)
    done = _done_result(data_dir, meta, fingerprint, on_error, t0)
    if done is not None:
        return done
    # same fingerprint but files missing or damaged: the rebuilt rows are byte-identical, so extracted
    # hidden states stay valid and the files are repaired in place
    repair = bool(meta) and meta.get("fingerprint") == fingerprint and data_dir.is_dir()
    damaged = _damaged_files(data_dir, meta) if repair else []
    if data_dir.exists():
        _check_replaceable(data_dir, force or repair)
    if check:
        return _check_result(data_dir, fingerprint, repair, damaged, t0)

    # 2.-4. read, check, render, shuffle; speculators' dataset builder
    built = _build_rows(
        pp,
        tokenizer,
        sources,
        max_length,
        log,
        progress,
        rows=rows,
        workers=workers,
        on_error=on_error,
        seed=seed,
        max_samples=max_samples,
        verify=lambda sample: tokcheck.check_samples(model, trust_remote_code, sample),
    )
    new_meta = functools.partial(
        _new_meta,
        built,
        fingerprint=fingerprint,
        model=model,
        tokenizer=tokenizer,
        sources=sources,
        params=params,
        rows=rows,
    )
    meta, removed_hs = _write_dataset(data_dir, built.ds, new_meta, repair, damaged, log)
    if removed_hs:
        log(f"prepare: removed {removed_hs} files of stale hidden states from {data_dir / HS_DIR} (--force)")
    result = _result(data_dir, meta, changed=True)
    result["removed_hidden_states"] = removed_hs
    result["damaged_files"] = damaged
    result["seconds"] = round(time.monotonic() - t0, 2)
    log(f"prepare: {result['summary']}, in {result['seconds']} s")
    return result


def _check_args(on_error: str, max_length: int, max_samples: int | None, rows: str, workers: int) -> None:
    if on_error not in ("fail", "skip"):
        raise PrepareError(f"on_error must be 'fail' or 'skip', not {on_error!r}")
    if max_length < 2:
        raise PrepareError(f"max_length {max_length} is too small")
    if max_samples is not None and max_samples < 1:
        raise PrepareError(f"max_samples {max_samples} must be at least 1")
    if rows not in ROWS_CHOICES:
        raise PrepareError(f"rows must be one of {', '.join(ROWS_CHOICES)}, not {rows!r}")
    if workers < 1:
        raise PrepareError(f"workers {workers} must be at least 1 (the rendering processes)")


def _done_result(
    data_dir: Path, meta: dict | None, fingerprint: str | None, on_error: str, t0: float
) -> dict | None:
    """The result of a run with nothing to do (the dataset at ``data_dir`` is complete with ``fingerprint``),
    or None. Its skipped rows still fail an ``on_error: fail`` run."""
    if fingerprint is None:
        return None
    if meta and meta.get("fingerprint") == fingerprint and _is_complete(data_dir, meta):
        if meta.get("skipped") and on_error == "fail":
            raise _failure(meta["skipped"])
        return {**_result(data_dir, meta, changed=False), "seconds": round(time.monotonic() - t0, 2)}
    return None


def _check_result(data_dir: Path, fingerprint: str, repair: bool, damaged: list[str], t0: float) -> dict:
    """``check``: what a run would change, nothing written."""
    return {
        "changed": True,
        "out": str(data_dir),
        "fingerprint": fingerprint,
        "removes_hidden_states": 0 if repair else (_hidden_state_files(data_dir) if data_dir.exists() else 0),
        "damaged_files": damaged,
        "seconds": round(time.monotonic() - t0, 2),
    }


@dataclass
class _Built:
    """The rows as speculators' builder made them, and what was read to make them."""

    ds: object
    n_records: int
    num_conversations: int
    problems: list
    dropped: dict
    merge_counts: dict
    cut_by_max_samples: int


def _build_rows(
    pp,
    tokenizer,
    sources,
    max_length,
    log,
    progress,
    *,
    rows,
    workers,
    on_error,
    seed,
    max_samples,
    verify=None,
) -> _Built:
    """Read, check and render every conversation; ``verify(sample)`` the first conversations' rows; shuffle;
    speculators' builder (pass-through path)."""
    # 2. read, check and render every conversation
    sample: list = []
    groups, problems, dropped, n_records, merge_counts = collect(
        pp, tokenizer, sources, max_length, log, progress, rows=rows, workers=workers, sample=sample
    )
    if problems and on_error == "fail":
        raise _failure([str(p) for p in problems])
    if verify is not None:  # the rows against the tokenizer as SGLang loads it (eagle3ops.prepare.tokcheck)
        verify(sample)
    raw, cut_by_max_samples = _shuffled_rows(groups, problems, n_records, max_length, seed, max_samples)
    # 4. speculators' dataset builder (pass-through path)
    ds = pp.build_speculator_training_dataset(raw, tokenizer, max_length=max_length, num_proc=1)
    if len(ds) != len(raw):
        raise RuntimeError(
            f"speculators dropped {len(raw) - len(ds)} rows that eagle3ops checked as supervised; "
            "its pass-through semantics changed (see speculators_preprocessing)"
        )
    return _Built(ds, n_records, len(groups), problems, dropped, merge_counts, cut_by_max_samples)


def _shuffled_rows(groups, problems, n_records: int, max_length: int, seed: int, max_samples: int | None):
    """3. the conversations shuffled with the seed (the rows of one kept together), cut to ``max_samples``.
    Returns (the raw datasets.Dataset of input_ids/loss_mask, rows cut by max_samples)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(groups)) if groups else []
    ids_rows: list = []
    mask_rows: list = []
    for g in order:
        for ids, mask in groups[g]:
            ids_rows.append(ids)
            mask_rows.append(mask)
    cut_by_max_samples = 0
    if max_samples is not None:
        cut_by_max_samples = max(0, len(ids_rows) - max_samples)
        ids_rows, mask_rows = ids_rows[:max_samples], mask_rows[:max_samples]
    if not ids_rows:
        raise PrepareError(
            "no training rows: "
            + (
                f"all {n_records} input rows were skipped or had no assistant turn that fits in "
                f"--max-length {max_length}"
                if n_records
                else "the inputs hold no rows"
            ),
            problems=[str(p) for p in problems],
        )
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": ids_rows, "loss_mask": mask_rows}), cut_by_max_samples


def _new_meta(built: _Built, tmp: Path, *, fingerprint, model, tokenizer, sources, params, rows) -> dict:
    """The meta of the dataset written in ``tmp`` (its files' sizes and checksums)."""
    stats = _stats(built.ds)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    checksums = {name: _file_checksum(tmp / name) for name in files}
    return {
        "fingerprint": fingerprint,
        "format": PREPARE_FORMAT,
        "speculators_version": SPECULATORS_VERSION,
        "model": str(model),
        "tokenizer_fingerprint": tokenizer_fingerprint(model, tokenizer),
        "inputs": [{"path": str(s.path), "sha256": s.sha256} for s in sources],
        "params": params,
        "num_input_rows": built.n_records,
        "num_conversations": built.num_conversations,
        **stats,
        "skipped": [str(p) for p in built.problems],
        "dropped": built.dropped,
        "rows_cut_by_max_samples": built.cut_by_max_samples,
        "rows": {"layout": rows, **(built.merge_counts if rows == "conversation" else {})},
        "files": files,
        "checksums": checksums,
    }


def _write_dataset(
    data_dir: Path, ds, new_meta: Callable[[Path], dict], repair: bool, damaged: list[str], log
) -> tuple[dict, int]:
    """The dataset, token counts and meta written in a temp dir beside ``data_dir``, fsynced, then repaired in
    place or swapped in. Returns (meta, hidden-state files removed with the old dataset)."""
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(data_dir)
    tmp = data_dir.parent / f".{data_dir.name}.prepare-new-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    removed_hs = 0
    try:
        log(f"prepare: writing {len(ds)} rows to {data_dir}")
        ds.save_to_disk(str(tmp))
        save_token_frequency_distribution(ds, tmp / TOKEN_FREQ)
        meta = new_meta(tmp)
        (tmp / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        fsync_tree(tmp)
        if repair:
            log(
                f"prepare: {data_dir} has the same fingerprint but missing or changed files "
                f"({', '.join(damaged) or 'none listed'}): rebuilding them"
            )
            _repair_in_place(tmp, data_dir)
        else:
            if data_dir.exists():
                removed_hs = _hidden_state_files(data_dir)
            swap_dir_into_place(tmp, data_dir, "prepare-old")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta, removed_hs


def summary(meta: dict) -> str:
    """One line that says what the rows are and what was left out on the way (issue 32: 37 rows from 40
    conversations, and the 110 assistant turns that did not fit were only in prepare_meta.json)."""
    d = meta.get("dropped") or {}
    max_length = (meta.get("params") or {}).get("max_length")
    n_in, n_conv = meta.get("num_input_rows"), meta.get("num_conversations")
    head = (
        f"{meta['num_rows']} rows ({meta['num_tokens']} tokens, {meta['num_supervised_tokens']} supervised)"
        + (f" from {n_in} input conversations ({n_conv} gave rows)" if n_in is not None else "")
    )
    left_out = [
        f"{d.get('turns_context_over_max_length', 0)} assistant turns whose context exceeds max_length "
        f"{max_length}",
        f"{d.get('rows_unsupervised_after_truncation', 0)} rows with no supervised token left after truncation",
        f"{len(meta.get('skipped') or [])} bad input rows skipped (on_error skip)",
    ]
    if meta.get("rows_cut_by_max_samples"):
        left_out.append(f"{meta['rows_cut_by_max_samples']} rows over max_samples")
    return f"{head}; left out: " + ", ".join(left_out)


def check_model(model: str | os.PathLike, trust_remote_code: bool = False) -> None:
    """The target's directory exists (extract's check, :mod:`eagle3ops.target_model`): a path that does not
    reached transformers' hub lookup and failed as ``Repo id must be in the form 'repo_name'...``; a remote-code
    tokenizer is refused unless ``trust_remote_code`` (:mod:`eagle3ops.remote_code`)."""
    target_model.require(model, "prepare_model_path (or --model)", PrepareError)
    try:
        remote_code.check(model, trust_remote_code)
    except remote_code.RemoteCodeError as e:
        raise PrepareError(str(e)) from None


def _failure(problems: list[str]) -> PrepareError:
    shown = "\n  ".join(problems[:MAX_ERRORS_SHOWN])
    more = f"\n  ... and {len(problems) - MAX_ERRORS_SHOWN} more" if len(problems) > MAX_ERRORS_SHOWN else ""
    return PrepareError(
        f"{len(problems)} bad input row(s); nothing was written. Fix them, or pass --on-error skip to "
        f"leave them out:\n  {shown}{more}",
        problems=problems,
    )


def _check_replaceable(data_dir: Path, force: bool) -> None:
    if not data_dir.is_dir():
        raise PrepareError(f"{data_dir} exists and is not a directory: choose another --out")
    foreign = _foreign_entries(data_dir)
    if foreign:
        raise PrepareError(
            f"{data_dir} holds {', '.join(foreign[:5])} that prepare did not make; prepare replaces the "
            "whole directory. Move those aside or choose another --out."
        )
    n = _hidden_state_files(data_dir)
    if n and not force:
        raise PrepareError(
            f"{data_dir / HS_DIR} holds {n} files of hidden states extracted for the rows prepared before; "
            "the new inputs, tokenizer or parameters would change the rows, so those states would no "
            "longer match. Nothing was changed. Re-run with --force to replace the dataset and delete "
            "those states (extract them again afterwards), or prepare into another --out."
        )


def _stats(ds) -> dict:
    import numpy as np
    import pyarrow.compute as pc

    seq = ds.data.column("seq_len").to_numpy().astype(np.int64)
    supervised = pc.sum(pc.list_flatten(ds.data.column("loss_mask"))).as_py() or 0
    return {
        "num_rows": len(ds),
        "num_tokens": int(seq.sum()),
        "num_supervised_tokens": int(supervised),
        "max_seq_len": int(seq.max()),
        "mean_seq_len": round(float(seq.mean()), 1),
    }


def _result(data_dir: Path, meta: dict, changed: bool) -> dict:
    return {
        "changed": changed,
        "out": str(data_dir),
        "num_rows": meta["num_rows"],
        "num_tokens": meta["num_tokens"],
        "num_supervised_tokens": meta["num_supervised_tokens"],
        "num_conversations": meta.get("num_conversations"),
        "skipped": meta.get("skipped", []),
        "dropped": meta.get("dropped", {}),
        "num_input_rows": meta.get("num_input_rows"),
        "rows_cut_by_max_samples": meta.get("rows_cut_by_max_samples", 0),
        "summary": summary(meta),
        "rows": meta.get("rows", {"layout": "turn"}),
        "fingerprint": meta["fingerprint"],
        "token_freq": str(data_dir / TOKEN_FREQ),
    }


def _repair_in_place(tmp: Path, data_dir: Path) -> None:
    """Move the rebuilt files over a dataset with the same fingerprint, file by file, meta last.

    The rows are byte-identical to the ones the meta describes, so every intermediate state is a
    consistent dataset; ``hidden_states/`` and speculators' vocab-map caches stay.
    """
    new = {p.name for p in tmp.iterdir()}
    for name in sorted(new - {META_NAME}):
        os.replace(tmp / name, data_dir / name)
    for p in data_dir.iterdir():
        if p.name not in new and p.is_file() and (p.suffix == ".arrow" or p.name in _KNOWN):
            p.unlink()
    os.replace(tmp / META_NAME, data_dir / META_NAME)
    fsync_dir(data_dir)
    shutil.rmtree(tmp, ignore_errors=True)


def load_rows_lengths(data_dir: str | os.PathLike) -> list[int]:
    """The ``seq_len`` column of a prepared dataset (memory-mapped, no token data decoded)."""
    from datasets import load_from_disk

    return load_from_disk(str(data_dir)).data.column("seq_len").to_pylist()
