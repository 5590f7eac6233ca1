"""Shared by tests/unit/serve/test_convert.py and train/test_specforge.py: SGLang's EAGLE3 draft loader as the real
wheels hold it (read from each wheel with ``ast``, never imported: SGLang's runtime needs CUDA kernels) and a
STAND-IN for the parameters its model builds (tests/unit/serve/test_convert.py's module doc says what is real)."""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))  # tests/fixtures: sglang_standin


def _sglang_source(member: str, version: str = "0.5.23") -> str:
    from sglang_standin import sglang_source

    return sglang_source(member, version)


def _load_weights_fn(src: str):
    """The real LlamaForCausalLMEagle3.load_weights, compiled from the 0.5.23 source."""
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LlamaForCausalLMEagle3")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights")
    import torch

    ns = {"torch": torch, "Iterable": typing.Iterable, "Tuple": tuple, "default_weight_loader": _copy}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "llama_eagle3.py", "exec"), ns)
    return ns["load_weights"]


def _copy(param, w):
    assert tuple(param.shape) == tuple(w.shape), (tuple(param.shape), tuple(w.shape))
    param.data.copy_(w)


def _stacked_loader(offsets):
    def loader(param, w, shard_id):
        lo, hi = offsets[shard_id]
        assert tuple(w.shape) == (hi - lo, param.shape[1]), (shard_id, tuple(w.shape), tuple(param.shape))
        param.data[lo:hi].copy_(w)

    return loader


def sglang_params(cfg: dict) -> dict:
    """STAND-IN for ``dict(LlamaForCausalLMEagle3(config).named_parameters())`` at TP=1 (see test_convert.py's module doc)."""
    import torch

    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hin = cfg.get("target_hidden_size") or h
    naux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shapes = {
        "model.embed_tokens.weight": (cfg["vocab_size"], h),
        "model.fc.weight": (h, hin * naux),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
    }
    if cfg["eagle_config"].get("norm_before_fc", cfg.get("norm_before_fc")):
        shapes["model.input_norm.weight"] = (hin * naux,)
    if cfg.get("fc_norm") or cfg.get("use_aux_norm"):  # one RMSNorm per aux state (SpecForge's fc_norm)
        shapes.update({f"model.fc_norm.{i}.weight": (hin,) for i in range(naux)})
    loaders = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qkv_in = 2 * h if i == 0 else h
        shapes[p + "self_attn.qkv_proj.weight"] = ((nh + 2 * nkv) * hd, qkv_in)
        loaders[p + "self_attn.qkv_proj.weight"] = _stacked_loader(
            {"q": (0, nh * hd), "k": (nh * hd, (nh + nkv) * hd), "v": ((nh + nkv) * hd, (nh + 2 * nkv) * hd)}
        )
        shapes[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        shapes[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)
        loaders[p + "mlp.gate_up_proj.weight"] = _stacked_loader({0: (0, inter), 1: (inter, 2 * inter)})
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
        for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
            shapes[p + norm + ".weight"] = (h,)
    params = {}
    for name, shape in shapes.items():
        t = torch.nn.Parameter(torch.full(shape, float("nan")), requires_grad=False)
        if name in loaders:
            t.weight_loader = loaders[name]
        params[name] = t
    return params
