"""The storage underneath the data directory, as the PVE host sees it: does what is left to write fit there too?

``statvfs`` inside a container sees the filesystem of its volume, not the pool the volume is carved from: an
LVM-thin pool or a Ceph pool can run out while the container's filesystem still shows terabytes free (thin
volumes are over-committed; Ceph's ``max_avail`` shrinks with every other guest's writes). The extract phase
therefore also asks the PVE host (``library/eagle3ops_extract_pve_usage.py``: ``pvesm status``, and a thin pool's
metadata% from ``lvs``) and hands the answer here, a dict: ``storage``, ``type``, ``volume``, ``total``,
``used``, ``avail`` (bytes), ``source``, ``metadata_percent`` (thin pools). This module only decides.
"""

from __future__ import annotations

from eagle3ops.store.errors import DiskSpaceError, StoreError

KEYS = ("storage", "type", "total", "used", "avail")


def check_pool(pool: dict | None, bytes_needed: int, with_margin: int, human) -> dict | None:
    """Refuse when ``with_margin`` bytes (``bytes_needed`` plus the preflight's margin) do not fit the PVE
    storage's available bytes; the refusal names the storage, its type and the numbers. None: no PVE storage
    given (a host path, or not a PVE container)."""
    if not pool:
        return None
    missing = [k for k in KEYS if k not in pool]
    if missing or not all(isinstance(pool[k], int) and pool[k] >= 0 for k in ("total", "used", "avail")):
        raise StoreError(
            f"the PVE storage usage handed to the preflight lacks {', '.join(missing) or 'whole byte counts'} "
            f"(want {', '.join(KEYS)}): {pool!r}. Nothing was written."
        )
    info = {k: pool[k] for k in (*KEYS, "volume", "source", "metadata_percent") if k in pool}
    meta = pool.get("metadata_percent")
    if bytes_needed > 0 and with_margin > pool["avail"]:
        used_pct = 100 * pool["used"] / pool["total"] if pool["total"] else 100.0
        raise DiskSpaceError(
            f"not enough space on PVE storage {pool['storage']!r} ({pool['type']}"
            + (f", volume {pool['volume']}" if pool.get("volume") else "")
            + f"), underneath the data directory: {human(bytes_needed)} of hidden states still to write "
            f"({human(with_margin)} with the margin), {human(pool['avail'])} available of {human(pool['total'])} "
            f"({used_pct:.1f}% used"
            + (f", thin-pool metadata {meta:.1f}%" if meta is not None else "")
            + f"; {pool.get('source', 'the PVE host')}). The filesystem inside the container may show more free "
            "space than the pool has: a full pool stops every write. Grow the pool, or move the data directory "
            "to a larger volume (the storage phase); nothing was written."
        )
    return info
