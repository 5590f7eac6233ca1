"""The benchmark phase: how well the trained draft works, offline and on the live server, and the report.

- :mod:`.options`: the phase's option definitions (one ``eagle3ops benchmark-*`` command each, one module);
  :mod:`.commands`: the sub-commands; :mod:`.uptodate`: when a result is up to date, how it is written;
- :mod:`.acceptance`: offline acceptance (transformers target, speculators draft, greedy chain);
- :mod:`.loadgen`: load on a live SGLang server, the speculative-decoding probe and its guard;
- :mod:`.promptsets`: benchmark prompt sets and the contamination check against the training data;
- :mod:`.lossless`: the speculative server's greedy output ids against the plain server's (first divergence, gap);
- :mod:`.curve`: the batch curve, its crossover and the setting to serve per concurrency;
- :mod:`.report`: the report (JSON, Markdown, plot); :mod:`.report_sections`: its curve, per-category and
  lossless sections.
"""
