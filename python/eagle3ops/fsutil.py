"""Kept for the callers not yet switched (prepare.py): the directory swap lives in :mod:`eagle3ops.durable`."""

from eagle3ops.durable import fsync_tree, swap_dir_into_place

__all__ = ["fsync_tree", "swap_dir_into_place"]
