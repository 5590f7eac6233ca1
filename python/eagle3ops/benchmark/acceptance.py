"""Offline acceptance length of an EAGLE-3 draft: greedy chain drafting, verified by the target (transformers).

Per verify step (what SGLang does with ``--speculative-eagle-topk 1 --speculative-num-steps k``):

1. The target has verified the context ``x_0..x_n`` (its last forward gave the hidden states of
   ``x_0..x_{n-1}`` and chose ``x_n``). Its aux states are the **inputs** of the layers the draft was trained
   on (``hidden_states[i]`` of transformers' ``output_hidden_states``: the ``extract`` convention).
2. The draft runs over the pairs ``(aux_j, x_{j+1})`` at positions ``j+1`` (speculators' ``shift_batch``),
   then chains ``k-1`` more steps on its own output hidden state (post-norm when the draft has
   ``norm_output``) and its own previous token, one position further each step (its KV cache holds the
   earlier ones: SGLang's chain). Draft-vocabulary ids map to target ids through ``d2t``.
3. One target forward over ``x_0..x_n, d_1..d_k`` verifies: ``a`` = the length of the longest prefix of the
   drafts equal to the target's greedy choices; ``a+1`` tokens are committed (the accepted drafts plus the
   target's own next token). The same forward gives the hidden states of the next step.

By default both run incrementally, as a server does: the target forwards only ``x_n, d_1..d_k`` against its KV
cache of ``x_0..x_{n-1}`` (the rejected drafts' entries are cropped before the next step), and the draft keeps the
KV of the pairs committed so far and computes only the new ones (its chain's own entries are dropped, as SGLang
recomputes them from the target's states). ``measure(..., incremental=False)`` recomputes everything at every
step; the tests check the two agree.

Acceptance length = mean of ``a+1`` over verify steps (SGLang reports completion tokens / ``spec_verify_ct``,
the same quantity). Per-position acceptance: the share of verify steps whose draft ``i`` was accepted (all of
``1..i`` matched), and the conditional rate (given ``1..i-1`` were).

The draft runs through speculators 0.9.0's own ``Eagle3DraftModel`` modules (fc, input norm, decoder layers,
rotary, norm, lm_head, d2t) loaded from the checkpoint; only the chaining loop is written here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from eagle3ops import jsonl


class AcceptanceError(Exception):
    """Unusable inputs; the message says what to do."""


def load_prompts(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Held-out prompts: JSONL with ``prompt``, ``conversations`` (from/value or role/content) or ``input_ids``."""
    out = []
    for n, row in jsonl.numbered(path, AcceptanceError):
        if row.get("input_ids"):
            out.append({"id": row.get("id", f"row-{n}"), "input_ids": [int(i) for i in row["input_ids"]]})
            if limit and len(out) >= limit:
                break
            continue
        msgs = []
        for t in row.get("conversations") or row.get("messages") or []:
            role = t.get("from", t.get("role"))
            role = {"human": "user", "gpt": "assistant"}.get(role, role)
            if role == "assistant":
                break  # the prompt is everything before the first answer
            msgs.append({"role": role, "content": t.get("value", t.get("content", ""))})
        if not msgs and row.get("prompt"):
            msgs = [{"role": "user", "content": row["prompt"]}]
        if not msgs:
            raise AcceptanceError(f"{path}:{n}: no 'prompt' and no user turn in 'conversations'")
        out.append({"id": row.get("id", f"row-{n}"), "messages": msgs})
        if limit and len(out) >= limit:
            break
    if not out:
        raise AcceptanceError(f"{path}: no prompts")
    return out


class Target:
    """The target model (transformers), greedy, recomputed over the whole sequence each call (small models)."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        layer_ids: list[int],
        dtype: str = "float32",
        device: str = "cpu",
        trust_remote_code: bool = False,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = str(model_path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError):
            self.tokenizer = None  # prompts must then be given as input_ids
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        ).to(self.device)
        self.model.eval()
        n = self.model.config.num_hidden_layers
        if max(layer_ids) >= n or min(layer_ids) < 0:
            raise AcceptanceError(f"layer ids {layer_ids} do not fit the target's {n} layers ({self.path})")
        self.layer_ids = list(layer_ids)
        self.eos = self.tokenizer.eos_token_id if self.tokenizer else self.model.config.eos_token_id

    def encode(self, prompt: dict) -> list[int]:
        if prompt.get("input_ids"):
            return list(prompt["input_ids"])
        messages = prompt["messages"]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def forward(self, ids: list[int]):
        """(greedy next-token choice at every position [T], aux states [T, K*H])."""
        import torch

        with torch.no_grad():
            out = self.model(torch.tensor([ids], device=self.device), output_hidden_states=True)
        choice = out.logits[0].argmax(-1).tolist()
        aux = torch.cat([out.hidden_states[i][0] for i in self.layer_ids], dim=-1)
        return choice, aux

    def extend(self, cache, new_ids: list[int], keep: int):
        """``forward`` of ``new_ids`` at positions ``keep``.. only, after the first ``keep`` positions of ``cache``
        (what was computed beyond them, rejected drafts, is dropped): the server's incremental verify. Returns the
        choices and aux states of the new positions."""
        import torch

        _keep(cache, keep)
        with torch.no_grad():
            out = self.model(
                torch.tensor([new_ids], device=self.device),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=True,
            )
        choice = out.logits[0].argmax(-1).tolist()
        aux = torch.cat([out.hidden_states[i][0] for i in self.layer_ids], dim=-1)
        return choice, aux


def _keep(cache, n: int) -> None:
    """Keep the first ``n`` positions of a transformers DynamicCache (a negative ``crop`` removes that many tokens
    from the end in the transformers 4.x and 5.x APIs alike)."""
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


class Eagle3Drafter:
    """A speculators 0.9.0 EAGLE-3 checkpoint, run as a greedy chain drafter."""

    def __init__(self, checkpoint: str | os.PathLike, dtype: str = "float32", device: str = "cpu"):
        import torch
        from safetensors.torch import load_file
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        from eagle3ops.checkpoints import resolve_checkpoint

        ckpt = resolve_checkpoint(checkpoint)
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg.pop("auto_map", None)
        config = Eagle3SpeculatorConfig(**cfg)
        config.transformer_layer_config._attn_implementation = "sdpa"
        model = Eagle3DraftModel(config)
        state = load_file(str(ckpt / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.startswith("verifier_")]
        if missing or unexpected:
            raise AcceptanceError(
                f"{ckpt}: checkpoint does not match its config (missing {missing}, unexpected {unexpected})"
            )
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=getattr(torch, dtype)).eval()
        self.dtype = getattr(torch, dtype)
        self.checkpoint = str(ckpt)
        self.layer_ids = list(cfg["eagle_aux_hidden_state_layer_ids"])
        self.norm_output = bool(cfg.get("norm_output"))
        self.d2t = self.model.d2t.long()
        self._cache, self._pairs = None, 0  # the draft KV kept between proposals of one sequence (begin/end)

    def _step(self, hidden, ids, position_ids, cache):
        """One decoder pass; hidden [1, T, H] (after fc), ids [1, T]. Returns (draft-vocab logits, next hidden)."""
        import torch

        m = self.model
        embeds = m.embed_tokens(ids)
        x = torch.cat([embeds, hidden], dim=-1)
        pos_emb = m.rotary_emb(x, position_ids)
        past = cache.get_seq_length()
        q = ids.shape[1]
        cache_position = torch.arange(past, past + q, device=self.device)
        mask = None  # sdpa: causal for a prefix without a cache, all-visible for a single new query
        if past and q > 1:  # several new queries after cached keys: query i sees keys 0..past+i (sdpa's own
            # is_causal would align the diagonal at key 0)
            keys = torch.arange(past + q, device=self.device)
            allowed = keys[None, :] <= cache_position[:, None]
            mask = torch.zeros(allowed.shape, dtype=x.dtype, device=self.device)
            mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]
        for layer in m.layers:
            x = layer(
                x,
                attention_mask=mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                cache_position=cache_position,
                position_embeddings=pos_emb,
            )
        normed = m.norm(x)
        logits = m.lm_head(normed)
        return logits, (normed if self.norm_output else x)

    def to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    def prefix_predictions(self, aux, ids):
        """Step-0 predictions (target ids) at every pair (aux_j, x_{j+1}): what the trainer's first TTT step sees."""
        import torch
        from transformers import DynamicCache

        with torch.no_grad():
            h = self._fc(aux[:-1].to(self.device, self.dtype))[None]
            tok = torch.tensor([ids[1:]], device=self.device)
            pos = torch.arange(1, len(ids), device=self.device)[None]
            logits, _ = self._step(h, tok, pos, DynamicCache())
        return self.to_target(logits[0].argmax(-1))

    def _fc(self, aux):
        m = self.model
        if m.input_norm is not None:
            aux = m.input_norm(aux)
        if m.fc_norm is not None:
            import torch

            aux = torch.cat(
                [n(c) for n, c in zip(m.fc_norm, aux.chunk(len(m.fc_norm), dim=-1), strict=True)], -1
            )
        return m.fc(aux)

    def begin(self) -> None:
        """A new sequence: from now on ``propose`` keeps the draft's KV of the committed pairs between calls (as
        SGLang does) and computes only the pairs committed since the last call."""
        from transformers import DynamicCache

        self._cache, self._pairs = DynamicCache(), 0

    def end(self) -> None:
        """The sequence is over: ``propose`` recomputes from the whole prefix again."""
        self._cache = None

    def propose(self, ids: list[int], aux, k: int) -> list[int]:
        """k greedy draft tokens after ``ids`` (x_0..x_n), from the target's aux states of x_0..x_{n-1}."""
        if self._cache is None:
            return self.chain(ids, aux, k)[0]
        out = self.chain(ids, aux, k, cache=self._cache, start=self._pairs)[0]
        self._pairs = len(ids) - 1
        return out

    def chain(self, ids: list[int], aux, k: int, feed: list[int] | None = None, cache=None, start: int = 0):
        """(k draft tokens, the draft-vocab logits of each step).

        ``cache``/``start``: a draft KV cache holding the pairs before ``start`` (what was cached beyond them, the
        last chain's own positions, is dropped); only the pairs from ``start`` on are computed. Default: a new
        cache, every pair.
        ``feed`` (tests only): tokens fed to steps 2..k instead of the draft's own choices (teacher forcing, as
        speculators' training forward does), to compare with it step by step.
        """
        import torch
        from transformers import DynamicCache

        n = len(ids) - 1
        out, all_logits = [], []
        if cache is None:
            cache, start = DynamicCache(), 0
        _keep(cache, start)
        with torch.no_grad():
            h = self._fc(aux[start:n].to(self.device, self.dtype))[None]
            tok = torch.tensor([ids[start + 1 : n + 1]], device=self.device)
            pos = torch.arange(start + 1, n + 1, device=self.device)[None]
            logits, hid = self._step(h, tok, pos, cache)
            for s in range(k):
                all_logits.append(logits[0, -1])
                d = self.to_target(logits[0, -1].argmax(-1))
                out.append(int(d))
                if s == k - 1:
                    break
                nxt = int(d) if feed is None else int(feed[s])
                logits, hid = self._step(
                    hid[:, -1:],
                    torch.tensor([[nxt]], device=self.device),
                    torch.tensor([[n + 1 + s]], device=self.device),
                    cache,
                )
        return out, all_logits


class OracleDrafter:
    """Constructed check: proposes the target's own greedy continuation (acceptance must be k+1)."""

    def __init__(self, target: Target):
        self.target = target

    def propose(self, ids, aux, k):
        seq = list(ids)
        for _ in range(k):
            choice, _ = self.target.forward(seq)
            seq.append(int(choice[-1]))
        return seq[len(ids) :]


class RandomDrafter:
    """Constructed check: uniformly random tokens (acceptance ~ 1)."""

    def __init__(self, vocab_size: int, seed: int = 0):
        import torch

        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab_size

    def propose(self, ids, aux, k):
        import torch

        return torch.randint(0, self.vocab, (k,), generator=self.gen).tolist()


def _generate(target: Target, drafter, ids: list[int], k: int, max_new_tokens: int, incremental: bool):
    """One prompt's draft/verify loop: (accepted drafts per verify step, tokens generated)."""
    import torch

    prompt_len = len(ids)
    if incremental:
        from transformers import DynamicCache

        cache = DynamicCache()
        choice, aux = target.extend(cache, ids, 0)
    else:
        choice, aux = target.forward(ids)
    ids = [*ids, int(choice[-1])]
    accepted = []
    while len(ids) - prompt_len < max_new_tokens and ids[-1] != target.eos:
        drafts = drafter.propose(ids, aux, k)
        n = len(ids) - 1
        if incremental:  # x_n and the drafts, at positions n..n+k, after the cached x_0..x_{n-1}
            choice, aux_new = target.extend(cache, [ids[-1], *drafts], n)
            at = 0  # choice[at + i]: the target's choice after x_n, d_1..d_i
        else:
            choice, aux_all = target.forward(ids + drafts)
            at = n
        a = 0
        while a < k and drafts[a] == int(choice[at + a]):
            a += 1
        new = [*drafts[:a], int(choice[at + a])]
        if target.eos in new:
            new = new[: new.index(target.eos) + 1]
        ids = ids + new
        aux = torch.cat([aux, aux_new[: a + 1]]) if incremental else aux_all[: len(ids) - 1]
        accepted.append(a)
    return accepted, len(ids) - prompt_len


def measure(
    target: Target,
    drafter,
    prompts: list[dict],
    *,
    k: int = 3,
    max_new_tokens: int = 64,
    incremental: bool = True,
) -> dict:
    """Run the greedy chain draft/verify loop over the prompts; return acceptance statistics.

    ``incremental`` (default): the target verifies only the new tokens against its KV cache, and the draft keeps
    the KV of the committed pairs, as a server does; otherwise both recompute the whole sequence at every step
    (the reference the incremental path is tested against)."""
    if k < 1:
        raise AcceptanceError("k (draft tokens per verify step) must be >= 1")
    started = time.time()
    accepted_hist = [0] * (k + 1)  # number of verify steps with exactly a accepted drafts
    per_prompt = []
    total_new = 0
    for p in prompts:
        if incremental and hasattr(drafter, "begin"):
            drafter.begin()
        try:
            accepted, new_tokens = _generate(
                target, drafter, target.encode(p), k, max_new_tokens, incremental
            )
        finally:
            if hasattr(drafter, "end"):
                drafter.end()
        for a in accepted:
            accepted_hist[a] += 1
        total_new += new_tokens
        per_prompt.append(
            {
                "id": p["id"],
                "verify_steps": len(accepted),
                "acceptance_length": round(sum(accepted) / len(accepted) + 1, 4) if accepted else None,
            }
        )
    steps = sum(accepted_hist)
    if not steps:
        raise AcceptanceError("no verify step ran (every prompt ended at once); use other prompts")
    at_least = [sum(accepted_hist[i:]) for i in range(k + 1)]  # steps with >= i accepted
    per_pos = [round(at_least[i] / steps, 4) for i in range(1, k + 1)]
    cond = [round(at_least[i] / at_least[i - 1], 4) if at_least[i - 1] else None for i in range(1, k + 1)]
    mean_len = sum((a + 1) * c for a, c in enumerate(accepted_hist)) / steps
    return {
        "k": k,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "verify_steps": steps,
        "new_tokens": total_new,
        "acceptance_length": round(mean_len, 4),
        "max_acceptance_length": k + 1,
        "accepted_histogram": accepted_hist,
        "per_position": per_pos,
        "per_position_conditional": cond,
        "per_prompt": per_prompt,
        "seconds": round(time.time() - started, 2),
    }


def _training_state(ckpt) -> dict | None:
    """The checkpoint's speculators training_state.json (epoch, global_step: how long the draft trained, what the
    report's verdict against the random baseline needs), or None."""
    try:
        state = json.loads((Path(ckpt) / "training_state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def run(
    checkpoint: str | os.PathLike,
    target_path: str | os.PathLike,
    prompts_path: str | os.PathLike,
    *,
    k: int = 3,
    max_new_tokens: int = 64,
    limit: int | None = None,
    baseline: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    trust_remote_code: bool = False,
) -> dict:
    """Acceptance of the trained draft (and a random-draft baseline) on held-out prompts; target and draft in
    ``dtype`` on ``device`` (``cuda``: the first visible GPU); ``trust_remote_code``: the target's tokenizer and
    config may be its own code."""
    from eagle3ops.checkpoints import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    if device != "cpu":
        import torch

        if not torch.cuda.is_available():
            raise AcceptanceError(
                f"device {device!r}: torch {torch.__version__} sees no GPU on this host; use device cpu"
            )
    drafter = Eagle3Drafter(ckpt, dtype=dtype, device=device)
    target = Target(
        target_path, drafter.layer_ids, dtype=dtype, device=device, trust_remote_code=trust_remote_code
    )
    prompts = load_prompts(prompts_path, limit)
    res = {
        "method": "offline greedy chain (transformers target, speculators draft)",
        "checkpoint": str(ckpt),
        "target": str(target_path),
        "prompts_file": str(prompts_path),
        "layer_ids": drafter.layer_ids,
        "device": device,
        "dtype": dtype,
        "draft": measure(target, drafter, prompts, k=k, max_new_tokens=max_new_tokens),
        "draft_training": _training_state(ckpt),
    }
    if baseline:
        rnd = RandomDrafter(target.model.config.vocab_size)
        res["random_draft"] = measure(target, rnd, prompts, k=k, max_new_tokens=max_new_tokens)
        res["random_draft"].pop("per_prompt")
    return res
