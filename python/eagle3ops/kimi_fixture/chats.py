"""Seeded conversations for the fixture, in the OpenAI messages shape with what Kimi-K2.5's template renders:
assistant ``reasoning_content`` (thinking), ``tool_calls`` and ``tool`` results, and contractions in the text
(where the remote-code and native tokenizers disagree). Standard library only."""

from __future__ import annotations

import json
import random

CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Perth", "Dakar"]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _arith(rng: random.Random) -> list[dict]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return [
        {"role": "user", "content": f"What's {a} plus {b}? Don't explain too much."},
        {
            "role": "assistant",
            "reasoning_content": f"The user wants {a} + {b}. That's {a + b}. We'll answer briefly.",
            "content": f"It's {a + b}.",
        },
    ]


def _followup(rng: random.Random) -> list[dict]:
    a, b, c = rng.randint(2, 50), rng.randint(2, 50), rng.randint(2, 9)
    first = _arith(random.Random(rng.random()))
    return [
        {"role": "system", "content": "You're a careful assistant. Keep answers short."},
        {"role": "user", "content": f"I'm counting: {a} times {c}?"},
        {"role": "assistant", "reasoning_content": f"{a} * {c} = {a * c}.", "content": f"That's {a * c}."},
        {"role": "user", "content": f"And if we'll add {b}?"},
        {
            "role": "assistant",
            "reasoning_content": f"Previous result {a * c}, plus {b} gives {a * c + b}.",
            "content": f"Then it's {a * c + b}; I've added {b}.",
        },
        *first,
    ]


def _weather(rng: random.Random) -> tuple[list[dict], list[dict]]:
    city = rng.choice(CITIES)
    temp = rng.randint(-5, 35)
    call_id = "functions.get_weather:0"
    args = json.dumps({"city": city, "unit": "celsius"})
    return [
        {"role": "user", "content": f"What's the weather in {city}? I don't know the unit, use celsius."},
        {
            "role": "assistant",
            "reasoning_content": f"I'll call get_weather for {city} in celsius.",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"city": city, "temperature": temp})},
        {
            "role": "assistant",
            "reasoning_content": f"The tool says {temp} degrees. That's the answer.",
            "content": f"It's {temp} degrees celsius in {city} right now.",
        },
    ], [WEATHER_TOOL]


def conversations(num: int, seed: int) -> list[dict]:
    """``num`` records ``{"messages": [...], "tools": [...]}`` (tools only where a tool is called)."""
    rng = random.Random(seed)
    out = []
    for i in range(num):
        kind = i % 3
        if kind == 0:
            out.append({"messages": _arith(rng)})
        elif kind == 1:
            out.append({"messages": _followup(rng)})
        else:
            messages, tools = _weather(rng)
            out.append({"messages": messages, "tools": tools})
    return out


def heldout(num: int, seed: int) -> list[dict]:
    """Prompts for the benchmark: one user turn each, none of them in :func:`conversations`' output."""
    rng = random.Random(seed + 7919)
    return [
        {
            "messages": [
                {"role": "user", "content": f"What's {rng.randint(100, 999)} minus {rng.randint(2, 99)}?"}
            ]
        }
        for _ in range(num)
    ]
