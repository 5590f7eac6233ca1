"""Kept by name, do not move or rename: the SGLang ``deepseek_v2.py`` patched by ``eagle3ops sglang-patch`` says
``from eagle3ops.sglang_hook import active_hook`` (the import hunk of each version's patch in
:mod:`eagle3ops.sglang.versions`). That text is part of the patched file, whose sha256 every version's entry
records (``patched_sha256``), and files patched with it run on servers already: a new import path would change
every recorded sha256 and break those servers' SGLang at start. The hook itself is :mod:`eagle3ops.sglang.hook`."""

from eagle3ops.sglang.hook import active_hook

__all__ = ["active_hook"]
