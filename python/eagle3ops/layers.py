"""Aux layer ids: the one home of eagle3ops' layer-id rule (stdlib only: the role's ``eagle3ops layer-ids``
call and the SGLang hook import it without torch).

Convention: input of layer ``i`` (SGLang, vLLM, speculators; ``hidden_states[i]`` of transformers'
``output_hidden_states``). SpecForge / ModelOpt ids name layer *outputs*: the output of layer ``i`` is the
input of layer ``i + 1`` (:func:`to_input`).

- :func:`default_ids`: EAGLE-3's low / mid / high capture points, ``[2, N//2, N-3]``;
- :func:`num_layers_of`: N from a model directory's ``config.json`` (``text_config`` first, as multimodal
  wrappers such as Kimi-K2.5 nest it);
- :func:`resolve`: the default or the given ids, converted to the input convention, in range, distinct;
- :func:`check_sglang`: what SGLang's ``set_eagle3_layers_to_capture`` accepts unchanged (0.5.17 and 0.5.23
  alike): distinct, ascending, the first not 1 (it adds 1 to every id then);
- :func:`capture_ids`: the ids to hand a model file's ``set_eagle3_layers_to_capture`` (the draft's
  ``eagle_config``) so that it captures given input-of-layer ids, per rule of
  :data:`eagle3ops.sglang.versions` ``layer_id_rules``.

Errors are :class:`LayerIdError` (a ``ValueError``) whose message names the ids and the fix; callers wrap it
in their own error type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from eagle3ops.errors import WithDetails

CONVENTIONS = ("input", "output")
MIN_LAYERS = 4  # EAGLE-3 needs low, mid and high states below the last layer
# [2, N//2, N-3] is distinct and ascending from 7 layers on
MIN_LAYERS_FOR_DEFAULT = 7
# what SGLang does with ids that start with 1 (read from set_eagle3_layers_to_capture of 0.5.17 and 0.5.23)
SGLANG_SHIFT = "SGLang's set_eagle3_layers_to_capture adds 1 to every id when the first is 1"


class LayerIdError(WithDetails, ValueError):
    """Aux layer ids that cannot be used; the message names them and says what to do."""


def default_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low / mid / high capture points, input-of-layer convention: ``[2, N//2, N-3]``."""
    n = int(num_layers)
    if n < MIN_LAYERS_FOR_DEFAULT:
        raise LayerIdError(
            f"the default aux layer ids [2, N//2, N-3] are {[2, n // 2, n - 3]} for a target with {n} layers, "
            f"not distinct and ascending (that needs {MIN_LAYERS_FOR_DEFAULT} layers or more); give the ids "
            f"explicitly (distinct, in 0..{n - 1})",
            num_layers=n,
        )
    return [2, n // 2, n - 3]


def text_config(cfg: dict) -> dict:
    """The language model's part of a ``config.json``: ``text_config`` when it is a dict, else the config."""
    sub = cfg.get("text_config")
    return sub if isinstance(sub, dict) else cfg


SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def special_token_ids(cfg: dict) -> dict:
    """The language model's special token ids of a ``config.json`` (``text_config`` first, then the top level), the
    ones it has: what a draft trained for it must say (speculators' draft decoder config carries Llama's)."""
    text = text_config(cfg)
    ids = {k: text.get(k, cfg.get(k)) for k in SPECIAL_TOKEN_IDS}
    return {k: v for k, v in ids.items() if v is not None}


def num_layers_of(model_dir: str | os.PathLike) -> int:
    """``num_hidden_layers`` of the model in ``model_dir`` (its ``config.json``, ``text_config`` first)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise LayerIdError(
            f"{path} does not exist: point the model path at a local model directory (its config.json gives the "
            "layer count)",
            path=str(path),
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LayerIdError(
            f"{path}: cannot be read as JSON ({e}); fix or replace the file", path=str(path)
        ) from e
    n = text_config(cfg).get("num_hidden_layers") if isinstance(cfg, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise LayerIdError(
            f"{path}: no usable num_hidden_layers ({n!r}) at the top level or in text_config; a decoder model's "
            "config.json has it - check the model path, or give the aux layer ids explicitly",
            path=str(path),
        )
    return n


def to_input(ids: Sequence[int], convention: str = "input") -> list[int]:
    """``ids`` in the input-of-layer convention: output-of-layer ids (SpecForge / ModelOpt) move up by one."""
    if convention not in CONVENTIONS:
        raise LayerIdError(f"layer id convention {convention!r}: use one of {CONVENTIONS}")
    shift = 1 if convention == "output" else 0
    return [int(i) + shift for i in ids]


def resolve(
    num_layers: int, ids: Sequence[int] | None = None, convention: str = "input", *, keep_order: bool = False
) -> list[int]:
    """The default (``ids`` None or empty) or the given ids, in the input convention, checked against a target
    of ``num_layers`` layers: in range, distinct. Sorted, unless ``keep_order`` (then they must come ascending,
    see :func:`check_sglang`)."""
    if convention not in CONVENTIONS:
        raise LayerIdError(f"layer id convention {convention!r}: use one of {CONVENTIONS}")
    n = int(num_layers)
    if n < MIN_LAYERS:
        raise LayerIdError(
            f"the target has {n} decoder layers; EAGLE-3 needs at least {MIN_LAYERS}", num_layers=n
        )
    given = [int(i) for i in ids] if ids else None
    out = default_ids(n) if given is None else to_input(given, convention)
    if any(not 0 <= i < n for i in out):
        default = default_ids(n) if n >= MIN_LAYERS_FOR_DEFAULT else "none"
        hint = (
            "If your ids come from SpecForge/ModelOpt, use the output convention (layer_convention: output)."
            if convention == "input"
            else f"An output-of-layer id i names input id i+1, so these must be in -1..{n - 2}."
        )
        raise LayerIdError(
            f"aux layer ids {given if given is not None else out} ({convention} convention) are out of range for "
            f"a target with {n} layers: input-of-layer ids must be in 0..{n - 1} (default {default}). {hint}",
            layer_ids=given,
            num_layers=n,
        )
    if len(set(out)) != len(out):
        raise LayerIdError(
            f"aux layer ids {out} must be distinct (speculators refuses duplicates); drop the repeated ones",
            layer_ids=out,
        )
    return out if keep_order else sorted(out)


def check_ascending(ids: Sequence[int]) -> list[int]:
    """``ids`` when they are distinct and ascending (SGLang packs the aux states in layer order)."""
    out = [int(i) for i in ids]
    if out != sorted(set(out)):
        raise LayerIdError(
            f"aux layer ids {out}: ids must be distinct and ascending (SGLang packs the aux states in layer "
            f"order); give them as {sorted(set(out))}",
            layer_ids=out,
        )
    return out


def check_sglang(ids: Sequence[int]) -> list[int]:
    """``ids`` (input convention) when SGLang's ``set_eagle3_layers_to_capture`` captures them unchanged:
    distinct, ascending, and the first is not 1."""
    out = check_ascending(ids)
    if not out:
        raise LayerIdError(
            "no aux layer ids: give at least one (or none at all for the default)", layer_ids=out
        )
    if out[0] == 1:
        raise LayerIdError(
            f"aux layer ids {out}: the first may not be 1 ({SGLANG_SHIFT}, in 0.5.17 and 0.5.23 alike, so it "
            "would capture other layers than these input-of-layer ids); start at 0 or at 2 or more",
            layer_ids=out,
        )
    return out


def capture_ids(ids: Sequence[int], rule: str) -> list[int]:
    """The ids a model file's ``set_eagle3_layers_to_capture`` must be given so that it captures the inputs of
    layers ``ids``, for its ``rule`` (:data:`eagle3ops.sglang.versions._LAYER_ID_RULES`):

    - ``as_is_unless_first_is_1``: it captures ``ids`` as given, unless the first is 1;
    - ``plus_one``: it captures the output of layer ``id`` (the input of ``id + 1``), so each id moves down one.
    """
    out = [int(i) for i in ids]
    if rule == "plus_one":
        if out and min(out) < 1:
            raise LayerIdError(
                f"layer id 0 (the embeddings) cannot be captured by a model file that captures the output of "
                f"layer id (input of id+1); use ids >= 1 (ids {out})",
                layer_ids=out,
            )
        return [i - 1 for i in out]
    if rule == "as_is_unless_first_is_1":
        if out and out[0] == 1:
            raise LayerIdError(
                f"the model file shifts ids that start with 1 by +1 ({SGLANG_SHIFT}), so the input of layers "
                f"{out} cannot be captured as such; use a first id != 1",
                layer_ids=out,
            )
        return out
    raise LayerIdError(f"unknown SGLang layer-id rule {rule!r}: use 'plus_one' or 'as_is_unless_first_is_1'")
