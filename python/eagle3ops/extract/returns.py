"""What both extraction modules (eagle3ops_extract, eagle3ops_extract_sglang) return with one meaning: their RETURN
documentation's shared entries, written into each module by ``make options`` (the ``returns extract`` blocks;
eagle3ops.option_render). Each entry: ansible-doc's fields of one returned key."""

from __future__ import annotations

RETURNS: dict[str, dict] = {
    "job_finished": {
        "description": "With O(job_file) (check mode) - whether the async job running the extraction has ended.",
        "returned": "check mode with job_file",
        "type": "bool",
    },
    "progress": {
        "description": [
            "Check mode, while a run holds the data directory - how far it is. V(line) is what a poll prints, e.g. "
            "C(extract: 312/867 rows (35%), 4.1 rows/s, ETA 0:02:15; PID 4242 since ...; log: "
            "/data/eagle3/data.extract.log); also V(done), V(total), V(rate_per_s) (from the manifests' file times "
            "since the run started; null before two rows), V(eta_s), V(log) (the run's log beside the data "
            "directory)."
        ],
        "returned": "check mode, while a run holds the data directory",
        "type": "dict",
    },
    "running": {
        "description": "Check mode only; another extraction holds this data directory now (its lock).",
        "returned": "check mode",
        "type": "bool",
    },
    "holder": {
        "description": [
            "The run that holds the data directory (pid, cmdline, host, started_at, what), or null; in check mode, "
            "and on a failure because another run holds it."
        ],
        "returned": "check mode or when running",
        "type": "dict",
    },
    "stale_lock": {
        "description": "The record of a dead run whose lock this run took over, or null.",
        "returned": "success, not in check mode",
        "type": "dict",
    },
    "total": {"description": "Rows this run is responsible for.", "returned": "always", "type": "int"},
    "bytes_needed": {
        "description": "Exact bytes the remaining rows need (check mode).",
        "returned": "check mode",
        "type": "int",
    },
    "tokens": {"description": "Tokens written by this run.", "returned": "success", "type": "int"},
    "bytes": {"description": "Bytes written by this run.", "returned": "success", "type": "int"},
    "seconds": {"description": "Wall time of the run.", "returned": "success", "type": "float"},
    "imported": {
        "description": "Rows taken over from a lost host that this run copied from its readable part, checked.",
        "returned": "success with reassign_from_data",
        "type": "int",
    },
}
