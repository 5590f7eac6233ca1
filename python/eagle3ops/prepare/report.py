"""The prepare role's report line (roles/prepare/tasks/main.yml, printed by action_plugins/eagle3ops_report.py):
what the run did to the data directory, or in check mode what it would do. Standard library only: the
controller imports it."""

from __future__ import annotations


def line(result: dict, check_mode: bool, output_dir: str) -> str:
    """``result``: the eagle3ops_prepare module's return; ``output_dir``: the data directory."""
    has_summary = "summary" in result
    if check_mode:
        state = "would be written" if result.get("changed") else "is up to date"
        return f"check mode: {output_dir} {state}" + (f" ({result['summary']})" if has_summary else "")
    done = result["summary"] if has_summary else f"{result.get('num_rows', '?')} rows"
    return f"prepared {done} -> {output_dir}" + ("" if result.get("changed") else " (unchanged)")
