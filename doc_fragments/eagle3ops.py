# Shared option documentation of the modules in library/ (ansible.cfg: doc_fragment_plugins = doc_fragments).
# A module takes one with ``extends_documentation_fragment: [eagle3ops]`` (DOCUMENTATION below) or
# ``eagle3ops.<name>`` (the attribute of that name in capitals). The options' names, types, defaults and choices
# are the definitions' in python/eagle3ops/*_options.py; tests/unit/test_options.py fails when they disagree.
from __future__ import annotations


class ModuleDocFragment:
    # every module that runs the eagle3ops CLI
    DOCUMENTATION = r"""
options:
  executable:
    description:
      - Path of the C(eagle3ops) command on the target (from the C(runtime) phase's venv).
      - When omitted, C(eagle3ops) next to the module's Python interpreter, then on E(PATH).
    type: path
"""
