"""Kept by name: torchrun runs ``python -m eagle3ops.speculators_shim`` (the train phase's command line, which its
liveness check matches, in runs and systemd units started before); the shim is
:mod:`eagle3ops.train.speculators_shim`."""

import sys

from eagle3ops.train.speculators_shim import main

if __name__ == "__main__":
    sys.exit(main())
