"""The plan of a run, computed without writing anything: the inputs read (:mod:`.inputs`), the device and the
nodes, the speculators config rendered (``templates/speculators_train.yaml.j2``), and the torchrun command line
(one host standalone, or one node of several at a c10d rendezvous)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle3ops.durable import sha256_file
from eagle3ops.store.layout import TOKEN_FREQ
from eagle3ops.train.inputs import (
    check_samples,
    check_verifier_matches,
    data_limited_warning,
    draft_vocab,
    layer_ids_from_meta,
    read_extract_meta,
    read_token_freq,
    verifier_facts,
)
from eagle3ops.train.spec import (
    DEFAULT_DRAFT_VOCAB,
    MANAGED_KEYS,
    TEMPLATE,
    TRAINER_DEFAULTS,
    TRAINERS,
    TrainError,
    TrainSpec,
)


def visible_gpus() -> int:
    from eagle3ops.cuda import cuda_device_count

    try:
        return cuda_device_count()
    except Exception:  # a broken CUDA set-up reads as no GPU (device=auto trains on the CPU; gpu is refused)
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
            "runs the minimal DDP job of eagle3ops.train.ddp_probe through it."
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
    init: dict | None = None  # a warm start's draft (eagle3ops.train.warm_start.read_init), with its maps


def prepared_max_length(data: Path) -> int:
    """The row length the prepare phase cut at (prepare_meta.json), 2048 when it does not say."""
    import json

    try:
        return int(json.loads((data / "prepare_meta.json").read_text())["params"]["max_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return 2048


def render_specforge(values: dict) -> str:
    """SpecForge's run config as YAML, after SpecForge's own schema accepted it."""
    import yaml

    from eagle3ops.train import specforge

    cfg = specforge.run_config(values)
    specforge.validate(cfg)
    head = (
        "# Rendered by eagle3ops (eagle3ops.train.specforge.run_config). Do not edit by hand: the train phase\n"
        "# compares this file with the one it would render to tell whether the run's configuration changed.\n"
        f"# Loaded by: [torchrun -m] {values['trainer_module']} --config <this file> "
        f"(specforge {values['specforge_version']})\n"
        f"# aux layer ids {values['layer_ids']} from {values['meta_path']}; draft vocab {values['draft_vocab_size']} "
        f"(requested {values['draft_vocab_requested']}, {values['distinct_tokens']} distinct tokens seen); "
        f"rows: the first {values['train_data_ratio']} of the dataset (the speculators trainer's training split)\n"
        f"# draft fc_norm (an RMSNorm on each aux state before fc): {'on' if values.get('specforge_fc_norm') else 'off'}"
        "\n"
    )
    return head + yaml.safe_dump(cfg, sort_keys=False)


def specforge_values(spec: TrainSpec, values: dict, data: Path, device: str, nproc: int) -> dict:
    """What SpecForge's config needs beyond the speculators values (added to ``values``); GPU hosts only."""
    from eagle3ops.train import specforge

    if device != "gpu":
        raise TrainError(
            "train trainer specforge needs a GPU host: SpecForge 0.2.0 shards the draft with FSDP on an "
            "accelerator and computes its loss with a Triton kernel (use trainer speculators on CPU)"
        )
    values.update(
        specforge_version=specforge.installed_version() or "missing",
        specforge_dir=str(Path(spec.run_dir).resolve() / specforge.INPUTS),
        specforge_lr=values["lr"],
        specforge_ttt=values["ttt_steps"],
        specforge_fc_norm=bool(spec.specforge_fc_norm),
        lm_head_key=specforge.lm_head_key(Path(spec.verifier_path)),
        max_length=prepared_max_length(data),
        nproc=nproc,
        nnodes=spec.nnodes,
        rdzv_host=(spec.rdzv_endpoint or "").rpartition(":")[0] or None,
    )
    return values


def plan(spec: TrainSpec) -> Plan:
    """Read the inputs and render the config; writes nothing."""
    if spec.trainer not in TRAINERS:
        raise TrainError(f"train trainer must be one of {sorted(TRAINERS)}, got {spec.trainer!r}")
    if spec.trainer == "specforge":
        from eagle3ops.train import specforge

        specforge.check_extra(spec.extra)
    else:
        check_extra(spec.extra)
    if spec.specforge_fc_norm and spec.trainer != "specforge":
        raise TrainError(
            f"train specforge_fc_norm is for trainer specforge (SpecForge's fc_norm), not {spec.trainer!r}: "
            "speculators normalises its draft's input itself (norm_before_fc)"
        )
    if spec.attention not in ("full", "sliding"):
        raise TrainError(f"train attention must be 'full' or 'sliding', got {spec.attention!r}")
    data = Path(spec.data_dir).resolve()
    run_dir = Path(spec.run_dir).resolve()
    meta, meta_path = read_extract_meta(data)
    layer_ids = layer_ids_from_meta(meta, meta_path, spec.layer_ids)
    facts = verifier_facts(spec.verifier_path, spec.trust_remote_code)
    warnings = check_verifier_matches(meta, meta_path, facts, spec.verifier_path)
    samples = check_samples(str(data), meta, spec.on_missing)
    small = data_limited_warning(samples)
    if small:
        warnings.append(small)
    tf_path = Path(spec.token_freq_path) if spec.token_freq_path else data / TOKEN_FREQ
    freq = read_token_freq(tf_path)
    init = _warm_start(spec, layer_ids, facts, warnings)
    size, capped = _draft_vocab_size(spec, freq, tf_path, facts, init, warnings)
    tf_sha = sha256_file(tf_path)
    device, nproc = resolve_device(spec)
    check_nodes(spec, device)
    cpu = device == "cpu"
    num_workers = spec.num_workers
    if num_workers is None:
        num_workers = 0 if cpu else max(1, min(12, (os.cpu_count() or 2) // nproc - 1))
    mask = spec.mask_token_id
    if mask is None and (not facts["has_tokenizer"] or facts["remote_code"]):
        # speculators resolves it from the verifier's tokenizer, loaded without trust_remote_code (a remote-code
        # target such as Kimi-K2.5 then fails in the trainer); EAGLE-3 does not use it: the config's pad id
        mask = facts["pad_token_id"] if isinstance(facts["pad_token_id"], int) else 0
    save_path = Path(spec.save_path).resolve() if spec.save_path else run_dir / "checkpoints"
    # the maps' directory is keyed by what they come from: the token counts, or a warm start's draft
    vocab_dir = run_dir / "vocab" / (f"init-{init['sha256'][:12]}" if init else tf_sha[:12])
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
        "ttt_steps": spec.ttt_steps
        if spec.ttt_steps is not None
        else TRAINER_DEFAULTS[spec.trainer]["ttt_steps"],
        "lr": spec.lr if spec.lr is not None else TRAINER_DEFAULTS[spec.trainer]["lr"],
        "epochs": spec.epochs,
        "save_path": str(save_path),
        "checkpoint_freq": spec.checkpoint_freq,
        "log_freq": spec.log_freq,
        "max_steps": spec.max_steps,
        "log_dir": str(run_dir / "logs"),
        "extra": spec.extra or {},
        "init_from": init["checkpoint"] if init else None,
        "init_sha256": init["sha256"] if init else None,
        # fp8 stores (extract dtype float8_e4m3fn: e4m3 + hidden_states_scales) are read by hs_connectors'
        # FP8Transfer; the default file backend would hand the trainer unscaled e4m3 values
        "hidden_states_backend": "fp8" if meta.get("dtype") == "float8_e4m3fn" else "file",
    }
    text = (
        render_specforge(specforge_values(spec, values, data, device, nproc))
        if spec.trainer == "specforge"
        else (render_config(values))
    )
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
        init=init,
    )


def _draft_vocab_size(spec: TrainSpec, freq: dict, tf_path: Path, facts: dict, init, warnings: list):
    """(size, capped): a warm start's own, or the requested size capped at the distinct tokens counted."""
    if init:
        return init["draft_vocab_size"], False
    size, capped = draft_vocab(spec.draft_vocab_size, len(freq), facts["vocab_size"])
    if capped:
        warnings.append(
            f"draft vocab capped at {size}: {tf_path} counts only {len(freq)} distinct tokens "
            f"(requested {spec.draft_vocab_size or DEFAULT_DRAFT_VOCAB})"
        )
    return size, capped


def _warm_start(spec: TrainSpec, layer_ids: list[int], facts: dict, warnings: list) -> dict | None:
    """The pretrained draft of ``init_from``, checked (eagle3ops.train.warm_start); None for a new draft."""
    if not spec.init_from:
        return None
    if spec.trainer != "speculators":
        raise TrainError(
            f"train init_from is for trainer speculators (its draft.from_pretrained), not {spec.trainer!r}"
        )
    from eagle3ops.train.warm_start import read_init

    init = read_init(spec.init_from, layer_ids, facts)
    if spec.draft_vocab_size and spec.draft_vocab_size != init["draft_vocab_size"]:
        warnings.append(
            f"train draft_vocab_size {spec.draft_vocab_size} does not apply to a warm start: the draft "
            f"{init['checkpoint']} keeps its own {init['draft_vocab_size']} tokens and their maps"
        )
    return init
