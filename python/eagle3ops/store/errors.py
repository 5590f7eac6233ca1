"""The store's errors: what the user must act on (the message says what to do)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """A problem with the store that the user must act on; the message says what to do."""


class DiskSpaceError(StoreError):
    """Not enough free space for what is left to write."""


class ModelChangedError(StoreError):
    """The target model differs from the one a store's hidden states came from."""
