"""Rendering conversations into training rows with speculators' own code (pinned to 0.9.0): its boundary rows
per assistant turn through a local stand-in of its ``/render`` call (the target's chat template and tokenizer),
and the read-check-render loop over every source."""

from __future__ import annotations

import contextlib
import time
from unittest import mock

from eagle3ops.conversations import Problem, check_record, iter_records, role_of
from eagle3ops.prepare.errors import PrepareError
from eagle3ops.speculators_pin import PINNED, installed_version

SPECULATORS_VERSION = PINNED  # the release whose preprocessing this calls


# ---------------------------------------------------------------------------------------------------
# speculators
# ---------------------------------------------------------------------------------------------------
def speculators_preprocessing():
    """speculators' preprocessing module, after checking that it is the pinned version."""
    version = installed_version()
    if version is None:
        raise PrepareError(
            f"speculators is not installed; prepare uses its {SPECULATORS_VERSION} data preparation. "
            "Install it: pip install --no-deps -r requirements/speculators.txt"
        )
    if version != SPECULATORS_VERSION:
        raise PrepareError(
            f"speculators {version} is installed but eagle3ops prepare is pinned to speculators "
            f"{SPECULATORS_VERSION} (it calls _render_boundary_rows, _normalize_conversation and "
            "build_speculator_training_dataset of that release). Install speculators=="
            f"{SPECULATORS_VERSION} (requirements/speculators.txt), or update eagle3ops/prepare/render.py and its "
            "tests to the new release's preprocessing before changing the pin."
        )
    from speculators.data_generation import preprocessing

    return preprocessing


def _local_encode_render(tokenizer):
    """A stand-in for speculators' ``_encode_render`` that renders with the local tokenizer.

    vLLM's ``/render`` applies the chat template, tokenizes without adding special tokens and truncates
    on the right to ``truncate_prompt_tokens``; this does the same.
    """

    def encode_render(conv_prefix, render_endpoint, *, add_generation_prompt, max_length, tools=None):
        text = tokenizer.apply_chat_template(
            conv_prefix, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return tokenizer.encode(text, add_special_tokens=False)[:max_length]

    return encode_render


@contextlib.contextmanager
def local_render(pp, tokenizer):
    """Point speculators' renderer at the local tokenizer for the duration of the block."""
    with mock.patch.object(pp, "_encode_render", _local_encode_render(tokenizer)):
        yield


def render_rows(pp, conv: list[dict], tools: object, max_length: int) -> list[dict]:
    """speculators' boundary rows of one conversation (call inside ``local_render``)."""
    normalized = pp._normalize_conversation(conv)
    parsed_tools = pp._parse_conv_tools(tools, 0)
    return pp._render_boundary_rows(normalized, "local", max_length, tools=parsed_tools)


def collect(pp, tokenizer, sources, max_length, log, progress):
    """Read, check and render every record. Returns (groups, problems, dropped, n_records)."""
    from speculators.data_generation.preprocessing import BoundaryUnstableError

    groups: list[list[tuple[list[int], list[int]]]] = []
    problems: list[Problem] = []
    dropped = {"turns_context_over_max_length": 0, "rows_unsupervised_after_truncation": 0}
    n_records = 0
    bar = _progress(progress)
    with local_render(pp, tokenizer), bar as advance:
        for source in sources:
            log(f"prepare: reading {source.path}")
            for loc, rec in iter_records(source):
                n_records += 1
                advance()
                if isinstance(rec, Problem):
                    problems.append(rec)
                    continue
                checked = check_record(rec)
                if isinstance(checked, str):
                    problems.append(Problem(loc, checked))
                    continue
                kind, payload = checked
                if kind == "rows":
                    ids, mask = payload
                    if sum(mask[:max_length]) == 0:
                        dropped["rows_unsupervised_after_truncation"] += 1
                        continue
                    groups.append([_compact(ids[:max_length], mask[:max_length])])
                    continue
                n_asst = sum(
                    1 for j, t in enumerate(payload) if j > 0 and role_of(t) not in ("user", "system", "tool")
                )
                try:
                    rows = render_rows(pp, payload, rec.get("tools"), max_length)
                except BoundaryUnstableError as e:
                    problems.append(Problem(loc, f"the chat template is not prefix-stable here: {e}"))
                    continue
                except Exception as e:  # templates raise anything (jinja errors, raise_exception)
                    problems.append(Problem(loc, f"the chat template failed: {type(e).__name__}: {e}"))
                    continue
                dropped["turns_context_over_max_length"] += n_asst - len(rows)
                kept = []
                for r in rows:
                    if sum(r["loss_mask"][:max_length]) == 0:
                        dropped["rows_unsupervised_after_truncation"] += 1
                        continue
                    kept.append(_compact(r["input_ids"][:max_length], r["loss_mask"][:max_length]))
                if kept:
                    groups.append(kept)
    return groups, problems, dropped, n_records


def _compact(ids: list[int], mask: list[int]):
    """A row as numpy arrays (12 bytes a token instead of ~44 as Python ints; the seed had 88M tokens).

    The dtypes are the ones the saved dataset has anyway (``datasets`` stores ``input_ids`` as int32,
    speculators writes ``loss_mask`` as int64), so the Arrow output is the same as from Python lists.
    """
    import numpy as np

    wide = max(ids, default=0) >= 2**31
    return np.asarray(ids, dtype=np.int64 if wide else np.int32), np.asarray(mask, dtype=np.int64)


@contextlib.contextmanager
def _progress(enabled: bool):
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("prepare: rendering"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("render", total=None, rate="")
        t0 = time.monotonic()
        n = [0]

        def advance():
            n[0] += 1
            if n[0] % 50 == 0:
                rate = n[0] / max(1e-9, time.monotonic() - t0)
                bar.update(task, completed=n[0], rate=f"{rate:.0f} rows/s")

        yield advance
        bar.update(task, completed=n[0])
