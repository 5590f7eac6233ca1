# The modules' old names (issue 19: every module is named eagle3ops_<phase>[_<action>]). Each old name is a
# symlink in library/ to the renamed module, so a playbook written for the old name runs the same code; the
# module calls deprecate_old_name() right after building its AnsibleModule, which adds a deprecation warning
# naming the new name. docs/architecture.md "Module names" says why symlinks and not shim files.
from __future__ import annotations

# old name -> new name (tests/unit/test_names.py holds library/'s symlinks to exactly this table)
RENAMED = {
    "dataset_prepare": "eagle3ops_prepare",
    "hidden_states_extract": "eagle3ops_extract",
    "sglang_extract": "eagle3ops_extract_sglang",
    "gpu_vram_free": "eagle3ops_gpu_free",
    "eagle3_train": "eagle3ops_train",
    "eagle3_convert": "eagle3ops_serve_convert",
    "eagle3_serve_process": "eagle3ops_serve_process",
    "eagle3_benchmark": "eagle3ops_benchmark",
    "sglang_capture_patch": "eagle3ops_sglang_patch",
    "proxmox_lxc_gpu": "eagle3ops_container_gpu",
    "eagle3ops_assets": "eagle3ops_runtime_assets",
    "eagle3ops_unit_backup": "eagle3ops_services_backup",
}
# the old names run until a release after this date (Ansible prints it with the warning)
REMOVAL_DATE = "2027-06-01"


def deprecate_old_name(module):
    """Warn (module.deprecate) when the task called this module by its old name; the module runs either way."""
    called = (module._name or "").rsplit(".", 1)[-1]  # a task may say ansible.legacy.<name>
    new = RENAMED.get(called)
    if new:
        module.deprecate(
            f"the module {called} is now named {new}: write {new} in the task ({called} runs the same module "
            "for now, and will be removed)",
            date=REMOVAL_DATE,
        )
