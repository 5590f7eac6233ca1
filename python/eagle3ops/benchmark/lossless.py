"""Is speculative decoding lossless here? The greedy output ids of the server with the draft against the plain
server's, prompt by prompt.

Greedy speculative decoding must commit exactly the tokens the target alone would pick. In floating point it can
differ where two tokens are nearly tied: the verify step scores a tree of draft tokens in one forward pass (other
kernel shapes, another reduction order), so a logit can move by a rounding step and flip an argmax. A mismatch is
therefore reported with its first divergence (position, both tokens) and, where the servers returned log
probabilities (SGLang's ``return_logprob`` + ``top_logprobs_num``), the gap between the two tokens at that position:
``logprob(plain token) - logprob(speculative token)`` under the plain server's distribution, which equals their
logit gap (the softmax normaliser cancels). A gap at or below ``tie_gap`` is a numerical near-tie, said as such;
a larger one is a real mismatch.

Inputs are what :func:`sample_entry` keeps of a ``/generate`` answer: ``output_ids`` and, per output position,
the top log probabilities as ``{token id: logprob}``.
"""

from __future__ import annotations

# Gap (nats) at or below which two tokens count as a numerical tie. Logits come out of a bf16 lm_head: at a
# logit of 16-32, one bf16 step is 0.125, so two logits one rounding step apart differ by up to ~0.125; 0.25
# allows one step on each side.
TIE_GAP = 0.25
TOP_LOGPROBS = 5  # top log probabilities asked per position (the other server's token is usually among them)


def sample_entry(answer: dict) -> dict:
    """What the check keeps of one SGLang ``/generate`` answer: ``output_ids`` and, when the server returned
    them, the top log probabilities per output position (``meta_info.output_top_logprobs``: per position a list
    of ``[logprob, token_id, text]``)."""
    meta = answer.get("meta_info") or {}
    tops = meta.get("output_top_logprobs")
    top = None
    if isinstance(tops, list):
        top = [{str(int(t[1])): float(t[0]) for t in pos or [] if t and t[0] is not None} for pos in tops]
    ids = answer.get("output_ids")
    return {"output_ids": [int(x) for x in ids] if isinstance(ids, list) else None, "top_logprobs": top}


def _lp(top: list | None, pos: int, token: int) -> float | None:
    if not top or pos >= len(top):
        return None
    return top[pos].get(str(token))


def _gap(top: list | None, pos: int, ta: int, tb: int) -> tuple[float | None, bool]:
    """(gap, exact) between tokens ``ta`` and ``tb`` at ``pos`` from one server's top log probabilities: exact
    when both are listed; a lower bound when one is (the other's log probability is at most the list's lowest);
    (None, False) when neither is."""
    la, lb = _lp(top, pos, ta), _lp(top, pos, tb)
    if la is not None and lb is not None:
        return abs(la - lb), True
    listed = la if la is not None else lb
    if listed is None:
        return None, False
    return listed - min(top[pos].values()), False


def first_divergence(plain: list[int], spec: list[int]) -> int | None:
    """The first position where the two id lists differ (a length difference counts at the shorter's end);
    None when they are equal."""
    for i, (a, b) in enumerate(zip(plain, spec, strict=False)):
        if a != b:
            return i
    return None if len(plain) == len(spec) else min(len(plain), len(spec))


def compare_one(plain: dict, spec: dict, *, tie_gap: float = TIE_GAP) -> dict:
    """One prompt: ``{"match": bool}``, and for a mismatch the divergence: ``position``, ``plain_token``,
    ``spec_token`` (None past the end of a shorter answer), the ``gap`` (nats, from the plain server's
    log probabilities; else from the speculative server's, ``gap_from`` says which; None when neither returned
    both tokens) and ``verdict``: ``near_tie`` (gap <= tie_gap), ``mismatch`` (larger gap) or ``unexplained``
    (no gap known)."""
    a, b = plain.get("output_ids"), spec.get("output_ids")
    if a is None or b is None:
        return {"match": None, "verdict": "no_output_ids"}
    k = first_divergence(a, b)
    if k is None:
        return {"match": True, "tokens": len(a)}
    ta = a[k] if k < len(a) else None
    tb = b[k] if k < len(b) else None
    out = {"match": False, "tokens": len(a), "position": k, "plain_token": ta, "spec_token": tb}
    gap, src = None, None
    if ta is not None and tb is not None:
        found = [
            (_gap(side.get("top_logprobs"), k, ta, tb), name)
            for name, side in (("plain", plain), ("spec", spec))
        ]
        exact = [(g, n) for (g, ex), n in found if g is not None and ex]
        bound = [(g, f"{n}_lower_bound") for (g, ex), n in found if g is not None and not ex]
        gap, src = (exact or bound or [(None, None)])[0]
    out["gap"] = round(gap, 5) if gap is not None else None
    out["gap_from"] = src
    if gap is None:
        out["verdict"] = "unexplained"
    elif src.endswith("lower_bound"):
        out["verdict"] = "mismatch" if gap > tie_gap else "unexplained"
    else:
        out["verdict"] = "near_tie" if gap <= tie_gap else "mismatch"
    return out


def compare(plain: list[dict], spec: list[dict], *, tie_gap: float = TIE_GAP) -> dict:
    """Every sampled prompt, the same ones in the same order on both sides (``plain[i]`` and ``spec[i]``, each
    with ``id``/``set`` and :func:`sample_entry`'s fields). The match rate, the divergences, and whether the run
    is lossless: every prompt identical, or every mismatch a near-tie."""
    if [(p.get("set"), p.get("id")) for p in plain] != [(s.get("set"), s.get("id")) for s in spec]:
        raise ValueError(
            "the two servers' lossless samples are not the same prompts (measured with different prompt sets, "
            "--lossless-sample or --per-category/--seed): measure both again with the same settings"
        )
    rows = []
    for p, s in zip(plain, spec, strict=True):
        r = compare_one(p, s, tie_gap=tie_gap)
        rows.append({"set": p.get("set"), "id": p.get("id"), **r})
    compared = [r for r in rows if r["match"] is not None]
    same = sum(1 for r in compared if r["match"])
    diverged = [r for r in compared if not r["match"]]
    verdicts = {
        v: sum(1 for r in diverged if r["verdict"] == v) for v in ("near_tie", "mismatch", "unexplained")
    }
    return {
        "prompts": len(rows),
        "compared": len(compared),
        "identical": same,
        "match_rate": round(same / len(compared), 4) if compared else None,
        "near_ties": verdicts["near_tie"],
        "mismatches": verdicts["mismatch"],
        "unexplained": verdicts["unexplained"],
        "lossless": bool(compared) and verdicts["mismatch"] == 0 and verdicts["unexplained"] == 0,
        "tie_gap": tie_gap,
        "divergences": diverged,
        "no_output_ids": len(rows) - len(compared),
    }


def summary_line(res: dict) -> str:
    """One sentence for the report."""
    if not res.get("compared"):
        return (
            f"Lossless check: not possible ({res.get('prompts', 0)} prompts sampled, no output ids returned by "
            "the servers)"
        )
    head = (
        f"Lossless check (greedy output ids, with vs without the draft, {res['compared']} prompts): "
        f"{res['identical']}/{res['compared']} identical ({100 * res['match_rate']:.1f} %)"
    )
    if not res["divergences"]:
        return head + ": lossless"
    parts = []
    for d in res["divergences"][:5]:
        gap = (
            f"gap {d['gap']:.3f} nats ({d['gap_from']})"
            if d.get("gap") is not None
            else "no log probabilities"
        )
        parts.append(
            f"{d['set']}/{d['id']} at token {d['position']}: {d['plain_token']} vs {d['spec_token']}, {gap}, "
            f"{d['verdict'].replace('_', ' ')}"
        )
    verdict = (
        "every divergence a numerical near-tie"
        if res["lossless"]
        else f"{res['mismatches']} mismatch(es), {res['unexplained']} without log probabilities to judge"
    )
    return f"{head}; {verdict} (tie: gap <= {res['tie_gap']} nats): " + "; ".join(parts)
