"""Shared by tests/unit/regenerate/: the regenerate phase's test inputs (conversations in both schemas,
written as JSONL), its config against the stand-in OpenAI server, and what the stand-in's target makes of a
conversation (every assistant turn answered from the regenerated history)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from eagle3ops.regenerate.config import RegenerateConfig
from eagle3ops.regenerate.turns import strip_think
from openai_standin import StandinServer, answer_for  # noqa: F401 - StandinServer: the server fixture (conftest.py)

# the two schemas of the inputs: the role key, the text key, the system/user/assistant role names, and how a
# question and an old answer start
_SCHEMAS = {
    "sharegpt": ("from", "value", ("system", "human", "gpt"), "question", "old answer"),
    "messages": ("role", "content", ("system", "user", "assistant"), "ask", "old"),
}


def _turns(schema: str, i: int, turns: int, system: bool) -> list[dict]:
    """Conversation ``i``'s turns in ``schema``: a system prompt if asked, then ``turns`` question/answer pairs."""
    role, text, (system_role, user, assistant), ask, old = _SCHEMAS[schema]
    out = [{role: system_role, text: f"system prompt {i}"}] if system else []
    for t in range(turns):
        out += [{role: user, text: f"{ask} {i}.{t}"}, {role: assistant, text: f"{old} {i}.{t}"}]
    return out


def _sharegpt(i: int, turns: int = 2, system: bool = False) -> dict:
    return {"id": f"sg{i}", "conversations": _turns("sharegpt", i, turns, system)}


def _messages(i: int, turns: int = 2, system: bool = False) -> dict:
    return {"id": f"m{i}", "messages": _turns("messages", i, turns, system), "meta": {"keep": i}}


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _cfg(server, inputs, out, **kw) -> RegenerateConfig:
    kw.setdefault("backoff", 0.001)
    kw.setdefault("log", lambda m: None)
    return RegenerateConfig(
        model="standin-model",
        inputs=[str(p) for p in inputs],
        out=str(out),
        backend="openai",
        urls=[server.url],
        **kw,
    )


def _norm(t: dict) -> str:
    r = t.get("from", t.get("role"))
    return {"human": "user", "gpt": "assistant"}.get(r, r)


def _expected(
    rec: dict,
    key: str,
    *,
    think: bool = False,
    strip: bool = False,
    drop_system: bool = False,
    suffix: str = "",
) -> dict:
    """What the stand-in's target makes of ``rec``: every assistant turn answered from the regenerated history."""
    out, history = [], []
    for t in rec[key]:
        role = _norm(t)
        text = t.get("value", t.get("content"))
        if role == "system" and drop_system:
            continue
        if role == "assistant":
            ans = answer_for(history, think) + suffix
            text = strip_think(ans) if strip else ans
            t = {**t, ("value" if "value" in t else "content"): text}
        out.append(t)
        history.append({"role": role, "content": text})
    return {**rec, key: out}
