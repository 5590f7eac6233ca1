"""The embedded demo: a tiny DeepSeek-V3-architecture target, its tokenizer and a conversation set.

Everything is generated locally from a seed (no downloads), deterministically, in a few tens of seconds
on one CPU core::

    DIR/model/               DeepseekV3ForCausalLM (8 layers, hidden 64, MLA with DeepSeek-V3's head dims, 4
                             routed + 1 shared expert, 2 dense first layers), bf16 safetensors, a config.json
                             with the fields real DeepSeek-V3/Kimi checkpoints carry (SGLang serves it: see
                             eagle3ops.tinymodel), plus a byte-level BPE tokenizer (PreTrainedTokenizerFast,
                             Jinja chat template, role special tokens)
    DIR/conversations.jsonl  synthetic multi-turn conversations, ShareGPT shape (from/value)
    DIR/heldout.jsonl        prompts not in the training conversations (for the benchmark phase)
    DIR/demo.json            parameters, sha256 of every file, training loss

The target is briefly trained on the rendered conversations so that its next-token predictions are
structured (a draft trained on its hidden states can then be accepted more than once per step): at compact MLA
dims (cheap on a CPU core), then widened exactly to the servable dims (:func:`eagle3ops.tinymodel.widen_mla`).

The build happens in a temporary directory beside DIR that is renamed into place at the end, so an
interrupted build never leaves a partial demo under DIR. Re-running with the same parameters checks the
fingerprints and returns ``changed: False``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

from eagle3ops import jsonl, tinymodel
from eagle3ops.durable import tree_sha256
from eagle3ops.target_dir import CONVERSATIONS, HELDOUT, MODEL_DIR, building, put_in_place, target_paths

DEMO_VERSION = 2  # 2: SGLang-servable target (checkpoint config fields, bf16, DeepSeek-V3's MLA dims)
DEMO_JSON = "demo.json"
_ENTRIES = {DEMO_JSON, MODEL_DIR, CONVERSATIONS, HELDOUT}

# tokenizer
VOCAB_SIZE = 1024
BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
THINK_TOKENS = ["<think>", "</think>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, *ROLE_TOKENS, *THINK_TOKENS]

# The template puts nothing between a role token and the content, so the generation-prompt render
# (ending in "<|assistant|>") is always a token prefix of the full render: special tokens are split out
# before byte-level BPE runs, so the content's tokens never merge with what precedes them.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' ~ message['role']) }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>' ~ message['reasoning_content'] ~ '</think>' }}"
    "{% endif %}"
    "{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# model (DeepSeek-V3 shape, scaled down; eagle3ops.tinymodel is the one builder): what is saved (servable MLA
# dims, bf16) and what is trained (compact MLA dims, float32, widened exactly before saving)
MODEL_CONFIG = tinymodel.model_config(tinymodel.SERVABLE_MLA)
TRAIN_MLA = tinymodel.COMPACT_MLA
MODEL_DTYPE = "bfloat16"
TRAIN_STEPS = 120
TRAIN_BATCH = 8
TRAIN_MAX_TOKENS = 384
TRAIN_SEQ = 256
TRAIN_LR = 5e-3
NUM_HELDOUT = 32


class DemoError(RuntimeError):
    """A problem the user must act on (the message says what to do)."""


# ---------------------------------------------------------------------------------------------------
# conversations
# ---------------------------------------------------------------------------------------------------
WORDS = [
    "apple",
    "banana",
    "cherry",
    "grape",
    "lemon",
    "mango",
    "orange",
    "peach",
    "pear",
    "plum",
    "red",
    "blue",
    "green",
    "yellow",
    "purple",
    "white",
    "black",
    "brown",
    "pink",
    "gray",
    "cat",
    "dog",
    "horse",
    "mouse",
    "bird",
    "fish",
    "tiger",
    "lion",
    "bear",
    "wolf",
    "river",
    "mountain",
    "forest",
    "desert",
    "ocean",
    "island",
    "valley",
    "lake",
    "field",
    "garden",
    "table",
    "chair",
    "window",
    "door",
    "lamp",
    "book",
    "pencil",
    "paper",
    "clock",
    "phone",
    "happy",
    "quiet",
    "bright",
    "small",
    "large",
    "fast",
    "slow",
    "warm",
    "cold",
    "early",
    "north",
    "south",
    "east",
    "west",
    "summer",
    "winter",
    "spring",
    "autumn",
    "morning",
    "evening",
]

UNITS = [
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("kilograms", "grams", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("liters", "milliliters", 1000),
    ("days", "hours", 24),
    ("weeks", "days", 7),
]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful assistant. Answer briefly and exactly.",
    "You answer questions about numbers and words.",
]


def _task_arith(rng: random.Random, ctx: dict) -> tuple[str, str]:
    op = rng.choice(["+", "-", "*"])
    a = rng.randint(2, 99)
    b = rng.randint(2, 99 if op != "*" else 12)
    res = a + b if op == "+" else a - b if op == "-" else a * b
    ctx["last"] = res
    q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Please calculate {a} {op} {b}."])
    return q.format(a=a, op=op, b=b), f"{a} {op} {b} = {res}."


def _task_followup(rng: random.Random, ctx: dict) -> tuple[str, str]:
    if "last" not in ctx:
        return _task_arith(rng, ctx)
    c = rng.randint(2, 20)
    prev = ctx["last"]
    res = prev + c
    ctx["last"] = res
    return f"Now add {c} to that.", f"{prev} + {c} = {res}."


def _task_units(rng: random.Random, ctx: dict) -> tuple[str, str]:
    big, small, factor = rng.choice(UNITS)
    x = rng.randint(1, 50)
    ctx["last"] = x * factor
    q = rng.choice(["Convert {x} {big} to {small}.", "How many {small} are in {x} {big}?"])
    return q.format(x=x, big=big, small=small), f"{x} {big} is {x * factor} {small}."


def _words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def _task_echo(rng: random.Random, ctx: dict) -> tuple[str, str]:
    w = _words(rng, 3, 40)
    return "Repeat these words: " + " ".join(w), " ".join(w)


def _task_reverse(rng: random.Random, ctx: dict) -> tuple[str, str]:
    w = _words(rng, 3, 25)
    return "Reverse the list: " + ", ".join(w), ", ".join(reversed(w))


def _task_sort(rng: random.Random, ctx: dict) -> tuple[str, str]:
    n = [rng.randint(0, 999) for _ in range(rng.randint(3, 20))]
    return "Sort these numbers: " + ", ".join(map(str, n)), ", ".join(map(str, sorted(n)))


def _task_count(rng: random.Random, ctx: dict) -> tuple[str, str]:
    w = _words(rng, 2, 30)
    ctx["last"] = len(w)
    return "Count the words in: " + " ".join(w), f"There are {len(w)} words."


def _task_spell(rng: random.Random, ctx: dict) -> tuple[str, str]:
    word = rng.choice(WORDS)
    return f"Spell the word {word}.", "-".join(word)


def _task_upper(rng: random.Random, ctx: dict) -> tuple[str, str]:
    w = _words(rng, 2, 15)
    return "Write in capitals: " + " ".join(w), " ".join(w).upper()


TASKS = [
    _task_arith,
    _task_followup,
    _task_units,
    _task_echo,
    _task_reverse,
    _task_sort,
    _task_count,
    _task_spell,
    _task_upper,
]


def _conversation(rng: random.Random) -> list[dict]:
    turns: list[dict] = []
    if rng.random() < 0.3:
        turns.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
    ctx: dict = {}
    want = rng.choice([1, 1, 2, 2, 3, 4, 6])
    # at least ~30 tokens: a lone short exchange ("Spell the word cat." / "c-a-t") gets another turn
    while want > 0 or sum(len(t["value"]) for t in turns) < 100:
        q, a = rng.choice(TASKS)(rng, ctx)
        turns.append({"from": "human", "value": q})
        turns.append({"from": "gpt", "value": a})
        want -= 1
    return turns


def generate_conversations(num: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(training conversations, held-out prompts); the held-out prompts appear in no training turn."""
    rng = random.Random(f"eagle3ops-demo-{seed}")
    convs = [{"id": f"demo-{i:05d}", "conversations": _conversation(rng)} for i in range(num)]
    seen = {t["value"] for c in convs for t in c["conversations"] if t["from"] == "human"}
    heldout: list[dict] = []
    hrng = random.Random(f"eagle3ops-demo-heldout-{seed}")
    while len(heldout) < NUM_HELDOUT:
        task = TASKS[len(heldout) % len(TASKS)]
        q, a = task(hrng, {})
        if q in seen:
            continue
        seen.add(q)
        heldout.append(
            {
                "id": f"heldout-{len(heldout):03d}",
                "prompt": q,
                "reference": a,
                "conversations": [{"from": "human", "value": q}],
            }
        )
    return convs, heldout


# ---------------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], out_dir: Path):
    """Train a byte-level BPE on ``texts`` and save it as a PreTrainedTokenizerFast with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[*ROLE_TOKENS, *THINK_TOKENS],
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    # Older loaders read the template from tokenizer_config.json only: keep it there too.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return fast


def render(tokenizer, conv: list[dict], *, add_generation_prompt: bool = False) -> str:
    """Render a ShareGPT/OpenAI-shaped conversation with the tokenizer's chat template."""
    msgs = []
    for t in conv:
        role = t.get("from", t.get("role"))
        role = {"human": "user", "gpt": "assistant"}.get(role, role)
        msgs.append({"role": role, "content": t.get("value", t.get("content", ""))})
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)


# ---------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _torch_single_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def build_model(
    tokenizer, texts: list[str], out_dir: Path, seed: int, log=None, *, steps: int = TRAIN_STEPS
) -> dict:
    """Create the tiny DeepSeek-V3 target, train it briefly (``steps`` optimiser steps) on ``texts``, save it.
    Returns train stats."""
    import torch
    from transformers import GenerationConfig

    seqs = [tokenizer.encode(t, add_special_tokens=False)[:TRAIN_MAX_TOKENS] for t in texts]
    stats: dict = {}
    with _torch_single_thread():
        model = tinymodel.build(
            len(tokenizer),
            mla=TRAIN_MLA,
            seed=seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / steps)
        )
        # Packed LM training: the rendered conversations, reshuffled every epoch, concatenated and cut
        # into TRAIN_BATCH x TRAIN_SEQ blocks (no padding, so every step sees the same number of tokens).
        order_rng = random.Random(seed)
        stream: list[int] = []
        losses: list[float] = []
        t0 = time.monotonic()
        need = TRAIN_BATCH * TRAIN_SEQ
        for step in range(steps):
            while len(stream) < need:
                epoch = list(range(len(seqs)))
                order_rng.shuffle(epoch)
                for i in epoch:
                    stream += seqs[i]
            ids = torch.tensor(stream[:need], dtype=torch.long).view(TRAIN_BATCH, TRAIN_SEQ)
            del stream[:need]
            mask = torch.ones_like(ids)
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if log and (step % 15 == 0 or step == steps - 1):
                log(f"demo: training the target, step {step + 1}/{steps}, loss {losses[-1]:.3f}")
        stats["train_seconds"] = round(time.monotonic() - t0, 1)
        stats["train_steps"] = steps
        stats["initial_lm_loss"] = round(losses[0], 4)
        stats["final_lm_loss"] = round(sum(losses[-10:]) / len(losses[-10:]), 4)
        model.eval()
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            do_sample=False,
        )
        stats["trained_mla"] = dict(TRAIN_MLA)
        model = tinymodel.widen_mla(model, tinymodel.SERVABLE_MLA)
        tinymodel.save(model, out_dir, dtype=MODEL_DTYPE)
    stats["num_parameters"] = sum(p.numel() for p in model.parameters())
    stats["dtype"] = MODEL_DTYPE
    return stats


# ---------------------------------------------------------------------------------------------------
# build / fingerprints
# ---------------------------------------------------------------------------------------------------
def _params(num_conversations: int, seed: int, train_steps: int = TRAIN_STEPS) -> dict:
    params = {"demo_version": DEMO_VERSION, "num_conversations": num_conversations, "seed": seed}
    if train_steps != TRAIN_STEPS:  # recorded only when not the default: demos built before it stay current
        params["train_steps"] = train_steps
    return params


def _result(root: Path, meta: dict, changed: bool) -> dict:
    return {
        "changed": changed,
        **target_paths(root),
        "demo_json": str(root / DEMO_JSON),
        **{k: meta[k] for k in ("num_layers", "hidden_size", "vocab_size", "num_conversations", "seed")},
        **{
            k: meta.get(k)
            for k in ("num_heldout", "final_lm_loss", "initial_lm_loss", "num_parameters", "fingerprint")
        },
    }


def read_demo(out: str | os.PathLike) -> dict | None:
    """The demo.json of a complete demo under ``out``, else None."""
    p = Path(out) / DEMO_JSON
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _is_current(root: Path, params: dict) -> dict | None:
    meta = read_demo(root)
    if not meta or meta.get("params") != params:
        return None
    try:
        if tree_sha256(root, DEMO_JSON) != meta.get("files"):
            return None
    except OSError:
        return None
    return meta


def _clean_stale_builds(root: Path) -> None:
    for p in root.parent.glob(f".{root.name}.demo-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(p, ignore_errors=True)


def build_demo(
    out: str | os.PathLike,
    num_conversations: int = 300,
    seed: int = 0,
    *,
    train_steps: int = TRAIN_STEPS,
    log=None,
    check: bool = False,
) -> dict:
    """Build the demo assets under ``out`` (idempotent; see the module docstring). ``train_steps``: optimiser
    steps of the target's training (fewer: a cheaper, less trained target, e.g. for a test of the pipeline).

    With ``check=True`` nothing is written; ``changed`` says whether a build would happen.
    """
    if num_conversations < 10:
        raise DemoError(f"--num-conversations {num_conversations} is too small: use at least 10")
    if train_steps < 1:
        raise DemoError(f"--train-steps {train_steps}: the target needs at least 1 training step")
    root = Path(out).absolute()
    params = _params(num_conversations, seed, train_steps)
    meta = _is_current(root, params)
    if meta is not None:
        return _result(root, meta, changed=False)
    if root.exists():
        if not root.is_dir():
            raise DemoError(f"{root} exists and is not a directory: choose another --out")
        foreign = sorted(set(os.listdir(root)) - _ENTRIES)
        if foreign:
            raise DemoError(
                f"{root} holds {', '.join(foreign[:5])} that the demo did not make; the demo replaces the "
                "whole directory. Move those aside or choose another --out."
            )
    if check:
        return _result(
            root,
            {
                **params,
                "num_layers": MODEL_CONFIG["num_hidden_layers"],
                "hidden_size": MODEL_CONFIG["hidden_size"],
                "vocab_size": VOCAB_SIZE,
            },
            True,
        )

    log = log or (lambda msg: print(msg, file=sys.stderr))
    _clean_stale_builds(root)
    t0 = time.monotonic()
    with building(root, "demo") as tmp:
        log(f"demo: generating {num_conversations} conversations (seed {seed})")
        convs, heldout = generate_conversations(num_conversations, seed)
        _write_jsonl(tmp / CONVERSATIONS, convs)
        _write_jsonl(tmp / HELDOUT, heldout)

        log("demo: training the tokenizer")
        model_dir = tmp / MODEL_DIR
        model_dir.mkdir()
        texts = [t["value"] for c in convs for t in c["conversations"]]
        tokenizer = train_tokenizer(texts, model_dir)
        rendered = [render(tokenizer, c["conversations"]) for c in convs]

        log("demo: building and training the DeepSeek-V3-shaped target")
        stats = build_model(tokenizer, rendered, model_dir, seed, log=log, steps=train_steps)
        lengths = [len(tokenizer.encode(t, add_special_tokens=False)) for t in rendered]

        meta = {
            "params": params,
            **params,
            "architecture": "DeepseekV3ForCausalLM",
            "num_layers": MODEL_CONFIG["num_hidden_layers"],
            "hidden_size": MODEL_CONFIG["hidden_size"],
            "model_config": MODEL_CONFIG,
            "vocab_size": len(tokenizer),
            "num_heldout": len(heldout),
            "num_turns": sum(len(c["conversations"]) for c in convs),
            "conversation_tokens": {"min": min(lengths), "max": max(lengths), "total": sum(lengths)},
            **stats,
            "files": tree_sha256(tmp, DEMO_JSON),
        }
        meta["build_seconds"] = round(time.monotonic() - t0, 1)
        put_in_place(tmp, root, DEMO_JSON, meta, "demo-old")
    log(f"demo: built {root} in {meta['build_seconds']} s (final LM loss {meta['final_lm_loss']})")
    return _result(root, meta, changed=True)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    jsonl.write(path, rows)
