"""SpecForge as the train phase's second trainer (``trainer: specforge``): one extraction, two trainers.

SpecForge 0.2.0 (SGLang's own trainer, ``specforge train --config run.yaml``) trains an EAGLE-3 draft offline from
a directory of feature files: one ``torch.save`` dict per sample with ``input_ids`` [T], ``loss_mask`` [T],
``aux_hidden_state`` [1, T, 3H] and ``hidden_state`` [1, T, H], the last layer **after** the target's final norm
(its target head is the bare ``lm_head``). It lists every ``*.ckpt`` under ``data.hidden_states_path`` and opens
each with ``torch.load(path, weights_only=False, mmap=True)`` in its loader workers.

Our store already holds those states (``hs_{i}.safetensors``: the three aux layers and the **pre**-norm last
state, bf16 or fp8). Copying them into SpecForge's layout would double the store (4.6 TB for Kimi-K2.5), so each
training row gets a **pointer file** instead (:func:`write_features`): a real ``torch.save`` file, a few hundred
bytes, whose pickle names :func:`load_row` and its arguments (our file, the row's loss mask, the target's final
norm). SpecForge's own ``torch.load`` then returns the dict it expects, computed from our file on the fly in its
loader worker: the aux states concatenated, the last state normalised with the target's own RMSNorm weight. Nothing
in SpecForge is patched; the pointer files hold no tensor data, so they cost ~1 KB a row.

Everything else SpecForge reads is made once per run in ``RUN/specforge/`` (:func:`prepare_inputs`):

- ``target/``: the target directory as links, plus the ``model.safetensors.index.json`` SpecForge's target head
  insists on (a single-file checkpoint has none);
- ``draft_config.json``: SpecForge's own derivation of an EAGLE-3 draft from the target (its
  ``_TARGET_ARCHITECTURE_FIELDS``, one Llama decoder layer), with the run's draft vocabulary and the aux layer
  ids written as SGLang reads them (``eagle_config``);
- ``vocab_mapping.pt``: ``{"d2t", "t2d"}`` from the **same** d2t/t2d the speculators trainer uses (speculators'
  algorithm over the same ``token_freq.pt``): both drafts predict the same draft vocabulary;
- ``final_norm.safetensors``: the target's final norm weight (``model.norm.weight``) for :func:`load_row`.

The rows are the speculators trainer's training split (the first ``train_data_ratio`` of the dataset, its
validation rows left out), so both trainers see the same samples.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECFORGE_PIN = "0.2.0"  # the version this backend was written against (its config schema and feature layout)
INPUTS = "specforge"  # RUN/specforge/: what SpecForge reads besides the pointer files
FEATURES = "features"  # RUN/specforge/features/data_{i:08d}.ckpt
NORM_FILE = "final_norm.safetensors"
VOCAB_FILE = "vocab_mapping.pt"
DRAFT_CONFIG = "draft_config.json"
OUTPUT = "output"  # SpecForge's output_dir: RUN/specforge/output/<run_id>/...

# SpecForge's settings that the run derives itself: ``extra_config`` may not set them
MANAGED = {
    "model": {
        "target_model_path",
        "draft_model_config",
        "vocab_mapping_path",
        "lm_head_key",
        "embedding_key",
    },
    "data": {"hidden_states_path", "max_length"},
    "training": {"num_epochs", "max_steps", "total_steps", "learning_rate", "ttt_length", "seed"},
    "": {"output_dir", "run_id"},
    "deployment": {"trainer"},
}
# SpecForge's own defaults for what the speculators trainer sets differently (its recipe, not ours)
DEFAULTS = {"learning_rate": 1e-4, "ttt_length": 7, "batch_size": 1}

# the target's config fields SpecForge copies into a derived EAGLE-3 draft config (specforge 0.2.0,
# training/model_loading.py: the same list, read there; a test compares the two)
TARGET_FIELDS = (
    "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "max_position_embeddings", "rms_norm_eps", "hidden_act", "initializer_range", "attention_bias",
    "attention_dropout", "head_dim", "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id",
    "sliding_window", "use_sliding_window", "max_window_layers",
)  # fmt: skip


class SpecForgeError(ValueError):
    """A SpecForge run cannot be set up; the message names the file or setting."""


def installed_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("specforge")
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------------------ the rows


class _Row:
    """What a pointer file pickles: unpickled (by SpecForge's ``torch.load``) it becomes :func:`load_row`'s dict."""

    def __init__(self, sample: str, loss_mask: bytes, norm: str, eps: float, dtype: str):
        self.args = (sample, loss_mask, norm, eps, dtype)

    def __reduce__(self):
        return (load_row, self.args)


_NORMS: dict[str, object] = {}


def _norm_weight(path: str):
    w = _NORMS.get(path)
    if w is None:
        from safetensors.torch import load_file

        w = _NORMS[path] = load_file(path)["weight"]
    return w


def rms_norm(x, weight, eps: float):
    """The target's final RMSNorm as Llama/DeepSeek compute it: in float32, cast back, then scaled by the weight."""
    import torch

    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * h.to(x.dtype)


def load_row(sample: str, loss_mask: bytes, norm: str, eps: float, dtype: str = "bfloat16") -> dict:
    """SpecForge's offline EAGLE-3 sample, made from one of our files: ``input_ids`` [T] and ``loss_mask`` [T]
    (int64), ``aux_hidden_state`` [1, T, K*H] (the aux layers side by side, in layer order) and ``hidden_state``
    [1, T, H] (the last layer after the target's final norm)."""
    import torch

    from eagle3ops.store.sample import load_sample

    d = load_sample(sample, dtype=getattr(torch, dtype))
    hs = d["hidden_states"]  # [T, K+1, H]
    ids = d["token_ids"].to(torch.long)
    mask = torch.frombuffer(bytearray(loss_mask), dtype=torch.uint8).to(torch.long)
    if mask.numel() != ids.numel():
        raise SpecForgeError(f"{sample}: {ids.numel()} tokens but the pointer's loss mask has {mask.numel()}")
    t, k1, h = hs.shape
    return {
        "input_ids": ids,
        "loss_mask": mask,
        "aux_hidden_state": hs[:, : k1 - 1, :].reshape(1, t, (k1 - 1) * h).contiguous(),
        "hidden_state": rms_norm(hs[:, k1 - 1, :], _norm_weight(norm), eps)[None].contiguous(),
    }


def pointer_name(index: int) -> str:
    return f"data_{index:08d}.ckpt"


def write_features(
    data_dir: Path, out: Path, norm: Path, eps: float, rows: int, dtype: str = "bfloat16"
) -> dict:
    """One pointer file per row ``0..rows-1`` of the dataset in ``data_dir`` (its ``loss_mask`` column, its
    ``hidden_states/hs_{i}.safetensors``) into ``out``. Written once: an existing file is kept (the rows of a
    prepared dataset do not change under a run; a re-prepared one changes the run's config and starts over)."""
    import io

    import torch
    from datasets import load_from_disk

    from eagle3ops.durable import atomic_write_bytes
    from eagle3ops.store.layout import sample_name

    out.mkdir(parents=True, exist_ok=True)
    ds = load_from_disk(str(data_dir))
    written = kept = 0
    masks = ds.select_columns(["loss_mask"]).with_format(None)
    for i in range(rows):
        p = out / pointer_name(i)
        if p.exists():
            kept += 1
            continue
        mask = bytes(int(v) & 1 for v in masks[i]["loss_mask"])
        sample = str((data_dir / "hidden_states" / sample_name(i)).resolve())
        buf = io.BytesIO()
        torch.save(_Row(sample, mask, str(norm), eps, dtype), buf)
        atomic_write_bytes(p, buf.getvalue(), fsync=False)
        written += 1
    return {"dir": str(out), "rows": rows, "written": written, "kept": kept}


# ------------------------------------------------------------------------------------------------ the inputs


def target_view(target: Path, out: Path) -> Path:
    """``out``: the target's files as links, plus a safetensors index when the target has none (SpecForge's
    target head refuses a directory without ``*.index.json``)."""
    from eagle3ops.store.sample import read_safetensors_header

    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(target.iterdir()):
        link = out / f.name
        if f.is_file() and not link.exists():
            link.symlink_to(f.resolve())
    if not list(target.glob("*.index.json")):
        shards = sorted(target.glob("*.safetensors"))
        if not shards:
            raise SpecForgeError(f"{target}: no *.safetensors weights (SpecForge's target head reads them)")
        weight_map = {k: s.name for s in shards for k in read_safetensors_header(s) if k != "__metadata__"}
        index = out / "model.safetensors.index.json"
        text = json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1, sort_keys=True)
        if not index.exists() or index.read_text() != text:
            index.write_text(text)
    return out


def final_norm(target: Path, out: Path) -> tuple[Path, float]:
    """The target's final norm weight into ``out`` (a one-tensor safetensors file) and its epsilon."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    cfg = json.loads((target / "config.json").read_text())
    cfg = cfg.get("text_config") or cfg
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    for s in sorted(target.glob("*.safetensors")):
        with safe_open(str(s), "pt") as f:
            if "model.norm.weight" in f.keys():  # noqa: SIM118 - safe_open has no __contains__
                if not out.exists():
                    save_file({"weight": f.get_tensor("model.norm.weight").contiguous()}, str(out))
                return out, eps
    raise SpecForgeError(
        f"{target}: no model.norm.weight in its safetensors (the final norm SpecForge needs)"
    )


def draft_config(
    target: Path, draft_vocab: int, layer_ids: list[int], num_layers: int = 1, fc_norm: bool = False
) -> dict:
    """The EAGLE-3 draft config SpecForge derives from a target (its fields, one Llama layer), with the run's
    draft vocabulary and, for SGLang's loader, the aux layer ids (SGLang's convention: the input of layer i).
    ``fc_norm``: SpecForge's RMSNorm on each aux state before ``fc`` (its draft and SGLang's read the flag)."""
    from eagle3ops import layers

    full = json.loads((target / "config.json").read_text())
    cfg = full.get("text_config") or full
    out = {k: cfg[k] for k in TARGET_FIELDS if cfg.get(k) is not None}
    out.update(layers.special_token_ids(full))  # a wrapper may state them at its top level only
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        # a transformers 5 config states the rope only here; SpecForge copies the top-level ``rope_theta`` alone, so
        # its draft fell back to 10,000 where SmolLM2 says 100,000 (proof-of-value run 2): the draft takes the target's
        out["rope_parameters"] = dict(rope)
        out.setdefault("rope_theta", rope["rope_theta"])
    out.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=num_layers,
        tie_word_embeddings=False,
        use_cache=True,
        draft_vocab_size=int(draft_vocab),
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    )
    out.setdefault("pad_token_id", 0)
    if fc_norm:
        out["fc_norm"] = True
    return out


def vocab_mapping(d2t_npy: Path, t2d_npy: Path, out: Path) -> Path:
    """SpecForge's ``{"d2t", "t2d"}`` from the speculators run's own maps (the same draft vocabulary)."""
    import io

    import numpy as np
    import torch

    from eagle3ops.durable import atomic_write_bytes

    d2t = torch.from_numpy(np.load(d2t_npy)).to(torch.long)
    t2d = torch.from_numpy(np.load(t2d_npy)).to(torch.bool)
    buf = io.BytesIO()
    torch.save({"d2t": d2t, "t2d": t2d}, buf)
    atomic_write_bytes(out, buf.getvalue(), fsync=False)
    return out


def lm_head_key(target: Path) -> str:
    cfg = json.loads((target / "config.json").read_text())
    tied = cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings", False))
    return "model.embed_tokens.weight" if tied else "lm_head.weight"


def train_rows(samples: int, ratio: float) -> int:
    """The speculators trainer's training split: the first ``int(samples * ratio)`` rows (its val split after)."""
    return int(samples * ratio)


def run_config(values: dict) -> dict:
    """SpecForge's run config (``specforge train --config``) from the plan's values."""
    extra = {k: dict(v) for k, v in (values.get("extra") or {}).items()}
    training = {
        "num_epochs": values["epochs"],
        "learning_rate": values["specforge_lr"],
        "ttt_length": values["specforge_ttt"],
        "seed": values["seed"],
        "batch_size": DEFAULTS["batch_size"],
        "log_interval": max(1, values.get("log_freq", 1)) * 10,
        **extra.get("training", {}),
    }
    if values.get("max_steps"):
        training["max_steps"] = values["max_steps"]
        training["total_steps"] = values["max_steps"]  # the schedule ends where the run is asked to stop
    inputs = Path(values["specforge_dir"])
    cfg = {
        "model": {
            "target_model_path": str(inputs / "target"),
            "draft_model_config": str(inputs / DRAFT_CONFIG),
            "vocab_mapping_path": str(inputs / VOCAB_FILE),
            "lm_head_key": values["lm_head_key"],
            **extra.get("model", {}),
        },
        "data": {
            "hidden_states_path": str(inputs / FEATURES),
            "max_length": values["max_length"],
            "dataloader_num_workers": values["num_workers"],
            **extra.get("data", {}),
        },
        "training": training,
        "output_dir": str(inputs / OUTPUT),
        "run_id": "eagle3ops",
    }
    # the process topology SpecForge checks torchrun's WORLD_SIZE against (the launcher's torchrun)
    trainer = {"nnodes": values.get("nnodes", 1), "nproc_per_node": values.get("nproc", 1)}
    if trainer["nnodes"] > 1:
        trainer["master_addr"] = values["rdzv_host"]
    cfg["deployment"] = {**extra.get("deployment", {}), "trainer": trainer}
    for section in ("tracking", "profiling", "runtime"):
        if section in extra:
            cfg[section] = extra[section]
    return cfg


def check_extra(extra: dict) -> None:
    from eagle3ops.train.spec import TrainError

    allowed = {"model", "data", "training", "tracking", "profiling", "runtime", "deployment"}
    for group, kv in (extra or {}).items():
        if group not in allowed or not isinstance(kv, dict):
            raise TrainError(
                f"train extra_config (trainer specforge): unknown group {group!r}; use one of {sorted(allowed)} "
                "with a mapping of SpecForge config keys (specforge/config/schema.py)."
            )
        clash = sorted(set(kv) & MANAGED.get(group, set()))
        if clash:
            raise TrainError(
                f"train extra_config.{group} sets {clash}, which the train phase derives for SpecForge; set the "
                "train_* variable instead."
            )


def validate(cfg: dict) -> None:
    """SpecForge's own schema over the config (``specforge.config.Config``): refused before anything is launched."""
    from eagle3ops.train.spec import TrainError

    try:
        from specforge.config import Config
    except ImportError as e:
        raise TrainError(
            f"train trainer specforge: SpecForge is not installed ({e}); install specforge=={SPECFORGE_PIN} with "
            "--no-deps (requirements/speculators.txt) or run the runtime phase."
        ) from e
    try:
        Config.model_validate(cfg)
    except Exception as e:  # pydantic's ValidationError: one line per bad key
        raise TrainError(f"train trainer specforge: SpecForge refuses the run config: {e}") from e


def prepare_inputs(values: dict, data_dir: Path, target: Path, samples: int) -> dict:
    """Everything SpecForge reads besides its config, in ``values["specforge_dir"]`` (idempotent)."""
    d = Path(values["specforge_dir"])
    d.mkdir(parents=True, exist_ok=True)
    target_view(target, d / "target")
    norm, eps = final_norm(target, d / NORM_FILE)
    dc = draft_config(target, values["draft_vocab_size"], values["layer_ids"], values["num_layers"],
                      fc_norm=bool(values.get("specforge_fc_norm")))  # fmt: skip
    text = json.dumps(dc, indent=1, sort_keys=True) + "\n"
    if not (d / DRAFT_CONFIG).exists() or (d / DRAFT_CONFIG).read_text() != text:
        (d / DRAFT_CONFIG).write_text(text)
    vocab_mapping(Path(values["d2t_path"]), Path(values["t2d_path"]), d / VOCAB_FILE)
    feats = write_features(
        data_dir, d / FEATURES, norm, eps, train_rows(samples, values["train_data_ratio"]), "bfloat16"
    )
    return {"features": feats, "norm_eps": eps}


STATE_FILE = "training_state.pt"  # SpecForge's checkpoint payload in each {run_id}-step{N}/


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint SpecForge's ``{run_id}-latest`` link names in ``output_dir``, when complete; else None."""
    for link in sorted(Path(output_dir).glob("*-latest")):
        target = link.resolve()
        if (target / STATE_FILE).is_file():
            return target
    return None


def output_dir(run_dir: Path) -> Path:
    return Path(run_dir) / INPUTS / OUTPUT


def export_to_sglang(checkpoint: Path, run_dir: Path, out: Path) -> Path:
    """SpecForge's own exporter (``specforge export --to sglang``) into ``out``."""
    from specforge.export.to_sglang import export_to_sglang as _export

    inputs = Path(run_dir) / INPUTS
    _export(
        str(checkpoint), str(inputs / DRAFT_CONFIG), str(out), vocab_mapping_path=str(inputs / VOCAB_FILE)
    )
    # SGLang reads the aux layer ids from eagle_config: keep the draft config's (the exporter writes its own copy)
    cfg_path = Path(out) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    want = json.loads((inputs / DRAFT_CONFIG).read_text())["eagle_config"]
    if cfg.get("eagle_config") != want:
        cfg["eagle_config"] = want
        cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    return Path(out)


def metrics_from_log(text: str) -> list[dict]:
    """SpecForge's console metric lines (``step N: {...}``) as records."""
    import ast
    import re

    out = []
    for m in re.finditer(r"^step (\d+): (\{.*\})\s*$", text, re.M):
        try:
            vals = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        if isinstance(vals, dict):
            out.append({"step": int(m.group(1)), **vals})
    return out


__all__ = ["SPECFORGE_PIN", "SpecForgeError", "load_row", "prepare_inputs", "run_config", "write_features"]
