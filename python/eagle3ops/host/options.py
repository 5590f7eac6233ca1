"""The host wing's options, once: the storage, services and container phases' modules (``eagle3ops_storage_*``,
``eagle3ops_services_*``, ``eagle3ops_container_gpu``), the ``eagle3ops storage plan|status`` and ``eagle3ops
pve`` tools, and the storage/services roles' variables come from here (eagle3ops.options says how).

These modules run on the machine that owns the disk, the units or the containers (the PVE host in production),
where eagle3ops is not installed: they call the host wing directly (``module_utils/eagle3ops_storage.py``, ...),
so most definitions here are module-only (``cli=False``): they give the module its argument_spec, and the
module's DOCUMENTATION and the role are checked against them (tests/unit/core/test_options.py). A definition that is
also a command (``storage plan``) gives both. Standard library only, shipped as
module_utils/eagle3ops_host_options.py.
"""

from __future__ import annotations

try:
    from eagle3ops import options as _o
except ImportError:  # on a target without eagle3ops: the copy Ansible ships
    from ansible.module_utils import eagle3ops_options as _o

Option, Command, Group = _o.Option, _o.Command, _o.Group
count = _o.count

# ---- storage: the /data migration -----------------------------------------------------------------------
STATE_FILE = Option(
    "state_file",
    "path",
    default="/var/lib/eagle3ops/storage-state.json",
    help="the migration's state file",
    doc="The migration's state file, on the machine whose /data migrates.",
)
DATA_PATH = Option(
    "data_path",
    "path",
    default="/data",
    help="the data directory to move onto the new disk",
    role_doc="The data directory to move.",
)
STAGING_PATH = Option(
    "staging_path",
    "path",
    default="/mnt/eagle3ops-storage-new",
    help="where the new filesystem is mounted while copying",
    role_doc="Mount point of the new filesystem while copying.",
)
OLD_PATH = Option(
    "old_path",
    "path",
    default="/data.old",
    help="where the old data is kept as the rollback after the cut-over",
    role_doc="Where the old data is kept as the rollback.",
)
# the paths of the migration that storage plan and storage state both take (the doc fragment eagle3ops.storage_paths)
PATHS = (DATA_PATH, STAGING_PATH, OLD_PATH)
FSTAB = Option(
    "fstab",
    "path",
    default="/etc/fstab",
    help="the fstab file consulted for the data directory",
    doc="The fstab file consulted for /data.",
    role_doc="The fstab file to edit.",
)
FSTYPE = Option(
    "fstype",
    default="xfs",
    role_choices=["xfs", "ext4"],  # what the role's mkfs step knows
    doc="Filesystem to create.",
)
ALLOW_EMPTY_SOURCE = Option(
    "allow_empty_source",
    "bool",
    default=False,
    help="allow migrating an empty data directory (a host with no data yet)",
    role_doc="Allow migrating an empty data directory.",
)

STORAGE_PLAN = Command(
    "plan",
    help="probe the disk and /data; print the steps or the refusal (changes nothing)",
    check=False,  # it only reads
    module="eagle3ops_storage_plan",
    role="storage",
    options=[
        Option(
            "disk",
            "path",
            required=True,
            role_default="",  # empty skips the phase
            help="the new disk, by a stable name (/dev/disk/by-id/...)",
            doc="The new disk, by a stable name (C(/dev/disk/by-id/...)).",
            role_doc="The new disk by a stable name (C(/dev/disk/by-id/...)); empty skips the phase.",
        ),
        DATA_PATH,
        STAGING_PATH,
        OLD_PATH,
        STATE_FILE,
        FSTAB,
        FSTYPE,
        Option(
            "force",
            "bool",
            default=False,
            help="accept a disk with a partition table, signatures or unknown data (it is wiped)",
            role_doc="Wipe a disk that is not blank (partition table, signatures, unknown data).",
        ),
        ALLOW_EMPTY_SOURCE,
        Option(
            "cleanup_old",
            "bool",
            default=False,
            help="plan the removal of the rollback copy after the cut-over",
            role_doc="Remove the rollback after the cut-over.",
        ),
        Option(
            "require_stable_name",
            "bool",
            default=True,
            role="storage_disk_require_stable_name",
            help="refuse kernel names such as /dev/nvme1n1 (they can change between boots)",
            doc="Refuse kernel names such as C(/dev/nvme1n1) (they can change between boots).",
            role_doc="Refuse kernel names such as C(/dev/nvme1n1).",
        ),
        Option(
            "cutover",
            "bool",
            default=True,
            help="cut over after the verification; --no-cutover stops after it (cut over in a later run)",
            doc=(
                "Cut over after the verification; false stops after it (copy now, cut over in a later run)."
            ),
            role_doc=("Cut over after the verification; false stops after it (cut over in a later run)."),
        ),
    ],
)

STORAGE_STATUS = Command("status", help="print the migration's state file", check=False, options=[STATE_FILE])

STORAGE = Group(
    "storage",
    [STORAGE_PLAN, STORAGE_STATUS],
    help="inspect the /data migration onto a new disk",
)

STORAGE_STATE = Command(
    "storage-state",
    help="record a step of the migration in its state file",
    cli=False,
    module="eagle3ops_storage_state",
    role="storage",
    options=[
        STATE_FILE,
        Option(
            "step",
            required=True,
            choices=["preparing", "prepared", "cutover_started", "cutover", "cleaned"],
            role=False,
            help="the step reached",
        ),
        Option(
            "disk_info",
            "dict",
            role=False,
            help="the plan module's disk result (for step=preparing)",
            doc="The plan module's C(disk) result (for O(step=preparing)).",
        ),
        Option(
            "source",
            "dict",
            role=False,
            help="the plan module's source result (for step=preparing)",
            doc="The plan module's C(source) result (for O(step=preparing)).",
        ),
        Option(
            "partition",
            "path",
            role=False,
            help="the new partition's device (for step=prepared)",
            doc="The new partition's device (for O(step=prepared)).",
        ),
        DATA_PATH,
        STAGING_PATH,
        OLD_PATH,
        FSTYPE,
        FSTAB,
    ],
)

RSYNC_OPTS = Option("rsync_opts", "list", elements="str", default=[], role_doc="Extra rsync options for the copy.",
                    help="extra rsync options (--bwlimit=100M); --bwlimit is not applied to verification",
                    doc="Extra rsync options (e.g. C(--bwlimit=100M)); C(--bwlimit) is not applied to verification.")  # fmt: skip
STORAGE_SYNC = Command(
    "storage-sync",
    help="copy, verify or quick-check the data onto the new filesystem (rsync)",
    cli=False,
    module="eagle3ops_storage_sync",
    role="storage",
    options=[
        STATE_FILE,
        Option(
            "mode", required=True, choices=["copy", "verify", "quick"], role=False, help="which pass to run"
        ),
        ALLOW_EMPTY_SOURCE.but(
            help="allow an empty source (only if the migration started from an empty one)",
            doc="Allow an empty source (only if the migration started from an empty one).",
        ),
        RSYNC_OPTS,
    ],
)

STORAGE_PARTITION = Command(
    "storage-partition",
    help="find (or create) the block node of a partition of the disk",
    cli=False,
    module="eagle3ops_storage_partition",
    role="storage",
    options=[
        Option("disk", "path", required=True, role_default="", help="the whole disk"),
        count(
            "number",
            default=1,
            role=False,
            help="the partition number",
            doc="Partition number.",
        ),
        Option(
            "timeout",
            "int",
            default=10,
            role=False,
            minimum=0,
            help="seconds to wait for the partition to appear",
        ),
    ],
)

# ---- services: the GPU units -----------------------------------------------------------------------------
BACKUP_DIR = Option(
    "backup_dir",
    "path",
    default="/var/lib/eagle3ops/services",
    help="where the per-unit state records and moved unit files are kept",
    doc="Where the records and moved unit files are kept.",
    role_doc="Per-unit state records and unit files moved out of /etc/systemd/system.",
)

SERVICES_INFO = Command(
    "services-info",
    help="find the GPU units, their backups and other NVIDIA device holders",
    cli=False,
    module="eagle3ops_services_info",
    role="services",
    options=[
        Option(
            "units",
            "list",
            elements="str",
            default=[],
            role_default=[
                "vllm.service"
            ],  # the playbook looks for the usual GPU server unless told otherwise
            help="unit names or glob patterns; a name without a suffix means <name>.service",
            doc="Unit names or glob patterns; a name without a suffix means C(<name>.service).",
            role_doc="Unit names or glob patterns; names without a suffix mean .service.",
        ),
        BACKUP_DIR,
        Option(
            "holders",
            "bool",
            default=True,
            role="services_report_holders",
            help="scan /proc for processes holding /dev/nvidia* open (other than the units)",
            doc="Scan C(/proc) for processes holding C(/dev/nvidia*) open (other than O(units)).",
            role_doc="Report other processes that hold /dev/nvidia* open.",
        ),
    ],
)

SERVICES_BACKUP = Command(
    "services-backup",
    help="record, move aside, restore or forget one unit's state",
    cli=False,
    module="eagle3ops_services_backup",
    role="services",
    options=[
        Option("unit", required=True, role=False, help="the unit name (no glob)"),
        Option(
            "state",
            required=True,
            choices=["recorded", "aside", "restored", "forgotten"],
            role=False,  # each task of the role asks for one
            help="what to do",
            doc="What to do (see the description).",
        ),
        BACKUP_DIR,
    ],
)

# ---- container: the LXC container on the PVE host ------------------------------------------------------------
# the PVE tools and configs, as the container, storage (a volume source) and extract (the preflight) modules take them
PCT = Option("pct", "path", default="/usr/sbin/pct", command=True, help="path of pct", doc="Path of C(pct).",
             role_doc="Path of pct.")  # fmt: skip
PVESM = Option("pvesm", "path", default="/usr/sbin/pvesm", command=True, help="path of pvesm",
               doc="Path of C(pvesm).", role_doc="Path of pvesm.")  # fmt: skip
PVE_CONFIG_DIR = Option("config_dir", "path", default="/etc/pve/lxc", help="where the container configs live",
                        role_doc="Container configs (test hook).")  # fmt: skip
CONTAINER_GPU = Command(
    "container-gpu",
    help="GPUs, data mount, sizes and state of one PVE LXC container",
    cli=False,  # `eagle3ops pve plan` previews the same change offline
    module="eagle3ops_container_gpu",
    role="container",
    options=[
        Option("vmid", "int", required=True, role_default=129, minimum=100, help="the container's id"),
        Option(
            "options",
            "dict",
            default={},
            role=False,  # the role combines its sizes, mount and container_options into it
            help="plain config keys to enforce, as pct set takes them (cores, memory, features, mp0, ...)",
            doc=[
                (
                    "Plain config keys to enforce, as C(pct set) takes them (C(cores), C(memory), "
                    "C(features), C(mp0), ...)."
                ),
                ("Property strings compare as sets (C(nesting=1,keyctl=1) equals C(keyctl=1,nesting=true))."),
                ("A bind mount point (C(mpN) whose volume is an absolute path) must exist on the host."),
            ],
        ),
        Option(
            "gpus",
            "raw",
            default="all",
            help="all, none, comma-separated indices, or a list of GPU indices (a string or a list: raw)",
            doc=(
                "C(all), C(none), or a list of GPU indices (C(/dev/nvidiaN)). The shared nodes "
                "(C(nvidiactl), C(nvidia-uvm), C(nvidia-uvm-tools), C(nvidia-modeset), "
                "C(nvidia-caps/*)) come with any GPU."
            ),
            role_doc=(
                'A string or a list (hence raw) - all, none, comma-separated indices ("0,1"), or '
                "a list of GPU indices ([0, 1]); anything else fails the container phase naming "
                "the value."
            ),
        ),
        Option(
            "passthrough",
            default="auto",
            choices=["auto", "dev", "raw"],
            help="dev writes devN entries (PVE >= 8.1), raw the lxc lines; auto picks from pveversion",
            doc=(
                "C(dev) writes C(devN) entries (PVE >= 8.1); C(raw) the "
                "C(lxc.cgroup2.devices.allow) and C(lxc.mount.entry) lines; C(auto) picks from "
                "C(pveversion)."
            ),
            role_doc="devN entries (PVE >= 8.1), raw lxc lines, or auto from pveversion.",
        ),
        Option(
            "dev_options",
            default="",
            help="extra options appended to every devN entry (mode=0666)",
            doc=("Extra options appended to every C(devN) entry, e.g. C(mode=0666) or C(uid=0,gid=44)."),
            role_doc="Extra options of each devN entry (mode=0666, uid=, gid=).",
        ),
        Option(
            "mp_replace",
            "bool",
            default=False,
            help="replace a mount point (mpN) the config already has with another volume or path",
            doc=[
                (
                    "Replace a mount point (C(mpN)) that the config already has with the one in O(options). "
                    "Without it a different C(mpN) is refused, naming both, and nothing is changed."
                ),
                (
                    "PVE keeps a replaced storage volume as C(unusedN) (the rollback); a host path is left "
                    "as it is. Diff mode shows the change; check mode predicts it."
                ),
            ],
            role_doc=(
                "Replace the container's data mount point when the config already has a different one "
                "(otherwise the run refuses it, naming both); the diff shows the change."
            ),
        ),
        PVESM.but(doc="Path of C(pvesm); a mount point on a PVE storage volume is checked with it."),
        Option(
            "prune_unregistered_majors",
            "bool",
            default=True,
            role=False,
            help="remove lxc.cgroup2.devices.allow lines whose major no driver registers",
            doc=(
                "Remove C(lxc.cgroup2.devices.allow) lines whose major no driver registers in "
                "C(/proc/devices)."
            ),
        ),
        Option(
            "restart",
            "bool",
            default=False,
            help="restart a running container when a change needs it",
            doc=("Restart a running container (C(pct stop) + C(pct start)) when a change needs it."),
            role_doc="Restart a running container when a change needs it (otherwise the run warns).",
        ),
        Option(
            "on_stale_mount",
            default="restart",
            choices=["restart", "fail"],
            help="a running container whose bind mount no longer shows its host path: restart it, or fail",
            doc=[
                ("What to do with a running container whose bind mount point no longer shows its host path."),
                (
                    "C(restart) (C(pct stop) + C(pct start)), refused while a process matching "
                    "O(busy_patterns) runs in the container; C(fail) never restarts and fails with "
                    "the reason."
                ),
            ],
            role_doc=(
                "A running container whose bind mount's host path changed underneath it (the "
                "storage cut-over) is restarted (refused while a pipeline job runs inside), or "
                "with C(fail) the run fails with the reason."
            ),
        ),
        Option(
            "busy_patterns",
            "list",
            elements="str",
            role_default=[],  # empty: the module's own list, the eagle3ops data-writing commands
            help="regexes of container processes a restart must not kill (default: the eagle3ops jobs)",
            doc=[
                (
                    "Regular expressions (Python, searched in the space-joined command line) of "
                    "processes in the container that a restart must not kill. Default - the "
                    "eagle3ops data-writing commands (prepare, regenerate, extract, extract-sglang, "
                    "extract-verify, train, serve-convert, benchmark-*, and their former names "
                    "sglang-extract, verify, convert; not the read-only ones such as extract-status "
                    "or train-status) and the detached trainer (C(eagle3ops.speculators_shim))."
                ),
                ("Add e.g. C(sglang\\.launch_server) to keep a serving container from being restarted."),
            ],
            role_doc=(
                "Command-line regexes of container processes a restart must not kill; empty = "
                "the eagle3ops jobs."
            ),
        ),
        Option(
            "state",
            default="present",
            choices=["present", "started"],
            role=False,  # the role's container_start (a bool) picks it
            help="started also starts a stopped container; present leaves it",
            doc=(
                "C(started) also starts a stopped container (after the config is right); "
                "C(present) leaves it."
            ),
        ),
        PCT,
        PVE_CONFIG_DIR,
        Option(
            "dev_root",
            "path",
            default="/dev",
            help="where to look for the NVIDIA device nodes (tests)",
            doc=("Where to look for the NVIDIA device nodes (reported as under C(/dev)); for tests."),
            role_doc="Where the NVIDIA nodes are looked for (test hook).",
        ),
        Option(
            "proc_devices",
            "path",
            default="/proc/devices",
            help="the host's character-device majors",
            doc="The host's character-device majors; for tests.",
            role_doc="The host's device majors (test hook).",
        ),
        Option(
            "driver_version_file",
            "path",
            default="/sys/module/nvidia/version",
            help="the host driver's version (compared with the container's libraries)",
            doc=(
                "The host driver's version (compared with the user-space libraries found in the container)."
            ),
            role_doc="The host driver's version (test hook).",
        ),
    ],
)

# ---- extract's disk preflight, the PVE side: how full the storage under the data directory is ---------------
PVE_STORAGE_USAGE = Command(
    "pve-storage-usage",
    help="how full the PVE storage under a path of an LXC container is (pvesm status; a thin pool's lvs)",
    check=False,  # it only reads
    cli=False,
    module="eagle3ops_extract_pve_usage",
    role="extract",
    options=[
        Option(
            "vmid",
            "int",
            required=True,
            minimum=100,
            why="PVE guest ids start at 100",
            role=False,  # the role passes extract_pve_vmid (the inventory's proxmox_vmid)
            help="the container's id",
        ),
        Option(
            "path",
            "path",
            required=True,
            role=False,  # the role passes extract_data_dir
            help="a path inside the container (the data directory); its mount point's volume is looked up",
        ),
        PVESM.but(role="extract_pve_pvesm", role_doc="Path of pvesm on the PVE host."),
        Option(
            "lvs",
            "path",
            default="/sbin/lvs",
            command=True,
            role="extract_pve_lvs",
            help="path of lvs (an LVM-thin pool's metadata%)",
            doc="Path of C(lvs), asked for an LVM-thin pool's metadata% (C(pvesm status) gives its data% only).",
            role_doc="Path of lvs on the PVE host.",
        ),
        PVE_CONFIG_DIR.but(
            role="extract_pve_config_dir", role_doc="Container configs on the PVE host (test hook)."
        ),
        Option(
            "storage_cfg",
            "path",
            default="/etc/pve/storage.cfg",
            role="extract_pve_storage_cfg",
            help="the PVE storage configuration (a thin pool's volume group and pool)",
            role_doc="The PVE storage configuration (test hook).",
        ),
    ],
)

# ---- storage: the old data on a PVE storage volume ---------------------------------------------------------
STORAGE_VOLUME = Command(
    "storage-volume",
    help="the old data on a PVE storage volume: refuse what is unsafe, say how to mount it at the data path",
    check=False,  # it only reads; the role mounts (ansible.posix.mount)
    cli=False,
    module="eagle3ops_storage_volume",
    role="storage",
    options=[
        Option("volume", required=True, role="storage_source_volume", role_default="",
               help="the PVE volume that holds the old data (<storage>:vm-<vmid>-disk-<n>)",
               doc="The PVE storage volume that holds the old data (C(<storage>:vm-<vmid>-disk-<n>)).",
               role_doc=("The PVE storage volume that holds the old data (ceph-rbd:vm-129-disk-1): it is mounted at "
                         "storage_data_path and migrated from there; the volume is the rollback. Empty: the old data "
                         "is a host directory.")),
        Option("vmid", "int", required=True, minimum=0, role="storage_source_vmid", role_default=0,
               help="the container that owns the volume (it must be stopped)",
               doc="The container that owns the volume; it must be stopped.",
               role_doc="The container that owns storage_source_volume (stopped while the phase runs)."),
        DATA_PATH,
        STATE_FILE,
        PVESM.but(role="storage_pvesm"),
        PCT.but(role="storage_pct"),
        PVE_CONFIG_DIR.but(role="storage_pve_config_dir"),
    ],
)  # fmt: skip

# ---- storage: the data mount moved onto a new PVE storage volume ----------------------------------------------
_TARGET_DOC = ("A new PVE storage volume for the container's data mount, <storage>:<GiB> (local-lvm:500): allocated, "
               "the data copied onto it and verified by checksum, then storage_target_mount_point of storage_target_vmid "
               "points at it; the old volume stays as unusedN (the rollback). Empty: the data moves onto storage_disk.")  # fmt: skip
STORAGE_VOLUME_MOVE = Command(
    "storage-volume-move",
    help="move a container's data mount onto a new PVE storage volume: allocate, copy, verify, switch mpN",
    cli=False,
    module="eagle3ops_storage_volume_move",
    role="storage",
    options=[
        Option("target", required=True, role="storage_target_volume", role_default="", role_doc=_TARGET_DOC,
               help="the new volume, <storage>:<size in GiB>",
               doc="The new volume, C(<storage>:<size in GiB>) (C(local-lvm:500)), allocated with C(pvesm alloc)."),
        Option("vmid", "int", required=True, minimum=0, role="storage_target_vmid", role_default=0,
               help="the container whose data mount moves (it must be stopped)",
               doc="The container whose data mount moves; it must be stopped.",
               role_doc="The container whose data mount moves onto storage_target_volume (stopped while it moves)."),
        Option("mount_point", default="mp0", role="storage_target_mount_point", help="the container's mount point that holds the data",
               doc="The container's mount point (C(mpN)) that holds the data.",
               role_doc="The container's mount point (mpN) that holds the data."),
        Option("state_file", "path", default="/var/lib/eagle3ops/storage-volume-move.json",
               role="storage_volume_state_file", help="the move's state file (the allocated volume, the step)",
               doc="The move's state file (the allocated volume and the step), on the PVE host.",
               role_doc="The state file of a move onto storage_target_volume, on the PVE host."),
        Option("source_path", "path", default="/mnt/eagle3ops-storage-old", role="storage_volume_source_path",
               help="where the old volume is mounted read-only while it is copied",
               doc="Where the old volume is mounted read-only while it is copied.",
               role_doc="Where the old volume is mounted read-only while it is copied."),
        STAGING_PATH,
        RSYNC_OPTS,
        PVESM.but(role="storage_pvesm"),
        PCT.but(role="storage_pct"),
        PVE_CONFIG_DIR.but(role="storage_pve_config_dir"),
    ],
)  # fmt: skip
