"""eagle3ops: the workload side of the EAGLE-3 pipeline (prepare, extract, train, ...).

All real logic lives here, importable and driven by the ``eagle3ops`` CLI; the Ansible modules in
``library/`` are thin wrappers that call ``eagle3ops <command> --json``.
"""

__version__ = "0.1.0"
