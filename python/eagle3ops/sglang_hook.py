"""Kept by name: SGLang model files patched by ``eagle3ops sglang-patch`` import ``eagle3ops.sglang_hook``
(:mod:`eagle3ops.extract.sglang_patch`'s text, byte-exact, applied on servers already); the hook itself is
:mod:`eagle3ops.extract.sglang_hook`."""

from eagle3ops.extract.sglang_hook import active_hook

__all__ = ["active_hook"]
