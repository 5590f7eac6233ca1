"""SGLang in eagle3ops, in one package: the versions it supports and everything that differs between them, the
hidden-state capture patch of SGLang's model file, the hook the patched file calls inside the server, the
extraction client that drives such servers, and their ``eagle3ops`` sub-commands.

- :mod:`.versions`: the version table (:data:`~.versions.VERSIONS`, one entry per version: its capture patch
  with hunks and sha256, the capture-only flag, the layer-id rules); standard library only, shipped to targets as
  module_utils/eagle3ops_sglang_versions.py for the option definitions; extract's and serve's code read it;
- :mod:`.patch`: apply / restore (byte-exact) / status of the patch (the sglang phase; ``eagle3ops
  sglang-patch``, module ``eagle3ops_sglang_patch``);
- :mod:`.hook`: runs inside the patched server and writes the store (the extract phase's SGLang backend; the
  patched file imports it as ``eagle3ops.sglang_hook``, a thin module kept by name: see there why);
- :mod:`.client`: sends the rows to the servers, confirms every file, restores the patch (``eagle3ops
  extract-sglang``, module ``eagle3ops_extract_sglang``);
- :mod:`.commands`: ``sglang-patch`` and ``extract-sglang`` (their option definitions are the extract phase's,
  :mod:`eagle3ops.extract.options`, with the module and role variables they feed).

The SGLang backend shares the extraction session with the transformers backend (:mod:`eagle3ops.extract`: the
plan, shards, the writer step and pinned-buffer pool, status and the run log): those edges are declared in
tests/unit/test_imports.py.
"""
