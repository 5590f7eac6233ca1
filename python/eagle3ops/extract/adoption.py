"""The extract phase's adoption of an existing dump (``adopt_from``): surveyed before the store is touched (every
refusal first, nothing written), recorded once the store's meta is in place, so that the plan that follows counts
the adopted rows done and extracts only the rest (:mod:`eagle3ops.store.adopt`)."""

from __future__ import annotations

from eagle3ops.extract.errors import ExtractError
from eagle3ops.store.adopt import Survey, commit, survey
from eagle3ops.store.dump import AdoptError


def survey_dump(cfg, layer_ids: list[int], hidden_size: int, *, content: bool = True) -> Survey | None:
    """The survey of ``cfg.adopt_from`` (None when not asked); a bad dump is refused as an ExtractError.
    ``content=False`` (a check-mode plan): metadata only, whatever ``adopt_checksum`` says (the run reads the
    bytes; a plan of a 2.3 TB dump must not)."""
    if not getattr(cfg, "adopt_from", None):
        return None
    ranks = getattr(cfg, "ranks", None) or []
    if ranks and cfg.world_size > len(ranks):
        raise ExtractError(
            f"adopt_from {cfg.adopt_from}: this host's store covers ranks {list(ranks)} of {cfg.world_size}; a "
            "dump's rows belong to every host's share, so one host's store cannot take it (the others would "
            "extract those rows again); adopting into a multi-host extraction is not supported: extract on one "
            "host with adopt_from"
        )
    try:
        return survey(
            cfg.data_dir,
            cfg.adopt_from,
            run_layer_ids=layer_ids,
            hidden_size=hidden_size,
            checksum=cfg.adopt_checksum and content,
            spec_kw={
                "layer_ids": cfg.adopt_layer_ids,
                "convention": cfg.adopt_layer_convention,
                "last_state": cfg.adopt_last_state,
                "keys": cfg.adopt_keys,
            },
        )
    except AdoptError as e:
        raise ExtractError(str(e)) from None


def commit_dump(s: Survey | None) -> dict:
    """Record a survey; the run's result fields (``dump``: what was adopted and what was left for extraction)."""
    if s is None:
        return {}
    try:
        return {"dump": commit(s)}
    except AdoptError as e:
        raise ExtractError(str(e)) from None


def predicted(s: Survey | None, remaining) -> dict:
    """Check mode: what a run would adopt, and the rows it would then not extract."""
    if s is None:
        return {}
    res = s.result(changed=True)
    return {"dump": res, "dump_rows": len(set(s.rows) & set(remaining))}
