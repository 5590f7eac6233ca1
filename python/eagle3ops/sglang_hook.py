"""Kept at this import path because the SGLang ``deepseek_v2.py`` that ``eagle3ops sglang-patch`` writes says
``from eagle3ops.sglang_hook import active_hook``, and that text is part of the file whose sha256 each version's
``patched_sha256`` in :mod:`eagle3ops.sglang.versions` records; the hook itself is :mod:`eagle3ops.sglang.hook`."""

from eagle3ops.sglang.hook import active_hook

__all__ = ["active_hook"]
