"""The ``train`` phase: an EAGLE-3 draft trained by speculators 0.9.0 as an idempotent, detached task.

One **run directory** holds everything about one training run::

    RUN/config.yaml      the rendered speculators config (templates/speculators_train.yaml.j2)
    RUN/state.json       launcher bookkeeping: attempt, PID, launcher (systemd unit or setsid), command
                         line, the config's sha256, launch time
    RUN/train.pid        the PID of the detached trainer (setsid launches; systemd units too)
    RUN/train.log        stdout+stderr of every attempt, appended, one header line per attempt
    RUN/metrics.jsonl    every speculators metric record as JSON (written by eagle3ops.speculators_shim),
                         with one ``attempt`` marker line per launch
    RUN/exit.json        written by the shim when the trainer ends: finished | failed | interrupted
    RUN/vocab/           d2t/t2d maps built here from token_freq.pt (never speculators' cache in the data
                         directory, which goes stale when token_freq.pt changes: speculators#1081)
    RUN/checkpoints/     speculators' save_path (default): 0/, 1/, ... checkpoint_best

**The state machine** (``ensure_run``), decided under the run directory's lock (``eagle3ops.runlock``; a
second ``train`` deciding at the same time fails naming the first), never while a prepare/extract run holds
the data directory:

- no state                                       -> launch                         (changed)
- PID alive and its command line is our trainer  -> running, nothing to do         (not changed)
- exit.json says finished for this attempt       -> finished, report metrics       (not changed)
- otherwise (killed, crashed, failed, interrupted) -> relaunch; speculators resumes
  from the newest checkpoint in save_path (an incomplete newest checkpoint, left by a kill during the
  save, is moved aside first so the resume does not crash on it)               (changed)
- the rendered config differs from the run's     -> fail, unless restart_on_change: then stop the
  running trainer, move the old checkpoints aside and start over              (changed)

Inputs are read, not re-typed: the aux layer ids come from ``hidden_states/extract_meta.json`` (a
user-given value must match them), the draft vocabulary from ``token_freq.pt`` (capped at the number
of distinct tokens: a draft vocab larger than that crashed SpecForge, #76).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3ops import layers
from eagle3ops.store import HS_DIR, META_NAME, HiddenStateStore, atomic_write_bytes, atomic_write_json

SHIM_MODULE = "eagle3ops.speculators_shim"
# what a run trains with: speculators (through the shim), or the minimal DDP job of eagle3ops.ddp_probe, which
# goes through the same launcher, rendezvous, data and checkpoints (a cluster check; the multi-node trainer on CPU)
TRAINERS = {"speculators": SHIM_MODULE, "ddp_probe": "eagle3ops.ddp_probe"}
TEMPLATE = "speculators_train.yaml.j2"
STATE = "state.json"
CONFIG = "config.yaml"
LOG = "train.log"
METRICS = "metrics.jsonl"
EXIT = "exit.json"
PIDFILE = "train.pid"
DEFAULT_DRAFT_VOCAB = 32000
# config keys the role manages itself; `extra` may not override them (set the role variable instead)
MANAGED_KEYS = {
    "verifier": {"verifier_name_or_path"},
    "draft": {
        "num_layers",
        "target_layer_ids",
        "draft_vocab_size",
        "d2t_path",
        "t2d_path",
        "norm_before_residual",
        "draft_attn_impl",
        "sliding_window",
        "full_attention_indices",
        "mask_token_id",
        "token_freq_path",
    },
    "data": {
        "data_path",
        "total_seq_len",
        "train_data_ratio",
        "hidden_states_dtype",
        "num_workers",
        "hidden_states_backend",
    },
    "loss": {"loss_implementation", "ttt_steps"},
    "optimizer": {"lr"},
    "scheduler": set(),
    "trainer": {"epochs", "save_path", "checkpoint_freq", "log_freq", "max_steps"},
}


class TrainError(Exception):
    """A problem the user must act on; the message names the file/PID and what to do."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


@dataclass
class TrainSpec:
    data_dir: str
    verifier_path: str
    run_dir: str
    save_path: str | None = None
    layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    token_freq_path: str | None = None
    epochs: int = 3
    lr: float = 1e-3
    ttt_steps: int = 3
    num_layers: int = 1
    total_seq_len: int = 8192
    train_data_ratio: float = 0.9
    max_steps: int | None = None
    checkpoint_freq: float = 1.0
    log_freq: int = 1
    seed: int = 42
    norm_before_residual: bool = False
    attention: str = "full"  # full | sliding
    sliding_window: int = 2048
    on_missing: str = "raise"
    mask_token_id: int | None = None
    device: str = "auto"  # auto | cpu | gpu
    nproc: int | None = None
    num_workers: int | None = None
    draft_attn_impl: str | None = None
    loss_implementation: str | None = None
    extra: dict = field(default_factory=dict)
    restart_on_change: bool = False
    launcher: str = "auto"  # auto | systemd | setsid
    unit_name: str | None = None
    python: str | None = None
    gpu_free_check: bool = True
    gpu_free_timeout: float = 60
    env: dict = field(default_factory=dict)
    # several hosts (docs/scale.md): torchrun on each, one c10d rendezvous on ``rdzv_endpoint`` (the first host)
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT, the same on every node
    rdzv_id: str | None = None  # the same on every node; default from the run directory's path
    nic: str | None = None  # network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    trainer: str = "speculators"  # a key of TRAINERS


# ---------------------------------------------------------------- inputs ---------------------------------


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def verifier_facts(verifier_path: str) -> dict:
    cfg_path = Path(verifier_path) / "config.json"
    if not cfg_path.exists():
        raise TrainError(
            f"{cfg_path} is missing: the verifier must be a local model directory (no hub access offline). "
            "Set train_verifier_path to the target model the hidden states were extracted from.",
            inputs_pending=True,
        )
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
    if not (data / "dataset_info.json").exists() and not (data / "state.json").exists():
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
            shown = "; ".join(f"row {i}: {store.path(i)}: {r}" for i, r in sorted(damaged.items())[:10])
            raise TrainError(
                f"{len(damaged)} hidden-state files in {store.dir} are damaged or missing ({shown}"
                + (f"; and {len(damaged) - 10} more" if len(damaged) > 10 else "")
                + "). Run the extract phase again: it moves them to hidden_states/damaged/ and extracts "
                "those rows anew (`eagle3ops verify --data DIR` lists them).",
                inputs_pending=True,
            )
    lengths = {i: r["n"] for i, r in rows.items()}
    done = sum(1 for i in lengths if i < num_rows)
    if on_missing == "raise" and done < num_rows:
        raise TrainError(
            f"extraction is incomplete in {data_dir}: {done} of {num_rows} rows have hidden states "
            f"(manifests in {data / HS_DIR}). Finish it (the extract phase resumes where it stopped), or set "
            "train_on_missing: skip to train on what is there.",
            inputs_pending=True,
        )
    return {"rows": num_rows, "samples_with_states": done, "tokens": sum(lengths.values())}


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
    import io

    import numpy as np
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d2t, t2d = build_vocab_mappings_from_distribution(freq, size, target_vocab)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / f"d2t-{size}.npy", out_dir / f"t2d-{size}.npy")
    for path, arr in zip(paths, (d2t, t2d), strict=True):
        buf = io.BytesIO()
        np.save(buf, arr.cpu().numpy())
        atomic_write_bytes(path, buf.getvalue())
    return paths


# ---------------------------------------------------------------- device / config ------------------------


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def check_nodes(spec: TrainSpec, device: str) -> None:
    """The multi-node settings, before anything is launched (one line naming what to set)."""
    if spec.nnodes < 1 or not 0 <= spec.node_rank < spec.nnodes:
        raise TrainError(
            f"train node_rank {spec.node_rank} is outside nnodes {spec.nnodes}: the node rank is this host's "
            "index in train_hosts (0 = the rendezvous host)"
        )
    if spec.nnodes == 1:
        return
    ep = spec.rdzv_endpoint or ""
    host, _, port = ep.rpartition(":")
    if not host or not port.isdigit():
        raise TrainError(
            f"train over {spec.nnodes} nodes needs rdzv_endpoint HOST:PORT (the first host, reachable from every "
            f"node), got {ep!r}"
        )
    if device == "cpu" and spec.trainer == "speculators":
        raise TrainError(
            f"train over {spec.nnodes} nodes on CPU: speculators 0.9.0 cannot - its "
            "speculators/train/distributed.py maybe_setup_distributed() calls "
            "torch.accelerator.set_device_index(LOCAL_RANK) ('Cannot access accelerator device when none is "
            "available') and shards the draft with FSDP on that device. Train on GPU hosts (NCCL), or on one "
            "host (train_hosts: [one host]). The launcher's rendezvous itself runs on CPU: train_trainer: ddp_probe "
            "runs the minimal DDP job of eagle3ops.ddp_probe through it."
        )


def torchrun_argv(
    python: str,
    target: list[str],
    *,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """torchrun (``python -m torch.distributed.run``) for ``target`` (``["-m", module, ...]`` or a script): one
    host standalone, or node ``node_rank`` of ``nnodes`` meeting at the c10d rendezvous on ``rdzv_endpoint``."""
    if nnodes == 1:
        head = ["--standalone", f"--nproc_per_node={nproc}"]
    else:
        head = [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
            # node 0 is the endpoint's host by construction (the first of train_hosts): say so, instead of
            # torch's guess from the machine's hostname (which fails where the name resolves to 127.0.1.1)
            f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}",
        ]
    return [python, "-m", "torch.distributed.run", *head, *target]


def rdzv_id_for(spec: TrainSpec) -> str:
    return spec.rdzv_id or f"eagle3-{hashlib.sha256(str(Path(spec.run_dir)).encode()).hexdigest()[:10]}"


def resolve_device(spec: TrainSpec) -> tuple[str, int]:
    gpus = visible_gpus()
    if spec.device == "cpu" or (spec.device == "auto" and gpus == 0):
        return "cpu", 1
    if gpus == 0:
        raise TrainError(
            "train device is 'gpu' but no CUDA device is visible (torch.cuda.device_count() == 0)."
        )
    nproc = spec.nproc or gpus
    if nproc > gpus:
        raise TrainError(f"train nproc={nproc} but only {gpus} GPUs are visible (CUDA_VISIBLE_DEVICES?).")
    return "gpu", nproc


def speculators_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("speculators")
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def render_config(values: dict) -> str:
    import importlib.resources

    import jinja2

    text = importlib.resources.files("eagle3ops").joinpath("templates", TEMPLATE).read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    out = env.from_string(text).render(**values)
    return out if out.endswith("\n") else out + "\n"


def check_extra(extra: dict) -> None:
    for group, kv in (extra or {}).items():
        if group not in MANAGED_KEYS or not isinstance(kv, dict):
            raise TrainError(
                f"train extra_config: unknown group {group!r}; use one of {sorted(MANAGED_KEYS)} with a mapping "
                "of speculators config keys (see `speculators train --help`)."
            )
        clash = sorted(set(kv) & MANAGED_KEYS[group])
        if clash:
            raise TrainError(
                f"train extra_config.{group} sets {clash}, which the role manages; set the train_* variable instead."
            )


@dataclass
class Plan:
    spec: TrainSpec
    run_dir: Path
    save_path: Path
    config_text: str
    config_sha256: str
    values: dict
    device: str
    nproc: int
    token_freq: dict
    target_vocab: int
    warnings: list = field(default_factory=list)
    samples: dict = field(default_factory=dict)


def plan(spec: TrainSpec) -> Plan:
    """Read the inputs and render the config; writes nothing."""
    check_extra(spec.extra)
    if spec.trainer not in TRAINERS:
        raise TrainError(f"train trainer must be one of {sorted(TRAINERS)}, got {spec.trainer!r}")
    if spec.attention not in ("full", "sliding"):
        raise TrainError(f"train attention must be 'full' or 'sliding', got {spec.attention!r}")
    data = Path(spec.data_dir).resolve()
    run_dir = Path(spec.run_dir).resolve()
    meta, meta_path = read_extract_meta(data)
    layer_ids = layer_ids_from_meta(meta, meta_path, spec.layer_ids)
    facts = verifier_facts(spec.verifier_path)
    warnings = check_verifier_matches(meta, meta_path, facts, spec.verifier_path)
    samples = check_samples(str(data), meta, spec.on_missing)
    tf_path = Path(spec.token_freq_path) if spec.token_freq_path else data / "token_freq.pt"
    freq = read_token_freq(tf_path)
    size, capped = draft_vocab(spec.draft_vocab_size, len(freq), facts["vocab_size"])
    if capped:
        warnings.append(
            f"draft vocab capped at {size}: {tf_path} counts only {len(freq)} distinct tokens "
            f"(requested {spec.draft_vocab_size or DEFAULT_DRAFT_VOCAB})"
        )
    tf_sha = sha256_file(tf_path)
    device, nproc = resolve_device(spec)
    check_nodes(spec, device)
    cpu = device == "cpu"
    num_workers = spec.num_workers
    if num_workers is None:
        num_workers = 0 if cpu else max(1, min(12, (os.cpu_count() or 2) // nproc - 1))
    mask = spec.mask_token_id
    if mask is None and not facts["has_tokenizer"]:
        # speculators resolves it from the verifier's tokenizer; EAGLE-3 does not use it
        mask = facts["pad_token_id"] if isinstance(facts["pad_token_id"], int) else 0
    save_path = Path(spec.save_path).resolve() if spec.save_path else run_dir / "checkpoints"
    vocab_dir = run_dir / "vocab" / tf_sha[:12]
    values = {
        "speculators_version": speculators_version(),
        "trainer_module": TRAINERS[spec.trainer],
        "meta_path": str(meta_path),
        "token_freq_path": str(tf_path),
        "token_freq_sha256": tf_sha,
        "distinct_tokens": len(freq),
        "draft_vocab_requested": spec.draft_vocab_size or DEFAULT_DRAFT_VOCAB,
        "draft_vocab_size": size,
        "draft_vocab_capped": capped,
        "device": device,
        "seed": spec.seed,
        "verifier_path": str(Path(spec.verifier_path).resolve()),
        "num_layers": spec.num_layers,
        "layer_ids": layer_ids,
        "d2t_path": str(vocab_dir / f"d2t-{size}.npy"),
        "t2d_path": str(vocab_dir / f"t2d-{size}.npy"),
        "norm_before_residual": spec.norm_before_residual,
        "draft_attn_impl": spec.draft_attn_impl or ("sdpa" if cpu else "simple_flex_attention"),
        "attention": spec.attention,
        "sliding_window": spec.sliding_window,
        "full_attention_indices": list(range(spec.num_layers)) if spec.attention == "full" else [],
        "mask_token_id": mask,
        "data_path": str(data),
        "total_seq_len": spec.total_seq_len,
        "train_data_ratio": spec.train_data_ratio,
        "hidden_states_dtype": "bfloat16"
        if meta.get("dtype") in (None, "bfloat16", "float8_e4m3fn")
        else meta["dtype"],
        "num_workers": num_workers,
        "on_missing": spec.on_missing,
        # eager everywhere by default: speculators 0.9.0's fused KL loss failed under torch 2.11's dynamo on an H200
        "loss_implementation": spec.loss_implementation or "eager",
        "ttt_steps": spec.ttt_steps,
        "lr": spec.lr,
        "epochs": spec.epochs,
        "save_path": str(save_path),
        "checkpoint_freq": spec.checkpoint_freq,
        "log_freq": spec.log_freq,
        "max_steps": spec.max_steps,
        "log_dir": str(run_dir / "logs"),
        "extra": spec.extra or {},
        # fp8 stores (extract dtype float8_e4m3fn: e4m3 + hidden_states_scales) are read by hs_connectors'
        # FP8Transfer; the default file backend would hand the trainer unscaled e4m3 values
        "hidden_states_backend": "fp8" if meta.get("dtype") == "float8_e4m3fn" else "file",
    }
    text = render_config(values)
    return Plan(
        spec=spec,
        run_dir=run_dir,
        save_path=save_path,
        config_text=text,
        config_sha256=hashlib.sha256(text.encode()).hexdigest(),
        values=values,
        device=device,
        nproc=nproc,
        token_freq=freq,
        target_vocab=int(facts["vocab_size"]),
        warnings=warnings,
        samples=samples,
    )


# ---------------------------------------------------------------- processes --------------------------------


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split(" ", 1)[0]


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_our_trainer(pid: int | None, config_path: Path) -> bool:
    """PID alive (not a zombie) and its command line runs one of our trainers on this run's config."""
    if not pid or pid <= 0:
        return False
    st = _proc_state(pid)
    if st is None or st in ("Z", "X"):
        return False
    argv = cmdline(pid) or []
    return any(m in argv for m in TRAINERS.values()) and str(config_path) in argv


def systemd_is_pid1() -> bool:
    return os.path.isdir("/run/systemd/system") and shutil.which("systemd-run") is not None


def unit_name_for(run_dir: Path, given: str | None) -> str:
    if given:
        return given if given.endswith(".service") else f"{given}.service"
    return f"eagle3-train-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:10]}.service"


def build_command(plan_: Plan, python: str) -> list[str]:
    cfg = str(plan_.run_dir / CONFIG)
    spec = plan_.spec
    module = TRAINERS[spec.trainer]
    if plan_.device == "cpu" and spec.nnodes == 1:
        return [python, "-m", module, "--config", cfg]
    return torchrun_argv(
        python,
        ["-m", module, "--config", cfg],
        nproc=plan_.nproc,
        nnodes=spec.nnodes,
        node_rank=spec.node_rank,
        rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_id=rdzv_id_for(spec),
    )


def _env(plan_: Plan) -> dict:
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "EAGLE3OPS_METRICS": str(plan_.run_dir / METRICS),
        "EAGLE3OPS_EXIT": str(plan_.run_dir / EXIT),
        "EAGLE3OPS_RUN_ID": f"train:{plan_.run_dir}",
    }
    if plan_.spec.nic:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = plan_.spec.nic
    if plan_.device == "cpu":
        env["EAGLE3OPS_FORCE_CPU"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # speculators picks its autocast device from the visible accelerator
    env.update({str(k): str(v) for k, v in (plan_.spec.env or {}).items()})
    return env


def launch(plan_: Plan, attempt: int, launcher: str, log, resume_from: dict | None = None) -> dict:
    """Start the trainer detached; return its state record."""
    run_dir = plan_.run_dir
    python = plan_.spec.python or sys.executable
    cmd = build_command(plan_, python)
    env = _env(plan_)
    log_path = run_dir / LOG
    pidfile = run_dir / PIDFILE
    (run_dir / EXIT).unlink(missing_ok=True)
    pidfile.unlink(missing_ok=True)
    started = time.time()
    with open(run_dir / METRICS, "a") as f:
        f.write(json.dumps({"kind": "attempt", "attempt": attempt, "time": round(started, 3)}) + "\n")
    with open(log_path, "a") as f:
        f.write(
            f"\n===== eagle3ops train: attempt {attempt} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} "
            f"({launcher}): {' '.join(cmd)}\n"
        )
    unit = None
    if launcher == "systemd":
        unit = unit_name_for(run_dir, plan_.spec.unit_name)
        subprocess.run(["systemctl", "reset-failed", unit], capture_output=True, check=False)
        active = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
        if active.stdout.strip() in ("active", "activating", "deactivating"):
            raise TrainError(
                f"systemd unit {unit} is {active.stdout.strip()} but {run_dir / STATE} does not know it. Stop it "
                f"(systemctl stop {unit}) or set train_unit_name to another name."
            )
        argv = [
            "systemd-run",
            f"--unit={unit}",
            "--collect",
            "--quiet",
            "--property=Type=exec",
            f"--working-directory={run_dir}",
            f"--property=StandardOutput=append:{log_path}",
            f"--property=StandardError=append:{log_path}",
            "--property=KillMode=control-group",
            "--property=TimeoutStopSec=150",
            *[f"--setenv={k}={v}" for k, v in env.items()],
            "--",
            *cmd,
        ]
        r = subprocess.run(argv, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise TrainError(f"systemd-run could not start {unit} (exit {r.returncode}): {r.stderr.strip()}")
        pid = 0
        for _ in range(50):
            out = subprocess.run(
                ["systemctl", "show", "-P", "MainPID", unit], capture_output=True, text=True, check=False
            ).stdout.strip()
            pid = int(out or 0)
            if pid:
                break
            time.sleep(0.1)
        atomic_write_bytes(pidfile, f"{pid}\n".encode())
    else:
        full_env = {**os.environ, **env}
        argv = ["setsid", "--fork", "sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *cmd]
        with open(log_path, "ab") as out:
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=run_dir,
                env=full_env,
                check=True,
                close_fds=True,
            )
        pid = 0
        for _ in range(100):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip() or 0)
            if pid:
                break
            time.sleep(0.05)
        if not pid:
            raise TrainError(f"the trainer did not write its PID to {pidfile} within 5 s; see {log_path}")
    state = {
        "version": 1,
        "attempt": attempt,
        "pid": pid,
        "launcher": launcher,
        "unit": unit,
        "command": cmd,
        "config_sha256": plan_.config_sha256,
        "started_at": started,
        "device": plan_.device,
        "nproc": plan_.nproc,
        "nnodes": plan_.spec.nnodes,
        "node_rank": plan_.spec.node_rank,
        # the job this node belongs to (docs/scale.md): the train role restarts every node when they differ
        "rdzv_id": rdzv_id_for(plan_.spec) if plan_.spec.nnodes > 1 else None,
        "trainer": plan_.spec.trainer,
        "save_path": str(plan_.save_path),
        "resume_from": resume_from,
    }
    atomic_write_json(run_dir / STATE, state)
    log(f"launched attempt {attempt}: PID {pid} ({launcher}{' ' + unit if unit else ''}), log {log_path}")
    return state


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc's parent links), children first."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split(" ", 2)[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stop_run(run_dir: Path, state: dict, grace_s: float = 60, log=lambda s: None) -> bool:
    """Stop the trainer of ``state`` (whole process group / unit). True when something was stopped.

    torchrun starts each worker in a session of its own: the agent's process group does not hold them, and
    an agent killed with SIGKILL leaves them running (and, on GPUs, holding memory). SIGTERM lets the agent
    stop them; the SIGKILL after ``grace_s`` goes to the agent's group and to every descendant found before."""
    pid = state.get("pid")
    if not is_our_trainer(pid, run_dir / CONFIG):
        return False
    if state.get("launcher") == "systemd" and state.get("unit"):
        subprocess.run(["systemctl", "stop", state["unit"]], capture_output=True, check=False)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_our_trainer(pid, run_dir / CONFIG):
        time.sleep(0.2)
    if is_our_trainer(pid, run_dir / CONFIG):
        tree = descendants(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        for child in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        time.sleep(0.5)
    log(f"stopped PID {pid}")
    return True


# ---------------------------------------------------------------- checkpoints ---------------------------


def _valid_zip(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
        return True
    except (OSError, zipfile.BadZipFile):
        return False


def checkpoint_problem(ckpt: Path, scheduler: bool = True) -> str | None:
    """None when a speculators epoch checkpoint is complete, else what is wrong with it."""
    from eagle3ops.store import read_safetensors_header

    model = ckpt / "model.safetensors"
    try:
        read_safetensors_header(model)
    except (OSError, ValueError) as e:
        return f"{model}: {e}"
    for name in ("optimizer_state_dict.pt", *(("scheduler_state_dict.pt",) if scheduler else ())):
        if not _valid_zip(ckpt / name):
            return f"{ckpt / name}: missing or truncated"
    ts = ckpt / "training_state.json"
    try:
        json.loads(ts.read_text())
    except (OSError, ValueError):
        return f"{ts}: missing or unreadable (the save was cut short)"
    return None


def epoch_dirs(save_path: Path) -> list[int]:
    if not save_path.is_dir():
        return []
    out = []
    for d in save_path.iterdir():
        if d.is_dir() and not d.is_symlink() and d.name.isdigit():
            out.append(int(d.name))
    return sorted(out)


def quarantine_incomplete(save_path: Path, scheduler: bool = True) -> list[dict]:
    """Move incomplete newest checkpoints aside so speculators resumes from the last complete one."""
    moved = []
    for epoch in reversed(epoch_dirs(save_path)):
        d = save_path / str(epoch)
        problem = checkpoint_problem(d, scheduler)
        if problem is None:
            break
        dest = save_path / f"incomplete-{epoch}-{int(time.time())}"
        os.replace(d, dest)
        moved.append({"epoch": epoch, "moved_to": str(dest), "reason": problem})
    return moved


def resume_point(save_path: Path) -> dict | None:
    eps = epoch_dirs(save_path)
    if not eps:
        return None
    ts = save_path / str(eps[-1]) / "training_state.json"
    try:
        st = json.loads(ts.read_text())
    except (OSError, ValueError):
        st = {}
    return {"checkpoint": str(save_path / str(eps[-1])), "epoch": eps[-1], **st}


# ---------------------------------------------------------------- metrics ---------------------------------


def read_metrics(run_dir: Path) -> dict:
    """Summarise RUN/metrics.jsonl: per attempt steps and timing, last val loss and per-step accuracies."""
    path = Path(run_dir) / METRICS
    attempts: list[dict] = []
    last_train = last_val = None
    cur = None
    if path.exists():
        for raw in path.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # a torn last line of a killed writer
            kind = rec.get("kind")
            if kind == "attempt":
                cur = {
                    "attempt": rec["attempt"],
                    "launched_at": rec["time"],
                    "steps": 0,
                    "first_global_step": None,
                    "last_global_step": None,
                    "first_step_at": None,
                    "last_step_at": None,
                    "tokens_per_s": [],
                }
                attempts.append(cur)
            elif kind == "train":
                if cur is None:
                    cur = {
                        "attempt": 0,
                        "launched_at": None,
                        "steps": 0,
                        "first_global_step": None,
                        "last_global_step": None,
                        "first_step_at": None,
                        "last_step_at": None,
                        "tokens_per_s": [],
                    }
                    attempts.append(cur)
                d = rec["data"]
                gs = d.get("global_step")
                cur["steps"] += 1
                if cur["first_global_step"] is None:
                    cur["first_global_step"], cur["first_step_at"] = gs, rec["time"]
                cur["last_global_step"], cur["last_step_at"] = gs, rec["time"]
                tps = (d.get("profile") or {}).get("tokens_per_s")
                if tps:
                    cur["tokens_per_s"].append(tps)
                last_train = d
            elif kind == "val":
                last_val = rec["data"]
    for a in attempts:
        tps = sorted(a.pop("tokens_per_s"))
        a["median_tokens_per_s_per_rank"] = tps[len(tps) // 2] if tps else None
        if a["launched_at"] and a["first_step_at"]:
            a["time_to_first_step_s"] = round(a["first_step_at"] - a["launched_at"], 3)
        # optimizer steps per second from the global step counter (records exist every log_freq steps)
        if a["steps"] > 1 and a["last_step_at"] > a["first_step_at"]:
            span = a["last_step_at"] - a["first_step_at"]
            a["steps_per_s"] = round((a["last_global_step"] - a["first_global_step"]) / span, 4)
    out: dict = {"attempts": attempts}
    if last_train:
        t = last_train.get("train", {})
        out["train_loss"] = t.get("loss")
        out["global_step"] = last_train.get("global_step")
        out["epoch"] = last_train.get("epoch")
    if last_val:
        v = last_val.get("val", {})
        out["val_loss"] = v.get("loss_epoch")
        out["val_epoch"] = last_val.get("epoch")
        for key in ("cond_acc", "full_acc"):
            vals = []
            i = 0
            while f"{key}_{i}_epoch" in v:
                vals.append(v[f"{key}_{i}_epoch"])
                i += 1
            out[f"val_{key}"] = vals
    return out


# ---------------------------------------------------------------- the state machine ---------------------


def read_state(run_dir: Path) -> dict | None:
    p = run_dir / STATE
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise TrainError(
            f"{p}: corrupt ({e}); move it aside to let the phase relaunch (checkpoints are kept)."
        ) from e


def read_exit(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / EXIT).read_text())
    except (OSError, ValueError):
        return None


def run_status(run_dir: Path, state: dict | None) -> tuple[str, dict | None]:
    """new | running | finished | failed | interrupted | killed, and the exit record.

    A trainer whose PID is in ``train.pid`` but not (yet) in ``state.json`` (the launcher was killed between
    the two writes) counts as running too, and is adopted into ``state``: never start a second one.
    """
    pid_in_file = None
    with contextlib.suppress(OSError, ValueError):
        pid_in_file = int((run_dir / PIDFILE).read_text().strip() or 0)
    stale = state is None or state.get("pid") != pid_in_file
    if pid_in_file and stale and is_our_trainer(pid_in_file, run_dir / CONFIG):
        if state is not None:
            state["pid"] = pid_in_file
        return "running", None
    if state is None:
        return "new", None
    if is_our_trainer(state.get("pid"), run_dir / CONFIG):
        return "running", None
    ex = read_exit(run_dir)
    if ex is None:
        return "killed", None
    return ex.get("status", "failed"), ex


def log_tail(run_dir: Path, n: int = 40) -> str:
    p = run_dir / LOG
    if not p.exists():
        return ""
    with open(p, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """One ``train`` deciding on a run directory at a time (:class:`eagle3ops.runlock.RunLock`: a second one
    fails at once with ``LockHeld``, exit code 2, naming the first's PID and command line). The running
    trainer itself is represented by ``train.pid`` (``run_status``): a later ``train`` adopts it."""
    from eagle3ops.runlock import RunLock

    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir, what="train"):
        yield


def data_dir_writer(data_dir: str | os.PathLike) -> dict | None:
    """The prepare/extract run that holds ``data_dir`` now (its lock record), or None."""
    from eagle3ops.runlock import holder

    return holder(data_dir)


def _refuse_while_written(data_dir: str, check: bool, warnings: list) -> None:
    h = data_dir_writer(data_dir)
    if not h:
        return
    msg = (
        f"{data_dir} is being written by {h.get('what', 'another run')} PID {h.get('pid')} since "
        f"{h.get('started_at')} ({h.get('cmdline')}); training now would read a partial data set. Wait for it "
        "to finish (the extract phase does), then re-run the train phase."
    )
    if check:
        warnings.append(msg)
        return
    raise TrainError(msg, holder=h)


def _config_diff(old: str, new: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(old.splitlines(True), new.splitlines(True), "running config.yaml", "requested")
    )


def gpu_free(plan_: Plan, check: bool, log) -> dict | None:
    if plan_.device != "gpu" or not plan_.spec.gpu_free_check:
        return None
    try:
        from eagle3ops import gpu
    except ImportError:
        return {"skipped": "eagle3ops.gpu is not available"}
    try:
        return gpu.ensure_free(timeout_s=plan_.spec.gpu_free_timeout, check_mode=check, log=log)
    except gpu.GpuFreeError as e:
        raise TrainError(f"GPUs are not free, not launching the trainer: {e}", gpu_free=e.details) from e


def ensure_run(
    spec: TrainSpec,
    *,
    check: bool = False,
    wait: bool = False,
    timeout: float = 3600,
    poll_s: float = 2.0,
    log=lambda s: print(s, file=sys.stderr),
) -> dict:
    if not check:  # before the plan: a data directory being written looks incomplete, not "in use"
        _refuse_while_written(spec.data_dir, check, [])
    try:
        p = plan(spec)
    except TrainError as e:
        if not (check and e.details.get("inputs_pending")):
            raise
        # check mode of a whole site run: the earlier phases have not produced the inputs yet
        return {
            "changed": True,
            "status": "launched",
            "would": "launch",
            "inputs_pending": str(e),
            "run_dir": str(Path(spec.run_dir).resolve()),
            "warnings": [f"inputs not ready: {e}"],
        }
    run_dir = p.run_dir
    cfg_path = run_dir / CONFIG
    if not check:
        run_dir.mkdir(parents=True, exist_ok=True)
    if check:
        _refuse_while_written(spec.data_dir, check, p.warnings)
    base = {
        "run_dir": str(run_dir),
        "config_path": str(cfg_path),
        "log_path": str(run_dir / LOG),
        "save_path": str(p.save_path),
        "layer_ids": p.values["layer_ids"],
        "draft_vocab_size": p.values["draft_vocab_size"],
        "draft_vocab_capped": p.values["draft_vocab_capped"],
        "device": p.device,
        "nproc": p.nproc,
        "nnodes": p.spec.nnodes,
        "node_rank": p.spec.node_rank,
        "config_sha256": p.config_sha256,
        "warnings": p.warnings,
        "samples": p.samples,
        "serve_window_size": p.spec.sliding_window if p.spec.attention == "sliding" else None,
    }
    lock = run_lock(run_dir) if not check else contextlib.nullcontext()
    with lock:
        state = read_state(run_dir) if run_dir.exists() else None
        status, ex = run_status(run_dir, state)
        if status == "running" and state is None:  # adopted from train.pid (see run_status)
            state = {"pid": int((run_dir / PIDFILE).read_text().strip()), "attempt": 1, "launcher": "unknown"}
        before = {
            "status": status,
            "attempt": (state or {}).get("attempt", 0),
            "job": (state or {}).get("rdzv_id"),
        }
        old_text = cfg_path.read_text() if cfg_path.exists() else None
        restarted = None
        if state is not None and old_text is not None and old_text != p.config_text:
            if not spec.restart_on_change:
                raise TrainError(
                    f"the training configuration changed while run {run_dir} exists (status {status}). Set "
                    "train_restart_on_change: true to stop it and start over (its checkpoints are moved aside), "
                    "or use another train_run_dir. Changes:\n" + _config_diff(old_text, p.config_text)[:4000],
                    status=status,
                    config_diff=_config_diff(old_text, p.config_text)[:8000],
                )
            restarted = {"previous_status": status}
            if not check:
                if status == "running":
                    stop_run(run_dir, state, log=log)
                old_save = Path(state.get("save_path") or p.save_path)
                if old_save.exists():
                    dest = old_save.with_name(f"{old_save.name}.superseded-{int(time.time())}")
                    os.replace(old_save, dest)
                    restarted["old_checkpoints"] = str(dest)
                (run_dir / METRICS).unlink(missing_ok=True)
            status = "new"
        job = rdzv_id_for(spec) if spec.nnodes > 1 else None
        other_job = None
        if job and state is not None and status in ("running", "finished") and state.get("rdzv_id") != job:
            # several hosts: this node runs (or finished) another job than the one every node is asked to join
            # now - a node that died meanwhile is being restarted. Stop it (the role stops every node first) and
            # join the new job, resuming from the newest checkpoint, never leaving half a job running.
            other_job = {"previous_status": status, "previous_job": state.get("rdzv_id"), "job": job}
            if status == "running" and not check:
                stop_run(run_dir, state, log=log)
            status = "other-job"
        result = dict(base, before=before, restarted=restarted, job=job, other_job=other_job)
        if status in ("running", "finished"):
            result.update(
                changed=False,
                status=status,
                pid=(state or {}).get("pid"),
                attempt=state.get("attempt"),
                launcher=state.get("launcher"),
                unit=state.get("unit"),
            )
        else:
            action = "launch" if status == "new" else "relaunch"
            result.update(
                changed=True, status="launched" if action == "launch" else "relaunched", previous_exit=ex
            )
            if status != "new":
                result["previous_status"] = status
            if check:
                result.update(
                    would=action,
                    after={"status": "running"},
                    resume_from=resume_point(p.save_path) if status != "new" else None,
                )
                held = other_job and other_job["previous_status"] == "running"
                # its own trainer holds this node's GPUs until the stop: nothing to predict from them now
                result["gpu_free"] = (
                    {
                        "skipped": "this node's GPUs are held by its own trainer of the previous job until it stops"
                    }
                    if held
                    else gpu_free(p, True, log)
                )
                return result
            result["gpu_free"] = gpu_free(p, False, log)
            scheduler = (spec.extra.get("scheduler") or {}).get("scheduler_type", "linear") != "none"
            result["quarantined_checkpoints"] = quarantine_incomplete(p.save_path, scheduler)
            result["resume_from"] = resume_point(p.save_path)
            write_vocab_maps(
                p.token_freq, p.values["draft_vocab_size"], p.target_vocab, Path(p.values["d2t_path"]).parent
            )
            atomic_write_bytes(cfg_path, p.config_text.encode())
            launcher = spec.launcher
            if launcher == "auto":
                launcher = "systemd" if systemd_is_pid1() else "setsid"
            state = launch(p, int((state or {}).get("attempt", 0)) + 1, launcher, log, result["resume_from"])
            result.update(pid=state["pid"], attempt=state["attempt"], launcher=launcher, unit=state["unit"])
        result["after"] = {
            "status": "running" if result["status"] != "finished" else "finished",
            "attempt": result.get("attempt"),
        }
    if wait and result["status"] != "finished":
        result.update(wait_for(run_dir, state, timeout=timeout, poll_s=poll_s, log=log))
    if result.get("status") == "finished":
        result["exit"] = read_exit(run_dir)
        result["checkpoint"] = final_checkpoint(p.save_path)
    result["metrics"] = read_metrics(run_dir)
    return result


def final_checkpoint(save_path: Path) -> str | None:
    best = save_path / "checkpoint_best"
    if best.exists():
        return str(best.resolve())
    eps = epoch_dirs(save_path)
    return str(save_path / str(eps[-1])) if eps else None


def wait_for(run_dir: Path, state: dict, *, timeout: float, poll_s: float, log) -> dict:
    deadline = time.monotonic() + timeout
    pid = state.get("pid")
    while is_our_trainer(pid, run_dir / CONFIG):
        if time.monotonic() > deadline:
            raise TrainError(
                f"training is still running after {timeout:.0f} s (PID {pid}, log {run_dir / LOG}); it keeps "
                "going. Re-run the phase to keep waiting (it will not start a second trainer), or raise "
                "train_wait_timeout.",
                pid=pid,
                status="running",
            )
        time.sleep(poll_s)
    ex = read_exit(run_dir)
    if not ex or ex.get("status") != "finished":
        why = "was killed (no exit record)" if not ex else f"ended {ex.get('status')}: {ex.get('error', '')}"
        raise TrainError(
            f"the trainer (PID {pid}) {why}. Log: {run_dir / LOG}. Re-running the phase resumes from the last "
            f"checkpoint. Last log lines:\n{log_tail(run_dir, 25)}",
            pid=pid,
            status=(ex or {}).get("status", "killed"),
            exit=ex,
        )
    log(f"training finished (PID {pid})")
    return {"status": "finished", "after": {"status": "finished", "attempt": state.get("attempt")}}


def status(run_dir: str) -> dict:
    rd = Path(run_dir).resolve()
    state = read_state(rd) if rd.exists() else None
    st, ex = run_status(rd, state)
    save = Path((state or {}).get("save_path") or rd / "checkpoints")
    return {
        "changed": False,
        "run_dir": str(rd),
        "status": st,
        "state": state,
        "exit": ex,
        "resume_from": resume_point(save),
        "metrics": read_metrics(rd),
        "log_path": str(rd / LOG),
    }


def stop(run_dir: str, grace_s: float = 60, check: bool = False) -> dict:
    rd = Path(run_dir).resolve()
    state = read_state(rd) if rd.exists() else None
    st, _ = run_status(rd, state)
    if st != "running":
        return {"changed": False, "status": st, "run_dir": str(rd)}
    if check:
        return {"changed": True, "status": st, "would": "stop", "pid": state.get("pid")}
    stop_run(rd, state, grace_s)
    return {
        "changed": True,
        "status": run_status(rd, state)[0],
        "stopped_pid": state.get("pid"),
        "run_dir": str(rd),
    }


def spec_asdict(spec: TrainSpec) -> dict:
    return asdict(spec)
