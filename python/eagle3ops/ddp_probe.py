"""Kept by name: torchrun runs ``python -m eagle3ops.ddp_probe`` (the train phase's command line with ``trainer:
ddp_probe``, which its liveness check matches); the probe is :mod:`eagle3ops.train.ddp_probe`."""

import sys

from eagle3ops.train.ddp_probe import main

if __name__ == "__main__":
    sys.exit(main())
