"""The extract phase: one extraction session with two backends, writing the hidden states of the prepared rows
into the data directory's store (:mod:`eagle3ops.store`).

- :mod:`.options`: the phase's option definitions (CLI, module parameters, role variables);
- :mod:`.commands`, :mod:`.verify`: the ``eagle3ops`` sub-commands;
- :mod:`.session`: what both backends share: settings, the target's facts and the store's meta, the plan (check
  mode), the one-time repair, progress; :mod:`.shards`: which rows a worker or a host takes;
  :mod:`.status`: where a store (or several hosts' stores) stands;
- :mod:`.writer`: the writer step and threads and the pinned-buffer pool, shared by both backends;
- :mod:`.transformers_backend`: the forward pass with capture hooks (CPU or CUDA); :mod:`.workers`: one process
  per GPU, one host's share of several;
- the SGLang backend is its own package, :mod:`eagle3ops.sglang` (the client that drives the server, the hook
  that runs inside it, the patch that puts the hook into SGLang's model file, the version table); it uses the
  session, shards, writer and status modules here.
"""
