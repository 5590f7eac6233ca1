"""Which state the capture patch should be in when sglang_capture_patch_state is ``auto`` (roles/sglang/tasks/
patch_state.yml, through action_plugins/eagle3ops_report.py): present while this host has rows left for SGLang to
extract, else query (left as it is), and the reason in words. Standard library only: the controller imports it."""

from __future__ import annotations


def auto(
    prepared: bool, takes_over: bool, plan: dict | None, data_dir: str, reassign_from: list | None = None
) -> dict:
    """``prepared``: the data directory holds a prepared dataset; ``takes_over``: rows of lost hosts were
    re-assigned to this host and its store does not hold them yet; ``plan``: the extraction plan of this host's
    share (to_extract, total). Returns ``state`` and ``reason``."""
    plan = plan or {}
    left = int(plan.get("to_extract") or 0)
    if not prepared:
        reason = f"{data_dir} is not prepared yet: every row is left"
    elif takes_over:
        reason = (
            f"the rows of {', '.join(str(h) for h in reassign_from or [])} are re-assigned to the other hosts "
            "(eagle3ops_extract_reassign_from) and this host's store does not hold its part of them yet"
        )
    elif left > 0:
        reason = f"{left} of {plan.get('total')} rows are left to extract through SGLang"
    else:
        return {
            "state": "query",
            "reason": f"all {plan.get('total')} rows are extracted: nothing for the patch to do",
        }
    return {"state": "present", "reason": reason}
