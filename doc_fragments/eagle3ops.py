# Shared option documentation of the modules in library/ (ansible.cfg: doc_fragment_plugins = doc_fragments).
# A module takes one with ``extends_documentation_fragment: [eagle3ops]`` (DOCUMENTATION below) or
# ``eagle3ops.<name>`` (the attribute of that name in capitals). The options' names, types, defaults and choices
# are the definitions' in python/eagle3ops/*_options.py; tests/unit/core/test_options.py fails when they disagree.
from __future__ import annotations

_EXECUTABLE = r"""
options:
  executable:
    description:
      - Path of the C(eagle3ops) command on the target (from the C(runtime) phase's venv).
      - When omitted, C(eagle3ops) next to the module's Python interpreter, then on E(PATH).
    type: path
"""

_CHECK_MODE = r"""
attributes:
  check_mode:
    support: full
    description: Check mode predicts whether the task would change anything, and writes nothing.
"""


class ModuleDocFragment:
    # every module that runs the eagle3ops CLI
    DOCUMENTATION = _EXECUTABLE

    # the same, for a module whose check mode predicts ``changed`` and that returns no diff
    NO_DIFF = (
        _EXECUTABLE
        + _CHECK_MODE
        + r"""
  diff_mode:
    support: none
    description: No diff is returned; the result's fields say what changed.
"""
    )

    # the same, for a module that returns a diff of what it changes, in check mode too
    DIFF = (
        _EXECUTABLE
        + _CHECK_MODE
        + r"""
  diff_mode:
    support: full
    description: Returns a diff of what changes (in check mode too).
"""
    )

    # the storage modules that read or write the /data migration's state file (plan, state, sync)
    STORAGE_STATE = r"""
options:
  state_file:
    description: The migration's state file, on the machine whose /data migrates.
    type: path
    default: /var/lib/eagle3ops/storage-state.json
"""

    # eagle3ops_extract and eagle3ops_extract_sglang: the store they both write (eagle3ops.extract_options)
    EXTRACT = r"""
options:
  data_dir:
    description: Prepared data directory (output of the C(prepare) phase); C(hidden_states/) is written inside it.
    type: path
    required: true
  layer_convention:
    description:
      - C(input) (id i names the input of layer i; SGLang, vLLM, speculators) or C(output) (SpecForge, ModelOpt).
    type: str
    choices: [input, output]
    default: input
  margin:
    description: Free-space margin over the exact need, as a fraction.
    type: float
    default: 0.05
  disk_margin_mib:
    description:
      - Free space kept on top of the exact need and O(margin), in MiB (the preflight refuses below it).
    type: float
    default: 64
  limit:
    description: Only the first N rows (smoke runs).
    type: int
  wait_running:
    description:
      - Check mode only; while another run holds O(data_dir) (an interrupted playbook's extraction), wait up to
        this many seconds for it to end (its lock to be free) before planning. 0 does not wait.
    type: float
    default: 0
  job_file:
    description:
      - Check mode only; the C(results_file) of the Ansible async job that runs the extraction (the task started
        with C(poll=0)). The result's RV(job_finished) says whether that job has ended, and RV(progress) how far
        the run is (rows done of this host's, rows/s from the manifests' file times, ETA, the run's log), so a
        task that polls with C(until) shows the progress at each poll.
    type: path
"""
