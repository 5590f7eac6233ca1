"""The train phase's inputs, read and checked, never re-typed: the extraction's meta (the aux layer ids), the
verifier's config, the finished samples (manifests and the cheap file check; their content against the
manifests' checksums, once per file: :func:`check_content`), the token frequencies and the draft vocabulary
built from them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from eagle3ops import checkpoint_files, layers, remote_code
from eagle3ops.durable import atomic_write_bytes
from eagle3ops.store import HS_DIR, META_NAME, HiddenStateStore, adopted, human_bytes, verify_content
from eagle3ops.store.layout import DATASET_FILES
from eagle3ops.train.spec import (
    DEFAULT_DRAFT_VOCAB,
    TrainError,
)


def read_extract_meta(data_dir: str | os.PathLike) -> tuple[dict, Path]:
    path = Path(data_dir) / HS_DIR / META_NAME
    if not path.exists():
        raise TrainError(
            f"{path} is missing: {data_dir} holds no extracted hidden states. Run the extract phase first "
            "(ansible-playbook site.yml --tags extract, or `eagle3ops extract --data DIR --model M`).",
            inputs_pending=True,
        )
    try:
        return json.loads(path.read_text()), path
    except ValueError as e:
        raise TrainError(f"{path}: not valid JSON ({e}); re-run the extract phase to rewrite it.") from e


def layer_ids_from_meta(meta: dict, meta_path: Path, given: list[int] | None) -> list[int]:
    """The aux layer ids the hidden states were extracted with (extract_meta.json), checked: input convention,
    distinct, and equal to the train setting ``given`` when there is one (ids are never re-typed)."""
    ids = meta.get("layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise TrainError(f"{meta_path}: no usable layer_ids ({ids!r}); re-run the extract phase.")
    if meta.get("layer_convention", "input") != "input":
        raise TrainError(
            f"{meta_path}: layer_convention is {meta.get('layer_convention')!r}; speculators' "
            "--target-layer-ids names layer *inputs*. Re-extract with the input convention."
        )
    if given is not None and [int(i) for i in given] != ids:
        raise TrainError(
            f"train layer ids {list(given)} differ from the ids the hidden states were extracted with, {ids} "
            f"({meta_path}). Training on other ids than the ones captured silently ruins acceptance. Remove "
            "the train layer_ids setting (they are read from the extraction metadata), or re-extract with "
            f"layer ids {list(given)}."
        )
    if len(set(ids)) != len(ids):
        raise TrainError(f"{meta_path}: layer ids {ids} are not distinct; speculators refuses them.")
    return ids


def _check_shards(verifier: Path) -> None:
    """The trainer reads the verifier's embedding and lm_head from its safetensors: a shard the index lists that is
    missing or truncated is refused here, before a run directory or a trainer process exists (headers only)."""
    if (
        not (verifier / checkpoint_files.INDEX).is_file()
        and not (verifier / checkpoint_files.SINGLE).is_file()
    ):
        return  # not safetensors (or no weights yet): the trainer's own loader says what is wrong
    try:
        checkpoint_files.tensors(verifier)
    except checkpoint_files.CheckpointError as e:
        raise TrainError(f"the verifier (train_verifier_path): {e}") from None


def verifier_facts(verifier_path: str, trust_remote_code: bool = False) -> dict:
    """The verifier's shapes from its config.json (``text_config`` first); a remote-code verifier is refused
    unless ``trust_remote_code`` (eagle3ops.remote_code)."""
    cfg_path = Path(verifier_path) / "config.json"
    if not cfg_path.exists():
        raise TrainError(
            f"{cfg_path} is missing: the verifier must be a local model directory (no hub access offline). "
            "Set train_verifier_path to the target model the hidden states were extracted from.",
            inputs_pending=True,
        )
    try:
        found = remote_code.check(verifier_path, trust_remote_code)
    except remote_code.RemoteCodeError as e:
        raise TrainError(str(e)) from None
    _check_shards(Path(verifier_path))
    cfg = json.loads(cfg_path.read_text())
    text = layers.text_config(cfg)
    return {
        "num_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        "pad_token_id": text.get("pad_token_id", cfg.get("pad_token_id")),
        "eos_token_id": text.get("eos_token_id", cfg.get("eos_token_id")),
        "has_tokenizer": any(
            (Path(verifier_path) / n).exists() for n in ("tokenizer.json", "tokenizer_config.json")
        ),
        "remote_code": bool(found),
    }


def check_verifier_matches(meta: dict, meta_path: Path, facts: dict, verifier_path: str) -> list[str]:
    warnings = []
    for key in ("num_layers", "hidden_size"):
        if meta.get(key) is not None and facts.get(key) is not None and meta[key] != facts[key]:
            raise TrainError(
                f"the verifier {verifier_path} has {key}={facts[key]} but the hidden states in {meta_path} were "
                f"extracted from a model with {key}={meta[key]} ({meta.get('model_path')}). Point "
                "train_verifier_path at the model the states came from, or re-extract with this one."
            )
    mp = meta.get("model_path")
    if mp and Path(mp).exists() and Path(mp).resolve() != Path(verifier_path).resolve():
        warnings.append(f"extract_meta.json names model {mp}; training with verifier {verifier_path}")
    return warnings


def check_samples(data_dir: str, meta: dict, on_missing: str) -> dict:
    """Rows vs. finished samples, from the manifests only (no tensor is opened)."""
    data = Path(data_dir)
    if not any((data / n).exists() for n in DATASET_FILES):
        raise TrainError(
            f"{data_dir} holds no Arrow dataset (dataset_info.json/state.json missing). Run the prepare "
            "phase, then extract, or point train_data_dir at their output.",
            inputs_pending=True,
        )
    num_rows = meta.get("num_rows")
    if num_rows is None:
        from datasets import load_from_disk

        num_rows = len(load_from_disk(str(data)))
    store = HiddenStateStore(data)
    rows = store.scan_manifest().rows()
    if all(meta.get(k) for k in ("num_states", "hidden_size", "dtype")):
        # the extract plan's cheap check (exists, recorded size, safetensors header): a file damaged or
        # deleted after it was written must not reach speculators, whatever train_on_missing says
        damaged, _ = store.check_files(
            rows.values(),
            {i: r["n"] for i, r in rows.items()},
            num_states=meta["num_states"],
            hidden_size=meta["hidden_size"],
            dtype=meta["dtype"],
        )
        if damaged:
            raise TrainError(
                f"{len(damaged)} hidden-state files in {store.dir} are damaged or missing ("
                + _first_ten(store, damaged)
                + "). Run the extract phase again: it moves them to hidden_states/damaged/ and extracts "
                "those rows anew (`eagle3ops extract-verify --data DIR` lists them).",
                inputs_pending=True,
            )
    taken = adopted.read_rows(store.dir)  # rows an adopted dump holds where it lies (store.adopt)
    lost = adopted.check_rows({i: r for i, r in taken.items() if i not in rows})
    if lost:
        raise TrainError(
            f"{len(lost)} adopted hidden-state files are gone or changed since their adoption ("
            + "; ".join(f"row {i}: {r}" for i, r in sorted(lost.items())[:10])
            + "). Run the extract phase again: it drops them from hidden_states/adopted.jsonl and extracts "
            "those rows anew.",
            inputs_pending=True,
        )
    lengths = {i: r["n"] for i, r in {**taken, **rows}.items()}
    done = sum(1 for i in lengths if i < num_rows)
    if on_missing == "raise" and done < num_rows:
        raise TrainError(
            f"extraction is incomplete in {data_dir}: {done} of {num_rows} rows have hidden states "
            f"(manifests in {data / HS_DIR}). Finish it (the extract phase resumes where it stopped), or set "
            "train_on_missing: skip to train on what is there.",
            inputs_pending=True,
        )
    return {"rows": num_rows, "samples_with_states": done, "tokens": sum(lengths.values())}


# Below this many tokens of hidden states a draft is data-limited: acceptance still rises steeply with more data
# (measured, SmolLM2-135M target, MT-bench at 3/1/4: 1.55 M tokens gave 1.66, 8.27 M gave 2.35; docs/performance.md
# "Fourth box run"; speculators' own 5k-sample examples report 1.45-1.53 on 8B targets).
DATA_LIMITED_TOKENS = 5_000_000


def data_limited_warning(samples: dict) -> str | None:
    """A warning when the store is small enough that the draft's acceptance is limited by its data (users' pain 5
    and 16: low acceptance from too little data, found only after training and serving), else None."""
    tokens = int(samples.get("tokens") or 0)
    if tokens >= DATA_LIMITED_TOKENS:
        return None
    return (
        f"the hidden states hold {tokens:,} tokens in {samples.get('samples_with_states', 0):,} samples, under "
        f"{DATA_LIMITED_TOKENS / 1e6:.0f} M: expect a data-limited draft (measured on SmolLM2-135M, MT-bench "
        "acceptance at 3/1/4: 1.55 M tokens gave 1.66, 8.27 M gave 2.35; docs/performance.md). More conversations, "
        "regenerated by the target, raise it most (the real profile's runtime_assets_sharegpt_limit, or a larger "
        "dataset of your own), then prepare and extract again"
    )


def _first_ten(store: HiddenStateStore, damaged: dict, rows: dict | None = None) -> str:
    """The first ten of ``damaged`` (row -> what is wrong), ``row I: FILE: reason``, and how many more (``rows``:
    the lines read, whose ``p`` names an adopted file where it lies)."""
    shown = "; ".join(f"row {i}: {_file(store, rows, i)}: {r}" for i, r in sorted(damaged.items())[:10])
    return shown + (f"; and {len(damaged) - 10} more" if len(damaged) > 10 else "")


def _file(store: HiddenStateStore, rows: dict | None, i: int) -> str:
    return str((rows or {}).get(i, {}).get("p") or store.path(i))


def check_content(data_dir: str | os.PathLike, *, check: bool, log) -> dict:
    """Every hidden-state file's content against the checksum its writer recorded, reading only the files not
    verified since they last changed (:mod:`eagle3ops.store.verified`; an unchanged store costs a stat a file).
    Refuses damaged files by name (issue 32: a 16-byte flip passed the size + header check and reached
    training). ``check``: read nothing; say how much a real run would read."""
    store = HiddenStateStore(data_dir)
    rows = {**adopted.read_rows(store.dir), **store.scan_manifest().rows()}  # native files win over adopted
    t0 = time.monotonic()
    if not check:
        pending = verify_content(store.dir, rows.values(), check=True)
        if pending["to_verify"]:
            log(
                f"checking the content of {pending['to_verify']} hidden-state files "
                f"({human_bytes(pending['bytes_to_verify'])}) against their manifest checksums (once per file; "
                f"{pending['already_verified']} verified before and unchanged)"
            )
    res = verify_content(store.dir, rows.values(), check=check, on_bytes=_every_10s(log))
    res["seconds"] = round(time.monotonic() - t0, 2)
    damaged = res.pop("damaged")
    if damaged:
        raise TrainError(
            f"{len(damaged)} hidden-state files in {store.dir} do not hold the bytes their writer recorded ("
            + _first_ten(store, damaged, rows)
            + "). Nothing was trained on them. Move them aside and extract those rows again: "
            f"`eagle3ops extract-verify --data {data_dir} --level checksum --move-aside`, then the extract phase (or "
            "the extract phase "
            "with extract_verify: checksum, which does both).",
            damaged_files={
                str(i): {"file": _file(store, rows, i), "reason": r} for i, r in sorted(damaged.items())
            },
        )
    if res["bytes_read"]:
        rate = res["bytes_read"] / max(res["seconds"], 1e-6)
        log(
            f"content check: {res['verified']} files ({human_bytes(res['bytes_read'])}) match their checksums, "
            f"{human_bytes(rate)}/s; recorded in {store.dir}/verified.jsonl"
        )
    return res


def content_status(data_dir: str | os.PathLike, *, check: bool, job_file=None, log=print) -> dict:
    """``eagle3ops train-verify``: the content check :func:`check_content` runs before a launch, as a step of its
    own (the role runs it detached and polls it, so a first check of a large store shows how far it is). Not
    ``check``: verify what the record does not vouch for (``changed`` when a file was newly recorded). ``check``:
    read nothing; what a check would read, and the progress of one running now (from the record); ``job_file``:
    also whether the Ansible async job running it has ended (``job_finished``)."""
    from eagle3ops.progress import async_job_finished, describe

    store = HiddenStateStore(data_dir)
    if store.dir.is_dir():
        res = check_content(data_dir, check=check, log=log)
    else:  # nothing extracted yet: nothing to verify
        res = {"verified": 0, "already_verified": 0, "bytes_already_verified": 0, "bytes_read": 0}
        res.update(to_verify=0, bytes_to_verify=0, files_per_s=None)
    res["changed"] = bool(res["verified"])
    # after a check, what it read is verified too (a damaged file raised before this)
    done = res["already_verified"] + (0 if check else res["verified"])
    done_bytes = res["bytes_already_verified"] + (0 if check else res["bytes_read"])
    total = res["already_verified"] + res["to_verify"]
    total_bytes = res["bytes_already_verified"] + res["bytes_to_verify"]
    res["progress"] = describe(
        "train content check",
        done,
        total,
        "files",
        res["files_per_s"],
        None,
        extra=f"{human_bytes(done_bytes)} of {human_bytes(total_bytes)} match their checksums",
    )
    if job_file:
        res["job_finished"] = async_job_finished(job_file)
    return res


def _every_10s(log):
    """An ``on_bytes`` that logs the bytes read so far every 10 seconds (a long first verification says where it
    is)."""
    state = {"n": 0, "last": time.monotonic()}

    def on_bytes(n: int) -> None:
        state["n"] += n
        now = time.monotonic()
        if now - state["last"] >= 10:
            state["last"] = now
            log(f"content check: {human_bytes(state['n'])} read")

    return on_bytes


def read_token_freq(path: Path) -> dict[int, int]:
    import torch

    if not path.exists():
        raise TrainError(
            f"{path} is missing: the draft vocabulary is built from the token frequencies the prepare phase "
            "counts. Re-run prepare, or set train_token_freq_path.",
            inputs_pending=True,
        )
    freq = torch.load(path, weights_only=True)
    if not isinstance(freq, dict) or not freq:
        raise TrainError(f"{path}: expected a non-empty {{token_id: count}} dict, got {type(freq).__name__}")
    return {int(k): int(v) for k, v in freq.items() if int(v) > 0}


def draft_vocab(requested: int | None, distinct: int, target_vocab: int | None) -> tuple[int, bool]:
    """The draft vocab size: requested (or 32000), capped at the distinct tokens seen (and the target's)."""
    want = DEFAULT_DRAFT_VOCAB if requested is None else int(requested)
    if want <= 0:
        raise TrainError(f"train draft_vocab_size must be positive, got {want}")
    cap = min(distinct, target_vocab or distinct)
    return (min(want, cap), want > cap)


def write_vocab_maps(freq: dict[int, int], size: int, target_vocab: int, out_dir: Path) -> tuple[Path, Path]:
    """d2t/t2d with speculators' own algorithm, into the run directory (atomic writes)."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d2t, t2d = build_vocab_mappings_from_distribution(freq, size, target_vocab)
    paths = (out_dir / f"d2t-{size}.npy", out_dir / f"t2d-{size}.npy")
    for path, arr in zip(paths, (d2t, t2d), strict=True):
        write_npy(path, arr.cpu().numpy())
    return paths


def write_npy(path: Path, arr) -> None:
    """One vocabulary map as a .npy file, written atomically (its directory made if missing)."""
    import io

    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())
