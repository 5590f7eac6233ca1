"""The extraction session both backends share (transformers: :mod:`.transformers_backend`; SGLang:
:mod:`eagle3ops.sglang.client` driving :mod:`eagle3ops.sglang.hook` in the server): the run's settings (:class:`ExtractConfig`),
the target's facts and the store's meta, the plan of what is left (also check mode, :func:`plan_extraction`),
the one-time repair a parent does before its workers start (:func:`repair_store`) and the progress reporter.
Nothing here loads weights or tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops import layers, remote_code, target_model
from eagle3ops.durable import sha256_file
from eagle3ops.extract.adoption import commit_dump, predicted, survey_dump
from eagle3ops.extract.errors import ExtractError
from eagle3ops.extract.options import EXTRACT
from eagle3ops.extract.shards import Reassignment, check_shard, rank_indices, rows_of_ranks
from eagle3ops.store import (
    DiskSpaceError,
    HiddenStateStore,
    ResumePlan,
    meta_decision,
    preflight_disk,
    sample_nbytes,
)


# ----------------------------------------------------------------------------------------------------------
# layer ids: the rule lives in eagle3ops.layers; this name stays for extract's callers (eagle3ops.sglang.client, tests)
# ----------------------------------------------------------------------------------------------------------
def resolve_layer_ids(
    num_layers: int, layer_ids: Sequence[int] | None = None, convention: str = "input"
) -> list[int]:
    """:func:`eagle3ops.layers.resolve` (default or given ids, input convention, checked, sorted), its
    refusal as an :class:`ExtractError`."""
    try:
        return layers.resolve(num_layers, layer_ids, convention)
    except layers.LayerIdError as e:
        raise ExtractError(str(e)) from None


# ----------------------------------------------------------------------------------------------------------
# dataset + model facts (cheap: no weights loaded)
# ----------------------------------------------------------------------------------------------------------
def _seq_lens_from_arrow(data_dir: Path) -> list[int] | None:
    """``seq_len`` straight from the Arrow files that ``datasets.save_to_disk`` wrote (``state.json`` lists
    them; each is an IPC stream, memory-mapped: no token data is read). ``None`` when the layout is not the
    plain one, so the caller falls back to ``datasets``. Importing ``datasets`` dominated resume planning
    (docs/performance.md, "Resume planning")."""
    try:
        state = json.loads((data_dir / "state.json").read_text())
        files = [data_dir / f["filename"] for f in state["_data_files"]]
        if not files or state.get("_indices_data_files"):
            return None
        import pyarrow as pa

        out: list[int] = []
        for f in files:
            with pa.memory_map(str(f)) as src:
                table = pa.ipc.open_stream(src).read_all()
            if "seq_len" not in table.column_names:
                return None
            out.extend(int(x) for x in table.column("seq_len").to_pylist())
        return out
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None


def load_seq_lens(data_dir: str | os.PathLike) -> list[int]:
    """The ``seq_len`` column of the prepared Arrow dataset (no token data read)."""
    fast = _seq_lens_from_arrow(Path(data_dir))
    if fast is not None:
        return fast
    from datasets import load_from_disk

    try:
        ds = load_from_disk(str(data_dir))
    except FileNotFoundError as e:
        raise ExtractError(
            f"{data_dir}: no prepared dataset here ({e}). Run the prepare phase first "
            "(ansible-playbook site.yml --tags prepare, or `eagle3ops prepare`)."
        ) from e
    if "seq_len" not in ds.column_names:
        raise ExtractError(
            f"{data_dir}: dataset has no seq_len column (columns: {ds.column_names}); re-run prepare"
        )
    return [int(x) for x in ds.data.column("seq_len").to_pylist()]


def model_facts(
    model_path: str | os.PathLike, *, content_hash: bool = False, trust_remote_code: bool = False
) -> dict:
    """num_layers, hidden_size and a fingerprint of the target, from its config and its weight files' sizes,
    mtimes and safetensors headers (``content_hash``: also a hash of every weight byte).

    Plain ``config.json`` files (top-level or ``text_config`` keys ``num_hidden_layers`` and ``hidden_size``)
    are read as JSON; anything else goes through ``transformers.AutoConfig`` (importing transformers
    dominated ``extract --plan``: docs/performance.md, "Resume planning"). A remote-code target (an ``auto_map``)
    is refused unless ``trust_remote_code`` (eagle3ops.remote_code)."""
    p = Path(model_path)
    target_model.require(model_path, "extract_model_path (or --model)", ExtractError)
    try:
        remote_code.check(p, trust_remote_code)
    except remote_code.RemoteCodeError as e:
        raise ExtractError(str(e)) from None
    facts = _facts_from_config_json(p / "config.json")
    if facts is None:
        from transformers import AutoConfig

        try:
            cfg = AutoConfig.from_pretrained(str(p), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise ExtractError(f"{model_path}: cannot read the model config ({e})") from e
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        facts = (int(text_cfg.num_hidden_layers), int(text_cfg.hidden_size), getattr(cfg, "model_type", None))
    h = hashlib.sha256()
    cfg_file = p / "config.json"
    if cfg_file.exists():
        h.update(cfg_file.read_bytes())
    weights: dict[str, list] = {}
    for f in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")):
        st = f.stat()
        h.update(
            f"{f.name}:{st.st_size}".encode()
        )  # the fingerprint of metas before issue 16: kept as it was
        weights[f.name] = [st.st_size, st.st_mtime_ns, _weights_header_digest(f)]
    out = {
        "num_layers": facts[0],
        "hidden_size": facts[1],
        "model_type": facts[2],
        "model_fingerprint": h.hexdigest()[:16],
        # per weight file: size, mtime (ns), sha256 of its safetensors header (None for .bin/unreadable): cheap
        # (no tensor bytes read) and it sees weights replaced in place by other weights of the same size
        "model_weights": weights,
    }
    if content_hash:
        out["model_content_hash"] = _weights_content_hash(p, sorted(weights))
    return out


def _weights_header_digest(path: Path) -> str | None:
    """sha256 (16 hex) of a safetensors file's length + JSON header (names, dtypes, shapes, offsets, metadata),
    None when it has none (``.bin``) or it does not parse as one."""
    if path.suffix != ".safetensors":
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return None
            n = int.from_bytes(head, "little")
            if n > 100 * 2**20:
                return None
            body = f.read(n)
    except OSError:
        return None
    return hashlib.sha256(head + body).hexdigest()[:16] if len(body) == n else None


def _weights_content_hash(p: Path, names: list[str]) -> dict:
    """The full content of every weight file (``--model-hash``): xxh3-64 (sha256 without xxhash), with a
    progress line per file on stderr; reads every byte of the weights (terabytes for Kimi-K2.5: on request)."""
    from eagle3ops.store import file_hashes, xxh3

    algo = "xxh3_64" if xxh3() is not None else "sha256"
    files = {}
    for name in names:
        t0 = time.monotonic()
        if algo == "xxh3_64":
            files[name] = format(file_hashes(p / name, {"h"})["h"], "016x")
        else:
            files[name] = sha256_file(p / name)
        print(f"model hash: {name} in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return {"algo": algo, "files": files}


def _facts_from_config_json(path: Path) -> tuple[int, int, str | None] | None:
    """(num_layers, hidden_size, model_type) from a config.json without transformers, or None to fall back."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or any(k in cfg for k in ("text_encoder", "decoder", "generator")):
        return None  # sub-configs transformers' get_text_config() would pick: let it
    text = layers.text_config(cfg)
    try:
        return int(text["num_hidden_layers"]), int(text["hidden_size"]), cfg.get("model_type")
    except (KeyError, TypeError, ValueError):
        return None


def dataset_fingerprint(data_dir: str | os.PathLike) -> str | None:
    """The prepare step's fingerprint (prepare_meta.json), else the Arrow state's fingerprint."""
    d = Path(data_dir)
    meta = d / "prepare_meta.json"
    if meta.exists():
        fp = json.loads(meta.read_text()).get("fingerprint")
        if fp:
            return str(fp)
    state = d / "state.json"
    if state.exists():
        return json.loads(state.read_text()).get("_fingerprint")
    return None


# ----------------------------------------------------------------------------------------------------------
# the extraction run
# ----------------------------------------------------------------------------------------------------------
# the settings' defaults are the definition's (python/eagle3ops/extract/options.py), written there once
_D = EXTRACT.defaults()


@dataclass
class ExtractConfig:
    data_dir: str
    model_path: str
    layer_ids: list[int] | None = _D["layer_ids"]
    layer_convention: str = _D["layer_convention"]
    trust_remote_code: bool = _D["trust_remote_code"]  # eagle3ops.remote_code
    # stored dtype; float8_e4m3fn = e4m3 + a float32 scale per row (see quantize_fp8)
    dtype: str = _D["dtype"]
    compute_dtype: str = _D["compute_dtype"]  # bfloat16 on CUDA, float32 on CPU
    device: str = _D["device"]
    max_batch_tokens: int = _D["max_batch_tokens"]
    max_batch_size: int = _D["max_batch_size"]
    world_size: int = 1
    rank: int = 0
    fsync: bool = _D["fsync"]
    writer_threads: int = _D["writer_threads"]
    # xxh3-64 of every file in its manifest line, over the bytes the writer holds (docs/performance.md)
    checksum: bool = True
    verify: str = _D["verify"]  # the plan's check of finished files: size (headers) or checksum
    # refuse | discard (move hidden_states aside) | accept (same model)
    on_model_change: str = _D["on_model_change"]
    model_hash: bool = _D["model_hash"]  # hash every weight byte for the model check (slow; on request)
    margin_frac: float = _D["margin"]
    margin_bytes: int = 64 * 1024 * 1024
    # the PVE storage underneath the data directory (store.pool); {} = not a PVE storage volume
    pve_storage: dict = field(default_factory=dict)
    check_finite: bool = True
    limit: int | None = _D["limit"]  # only the first N rows (testing / smoke runs)
    progress: bool = _D["progress"]
    # the run's log (status.run_log_path): a progress line every 30 s goes there even without --progress
    log_path: str | None = None
    extra: dict = field(default_factory=dict)
    # several hosts (docs/scale.md): the global ranks this host's store covers, of ``world_size``; None = the
    # one rank ``rank`` (or every row with world_size 1)
    ranks: list[int] | None = None
    # on request, a lost host's ranks whose rows the surviving ranks take over (docs/scale.md, "A host that stays
    # lost"), and that host's data directory where it can still be read here (its finished rows are copied)
    reassign_ranks: list[int] | None = None
    reassign_from_data: list[str] | None = None
    # an existing dump adopted where it lies before the plan (eagle3ops.extract.adoption)
    adopt_from: str | None = None
    adopt_layer_ids: list[int] | None = None
    adopt_layer_convention: str | None = None
    adopt_last_state: str | None = None
    adopt_keys: dict = field(default_factory=dict)
    adopt_checksum: bool = _D["adopt_checksum"]

    def reassignment(self) -> Reassignment | None:
        return Reassignment.of(self.world_size, self.reassign_ranks)


def build_meta(cfg: ExtractConfig, facts: dict, layer_ids: list[int], num_rows: int) -> dict:
    return {
        "format": "speculators-0.9.0-offline",
        "layer_ids": layer_ids,
        "layer_convention": "input",
        "last_state": "pre-norm output of the last decoder layer",
        "num_layers": facts["num_layers"],
        "hidden_size": facts["hidden_size"],
        "num_states": len(layer_ids) + 1,
        "dtype": cfg.dtype,
        "model_path": str(Path(cfg.model_path).resolve()),
        "model_type": facts.get("model_type"),
        "model_fingerprint": facts["model_fingerprint"],
        "model_weights": facts.get("model_weights"),
        **({"model_content_hash": facts["model_content_hash"]} if facts.get("model_content_hash") else {}),
        "dataset_fingerprint": dataset_fingerprint(cfg.data_dir),
        "num_rows": num_rows,
        "backend": "transformers",
    }


def run_result(cfg, indices, plan, layer_ids: list[int], facts: dict) -> dict:
    """The result both backends start a run with: what the plan found, nothing written yet. ``cfg``: either
    backend's settings (its ``data_dir`` and ``dtype``)."""
    return {
        "total": len(indices),
        "done_before": plan.done,
        "adopted": plan.adopted,
        "written": 0,
        "failed": 0,
        "tokens": 0,
        "bytes": 0,
        "seconds": 0.0,
        "layer_ids": layer_ids,
        "num_layers": facts["num_layers"],
        "hidden_size": facts["hidden_size"],
        "dtype": cfg.dtype,
        "invalid_files_replaced": sorted(plan.invalid),
        "torn_manifest_lines": plan.torn_lines,
        "data_dir": str(cfg.data_dir),
    }


def disk_preflight(store_dir: Path, bytes_needed: int, cfg) -> dict:
    """The run's disk preflight (both backends', ``cfg`` either's config): ``bytes_needed`` with the margins
    against the filesystem of ``store_dir`` and the PVE storage beneath it; raises DiskSpaceError, read-only."""
    return preflight_disk(
        store_dir,
        bytes_needed,
        margin_frac=cfg.margin_frac,
        margin_bytes=cfg.margin_bytes,
        pool=cfg.pve_storage,
    )


def damaged_report(store: HiddenStateStore, damaged: dict[int, str]) -> dict:
    return {str(i): {"file": str(store.path(i)), "reason": r} for i, r in sorted(damaged.items())}


def plan_extraction(cfg: ExtractConfig) -> dict:
    """What a run would do, without loading weights or writing anything (check mode)."""
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash, trust_remote_code=cfg.trust_remote_code)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    store = HiddenStateStore(cfg.data_dir, rank=cfg.rank)
    meta = build_meta(cfg, facts, layer_ids, len(seq_lens))
    old = store.read_meta()
    action = "ok"
    if old is not None:  # same refusal as a real run, but read-only
        action, _ = meta_decision(old, meta, store.meta_path, cfg.on_model_change)
    reassign = cfg.reassignment()
    if cfg.ranks:
        check_shard(cfg.data_dir, cfg.world_size, cfg.ranks, write=False, reassign=reassign)
    indices = config_indices(cfg, len(seq_lens))
    importable = taken_from_lost_parts(cfg, len(seq_lens))
    dump = survey_dump(cfg, layer_ids, facts["hidden_size"], content=False)
    num_states = len(layer_ids) + 1
    if action == "discard":  # the run moves the old states aside and starts over: everything is to do
        plan = ResumePlan(
            remaining=list(indices),
            done=0,
            adopted=0,
            invalid={},
            torn_lines=[],
            bytes_needed=sum(
                sample_nbytes(seq_lens[i], num_states, facts["hidden_size"], cfg.dtype) for i in indices
            ),
            tokens_remaining=sum(seq_lens[i] for i in indices),
        )
    else:
        plan = store.plan(
            seq_lens,
            num_states=num_states,
            hidden_size=facts["hidden_size"],
            dtype=cfg.dtype,
            indices=indices,
            adopt=False,
            verify=cfg.verify,
        )
    free = preflight_disk(store.dir, 0)["free_bytes"]
    from_dump = predicted(dump, plan.remaining)
    # rows the dump will give cost no bytes here: the files stay where they are
    from_dump_bytes = sum(
        sample_nbytes(seq_lens[i], num_states, facts["hidden_size"], cfg.dtype)
        for i in (set(dump.rows) & set(plan.remaining) if dump is not None else ())
    )
    bytes_needed = plan.bytes_needed - from_dump_bytes
    try:  # the run's own preflight (both backends'), read-only: the filesystem and the PVE storage beneath it
        disk_preflight(store.dir, len(plan.remaining) and bytes_needed, cfg)
        does_not_fit = ""
    except DiskSpaceError as e:
        does_not_fit = str(e)
    return {
        "total": len(indices),
        "done_before": plan.done,  # plan.done already counts adopted files
        "adoptable": plan.adopted,
        # rows taken over from a lost host that its readable part holds finished: a run copies them
        "importable": len(importable),
        "to_extract": len(plan.remaining) - len(importable) - from_dump.get("dump_rows", 0),
        "tokens_to_extract": plan.tokens_remaining,
        "bytes_needed": bytes_needed,
        "free_bytes": free,
        "fits": not does_not_fit,
        "does_not_fit": does_not_fit,
        "pve_storage": cfg.pve_storage,
        "invalid_files": {str(k): v for k, v in plan.invalid.items()},
        "damaged": len(plan.damaged),
        "damaged_files": damaged_report(store, plan.damaged),
        "duplicate_manifest_lines": plan.duplicates,
        "unchecked_files": plan.unchecked,
        "verify": cfg.verify,
        "discards_store": action == "discard",
        "layer_ids": layer_ids,
        "num_layers": facts["num_layers"],
        "hidden_size": facts["hidden_size"],
        "dtype": cfg.dtype,
        "world_size": cfg.world_size,
        "ranks": list(cfg.ranks) if cfg.ranks else [cfg.rank],
        **({"reassigned": reassign.record()} if reassign else {}),
        **from_dump,
    }


def taken_rows(cfg: ExtractConfig, num_rows: int) -> dict[int, list[int]]:
    """Rank -> the lost ranks' rows it takes over, for this host's ranks (none without a re-assignment)."""
    reassign = cfg.reassignment()
    if reassign is None:
        return {}
    ranks = cfg.ranks or [cfg.rank]
    return {r: reassign.taken_rows(num_rows, r, cfg.limit) for r in ranks}


def taken_from_lost_parts(cfg: ExtractConfig, num_rows: int) -> dict:
    """Row -> (lost part, manifest line) of the rows this host takes over that a readable lost part
    (``reassign_from_data``) holds finished and this store does not: what a run copies instead of extracting."""
    from eagle3ops.extract.reassign import check_sources, importable

    sources = check_sources(cfg.reassign_from_data or [], cfg.world_size, cfg.reassignment())
    return importable(cfg.data_dir, sources, taken_rows(cfg, num_rows)) if sources else {}


def import_from_lost_parts(cfg: ExtractConfig) -> dict:
    """Copy the finished rows this host takes over from the readable lost parts into this store (the parent of a
    host's share does it once, before its workers start)."""
    from eagle3ops.extract.reassign import check_sources, import_taken_rows

    sources = check_sources(cfg.reassign_from_data or [], cfg.world_size, cfg.reassignment())
    if not sources:
        return {}
    seq_lens = load_seq_lens(cfg.data_dir)
    return import_taken_rows(cfg.data_dir, sources, taken_rows(cfg, len(seq_lens)), seq_lens, fsync=cfg.fsync)


def progress_reporter(total_samples: int, total_tokens: int, enabled: bool, log_path: str | None = None):
    """A rich progress bar on a terminal, periodic log lines otherwise; with ``log_path`` a line every 30 s is
    appended to the run's log as well (also without the bar: what an Ansible-run extraction's log shows).
    Returns (advance, close)."""
    if total_samples == 0:
        return (lambda n, t: None), (lambda: None)
    if log_path:
        shown, close_shown = progress_reporter(total_samples, total_tokens, enabled)
        return _log_lines(total_samples, total_tokens, log_path, shown), close_shown
    if not enabled:
        return (lambda n, t: None), (lambda: None)
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        prog = Progress(
            TextColumn("extract"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            transient=False,
            console=None,
        )
        task = prog.add_task("extract", total=total_samples, rate="")
        prog.start()
        t0 = time.monotonic()
        tok = [0]

        def advance(n, t):
            tok[0] += t
            rate = tok[0] / max(time.monotonic() - t0, 1e-9)
            prog.update(task, advance=n, rate=f"{rate:,.0f} tok/s")

        return advance, prog.stop

    def print_line(n, t, elapsed):
        rate = t / max(elapsed, 1e-9)
        eta = (total_tokens - t) / rate if rate else float("inf")
        print(
            f"extract: {n}/{total_samples} samples, {rate:,.0f} tok/s, ETA {eta:,.0f} s",
            file=sys.stderr,
            flush=True,
        )

    return _every(10, total_samples, print_line), (lambda: None)


def _every(seconds: float, total_samples: int, report):
    """``advance(n, t)`` that counts the rows and tokens done and calls ``report(rows, tokens, elapsed_s)`` when
    ``seconds`` have passed since it last did, and once all ``total_samples`` rows are done."""
    t0 = time.monotonic()
    state = {"n": 0, "t": 0, "last": t0}

    def advance(n, t):
        state["n"] += n
        state["t"] += t
        now = time.monotonic()
        if now - state["last"] >= seconds or state["n"] == total_samples:
            state["last"] = now
            report(state["n"], state["t"], now - t0)

    return advance


def _log_lines(total_samples: int, total_tokens: int, log_path: str, also):
    """``advance`` that calls ``also`` and appends a progress line to ``log_path`` every 30 s and at the end."""

    def write_line(n, t, elapsed):
        rate = n / max(elapsed, 1e-9)
        eta = (total_samples - n) / rate if rate else None
        line = (
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} extract (PID {os.getpid()}): {n}/{total_samples} "
            f"rows, {rate:.3g} rows/s, {t:,} tokens, ETA {'?' if eta is None else f'{eta:.0f} s'}\n"
        )
        # a full disk: the run goes on, its log falls behind
        with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as f:
            f.write(line)

    counted = _every(30, total_samples, write_line)

    def advance(n, t):
        also(n, t)
        counted(n, t)

    return advance


def repair_store(cfg: ExtractConfig) -> dict:
    """What ``extract --workers N`` does once in the parent before it starts the workers: the model check
    (with ``on_model_change``), temp-file cleanup and the verify check of every row at ``cfg.verify``, moving
    damaged files aside and collapsing duplicate manifest lines, so that no worker rewrites a manifest another
    one appends to. Returns the counts for the run's result."""
    seq_lens = load_seq_lens(cfg.data_dir)
    facts = model_facts(cfg.model_path, content_hash=cfg.model_hash, trust_remote_code=cfg.trust_remote_code)
    layer_ids = resolve_layer_ids(facts["num_layers"], cfg.layer_ids, cfg.layer_convention)
    store = HiddenStateStore(cfg.data_dir)
    dump = survey_dump(cfg, layer_ids, facts["hidden_size"])  # refused before anything is written
    discarded = store.ensure_meta(
        build_meta(cfg, facts, layer_ids, len(seq_lens)), on_model_change=cfg.on_model_change
    )
    adopted_dump = commit_dump(dump)
    store.clean_temp_files()
    plan = store.plan(
        seq_lens,
        num_states=len(layer_ids) + 1,
        hidden_size=facts["hidden_size"],
        dtype=cfg.dtype,
        indices=range(min(len(seq_lens), cfg.limit if cfg.limit is not None else len(seq_lens))),
        verify=cfg.verify,
    )
    store.close()
    return {
        # files under their final name without a manifest line (a run killed between the rename and the append),
        # recorded by this plan: the workers then find them done, so the run's result counts them from here
        "adopted": plan.adopted,
        "damaged": len(plan.damaged),
        "damaged_files": damaged_report(store, plan.damaged),
        "moved_aside": plan.moved_aside,
        "duplicate_manifest_lines": plan.duplicates,
        "unchecked_files": plan.unchecked,
        "discarded_store": discarded,
        **adopted_dump,
    }


def config_indices(cfg: ExtractConfig, num_rows: int) -> list[int]:
    """The rows this run extracts: its ranks' (``ranks``, else the one ``rank``), with the rows they take over
    when a lost host's ranks are re-assigned."""
    reassign = cfg.reassignment()
    if cfg.ranks:
        return rows_of_ranks(num_rows, cfg.world_size, cfg.ranks, cfg.limit, reassign)
    if reassign is not None:
        return reassign.rank_rows(num_rows, cfg.rank, cfg.limit)
    return rank_indices(num_rows, cfg.world_size, cfg.rank, cfg.limit)
