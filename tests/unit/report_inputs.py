"""Inputs of ``eagle3ops benchmark-report`` written by hand, for the tests of the report."""

from __future__ import annotations


def acceptance_result(
    acceptance_length: float, per_position: list[float], conditional: list[float], prompts_file: str = "p"
) -> dict:
    """An offline acceptance result as ``eagle3ops benchmark-acceptance`` writes it: a k=3 draft measured on 2
    prompts (10 verify steps, at most 4 tokens accepted per step), its figures given."""
    return {
        "checkpoint": "c",
        "target": "t",
        "prompts_file": prompts_file,
        "layer_ids": [2, 4, 5],
        "draft": {
            "k": 3,
            "prompts": 2,
            "verify_steps": 10,
            "acceptance_length": acceptance_length,
            "max_acceptance_length": 4,
            "per_position": per_position,
            "per_position_conditional": conditional,
        },
    }
