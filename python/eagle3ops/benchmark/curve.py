"""The batch curve: speed-up of speculative decoding against concurrency, where it stops paying, and which
setting (steps/topk/draft tokens, or off) to serve at each concurrency.

A point is measured in rounds, with and without the draft (interleaved where both servers are up); its speed-up
is the ratio of the medians, its spread the lowest and highest per-round ratio. Speculation costs a verify of
several tokens per step: at low concurrency the GPU has room and the accepted tokens are nearly free, at high
concurrency the batch already fills it and the extra tokens cost time. The crossover is the concurrency where
the speed-up falls through 1.0, interpolated between the two measured points around it (linear in
log2(concurrency), the axis the points are spaced on), or "beyond the range" / "below the range" when every
measured point is above / below 1.0.
"""

from __future__ import annotations

import itertools
import math
import statistics


def point(concurrency: int, with_tok_s: list[float], without_tok_s: list[float]) -> dict:
    """One concurrency's rounds: medians, the speed-up from the medians, the per-round ratios' range (paired
    rounds: round i with against round i without)."""
    if not with_tok_s or not without_tok_s:
        raise ValueError(f"concurrency {concurrency}: no rounds with and without the draft")
    mw, mo = statistics.median(with_tok_s), statistics.median(without_tok_s)
    ratios = [w / o for w, o in zip(with_tok_s, without_tok_s, strict=False) if o]
    return {
        "concurrency": concurrency,
        "rounds": min(len(with_tok_s), len(without_tok_s)),
        "with_median": round(mw, 3),
        "without_median": round(mo, 3),
        "speedup": round(mw / mo, 4) if mo else None,
        "ratio_min": round(min(ratios), 4) if ratios else None,
        "ratio_max": round(max(ratios), 4) if ratios else None,
    }


def crossover(points: list[dict]) -> dict:
    """Where the speed-up falls through 1.0 over ``points`` (:func:`point` dicts, any order): ``{"at": c,
    "where": "interpolated", "between": [c_lo, c_hi]}``, or ``at`` None with ``where`` "beyond the range" (every
    point >= 1.0: it pays up to the highest concurrency measured, ``above``) or "below the range" (it does not
    pay even at the lowest, ``below``). Only the first fall counts; a later rise is reported in ``rises_again``."""
    pts = sorted((p for p in points if p.get("speedup") is not None), key=lambda p: p["concurrency"])
    if not pts:
        return {"at": None, "where": "not measured"}
    if pts[0]["speedup"] < 1.0:
        return {"at": None, "where": "below the range", "below": pts[0]["concurrency"]}
    for lo, hi in itertools.pairwise(pts):
        if lo["speedup"] >= 1.0 > hi["speedup"]:
            x0, x1 = math.log2(lo["concurrency"]), math.log2(hi["concurrency"])
            f = (lo["speedup"] - 1.0) / (lo["speedup"] - hi["speedup"])
            at = 2 ** (x0 + f * (x1 - x0))
            rest = pts[pts.index(hi) + 1 :]
            return {
                "at": round(at, 2),
                "where": "interpolated",
                "between": [lo["concurrency"], hi["concurrency"]],
                "rises_again": any(p["speedup"] >= 1.0 for p in rest),
            }
    return {"at": None, "where": "beyond the range", "above": pts[-1]["concurrency"]}


def recommend(curves: dict[str, list[dict]]) -> list[dict]:
    """Per measured concurrency, the setting to serve: among ``curves`` (setting name, e.g. "3/1/4" -> its
    :func:`point` dicts) the one with the highest speed-up, or ``off`` when none is faster than without the draft
    in every round (its median speed-up <= 1.0, or a round where it was slower: the lowest per-round ratio < 1)."""
    by_c: dict[int, list[tuple[str, dict]]] = {}
    for name, pts in curves.items():
        for p in pts:
            if p.get("speedup") is not None:
                by_c.setdefault(p["concurrency"], []).append((name, p))
    out = []
    for c in sorted(by_c):
        name, best = max(by_c[c], key=lambda np: np[1]["speedup"])
        low = best["ratio_min"] if best.get("ratio_min") is not None else best["speedup"]
        pays = best["speedup"] > 1.0 and low >= 1.0
        out.append(
            {
                "concurrency": c,
                "setting": name if pays else "off",
                "speedup": best["speedup"],
                "best_setting": name,
                "why": (
                    f"{name}: {best['speedup']:.3f}x (rounds {low:.3f}-{best.get('ratio_max') or best['speedup']:.3f})"
                    if pays
                    else f"no setting faster in every round (best {name}: {best['speedup']:.3f}x, lowest round "
                    f"{low:.3f}): serve without the draft"
                ),
            }
        )
    return out
