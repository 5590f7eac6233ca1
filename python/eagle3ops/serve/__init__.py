"""The serve phase: the trained draft made servable and the servers run.

- :mod:`.options`: the phase's option definitions; :mod:`.commands`: ``eagle3ops serve-convert``, ``serve-process``;
- :mod:`.convert`: a speculators checkpoint -> the draft directory SGLang serves (per SGLang version);
- :mod:`.process`: a server as a detached process with its spec, health wait and stop (hosts without systemd).
"""
