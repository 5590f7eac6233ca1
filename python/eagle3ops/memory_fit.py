"""Will the target fit the GPUs? The memory preflight the sglang and serve phases run before they start a server
(``eagle3ops memory-fit``; standard library only: no torch, the GPUs untouched).

SGLang splits each GPU in two: ``mem_fraction_static`` of it for the weights and the KV-cache pool, the rest for
activations, CUDA graphs, NCCL buffers and, in the capture server, the dump hook's buffers. Per GPU of a TP group:

- weights: the checkpoint's tensors (:mod:`eagle3ops.checkpoint_files`, the bytes on disk: INT4 experts count as
  INT4) divided by TP, except what every rank holds whole: in SGLang's DeepSeek-V2/V3 code the MLA
  down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``), the norms and the MoE router; and a multimodal
  wrapper's vision tower and projector (every tensor outside the language model); plus a served draft's share;
- KV cache for ``context_length`` tokens (one full-length request must fit): MLA keeps one latent of
  ``kv_lora_rank + qk_rope_head_dim`` a token and layer, whole on every rank; other attention
  ``2 x ceil(kv_heads / TP) x head_dim``;
- outside the static part: ``reserve`` for activations, CUDA graphs and NCCL, by SGLang's own rule when
  ``--mem-fraction-static`` is not given (:func:`sglang_reserve_mib`: 512 MiB + 1.5 MiB a prefill token + 2 MiB
  a CUDA-graph batch size + 128 MiB a TP rank, at least 10 GiB on a GPU over 60 GiB, 2 GiB more for a draft);
  and for capture, on TP rank 0 (the one that dumps), one prefill batch: SGLang's aux + last states in the model
  dtype ``[N, K+1, H]``, the hook's packed block in the store dtype ``[N, K+1, H]`` and its copy of the last
  state ``[N, H]``. Without ``--mem-fraction-static`` SGLang sets it to ``(GPU - reserve) / GPU``, and so does
  this check.

:func:`check` raises :class:`MemoryFitError` naming the numbers and the inventory variables that change them.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3ops import checkpoint_files, layers
from eagle3ops.errors import WithDetails

MIB = 1024**2
GIB = 1024**3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
# SGLang's ServerArgs defaults where a command line does not say: --max-prefill-tokens; and the chunked prefill
# size and CUDA-graph batch sizes it picks for a large GPU at TP >= 4
SGLANG_MAX_PREFILL_TOKENS = 16384
SGLANG_CHUNKED_PREFILL = 8192
SGLANG_CUDA_GRAPH_MAX_BS = 512
TEXT_PREFIXES = ("language_model.", "model.", "lm_head.")
# held whole by every TP rank in SGLang's deepseek_v2.py (ReplicatedLinear, RMSNorm, MoEGate)
_REPLICATED = re.compile(r"\.(q_a_proj|kv_a_proj_with_mqa|[a-z_]*norm|gate)\.[A-Za-z_]+$")
# the inventory variables that set each number, per phase (what the refusal tells the user to change)
VARIABLES = {
    "capture": {
        "mem_fraction_static": "sglang_extra_args: --mem-fraction-static",
        "context_length": "sglang_extra_args: --context-length",
        "max_prefill_tokens": "sglang_extra_args: --max-prefill-tokens",
        "tp_size": "eagle3ops_tp_size",
        "dtype": "eagle3ops_extract_dtype",
        "reserve": "sglang_extra_args: --cuda-graph-max-bs",
        "model": "sglang_model_path",
    },
    "serve": {
        "mem_fraction_static": "serve_mem_fraction_static",
        "context_length": "serve_extra_args: --context-length",
        "max_prefill_tokens": "serve_extra_args: --max-prefill-tokens",
        "tp_size": "serve_tp_size",
        "dtype": "serve_dtype",
        "reserve": "serve_extra_args: --cuda-graph-max-bs / --chunked-prefill-size",
        "model": "serve_model_path",
    },
}


class MemoryFitError(WithDetails, ValueError):
    """A profile whose memory cannot fit; the message names the numbers and the variables to change."""


@dataclass(frozen=True)
class ModelMemory:
    """What a model needs, read from its directory: bytes split by how TP treats them, KV bytes a token."""

    sharded_bytes: int
    replicated_bytes: int
    kv_latent: int  # MLA: kv_lora_rank + qk_rope_head_dim; 0 for other attention
    kv_heads: int
    head_dim: int
    num_layers: int
    hidden_size: int
    max_positions: int

    def kv_bytes_per_token(self, tp_size: int, kv_bytes: int = 2) -> int:
        if self.kv_latent:
            return self.kv_latent * kv_bytes * self.num_layers
        return 2 * math.ceil(self.kv_heads / tp_size) * self.head_dim * kv_bytes * self.num_layers

    def weight_bytes_per_gpu(self, tp_size: int) -> int:
        return math.ceil(self.sharded_bytes / tp_size) + self.replicated_bytes


@dataclass(frozen=True)
class Profile:
    """The settings one server runs with (``phase``: ``capture`` or ``serve``)."""

    phase: str
    gpu_memory_mib: int
    tp_size: int
    context_length: int
    mem_fraction_static: float | None = None  # None: SGLang's own, (GPU - reserve) / GPU
    chunked_prefill_size: int = (
        SGLANG_CHUNKED_PREFILL  # -1 or 0: off (capture), a prefill is max_prefill_tokens
    )
    max_prefill_tokens: int = SGLANG_MAX_PREFILL_TOKENS
    cuda_graph_max_bs: int = SGLANG_CUDA_GRAPH_MAX_BS
    speculative: bool = False
    aux_layers: int = 3
    model_dtype: str = "bfloat16"
    store_dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    draft_bytes: int = 0

    @property
    def prefill_tokens(self) -> int:
        """The most tokens one prefill forward takes."""
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens


def is_replicated(name: str) -> bool:
    """Whether every TP rank holds the tensor ``name`` whole (see the module docstring)."""
    return not name.startswith(TEXT_PREFIXES) or bool(_REPLICATED.search(name))


def model_memory(model_dir: str | os.PathLike, setting: str = "--model") -> ModelMemory:
    """The model in ``model_dir``: its shards' tensor bytes (headers only) and its (text) config's shape; a
    checkpoint without a decoder language model is refused naming ``setting``
    (:func:`eagle3ops.checkpoint_files.decoder_prefix`)."""
    d = Path(model_dir)
    try:
        full = json.loads((d / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise MemoryFitError(f"{d / 'config.json'}: cannot be read ({e})", path=str(d)) from e
    cfg = layers.text_config(full)
    found = checkpoint_files.tensors(d)
    checkpoint_files.decoder_prefix(d, full, [t.name for t in found], setting)
    sharded = replicated = 0
    for t in found:
        if is_replicated(t.name):
            replicated += t.nbytes
        else:
            sharded += t.nbytes
    heads = int(cfg.get("num_attention_heads") or 1)
    hidden = int(cfg.get("hidden_size") or 0)
    latent = int(cfg.get("kv_lora_rank") or 0) and int(cfg["kv_lora_rank"]) + int(
        cfg.get("qk_rope_head_dim") or 0
    )
    return ModelMemory(
        sharded_bytes=sharded,
        replicated_bytes=replicated,
        kv_latent=latent,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or (hidden // heads if hidden else 0)),
        num_layers=int(cfg.get("num_hidden_layers") or 0),
        hidden_size=hidden,
        max_positions=int(cfg.get("max_position_embeddings") or 0),
    )


def server_flags(args: str | list[str]) -> dict:
    """The memory flags of an SGLang command line (a string or an argv list): ``mem_fraction_static``,
    ``context_length``, ``max_prefill_tokens``, ``tp_size``, ``kv_cache_dtype``; absent ones are left out."""
    argv = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    names = {
        "--mem-fraction-static": ("mem_fraction_static", float),
        "--context-length": ("context_length", int),
        "--max-prefill-tokens": ("max_prefill_tokens", int),
        "--tp-size": ("tp_size", int),
        "--tp": ("tp_size", int),
        "--tensor-parallel-size": ("tp_size", int),
        "--kv-cache-dtype": ("kv_cache_dtype", str),
        "--chunked-prefill-size": ("chunked_prefill_size", int),
        "--cuda-graph-max-bs": ("cuda_graph_max_bs", int),
        "--speculative-algorithm": ("speculative_algorithm", str),
    }
    out: dict = {}
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag in names and (eq or i + 1 < len(argv)):
            key, kind = names[flag]
            raw = value if eq else argv[i + 1]
            try:
                out[key] = kind(raw)
            except ValueError:
                raise MemoryFitError(f"{flag} {raw!r}: not a {kind.__name__}", flag=flag) from None
    return out


def sglang_reserve_mib(p: Profile) -> int:
    """What SGLang keeps outside ``mem_fraction_static`` when it picks the fraction itself (its
    ``_handle_gpu_memory_settings``): activations of the largest prefill, CUDA graphs, TP buffers; at least 10 GiB
    on a GPU of more than 60 GiB; 2 GiB more with a speculative draft."""
    reserved = 512 + max(p.prefill_tokens, 2048) * 1.5 + p.cuda_graph_max_bs * 2 + p.tp_size * 1024 / 8
    if p.gpu_memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return int(reserved + (2048 if p.speculative else 0))


def capture_bytes(p: Profile, hidden: int) -> int:
    """One prefill batch's dump buffers on the capturing GPU (the module docstring says which)."""
    if p.phase != "capture":
        return 0
    k1 = p.aux_layers + 1
    store = DTYPE_BYTES[p.store_dtype]
    scales = 4 * k1 if p.store_dtype == "float8_e4m3fn" else 0  # one float32 scale a token and state
    per_token = hidden * (k1 * DTYPE_BYTES[p.model_dtype] + (k1 + 1) * store) + scales
    return p.prefill_tokens * per_token


def fit(model: ModelMemory, p: Profile) -> dict:
    """The numbers of one GPU (bytes) and ``problems``: what does not fit, each with its fix (empty: it fits)."""
    gpu = p.gpu_memory_mib * MIB
    reserve = sglang_reserve_mib(p) * MIB
    mfs = p.mem_fraction_static
    if mfs is None:  # SGLang's own choice
        mfs = round((gpu - reserve) / gpu, 3)
    static = int(gpu * mfs)
    weights = model.weight_bytes_per_gpu(p.tp_size) + math.ceil(p.draft_bytes / p.tp_size)  # at the same TP
    kv_token = model.kv_bytes_per_token(p.tp_size, KV_DTYPE_BYTES.get(p.kv_cache_dtype, 2))
    kv = p.context_length * kv_token
    capture = capture_bytes(p, model.hidden_size)
    out = {
        "gpu": gpu,
        "static": static,
        "weights": weights,
        "kv_per_token": kv_token,
        "kv": kv,
        "mem_fraction_static": mfs,
        "headroom": gpu - static,
        "reserve": reserve,
        "capture": capture,
        "max_context_length": max(0, (static - weights) // kv_token) if kv_token else 0,
        "profile": asdict(p),
        "problems": [],
    }
    v = VARIABLES[p.phase]
    need_static, need_headroom = weights + kv, reserve + capture
    if need_static + need_headroom > gpu:
        out["problems"].append(
            f"no mem_fraction_static fits: weights {_g(weights)} + KV {_g(kv)} + reserve {_g(reserve)}"
            f"{f' + capture buffers {_g(capture)}' if capture else ''} = {_g(need_static + need_headroom)} > "
            f"{_g(gpu)} a GPU; {_ctx(gpu - weights - need_headroom, kv_token, v)}the reserve ({v['reserve']}"
            + (f"; {v['max_prefill_tokens']}, {p.prefill_tokens:,} tokens a prefill" if capture else "")
            + f"), or use more GPUs ({v['tp_size']} {p.tp_size})"
        )
    elif need_static > static:
        out["problems"].append(
            f"mem_fraction_static {mfs} gives {_g(static)} a GPU for weights {_g(weights)} + KV "
            f"for {p.context_length:,} tokens {_g(kv)} = {_g(need_static)}: raise it to "
            f"{math.ceil(need_static / gpu * 100) / 100} ({v['mem_fraction_static']}; at most "
            f"{math.floor((gpu - need_headroom) / gpu * 100) / 100} leaves the {_g(need_headroom)} outside it), or "
            f"lower the context to {out['max_context_length']:,} tokens ({v['context_length']})"
        )
    elif need_headroom > gpu - static:
        what = f"reserve {_g(reserve)}" + (f" + capture buffers {_g(capture)}" if capture else "")
        out["problems"].append(
            f"mem_fraction_static {mfs} leaves {_g(gpu - static)} a GPU outside it for {what} = "
            f"{_g(need_headroom)}: lower it to {math.floor((gpu - need_headroom) / gpu * 100) / 100} "
            f"({v['mem_fraction_static']})"
            + (
                f", or lower {v['max_prefill_tokens']} ({p.prefill_tokens:,} tokens a prefill)"
                if capture
                else ""
            )
        )
    return out


def check(model: ModelMemory, p: Profile) -> dict:
    """:func:`fit`, raising :class:`MemoryFitError` when anything does not fit."""
    res = fit(model, p)
    if res["problems"]:
        raise MemoryFitError(
            f"the {p.phase} server does not fit {p.tp_size} GPUs of {p.gpu_memory_mib:,} MiB: "
            + "; ".join(res["problems"]),
            **{k: res[k] for k in ("gpu", "static", "weights", "kv", "headroom", "reserve", "capture")},
        )
    return res


def gpu_memory_mib(run=subprocess.run) -> int | None:
    """The smallest GPU's memory in MiB as ``nvidia-smi`` reports it (97,887 on an RTX PRO 6000 Blackwell); None
    where there is no ``nvidia-smi`` or it answers nothing usable (no GPU: nothing to check)."""
    try:
        p = run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    sizes = [int(x) for x in p.stdout.split() if x.isdigit()] if p.returncode == 0 else []
    return min(sizes) if sizes else None


def _g(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _ctx(room: int, kv_token: int, v: dict) -> str:
    """The context-length fix, where one exists (``room``: what is left for the KV cache)."""
    if room < kv_token or not kv_token:
        return "no context length fits beside the weights and the reserve; lower "
    return f"lower the context to {room // kv_token:,} tokens or less ({v['context_length']}), "
