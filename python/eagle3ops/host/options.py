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
    doc="The migration's state file, on the machine whose /data migrates.",
)
DATA_PATH = Option(
    "data_path",
    "path",
    default="/data",
    doc="the data directory to move onto the new disk",
)
STAGING_PATH = Option(
    "staging_path",
    "path",
    default="/mnt/eagle3ops-storage-new",
    doc="where the new filesystem is mounted while copying",
)
OLD_PATH = Option(
    "old_path",
    "path",
    default="/data.old",
    doc="where the old data is kept as the rollback after the cut-over",
)
# the paths of the migration that storage plan and storage state both take (the doc fragment eagle3ops.storage_paths)
PATHS = (DATA_PATH, STAGING_PATH, OLD_PATH)
FSTAB = Option(
    "fstab",
    "path",
    default="/etc/fstab",
    doc="The fstab file consulted for /data.",
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
    doc="allow migrating an empty data directory (a host with no data yet)",
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
            doc="The new disk, by a stable name (C(/dev/disk/by-id/...)); empty, the storage role skips the phase.",
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
            doc="accept a disk with a partition table, signatures or unknown data (it is wiped)",
        ),
        ALLOW_EMPTY_SOURCE,
        Option(
            "cleanup_old",
            "bool",
            default=False,
            doc="plan the removal of the rollback copy after the cut-over",
        ),
        Option(
            "require_stable_name",
            "bool",
            default=True,
            role="storage_disk_require_stable_name",
            doc="Refuse kernel names such as C(/dev/nvme1n1) (they can change between boots).",
        ),
        Option(
            "cutover",
            "bool",
            default=True,
            doc=(
                "Cut over after the verification; false stops after it (copy now, cut over in a later run)."
            ),
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
            doc="the step reached",
        ),
        Option(
            "disk_info",
            "dict",
            role=False,
            doc="The plan module's C(disk) result (for O(step=preparing)).",
        ),
        Option(
            "source",
            "dict",
            role=False,
            doc="The plan module's C(source) result (for O(step=preparing)).",
        ),
        Option(
            "partition",
            "path",
            role=False,
            doc="The new partition's device (for O(step=prepared)).",
        ),
        DATA_PATH,
        STAGING_PATH,
        OLD_PATH,
        FSTYPE,
        FSTAB,
    ],
)

RSYNC_OPTS = Option("rsync_opts", "list", elements="str", default=[],
                    doc="Extra rsync options for the copy (e.g. C(--bwlimit=100M)); C(--bwlimit) is not applied to verification.")  # fmt: skip
STORAGE_SYNC = Command(
    "storage-sync",
    help="copy, verify or quick-check the data onto the new filesystem (rsync)",
    cli=False,
    module="eagle3ops_storage_sync",
    role="storage",
    options=[
        STATE_FILE,
        Option(
            "mode", required=True, choices=["copy", "verify", "quick"], role=False, doc="which pass to run"
        ),
        ALLOW_EMPTY_SOURCE.but(
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
        Option("disk", "path", required=True, role_default="", doc="the whole disk"),
        count(
            "number",
            default=1,
            role=False,
            doc="Partition number.",
        ),
        Option(
            "timeout",
            "int",
            default=10,
            role=False,
            minimum=0,
            doc="seconds to wait for the partition to appear",
        ),
    ],
)

# ---- services: the GPU units -----------------------------------------------------------------------------
BACKUP_DIR = Option(
    "backup_dir",
    "path",
    default="/var/lib/eagle3ops/services",
    doc="Where the per-unit state records and the unit files moved out of C(/etc/systemd/system) are kept.",
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
            doc="Unit names or glob patterns; a name without a suffix means C(<name>.service).",
        ),
        BACKUP_DIR,
        Option(
            "holders",
            "bool",
            default=True,
            role="services_report_holders",
            doc="Scan C(/proc) for processes holding C(/dev/nvidia*) open (other than O(units)).",
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
        Option("unit", required=True, role=False, doc="the unit name (no glob)"),
        Option(
            "state",
            required=True,
            choices=["recorded", "aside", "restored", "forgotten"],
            role=False,  # each task of the role asks for one
            doc="What to do (see the description).",
        ),
        BACKUP_DIR,
    ],
)

# ---- container: the LXC container on the PVE host ------------------------------------------------------------
# the PVE tools and configs, as the container, storage (a volume source) and extract (the preflight) modules take them
PCT = Option("pct", "path", default="/usr/sbin/pct", command=True, doc="Path of C(pct).")
PVESM = Option("pvesm", "path", default="/usr/sbin/pvesm", command=True, doc="Path of C(pvesm).")
PVE_CONFIG_DIR = Option(
    "config_dir", "path", default="/etc/pve/lxc", doc="Where the container configs live (a test hook)."
)
PVE_CONTAINER = (PCT, PVE_CONFIG_DIR)  # the modules that read or change a container's config
CONTAINER_GPU = Command(
    "container-gpu",
    help="GPUs, data mount, sizes and state of one PVE LXC container",
    cli=False,  # `eagle3ops pve plan` previews the same change offline
    module="eagle3ops_container_gpu",
    role="container",
    options=[
        Option("vmid", "int", required=True, role_default=129, minimum=100, doc="the container's id"),
        Option(
            "options",
            "dict",
            default={},
            role=False,  # the role combines its sizes, mount and container_options into it
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
            doc=(
                "C(all), C(none), comma-separated indices (C(0,1)) or a list of GPU indices (C(/dev/nvidiaN)); "
                "anything else is refused, naming the value. The shared nodes "
                "(C(nvidiactl), C(nvidia-uvm), C(nvidia-uvm-tools), C(nvidia-modeset), "
                "C(nvidia-caps/*)) come with any GPU."
            ),
        ),
        Option(
            "passthrough",
            default="auto",
            choices=["auto", "dev", "raw"],
            doc=(
                "C(dev) writes C(devN) entries (PVE >= 8.1); C(raw) the "
                "C(lxc.cgroup2.devices.allow) and C(lxc.mount.entry) lines; C(auto) picks from "
                "C(pveversion)."
            ),
        ),
        Option(
            "dev_options",
            default="",
            doc=("Extra options appended to every C(devN) entry, e.g. C(mode=0666) or C(uid=0,gid=44)."),
        ),
        Option(
            "mp_replace",
            "bool",
            default=False,
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
        ),
        PVESM.but(doc="Path of C(pvesm); a mount point on a PVE storage volume is checked with it."),
        Option(
            "prune_unregistered_majors",
            "bool",
            default=True,
            role=False,
            doc=(
                "Remove C(lxc.cgroup2.devices.allow) lines whose major no driver registers in "
                "C(/proc/devices)."
            ),
        ),
        Option(
            "restart",
            "bool",
            default=False,
            doc=(
                "Restart a running container (C(pct stop) + C(pct start)) when a change needs it; without it "
                "the run warns that the change waits for a restart."
            ),
        ),
        Option(
            "on_stale_mount",
            default="restart",
            choices=["restart", "fail"],
            doc=[
                ("What to do with a running container whose bind mount point no longer shows its host path."),
                (
                    "C(restart) (C(pct stop) + C(pct start)), refused while a process matching "
                    "O(busy_patterns) runs in the container; C(fail) never restarts and fails with "
                    "the reason."
                ),
            ],
        ),
        Option(
            "busy_patterns",
            "list",
            elements="str",
            role_default=[],  # empty: the module's own list, the eagle3ops data-writing commands
            doc=[
                (
                    "Regular expressions (Python, searched in the space-joined command line) of "
                    "processes in the container that a restart must not kill. Default - the "
                    "eagle3ops data-writing commands (prepare, regenerate, extract, extract-sglang, "
                    "extract-verify, train, serve-convert, benchmark-*; not the read-only ones such as "
                    "extract-status or train-status) and the detached trainers "
                    "(C(eagle3ops.train.speculators_shim), C(specforge_shim), C(ddp_probe))."
                ),
                ("Add e.g. C(sglang\\.launch_server) to keep a serving container from being restarted."),
            ],
        ),
        Option(
            "state",
            default="present",
            choices=["present", "started"],
            role=False,  # the role's container_start (a bool) picks it
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
            doc=("Where to look for the NVIDIA device nodes (reported as under C(/dev)); for tests."),
        ),
        Option(
            "proc_devices",
            "path",
            default="/proc/devices",
            doc="The host's character-device majors; for tests.",
        ),
        Option(
            "driver_version_file",
            "path",
            default="/sys/module/nvidia/version",
            doc=(
                "The host driver's version file (compared with the user-space libraries found in the container); "
                "for tests."
            ),
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
            doc="the container's id",
        ),
        Option(
            "path",
            "path",
            required=True,
            role=False,  # the role passes extract_data_dir
            doc="a path inside the container (the data directory); its mount point's volume is looked up",
        ),
        PVESM.but(
            role="extract_pve_pvesm",
        ),
        Option(
            "lvs",
            "path",
            default="/sbin/lvs",
            command=True,
            role="extract_pve_lvs",
            doc="Path of C(lvs), asked for an LVM-thin pool's metadata% (C(pvesm status) gives its data% only).",
        ),
        PVE_CONFIG_DIR.but(
            role="extract_pve_config_dir",
        ),
        Option(
            "storage_cfg",
            "path",
            default="/etc/pve/storage.cfg",
            role="extract_pve_storage_cfg",
            doc="The PVE storage configuration (a thin pool's volume group and pool); for tests.",
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
               doc="The PVE storage volume that holds the old data (C(<storage>:vm-<vmid>-disk-<n>)); it is mounted at "
               "O(data_path), migrated from there and kept as the rollback. Empty: the old data is a host directory."),
        Option("vmid", "int", required=True, minimum=0, role="storage_source_vmid", role_default=0,
               doc="The container that owns the volume; it must be stopped."),
        DATA_PATH,
        STATE_FILE,
        PVESM.but(role="storage_pvesm"),
        PCT.but(role="storage_pct"),
        PVE_CONFIG_DIR.but(role="storage_pve_config_dir"),
    ],
)  # fmt: skip

# ---- storage: the data mount moved onto a new PVE storage volume ----------------------------------------------
STORAGE_VOLUME_MOVE = Command(
    "storage-volume-move",
    help="move a container's data mount onto a new PVE storage volume: allocate, copy, verify, switch mpN",
    cli=False,
    module="eagle3ops_storage_volume_move",
    role="storage",
    options=[
        Option("target", required=True, role="storage_target_volume", role_default="",
               doc=["A new PVE storage volume for the container's data mount, C(<storage>:<size in GiB>) (C(local-lvm:500)), "
                    "allocated with C(pvesm alloc): the data is copied onto it and verified by checksum, then "
                    "O(mount_point) of O(vmid) points at it; the old volume stays as C(unusedN) (the rollback).",
                    "Empty: the data moves onto a disk instead (C(storage_disk))."]),
        Option("vmid", "int", required=True, minimum=0, role="storage_target_vmid", role_default=0,
               doc="The container whose data mount moves; it must be stopped while it moves."),
        Option("mount_point", default="mp0", role="storage_target_mount_point",
               doc="The container's mount point (C(mpN)) that holds the data."),
        Option("state_file", "path", default="/var/lib/eagle3ops/storage-volume-move.json",
               role="storage_volume_state_file",
               doc="The move's state file (the allocated volume and the step), on the PVE host."),
        Option("source_path", "path", default="/mnt/eagle3ops-storage-old", role="storage_volume_source_path",
               doc="Where the old volume is mounted read-only while it is copied."),
        STAGING_PATH,
        RSYNC_OPTS,
        PVESM.but(role="storage_pvesm"),
        PCT.but(role="storage_pct"),
        PVE_CONFIG_DIR.but(role="storage_pve_config_dir"),
    ],
)  # fmt: skip
