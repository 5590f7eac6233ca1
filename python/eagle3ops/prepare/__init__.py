"""The prepare phase: conversations -> the offline training rows of speculators 0.9.0 in a data directory.

- :mod:`.options`: the phase's option definitions; :mod:`.commands`: ``eagle3ops prepare``;
- :mod:`.dataset`: the data directory (fingerprint, up-to-date check, build in a temp dir, swap into place,
  repair in place); :mod:`.render`: speculators' rendering with the local tokenizer, the read-check-render loop;
- the inputs are read by :mod:`eagle3ops.conversations` (shared with regenerate); the names in the data
  directory are :mod:`eagle3ops.store.layout`'s.
"""
