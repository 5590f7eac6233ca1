"""``--smoke`` of bench/proof_of_value.py and bench/pov_equal.py: a CPU dry run of a run's control flow.

SGLang cannot run here: the stand-in server (tests/fixtures/sglang_standin_server.py) takes its place, and every
size is tiny (``SMOKE_SIZES``). SpecForge cannot train on a CPU: a copy of our draft is served in its place
(:func:`stand_in_specforge`), and the results say so. Nothing a smoke run measures is an acceptance figure.
"""

from __future__ import annotations

import os
import shlex
import shutil

import sglang_live as L

# a smoke run's sizes: every stage of the run on a CPU in minutes
SMOKE_SIZES = {"device": "cpu", "n_conv": 12, "max_length": 256, "total_seq_len": 512, "draft_vocab": 512,
               "mt_prompts": 4, "heldout_prompts": 3, "tokens": 16, "prepare_workers": 2, "stagger_s": 0.5,
               "kv_tokens": 4096}  # fmt: skip


def smoke(a, **own) -> None:
    """The stand-in server in SGLang's place, for this process and the CLI's children, and the tiny sizes
    (``SMOKE_SIZES``, then the caller's ``own``) set on the arguments ``a``."""
    L.SERVER_CMD = [L.PY, str(L.ROOT / "tests" / "fixtures" / "sglang_standin_server.py")]
    os.environ["LIVE_SERVER_CMD"] = shlex.join(L.SERVER_CMD)
    for k, v in {**SMOKE_SIZES, **own}.items():
        setattr(a, k, v)


def stand_in_specforge(r, ours: str, specforge: str) -> bool:
    """In a smoke run, a copy of the draft of ``ours`` (a key of the ``proof_of_value.Run`` ``r``'s drafts) is
    served as SpecForge's draft ``specforge``, and ``res/smoke_note.json`` says so. False if ``ours`` has none."""
    if ours not in r.drafts:
        return False
    dst = r.d / f"draft-{specforge}-standin"
    shutil.copytree(r.drafts[ours], dst, dirs_exist_ok=True)
    r.drafts[specforge] = dst
    note = f"not trained (CPU); a copy of the draft of {ours} stands in for the code paths"
    L.save("smoke_note", {**(L.SUMMARY.get("smoke_note") or {}), specforge: note})
    return True
