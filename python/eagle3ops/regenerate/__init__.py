"""The regenerate phase: every assistant turn of the training conversations rewritten by the target itself
(docs/regenerate.md).

- :mod:`.options`: the phase's option definitions; :mod:`.commands`: ``eagle3ops regenerate``;
- :mod:`.run`: the run (up-to-date check, resume, accounting, the atomic output); :mod:`.config`: its settings;
- :mod:`.turns`: which rows can be regenerated, one conversation turn by turn; :mod:`.workdir`: ``OUT.regenerate/``
  (meta, the append-only ``done.log``); :mod:`.backends`: transformers in process, or OpenAI-compatible servers;
- the inputs are read by :mod:`eagle3ops.conversations` (shared with prepare).
"""
