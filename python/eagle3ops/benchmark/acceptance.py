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

    def __init__(self, model_path: str | os.PathLike, layer_ids: list[int], dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = str(model_path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        except (OSError, ValueError):
            self.tokenizer = None  # prompts must then be given as input_ids
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, dtype)).eval()
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
            out = self.model(torch.tensor([ids]), output_hidden_states=True)
        choice = out.logits[0].argmax(-1)
        aux = torch.cat([out.hidden_states[i][0] for i in self.layer_ids], dim=-1)
        return choice, aux


class Eagle3Drafter:
    """A speculators 0.9.0 EAGLE-3 checkpoint, run as a greedy chain drafter."""

    def __init__(self, checkpoint: str | os.PathLike, dtype: str = "float32"):
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
        self.model = model.to(getattr(torch, dtype)).eval()
        self.dtype = getattr(torch, dtype)
        self.checkpoint = str(ckpt)
        self.layer_ids = list(cfg["eagle_aux_hidden_state_layer_ids"])
        self.norm_output = bool(cfg.get("norm_output"))
        self.d2t = self.model.d2t.long()

    def _step(self, hidden, ids, position_ids, cache):
        """One decoder pass; hidden [1, T, H] (after fc), ids [1, T]. Returns (draft-vocab logits, next hidden)."""
        import torch

        m = self.model
        embeds = m.embed_tokens(ids)
        x = torch.cat([embeds, hidden], dim=-1)
        pos_emb = m.rotary_emb(x, position_ids)
        past = cache.get_seq_length()
        cache_position = torch.arange(past, past + ids.shape[1])
        for layer in m.layers:
            x = layer(
                x,
                attention_mask=None,  # sdpa: causal for the prefix, all-visible for a single new query
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
            h = self._fc(aux[:-1].to(self.dtype))[None]
            tok = torch.tensor([ids[1:]])
            pos = torch.arange(1, len(ids))[None]
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

    def propose(self, ids: list[int], aux, k: int) -> list[int]:
        """k greedy draft tokens after ``ids`` (x_0..x_n), from the target's aux states of x_0..x_{n-1}."""
        return self.chain(ids, aux, k)[0]

    def chain(self, ids: list[int], aux, k: int, feed: list[int] | None = None):
        """(k draft tokens, the draft-vocab logits of each step).

        ``feed`` (tests only): tokens fed to steps 2..k instead of the draft's own choices (teacher forcing, as
        speculators' training forward does), to compare with it step by step.
        """
        import torch
        from transformers import DynamicCache

        n = len(ids) - 1
        out, all_logits = [], []
        with torch.no_grad():
            cache = DynamicCache()
            h = self._fc(aux[:n].to(self.dtype))[None]
            tok = torch.tensor([ids[1:]])
            pos = torch.arange(1, n + 1)[None]
            logits, hid = self._step(h, tok, pos, cache)
            for s in range(k):
                all_logits.append(logits[0, -1])
                d = self.to_target(logits[0, -1].argmax(-1))
                out.append(int(d))
                if s == k - 1:
                    break
                nxt = int(d) if feed is None else int(feed[s])
                logits, hid = self._step(
                    hid[:, -1:], torch.tensor([[nxt]]), torch.tensor([[n + 1 + s]]), cache
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


def measure(target: Target, drafter, prompts: list[dict], *, k: int = 3, max_new_tokens: int = 64) -> dict:
    """Run the greedy chain draft/verify loop over the prompts; return acceptance statistics."""
    if k < 1:
        raise AcceptanceError("k (draft tokens per verify step) must be >= 1")
    started = time.time()
    accepted_hist = [0] * (k + 1)  # number of verify steps with exactly a accepted drafts
    per_prompt = []
    total_new = 0
    for p in prompts:
        ids = target.encode(p)
        prompt_len = len(ids)
        choice, aux = target.forward(ids)
        ids = [*ids, int(choice[-1])]
        steps = 0
        acc_sum = 0
        while len(ids) - prompt_len < max_new_tokens and ids[-1] != target.eos:
            drafts = drafter.propose(ids, aux, k)
            choice, aux_all = target.forward(ids + drafts)
            n = len(ids) - 1
            a = 0
            while a < k and drafts[a] == int(choice[n + a]):
                a += 1
            new = [*drafts[:a], int(choice[n + a])]
            if target.eos in new:
                new = new[: new.index(target.eos) + 1]
            ids = ids + new
            aux = aux_all[: len(ids) - 1]
            accepted_hist[a] += 1
            steps += 1
            acc_sum += a + 1
        total_new += len(ids) - prompt_len
        per_prompt.append(
            {
                "id": p["id"],
                "verify_steps": steps,
                "acceptance_length": round(acc_sum / steps, 4) if steps else None,
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


def run(
    checkpoint: str | os.PathLike,
    target_path: str | os.PathLike,
    prompts_path: str | os.PathLike,
    *,
    k: int = 3,
    max_new_tokens: int = 64,
    limit: int | None = None,
    baseline: bool = True,
) -> dict:
    """Acceptance of the trained draft (and a random-draft baseline) on held-out prompts."""
    from eagle3ops.checkpoints import resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    drafter = Eagle3Drafter(ckpt)
    target = Target(target_path, drafter.layer_ids)
    prompts = load_prompts(prompts_path, limit)
    res = {
        "method": "offline greedy chain (transformers target, speculators draft)",
        "checkpoint": str(ckpt),
        "target": str(target_path),
        "prompts_file": str(prompts_path),
        "layer_ids": drafter.layer_ids,
        "draft": measure(target, drafter, prompts, k=k, max_new_tokens=max_new_tokens),
    }
    if baseline:
        rnd = RandomDrafter(target.model.config.vocab_size)
        res["random_draft"] = measure(target, rnd, prompts, k=k, max_new_tokens=max_new_tokens)
        res["random_draft"].pop("per_prompt")
    return res
