"""The two ways to get the target's answers: :class:`TransformersBackend` (the model in this process, left-padded
batches, a slot freed by a finished conversation takes the next one) and :class:`OpenAIBackend` (an
OpenAI-compatible server or several, a thread pool, retries with backoff and jitter)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from eagle3ops.conversations import InputError, load_tokenizer
from eagle3ops.http_retry import RETRY_STATUS
from eagle3ops.regenerate.config import RegenerateConfig, RegenerateError
from eagle3ops.regenerate.turns import Answer, Item, TurnError, conversation_steps


# ---------------------------------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------------------------------
class TransformersBackend:
    """The target in this process: left-padded batches, greedy (or sampled with temperature/top_p)."""

    def __init__(self, cfg: RegenerateConfig):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.cfg = cfg
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        try:
            self.tok = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
        except InputError as e:
            raise RegenerateError(str(e)) from e
        self.tok.padding_side = "left"
        device = cfg.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = cfg.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                cfg.model, dtype=getattr(torch, dtype), trust_remote_code=cfg.trust_remote_code
            ).to(device)
        except Exception as e:
            raise RegenerateError(
                f"{cfg.model}: cannot load the target with transformers ({type(e).__name__}: {e}). Point --model at "
                "a local model directory, or use --backend openai with a server that serves it."
            ) from e
        self.model.eval()
        self.device = device
        self.torch = torch
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tok.eos_token_id is not None and self.tok.eos_token_id not in eos:
            eos.append(self.tok.eos_token_id)
        self.eos = set(eos)
        self.pad = self.tok.pad_token_id
        self.max_pos = getattr(self.model.config, "max_position_embeddings", None)
        sample = cfg.temperature > 0
        kw = {"temperature": cfg.temperature, "top_p": cfg.top_p} if sample else {}
        self.gen_config = GenerationConfig(
            max_new_tokens=cfg.max_new_tokens,
            do_sample=sample,
            eos_token_id=eos,
            pad_token_id=self.pad,
            **kw,
        )
        if sample:
            torch.manual_seed(cfg.seed)

    def encode(self, messages: list[dict]) -> list[int]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok.encode(text, add_special_tokens=False)

    def generate(self, prompts: list[list[int]]) -> list[Answer]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=self.gen_config,
            )
        answers = []
        for row in out[:, width:].tolist():
            taken, finish = [], "length"
            for t in row:
                if t in self.eos:
                    finish = "stop"
                    break
                taken.append(t)
            n = len(taken) + (finish == "stop")
            answers.append(Answer(self.tok.decode(taken, skip_special_tokens=False), None, n, finish))
        return answers


class _HTTPError(Exception):
    def __init__(self, reason: str, retryable: bool):
        super().__init__(reason)
        self.retryable = retryable


class OpenAIBackend:
    """``/v1/chat/completions`` on one or more servers; one keep-alive connection per thread and server."""

    def __init__(self, cfg: RegenerateConfig):
        self.cfg = cfg
        self.urls = [u.rstrip("/") for u in cfg.urls]
        if not self.urls:
            raise RegenerateError("the openai backend needs at least one --url (e.g. http://127.0.0.1:30000)")
        for u in self.urls:
            parsed = urllib.parse.urlsplit(u)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise RegenerateError(f"--url {u!r} is not an http(s) URL like http://127.0.0.1:30000")
        self._local = threading.local()
        self.served = {}

    def _conn(self, url: str) -> http.client.HTTPConnection:
        conns = self._local.__dict__.setdefault("conns", {})
        c = conns.get(url)
        if c is None:
            p = urllib.parse.urlsplit(url)
            cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
            c = conns[url] = cls(p.hostname, p.port, timeout=self.cfg.request_timeout)
        return c

    def _drop(self, url: str) -> None:
        c = self._local.__dict__.get("conns", {}).pop(url, None)
        if c is not None:
            c.close()

    def request(self, url: str, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        base = urllib.parse.urlsplit(url).path.rstrip("/")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        c = self._conn(url)
        try:
            c.request(method, base + path, body=data, headers=headers)
            r = c.getresponse()
            payload = r.read()
        except Exception:
            self._drop(url)
            raise
        if r.will_close:
            self._drop(url)
        return r.status, payload

    def check_servers(self) -> None:
        """Every server answers GET /v1/models (waiting up to ``health_timeout`` for one still loading)."""
        for url in self.urls:
            t0 = time.monotonic()
            while True:
                try:
                    code, body = self.request(url, "GET", "/v1/models", None)
                    if code == 200:
                        try:
                            self.served[url] = [m.get("id") for m in json.loads(body).get("data", [])]
                        except (ValueError, AttributeError):
                            self.served[url] = []
                        break
                    last = f"HTTP {code} {body[:200]!r}"
                except (OSError, http.client.HTTPException) as e:
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() - t0 > self.cfg.health_timeout:
                    raise RegenerateError(
                        f"the server at {url} does not answer GET /v1/models within {self.cfg.health_timeout:.0f} s "
                        f"(last: {last}). Start it (the sglang phase's unit, or sglang.launch_server), fix --url, "
                        "or raise the wait (regenerate_health_timeout)."
                    )
                time.sleep(0.5)

    def answer(self, url: str, messages: list[dict], turn: int) -> Answer:
        cfg = self.cfg
        body = {
            "model": cfg.served_model or cfg.model,
            "messages": messages,
            "max_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "stream": False,
        }
        if cfg.temperature > 0:
            body["seed"] = cfg.seed
        last = ""
        for attempt in range(cfg.retries + 1):
            if attempt:
                cfg.sleep(cfg.retry_delay(attempt))
            try:
                code, payload = self.request(url, "POST", "/v1/chat/completions", body)
            except TimeoutError:
                last = f"no answer within {cfg.request_timeout:g} s (request timeout)"
                continue
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if code == 200:
                try:
                    d = json.loads(payload)
                    choice = d["choices"][0]
                    msg = choice["message"]
                    text = msg.get("content") or ""
                    tokens = int((d.get("usage") or {}).get("completion_tokens") or 0)
                    finish = "length" if choice.get("finish_reason") == "length" else "stop"
                    return Answer(text, msg.get("reasoning_content"), tokens, finish)
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise _HTTPError(
                        f"turn {turn}: {url} answered 200 without a chat completion ({e})", False
                    ) from e
            last = f"HTTP {code}: {payload[:300].decode('utf-8', 'replace')}"
            if code not in RETRY_STATUS:
                raise _HTTPError(f"turn {turn}: {url} refused the request ({last})", False)
        raise _HTTPError(f"turn {turn}: {url} failed {cfg.retries + 1} attempts (last: {last})", True)


# ---------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------
@dataclass
class Done:
    item: Item
    record: dict | None = None
    tokens: int = 0
    turns: int = 0
    truncated: int = 0
    error: str | None = None
    retryable: bool = False


def run_transformers(cfg: RegenerateConfig, items: list[Item], emit: Callable[[Done], None], stop) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        _transformers_loop(cfg, TransformersBackend(cfg), items, emit, stop)
    finally:
        torch.set_num_threads(threads)  # --threads is this run's, not the calling process's


def _transformers_loop(
    cfg: RegenerateConfig, be, items: list[Item], emit: Callable[[Done], None], stop
) -> None:
    queue = iter(items)
    active: list[tuple[Item, object, list[int]]] = []  # (item, generator, the pending prompt's token ids)

    def start(item: Item, gen, value) -> None:
        try:
            k, msgs = next(gen) if value is None else gen.send(value)
        except StopIteration as fin:
            rec, tokens, truncated, turns = fin.value
            emit(Done(item, rec, tokens, turns, truncated))
            return
        except TurnError as e:
            emit(Done(item, error=str(e)))
            return
        try:
            ids = be.encode(msgs)
        except Exception as e:  # templates raise anything (jinja errors, raise_exception)
            gen.close()
            emit(Done(item, error=f"turn {k}: the chat template failed: {type(e).__name__}: {e}"))
            return
        if be.max_pos and len(ids) + cfg.max_new_tokens > be.max_pos:
            gen.close()
            emit(
                Done(
                    item,
                    error=f"turn {k}: the prompt has {len(ids)} tokens; with max_new_tokens {cfg.max_new_tokens} "
                    f"that is over the target's max_position_embeddings {be.max_pos}",
                )
            )
            return
        active.append((item, gen, ids))

    def refill() -> None:
        while len(active) < cfg.concurrency and not stop():
            item = next(queue, None)
            if item is None:
                return
            start(item, conversation_steps(item, cfg), None)

    refill()
    while active:
        batch = list(active)
        active.clear()
        answers = be.generate([ids for _, _, ids in batch])
        for (item, gen, _), ans in zip(batch, answers, strict=True):
            start(item, gen, ans)
        refill()


def run_openai(cfg: RegenerateConfig, items: list[Item], emit: Callable[[Done], None], stop) -> dict:
    be = OpenAIBackend(cfg)
    be.check_servers()

    def one(n: int, item: Item) -> Done:
        url = be.urls[n % len(be.urls)]
        gen = conversation_steps(item, cfg)
        value = None
        try:
            while True:
                if stop():
                    gen.close()
                    return Done(item, error="run stopped", retryable=True)
                k, msgs = next(gen) if value is None else gen.send(value)
                try:
                    value = be.answer(url, msgs, k)
                except _HTTPError as e:
                    gen.close()
                    return Done(item, error=str(e), retryable=e.retryable)
        except StopIteration as fin:
            rec, tokens, truncated, turns = fin.value
            return Done(item, rec, tokens, turns, truncated)
        except TurnError as e:
            return Done(item, error=str(e))

    with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="regenerate") as pool:
        it = iter(enumerate(items))
        pending = set()
        while True:
            while len(pending) < cfg.concurrency and not stop():
                nxt = next(it, None)
                if nxt is None:
                    break
                pending.add(pool.submit(one, *nxt))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                emit(f.result())
    return {"servers": be.served}
