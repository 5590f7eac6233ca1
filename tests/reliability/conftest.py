"""Fixtures of the fault-injection suite (issue #10); they live in rel_common.py, which the tests import by
that unique name (several conftest.py files exist under tests/, so ``from conftest import`` is ambiguous)."""

from rel_common import demo, figures, prepared, reference, small_fs, tiny_model, zygote  # noqa: F401
