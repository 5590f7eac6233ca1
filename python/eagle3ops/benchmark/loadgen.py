"""Measuring a live SGLang server: the acceptance probe (and the serve phase's guard), and a small load generator.

Everything talks to SGLang's native ``POST /generate`` (``text`` + ``sampling_params``; the answer's
``meta_info`` has ``completion_tokens`` and, on a server with a draft, ``spec_verify_ct`` — but only for a request
that reached at least one verify step: read in 0.5.17's and 0.5.23's tokenizer manager, and seen live on 0.5.17,
where a raw prompt answered with EOS at once came back without it). Acceptance length = completion tokens / ``spec_verify_ct`` (tokens committed per verify step; 1.00 means
no draft token was ever accepted). Only the standard library is used (threads over ``http.client``): no
dependency on SGLang's own bench module, whose path and options change between versions.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import urllib.parse
from pathlib import Path

# Generic prompts for the guard when no held-out file is given: ordinary requests whose answers a trained draft
# should partly predict (any real draft accepts well above 1 on such text).
BUILTIN_PROBE_PROMPTS = [
    "Explain in a few sentences how a bicycle stays upright.",
    "Write a short list of five tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the water cycle for a ten-year-old.",
    "Give three reasons why people keep a diary.",
    "Describe how to make a cup of tea, step by step.",
    "What does a compiler do? Answer in one paragraph.",
    "Name the planets of the solar system in order from the sun.",
]

LIKELY_CAUSES = (
    "Likely causes: the wrong --speculative-algorithm (EAGLE3 for an EAGLE-3 draft; "
    "serve_speculative_algorithm); aux layer ids in the draft's config.json "
    "(eagle_config.eagle_aux_hidden_state_layer_ids) that are not the layers it was trained on - SGLang and "
    "SpecForge count them one apart (docs/serve-benchmark.md, 'Layer ids'); target and draft served in "
    "different dtypes (serve_dtype, --dtype); a draft trained on another target or tokenizer. A misconfigured "
    "draft serves at exactly 1.00 and nothing else complains (sglang#21272)."
)


class LiveError(Exception):
    pass


def _split(url: str) -> tuple[str, int, str]:
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise LiveError(f"{url}: expected http://HOST:PORT")
    return u.hostname, u.port or 80, u.path.rstrip("/")


def generate(url: str, text: str, sampling: dict, *, timeout: float = 600.0, conn=None) -> dict:
    """One ``POST /generate``; returns the JSON answer. ``conn``: a reusable http.client connection."""
    host, port, base = _split(url)
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    body = json.dumps({"text": text, "sampling_params": sampling})
    try:
        conn.request("POST", base + "/generate", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    except (OSError, http.client.HTTPException) as e:
        raise LiveError(f"{url}/generate: {type(e).__name__}: {e} (is the server up? see its log)") from None
    finally:
        if own:
            conn.close()
    if r.status != 200:
        raise LiveError(f"{url}/generate answered {r.status}: {data[:300].decode(errors='replace')}")
    try:
        return json.loads(data)
    except ValueError:
        raise LiveError(f"{url}/generate: not JSON: {data[:200]!r}") from None


def server_speculative(url: str, *, timeout: float = 30.0) -> str | bool | None:
    """The server's ``speculative_algorithm`` from ``GET /server_info`` (0.5.17 and 0.5.23; ``/get_server_info``
    is the older, deprecated name): the algorithm's name, None when the server runs without a draft, False when
    the server does not say (endpoint missing or unreadable)."""
    host, port, base = _split(url)
    for path in ("/server_info", "/get_server_info"):
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", base + path)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                continue
            info = json.loads(data)
        except (OSError, http.client.HTTPException, ValueError):
            continue
        finally:
            conn.close()
        if isinstance(info, dict) and "speculative_algorithm" in info:
            return info["speculative_algorithm"] or None
    return False


def spec_probe(
    url: str, prompts: list[str], *, max_new_tokens: int = 128, timeout: float = 600, render=None
) -> dict:
    """Acceptance length as SGLang counts it, greedy, one request at a time: completion tokens / ``spec_verify_ct``
    summed over the prompts that reached a verify step, and per request. ``render(messages) -> text`` formats each
    prompt as a one-turn conversation (the target's chat template); without it the prompt is sent as it is.

    SGLang puts ``spec_verify_ct`` into ``meta_info`` only when the request had at least one verify step: an answer
    that ends with its first token (an instruct model given a raw prompt often answers EOS at once) carries no
    acceptance at all, draft or not. Such answers are counted apart (``no_verify``); the probe fails only when no
    answer had a verify step, and then says, from ``/server_info``, whether the server runs a draft at all."""
    per = []
    for text in prompts:
        sent = render([{"role": "user", "content": text}]) if render else text
        ans = generate(url, sent, {"temperature": 0, "max_new_tokens": max_new_tokens}, timeout=timeout)
        meta = ans.get("meta_info") or {}
        c = int(meta.get("completion_tokens") or 0)
        v = meta.get("spec_verify_ct")
        v = int(v) if v is not None else None
        per.append(
            {"completion_tokens": c, "spec_verify_ct": v, "acceptance_length": round(c / v, 4) if v else None}
        )
    verified = [p for p in per if p["spec_verify_ct"]]
    lengths = [p["completion_tokens"] for p in per]
    if not verified:
        algo = server_speculative(url)
        if algo is None:
            raise LiveError(
                f"{url}: the server runs without a draft (/server_info: speculative_algorithm unset); "
                "start it with --speculative-algorithm EAGLE3 and --speculative-draft-model-path"
            )
        how = (
            f"the server runs a draft ({algo}, /server_info)"
            if algo
            else "the server did not say whether it runs a draft (/server_info unreadable)"
        )
        raise LiveError(
            f"{url}: none of the {len(prompts)} probe answers reached a verify step (no spec_verify_ct in "
            f"meta_info; completion tokens per prompt {lengths}); {how}. Answers of 0-1 token carry no "
            "acceptance: render the prompts with the target's chat template (benchmark-spec-probe --chat-template "
            "MODEL_DIR; the serve role does it with serve_probe_chat_template) or use prompts that ask for a "
            "longer answer"
        )
    completion = sum(p["completion_tokens"] for p in verified)
    verify = sum(p["spec_verify_ct"] for p in verified)
    return {
        "prompts": len(prompts),
        "verified_prompts": len(verified),
        "no_verify": len(prompts) - len(verified),
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "acceptance_length": round(completion / verify, 4),
        "per_request": [p["acceptance_length"] for p in per],
        "completion_tokens_per_request": lengths,
        "max_new_tokens": max_new_tokens,
        "chat_template": render is not None,
    }


def guard(res: dict, floor: float, url: str) -> str | None:
    """The guard's verdict on a :func:`spec_probe` result: None when acceptance reaches ``floor``, else why not."""
    if res["acceptance_length"] >= floor:
        return None
    return (
        f"{url}: acceptance length {res['acceptance_length']:.2f} (completion_tokens {res['completion_tokens']} / "
        f"spec_verify_ct {res['spec_verify_ct']} over {res['prompts']} greedy probe prompts; per request "
        f"{res['per_request']}) is below the floor {floor:g} (serve_min_accept_length): the server runs the draft "
        f"but accepts (almost) none of its tokens, so speculative decoding costs time instead of saving it. "
        f"{LIKELY_CAUSES} Check the draft's config.json against extract_meta.json, or lower "
        "serve_min_accept_length for a draft known to be weak."
    )


def request_mean(per_request: list | None) -> float | None:
    """The mean of the per-request acceptance lengths (each request once), beside the pooled length."""
    return round(statistics.fmean(per_request), 4) if per_request else None


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[k]


def run_load(
    url: str,
    requests: list[list[str]],
    *,
    concurrency: int = 1,
    max_new_tokens: int = 256,
    time_budget: float = 600.0,
    timeout: float = 600.0,
    ignore_eos: bool = False,
    render=None,
) -> dict:
    """Send ``requests`` (each a list of user turns: one turn, or a multi-turn conversation whose later turns follow
    the server's own earlier answers) with ``concurrency`` in flight, greedy. Starts no new request once
    ``time_budget`` seconds have passed. ``render(messages) -> text`` turns a conversation into the prompt text
    (a chat template); the default joins the turns as ``User:``/``Assistant:`` lines.

    Output tok/s = all completion tokens / wall time (first request sent to last answer received): what the
    server delivered at this concurrency. Per turn: latency, completion tokens, ``spec_verify_ct``."""
    if concurrency < 1:
        raise LiveError(f"concurrency {concurrency}: must be >= 1")
    if not requests:
        raise LiveError("no requests to send")
    render = render or plain_render
    sampling = {"temperature": 0, "max_new_tokens": max_new_tokens}
    if ignore_eos:
        sampling["ignore_eos"] = True
    host, port, _ = _split(url)
    lock = threading.Lock()
    nxt = [0]
    turns: list[dict] = []
    errors: list[str] = []
    t_start = time.monotonic()

    def worker():
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            while True:
                with lock:
                    i = nxt[0]
                    if i >= len(requests) or time.monotonic() - t_start > time_budget:
                        return
                    nxt[0] += 1
                msgs: list[dict] = []
                for j, user in enumerate(requests[i]):
                    msgs.append({"role": "user", "content": user})
                    t0 = time.monotonic()
                    try:
                        ans = generate(url, render(msgs), sampling, timeout=timeout, conn=conn)
                    except LiveError as e:
                        conn.close()
                        conn = http.client.HTTPConnection(host, port, timeout=timeout)
                        with lock:
                            errors.append(f"request {i} turn {j + 1}: {e}")
                        break
                    t1 = time.monotonic()
                    meta = ans.get("meta_info") or {}
                    msgs.append({"role": "assistant", "content": ans.get("text", "")})
                    with lock:
                        turns.append(
                            {
                                "request": i,
                                "turn": j + 1,
                                "start": t0 - t_start,
                                "end": t1 - t_start,
                                "latency_s": t1 - t0,
                                "prompt_tokens": meta.get("prompt_tokens"),
                                "completion_tokens": int(meta.get("completion_tokens") or 0),
                                "spec_verify_ct": meta.get("spec_verify_ct"),
                            }
                        )
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(requests)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not turns:
        raise LiveError(f"{url}: no request succeeded; first error: {errors[0] if errors else 'none sent'}")
    wall = max(t["end"] for t in turns) - min(t["start"] for t in turns)
    comp = sum(t["completion_tokens"] for t in turns)
    lat = [t["latency_s"] for t in turns]
    spec = [t for t in turns if t["spec_verify_ct"] is not None]
    verify = sum(int(t["spec_verify_ct"]) for t in spec)
    comp_spec = sum(t["completion_tokens"] for t in spec)
    per_acc = [round(t["completion_tokens"] / t["spec_verify_ct"], 4) for t in spec if t["spec_verify_ct"]]
    return {
        "url": url,
        "concurrency": concurrency,
        "requests_planned": len(requests),
        "requests_sent": nxt[0],
        "turns": len(turns),
        "failed": len(errors),
        "errors": errors[:5],
        "wall_s": round(wall, 4),
        "completion_tokens": comp,
        "output_tok_s": round(comp / wall, 3) if wall > 0 else None,
        "requests_per_s": round(len(turns) / wall, 3) if wall > 0 else None,
        "latency_s": {
            "mean": round(statistics.fmean(lat), 4),
            "median": round(statistics.median(lat), 4),
            "p90": round(_percentile(lat, 0.9), 4),
        },
        "per_request_tok_s_median": round(
            statistics.median(t["completion_tokens"] / t["latency_s"] for t in turns if t["latency_s"] > 0), 3
        ),
        "spec_verify_ct": verify if spec else None,
        # pooled: Σ completion tokens / Σ verify steps (a long answer weighs more); the mean of the per-request
        # values weighs each request once (what some tools report as "the" acceptance: say which, give both)
        "acceptance_length": round(comp_spec / verify, 4) if verify else None,
        "acceptance_length_request_mean": request_mean(per_acc),
        "acceptance_per_request": per_acc,
        "time_budget_hit": nxt[0] < len(requests),
        "max_new_tokens": max_new_tokens,
        "per_turn": turns,
    }


def plain_render(messages: list[dict]) -> str:
    """A conversation as plain text, for servers/targets without a chat template."""
    lines = [f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def _may_have_chat_template(model_path: str) -> bool:
    """False when the directory holds no chat template in any place a transformers tokenizer reads one from
    (tokenizer_config.json's ``chat_template``, chat_template.jinja / .json, additional_chat_templates/): then
    there is nothing to render with, and transformers (and torch with it: seconds of CPU) is not imported."""
    d = Path(model_path)
    if not d.is_dir():
        return True  # not a local model directory: transformers resolves it as before
    if any(
        (d / name).exists()
        for name in ("chat_template.jinja", "chat_template.json", "additional_chat_templates")
    ):
        return True
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # unreadable here: let transformers decide (and say so) as before
    return not isinstance(cfg, dict) or bool(cfg.get("chat_template"))


def chat_template_render(model_path: str, *, trust_remote_code: bool = False):
    """``render(messages)`` with the target's own chat template (transformers tokenizer, ``trust_remote_code`` as
    SGLang serves it), or None where the directory holds no chat template at all (the callers report that).

    A template that is there but cannot be loaded or rendered is a :class:`LiveError` naming ``model_path``, never
    a silent fall-back to raw prompts: the acceptance measured on untemplated prompts is not the served one."""
    if not _may_have_chat_template(model_path):
        return None
    why = None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        if getattr(tok, "chat_template", None):
            tok.apply_chat_template(
                [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
            )
        else:
            why = "its tokenizer has no chat template"
    except Exception as e:  # a tokenizer class or a template raises anything (jinja errors, missing modules)
        why = f"{type(e).__name__}: {e}"
    if why:
        raise LiveError(
            f"{model_path}: the chat template cannot be rendered ({why}). Prompts are not sent untemplated: fix the "
            "model directory's tokenizer files (or trust_remote_code for a remote-code tokenizer)."
        )
    return lambda msgs: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
