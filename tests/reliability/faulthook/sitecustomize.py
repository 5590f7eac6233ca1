"""Test-only: with this directory on PYTHONPATH, ``$E3_FAULT`` injects a fault into any eagle3ops process
(see faults.py). Not shipped; eagle3ops has no hooks of its own."""

import os

if os.environ.get("E3_FAULT"):
    import faults

    faults.install(os.environ["E3_FAULT"])
