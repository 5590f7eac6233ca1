"""Convert a speculators 0.9.0 EAGLE-3 checkpoint into the draft layout SGLang serves (0.5.17 and 0.5.23: the
versions of :mod:`eagle3ops.sglang.versions`; ``llama_eagle3.py``'s config keys, weight loading and the layer-id
rules are the same in both, each checked against its wheel by tests/unit/serve/test_convert.py).

What SGLang 0.5.23 expects (read from its source, ``sglang/srt/models/llama_eagle3.py`` and the EAGLE3 parts of
``speculative/eagle_worker_v2.py``, ``speculative/eagle_utils.py``,
``model_executor/model_runner_components/spec_aux_hidden_state.py``):

- ``config.json``: a Llama config with ``architectures: ["LlamaForCausalLMEagle3"]`` (its ``EntryClass``),
  ``draft_vocab_size`` (size of ``lm_head``; the logits processor's vocab), ``vocab_size`` = the target's,
  ``tie_word_embeddings: false``, ``eagle_config.eagle_aux_hidden_state_layer_ids`` (read by the target to
  choose the layers it captures, and by the draft for the width of ``fc``), optional ``target_hidden_size``,
  ``norm_before_fc`` (in ``eagle_config`` or top level), ``fc_norm`` and ``norm_output`` (top level).
- weights: ``load_weights`` stacks ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into
  ``gate_up_proj``, prefixes ``model.`` to any name that is not a parameter as is, loads ``d2t`` as
  ``hot_token_id = d2t + arange`` and skips ``t2d``. A name matching no parameter is **silently ignored**: the
  converter therefore writes only names that land on a parameter (the tests run the real ``load_weights``).
- The draft's decoder layers: layer 0 takes ``cat(input_layernorm(embeds), hidden_norm(hidden))`` with the
  *un-normalised* hidden state as residual (speculators ``norm_before_residual=False``; SGLang has no other
  path). Layers >= 1 use ``hidden_norm`` as their pre-attention norm: speculators calls it
  ``input_layernorm``, so it is renamed.
- ``embed_tokens`` is replaced by the target's embedding at load (``set_embed``): a draft trained with its own
  embedding (``embed_requires_grad``) would be served with another one, so it is refused.
- Sliding window: ``LlamaForCausalLMEagle3`` applies ``--speculative-draft-window-size`` to every draft layer
  and has no window otherwise. A draft whose layers are all ``sliding_attention`` with window W is servable
  only with that flag = W; a mix of full and sliding layers is not servable.
- Layer ids: SGLang's convention depends on the *target's* model file. ``deepseek_v2.py`` (DeepSeek-V3,
  Kimi-K2.5) captures the input of layer i for id i, except that ids starting at 1 are shifted by +1;
  ``llama.py``, ``qwen2.py``, ``qwen3.py``... always add 1 (id i = output of layer i). eagle3ops' ids (from
  extract_meta.json) are "input of layer i"; they are translated per :data:`LAYER_ID_RULES`, and ids that
  SGLang cannot express for that target are refused.
- The target (``--target``, else the verifier the checkpoint names): speculators builds the draft's decoder config
  as a ``LlamaConfig``, whose ``bos_token_id``/``eos_token_id`` are Llama's defaults (1, 2), not the target's; the
  draft config takes them (and ``pad_token_id``) from the target's ``config.json`` (``text_config`` first, for a
  wrapper such as Kimi-K2.5's), and records the target as ``verifier`` (``architectures``, ``model_type``, the
  text model's ``model_type``, ``name_or_path``: speculators' own record of its verifier; a key SGLang does not
  read).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from eagle3ops import layers
from eagle3ops.checkpoints import CheckpointError, resolve_checkpoint
from eagle3ops.durable import sha256_file
from eagle3ops.errors import WithDetails
from eagle3ops.sglang import versions as sglang_versions

SGLANG_VERSION = sglang_versions.DEFAULT_VERSION
CONVERTER_VERSION = 3  # 2: weights always written in DRAFT_DTYPE; 3: token ids and verifier from the target
# SGLang serves target and draft in one dtype (serve passes --dtype bfloat16): the draft is written in bf16 whatever
# speculators saved (float32 from a CPU run), and its config says so
DRAFT_DTYPE = "bfloat16"
STAMP = "eagle3ops_convert.json"

# Target architecture -> how its model file's set_eagle3_layers_to_capture reads the ids, per SGLang version
# (sglang_versions.VERSIONS[v].layer_id_rules; checked against each real wheel by tests/unit/serve/test_convert.py).
#   as_is_unless_first_is_1: layers_to_capture = ids, but [v+1 for v in ids] when ids[0] == 1
#   plus_one:                layers_to_capture = [v+1 for v in ids]
# (applied by eagle3ops.layers.capture_ids, the one home of the layer-id rule)
LAYER_ID_RULES: dict[str, tuple[str, str]] = sglang_versions.get(SGLANG_VERSION).layer_id_rules


def installed_sglang() -> str | None:
    """The SGLang version importable here, when it is one eagle3ops knows (the server that will load the draft on
    this host); None otherwise."""
    import importlib.metadata

    try:
        v = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    return v if v in sglang_versions.KNOWN else None


def _version(sglang_version: str | None) -> sglang_versions.SGLangVersion:
    """The version asked for; without one, the installed SGLang's (when known), else the project's pin."""
    try:
        return sglang_versions.get(sglang_version or installed_sglang())
    except sglang_versions.UnknownVersion as e:
        raise ConvertError(str(e), sglang_version=sglang_version, known=list(sglang_versions.KNOWN)) from None


class ConvertError(WithDetails, Exception):
    """A checkpoint SGLang cannot serve, or an unusable input; the message says what to do."""


def sglang_layer_ids(
    layer_ids: list[int],
    target_arch: str | None,
    num_target_layers: int | None = None,
    sglang_version: str | None = None,
):
    """eagle3ops' ids (input of layer i) -> the ids to write into eagle_config for SGLang ``sglang_version``."""
    ver = _version(sglang_version)
    sv = ver.version
    rules = ver.layer_id_rules
    ids = [int(i) for i in layer_ids]
    if not target_arch:
        raise ConvertError(
            "the target's architecture is unknown (no --target-arch, no readable --target config, and the "
            "checkpoint's verifier record names none): give --target, the model directory SGLang serves "
            "(serve_model_path), or --target-arch (serve_target_arch)"
        )
    if target_arch not in rules:
        raise ConvertError(
            f"the target architecture {target_arch!r} is not in eagle3ops' table of SGLang {sv} "
            f"layer-id conventions ({', '.join(sorted(rules))}); read that model's "
            "set_eagle3_layers_to_capture in sglang/srt/models/ and pass the ids SGLang must see with "
            "--sglang-layer-ids.",
            target_arch=target_arch,
        )
    fname, rule = rules[target_arch]
    try:  # the rule itself: eagle3ops.layers.capture_ids
        out = layers.capture_ids(ids, rule)
    except layers.LayerIdError as e:
        raise ConvertError(
            f"SGLang {sv}'s {fname}: {e}. The draft was trained on the input of layers {ids}, so it cannot be "
            "served as trained: retrain it on ids that fit (layer_ids of the extract phase).",
            layer_ids=ids,
        ) from None
    if num_target_layers is not None and max(ids) >= num_target_layers:
        raise ConvertError(
            f"layer ids {ids} reach past the target's {num_target_layers} layers", layer_ids=ids
        )
    return out, rule


def check_servable(cfg: dict, serve_window: int | None = None, sglang_version: str | None = None) -> dict:
    """Refuse what SGLang's LlamaForCausalLMEagle3 cannot serve; return serve facts (window)."""
    sv = _version(sglang_version).version
    where = cfg.get("_path", "config.json")
    tl = cfg.get("transformer_layer_config") or {}
    problems = []
    if cfg.get("speculators_model_type", "eagle3") != "eagle3":
        problems.append(f"speculators_model_type is {cfg.get('speculators_model_type')!r}, not 'eagle3'")
    if tl.get("model_type", "llama") != "llama":
        problems.append(
            f"the draft decoder is {tl.get('model_type')!r}; SGLang's LlamaForCausalLMEagle3 is a Llama layer "
            "(train with the default draft architecture llama)"
        )
    if cfg.get("norm_before_residual"):
        problems.append(
            "norm_before_residual=True: SGLang keeps the un-normalised hidden state as the first layer's "
            "residual and has no other path; retrain with norm_before_residual false "
            "(train_norm_before_residual: false, the eagle3ops default)"
        )
    if cfg.get("embed_requires_grad"):
        problems.append(
            "embed_requires_grad=True: SGLang replaces the draft's embedding with the target's at load, "
            "so the trained embedding would be lost; retrain with frozen embeddings"
        )
    if cfg.get("tie_word_embeddings") or tl.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings=True: SGLang would use embed_tokens as the draft lm_head")
    if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
        problems.append("norm_before_fc and fc_norm are both set")
    if tl.get("attention_bias") or tl.get("mlp_bias"):
        problems.append("attention_bias/mlp_bias: SGLang's draft layers have no biases")
    rope = tl.get("rope_parameters") or tl.get("rope_scaling") or {}
    if isinstance(rope, dict) and ("mrope_section" in rope or "partial_rotary_factor" in rope):
        problems.append(f"rope {rope}: partial/multimodal rope is not handled by this converter")
    n_layers = int(tl.get("num_hidden_layers", 1))
    types = tl.get("layer_types") or ["full_attention"] * n_layers
    window = None
    if "sliding_attention" in types:
        w = int(tl.get("sliding_window") or 0)
        if "full_attention" in types:
            problems.append(
                f"layer_types {types} mix full and sliding attention: SGLang applies "
                "--speculative-draft-window-size to every draft layer; retrain with train_attention full "
                "(or all layers sliding)"
            )
        elif serve_window is None:
            problems.append(
                f"the draft was trained with a sliding window of {w} on every layer: serve it with "
                f"--speculative-draft-window-size {w} (serve_draft_window_size: {w} / --serve-window {w}), "
                "or retrain with full attention"
            )
        elif int(serve_window) != w:
            problems.append(
                f"serve window {serve_window} != the trained sliding window {w}: the draft would attend "
                "to other tokens than in training; use --serve-window " + str(w)
            )
        window = w
    elif serve_window:
        problems.append(
            f"a serve window ({serve_window}) was asked for, but the draft was trained with full attention"
        )
    if problems:
        raise ConvertError(
            f"{where}: SGLang {sv} cannot serve this draft as trained:\n- " + "\n- ".join(problems),
            problems=problems,
        )
    return {"window": window}


def target_facts(target: str | os.PathLike) -> dict:
    """What the draft config takes from the target's ``config.json``: its special token ids (``text_config``
    first, then the top level) and what it is (the ``verifier`` record)."""
    path = Path(target) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConvertError(
            f"{path}: cannot read the target's config ({e}); point --target (serve_model_path) at the model "
            "directory SGLang serves",
            target=str(target),
        ) from None
    text = layers.text_config(cfg)
    verifier = {
        "name_or_path": str(target),
        "architectures": list(cfg.get("architectures") or []),
        "model_type": cfg.get("model_type"),
        "text_model_type": text.get("model_type"),
    }
    return {"token_ids": layers.special_token_ids(cfg), "verifier": verifier}


def served_arch(target_arch: str | None, tfacts: dict | None, verifier: dict) -> tuple[str | None, str]:
    """The architecture whose SGLang model file reads the draft's aux layer ids, and where it came from: the one
    given, else the target SGLang serves (``tfacts``: it is that model's file that captures), else the verifier
    the checkpoint was trained on."""
    if target_arch:
        return target_arch, "given"
    served = ((tfacts or {}).get("verifier") or {}).get("architectures") or []
    if served:
        return served[0], f"the target {tfacts['verifier']['name_or_path']}"
    trained = verifier.get("architectures") or []
    return (trained[0] if trained else None), "the checkpoint's verifier"


def _target_of(cfg: dict, target: str | os.PathLike | None) -> dict | None:
    """The target's facts: from ``target`` when given (refused when unreadable), else from the verifier the
    checkpoint names when that directory is here; None when neither is."""
    if target:
        return target_facts(target)
    named = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if named and (Path(named) / "config.json").is_file():
        return target_facts(named)
    return None


def sglang_config(
    cfg: dict, layer_ids_sglang: list[int], sglang_version: str | None = None, target: dict | None = None
) -> dict:
    """The config.json SGLang loads for LlamaForCausalLMEagle3 (the same keys in 0.5.17 and 0.5.23); with the
    ``target``'s facts (:func:`target_facts`), its token ids and the ``verifier`` record."""
    tl = dict(cfg["transformer_layer_config"])
    hidden = int(tl["hidden_size"])
    heads = int(tl["num_attention_heads"])
    out = {
        "architectures": [_version(sglang_version).draft_architecture],
        "model_type": "llama",
        "vocab_size": int(tl["vocab_size"]),
        "draft_vocab_size": int(cfg["draft_vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(tl["intermediate_size"]),
        "num_hidden_layers": int(tl.get("num_hidden_layers", 1)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(tl.get("num_key_value_heads") or heads),
        "head_dim": int(tl.get("head_dim") or hidden // heads),
        "hidden_act": tl.get("hidden_act", "silu"),
        "max_position_embeddings": int(tl.get("max_position_embeddings", 4096)),
        "rms_norm_eps": float(tl.get("rms_norm_eps", 1e-6)),
        "initializer_range": float(tl.get("initializer_range", 0.02)),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": DRAFT_DTYPE,  # the weights are written in it; serve with --dtype bfloat16 (target too)
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(layer_ids_sglang),
            "use_aux_hidden_state": True,
            "norm_before_fc": bool(cfg.get("norm_before_fc")),
        },
        "norm_before_fc": bool(cfg.get("norm_before_fc")),
        "fc_norm": bool(cfg.get("fc_norm")),
        "norm_output": bool(cfg.get("norm_output")),
    }
    for k in layers.SPECIAL_TOKEN_IDS:
        if tl.get(k) is not None:
            out[k] = tl[k]
    if (
        target
    ):  # speculators' LlamaConfig carries Llama's defaults: the target's ids are the ones it generates
        out.update(target["token_ids"])
        out["verifier"] = target["verifier"]
    if cfg.get("target_hidden_size"):
        out["target_hidden_size"] = int(cfg["target_hidden_size"])
    rope = tl.get("rope_parameters") or tl.get("rope_scaling") or {}
    out["rope_theta"] = float(rope.get("rope_theta", tl.get("rope_theta", 10000.0)))
    if rope and rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


def map_weights(names: list[str], num_layers: int) -> dict[str, str]:
    """speculators name -> SGLang checkpoint name (names SGLang would not load are dropped)."""
    out = {}
    for n in names:
        if n.startswith("verifier_") or n == "t2d":
            continue  # frozen copies of the target's head/norm; t2d is skipped by SGLang anyway
        if n.startswith("layers."):
            i = int(n.split(".")[1])
            if i >= num_layers:
                raise ConvertError(f"weight {n} is past the config's {num_layers} layers")
            if i >= 1 and ".input_layernorm." in n:
                out[n] = n.replace(".input_layernorm.", ".hidden_norm.")
                continue
        out[n] = n
    return out


def _read_config(ckpt: Path) -> dict:
    try:
        cfg = json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConvertError(f"{ckpt / 'config.json'}: unreadable ({e})") from None
    cfg["_path"] = str(ckpt / "config.json")
    if "transformer_layer_config" not in cfg or "draft_vocab_size" not in cfg:
        raise ConvertError(
            f"{ckpt / 'config.json'}: not a speculators eagle3 checkpoint config (no transformer_layer_config "
            "/ draft_vocab_size)"
        )
    return cfg


def plan(
    checkpoint: str | os.PathLike,
    *,
    serve_window: int | None = None,
    target_arch: str | None = None,
    sglang_ids: list[int] | None = None,
    sglang_version: str | None = None,
    target: str | os.PathLike | None = None,
) -> dict:
    """Everything convert would write, checked, without writing (what --check reports). ``target``: the model
    directory SGLang serves (default: the verifier the checkpoint names, when it is here)."""
    version = _version(sglang_version).version
    try:
        ckpt = resolve_checkpoint(checkpoint)
    except CheckpointError as e:
        raise ConvertError(str(e), **e.details) from None
    cfg = _read_config(ckpt)
    facts = check_servable(cfg, serve_window, version)
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    tfacts = _target_of(cfg, target)
    arch, arch_from = served_arch(target_arch, tfacts, verifier)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ConvertError(
            f"{cfg['_path']}: eagle_aux_hidden_state_layer_ids is empty; retrain with explicit ids"
        )
    if sglang_ids:
        out_ids, rule = [int(i) for i in sglang_ids], "given"
        if len(out_ids) != len(ids):
            raise ConvertError(
                f"--sglang-layer-ids {out_ids} has not the {len(ids)} ids the draft was trained on"
            )
    else:
        out_ids, rule = sglang_layer_ids(ids, arch, sglang_version=version)
    scfg = sglang_config(cfg, out_ids, version, tfacts)
    src = {
        "config.json": sha256_file(ckpt / "config.json"),
        "model.safetensors": sha256_file(ckpt / "model.safetensors"),
    }
    serve_args = [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "<out>",
    ]
    if facts["window"]:
        serve_args += ["--speculative-draft-window-size", str(facts["window"])]
    return {
        "checkpoint": str(ckpt),
        "target_arch": arch,
        "target_arch_from": arch_from,
        "layer_ids": list(ids),
        "sglang_layer_ids": out_ids,
        "layer_id_rule": rule,
        "draft_window_size": facts["window"],
        "config": scfg,
        "source_sha256": src,
        "serve_args": serve_args,
        "token_ids_from": tfacts["verifier"]["name_or_path"]
        if tfacts
        else "the checkpoint (no target found)",
        "stamp": {
            "converter_version": CONVERTER_VERSION,
            "dtype": DRAFT_DTYPE,
            "sglang_version": version,
            "source": src,
            "sglang_layer_ids": out_ids,
            "draft_window_size": facts["window"],
            "target": tfacts,
        },
    }


def _publish(out: Path, write) -> None:
    """``write(tmp)`` fills a new directory beside ``out``, which then replaces ``out`` whole (a crash leaves the old
    draft or the new one, never a mix); files readable by a server running as another user."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old.{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def convert(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    serve_window: int | None = None,
    target_arch: str | None = None,
    sglang_ids: list[int] | None = None,
    check: bool = False,
    sglang_version: str | None = None,
    target: str | os.PathLike | None = None,
) -> dict:
    """Write the SGLang draft directory (config.json, model.safetensors, stamp); idempotent, atomic."""
    p = plan(
        checkpoint,
        serve_window=serve_window,
        target_arch=target_arch,
        sglang_ids=sglang_ids,
        sglang_version=sglang_version,
        target=target,
    )
    out = Path(out_dir)
    p["out"] = str(out)
    p["serve_args"] = [str(out) if a == "<out>" else a for a in p["serve_args"]]
    try:
        current = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        current = None
    p["changed"] = current != p["stamp"] or not (out / "model.safetensors").is_file()
    p["check_mode"] = check
    if not p["changed"] or check:
        return p
    # torch only for an actual conversion: a check or an up-to-date draft (every re-run) needs none
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    ckpt = Path(p["checkpoint"])
    n_layers = p["config"]["num_hidden_layers"]
    tensors = {}
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        mapping = map_weights(names, n_layers)
        for src, dst in mapping.items():
            t = f.get_tensor(src)
            if src == "d2t":
                t = t.to(torch.int64)
            elif t.is_floating_point():
                t = t.to(getattr(torch, DRAFT_DTYPE))
            tensors[dst] = t.contiguous()
    for need in ("fc.weight", "lm_head.weight", "norm.weight", "d2t", "layers.0.hidden_norm.weight"):
        if need not in tensors:
            raise ConvertError(
                f"{ckpt / 'model.safetensors'}: no {need!r}; not a complete speculators eagle3 draft"
            )
    if tuple(tensors["lm_head.weight"].shape) != (
        p["config"]["draft_vocab_size"],
        p["config"]["hidden_size"],
    ):
        raise ConvertError(
            f"lm_head.weight {tuple(tensors['lm_head.weight'].shape)} does not match draft_vocab_size x hidden"
        )

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(p["config"], indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(p["stamp"], indent=2, sort_keys=True) + "\n")

    _publish(out, write)
    p["weights"] = {k: list(v.shape) for k, v in sorted(tensors.items())}
    return p


# ---------------------------------------------------------------------------------- a SpecForge run's draft


def is_specforge_run(path: str | os.PathLike) -> bool:
    """A train run directory of ``trainer: specforge`` (its SpecForge inputs beside the config)."""
    from eagle3ops.train import specforge

    return (Path(path) / specforge.INPUTS / specforge.DRAFT_CONFIG).is_file()


def convert_specforge(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    target_arch: str | None = None,
    sglang_ids: list[int] | None = None,
    check: bool = False,
    sglang_version: str | None = None,
    target: str | os.PathLike | None = None,
) -> dict:
    """A SpecForge run's newest checkpoint, exported by SpecForge's own exporter (``specforge export --to sglang``:
    its weights are already named as SGLang's ``LlamaForCausalLMEagle3`` loads them), with the aux layer ids
    translated for SGLang as for a speculators draft, the target's token ids and ``verifier`` record (``target``,
    default the one the run trained against), and the same stamp (idempotent, atomic)."""
    from eagle3ops.train import specforge

    version = _version(sglang_version).version
    run = Path(run_dir)
    inputs = run / specforge.INPUTS
    ckpt = specforge.latest_checkpoint(specforge.output_dir(run))
    if ckpt is None:
        raise ConvertError(
            f"{specforge.output_dir(run)}: no complete SpecForge checkpoint (no *-latest with "
            f"{specforge.STATE_FILE}); train first",
            missing=True,
        )
    dcfg = json.loads((inputs / specforge.DRAFT_CONFIG).read_text())
    ids = list(dcfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    tcfg = json.loads((inputs / "target" / "config.json").read_text())
    # the run's target view links the target's own files: its config.json resolves to the target directory
    tfacts = target_facts(target or (inputs / "target" / "config.json").resolve().parent)
    arch, arch_from = served_arch(target_arch, tfacts, {})
    if sglang_ids:
        out_ids, rule = [int(i) for i in sglang_ids], "given"
    else:
        out_ids, rule = sglang_layer_ids(ids, arch, tcfg.get("num_hidden_layers"), sglang_version=version)
    src = {"training_state": sha256_file(ckpt / specforge.STATE_FILE)}
    stamp = {
        "converter_version": CONVERTER_VERSION,
        "trainer": "specforge",
        "specforge_version": specforge.installed_version(),
        "dtype": DRAFT_DTYPE,
        "sglang_version": version,
        "source": src,
        "sglang_layer_ids": out_ids,
        "draft_window_size": None,
        "target": tfacts,
    }
    out = Path(out_dir)
    try:
        current = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        current = None
    res = {
        "checkpoint": str(ckpt),
        "out": str(out),
        "trainer": "specforge",
        "target_arch": arch,
        "target_arch_from": arch_from,
        "layer_ids": ids,
        "sglang_layer_ids": out_ids,
        "layer_id_rule": rule,
        "draft_window_size": None,
        "stamp": stamp,
        "serve_args": ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(out)],
        "changed": current != stamp or not any(out.glob("*.safetensors")),
        "check_mode": check,
    }
    if not res["changed"] or check:
        return res

    def write(tmp: Path) -> None:
        specforge.export_to_sglang(ckpt, run, tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), "eagle_aux_hidden_state_layer_ids": out_ids}
        cfg["torch_dtype"] = cfg["dtype"] = DRAFT_DTYPE
        cfg.update(tfacts["token_ids"])
        cfg["verifier"] = tfacts["verifier"]
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")

    _publish(out, write)
    res["config"] = json.loads((out / "config.json").read_text())
    return res
