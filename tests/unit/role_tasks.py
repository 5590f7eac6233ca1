"""What the role tests walk: every task of a role's tasks or handlers file."""

from __future__ import annotations


def each_task(node):
    """Every task mapping in a tasks/handlers file's YAML (``None`` for an empty file), the tasks of its blocks
    (block/rescue/always) included, each block before the tasks inside it."""
    if isinstance(node, list):
        for item in node:
            yield from each_task(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always"):
            if key in node:
                yield from each_task(node[key])
