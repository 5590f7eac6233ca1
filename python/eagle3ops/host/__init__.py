"""The host wing: what runs on the machines that own the hardware (the PVE host, a bare host before the runtime
phase), where eagle3ops is not installed. Each file is shipped there by Ansible as
``module_utils/eagle3ops_<name>.py`` (a symlink to it), so each imports only the standard library and other
host-wing files (``try: from eagle3ops.host import x`` / ``except ImportError: from ansible.module_utils import
eagle3ops_x``), and :mod:`eagle3ops.durable`; ``tests/unit/core/test_durable.py`` enforces it.

- :mod:`.storage` (the migration's state machine) and :mod:`.storage_probe` (disks, mounts, fstab): /data
  moved to a new disk without losing the old data;
- :mod:`.services`: GPU-grabbing systemd units kept off the GPUs, with a byte-exact backup;
- :mod:`.pve` (a container's config: parse, plan, edit), :mod:`.pve_devices` (the host's NVIDIA nodes),
  :mod:`.pve_container` (a running container's bind mounts and jobs);
- :mod:`._fs`: the file helpers they share.
"""
