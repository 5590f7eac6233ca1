"""Regeneration throughput vs a plain load generator on the same server, at the same concurrency (issue #18:
the regenerate phase must reach >= 0.9 x what the server does under a plain load generator).

Both legs send the *same* requests: the first user turn of each of N conversations (single-turn copies are
written to a temp file), greedy, the same max_tokens, the same concurrency. The load generator is the
smallest honest one: a thread pool, one keep-alive http.client connection per thread, nothing else; the
other leg is ``eagle3ops.regenerate`` (openai backend) with its accounting, done.log and atomic output.
Output tokens come from the server's ``usage.completion_tokens`` in both legs. Run the legs in either order
(``--order``) to see warm-up effects; ``--multi-turn`` also times regenerate on the full conversations
(no load-generator twin: its prompts depend on the answers).

Usage (the GPU box, an SGLang server already up):
  PYTHONPATH=python python3 bench/regenerate_throughput.py --url http://127.0.0.1:30000 --model M \\
      --input sharegpt.json --n 512 --concurrency 64 --max-new-tokens 256 --out "$OUT"
Writes OUT/regenerate_throughput_<date>_<card>.json. Smoke test on a CPU box: against tests/fixtures/openai_standin.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from result_name import result_name  # bench/result_name.py: this script's directory is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def first_turns(inputs: list[str], n: int) -> list[dict]:
    """Single-turn copies (system + first user turn + first answer) of the first n usable conversations."""
    from eagle3ops import conversations as rg_conversations
    from eagle3ops.regenerate import turns as rg_turns

    scan = rg_turns.scan_inputs(rg_conversations.resolve_sources(inputs), None)
    out = []
    for it in scan.items:
        conv = it.record[it.key]
        k = next(j for j, t in enumerate(conv) if rg_conversations.role_of(t) == "user")
        rest = conv[k + 1 :]
        a = next((j for j, t in enumerate(rest) if rg_conversations.role_of(t) == "assistant"), None)
        if a is None:
            continue
        out.append({it.key: [*conv[: k + 1], rest[a]]})
        if len(out) == n:
            break
    return out


def load_generator(
    url: str, model: str, convs: list[dict], concurrency: int, max_new: int, timeout: float
) -> dict:
    p = urllib.parse.urlsplit(url)
    local = threading.local()
    tokens = [0]
    lock = threading.Lock()

    def one(rec: dict) -> None:
        key = "conversations" if "conversations" in rec else "messages"
        msgs = [
            {
                "role": {"human": "user", "gpt": "assistant"}.get(
                    t.get("from"), t.get("from", t.get("role"))
                ),
                "content": t.get("value", t.get("content")),
            }
            for t in rec[key][:-1]
        ]
        body = json.dumps(
            {
                "model": model,
                "messages": msgs,
                "max_tokens": max_new,
                "temperature": 0.0,
                "top_p": 1.0,
                "stream": False,
            }
        ).encode()
        c = getattr(local, "c", None) or http.client.HTTPConnection(p.hostname, p.port, timeout=timeout)
        local.c = c
        c.request(
            "POST",
            p.path.rstrip("/") + "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        r = c.getresponse()
        d = json.loads(r.read())
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {d}")
        with lock:
            tokens[0] += int(d["usage"]["completion_tokens"])

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, convs))
    wall = time.monotonic() - t0
    return {
        "output_tokens": tokens[0],
        "wall_seconds": round(wall, 3),
        "tok_per_s": round(tokens[0] / wall, 1),
    }


def regenerate_leg(url, model, srcs: list, out: Path, concurrency, max_new, timeout, limit=None) -> dict:
    from eagle3ops.regenerate.config import RegenerateConfig
    from eagle3ops.regenerate.run import regenerate

    r = regenerate(
        RegenerateConfig(
            model=model,
            inputs=[str(s) for s in srcs],
            out=str(out),
            backend="openai",
            urls=[url],
            concurrency=concurrency,
            max_new_tokens=max_new,
            request_timeout=timeout,
            on_error="skip",
            limit=limit,
            log=lambda m: None,
        )
    )
    keys = (
        "num_written",
        "num_failed",
        "num_skipped",
        "output_tokens",
        "wall_seconds",
        "tok_per_s",
        "turns_generated",
    )
    return {k: r[k] for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True, action="append")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--order", choices=["load-first", "regenerate-first"], default="load-first")
    ap.add_argument("--multi-turn", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    convs = first_turns(a.input, a.n)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "first_turns.jsonl"
        src.write_text("".join(json.dumps(c) + "\n" for c in convs))
        legs = {}
        order = ["load", "regenerate"] if a.order == "load-first" else ["regenerate", "load"]
        for leg in order:
            if leg == "load":
                legs[leg] = load_generator(a.url, a.model, convs, a.concurrency, a.max_new_tokens, a.timeout)
            else:
                legs[leg] = regenerate_leg(
                    a.url, a.model, [src], Path(tmp) / "out.jsonl", a.concurrency, a.max_new_tokens, a.timeout
                )
        if a.multi_turn:
            legs["regenerate_multi_turn"] = regenerate_leg(
                a.url,
                a.model,
                a.input,
                Path(tmp) / "multi.jsonl",
                a.concurrency,
                a.max_new_tokens,
                a.timeout,
                a.n,
            )
    res = {
        "url": a.url,
        "model": a.model,
        "n": len(convs),
        "concurrency": a.concurrency,
        "max_new_tokens": a.max_new_tokens,
        "order": a.order,
        "legs": legs,
        "ratio_regenerate_vs_load": round(
            legs["regenerate"]["tok_per_s"] / max(1e-9, legs["load"]["tok_per_s"]), 3
        ),
    }
    (outdir / result_name("regenerate_throughput")).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
